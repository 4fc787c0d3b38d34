// Element types of Kiln's tensors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "kiln/result.h"

namespace kiln {

/// Tensor element types. bf16 and fp16 are stored as 16-bit patterns (IEEE binary16 and
/// bfloat16); arithmetic inside kernels is fp32.
enum class DType : uint8_t { f32, f16, bf16 };

/// Canonical name: "fp32", "fp16", "bf16".
std::string_view dtype_name(DType t);
/// Parses "fp32"/"f32"/"float32", "fp16"/"f16"/"float16", "bf16"/"bfloat16".
Result<DType> parse_dtype(std::string_view name);
/// Bytes per element.
std::size_t dtype_size(DType t);

/// Host conversions used by tests, `kiln run` and references (round to nearest even).
uint16_t float_to_bf16_bits(float f);
float bf16_bits_to_float(uint16_t b);
uint16_t float_to_f16_bits(float f);
float f16_bits_to_float(uint16_t h);
/// Rounds f to the nearest value representable in t (identity for f32).
float round_to_dtype(float f, DType t);

}  // namespace kiln
