// embedding_bwd: the gradient of an embedding table, deterministic (no atomics).
#pragma once

#include "templates/op_template.h"

namespace kiln {

/// Parameters: tokens (runtime; 0 is a no-op that writes dW = 0), vocab, hidden (baked),
/// ids_dtype (int32 or int64, default int64 as embedding's: docs/embedding.md), dw_dtype (fp32,
/// the default, or dy: dW in dy's dtype, as PyTorch's gradient; the sums are fp32 either way).
/// Tensors: ids [tokens] (int32/int64), dy [tokens, hidden] (dtype) -> dW [vocab, hidden] (fp32):
/// dW[v] = sum of dy[t] over the tokens with ids[t] = v, in token order, in fp32; 0 for ids
/// never seen; ids outside [0, vocab) contribute nothing. Bitwise deterministic: dW filled with
/// zeros, a counting sort of the token indices by id (integer counts, no atomics) in five
/// launches with a workspace, then one block per (seen id, column chunk) sums its tokens in order
/// (embedding_bwd.kernel; docs/embedding.md). bf16/fp16/fp32 dy.
class EmbeddingBwdOp final : public OpTemplate {
 public:
  std::string_view name() const override { return "embedding_bwd"; }
  std::string_view summary() const override {
    return "dW [vocab, hidden] (fp32, or dy's dtype) = sum of dy rows by token id, in token order (bitwise deterministic)";
  }
  std::span<const ParamInfo> params() const override;
  std::span<const DType> dtypes() const override;
  std::span<const TensorDecl> signature() const override;
  std::vector<KernelConfig> variants(const KernelSpec& spec, const TargetInfo& target) const override;
  std::string_view device_template(const KernelConfig& config) const override;
  std::string specialize(const KernelSpec& spec, const KernelConfig& config) const override;
  std::string_view kernel_name(const KernelConfig&) const override { return "kiln_embedding_bwd_sum"; }
  Plan plan(const KernelSpec& call, const KernelConfig& config) const override;
  std::vector<uint32_t> base_alignment(const KernelSpec& spec, const KernelConfig& config) const override;
  void init_inputs(const KernelSpec& spec, std::span<const TensorInfo> inputs, std::vector<std::vector<float>>& values,
                   std::mt19937_64& rng) const override;
  void reference(const KernelSpec& spec, const Scalars& scalars, std::span<const std::vector<float>> inputs,
                 std::span<const int64_t> rows, std::vector<RefOutput>& outputs) const override;
  std::vector<TestSpec> test_specs(const TargetInfo& target) const override;
};

}  // namespace kiln
