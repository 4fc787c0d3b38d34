// swiglu backward: dx [rows, 2*I] (dgate | dup) from dy [rows, I] and the forward's input x.
#pragma once

#include "templates/op_template.h"

namespace kiln {

/// Parameters: rows (runtime; 0 is a no-op), intermediate = I (baked); an optional fp8 output of dx
/// in the same pass, as swiglu's for y: fp8_out (baked: none, the default, or dx_fp8's fp8 dtype;
/// a training step takes e5m2, the gradient format, for the gate_up dgrad GEMM's A operand),
/// fp8_granularity (baked: tensorwise with delayed scaling, rowwise (default), block1x128, over the
/// 2*I columns of a row), history_len and margin (runtime, delayed scaling). I <= 32768 with fp8_out.
/// Tensors: dy [rows, I], x [rows, 2*I] (gate | up, the forward's input) -> dx [rows, 2*I]
/// (dgate | dup, the same halves). With s = sigmoid(gate):
///   dgate = dy * up * s * (1 + gate * (1 - s)),   dup = dy * gate * s.
/// With fp8_out: amax_history [history_len] (fp32 input, tensorwise) -> dx_fp8 [rows, 2*I],
/// dx_scale ([1] | [rows] | [rows, ceil(2*I/128)] fp32), amax_history_out (tensorwise, over
/// amax_history): dx as stored, quantized exactly as quantize_fp8 defines it (kiln_swiglu_bwd_fp8,
/// one block per row, swiglu_bwd_fp8.kernel; tensorwise adds kiln_fp8_amax_history).
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
  std::vector<KernelConfig> tuning_candidates(const KernelSpec& spec, const TargetInfo& target) const override;
  std::string_view device_template(const KernelConfig& config) const override;
  std::string specialize(const KernelSpec& spec, const KernelConfig& config) const override;
  std::string_view kernel_name(const KernelConfig& config) const override;
  Plan plan(const KernelSpec& call, const KernelConfig& config) const override;
  std::vector<uint32_t> base_alignment(const KernelSpec& spec, const KernelConfig& config) const override;
  void init_inputs(const KernelSpec& spec, std::span<const TensorInfo> inputs, std::vector<std::vector<float>>& values,
                   std::mt19937_64& rng) const override;
  Gate gate(const KernelSpec& spec, const TensorInfo& output) const override;
  void reference(const KernelSpec& spec, const Scalars& scalars, std::span<const std::vector<float>> inputs,
                 std::span<const int64_t> rows, std::vector<RefOutput>& outputs) const override;
  std::vector<TestSpec> test_specs(const TargetInfo& target) const override;

 protected:
  Result<void> validate_rules(const KernelSpec& spec, const TargetInfo& target) const override;
};

}  // namespace kiln
