// rope: rotary position embedding of q and k in one launch (forward).
#pragma once

#include "templates/op_template.h"

namespace kiln {

/// Parameters: tokens (runtime; 0 is a no-op), heads (Hq), kv_heads (Hkv), head_dim (D),
/// rotary_dim (R, even, <= D; 0, the default: D), interleaved (0: rotate-half, GPT-NeoX/Llama;
/// 1: pairs (2i, 2i+1), GPT-J), positions (cu_seqlens: they restart at each packed sequence;
/// tensor: an int32 position per token), batch (runtime; sequences in cu_seqlens), cos_sin
/// (computed: from rope_theta and scaling in the kernel; cache: read from cos/sin tables),
/// rope_theta (the base, an integer, default 10000), scaling (none, or llama3: Llama-3.1's
/// frequency scaling, factor 8, low_freq_factor 1, high_freq_factor 4, original context 8192),
/// max_pos (runtime; rows of the cos/sin caches), inplace (q_out and k_out are q and k),
/// q_row_stride, k_row_stride (runtime; elements between consecutive tokens' rows of q and q_out,
/// k and k_out, with inplace: views of a fused qkv buffer; 0, the default: contiguous).
/// Tensors: q [tokens, Hq, D], k [tokens, Hkv, D] (dtype; [tokens, q_row_stride] and
/// [tokens, k_row_stride] with strides), cu_seqlens int32 [batch + 1] or positions int32
/// [tokens], cos and sin fp32 [max_pos, R/2] (with cos_sin = cache) -> q_out, k_out (q's and
/// k's shapes, dtype; written over q and k with inplace).
/// bf16/fp16/fp32, computed in fp32. docs/rope.md gives the conventions and the numerics.
class RopeOp final : public OpTemplate {
 public:
  std::string_view name() const override { return "rope"; }
  std::string_view summary() const override {
    return "rotary position embedding of q [tokens, Hq, D] and k [tokens, Hkv, D] in one launch (forward)";
  }
  std::span<const ParamInfo> params() const override;
  std::span<const DType> dtypes() const override;
  std::span<const TensorDecl> signature() const override;
  std::vector<TileConfig> variants(const KernelSpec& spec, const TargetInfo& target) const override;
  std::string_view device_template(const TileConfig& config) const override;
  std::string specialize(const KernelSpec& spec, const TileConfig& config) const override;
  std::string_view kernel_name(const TileConfig&) const override { return "kiln_rope"; }
  Plan plan(const KernelSpec& call, const TileConfig& config) const override;
  std::vector<uint32_t> base_alignment(const KernelSpec& spec, const TileConfig& config) const override;
  void init_inputs(const KernelSpec& spec, std::span<const TensorInfo> inputs, std::vector<std::vector<float>>& values,
                   std::mt19937_64& rng) const override;
  void reference(const KernelSpec& spec, const Scalars& scalars, std::span<const std::vector<float>> inputs,
                 std::span<const int64_t> rows, std::vector<RefOutput>& outputs) const override;
  std::vector<TestSpec> test_specs(const TargetInfo& target) const override;
  double bytes(const KernelSpec& spec) const override;
  std::string short_form(const KernelSpec& spec) const override;

 protected:
  Result<void> check(const KernelSpec& spec, const TargetInfo& target) const override;
};

}  // namespace kiln
