// fp8 scaling granularities and scale-tensor layouts (host side of the library): shared by
// quantize_fp8, dequantize_fp8, `kiln manifest --fp8` and, later, fp8 GEMMs. Tensorwise, rowwise
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
/// The index into the scale tensor of element (r, c).
int64_t fp8_scale_index(int64_t granularity, int64_t cols, int64_t r, int64_t c);
/// The test formats of a target: {e4m3, e5m2} in the encodings it converts (FNUZ on gfx942).
std::pair<DType, DType> fp8_test_formats(const TargetInfo& target);

}  // namespace kiln
