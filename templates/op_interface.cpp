#include "templates/op_interface.h"

#include <fmt/format.h>

#include <algorithm>

namespace kiln {
namespace {

std::string dtype_list(std::span<const DType> ts) {
  std::string names;
  for (DType t : ts) names += fmt::format("{}{}", names.empty() ? "" : ", ", dtype_name(t));
  return names;
}

}  // namespace

Result<void> OpInterface::validate(const KernelSpec& spec, const TargetInfo& target) const {
  if (spec.op != name())
    return make_error(Errc::invalid_argument, fmt::format("spec for op '{}' given to op '{}'", spec.op, name()));
  auto ins = dtypes();
  if (std::find(ins.begin(), ins.end(), spec.dtype) == ins.end())
    return make_error(Errc::invalid_argument, fmt::format("{}: dtype '{}' is not supported; use one of: {}", name(),
                                                          dtype_name(spec.dtype), dtype_list(ins)));
  if (!supports_out_dtype(spec.dtype, spec.out_dtype)) {
    std::vector<DType> outs;
    for (DType t : kAllDTypes)
      if (supports_out_dtype(spec.dtype, t)) outs.push_back(t);
    return make_error(Errc::invalid_argument,
                      fmt::format("{}: out_dtype '{}' is not supported with dtype '{}'; use one of: {}", name(),
                                  dtype_name(spec.out_dtype), dtype_name(spec.dtype), dtype_list(outs)));
  }
  for (const auto& [key, value] : spec.params) {
    auto ps = params();
    if (std::none_of(ps.begin(), ps.end(), [&](const ParamInfo& p) { return p.name == key; })) {
      std::string names;
      for (const auto& p : ps) names += fmt::format("{}{}", names.empty() ? "" : ", ", p.name);
      return make_error(Errc::invalid_argument,
                        fmt::format("{}: unknown parameter '{}'; its parameters are: {}", name(), key, names));
    }
  }
  for (const ParamInfo& p : params()) {
    auto it = spec.params.find(std::string(p.name));
    if (it == spec.params.end() && p.default_value) continue;
    if (it == spec.params.end())
      return make_error(Errc::invalid_argument, fmt::format("{}: missing parameter '{}' ({})", name(), p.name, p.doc));
    if (it->second < p.min_value || it->second > p.max_value) {
      std::string what;
      if (p.is_bool) {
        what = "must be true or false (0 or 1)";
      } else if (!p.choices.empty()) {
        std::string names;
        for (size_t i = 0; i < p.choices.size(); ++i)
          names += fmt::format("{}{} ({})", names.empty() ? "" : ", ", p.choices[i], i);
        what = fmt::format("must be one of: {}", names);
      } else {
        what = fmt::format("is out of range; it must be in [{}, {}]", p.min_value, p.max_value);
      }
      return make_error(Errc::invalid_argument, fmt::format("{}: parameter '{}' = {} {}", name(), p.name, it->second, what));
    }
  }
  for (const TensorInfo& t : tensors(spec))  // fp8 encodings of the target (dtype.h: fp8_for_target)
    if (is_fp8(t.dtype) && fp8_for_target(t.dtype, target) != t.dtype)
      return make_error(Errc::invalid_argument,
                        fmt::format("{}: tensor '{}' is {}, which {} does not convert natively; use the {} encodings "
                                    "there ({} / {})",
                                    name(), t.name, dtype_name(t.dtype), target.name,
                                    fp8_encoding_name(target.fp8_encoding),
                                    dtype_name(fp8_for_target(DType::e4m3, target)),
                                    dtype_name(fp8_for_target(DType::e5m2, target))));
  return validate_rules(spec, target);
}

std::vector<TensorInfo> OpInterface::tensors(const KernelSpec& given) const {
  const KernelSpec spec = with_defaults(given);
  std::vector<TensorInfo> out;
  for (const TensorDecl& d : signature()) {
    if (d.present && !d.present(spec)) continue;
    const DType t = d.dtype_rule == DTypeRule::in        ? spec.dtype
                    : d.dtype_rule == DTypeRule::out     ? spec.out_dtype
                    : d.dtype_rule == DTypeRule::derived ? d.derive(spec)
                                                         : d.fixed;
    out.push_back({std::string(d.name), t, d.shape(spec), d.role == Role::output});
    if (!d.overwrites.empty() && (!d.in_place || d.in_place(spec)))
      for (size_t i = 0; i < out.size(); ++i)
        if (!out[i].output && out[i].name == d.overwrites) out.back().overwrites = static_cast<int>(i);
  }
  return out;
}

KernelSpec OpInterface::with_defaults(const KernelSpec& spec) const {
  KernelSpec out = spec;
  for (const ParamInfo& p : params())
    if (p.default_value) out.params.emplace(std::string(p.name), *p.default_value);
  return out;
}

KernelSpec OpInterface::baked_spec(const KernelSpec& spec) const {
  KernelSpec baked = with_defaults(spec);
  for (const ParamInfo& p : params())
    if (!p.baked || (p.unkeyed_default && baked.param(std::string(p.name)) == p.default_value))
      baked.params.erase(std::string(p.name));
  return baked;
}

float OpInterface::scalar(const Scalars& scalars, std::string_view key) const {
  for (const ScalarInfo& s : this->scalars()) {
    if (s.name != key) continue;
    auto it = scalars.find(std::string(key));
    return it == scalars.end() ? s.default_value : it->second;
  }
  return 0.0f;
}

}  // namespace kiln
