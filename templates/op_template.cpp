#include "templates/op_template.h"

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

Result<void> OpTemplate::validate(const KernelSpec& spec, const TargetInfo& target) const {
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
  return check(spec, target);
}

std::vector<uint32_t> OpTemplate::base_alignment(const KernelSpec& spec, const TileConfig&) const {
  return std::vector<uint32_t>(tensors(spec).size(), 1);
}

std::vector<uint32_t> vector_variant_alignment(const TileConfig& config, size_t tensors,
                                               std::initializer_list<size_t> scalar_tensors) {
  auto vec = config.find("VEC");
  std::vector<uint32_t> out(tensors, vec != config.end() && vec->second > 1 ? 16 : 1);
  for (size_t i : scalar_tensors)
    if (i < tensors) out[i] = 1;
  return out;
}

std::vector<TensorInfo> OpTemplate::tensors(const KernelSpec& given) const {
  const KernelSpec spec = with_defaults(given);
  std::vector<TensorInfo> out;
  for (const TensorDecl& d : signature()) {
    if (d.present && !d.present(spec)) continue;
    const DType t = d.dtype_rule == DTypeRule::in ? spec.dtype : d.dtype_rule == DTypeRule::out ? spec.out_dtype : d.fixed;
    out.push_back({std::string(d.name), t, d.shape(spec), d.role == Role::output});
    if (!d.overwrites.empty() && (!d.in_place || d.in_place(spec)))
      for (size_t i = 0; i + 1 < out.size(); ++i)
        if (out[i].name == d.overwrites && !out[i].output) out.back().overwrites = static_cast<int>(i);
  }
  return out;
}

KernelSpec OpTemplate::with_defaults(const KernelSpec& spec) const {
  KernelSpec out = spec;
  for (const ParamInfo& p : params())
    if (p.default_value) out.params.emplace(std::string(p.name), *p.default_value);
  return out;
}

KernelSpec OpTemplate::baked_spec(const KernelSpec& spec) const {
  KernelSpec baked = with_defaults(spec);
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

double OpTemplate::bytes(const KernelSpec& spec) const {
  double b = 0;
  for (const TensorInfo& t : tensors(spec)) b += static_cast<double>(t.bytes());
  return b;
}

int64_t OpTemplate::sample_dimension(const KernelSpec& spec) const {
  for (const TensorInfo& t : tensors(spec))
    if (t.output && !t.shape.empty()) return t.shape.front();
  return 0;
}

void OpTemplate::init_inputs(const KernelSpec& /*spec*/, std::span<const TensorInfo> inputs,
                             std::vector<std::vector<float>>& values, std::mt19937_64& rng) const {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  values.resize(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    values[i].resize(static_cast<size_t>(inputs[i].elements()));
    for (float& v : values[i]) {
      do v = round_to_dtype(dist(rng), inputs[i].dtype);
      while (v == 0.0f);
    }
  }
}

Launch OpTemplate::single_launch(const KernelSpec& call, const TileConfig& config, LaunchGeometry geometry) const {
  Launch l;
  l.kernel = std::string(kernel_name(config));
  l.geometry = geometry;
  const size_t n = tensors(call).size();
  for (size_t i = 0; i < n; ++i) l.args.push_back(KernelArg::tensor(static_cast<uint32_t>(i)));
  for (const ParamInfo& p : params())
    if (!p.baked) l.args.push_back(KernelArg::i32(call.param(std::string(p.name))));
  for (size_t i = 0; i < scalars().size(); ++i) l.args.push_back(KernelArg::scalar(static_cast<uint32_t>(i)));
  return l;
}

std::string Gate::describe() const {
  switch (kind) {
    case Kind::tolerance:
      return max_rel_fro >= 0 ? fmt::format("|err| <= {:g} + {:g}|ref| and rel. Frobenius < {:g}", atol, rtol, max_rel_fro)
                              : fmt::format("|err| <= {:g} + {:g}|ref|", atol, rtol);
    case Kind::snr: return fmt::format("SNR > {:g} dB", min_snr_db);
    case Kind::exact:
      return max_code_diff ? fmt::format("codes equal within {} step(s)", max_code_diff) : "bitwise equal codes";
  }
  return "";
}

Gate Gate::for_dtype(DType t) {
  Gate g;
  if (t == DType::f32) {
    g.atol = g.rtol = 1e-4;
    g.max_rel_fro = -1;
  } else if (t == DType::f16 || t == DType::bf16) {
    g.atol = g.rtol = 1e-2;
    g.max_rel_fro = 1e-2;
  } else {
    g.kind = Kind::exact;
  }
  return g;
}

std::string config_string(const TileConfig& config) {
  std::string out;
  for (const auto& [k, v] : config) out += fmt::format("{}{}={}", out.empty() ? "" : " ", k, v);
  return out;
}

std::string_view device_type_name(DType t) {
  switch (t) {
    case DType::f32: return "float";
    case DType::f16: return "kiln::f16";
    case DType::bf16: return "kiln::bf16";
    case DType::e4m3: return "kiln::fp8_e4m3";
    case DType::e5m2: return "kiln::fp8_e5m2";
    case DType::e4m3fnuz: return "kiln::fp8_e4m3fnuz";
    case DType::e5m2fnuz: return "kiln::fp8_e5m2fnuz";
    case DType::i32: return "int";
    case DType::i64: return "long long";
  }
  return "float";
}

}  // namespace kiln
