// moe_unpermute: the experts' output rows combined back into token order (MoE combine, one rank).
#pragma once

#include "templates/op_template.h"

namespace kiln {

/// Parameters: tokens (runtime; 0 is a no-op), hidden, k (<= 32), baked.
/// Tensors: y_sorted [tokens * k, hidden] (bf16/fp16/fp32; the experts' outputs in moe_permute's
/// row order), row_map [tokens, k] int32 (moe_permute's), topk_weights [tokens, k] fp32
/// (moe_router's) -> y [tokens, hidden] (y_sorted's dtype):
///   y[t] = sum over s = 0, 1, ..., k - 1 of topk_weights[t, s] * y_sorted[row_map[t, s]], in fp32,
///   slots with row_map -1 (dropped) left out; a token with no slot gets zeros.
/// Bitwise deterministic: the sum runs in slot order with fused multiply-adds, no atomics. One
/// block per (token, chunk of the row), 16-byte accesses where hidden allows (docs/moe.md).
class MoeUnpermuteOp final : public OpTemplate {
 public:
  std::string_view name() const override { return "moe_unpermute"; }
  std::string_view summary() const override {
    return "y[t] = sum_s topk_weights[t, s] * y_sorted[row_map[t, s]], in slot order (bitwise deterministic)";
  }
  std::span<const ParamInfo> params() const override;
  std::span<const DType> dtypes() const override;
  std::span<const TensorDecl> signature() const override;
  std::vector<KernelConfig> variants(const KernelSpec& spec, const TargetInfo& target) const override;
  std::string_view device_template(const KernelConfig& config) const override;
  std::string specialize(const KernelSpec& spec, const KernelConfig& config) const override;
  std::string_view kernel_name(const KernelConfig&) const override { return "kiln_moe_unpermute"; }
  Plan plan(const KernelSpec& call, const KernelConfig& config) const override;
  std::vector<uint32_t> base_alignment(const KernelSpec& spec, const KernelConfig& config) const override;
  void init_inputs(const KernelSpec& spec, std::span<const TensorInfo> inputs, std::vector<std::vector<float>>& values,
                   std::mt19937_64& rng) const override;
  void reference(const KernelSpec& spec, const Scalars& scalars, std::span<const std::vector<float>> inputs,
                 std::span<const int64_t> rows, std::vector<RefOutput>& outputs) const override;
  std::vector<TestSpec> test_specs(const TargetInfo& target) const override;

 protected:
  Result<void> validate_rules(const KernelSpec& spec, const TargetInfo& target) const override;
};

}  // namespace kiln
