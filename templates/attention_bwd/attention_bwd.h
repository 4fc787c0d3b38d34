// attention backward: dq, dk, dv of the attention op (FlashAttention-2's backward, Dao 2023).
#pragma once

#include "templates/op_template.h"

namespace kiln {

/// Parameters: those of `attention` (layout, batch, seqlen_q/k or total_q/k and max_seqlen_q/k,
/// heads, kv_heads, head_dim, head_dim_v, causal, window_left, window_right, softcap) and
/// deterministic (baked, 0/1, default 0). Scalar: softmax_scale (0 = 1 / sqrt(head_dim)), as in
/// the forward call.
/// Tensors: dout (like out), q, k, v, out, lse fp32 [heads, tokens_q] (as the forward wrote them),
///   cu_seqlens_q, cu_seqlens_k (thd) -> dq (like q), dk (like k), dv (like v). For GQA, dk and dv
///   are summed over the heads / kv_heads query heads of each key/value head.
/// With P = exp(S - lse) and D = rowsum(dout * out): dV = P^T dO, dS = P (dO V^T - D) (times
/// 1 - tanh^2 with softcap), dQ = scale dS K, dK = scale dS^T Q.
/// Three launches (D into an fp32 workspace of 4 x heads x tokens_q bytes; dK/dV per key block;
/// dQ per query block), no atomics: every output is bitwise deterministic. Except on sm_90a with
/// deterministic = 0 (the default), for fixed-length (bshd) batches at head dim 64, and at 128
/// for those that are MHA or unmasked: there the atomic-dQ kernels run
/// (FlashAttention-3's five GEMMs, Shah et al. 2024): D (which also zeroes a second fp32 workspace
/// of (tokens_q / 64 + batch + 1) x heads x 64 x head_dim values), dK/dV, whose blocks add dQ into
/// that workspace with fp32 atomic adds, and a launch that converts it to dq; dq is then not bitwise
/// reproducible (summation order), dk and dv still are. deterministic = 1 keeps the three ordered
/// launches (H200: up to 13% slower at head dim 64, 4-8% at 128; docs/attention.md).
/// Kernels (docs/attention.md): MFMA on gfx942/gfx950 for head dims up to 128, TMA + WGMMA on
/// sm_90a for head dims 64 and 128, portable FlashAttention-2 kernels for every other case.
class AttentionBwdOp final : public OpTemplate {
 public:
  std::string_view name() const override { return "attention_bwd"; }
  std::string_view summary() const override {
    return "flash attention backward: dout, q, k, v, out, lse -> dq, dk, dv (GQA sums; deterministic)";
  }
  std::span<const ParamInfo> params() const override;
  std::span<const ScalarInfo> scalars() const override;
  std::span<const DType> dtypes() const override;
  std::span<const TensorDecl> signature() const override;
  std::vector<KernelConfig> variants(const KernelSpec& spec, const TargetInfo& target) const override;
  std::vector<KernelConfig> tuning_candidates(const KernelSpec& spec, const TargetInfo& target) const override;
  std::string_view device_template(const KernelConfig& config) const override;
  std::string specialize(const KernelSpec& spec, const KernelConfig& config) const override;
  std::string_view kernel_name(const KernelConfig&) const override { return "kiln_attention_bwd_dkdv"; }
  Plan plan(const KernelSpec& call, const KernelConfig& config) const override;
  uint32_t dynamic_shared_bytes(const KernelSpec& spec, const KernelConfig& config) const override;
  std::vector<uint32_t> base_alignment(const KernelSpec& spec, const KernelConfig& config) const override;
  void init_inputs(const KernelSpec& spec, std::span<const TensorInfo> inputs, std::vector<std::vector<float>>& values,
                   std::mt19937_64& rng) const override;
  void init_inputs_with_scalars(const KernelSpec& spec, const Scalars& scalars, std::span<const TensorInfo> inputs,
                                std::vector<std::vector<float>>& values, std::mt19937_64& rng) const override;
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
