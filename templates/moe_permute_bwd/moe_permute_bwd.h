// moe_permute_bwd: the gradient of moe_permute with respect to x.
#pragma once

#include "templates/op_template.h"

namespace kiln {

/// Parameters: tokens (runtime; 0 is a no-op), hidden, k (<= 32), accumulate (0/1, default 0), baked.
/// Tensors: dx_sorted [tokens * k, hidden] (bf16/fp16/fp32; the gradient of moe_permute's x_sorted),
/// row_map [tokens, k] int32 (moe_permute's), dx_in [tokens, hidden] (accumulate=1 only; the same
/// buffer as dx: written over, in place) -> dx [tokens, hidden] (dx_sorted's dtype):
///   dx[t] = (dx_in[t] +) sum over s = 0, 1, ..., k - 1 of dx_sorted[row_map[t, s]], in fp32 from
///   dx_in then in slot order, slots with row_map -1 (dropped) left out; a token with no slot gets
///   zeros (dx_in with accumulate). accumulate adds an MoE block's other gradient of x (its router
///   path: dlogits W_router) in the pass that sums the expert rows, so no add kernel runs.
/// Bitwise deterministic (slot order, no atomics); the kernel is moe_unpermute's without weights
/// (lib/moe_rows.kernel; docs/moe.md).
class MoePermuteBwdOp final : public OpTemplate {
 public:
  std::string_view name() const override { return "moe_permute_bwd"; }
  std::string_view summary() const override {
    return "dx[t] = sum_s dx_sorted[row_map[t, s]], in slot order (bitwise deterministic)";
  }
  std::span<const ParamInfo> params() const override;
  std::span<const DType> dtypes() const override;
  std::span<const TensorDecl> signature() const override;
  std::vector<KernelConfig> variants(const KernelSpec& spec, const TargetInfo& target) const override;
  std::string_view device_template(const KernelConfig& config) const override;
  std::string specialize(const KernelSpec& spec, const KernelConfig& config) const override;
  std::string_view kernel_name(const KernelConfig&) const override { return "kiln_moe_permute_bwd"; }
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
