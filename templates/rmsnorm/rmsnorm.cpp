#include "templates/rmsnorm/rmsnorm.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "templates/lib/fp8_scaling.h"

namespace kiln {
namespace {
const ParamInfo kParams[] = {
    {"rows", "rows (tokens); a runtime argument, not baked; 0 is a no-op", false, false, 0, (int64_t{1} << 31) - 1},
    {"hidden", "normalized (last) dimension", true, false, 1, 65536},
    {"residual", "fused residual add: normalize h = x + residual and write h (default 0)", true, true, 0, 1, {}, 0},
    {"save_rstd", "write rstd [rows] (fp32) for the backward (default 0)", true, true, 0, 1, {}, 0},
    {"fp8_out", "also write y_fp8 = y quantized to this fp8 dtype, with its scales, in the same pass (default none)",
     true, false, 0, 4, fp8_out_names(), 0, true},
    {"fp8_granularity", "y_fp8's scales: tensorwise (delayed scaling, from amax_history), rowwise (default), block1x128",
     true, false, 0, 2, fp8_fused_granularity_names(), kRowwise, true},
    {"history_len", "delayed scaling: entries of amax_history (default 1024)", false, false, 1, kFp8MaxHistory, {}, 1024},
    {"margin", "delayed scaling: the scale keeps amax_h at 2^-margin of the format's largest value (default 0)", false,
     false, 0, 64, {}, 0},
};
const ScalarInfo kScalars[] = {{"eps", 1e-5f, "added to mean(h^2) before the square root"}};
const DType kDTypes[] = {DType::bf16, DType::f16, DType::f32};

std::vector<int64_t> rows_hidden(const KernelSpec& s) { return {s.param("rows"), s.param("hidden")}; }
std::vector<int64_t> hidden(const KernelSpec& s) { return {s.param("hidden")}; }
std::vector<int64_t> rows(const KernelSpec& s) { return {s.param("rows")}; }
bool with_residual(const KernelSpec& s) { return s.param("residual") != 0; }
bool with_rstd(const KernelSpec& s) { return s.param("save_rstd") != 0; }
DType y_fp8_dtype(const KernelSpec& s) { return fp8_out_dtype(s); }
std::vector<int64_t> y_scale_shape(const KernelSpec& s) {
  return fp8_scale_shape(s.param("fp8_granularity"), s.param("rows"), s.param("hidden"));
}

const TensorDecl kSignature[] = {
    {"x", Role::input, DTypeRule::in, DType::f32, "[rows, hidden]", rows_hidden},
    {"residual", Role::input, DTypeRule::in, DType::f32, "[rows, hidden]", rows_hidden, with_residual},
    {"gamma", Role::input, DTypeRule::in, DType::f32, "[hidden]", hidden},
    {"amax_history", Role::input, DTypeRule::fixed, DType::f32, "[history_len]", fp8_history_shape, fp8_fused_delayed,
     "delayed scaling: max |y| of earlier calls, [0] the latest"},
    {"y", Role::output, DTypeRule::out, DType::f32, "[rows, hidden]", rows_hidden},
    {"h", Role::output, DTypeRule::in, DType::f32, "[rows, hidden]", rows_hidden, with_residual,
     "x + residual, rounded to the dtype"},
    {"rstd", Role::output, DTypeRule::fixed, DType::f32, "[rows]", rows, with_rstd, "1 / sqrt(mean(h^2) + eps)"},
    {"y_fp8", Role::output, DTypeRule::derived, DType::f32, "[rows, hidden]", rows_hidden, fp8_fused,
     "y (as stored) quantized as quantize_fp8 defines it", {}, nullptr, y_fp8_dtype, "fp8_out"},
    {"y_scale", Role::output, DTypeRule::fixed, DType::f32, "[1] | [rows] | [rows, ceil(hidden/128)]", y_scale_shape,
     fp8_fused, "y ~ float(y_fp8) * y_scale, per fp8_granularity (tensorwise | rowwise | block1x128)"},
    {"amax_history_out", Role::output, DTypeRule::fixed, DType::f32, "[history_len]", fp8_history_shape,
     fp8_fused_delayed, "the history with this call's max |y| pushed at [0] (written over amax_history)",
     "amax_history"},
};
// |y| = |h| / rms(h) * |gamma| reaches about sqrt(3) for uniform inputs.
constexpr Fp8FusedRowOp kFused = {"rmsnorm", "templates/rmsnorm/rmsnorm.kernel", "templates/rmsnorm/rmsnorm_fp8.kernel",
                                  "kiln_rmsnorm", "kiln_rmsnorm_fp8", 1.7f};
}  // namespace

std::span<const ParamInfo> RmsNormOp::params() const { return kParams; }
std::span<const ScalarInfo> RmsNormOp::scalars() const { return kScalars; }
std::span<const DType> RmsNormOp::dtypes() const { return kDTypes; }
std::span<const TensorDecl> RmsNormOp::signature() const { return kSignature; }
std::string_view RmsNormOp::device_template(const KernelConfig& c) const {
  return fp8_fused_device_template(kFused, c);
}
std::string_view RmsNormOp::kernel_name(const KernelConfig& c) const { return fp8_fused_kernel_name(kFused, c); }

Result<void> RmsNormOp::validate_rules(const KernelSpec& spec, const TargetInfo&) const {
  return fp8_fused_validate(kFused, with_defaults(spec));
}

// Each thread loads ITEMS vectors of VEC elements (16 bytes when VEC > 1) and keeps them in
// registers between the sum-of-squares pass and the scaling pass: about 2 vectors per thread on
// NVIDIA, whole wavefronts, at most 1024 threads. On the H100 (2026-11-27, `scripts/gpu_tune_membound.sh`,
// bf16, 8192 rows) 2 vectors a thread beat 4 by 2.5-4.2% at hidden 4096-16384, and 1 or 8 were
// slower still (the residual form: within 2% of each other). AMD keeps the 4 vectors a thread
// that no measurement there has replaced.
// About `per_thread` vectors a thread (more where a row needs more than 1024 threads).
KernelConfig norm_row_config_of(int64_t hidden, int64_t vec, int64_t per_thread, const TargetInfo& target) {
  const int64_t nvec = ceil_div(hidden, vec);
  const int64_t threads =
      std::clamp<int64_t>(round_up(ceil_div(nvec, per_thread), target.wave_size), target.wave_size, 1024);
  return {{"THREADS", threads}, {"VEC", vec}, {"ITEMS", ceil_div(nvec, threads)}};
}
KernelConfig norm_row_config(int64_t hidden, int64_t vec, const TargetInfo& target) {
  return norm_row_config_of(hidden, vec, target.vendor == Vendor::nvidia ? 2 : 4, target);
}

std::vector<KernelConfig> RmsNormOp::variants(const KernelSpec& spec, const TargetInfo& target) const {
  const KernelSpec s = with_defaults(spec);
  const int64_t hidden = s.param("hidden");
  const int64_t vec = 16 / static_cast<int64_t>(dtype_size(s.dtype));
  auto config = fp8_fused(s) ? fp8_row_config : norm_row_config;
  std::vector<KernelConfig> out;
  if (hidden % vec == 0 && hidden >= vec) out.push_back(config(hidden, vec, target));
  out.push_back(config(hidden, 1, target));
  return out;
}

std::vector<KernelConfig> RmsNormOp::tuning_candidates(const KernelSpec& spec, const TargetInfo& target) const {
  // The heuristic's, then 1, 2, 4 or 8 accesses per thread over whole wavefronts (at most 1024
  // threads): one block per row either way, a row in registers (`kiln run --bench` times them).
  const KernelSpec s = with_defaults(spec);
  std::vector<KernelConfig> out = {choose_config(s, target)};
  if (fp8_fused(s)) return out;
  for (int64_t items : {1, 2, 4, 8}) {
    KernelConfig c = norm_row_config_of(s.param("hidden"), out.front().at("VEC"), items, target);
    if (c.at("THREADS") <= target.max_threads_per_block && std::find(out.begin(), out.end(), c) == out.end())
      out.push_back(std::move(c));
  }
  // NVIDIA, without the residual: the heuristic's with the other loads of the template's LOAD
  // (plain ld.global; evict_last hints; Inductor's reload of x, the row not kept in registers).
  // H100, 2026-11-28, 8192 rows bf16, the tuner (then with L2 warm) and bench_membound with the winners
  // (L2 flushed), two rounds each: hidden 16384 LOAD 2 0.1856 / 0.1854 ms against 0.1874 (0.97 ->
  // 0.98x torch.compile); 4096 LOAD 3 0.0490 / 0.0491 against 0.0499; 8192 the heuristic's, with
  // LOAD 2 10% slower there. No one choice wins at every size, so they stay tuning candidates
  // (bench/results/h100-2026-11-27-session17/rmsnorm-load/).
  if (!s.param("residual") && target.vendor == Vendor::nvidia && out.front().at("VEC") > 1)
    for (int64_t load : {1, 2, 3}) {
      KernelConfig c = out.front();
      c["LOAD"] = load;
      out.push_back(std::move(c));
    }
  return out;
}
std::vector<uint32_t> RmsNormOp::base_alignment(const KernelSpec& spec, const KernelConfig& config) const {
  return fp8_fused_alignment(config, tensors(spec));
}

std::string RmsNormOp::specialize(const KernelSpec& given, const KernelConfig& c) const {
  const KernelSpec spec = with_defaults(given);
  return fp8_fused_defines(spec, c) + fmt::format("constexpr int HIDDEN = {};\nconstexpr int THREADS = {}, VEC = {}, ITEMS = {};\n"
                     "#define RESIDUAL {}\n#define SAVE_RSTD {}\n#define LOAD {}\n"
                     "typedef {} in_t;\ntypedef {} out_t;\n",
                     spec.param("hidden"), c.at("THREADS"), c.at("VEC"), c.at("ITEMS"), spec.param("residual"),
                     spec.param("save_rstd"), c.count("LOAD") ? c.at("LOAD") : 0, device_type_name(spec.dtype), device_type_name(spec.out_dtype));
}

Plan RmsNormOp::plan(const KernelSpec& given, const KernelConfig& c) const {
  Plan p;
  const KernelSpec call = with_defaults(given);
  const int64_t rows = call.param("rows");
  const bool delayed = fp8_fused_delayed(call);
  if (rows == 0 && !delayed) return p;
  // Tensors: x, residual?, gamma, amax_history? -> y, h?, rstd?, y_fp8?, y_scale?, amax_history_out?
  const std::vector<TensorInfo> ts = tensors(call);
  Launch l;
  l.kernel = std::string(kernel_name(c));
  l.geometry.grid.x = static_cast<uint32_t>(rows);
  l.geometry.block.x = static_cast<uint32_t>(c.at("THREADS"));
  uint32_t history = 0, scale = 0;
  for (uint32_t i = 0; i < ts.size(); ++i) {
    if (ts[i].name == "amax_history") history = i;
    if (ts[i].name == "y_scale") scale = i;
    if (ts[i].name != "amax_history" && ts[i].name != "amax_history_out") l.args.push_back(KernelArg::tensor(i));
  }
  fp8_fused_delayed_args(call, history, l.args);
  l.args.push_back(KernelArg::i32(rows));
  l.args.push_back(KernelArg::scalar(0));
  if (rows > 0) p.launches.push_back(l);
  fp8_fused_delayed_push(call, rows, history, scale, p);
  return p;
}

void RmsNormOp::init_inputs(const KernelSpec& spec, std::span<const TensorInfo> inputs,
                            std::vector<std::vector<float>>& values, std::mt19937_64& rng) const {
  OpTemplate::init_inputs(spec, inputs, values, rng);
  fp8_fused_init_history(kFused, with_defaults(spec), values, rng);
}

Gate RmsNormOp::gate(const KernelSpec& spec, const TensorInfo& output) const {
  return fp8_fused_gate(with_defaults(spec), output);
}

void RmsNormOp::reference(const KernelSpec& given, const Scalars& scalars, std::span<const std::vector<float>> inputs,
                          std::span<const int64_t> sampled, std::vector<RefOutput>& outputs) const {
  const KernelSpec spec = with_defaults(given);
  const int64_t H = spec.param("hidden");
  const bool residual = with_residual(spec), save = with_rstd(spec);
  const double eps = scalar(scalars, "eps");
  const std::vector<float>& x = inputs[0];
  const std::vector<float>* res = residual ? &inputs[1] : nullptr;
  const std::vector<float>& gamma = inputs[residual ? 2 : 1];
  outputs.assign(1 + residual + save, {});
  const std::vector<int64_t> rows = fp8_fused_reference_rows(spec, sampled);
  for (RefOutput& o : outputs) o.rows = rows;
  std::vector<double> h(static_cast<size_t>(H));
  for (int64_t row : rows) {
    double sum_sq = 0.0;
    for (int64_t c = 0; c < H; ++c) {
      const size_t i = static_cast<size_t>(row * H + c);
      // h is stored in the dtype and the kernel normalizes the stored value.
      h[c] = residual ? round_to_dtype(x[i] + (*res)[i], spec.dtype) : x[i];
      sum_sq += h[c] * h[c];
    }
    const double inv_rms = 1.0 / std::sqrt(sum_sq / H + eps);
    for (int64_t c = 0; c < H; ++c) outputs[0].values.push_back(h[c] * inv_rms * gamma[c]);
    if (residual) outputs[1].values.insert(outputs[1].values.end(), h.begin(), h.end());
    if (save) outputs.back().values.push_back(inv_rms);
  }
  fp8_fused_reference(spec, H, inputs, outputs);
}

std::vector<TestSpec> RmsNormOp::test_specs(const TargetInfo& target) const {
  std::vector<TestSpec> out;
  auto add = [&](DType t, int64_t rows, int64_t hidden, int residual, int save, std::string_view why) {
    out.push_back({{"rmsnorm", t, t, {{"rows", rows}, {"hidden", hidden}, {"residual", residual}, {"save_rstd", save}}},
                   why});
  };
  for (DType t : kDTypes) {
    add(t, 3, 1, 0, 0, "hidden 1");
    add(t, 5, 7, 1, 1, "hidden 7, residual, rstd (scalar variant)");
    add(t, 4, 1000, 0, 1, "hidden 1000");
    add(t, 2, 4096, 1, 0, "hidden 4096, vector loads");
  }
  add(DType::bf16, 0, 64, 0, 0, "0 rows: a no-op");
  add(DType::bf16, 9, 5120, 1, 1, "hidden 5120");
  // The fp8 output in the same pass.
  const auto [e4, e5] = fp8_test_formats(target);
  auto fp8 = [&](DType t, int64_t rows, int64_t hidden, int residual, DType f, int64_t g, int64_t len, int64_t margin,
                 std::string_view why) {
    KernelSpec s{"rmsnorm", t, t,
                 {{"rows", rows}, {"hidden", hidden}, {"residual", residual}, {"save_rstd", residual},
                  {"fp8_out", fp8_out_value(f)}, {"fp8_granularity", g}}};
    if (g == kTensorwise) {
      s.params["history_len"] = len;
      s.params["margin"] = margin;
    }
    out.push_back({s, why});
  };
  fp8(DType::bf16, 3, 4096, 0, e4, kRowwise, 0, 0, "fp8 rowwise, hidden 4096");
  fp8(DType::bf16, 3, 7, 0, e5, kRowwise, 0, 0, "fp8 rowwise, hidden 7 (scalar variant)");
  fp8(DType::f16, 4, 1000, 1, e4, kBlock1x128, 0, 0, "fp8 1x128, hidden 1000 (tail group), residual, rstd");
  fp8(DType::bf16, 2, 300, 0, e5, kBlock1x128, 0, 0, "fp8 1x128, hidden 300 (scalar variant: groups across wavefronts)");
  fp8(DType::f32, 2, 384, 0, e4, kBlock1x128, 0, 0, "fp8 1x128 from fp32 (32 lanes a group)");
  fp8(DType::bf16, 9, 1024, 1, e4, kTensorwise, 16, 0, "fp8 delayed tensorwise, history 16");
  fp8(DType::f32, 3, 100, 0, e5, kTensorwise, kFp8MaxHistory, 1, "fp8 delayed tensorwise, history 1024, margin 1");
  fp8(DType::bf16, 0, 64, 0, e4, kTensorwise, 4, 0, "fp8 delayed, 0 rows: the history's scale, amax 0 pushed");
  return out;
}

}  // namespace kiln
