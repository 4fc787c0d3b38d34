// rmsnorm forward: y = x / sqrt(mean(x^2) + eps) * gamma over the last dimension, with an optional
// fused residual add (h = x + residual, y = rmsnorm(h) * gamma, h written too) and an optional
// fp32 rstd output saved for the backward.
#pragma once

#include "templates/op_template.h"

namespace kiln {

/// Parameters: rows (runtime; 0 is a no-op), hidden (baked), residual (0/1, baked),
/// save_rstd (0/1, baked).
/// Tensors, in kernel-argument order:
///   x [rows, hidden] (dtype), residual [rows, hidden] (dtype, with residual=1),
///   gamma [hidden] (dtype) -> y [rows, hidden] (dtype), h [rows, hidden] (dtype, with residual=1:
///   x + residual rounded to dtype, the input of the next residual), rstd [rows] (fp32, with
///   save_rstd=1: 1 / sqrt(mean(h^2) + eps)).
/// bf16/fp16/fp32 with fp32 accumulation. Scalars: eps (default 1e-5).
/// Kernel variants: 16-byte vector loads when hidden is a multiple of 16 bytes of elements and
/// every base is 16-byte aligned; else scalar loads (the fallback, any alignment).
/// The row configuration of the norms (rmsnorm, rmsnorm_bwd): one block per row, about 4 accesses
/// of VEC elements per thread (VEC: 16 bytes, or 1), whole wavefronts, at most 1024 threads.
TileConfig norm_row_config(int64_t hidden, int64_t vec, const TargetInfo& target);

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
  std::vector<TileConfig> variants(const KernelSpec& spec, const TargetInfo& target) const override;
  std::string_view device_template(const TileConfig& config) const override;
  std::string specialize(const KernelSpec& spec, const TileConfig& config) const override;
  std::string_view kernel_name(const TileConfig&) const override { return "kiln_rmsnorm"; }
  Plan plan(const KernelSpec& call, const TileConfig& config) const override;
  std::vector<uint32_t> base_alignment(const KernelSpec& spec, const TileConfig& config) const override;
  void reference(const KernelSpec& spec, const Scalars& scalars, std::span<const std::vector<float>> inputs,
                 std::span<const int64_t> rows, std::vector<RefOutput>& outputs) const override;
  std::vector<TestSpec> test_specs(const TargetInfo& target) const override;
};

}  // namespace kiln
