#include "templates/op_template.h"

#include <fmt/format.h>

#include <algorithm>

#include "templates/gemm/gemm.h"
#include "templates/rmsnorm/rmsnorm.h"
#include "templates/swiglu/swiglu.h"

namespace kiln {

Result<void> OpTemplate::validate(const KernelSpec& spec, const TargetInfo& target) const {
  if (spec.op != name())
    return make_error(Errc::invalid_argument,
                      fmt::format("spec for op '{}' given to op '{}'", spec.op, name()));
  auto ins = dtypes();
  if (std::find(ins.begin(), ins.end(), spec.dtype) == ins.end()) {
    std::string names;
    for (DType t : ins) names += fmt::format("{}{}", names.empty() ? "" : ", ", dtype_name(t));
    return make_error(Errc::invalid_argument,
                      fmt::format("{}: dtype '{}' is not supported; use one of: {}", name(),
                                  dtype_name(spec.dtype), names));
  }
  if (!supports_out_dtype(spec.dtype, spec.out_dtype))
    return make_error(Errc::invalid_argument,
                      fmt::format("{}: out_dtype '{}' is not supported with dtype '{}'{}", name(),
                                  dtype_name(spec.out_dtype), dtype_name(spec.dtype),
                                  name() == "gemm" ? "" : "; the output dtype equals the input dtype"));
  for (const auto& [key, value] : spec.params) {
    auto ps = params();
    if (std::none_of(ps.begin(), ps.end(), [&](const ParamInfo& p) { return p.name == key; })) {
      std::string names;
      for (const auto& p : ps) names += fmt::format("{}{}", names.empty() ? "" : ", ", p.name);
      return make_error(Errc::invalid_argument,
                        fmt::format("{}: unknown parameter '{}'; its parameters are: {}", name(),
                                    key, names));
    }
  }
  for (const ParamInfo& p : params()) {
    auto it = spec.params.find(std::string(p.name));
    if (it == spec.params.end())
      return make_error(Errc::invalid_argument,
                        fmt::format("{}: missing parameter '{}' ({})", name(), p.name, p.doc));
    if (it->second < p.min_value || it->second > p.max_value)
      return make_error(
          Errc::invalid_argument,
          p.is_bool ? fmt::format("{}: parameter '{}' = {} must be true or false (0 or 1)", name(),
                                  p.name, it->second)
                    : fmt::format("{}: parameter '{}' = {} is out of range; it must be in [{}, {}]",
                                  name(), p.name, it->second, p.min_value, p.max_value));
  }
  return check(spec, target);
}

KernelSpec OpTemplate::baked_spec(const KernelSpec& spec) const {
  KernelSpec baked = spec;
  for (const ParamInfo& p : params())
    if (!p.baked) baked.params.erase(std::string(p.name));
  return baked;
}

float OpTemplate::scalar(const Scalars& scalars, std::string_view key) const {
  for (const ScalarInfo& s : this->scalars()) {
    if (s.name != key) continue;
    auto it = scalars.find(std::string(key));
    return it == scalars.end() ? s.default_value : it->second;
  }
  return 0.0f;
}

std::string config_string(const TileConfig& config) {
  std::string out;
  for (const auto& [k, v] : config) out += fmt::format("{}{}={}", out.empty() ? "" : " ", k, v);
  return out;
}

std::span<const OpTemplate* const> all_ops() {
  static const GemmOp gemm;
  static const RmsNormOp rmsnorm;
  static const SwiGluOp swiglu;
  static const OpTemplate* const ops[] = {&gemm, &rmsnorm, &swiglu};
  return ops;
}

Result<const OpTemplate*> find_op(std::string_view op_name) {
  std::string names;
  for (const OpTemplate* op : all_ops()) {
    if (op->name() == op_name) return op;
    names += fmt::format("{}{}", names.empty() ? "" : ", ", op->name());
  }
  return make_error(Errc::unknown, fmt::format("unknown op '{}'; known ops: {}", op_name, names));
}

std::string_view device_type_name(DType t) {
  switch (t) {
    case DType::f32: return "float";
    case DType::f16: return "kiln::f16";
    case DType::bf16: return "kiln::bf16";
  }
  return "float";
}

}  // namespace kiln
