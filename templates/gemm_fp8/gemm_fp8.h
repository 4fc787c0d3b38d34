// gemm_fp8: C[M,N] = (A * sa) @ (B * sb)^T with A [M,K] and B [N,K] in fp8 (both K-major), fp32
// scales (tensorwise, rowwise or DeepSeek-V3's blockwise), fp32 accumulation, C in bf16, fp16 or
// fp32, optionally accumulated into an fp32 C. docs/gemm-fp8.md says what a training step feeds it.
#pragma once

#include "templates/lib/fp8_scaling.h"
#include "templates/op_template.h"

namespace kiln {

/// Parameters (all baked): M, N, K >= 1 (any, tails included); granularity (tensorwise, rowwise,
/// blockwise, block1x128, mx); b_format (e4m3 or e5m2, default e4m3); accumulate (0/1, default 0).
/// KernelSpec: dtype = A's fp8 dtype, which also picks the encoding of both operands (OCP
/// fp8_e4m3 / fp8_e5m2 on sm_90a and gfx950, FNUZ fp8_e4m3fnuz / fp8_e5m2fnuz on gfx942);
/// out_dtype = C's dtype (bf16, fp16, fp32; fp32 with accumulate).
/// Formats: e4m3 x e4m3 (forward), e5m2 x e4m3 (dgrad, wgrad: A is the gradient) and e4m3 x e5m2;
/// e5m2 x e5m2 is served too.
/// Tensors, all row-major:
///   A  [M, K]  fp8 (dtype), K contiguous;
///   B  [N, K]  fp8 (b_format in dtype's encoding), K contiguous;
///   sa fp32: tensorwise [1]; rowwise [M]; blockwise and block1x128 [M, ceil(K/128)] (1 x 128 blocks);
///   sb fp32: tensorwise [1]; rowwise [N]; blockwise [ceil(N/128), ceil(K/128)] (128 x 128 blocks);
///      block1x128 [N, ceil(K/128)] (1 x 128 blocks, as A's: the wgrad GEMM, whose B is x^T);
///   mx (OCP MXFP8, OCP MX spec v1.0; gfx950 only): sa [M, ceil(K/32)] and sb [N, ceil(K/32)], e8m0
///      (one byte, 2^(b - 127)) per 32 consecutive k of a row, row-major: what quantize_fp8
///      granularity=mx writes. K need not be a multiple of 32 (the last group is shorter; the
///      kernel pads it with zeros);
///   C_in [M, N] fp32 (accumulate=1 only): the C accumulated into, overwritten by C (in place);
///   C  [M, N]  out_dtype.
/// Definition: C[m][n] = (C_in[m][n] +) sum_k float(A[m][k]) sa(m, k) float(B[n][k]) sb(n, k),
/// with sa(m, k) the scale of A's group holding (m, k) (quantize_fp8's layouts, fp8_scale_index);
/// A and B are what quantize_fp8 writes (q, or qt for a transposed operand) with its scale.
/// Kernels: gemm_fp8_mfma.kernel on gfx942 (FNUZ) and gfx950 (OCP), both with
/// v_mfma_f32_32x32x16_{fp8,bf8}_{fp8,bf8} (gfx950's 32x32x64 f8f6f4 form is a tuning candidate, not the choice, while
/// CI's CDNA emulator misdecodes it: docs/gemm-fp8.md): fp32 partial sums per 128 of K, promoted into the
/// accumulators with the block scales (blockwise, block1x128) or scaled once in the epilogue (tensorwise,
/// rowwise). sm_90a with K % 16 == 0: gemm_fp8_sm90_tma.kernel (TMA loads by a producer
/// warpgroup, fp8 WGMMA m64n128k32, persistent, partial sums promoted every 128 of K as DeepGEMM
/// does). Elsewhere, and for A or B views not 16-byte aligned, the portable LDS-tiled
/// gemm_fp8.kernel, which dequantizes the operands as it stages them.
/// mx on gfx950: gemm_fp8_mfma.kernel with v_mfma_scale_f32_32x32x64_f8f6f4, which applies both
/// operands' e8m0 scales per 32 k inside the instruction (one accumulation, no promotion).
/// Errors: accumulate with out_dtype other than fp32; M needing more than 65535 row blocks;
/// granularity mx on a target without gfx950's scaled MFMA (gfx942, sm_90a: Errc::unsupported,
/// naming blockwise and block1x128 as what serves there).
class GemmFp8Op final : public OpTemplate {
 public:
  std::string_view name() const override { return "gemm_fp8"; }
  std::string_view summary() const override {
    return "C[M,N] = (A*sa) @ (B*sb)^T, fp8 A [M,K] and B [N,K] K-major; tensorwise/rowwise/blockwise/block1x128 fp32 "
           "scales, mx e8m0 (gfx950)";
  }
  std::span<const ParamInfo> params() const override;
  std::span<const DType> dtypes() const override;
  bool supports_out_dtype(DType in, DType out) const override { return is_fp8(in) && is_float16_or_32(out); }
  std::span<const TensorDecl> signature() const override;
  /// gfx942, gfx950: the MFMA kernel (MFMA=1); sm_90a (K % 16 == 0): the TMA kernel (TMA=1);
  /// then the portable kernel for unaligned views. Elsewhere: the portable kernel.
  std::vector<KernelConfig> variants(const KernelSpec& spec, const TargetInfo& target) const override;
  std::string_view device_template(const KernelConfig& config) const override;
  std::string specialize(const KernelSpec& spec, const KernelConfig& config) const override;
  std::string_view kernel_name(const KernelConfig&) const override { return "kiln_gemm_fp8"; }
  Plan plan(const KernelSpec& call, const KernelConfig& config) const override;
  uint32_t dynamic_shared_bytes(const KernelSpec& spec, const KernelConfig& config) const override;
  /// sm_90a with K % 16 == 0: the TMA kernel with and without DBUF, with three consumer
  /// warpgroups (BM 192), and the cp.async WGMMA kernel.
  std::vector<KernelConfig> tuning_candidates(const KernelSpec& spec, const TargetInfo& target) const override;
  /// The MFMA kernel needs A and B 16-byte aligned where K % 16 == 0 (16-byte loads); the portable
  /// kernel, its fallback, needs nothing.
  std::vector<uint32_t> base_alignment(const KernelSpec& spec, const KernelConfig& config) const override;
  /// fp8 values spread over the format's range, scales about 1 / FP8_MAX (B's also 1 / sqrt(K))
  /// and different per group, so that a wrong scale index shows.
  void init_inputs(const KernelSpec& spec, std::span<const TensorInfo> inputs, std::vector<std::vector<float>>& values,
                   std::mt19937_64& rng) const override;
  /// fp64 on the dequantized inputs.
  void reference(const KernelSpec& spec, const Scalars& scalars, std::span<const std::vector<float>> inputs,
                 std::span<const int64_t> rows, std::vector<RefOutput>& outputs) const override;
  /// SNR > 40 dB against the fp64 reference of the dequantized inputs (issue 17).
  Gate gate(const KernelSpec& spec, const TensorInfo& output) const override;
  double flops(const KernelSpec& spec) const override {
    return 2.0 * double(spec.param("M")) * double(spec.param("N")) * double(spec.param("K"));
  }
  std::vector<TestSpec> test_specs(const TargetInfo& target) const override;
  /// The MFMA kernel's modelled throughput on gfx942 / gfx950 (MI300X / MI355X datasheet figures,
  /// docs/gemm-fp8.md): modelled, not measured.
  std::vector<ModelLine> throughput_model(const KernelSpec& spec, const KernelConfig& config, const TargetInfo& target,
                                          int registers_per_lane) const override;
  /// "MxNxK blockwise e5m2xe4m3".
  std::string short_form(const KernelSpec& spec) const override;

 protected:
  Result<void> validate_rules(const KernelSpec& spec, const TargetInfo& target) const override;
};

/// B's dtype for a gemm_fp8 spec: b_format in the encoding of dtype.
DType gemm_fp8_b_dtype(const KernelSpec& spec);

}  // namespace kiln
