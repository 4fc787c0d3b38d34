// rope: rotary position embedding of q and k in one launch (forward).
#pragma once

#include "templates/lib/rope_params.h"

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
class RopeOp final : public RopeOpBase {
 public:
  std::string_view name() const override { return "rope"; }
  std::string_view summary() const override {
    return "rotary position embedding of q [tokens, Hq, D] and k [tokens, Hkv, D] in one launch (forward)";
  }
  std::span<const TensorDecl> signature() const override;
  std::string_view device_template(const KernelConfig& config) const override;
  std::string_view kernel_name(const KernelConfig&) const override { return "kiln_rope"; }

 protected:
  int sign() const override { return 1; }
};

}  // namespace kiln
