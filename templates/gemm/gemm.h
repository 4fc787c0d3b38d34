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
/// On gfx942 and gfx950, bf16/fp16 inputs use the matrix-core kernel gemm_mfma.kernel (MFMA=1;
/// configurations and model in gemm_mfma.h). fp32 inputs and other AMD targets use the LDS-tiled
/// gemm.kernel.
/// The TMA kernel needs A, B and C 16-byte aligned (every device allocation is); a call with an
/// unaligned view is served by the cp.async kernel instead (a second variant, compiled on demand).
class GemmOp final : public OpTemplate {
 public:
  std::string_view name() const override { return "gemm"; }
  std::string_view summary() const override {
    return "C[M,N] = op(A) @ op(B); NT forward, NN dgrad, TN wgrad; fp32 accumulation";
  }
  std::span<const ParamInfo> params() const override;
  std::span<const DType> dtypes() const override;
  bool supports_out_dtype(DType, DType out) const override { return is_float16_or_32(out); }
  std::span<const TensorDecl> signature() const override;
  /// sm_90a with bf16/fp16 and TMA-able strides: the TMA kernel, then the cp.async kernel for
  /// calls whose bases are not 16-byte aligned. Elsewhere the heuristic's kernel only.
  std::vector<KernelConfig> variants(const KernelSpec& spec, const TargetInfo& target) const override;
  KernelConfig choose_config(const KernelSpec& spec, const TargetInfo& target) const override;
  /// The TMA kernel (sm_90a): the heuristic's tile, then the other of 128 x 256 (4 stages) and
  /// 128 x 128 (6 stages), each with tile-order groups of 8 row tiles (the kernel's default, no
  /// key) and of 16 (GROUP_M=16). Every other path: the heuristic's configuration only.
  std::vector<KernelConfig> tuning_candidates(const KernelSpec& spec, const TargetInfo& target) const override;
  /// gemm_sm90_tma.kernel (TMA=1), gemm_sm90.kernel (WGMMA=1), gemm_mfma.kernel (MFMA=1), else the
  /// portable gemm.kernel; the last two after the shared gemm_common.kernel.
  std::string_view device_template(const KernelConfig& config) const override;
  std::string specialize(const KernelSpec& spec, const KernelConfig& config) const override;
  uint32_t dynamic_shared_bytes(const KernelSpec& spec, const KernelConfig& config) const override;
  std::string_view kernel_name(const KernelConfig&) const override { return "kiln_gemm"; }
  Plan plan(const KernelSpec& call, const KernelConfig& config) const override;
  /// The TMA variant needs A, B and C 16-byte aligned.
  std::vector<uint32_t> base_alignment(const KernelSpec& spec, const KernelConfig& config) const override;
  /// B is scaled by 1/sqrt(K), so that outputs stay O(1) for any K.
  void init_inputs(const KernelSpec& spec, std::span<const TensorInfo> inputs, std::vector<std::vector<float>>& values,
                   std::mt19937_64& rng) const override;
  void reference(const KernelSpec& spec, const Scalars& scalars, std::span<const std::vector<float>> inputs,
                 std::span<const int64_t> rows, std::vector<RefOutput>& outputs) const override;
  double flops(const KernelSpec& spec) const override {
    return 2.0 * double(spec.param("M")) * double(spec.param("N")) * double(spec.param("K"));
  }
  std::vector<TestSpec> test_specs(const TargetInfo& target) const override;
  /// "MxNxK NT" (transposes of A and B).
  std::string short_form(const KernelSpec& spec) const override;
  /// The MFMA configurations' modelled throughput (gemm_mfma.h, docs/amd-gemm-model.md).
  std::vector<ModelLine> throughput_model(const KernelSpec& spec, const KernelConfig& config, const TargetInfo& target,
                                          int registers_per_lane) const override;

  /// The TMA tensor maps of a TMA configuration (A, B, C), in tensor order; empty otherwise.
  std::vector<TensorMapInfo> tensor_maps(const KernelSpec& spec, const KernelConfig& config) const;
  /// The launch geometry of a configuration.
  LaunchGeometry geometry(const KernelSpec& spec, const KernelConfig& config) const;

 protected:
  Result<void> validate_rules(const KernelSpec& spec, const TargetInfo& target) const override;
};

}  // namespace kiln
