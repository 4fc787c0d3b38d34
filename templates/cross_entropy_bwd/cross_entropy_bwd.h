// cross_entropy backward: dlogits from the per-token upstream gradient, the logits, the targets
// and the forward's saved log-sum-exp; optionally written in place over the logits.
#pragma once

#include "templates/op_template.h"

namespace kiln {

/// Parameters: tokens (runtime; 0 is a no-op), vocab, target_dtype (int64 (0, default) or int32
/// (1)), ignore_index (default -100), smoothing, z_loss (booleans; scalars label_smoothing,
/// default 0.1, and z_loss_weight, default 1e-4), as cross_entropy; inplace (baked boolean,
/// default 0): dlogits is written over the logits, whose buffer the caller passes for both
/// (Liger-Kernel's way to save the [tokens, vocab] buffer; Kernel::launch refuses two buffers).
/// Tensors: dloss [tokens] fp32, logits [tokens, vocab] (bf16/fp16/fp32), targets [tokens]
/// (int64 or int32), lse [tokens] fp32 (cross_entropy's) -> dlogits [tokens, vocab] (the logits'
/// dtype).
///   dlogits_ij = dloss_i (p_ij (1 + 2 z lse_i) - s / vocab - (1 - s) [j == t_i]),
///   p_ij = exp(x_ij - lse_i); 0 for the whole row where t_i == ignore_index; NaN where t_i is
///   outside [0, vocab). For PyTorch's mean reduction, dloss_i = 1 / count(t != ignore_index).
/// One read of the logits and one write of dlogits: an elementwise pass, grid (tokens, chunks of
/// a row). Variants: 16-byte vector accesses when vocab is a multiple of 16 bytes of elements and
/// logits and dlogits are 16-byte aligned; else one element per access.
class CrossEntropyBwdOp final : public OpTemplate {
 public:
  std::string_view name() const override { return "cross_entropy_bwd"; }
  std::string_view summary() const override {
    return "dlogits of cross_entropy from dloss, logits, targets and the saved lse; optionally in place";
  }
  std::span<const ParamInfo> params() const override;
  std::span<const ScalarInfo> scalars() const override;
  std::span<const DType> dtypes() const override;
  std::span<const TensorDecl> signature() const override;
  std::vector<KernelConfig> variants(const KernelSpec& spec, const TargetInfo& target) const override;
  std::vector<KernelConfig> tuning_candidates(const KernelSpec& spec, const TargetInfo& target) const override;
  std::string_view device_template(const KernelConfig& config) const override;
  std::string specialize(const KernelSpec& spec, const KernelConfig& config) const override;
  std::string_view kernel_name(const KernelConfig&) const override { return "kiln_cross_entropy_bwd"; }
  Plan plan(const KernelSpec& call, const KernelConfig& config) const override;
  std::vector<uint32_t> base_alignment(const KernelSpec& spec, const KernelConfig& config) const override;
  void init_inputs(const KernelSpec& spec, std::span<const TensorInfo> inputs, std::vector<std::vector<float>>& values,
                   std::mt19937_64& rng) const override;
  void reference(const KernelSpec& spec, const Scalars& scalars, std::span<const std::vector<float>> inputs,
                 std::span<const int64_t> rows, std::vector<RefOutput>& outputs) const override;
  std::vector<TestSpec> test_specs(const TargetInfo& target) const override;
};

}  // namespace kiln
