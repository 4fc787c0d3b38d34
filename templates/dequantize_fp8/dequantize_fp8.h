// dequantize_fp8: the inverse of quantize_fp8, fp8 q and fp32 scales -> bf16/fp16/fp32 x.
#pragma once

#include "templates/op_template.h"

namespace kiln {

/// Parameters: rows (runtime; 0 is a no-op), cols (baked), granularity (baked: tensorwise,
/// rowwise, block1x128, block128x128, as quantize_fp8).
/// KernelSpec: dtype = the fp8 format of q, out_dtype = bf16/fp16/fp32.
/// Tensors: q [rows, cols] (fp8), scale (fp32; tensorwise [1], rowwise [rows], block1x128
/// [rows, ceil(cols/128)], block128x128 [ceil(rows/128), ceil(cols/128)]) -> x [rows, cols].
/// x = out_dtype(float(q) * scale), the product in fp32. Gate: the tolerance of the out dtype.
/// Kernel variants: 16-byte stores when cols is a multiple of a 16-byte vector of out_dtype and
/// q and x are 16-byte aligned; else scalar accesses. Grid (rows, chunks of a row), as swiglu.
class DequantizeFp8Op final : public OpTemplate {
 public:
  std::string_view name() const override { return "dequantize_fp8"; }
  std::string_view summary() const override {
    return "fp8 q and fp32 scales (tensorwise, rowwise, block1x128, block128x128) -> x = float(q) * scale";
  }
  std::span<const ParamInfo> params() const override;
  std::span<const DType> dtypes() const override;
  bool supports_out_dtype(DType in, DType out) const override;
  std::span<const TensorDecl> signature() const override;
  std::vector<KernelConfig> variants(const KernelSpec& spec, const TargetInfo& target) const override;
  std::string_view device_template(const KernelConfig& config) const override;
  std::string specialize(const KernelSpec& spec, const KernelConfig& config) const override;
  std::string_view kernel_name(const KernelConfig&) const override { return "kiln_dequantize_fp8"; }
  Plan plan(const KernelSpec& call, const KernelConfig& config) const override;
  std::vector<uint32_t> base_alignment(const KernelSpec& spec, const KernelConfig& config) const override;
  void init_inputs(const KernelSpec& spec, std::span<const TensorInfo> inputs, std::vector<std::vector<float>>& values,
                   std::mt19937_64& rng) const override;
  void reference(const KernelSpec& spec, const Scalars& scalars, std::span<const std::vector<float>> inputs,
                 std::span<const int64_t> rows, std::vector<RefOutput>& outputs) const override;
  std::vector<TestSpec> test_specs(const TargetInfo& target) const override;
};

}  // namespace kiln
