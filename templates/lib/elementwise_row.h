// Host helpers of the elementwise-row kernels (swiglu, swiglu_bwd, dequantize_fp8, rmsnorm's
// variants): ops whose kernels walk rows of `columns` elements with 16-byte vector accesses where
// the row length allows, THREADS threads of ITEMS accesses each per block, grid (rows, chunks of
// a row). Part of the library (templates/lib/): no op folder includes another's.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "templates/op_template.h"

namespace kiln {

/// The elementwise-row configuration shared by swiglu and swiglu_bwd: VEC elements per access
/// (16 bytes, or 1), THREADS per block, ITEMS accesses per thread; grid (rows, chunks of a row).
KernelConfig elementwise_row_config(int64_t columns, int64_t vec, const TargetInfo& target);
/// Variants for rows of `columns` elements of dtype `t`: vector loads when columns is a
/// multiple of a 16-byte vector, then scalar loads.
std::vector<KernelConfig> elementwise_row_variants(int64_t columns, DType t, const TargetInfo& target);
/// The test specs of an elementwise-row op over [rows, I] (swiglu, swiglu_bwd): I 1, 7, 100, 1024
/// in each dtype, 0 rows, and I 18944.
std::vector<TestSpec> elementwise_row_test_specs(std::string_view op);
/// The launch geometry of an elementwise-row config over `rows` rows of `columns`.
LaunchGeometry elementwise_row_geometry(int64_t rows, int64_t columns, const KernelConfig& config);

}  // namespace kiln
