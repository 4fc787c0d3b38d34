// swiglu forward: [rows, 2*I] -> [rows, I], y = silu(gate) * up (gate = first half of a row).
#pragma once

#include "templates/op_template.h"

namespace kiln {

/// Parameters: intermediate = I (baked), rows (runtime).
/// Tensors: x [rows, 2*I] (gate | up, as Llama's fused gate_up projection writes it), y [rows, I];
/// bf16/fp16/fp32, computed in fp32.
class SwiGluOp final : public OpTemplate {
 public:
  std::string_view name() const override { return "swiglu"; }
  std::string_view summary() const override {
    return "[rows, 2*I] -> [rows, I], y = silu(gate) * up (forward)";
  }
  std::span<const ParamInfo> params() const override;
  std::span<const DType> dtypes() const override;
  std::string_view device_template() const override;
  std::string_view kernel_name() const override { return "kiln_swiglu"; }
  TileConfig choose_config(const KernelSpec& spec, const TargetInfo& target) const override;
  std::string specialize(const KernelSpec& spec, const TileConfig& config) const override;
  LaunchGeometry geometry(const KernelSpec& spec, const TileConfig& config) const override;
  std::vector<TensorInfo> tensors(const KernelSpec& spec) const override;
  void reference(const KernelSpec& spec, const Scalars& scalars,
                 std::span<const std::vector<float>> inputs, std::span<const int64_t> rows,
                 std::vector<double>& out) const override;

 protected:
  Result<void> check(const KernelSpec&, const TargetInfo&) const override { return ok(); }
};

}  // namespace kiln
