// swiglu backward: dx [rows, 2*I] (dgate | dup) from dy [rows, I] and the forward's input x.
#pragma once

#include "templates/op_template.h"

namespace kiln {

/// Parameters: rows (runtime; 0 is a no-op), intermediate = I (baked).
/// Tensors: dy [rows, I], x [rows, 2*I] (gate | up, the forward's input) -> dx [rows, 2*I]
/// (dgate | dup, the same halves). With s = sigmoid(gate):
///   dgate = dy * up * s * (1 + gate * (1 - s)),   dup = dy * gate * s.
/// bf16/fp16/fp32, computed in fp32. Variants: 16-byte accesses, then scalar accesses.
class SwiGluBwdOp final : public OpTemplate {
 public:
  std::string_view name() const override { return "swiglu_bwd"; }
  std::string_view summary() const override {
    return "dx [rows, 2*I] (dgate | dup) from dy [rows, I] and x = gate | up (backward of swiglu)";
  }
  std::span<const ParamInfo> params() const override;
  std::span<const DType> dtypes() const override;
  std::span<const TensorDecl> signature() const override;
  std::vector<KernelConfig> variants(const KernelSpec& spec, const TargetInfo& target) const override;
  std::string_view device_template(const KernelConfig& config) const override;
  std::string specialize(const KernelSpec& spec, const KernelConfig& config) const override;
  std::string_view kernel_name(const KernelConfig&) const override { return "kiln_swiglu_bwd"; }
  Plan plan(const KernelSpec& call, const KernelConfig& config) const override;
  std::vector<uint32_t> base_alignment(const KernelSpec& spec, const KernelConfig& config) const override;
  void reference(const KernelSpec& spec, const Scalars& scalars, std::span<const std::vector<float>> inputs,
                 std::span<const int64_t> rows, std::vector<RefOutput>& outputs) const override;
  std::vector<TestSpec> test_specs(const TargetInfo& target) const override;
};

}  // namespace kiln
