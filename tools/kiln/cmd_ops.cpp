// kiln ops: every op with its parameters, scalars, tensors and dtypes, then the targets.
#include <fmt/format.h>

#include <array>

#include "templates/registry.h"
#include "tools/kiln/cli.h"

namespace kiln::cli {
namespace {

std::string join(const std::vector<std::string>& items, std::string_view sep = ", ") {
  std::string out;
  for (const auto& s : items) out += (out.empty() ? "" : std::string(sep)) + s;
  return out;
}

// The signature as declared: "x [rows, hidden] (dtype), gamma [hidden] (dtype) -> y [rows, hidden]
// (out_dtype), rstd [rows] (fp32, if save_rstd)". Which flag makes a tensor optional is found by
// flipping each boolean parameter of a spec.
std::string tensor_order(const OpTemplate& op) {
  std::vector<std::string> ins, outs;
  for (const TensorDecl& d : op.signature()) {
    std::string dtype = d.dtype_rule == DTypeRule::in    ? "dtype"
                        : d.dtype_rule == DTypeRule::out ? "out_dtype"
                                                         : std::string(dtype_name(d.fixed));
    std::string s = fmt::format("{} {} ({}", d.name, d.shape_doc, dtype);
    if (d.present) {
      std::vector<std::string> flags;
      for (const ParamInfo& p : op.params()) {
        if (!p.is_bool) continue;
        KernelSpec on;
        on.params[std::string(p.name)] = 1;
        KernelSpec off;
        off.params[std::string(p.name)] = 0;
        if (d.present(on) && !d.present(off)) flags.emplace_back(p.name);
      }
      s += flags.empty() ? ", optional" : fmt::format(", if {}", join(flags, " and "));
    }
    s += ")";
    (d.role == Role::input ? ins : outs).push_back(std::move(s));
  }
  return join(ins) + " -> " + join(outs);
}

void print_op(const OpTemplate& op) {
  fmt::print("{}: {}\n", op.name(), op.summary());
  fmt::print("  kernel:     extern \"C\" {}\n", op.kernel_name({}));
  Table params({"parameter", "kind", "range", "doc"});
  for (const ParamInfo& p : op.params())
    params.add({std::string(p.name), p.baked ? "baked" : "runtime",
                p.is_bool            ? std::string("true/false")
                : !p.choices.empty() ? join(std::vector<std::string>(p.choices.begin(), p.choices.end()), "|")
                                     : fmt::format("[{}, {}]", p.min_value, p.max_value),
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
