#include "templates/lib/fp8_scaling.h"

#include "templates/op_template.h"

namespace kiln {
namespace {
constexpr std::string_view kGranularities[] = {"tensorwise", "rowwise", "block1x128", "block128x128"};
constexpr std::string_view kGemmScalings[] = {"tensorwise", "rowwise", "blockwise", "block1x128"};
}  // namespace

std::span<const std::string_view> fp8_granularity_names() { return kGranularities; }

std::vector<int64_t> fp8_scale_shape(const KernelSpec& s) {
  return fp8_scale_shape(s.param("granularity"), s.param("rows"), s.param("cols"));
}

std::vector<int64_t> fp8_scale_shape(int64_t granularity, int64_t rows, int64_t cols) {
  switch (granularity) {
    case kTensorwise: return {1};
    case kRowwise: return {rows};
    case kBlock1x128: return {rows, ceil_div(cols, 128)};
    default: return {ceil_div(rows, 128), ceil_div(cols, 128)};
  }
}

int64_t fp8_scale_index(int64_t granularity, int64_t cols, int64_t r, int64_t c) {
  switch (granularity) {
    case kTensorwise: return 0;
    case kRowwise: return r;
    case kBlock1x128: return r * ceil_div(cols, 128) + c / 128;
    default: return r / 128 * ceil_div(cols, 128) + c / 128;
  }
}

std::span<const std::string_view> fp8_gemm_scaling_names() { return kGemmScalings; }

Fp8Granularity fp8_gemm_operand_granularity(int64_t scaling, bool operand_b) {
  switch (scaling) {
    case kGemmTensorwise: return kTensorwise;
    case kGemmRowwise: return kRowwise;
    case kGemmBlockwise: return operand_b ? kBlock128x128 : kBlock1x128;
    default: return kBlock1x128;
  }
}

std::pair<DType, DType> fp8_test_formats(const TargetInfo& target) {
  return {fp8_for_target(DType::e4m3, target), fp8_for_target(DType::e5m2, target)};
}

}  // namespace kiln
