// kiln ops: every op with its parameters, scalars, tensors and dtypes, then the targets.
#include <fmt/format.h>

#include <array>

#include "templates/op_template.h"
#include "tools/kiln/cli.h"

namespace kiln::cli {
namespace {

constexpr std::array<DType, 3> kAllDTypes = {DType::bf16, DType::f16, DType::f32};

std::string join(const std::vector<std::string>& items, std::string_view sep = ", ") {
  std::string out;
  for (const auto& s : items) out += (out.empty() ? "" : std::string(sep)) + s;
  return out;
}

/// An example spec whose integer parameters have distinct values (so tensor shapes can be written
/// with parameter names) and whose booleans are 0.
KernelSpec example_spec(const OpTemplate& op, std::map<int64_t, std::string>& names) {
  static constexpr int64_t kValues[] = {61, 67, 71, 73, 79, 83, 89, 97, 101, 103};
  KernelSpec spec;
  spec.op = std::string(op.name());
  spec.dtype = spec.out_dtype = op.dtypes().front();
  size_t next = 0;
  for (const ParamInfo& p : op.params()) {
    int64_t v = p.is_bool ? p.min_value : kValues[next++ % std::size(kValues)];
    v = std::clamp(v, p.min_value, p.max_value);
    spec.params[std::string(p.name)] = v;
    if (!p.is_bool) names.emplace(v, std::string(p.name));
  }
  return spec;
}

std::string symbolic_shape(const std::vector<int64_t>& shape, const std::map<int64_t, std::string>& names) {
  std::vector<std::string> dims;
  for (int64_t d : shape) {
    if (auto it = names.find(d); it != names.end()) dims.push_back(it->second);
    else if (auto half = names.find(d / 2); d % 2 == 0 && half != names.end()) dims.push_back("2*" + half->second);
    else dims.push_back(std::to_string(d));
  }
  return "[" + join(dims) + "]";
}

std::string tensor_order(const OpTemplate& op) {
  std::map<int64_t, std::string> names;
  const KernelSpec base = example_spec(op, names);
  const std::vector<TensorInfo> tensors = op.tensors(base);
  std::vector<std::string> out;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorInfo& t = tensors[i];
    std::string s = fmt::format("{} {}", t.name, symbolic_shape(t.shape, names));
    for (const ParamInfo& p : op.params()) {
      if (!p.is_bool) continue;
      KernelSpec flipped = base;
      flipped.params[std::string(p.name)] = p.max_value;
      const auto other = op.tensors(flipped);
      if (i < other.size() && other[i].shape != t.shape)
        s += fmt::format(" ({} if {})", symbolic_shape(other[i].shape, names), p.name);
    }
    if (t.output) s += " -> output";
    out.push_back(std::move(s));
  }
  return join(out, ", ");
}

void print_op(const OpTemplate& op) {
  fmt::print("{}: {}\n", op.name(), op.summary());
  fmt::print("  kernel:     extern \"C\" {}\n", op.kernel_name());
  Table params({"parameter", "kind", "range", "doc"});
  for (const ParamInfo& p : op.params())
    params.add({std::string(p.name), p.baked ? "baked" : "runtime",
                p.is_bool ? std::string("true/false") : fmt::format("[{}, {}]", p.min_value, p.max_value),
                std::string(p.doc)});
  fmt::print("  parameters (baked: a compile-time constant, part of the cache key; runtime: a kernel argument):\n{}",
             params.render({}, "    "));
  if (op.scalars().empty()) {
    fmt::print("  scalars:    none\n");
  } else {
    for (const ScalarInfo& s : op.scalars())
      fmt::print("  scalar:     {} (fp32, runtime, default {:g}): {}\n", s.name, s.default_value, s.doc);
  }
  fmt::print("  tensors:    {}\n", tensor_order(op));
  std::vector<std::string> ins;
  for (DType t : op.dtypes()) ins.emplace_back(dtype_name(t));
  fmt::print("  dtypes:     {}\n", join(ins));
  std::vector<std::string> outs;
  for (DType in : op.dtypes()) {
    std::vector<std::string> o;
    for (DType out : kAllDTypes)
      if (op.supports_out_dtype(in, out)) o.emplace_back(dtype_name(out));
    outs.push_back(fmt::format("{} -> {}", dtype_name(in), join(o, "|")));
  }
  fmt::print("  out dtypes: {}\n\n", join(outs, "; "));
}

}  // namespace

Command add_ops_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("ops", "List the ops (parameters, scalars, tensors, dtypes) and the targets");
  auto op_name = std::make_shared<std::string>();
  cmd->add_option("op", *op_name, "Show only this op");
  return [op_name]() -> int {
    if (!op_name->empty()) {
      auto op = find_op(*op_name);
      if (!op) return fail(op.error());
      print_op(**op);
      return 0;
    }
    fmt::print("Ops\n\n");
    for (const OpTemplate* op : all_ops()) print_op(*op);
    fmt::print("Targets (--arch)\n");
    Table targets({"target", "vendor", "GPUs", "LLVM triple", "wave", "CUs", "max threads", "LDS/shared",
                   "code object"});
    for (const TargetInfo& t : all_targets())
      targets.add({std::string(t.name), t.vendor == Vendor::amd ? "AMD" : "NVIDIA", std::string(t.gpus),
                   std::string(t.llvm_triple), std::to_string(t.wave_size), std::to_string(t.compute_units),
                   std::to_string(t.max_threads_per_block), fmt::format("{} KiB", t.shared_bytes_per_block / 1024),
                   std::string(t.code_object)});
    fmt::print("{}", targets.render({4, 5, 6, 7}, "  "));
    return 0;
  };
}

}  // namespace kiln::cli
