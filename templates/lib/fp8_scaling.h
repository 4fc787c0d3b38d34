// fp8 scaling granularities and scale-tensor layouts (host side of the library): shared by
// quantize_fp8, dequantize_fp8, gemm_fp8 and `kiln manifest --fp8`. Tensorwise, rowwise
// and blockwise (1x128 for activations and gradients, 128x128 for weights, as DeepGEMM and
// Primus-Turbo use them).
#pragma once

#include <cstdint>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/dtype.h"
#include "kiln/spec.h"
#include "kiln/target.h"

namespace kiln {

/// Values of the `granularity` parameter of quantize_fp8 and dequantize_fp8.
enum Fp8Granularity : int64_t { kTensorwise = 0, kRowwise = 1, kBlock1x128 = 2, kBlock128x128 = 3 };
/// Their names, in value order: "tensorwise", "rowwise", "block1x128", "block128x128".
std::span<const std::string_view> fp8_granularity_names();
/// The fp32 scale tensor's shape for a spec with rows, cols and granularity:
/// tensorwise [1]; rowwise [rows]; block1x128 [rows, ceil(cols/128)];
/// block128x128 [ceil(rows/128), ceil(cols/128)].
std::vector<int64_t> fp8_scale_shape(const KernelSpec& spec);
/// The same for a granularity and a [rows, cols] tensor.
std::vector<int64_t> fp8_scale_shape(int64_t granularity, int64_t rows, int64_t cols);
/// The index into the scale tensor of element (r, c).
int64_t fp8_scale_index(int64_t granularity, int64_t cols, int64_t r, int64_t c);
/// Values of gemm_fp8's `granularity` parameter: how its two operands are scaled.
enum Fp8GemmScaling : int64_t { kGemmTensorwise = 0, kGemmRowwise = 1, kGemmBlockwise = 2, kGemmBlock1x128 = 3 };
/// Their names, in value order: "tensorwise", "rowwise", "blockwise", "block1x128".
std::span<const std::string_view> fp8_gemm_scaling_names();
/// The quantize_fp8 granularity of a gemm_fp8 operand (A [M, K], the activation or gradient, or
/// B [N, K], the weight, both K-major): tensorwise and rowwise as named; blockwise is block1x128
/// for A and block128x128 for B (DeepSeek-V3's recipe); block1x128 is block1x128 for both (the
/// wgrad GEMM, whose B is an activation quantized along tokens).
Fp8Granularity fp8_gemm_operand_granularity(int64_t scaling, bool operand_b);
/// The test formats of a target: {e4m3, e5m2} in the encodings it converts (FNUZ on gfx942).
std::pair<DType, DType> fp8_test_formats(const TargetInfo& target);

}  // namespace kiln
