// rmsnorm forward: y = x / sqrt(mean(x^2) + eps) * gamma over the last dimension.
#pragma once

#include "templates/op_template.h"

namespace kiln {

/// Parameters: hidden (baked), rows (runtime: one kernel serves every token count).
/// Tensors: x [rows, hidden], gamma [hidden], y [rows, hidden]; bf16/fp16/fp32, fp32 accumulation.
/// Scalars: eps (runtime fp32, default 1e-5).
class RmsNormOp final : public OpTemplate {
 public:
  std::string_view name() const override { return "rmsnorm"; }
  std::string_view summary() const override {
    return "y = x / sqrt(mean(x^2) + eps) * gamma over the last dimension (forward)";
  }
  std::span<const ParamInfo> params() const override;
  std::span<const ScalarInfo> scalars() const override;
  std::span<const DType> dtypes() const override;
  std::string_view device_template() const override;
  std::string_view kernel_name() const override { return "kiln_rmsnorm"; }
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
