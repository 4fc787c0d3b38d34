// rmsnorm backward: dx and dgamma of y = x * rstd * gamma, rstd = 1 / sqrt(mean(x^2) + eps).
#pragma once

#include "templates/op_template.h"

namespace kiln {

/// Parameters: rows (runtime; 0 is a no-op), hidden (baked), recompute_rstd (0/1, baked,
/// default 0: rstd is an input, as the forward's save_rstd wrote it; 1: recomputed from x and eps),
/// residual_grad (0/1, baked, default 0: 1 adds dres to dx in the same pass).
/// Tensors, in this order: dy [rows, hidden], x [rows, hidden], gamma [hidden] (dtype), rstd [rows]
/// (fp32, unless recompute_rstd), dres [rows, hidden] (dtype, with residual_grad) -> dx [rows, hidden],
/// dgamma [hidden] (dtype).
///   dx = rstd * gamma * dy - x * rstd^3 / hidden * sum_j(dy_j * gamma_j * x_j) [+ dres]
///   dgamma = sum over rows of dy * x * rstd (dres does not enter it)
/// dres is the gradient arriving along the residual connection around the norm (a pre-norm
/// decoder's h = x + f(rmsnorm(x))): with it dx is the residual stream's whole gradient, added in
/// fp32 before the conversion to the output dtype, without a separate pass over [rows, hidden].
/// Two launches: a persistent row pass (each block owns a fixed set of rows, several at a time,
/// and loads the next rows while it reduces the current ones) that writes dx and per-block fp32
/// partial sums of dgamma into the workspace, then their reduction in a fixed order: dgamma is
/// bitwise deterministic across runs. bf16/fp16/fp32 with fp32 math. Scalars: eps (with
/// recompute_rstd). The configuration knobs are described in rmsnorm_bwd.cpp (BwdKnobs).
/// An optional fp8 output of dx in the same pass, as rmsnorm's for y (docs/gemm-fp8.md): fp8_out
/// (baked: none, the default, or dx_fp8's fp8 dtype; a training step takes e5m2, the gradient
/// format, for the dgrad GEMM's A operand), fp8_granularity (baked: tensorwise with delayed
/// scaling, rowwise (default), block1x128), history_len and margin (runtime, delayed scaling).
/// Tensors then: ..., amax_history [history_len] (tensorwise) -> dx, dgamma, dx_fp8 [rows, hidden],
/// dx_scale ([1] | [rows] | [rows, ceil(hidden/128)] fp32), amax_history_out (tensorwise, over
/// amax_history): dx as stored, quantized exactly as quantize_fp8 defines it. Its kernel
/// (rmsnorm_bwd_fp8.kernel) holds one row per block at a time (persistent, no prefetch), then the
/// same dgamma reduction; tensorwise adds kiln_fp8_amax_history.
class RmsNormBwdOp final : public OpTemplate {
 public:
  std::string_view name() const override { return "rmsnorm_bwd"; }
  std::string_view summary() const override {
    return "dx, dgamma of rmsnorm from dy, x, gamma and the saved rstd (or recomputed); deterministic dgamma";
  }
  std::span<const ParamInfo> params() const override;
  std::span<const ScalarInfo> scalars() const override;
  std::span<const DType> dtypes() const override;
  std::span<const TensorDecl> signature() const override;
  std::vector<KernelConfig> variants(const KernelSpec& spec, const TargetInfo& target) const override;
  KernelConfig choose_config(const KernelSpec& spec, const TargetInfo& target) const override;
  std::vector<KernelConfig> tuning_candidates(const KernelSpec& spec, const TargetInfo& target) const override;
  std::string_view device_template(const KernelConfig& config) const override;
  std::string specialize(const KernelSpec& spec, const KernelConfig& config) const override;
  std::string_view kernel_name(const KernelConfig& config) const override;
  Plan plan(const KernelSpec& call, const KernelConfig& config) const override;
  std::vector<uint32_t> base_alignment(const KernelSpec& spec, const KernelConfig& config) const override;
  void init_inputs(const KernelSpec& spec, std::span<const TensorInfo> inputs, std::vector<std::vector<float>>& values,
                   std::mt19937_64& rng) const override;
  void reference(const KernelSpec& spec, const Scalars& scalars, std::span<const std::vector<float>> inputs,
                 std::span<const int64_t> rows, std::vector<RefOutput>& outputs) const override;
  Gate gate(const KernelSpec& spec, const TensorInfo& output) const override;
  std::vector<TestSpec> test_specs(const TargetInfo& target) const override;

 protected:
  Result<void> validate_rules(const KernelSpec& spec, const TargetInfo& target) const override;
};

}  // namespace kiln
