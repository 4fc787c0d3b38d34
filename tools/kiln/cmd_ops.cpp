// kiln ops: every op with its parameters, scalars, tensors and dtypes, then the targets.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

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
    std::string dtype = d.dtype_rule == DTypeRule::in        ? "dtype"
                        : d.dtype_rule == DTypeRule::out     ? "out_dtype"
                        : d.dtype_rule == DTypeRule::derived ? std::string(d.dtype_doc)
                                                             : std::string(dtype_name(d.fixed));
    std::string s = fmt::format("{} {} ({}", d.name, d.shape_doc, dtype);
    // The values of the boolean and enumerated parameters for which `holds` is true, where not all
    // or none of them are.
    auto flags_of = [&](bool (*holds)(const KernelSpec&)) {
      std::vector<std::string> flags;
      for (const ParamInfo& p : op.params()) {
        if (!p.is_bool && p.choices.empty()) continue;
        std::vector<std::string> when;
        const int64_t n = p.is_bool ? 2 : static_cast<int64_t>(p.choices.size());
        for (int64_t v = 0; v < n; ++v) {
          KernelSpec s;
          s.params[std::string(p.name)] = v;
          if (holds(s)) when.push_back(p.is_bool ? (v ? std::string(p.name) : "not " + std::string(p.name))
                                                     : fmt::format("{}={}", p.name, p.choices[v]));
        }
        if (!when.empty() && static_cast<int64_t>(when.size()) < n) flags.push_back(join(when, " or "));
      }
      return flags;
    };
    if (d.present) {
      const std::vector<std::string> flags = flags_of(d.present);
      s += flags.empty() ? ", optional" : fmt::format(", if {}", join(flags, " and "));
    }
    if (!d.overwrites.empty()) {  // in place: "q_out ... (out_dtype, written over q if inplace)"
      const std::vector<std::string> flags = d.in_place ? flags_of(d.in_place) : std::vector<std::string>{};
      s += fmt::format(", written over {}{}", d.overwrites, flags.empty() ? "" : " if " + join(flags, " and "));
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

// One op as JSON (docs/json.md, kiln.ops).
nlohmann::json op_json(const OpTemplate& op) {
  nlohmann::json params = nlohmann::json::array();
  for (const ParamInfo& p : op.params()) {
    nlohmann::json j = {{"name", p.name}, {"doc", p.doc}, {"baked", p.baked}, {"bool", p.is_bool},
                        {"min", p.min_value}, {"max", p.max_value}};
    if (!p.choices.empty()) j["choices"] = std::vector<std::string>(p.choices.begin(), p.choices.end());
    if (p.default_value) j["default"] = *p.default_value;
    params.push_back(std::move(j));
  }
  nlohmann::json scalars = nlohmann::json::array();
  for (const ScalarInfo& s : op.scalars()) scalars.push_back({{"name", s.name}, {"default", s.default_value}, {"doc", s.doc}});
  nlohmann::json tensors = nlohmann::json::array();
  for (const TensorDecl& d : op.signature()) {
    tensors.push_back({{"name", d.name},
                       {"role", d.role == Role::input ? "input" : "output"},
                       {"dtype", d.dtype_rule == DTypeRule::in        ? std::string("dtype")
                                 : d.dtype_rule == DTypeRule::out     ? std::string("out_dtype")
                                 : d.dtype_rule == DTypeRule::derived ? std::string(d.dtype_doc)
                                                                      : std::string(dtype_name(d.fixed))},
                       {"shape", d.shape_doc},
                       {"optional", d.present != nullptr}});
    if (!d.overwrites.empty()) tensors.back()["overwrites"] = d.overwrites;
  }
  nlohmann::json dtypes = nlohmann::json::object();
  for (DType in : op.dtypes()) {
    std::vector<std::string> outs;
    for (DType out : kAllDTypes)
      if (op.supports_out_dtype(in, out)) outs.emplace_back(dtype_name(out));
    dtypes[std::string(dtype_name(in))] = outs;
  }
  return {{"name", op.name()}, {"summary", op.summary()}, {"parameters", params}, {"scalars", scalars},
          {"tensors", tensors}, {"dtypes", dtypes}};
}

Command add_ops_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("ops", "List the ops (parameters, scalars, tensors, dtypes) and the targets");
  auto op_name = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  cmd->add_option("op", *op_name, "Show only this op");
  cmd->add_flag("--json", *json, "Print one JSON document (docs/json.md: kiln.ops)");
  return [op_name, json]() -> int {
    if (*json) {
      nlohmann::json doc = {{"schema", "kiln.ops"}, {"schema_version", 1}};
      doc["ops"] = nlohmann::json::array();
      for (const OpTemplate* op : all_ops())
        if (op_name->empty() || op->name() == *op_name) doc["ops"].push_back(op_json(*op));
      if (!op_name->empty() && doc["ops"].empty()) return fail(find_op(*op_name).error());
      doc["targets"] = nlohmann::json::array();
      for (const TargetInfo& t : all_targets())
        doc["targets"].push_back({{"name", t.name}, {"vendor", t.vendor == Vendor::amd ? "amd" : "nvidia"},
                                  {"gpus", t.gpus}, {"wave_size", t.wave_size}, {"compute_units", t.compute_units},
                                  {"code_object", t.code_object}});
      fmt::print("{}\n", doc.dump(2));
      return 0;
    }
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
