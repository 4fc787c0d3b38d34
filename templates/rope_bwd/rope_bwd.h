// rope_bwd: the backward of rope, the inverse rotation of the gradients of q and k in one launch.
#pragma once

#include "templates/lib/rope_params.h"

namespace kiln {

/// The parameters of rope (templates/rope/rope.h), the same meaning: tokens (runtime), heads,
/// kv_heads, head_dim, rotary_dim, interleaved, positions, batch (runtime), cos_sin, rope_theta,
/// scaling, max_pos (runtime), inplace, q_row_stride and k_row_stride (runtime; rows of dq_out
/// and dq, dk_out and dk; with inplace).
/// Tensors: dq_out [tokens, Hq, D], dk_out [tokens, Hkv, D] (the gradients of rope's q_out and
/// k_out; dtype), cu_seqlens int32 [batch + 1] or positions int32 [tokens], cos and sin fp32
/// [max_pos, R/2] (with cos_sin = cache) -> dq [tokens, Hq, D], dk [tokens, Hkv, D] (dtype;
/// written over dq_out and dk_out with inplace). With row strides, dq_out and dq are
/// [tokens, q_row_stride], dk_out and dk [tokens, k_row_stride].
/// The rotation by -angle of each pair (its transpose, the inverse), the pass-through copied.
/// bf16/fp16/fp32, computed in fp32. docs/rope.md.
class RopeBwdOp final : public RopeOpBase {
 public:
  std::string_view name() const override { return "rope_bwd"; }
  std::string_view summary() const override {
    return "backward of rope: dq, dk from dq_out, dk_out by the inverse rotation, in one launch";
  }
  std::span<const TensorDecl> signature() const override;
  std::string_view device_template(const KernelConfig& config) const override;
  std::string_view kernel_name(const KernelConfig&) const override { return "kiln_rope_bwd"; }

 protected:
  int sign() const override { return -1; }
};

}  // namespace kiln
