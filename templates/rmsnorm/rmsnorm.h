// rmsnorm forward: y = x / sqrt(mean(x^2) + eps) * gamma over the last dimension, with an optional
// fused residual add (h = x + residual, y = rmsnorm(h) * gamma, h written too) and an optional
// fp32 rstd output saved for the backward.
#pragma once

#include "templates/op_template.h"

namespace kiln {

/// Parameters: rows (runtime; 0 is a no-op), hidden (baked), residual (0/1, baked),
/// save_rstd (0/1, baked); an optional fp8 output in the same pass: fp8_out (baked: none, the
/// default, or the fp8 dtype of y_fp8 in the target's encoding), fp8_granularity (baked:
/// tensorwise with delayed scaling, rowwise (default), block1x128), history_len and margin
/// (runtime, delayed scaling: as quantize_fp8's).
/// Tensors, in kernel-argument order:
///   x [rows, hidden] (dtype), residual [rows, hidden] (dtype, with residual=1),
///   gamma [hidden] (dtype) -> y [rows, hidden] (dtype), h [rows, hidden] (dtype, with residual=1:
///   x + residual rounded to dtype, the input of the next residual), rstd [rows] (fp32, with
///   save_rstd=1: 1 / sqrt(mean(h^2) + eps)).
///   With fp8_out: amax_history [history_len] (fp32, an input after gamma, tensorwise only) ->
///   y_fp8 [rows, hidden] (fp8_out), y_scale ([1] | [rows] | [rows, ceil(hidden/128)] fp32) and
///   amax_history_out (tensorwise; written over amax_history). y_fp8 and y_scale are y, as
///   stored in out_dtype, quantized exactly as quantize_fp8 defines it (rowwise, block1x128; and
///   tensorwise with scaling=delayed, whose history update they follow too): the GEMM that takes y
///   needs no quantize_fp8 pass over it. The fp8 kernel (kiln_rmsnorm_fp8, rmsnorm_fp8.kernel)
///   keeps the row in registers; tensorwise adds kiln_fp8_amax_history (one block) after it.
/// bf16/fp16/fp32 with fp32 accumulation. Scalars: eps (default 1e-5).
/// Kernel variants: 16-byte vector loads when hidden is a multiple of 16 bytes of elements and
/// every base is 16-byte aligned; else scalar loads (the fallback, any alignment).
/// The row configuration of the norms (rmsnorm, rmsnorm_bwd): one block per row, about 4 accesses
/// of VEC elements per thread (VEC: 16 bytes, or 1), whole wavefronts, at most 1024 threads.
KernelConfig norm_row_config(int64_t hidden, int64_t vec, const TargetInfo& target);

class RmsNormOp final : public OpTemplate {
 public:
  std::string_view name() const override { return "rmsnorm"; }
  std::string_view summary() const override {
    return "y = rmsnorm(x [+ residual]) * gamma over the last dimension, optional h and rstd outputs (forward)";
  }
  std::span<const ParamInfo> params() const override;
  std::span<const ScalarInfo> scalars() const override;
  std::span<const DType> dtypes() const override;
  std::span<const TensorDecl> signature() const override;
  std::vector<KernelConfig> variants(const KernelSpec& spec, const TargetInfo& target) const override;
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
