// moe_router_bwd: the gradient of the MoE router's top-k weights with respect to its logits.
#pragma once

#include "templates/op_template.h"

namespace kiln {

/// Parameters: tokens (runtime; 0 is a no-op), experts (<= 512), k (<= 32), scoring (softmax (0,
/// default) or sigmoid (1)), renormalize (default false), all baked, as the forward's
/// (moe_router); the runtime scalar routed_scaling_factor (default 1).
/// Tensors: logits [tokens, experts] (bf16/fp16/fp32), topk_ids [tokens, k] int32 (the forward's),
/// dtopk_weights [tokens, k] fp32 -> dlogits [tokens, experts] (the logits' dtype).
/// With s = the scores (softmax or sigmoid of the logits), w_r = s of topk_ids[r],
/// S = sum_r w_r + 1e-20, c = routed_scaling_factor, g = dtopk_weights:
///   dw_r = c (g_r / S - sum_q g_q w_q / S^2) with renormalize, else c g_r;
///   softmax: dlogits_e = s_e (dw(e) - sum_r dw_r w_r), dw(e) = dw_r where topk_ids[r] = e, else 0;
///   sigmoid: dlogits_e = dw(e) s_e (1 - s_e).
/// The selection is not differentiable and the score-correction bias has no gradient (it only
/// selects). An id outside [0, experts) contributes nothing. One wavefront per token, fp32 math.
class MoeRouterBwdOp final : public OpTemplate {
 public:
  std::string_view name() const override { return "moe_router_bwd"; }
  std::string_view summary() const override {
    return "dlogits [tokens, experts] of the MoE router from dtopk_weights (softmax or sigmoid, renormalized)";
  }
  std::span<const ParamInfo> params() const override;
  std::span<const ScalarInfo> scalars() const override;
  std::span<const DType> dtypes() const override;
  std::span<const TensorDecl> signature() const override;
  std::vector<KernelConfig> variants(const KernelSpec& spec, const TargetInfo& target) const override;
  std::string_view device_template(const KernelConfig& config) const override;
  std::string specialize(const KernelSpec& spec, const KernelConfig& config) const override;
  std::string_view kernel_name(const KernelConfig&) const override { return "kiln_moe_router_bwd"; }
  Plan plan(const KernelSpec& call, const KernelConfig& config) const override;
  void init_inputs(const KernelSpec& spec, std::span<const TensorInfo> inputs, std::vector<std::vector<float>>& values,
                   std::mt19937_64& rng) const override;
  void reference(const KernelSpec& spec, const Scalars& scalars, std::span<const std::vector<float>> inputs,
                 std::span<const int64_t> rows, std::vector<RefOutput>& outputs) const override;
  std::vector<TestSpec> test_specs(const TargetInfo& target) const override;

 protected:
  Result<void> validate_rules(const KernelSpec& spec, const TargetInfo& target) const override;
};

}  // namespace kiln
