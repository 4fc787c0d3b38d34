#include <fmt/format.h>

#include <cmath>
#include <cstring>

#include "kiln/dtype.h"
#include "kiln/spec.h"

namespace kiln {

std::string_view errc_name(Errc code) {
  switch (code) {
    case Errc::invalid_argument: return "invalid_argument";
    case Errc::unknown: return "unknown";
    case Errc::unsupported: return "unsupported";
    case Errc::compile_failed: return "compile_failed";
    case Errc::driver_unavailable: return "driver_unavailable";
    case Errc::driver_error: return "driver_error";
    case Errc::io_error: return "io_error";
    case Errc::corrupt: return "corrupt";
    case Errc::timeout: return "timeout";
  }
  return "error";
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "fp32";
    case DType::f16: return "fp16";
    case DType::bf16: return "bf16";
  }
  return "?";
}

Result<DType> parse_dtype(std::string_view name) {
  if (name == "fp32" || name == "f32" || name == "float32" || name == "float") return DType::f32;
  if (name == "fp16" || name == "f16" || name == "float16" || name == "half") return DType::f16;
  if (name == "bf16" || name == "bfloat16") return DType::bf16;
  return make_error(Errc::unknown,
                    fmt::format("unknown dtype '{}'; use one of: bf16, fp16, fp32", name));
}

std::size_t dtype_size(DType t) { return t == DType::f32 ? 4 : 2; }

uint16_t float_to_bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if (std::isnan(f)) return static_cast<uint16_t>((u >> 16) | 0x40);  // keep NaN quiet
  u += 0x7fff + ((u >> 16) & 1);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

float bf16_bits_to_float(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t float_to_f16_bits(float f) {
  // IEEE binary32 -> binary16, round to nearest even, with subnormals, infinities and NaN.
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t abs = u & 0x7fffffffu;
  if (abs >= 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0));
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to infinity
  if (abs < 0x38800000u) {  // subnormal or zero in fp16
    const float scaled = std::fabs(f) * 16777216.0f;  // 2^24: units of the smallest subnormal
    const uint32_t q = static_cast<uint32_t>(std::nearbyint(scaled));
    return static_cast<uint16_t>(sign | q);
  }
  uint32_t mant = abs & 0x7fffffu;
  uint32_t exp = (abs >> 23) - 112;
  uint32_t h = (exp << 10) | (mant >> 13);
  const uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

float f16_bits_to_float(uint16_t h) {
  const uint32_t sign = (h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    float f = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -f : f;
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp + 112) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

float round_to_dtype(float f, DType t) {
  switch (t) {
    case DType::f32: return f;
    case DType::f16: return f16_bits_to_float(float_to_f16_bits(f));
    case DType::bf16: return bf16_bits_to_float(float_to_bf16_bits(f));
  }
  return f;
}

std::string to_string(const KernelSpec& spec) {
  std::string s = fmt::format("{} {}", spec.op, dtype_name(spec.dtype));
  if (spec.out_dtype != spec.dtype) s += fmt::format("->{}", dtype_name(spec.out_dtype));
  for (const auto& [k, v] : spec.params) s += fmt::format(" {}={}", k, v);
  return s;
}

}  // namespace kiln
