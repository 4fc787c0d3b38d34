// moe_unpermute_bwd: the gradients of moe_unpermute (its rows and its weights).
#pragma once

#include "templates/op_template.h"

namespace kiln {

/// Parameters: tokens (runtime; 0 is a no-op), hidden, k (<= 32), baked.
/// Tensors: dy [tokens, hidden] (bf16/fp16/fp32; the gradient of moe_unpermute's y), y_sorted
/// [tokens * k, hidden], row_map [tokens, k] int32, topk_weights [tokens, k] fp32 (the forward's
/// inputs) -> dy_sorted [tokens * k, hidden] (dy's dtype), dtopk_weights [tokens, k] fp32:
///   dy_sorted[row_map[t, s]] = topk_weights[t, s] * dy[t];
///   dtopk_weights[t, s] = sum over the row of dy[t] * y_sorted[row_map[t, s]] (fp32);
///   a dropped slot (row_map -1) writes no row and dtopk_weights 0; rows of dy_sorted that no
///   slot maps to are not written.
/// Bitwise deterministic: one block per token, each thread's products summed in order, then a
/// fixed block reduction (docs/moe.md).
class MoeUnpermuteBwdOp final : public OpTemplate {
 public:
  std::string_view name() const override { return "moe_unpermute_bwd"; }
  std::string_view summary() const override {
    return "dy_sorted[row_map[t, s]] = w[t, s] dy[t] and dtopk_weights = <dy[t], y_sorted[row]> (deterministic)";
  }
  std::span<const ParamInfo> params() const override;
  std::span<const DType> dtypes() const override;
  std::span<const TensorDecl> signature() const override;
  std::vector<KernelConfig> variants(const KernelSpec& spec, const TargetInfo& target) const override;
  std::vector<KernelConfig> tuning_candidates(const KernelSpec& spec, const TargetInfo& target) const override;
  std::string_view device_template(const KernelConfig& config) const override;
  std::string specialize(const KernelSpec& spec, const KernelConfig& config) const override;
  std::string_view kernel_name(const KernelConfig&) const override { return "kiln_moe_unpermute_bwd"; }
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
