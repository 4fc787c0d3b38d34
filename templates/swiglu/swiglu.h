// swiglu forward: [rows, 2*I] -> [rows, I], y = silu(gate) * up (gate = first half of a row).
#pragma once

#include "templates/op_template.h"

namespace kiln {

/// Parameters: rows (runtime; 0 is a no-op), intermediate = I (baked); an optional fp8 output in
/// the same pass, as rmsnorm's: fp8_out (baked: none, the default, or y_fp8's fp8 dtype),
/// fp8_granularity (baked: tensorwise with delayed scaling, rowwise (default), block1x128),
/// history_len and margin (runtime, delayed scaling). I <= 65536 with fp8_out.
/// Tensors: x [rows, 2*I] (gate | up, as Llama's fused gate_up projection writes it), y [rows, I];
/// bf16/fp16/fp32, computed in fp32. With fp8_out: amax_history [history_len] (fp32 input,
/// tensorwise) -> y_fp8 [rows, I], y_scale ([1] | [rows] | [rows, ceil(I/128)] fp32),
/// amax_history_out (tensorwise, over amax_history): y as stored, quantized exactly as quantize_fp8
/// defines it (kiln_swiglu_fp8, one block per row, swiglu_fp8.kernel; tensorwise adds
/// kiln_fp8_amax_history).
/// Kernel variants: 16-byte vector loads when I is a multiple of 16 bytes of elements and the
/// bases are 16-byte aligned; else scalar loads.
class SwiGluOp final : public OpTemplate {
 public:
  std::string_view name() const override { return "swiglu"; }
  std::string_view summary() const override { return "[rows, 2*I] -> [rows, I], y = silu(gate) * up (forward)"; }
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
  void reference(const KernelSpec& spec, const Scalars& scalars, std::span<const std::vector<float>> inputs,
                 std::span<const int64_t> rows, std::vector<RefOutput>& outputs) const override;
  Gate gate(const KernelSpec& spec, const TensorInfo& output) const override;
  std::vector<TestSpec> test_specs(const TargetInfo& target) const override;

 protected:
  Result<void> validate_rules(const KernelSpec& spec, const TargetInfo& target) const override;
};

}  // namespace kiln
