// embedding: rows of a table gathered by token ids (forward).
#pragma once

#include "templates/op_template.h"

namespace kiln {

/// Parameters: tokens (runtime; 0 is a no-op), vocab, hidden (baked), ids_dtype (int32 or int64;
/// default int64, PyTorch's torch.long token ids, so a PyTorch caller's ids need no cast; int32
/// reads half the id bytes: examples/llama_step and the manifests name it. docs/embedding.md).
/// Tensors: ids [tokens] (int32/int64), W [vocab, hidden] (dtype) -> y [tokens, hidden] (dtype):
/// y[t] = W[ids[t]]; an id outside [0, vocab) gives a row of zeros (PyTorch raises an error there;
/// a kernel cannot: docs/embedding.md). bf16/fp16/fp32, copied exactly.
/// Kernel variants: 16-byte vector accesses when hidden is a multiple of 16 bytes of elements and
/// the bases of W and y are 16-byte aligned; else one element per access.
class EmbeddingOp final : public OpTemplate {
 public:
  std::string_view name() const override { return "embedding"; }
  std::string_view summary() const override { return "y[t] = W[ids[t]]: rows of W [vocab, hidden] gathered by token ids"; }
  std::span<const ParamInfo> params() const override;
  std::span<const DType> dtypes() const override;
  std::span<const TensorDecl> signature() const override;
  std::vector<KernelConfig> variants(const KernelSpec& spec, const TargetInfo& target) const override;
  std::string_view device_template(const KernelConfig& config) const override;
  std::string specialize(const KernelSpec& spec, const KernelConfig& config) const override;
  std::string_view kernel_name(const KernelConfig&) const override { return "kiln_embedding"; }
  Plan plan(const KernelSpec& call, const KernelConfig& config) const override;
  std::vector<uint32_t> base_alignment(const KernelSpec& spec, const KernelConfig& config) const override;
  void init_inputs(const KernelSpec& spec, std::span<const TensorInfo> inputs, std::vector<std::vector<float>>& values,
                   std::mt19937_64& rng) const override;
  void reference(const KernelSpec& spec, const Scalars& scalars, std::span<const std::vector<float>> inputs,
                 std::span<const int64_t> rows, std::vector<RefOutput>& outputs) const override;
  double bytes(const KernelSpec& spec) const override;
  std::vector<TestSpec> test_specs(const TargetInfo& target) const override;
};

}  // namespace kiln
