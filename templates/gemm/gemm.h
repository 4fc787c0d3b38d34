// gemm: C[M,N] = op(A) @ op(B), fp32 accumulation (see gemm.kernel for layouts and algorithm).
#pragma once

#include "templates/op_template.h"

namespace kiln {

/// Parameters (all baked): M, N, K >= 1; trans_a, trans_b (0/1).
/// Tensors: A [M,K] (or [K,M] with trans_a), B [K,N] (or [N,K] with trans_b), C [M,N], all
/// row-major. Inputs bf16/fp16/fp32; out_dtype any of the three.
/// On sm_90a, bf16/fp16 inputs use the tensor-core kernels: gemm_sm90_tma.kernel (WGMMA, TMA
/// tensor maps for A and B, producer/consumer warpgroups, persistent grid) when the leading
/// dimensions are multiples of 8 elements, else gemm_sm90.kernel (WGMMA, cp.async pipeline).
/// fp32 inputs and AMD targets use the LDS-tiled gemm.kernel.
/// The TMA kernel needs A and B 16-byte aligned (every device allocation is); a launch with an
/// unaligned view fails with Errc::invalid_argument.
class GemmOp final : public OpTemplate {
 public:
  std::string_view name() const override { return "gemm"; }
  std::string_view summary() const override {
    return "C[M,N] = op(A) @ op(B); NT forward, NN dgrad, TN wgrad; fp32 accumulation";
  }
  std::span<const ParamInfo> params() const override;
  std::span<const DType> dtypes() const override;
  bool supports_out_dtype(DType, DType) const override { return true; }
  std::string_view device_template() const override;
  /// gemm_sm90.kernel (WGMMA) when the config says WGMMA=1, else the portable gemm.kernel.
  std::string_view device_template_for(const TileConfig& config) const override;
  std::string_view kernel_name() const override { return "kiln_gemm"; }
  TileConfig choose_config(const KernelSpec& spec, const TargetInfo& target) const override;
  /// The TMA kernel (sm_90a): the heuristic's tile, then the other of 128 x 256 (4 stages) and
  /// 128 x 128 (6 stages), each with tile-order groups of 8 row tiles (the kernel's default, no
  /// key) and of 16 (GROUP_M=16). Every other path: the heuristic's configuration only.
  std::vector<TileConfig> tuning_candidates(const KernelSpec& spec, const TargetInfo& target) const override;
  std::string specialize(const KernelSpec& spec, const TileConfig& config) const override;
  LaunchGeometry geometry(const KernelSpec& spec, const TileConfig& config) const override;
  std::vector<TensorInfo> tensors(const KernelSpec& spec) const override;
  std::vector<TensorMapInfo> tensor_maps(const KernelSpec& spec, const TileConfig& config) const override;
  void reference(const KernelSpec& spec, const Scalars& scalars,
                 std::span<const std::vector<float>> inputs, std::span<const int64_t> rows,
                 std::vector<double>& out) const override;

 protected:
  Result<void> check(const KernelSpec& spec, const TargetInfo& target) const override;
};

}  // namespace kiln
