// attention forward: out = softmax(mask(softcap(scale * q k^T))) v per head, and its log-sum-exp,
// with FlashAttention-2's algorithm (Dao, "FlashAttention-2: Faster Attention with Better
// Parallelism and Work Partitioning", 2023): tiled online softmax, no S x S matrix in memory.
#pragma once

#include "templates/op_template.h"

namespace kiln {

/// Parameters (docs/attention.md has the full table):
///   layout (baked): bshd (fixed length; runtime batch, seqlen_q, seqlen_k) or thd (packed
///     variable length; runtime batch, total_q, total_k, max_seqlen_q, max_seqlen_k and the
///     cu_seqlens_q / cu_seqlens_k int32 [batch + 1] offsets);
///   heads, kv_heads (baked; heads % kv_heads == 0: GQA, MQA with kv_heads = 1);
///   head_dim (baked: 64, 128, 192 or 256), head_dim_v (baked; 0 = head_dim; 192/128 as DeepSeek);
///   causal (bottom-right aligned as FlashAttention 2.1+: query i of a sequence sees key j when
///     j <= i + seqlen_k - seqlen_q), window_left / window_right (-1 = unbounded; query i sees
///     keys i + seqlen_k - seqlen_q - window_left ... + window_right), softcap (an integer; 0 =
///     none; scores become softcap * tanh(score / softcap)).
/// Scalar: softmax_scale (0 = 1 / sqrt(head_dim)).
/// Tensors: q [tokens_q, heads, head_dim], k [tokens_k, kv_heads, head_dim],
///   v [tokens_k, kv_heads, head_dim_v] (bshd: [batch, seqlen, heads, dim], the same memory),
///   cu_seqlens_q, cu_seqlens_k (thd) -> out [tokens_q, heads, head_dim_v] (dtype of q),
///   lse fp32 [heads, tokens_q] (natural log of the row's sum of exp(score); -inf, with out = 0,
///   for a row that sees no key). bf16/fp16 in and out, fp32 math.
/// Errors: heads % kv_heads, an unsupported head_dim, causal with window_right > 0, token counts
/// above the int32 offsets, parameters of the other layout.
class AttentionOp final : public OpTemplate {
 public:
  std::string_view name() const override { return "attention"; }
  std::string_view summary() const override {
    return "flash attention forward (FlashAttention-2; FlashAttention-3's TMA + WGMMA on sm_90a): q, k, v -> out, lse; causal, sliding window, softcap, GQA, "
           "varlen";
  }
  std::span<const ParamInfo> params() const override;
  std::span<const ScalarInfo> scalars() const override;
  std::span<const DType> dtypes() const override;
  std::span<const TensorDecl> signature() const override;
  std::vector<KernelConfig> variants(const KernelSpec& spec, const TargetInfo& target) const override;
  std::string_view device_template(const KernelConfig& config) const override;
  std::string specialize(const KernelSpec& spec, const KernelConfig& config) const override;
  std::string_view kernel_name(const KernelConfig&) const override { return "kiln_attention_fwd"; }
  Plan plan(const KernelSpec& call, const KernelConfig& config) const override;
  uint32_t dynamic_shared_bytes(const KernelSpec& spec, const KernelConfig& config) const override;
  std::vector<KernelConfig> tuning_candidates(const KernelSpec& spec, const TargetInfo& target) const override;
  std::vector<uint32_t> base_alignment(const KernelSpec& spec, const KernelConfig& config) const override;
  void init_inputs(const KernelSpec& spec, std::span<const TensorInfo> inputs, std::vector<std::vector<float>>& values,
                   std::mt19937_64& rng) const override;
  void reference(const KernelSpec& spec, const Scalars& scalars, std::span<const std::vector<float>> inputs,
                 std::span<const int64_t> rows, std::vector<RefOutput>& outputs) const override;
  int64_t sample_dimension(const KernelSpec& spec) const override;
  Gate gate(const KernelSpec& spec, const TensorInfo& output) const override;
  double flops(const KernelSpec& spec) const override;
  std::vector<TestSpec> test_specs(const TargetInfo& target) const override;

 protected:
  Result<void> validate_rules(const KernelSpec& spec, const TargetInfo& target) const override;
};

}  // namespace kiln
