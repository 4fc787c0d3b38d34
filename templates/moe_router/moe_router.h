// moe_router: the Mixture-of-Experts router's top-k selection (forward).
#pragma once

#include "templates/op_template.h"

namespace kiln {

/// Parameters: tokens (runtime; 0 writes tokens_per_expert = 0), experts (<= 512), k (<= 32),
/// scoring (softmax (0, default: Mixtral, Qwen3-MoE, DeepSeek-V2) or sigmoid (1: DeepSeek-V3)),
/// n_group (default 1), topk_group (default 0 = every group), group_score (max (0, default:
/// DeepSeek-V2) or top2_sum (1: DeepSeek-V3)), renormalize (default false), bias (default false),
/// all baked; the runtime scalar routed_scaling_factor (default 1).
/// Tensors: logits [tokens, experts] (bf16/fp16/fp32), bias [experts] fp32 (with bias: the
/// score-correction bias, added for the selection only) -> topk_ids [tokens, k] int32,
/// topk_weights [tokens, k] fp32, tokens_per_expert [experts] int32.
///   score_e = softmax(logits)_e or sigmoid(logits_e), in fp32;
///   selection value v_e = score_e + bias_e (or the logit where that gives the same order);
///   with groups: experts split into n_group groups of consecutive experts, each scored by its
///   max v (or the sum of its top two), and only the topk_group best groups' experts selectable;
///   topk_ids[t] = the k experts of highest v, best first, ties to the lower expert index;
///   topk_weights[t, j] = score of topk_ids[t, j], divided by (sum of the k scores + 1e-20) when
///   renormalize, times routed_scaling_factor;
///   tokens_per_expert[e] = the number of (token, slot) pairs routed to e (exact, deterministic).
/// The check compares topk_ids bitwise except at near-ties of the fp32 selection values (below).
/// These are the routings of Hugging Face's MixtralSparseMoeBlock, Qwen3MoeSparseMoeBlock and
/// DeepseekV3TopkRouter (noaux_tc), except that experts of dropped groups are never selected
/// (DeepSeek-V3's reference fills them with 0, which a negative biased value could lose to).
/// Kernels: one wavefront per token, butterflies over the wave (moe_router.kernel), then a
/// second launch that sums the per-block expert counts (no atomics). docs/moe.md.
class MoeRouterOp final : public OpTemplate {
 public:
  std::string_view name() const override { return "moe_router"; }
  std::string_view summary() const override {
    return "MoE top-k routing of logits [tokens, experts]: softmax or sigmoid (+bias), group-limited, "
           "renormalized -> ids, weights, tokens per expert";
  }
  std::span<const ParamInfo> params() const override;
  std::span<const ScalarInfo> scalars() const override;
  std::span<const DType> dtypes() const override;
  std::span<const TensorDecl> signature() const override;
  std::vector<KernelConfig> variants(const KernelSpec& spec, const TargetInfo& target) const override;
  std::string_view device_template(const KernelConfig& config) const override;
  std::string specialize(const KernelSpec& spec, const KernelConfig& config) const override;
  std::string_view kernel_name(const KernelConfig&) const override { return "kiln_moe_router"; }
  Plan plan(const KernelSpec& call, const KernelConfig& config) const override;
  void init_inputs(const KernelSpec& spec, std::span<const TensorInfo> inputs, std::vector<std::vector<float>>& values,
                   std::mt19937_64& rng) const override;
  void reference(const KernelSpec& spec, const Scalars& scalars, std::span<const std::vector<float>> inputs,
                 std::span<const int64_t> rows, std::vector<RefOutput>& outputs) const override;
  std::vector<TestSpec> test_specs(const TargetInfo& target) const override;
  /// The near-tie gate of topk_ids: a token whose ids differ from the fp64 reference's is accepted
  /// only when they are a near-tie order of the reference's values (moe::near_tie_order: every
  /// swapped expert's selection value, and group score where group-limited, within
  /// moe::kNearTieUlps fp32 ulps of the one it replaces). The reference then takes the kernel's
  /// ids for that token, its weights become the reference weights of those experts (compared per
  /// chosen expert, not by slot) and tokens_per_expert counts them. Every other token is compared
  /// bitwise as before.
  bool compares_outputs() const override { return true; }
  AcceptedOutputs compare_outputs(const KernelSpec& spec, const Scalars& scalars,
                                  std::span<const std::vector<float>> inputs,
                                  std::span<const std::vector<double>> outputs,
                                  std::vector<RefOutput>& refs) const override;

 protected:
  Result<void> validate_rules(const KernelSpec& spec, const TargetInfo& target) const override;
};

}  // namespace kiln
