// cross_entropy forward: per-token loss and log-sum-exp of logits [tokens, vocab] against integer
// targets, with ignore_index, label smoothing (PyTorch's definition) and z-loss (PaLM).
#pragma once

#include "templates/op_template.h"

namespace kiln {

/// Parameters: tokens (runtime; 0 is a no-op), vocab (baked), target_dtype (baked: int64 (0,
/// default: PyTorch's torch.long targets, taken without a cast; docs/cross-entropy.md) or int32
/// (1)), ignore_index (baked, default -100), smoothing and z_loss (baked booleans, default 0)
/// that switch on the terms whose weights are the runtime scalars label_smoothing (default 0.1)
/// and z_loss_weight (default 1e-4); split_rows (baked: auto (0, default), never (1), always (2);
/// see below).
/// Tensors: logits [tokens, vocab] (bf16/fp16/fp32), targets [tokens] (int64 or int32) ->
/// loss [tokens] fp32, lse [tokens] fp32 (log-sum-exp of the row, saved for cross_entropy_bwd).
///   lse_i  = log(sum_j exp(x_ij))
///   loss_i = lse_i - (1 - s) x_i,t - s/vocab sum_j x_ij + z lse_i^2  (s = label_smoothing with
///            smoothing, else 0; z = z_loss_weight with z_loss, else 0)
///   a token whose target is ignore_index: loss 0 (lse is still written); a target outside
///   [0, vocab) that is not ignore_index: loss NaN.
/// PyTorch's F.cross_entropy(reduction="mean") is sum(loss) / count(targets != ignore_index);
/// the op does not count the tokens (docs/cross-entropy.md).
/// Kernel: one block per token, an online (max, sum) pass over the row in chunks (Milakov and
/// Gimelshein, "Online normalizer calculation for softmax", 2018): one read of the logits. With
/// few tokens (split_rows: auto, below 2 blocks per SM/CU; or always), SPLIT blocks per token each
/// reduce a slice of the row into a workspace normalizer, and a second launch merges them.
/// grad_inplace (baked boolean, default 0): Liger-Kernel's fused loss and gradient for a loss
/// whose upstream gradient is known before the forward (a mean or sum): also takes dloss [tokens]
/// fp32 and writes dlogits [tokens, vocab] (the logits' dtype) over the logits in the same launch,
/// dlogits_j = dloss_i (p_j (1 + 2 z lse_i) - s/vocab - (1 - s) [j == t]) as cross_entropy_bwd;
/// the caller passes the logits' buffer for both. One block per SM/CU loops over rows and reads
/// each row twice, the second time mostly from the L2 cache. On sm_90a, for 16-byte rows longer
/// than 96 KiB, a thread-block cluster holds each row in its blocks' shared memory instead
/// (kiln_cross_entropy_grad_cluster, QuACK's design): exactly one read and one write of the
/// logits, where cross_entropy + cross_entropy_bwd make two reads and a write. split_rows=always
/// is refused.
/// Variants: 16-byte vector loads when vocab is a multiple of 16 bytes of elements and the
/// logits are 16-byte aligned; else one element per load.
class CrossEntropyOp final : public OpTemplate {
 public:
  std::string_view name() const override { return "cross_entropy"; }
  std::string_view summary() const override {
    return "per-token loss and lse of logits [tokens, vocab] against targets; ignore_index, label smoothing, z-loss";
  }
  std::span<const ParamInfo> params() const override;
  std::span<const ScalarInfo> scalars() const override;
  std::span<const DType> dtypes() const override;
  std::span<const TensorDecl> signature() const override;
  std::vector<KernelConfig> variants(const KernelSpec& spec, const TargetInfo& target) const override;
  std::vector<KernelConfig> tuning_candidates(const KernelSpec& spec, const TargetInfo& target) const override;
  std::string_view device_template(const KernelConfig& config) const override;
  std::string specialize(const KernelSpec& spec, const KernelConfig& config) const override;
  std::string_view kernel_name(const KernelConfig& config) const override;
  uint32_t dynamic_shared_bytes(const KernelSpec& spec, const KernelConfig& config) const override;
  Result<void> validate_rules(const KernelSpec& spec, const TargetInfo& target) const override;
  Plan plan(const KernelSpec& call, const KernelConfig& config) const override;
  std::vector<uint32_t> base_alignment(const KernelSpec& spec, const KernelConfig& config) const override;
  void init_inputs(const KernelSpec& spec, std::span<const TensorInfo> inputs, std::vector<std::vector<float>>& values,
                   std::mt19937_64& rng) const override;
  void reference(const KernelSpec& spec, const Scalars& scalars, std::span<const std::vector<float>> inputs,
                 std::span<const int64_t> rows, std::vector<RefOutput>& outputs) const override;
  std::vector<TestSpec> test_specs(const TargetInfo& target) const override;
};

}  // namespace kiln
