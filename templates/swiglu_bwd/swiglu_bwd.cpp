#include "templates/swiglu_bwd/swiglu_bwd.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "templates/lib/elementwise_row.h"
#include "templates/lib/fp8_scaling.h"

namespace kiln {
namespace {
const ParamInfo kParams[] = {
    {"rows", "rows (tokens); a runtime argument, not baked; 0 is a no-op", false, false, 0, (int64_t{1} << 31) - 1},
    {"intermediate", "I: columns of dy; x and dx have 2*I", true, false, 1, int64_t{1} << 24},
    {"fp8_out",
     "also write dx_fp8 = dx quantized to this fp8 dtype (e5m2 for the dgrad GEMM), with its scales, in the same pass "
     "(default none)",
     true, false, 0, 4, fp8_out_names(), 0, true},
    {"fp8_granularity", "dx_fp8's scales: tensorwise (delayed scaling, from amax_history), rowwise (default), block1x128",
     true, false, 0, 2, fp8_fused_granularity_names(), kRowwise, true},
    {"history_len", "delayed scaling: entries of amax_history (default 1024)", false, false, 1, kFp8MaxHistory, {}, 1024},
    {"margin", "delayed scaling: the scale keeps amax_h at 2^-margin of the format's largest value (default 0)", false,
     false, 0, 64, {}, 0},
};
constexpr int64_t kFp8MaxColumns = 65536;  // the fp8 kernel keeps a row of dx (2*I) in registers
const DType kDTypes[] = {DType::bf16, DType::f16, DType::f32};
std::vector<int64_t> rows_2i(const KernelSpec& s) { return {s.param("rows"), 2 * s.param("intermediate")}; }
std::vector<int64_t> rows_i(const KernelSpec& s) { return {s.param("rows"), s.param("intermediate")}; }
DType dx_fp8_dtype(const KernelSpec& s) { return fp8_out_dtype(s); }
std::vector<int64_t> dx_scale_shape(const KernelSpec& s) {
  return fp8_scale_shape(s.param("fp8_granularity"), s.param("rows"), 2 * s.param("intermediate"));
}
const TensorDecl kSignature[] = {
    {"dy", Role::input, DTypeRule::in, DType::f32, "[rows, I]", rows_i},
    {"x", Role::input, DTypeRule::in, DType::f32, "[rows, 2*I]", rows_2i, nullptr, "gate | up"},
    {"amax_history", Role::input, DTypeRule::fixed, DType::f32, "[history_len]", fp8_history_shape, fp8_fused_delayed,
     "delayed scaling: max |dx| of earlier calls, [0] the latest"},
    {"dx", Role::output, DTypeRule::out, DType::f32, "[rows, 2*I]", rows_2i, nullptr, "dgate | dup"},
    {"dx_fp8", Role::output, DTypeRule::derived, DType::f32, "[rows, 2*I]", rows_2i, fp8_fused,
     "dx (as stored) quantized as quantize_fp8 defines it", {}, nullptr, dx_fp8_dtype, "fp8_out"},
    {"dx_scale", Role::output, DTypeRule::fixed, DType::f32, "[1] | [rows] | [rows, ceil(2*I/128)]", dx_scale_shape,
     fp8_fused, "dx ~ float(dx_fp8) * dx_scale, per fp8_granularity (tensorwise | rowwise | block1x128)"},
    {"amax_history_out", Role::output, DTypeRule::fixed, DType::f32, "[history_len]", fp8_history_shape,
     fp8_fused_delayed, "the history with this call's max |dx| pushed at [0] (written over amax_history)",
     "amax_history"},
};
// |dgate| reaches about 1.1 for inputs in [-1, 1] (dy = up = 1, gate = 1).
constexpr Fp8FusedRowOp kFused = {"swiglu_bwd", "templates/swiglu_bwd/swiglu_bwd.kernel",
                                  "templates/swiglu_bwd/swiglu_bwd_fp8.kernel", "kiln_swiglu_bwd",
                                  "kiln_swiglu_bwd_fp8", 1.1f};
}  // namespace

std::span<const ParamInfo> SwiGluBwdOp::params() const { return kParams; }
std::span<const DType> SwiGluBwdOp::dtypes() const { return kDTypes; }
std::span<const TensorDecl> SwiGluBwdOp::signature() const { return kSignature; }
std::string_view SwiGluBwdOp::device_template(const KernelConfig& c) const {
  return fp8_fused_device_template(kFused, c);
}
std::string_view SwiGluBwdOp::kernel_name(const KernelConfig& c) const { return fp8_fused_kernel_name(kFused, c); }

Result<void> SwiGluBwdOp::validate_rules(const KernelSpec& spec, const TargetInfo&) const {
  const KernelSpec s = with_defaults(spec);
  KILN_TRY(fp8_fused_validate(kFused, s));
  if (fp8_fused(s) && 2 * s.param("intermediate") > kFp8MaxColumns)
    return make_error(Errc::invalid_argument,
                      fmt::format("swiglu_bwd: with fp8_out a block keeps a row of dx in registers: intermediate = {} "
                                  "must be at most {}; quantize dx with quantize_fp8 instead",
                                  s.param("intermediate"), kFp8MaxColumns / 2));
  return ok();
}

std::vector<KernelConfig> SwiGluBwdOp::variants(const KernelSpec& spec, const TargetInfo& target) const {
  const KernelSpec s = with_defaults(spec);
  if (!fp8_fused(s))  // lib/elementwise_row.h: the measured block and the chunk-major order
    return elementwise_row_variants(s.param("intermediate"), s.dtype, target, swiglu_row_block(target, RowBlock{512, 2}));
  // The row of dx is dgate | dup: a vector must not straddle the halves, so VEC divides I.
  const int64_t I = s.param("intermediate"), vec = 16 / static_cast<int64_t>(dtype_size(s.dtype));
  std::vector<KernelConfig> out;
  if (I % vec == 0) out.push_back(fp8_row_config(2 * I, vec, target));
  out.push_back(fp8_row_config(2 * I, 1, target));
  return out;
}
std::vector<KernelConfig> SwiGluBwdOp::tuning_candidates(const KernelSpec& spec, const TargetInfo& target) const {
  const KernelSpec s = with_defaults(spec);
  KernelConfig first = choose_config(s, target);
  if (fp8_fused(s)) return {std::move(first)};
  return elementwise_row_candidates(s.param("intermediate"), std::move(first), target);
}
std::vector<uint32_t> SwiGluBwdOp::base_alignment(const KernelSpec& spec, const KernelConfig& config) const {
  return fp8_fused_alignment(config, tensors(spec));
}
std::string SwiGluBwdOp::specialize(const KernelSpec& given, const KernelConfig& c) const {
  const KernelSpec spec = with_defaults(given);
  return fp8_fused_defines(spec, c) + elementwise_row_defines(c) +
         fmt::format("constexpr int INTERMEDIATE = {};\nconstexpr int THREADS = {}, VEC = {}, ITEMS = {};\n"
                     "typedef {} in_t;\ntypedef {} out_t;\n",
                     spec.param("intermediate"), c.at("THREADS"), c.at("VEC"), c.at("ITEMS"),
                     device_type_name(spec.dtype), device_type_name(spec.out_dtype));
}
Plan SwiGluBwdOp::plan(const KernelSpec& given, const KernelConfig& c) const {
  Plan p;
  const KernelSpec call = with_defaults(given);
  const int64_t rows = call.param("rows");
  if (!c.count("FP8")) {
    if (rows == 0) return p;
    Launch l;  // the runtime delayed-scaling sizes are not arguments of this kernel
    l.kernel = "kiln_swiglu_bwd";
    l.geometry = elementwise_row_geometry(rows, call.param("intermediate"), c);
    l.args = {KernelArg::tensor(0), KernelArg::tensor(1), KernelArg::tensor(2), KernelArg::i32(rows)};
    p.launches.push_back(l);
    return p;
  }
  // Tensors: dy, x, amax_history? -> dx, dx_fp8, dx_scale, amax_history_out?; one block per row.
  const bool delayed = fp8_fused_delayed(call);
  const uint32_t h = delayed ? 1 : 0;
  Launch l;
  l.kernel = "kiln_swiglu_bwd_fp8";
  l.geometry.grid.x = static_cast<uint32_t>(rows);
  l.geometry.block.x = static_cast<uint32_t>(c.at("THREADS"));
  l.args = {KernelArg::tensor(0), KernelArg::tensor(1), KernelArg::tensor(2 + h), KernelArg::tensor(3 + h),
            KernelArg::tensor(4 + h)};
  fp8_fused_delayed_args(call, 2, l.args);
  l.args.push_back(KernelArg::i32(rows));
  if (rows > 0) p.launches.push_back(l);
  fp8_fused_delayed_push(call, rows, 2, 5, p);
  return p;
}

void SwiGluBwdOp::init_inputs(const KernelSpec& spec, std::span<const TensorInfo> inputs,
                              std::vector<std::vector<float>>& values, std::mt19937_64& rng) const {
  OpTemplate::init_inputs(spec, inputs, values, rng);
  fp8_fused_init_history(kFused, with_defaults(spec), values, rng);
}

Gate SwiGluBwdOp::gate(const KernelSpec& spec, const TensorInfo& output) const {
  return fp8_fused_gate(with_defaults(spec), output);
}

void SwiGluBwdOp::reference(const KernelSpec& given, const Scalars&, std::span<const std::vector<float>> in,
                            std::span<const int64_t> sampled, std::vector<RefOutput>& outputs) const {
  const KernelSpec spec = with_defaults(given);
  const int64_t I = spec.param("intermediate");
  outputs.assign(1, {});
  RefOutput& dx = outputs[0];
  dx.rows = fp8_fused_reference_rows(spec, sampled);
  for (int64_t row : dx.rows) {
    const float* dy = &in[0][static_cast<size_t>(row * I)];
    const float* x = &in[1][static_cast<size_t>(row * 2 * I)];
    const size_t base = dx.values.size();
    dx.values.resize(base + static_cast<size_t>(2 * I));
    for (int64_t c = 0; c < I; ++c) {
      const double g = x[c], u = x[I + c], d = dy[c];
      const double s = 1.0 / (1.0 + std::exp(-g));
      dx.values[base + c] = d * u * s * (1.0 + g * (1.0 - s));
      dx.values[base + I + c] = d * g * s;
    }
  }
  fp8_fused_reference(spec, 2 * I, in, outputs);
}

std::vector<TestSpec> SwiGluBwdOp::test_specs(const TargetInfo& target) const {
  std::vector<TestSpec> out = elementwise_row_test_specs("swiglu_bwd", target);
  // The fp8 output of dx in the same pass (e5m2 is the gradient's format; e4m3 served too).
  const auto [e4, e5] = fp8_test_formats(target);
  auto fp8 = [&](DType t, int64_t rows, int64_t I, DType f, int64_t g, int64_t len, int64_t margin, std::string_view why) {
    KernelSpec s{"swiglu_bwd", t, t,
                 {{"rows", rows}, {"intermediate", I}, {"fp8_out", fp8_out_value(f)}, {"fp8_granularity", g}}};
    if (g == kTensorwise) {
      s.params["history_len"] = len;
      s.params["margin"] = margin;
    }
    out.push_back({s, why});
  };
  fp8(DType::bf16, 3, 512, e5, kRowwise, 0, 0, "fp8 rowwise, I 512 (row 1024)");
  fp8(DType::f16, 2, 50, e5, kRowwise, 0, 0, "fp8 rowwise, I 50 (scalar variant)");
  fp8(DType::bf16, 4, 500, e5, kBlock1x128, 0, 0, "fp8 1x128, I 500 (a group across dgate | dup, tail group)");
  fp8(DType::f32, 2, 100, e4, kBlock1x128, 0, 0, "fp8 1x128 from fp32, I 100 (32 lanes a group, tail)");
  fp8(DType::bf16, 3, 65, e5, kBlock1x128, 0, 0, "fp8 1x128, I 65 (scalar variant: groups across wavefronts)");
  fp8(DType::bf16, 5, 256, e5, kTensorwise, 16, 0, "fp8 delayed tensorwise, history 16");
  fp8(DType::f16, 2, 7, e5, kTensorwise, 1, 2, "fp8 delayed tensorwise, I 7, history 1, margin 2");
  fp8(DType::bf16, 0, 64, e5, kTensorwise, 4, 0, "fp8 delayed, 0 rows: the history's scale, amax 0 pushed");
  return out;
}

}  // namespace kiln
