// grouped_gemm: many GEMMs of one shape family in one launch, the groups' row counts on the device
// (Mixture-of-Experts layers: one GEMM per expert over the tokens routed to it).
#pragma once

#include "templates/op_template.h"

namespace kiln {

/// Parameters: mode (baked): nt, nn (m-grouped) or tn (k-grouped); groups G, N, K (baked);
/// tokens (runtime: rows of the grouped operands; 0 is a no-op).
/// Tensors, with group g the rows offsets[g] .. offsets[g + 1] - 1 (int32 [G + 1], offsets[0] = 0,
/// offsets[G] = tokens, non-decreasing; as moe_permute writes them, on the device):
///   nt (forward y = x W_g^T): a [tokens, K], b [G, N, K], offsets -> c [tokens, N];
///   nn (dgrad dx = dy W_g):   a [tokens, K], b [G, K, N], offsets -> c [tokens, N];
///   tn (wgrad dW_g = dy_g^T x_g): a [tokens, N], b [tokens, K], offsets -> c [G, N, K]
///     (an empty group's c[g] is zero); with accumulate=1 (tn only, c fp32), a further input
///     c_in [G, N, K] fp32 that c is written over: c[g] = c_in[g] + a_g^T b_g (the caller passes
///     one buffer for both; an empty group's c[g] keeps c_in[g]): gradient accumulation over
///     micro-batches, as gemm_fp8's accumulate.
/// fp8 blockwise (dtype e4m3: OCP on gfx950 and sm_90a, FNUZ (e4m3fnuz) on gfx942; modes nt and tn):
///   a [tokens, K] and b [G, N, K] fp8 e4m3, offsets, sa [tokens, ceil(K/128)] fp32 (1 x 128
///   blocks of a's rows), sb [G, ceil(N/128), ceil(K/128)] fp32 (128 x 128 blocks of each b[g])
///   -> c [tokens, N] = (a * sa) (b[g] * sb[g])^T per group (DeepSeek-V3's fp8 recipe, as
///   DeepGEMM's m-grouped fp8 GEMM), c bf16, fp16 or fp32; the device code is gemm_fp8's
///   (templates/lib/fp8_mfma, fp8_sm90). Gate: 40 dB against the fp64 product of the
///   dequantized operands (gemm_fp8's). The dgrad dx_g = dy_g W_g is this mode with a = dy
///   (1 x 128 along the forward's N) and b = W^T [G, K, N] with sb [G, ceil(K/128), ceil(N/128)]
///   (quantize_fp8 only_qt block128x128 batch=G on W [G, N, K]; docs/grouped-gemm.md).
/// fp8 k-grouped wgrad (dtype e4m3, mode tn): a [P, N, 128] and b [P, K, 128] fp8, dy^T and x^T in
///   group-aligned 128-token panels (quantize_fp8 only_qt block1x128 groups=G on dy [tokens, N] and
///   x [tokens, K]; P = ceil(tokens/128) + G; group g's tokens fill panels offsets[g] / 128 + g
///   onwards, zero past its last token), sa [P, N] and sb [P, K] fp32 (1 x 128 scales along the
///   tokens, DeepSeek-V3's wgrad recipe) -> c[g] [N, K] = sum over g's panels p of
///   (a[p] * sa[p]) (b[p] * sb[p])^T, bf16, fp16 or fp32, with accumulate as for bf16 tn; an empty
///   group writes zeros (keeps c_in[g]). Each panel's product is promoted into fp32 with the outer
///   product sa(p, n) sb(p, k).
/// All row-major. Inputs bf16/fp16 (or fp8 as above), c bf16, fp16 or fp32; fp32 accumulation. Empty groups and
/// group sizes that are not multiples of a tile are legal; no host synchronisation.
/// Errors: accumulate=1 with mode nt / nn or with out_dtype other than fp32; fp8 with mode nn,
/// or mode nt on sm_90a with K not a multiple of 16 (invalid_argument, naming the fix). Offsets that are not as above are the caller's to avoid (the kernel reads them as
/// given; rows outside [0, tokens) are never touched).
class GroupedGemmOp final : public OpTemplate {
 public:
  std::string_view name() const override { return "grouped_gemm"; }
  std::string_view summary() const override {
    return "MoE grouped GEMM: one launch over G groups whose row offsets live on the device (nt, nn: m-grouped; tn: "
           "k-grouped wgrad)";
  }
  std::span<const ParamInfo> params() const override;
  std::span<const DType> dtypes() const override;
  bool supports_out_dtype(DType, DType out) const override { return is_float16_or_32(out); }
  std::span<const TensorDecl> signature() const override;
  std::vector<KernelConfig> variants(const KernelSpec& spec, const TargetInfo& target) const override;
  std::string_view device_template(const KernelConfig& config) const override;
  std::string specialize(const KernelSpec& spec, const KernelConfig& config) const override;
  std::string_view kernel_name(const KernelConfig&) const override { return "kiln_grouped_gemm"; }
  Plan plan(const KernelSpec& call, const KernelConfig& config) const override;
  std::vector<uint32_t> base_alignment(const KernelSpec& spec, const KernelConfig& config) const override;
  uint32_t dynamic_shared_bytes(const KernelSpec& spec, const KernelConfig& config) const override;
  /// sm_90a, m-grouped, where the TMA kernel applies: its 128 x 256 and 128 x 128 tiles and the
  /// cp.async kernel.
  std::vector<KernelConfig> tuning_candidates(const KernelSpec& spec, const TargetInfo& target) const override;
  void init_inputs(const KernelSpec& spec, std::span<const TensorInfo> inputs, std::vector<std::vector<float>>& values,
                   std::mt19937_64& rng) const override;
  void reference(const KernelSpec& spec, const Scalars& scalars, std::span<const std::vector<float>> inputs,
                 std::span<const int64_t> rows, std::vector<RefOutput>& outputs) const override;
  Gate gate(const KernelSpec& spec, const TensorInfo& output) const override;
  double flops(const KernelSpec& spec) const override;
  std::vector<TestSpec> test_specs(const TargetInfo& target) const override;

 protected:
  Result<void> validate_rules(const KernelSpec& spec, const TargetInfo& target) const override;
};

}  // namespace kiln
