#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kiln/dtype.h"
#include "kiln/spec.h"
#include "kiln/target.h"

namespace kiln {

std::string_view errc_name(Errc code) {
  switch (code) {
    case Errc::invalid_argument: return "invalid_argument";
    case Errc::not_found: return "not_found";
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
    case DType::e4m3: return "fp8_e4m3";
    case DType::e5m2: return "fp8_e5m2";
    case DType::e4m3fnuz: return "fp8_e4m3fnuz";
    case DType::e5m2fnuz: return "fp8_e5m2fnuz";
    case DType::i32: return "int32";
    case DType::i64: return "int64";
    case DType::e8m0: return "e8m0";
  }
  return "?";
}

Result<DType> parse_dtype(std::string_view name) {
  if (name == "fp32" || name == "f32" || name == "float32" || name == "float") return DType::f32;
  if (name == "fp16" || name == "f16" || name == "float16" || name == "half") return DType::f16;
  if (name == "bf16" || name == "bfloat16") return DType::bf16;
  if (name == "fp8_e4m3" || name == "e4m3" || name == "float8_e4m3fn" || name == "e4m3fn") return DType::e4m3;
  if (name == "fp8_e5m2" || name == "e5m2" || name == "float8_e5m2") return DType::e5m2;
  if (name == "fp8_e4m3fnuz" || name == "e4m3fnuz" || name == "float8_e4m3fnuz") return DType::e4m3fnuz;
  if (name == "fp8_e5m2fnuz" || name == "e5m2fnuz" || name == "float8_e5m2fnuz") return DType::e5m2fnuz;
  if (name == "int32" || name == "i32") return DType::i32;
  if (name == "int64" || name == "i64") return DType::i64;
  if (name == "e8m0" || name == "float8_e8m0fnu" || name == "e8m0fnu") return DType::e8m0;
  std::string names;
  for (DType t : kAllDTypes) names += fmt::format("{}{}", names.empty() ? "" : ", ", dtype_name(t));
  return make_error(Errc::not_found, fmt::format("unknown dtype '{}'; use one of: {}", name, names));
}

std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::f32: case DType::i32: return 4;
    case DType::f16: case DType::bf16: return 2;
    case DType::i64: return 8;
    default: return 1;
  }
}

bool is_float16_or_32(DType t) { return t == DType::f32 || t == DType::f16 || t == DType::bf16; }
bool is_fp8(DType t) {
  return t == DType::e4m3 || t == DType::e5m2 || t == DType::e4m3fnuz || t == DType::e5m2fnuz;
}
bool is_integer(DType t) { return t == DType::i32 || t == DType::i64; }

namespace {
struct Fp8Format {
  int mant_bits, bias;
  double max;
  bool fnuz;  // no infinities, no negative zero, NaN = 0x80
  bool ieee;  // e5m2: infinities (0x7c) and NaNs (exponent all ones)
};
Fp8Format fp8_format(DType t) {
  switch (t) {
    case DType::e4m3: return {3, 7, 448.0, false, false};
    case DType::e5m2: return {2, 15, 57344.0, false, true};
    case DType::e4m3fnuz: return {3, 8, 240.0, true, false};
    default: return {2, 16, 57344.0, true, false};
  }
}
}  // namespace

double fp8_max(DType t) { return is_fp8(t) ? fp8_format(t).max : 0.0; }

uint8_t float_to_fp8_bits(float f, DType t) {
  const Fp8Format fmt = fp8_format(t);
  if (std::isnan(f)) return fmt.fnuz ? 0x80 : (fmt.ieee ? 0x7f : 0x7f);
  const bool neg = std::signbit(f);
  double a = std::fabs(static_cast<double>(f));
  const int emin = 1 - fmt.bias;  // exponent of the smallest normal
  // Round to the format's grid: the quantum is 2^(e - mant_bits) for a in [2^e, 2^(e+1)), and
  // 2^(emin - mant_bits) among the subnormals. nearbyint rounds ties to even.
  int e;
  (void)std::frexp(a, &e);
  e -= 1;  // a in [2^e, 2^(e+1))
  if (a == 0.0 || e < emin) e = emin;
  const double quantum = std::ldexp(1.0, e - fmt.mant_bits);
  double q = std::nearbyint(a / quantum) * quantum;
  if (q > fmt.max) q = fmt.max;  // satfinite (also for +-inf inputs)
  uint32_t code = 0;
  if (q != 0.0) {
    int qe;
    (void)std::frexp(q, &qe);
    qe -= 1;
    if (qe < emin) {
      code = static_cast<uint32_t>(q / std::ldexp(1.0, emin - fmt.mant_bits));  // subnormal
    } else {
      const uint32_t mant = static_cast<uint32_t>(q / std::ldexp(1.0, qe - fmt.mant_bits)) - (1u << fmt.mant_bits);
      code = (static_cast<uint32_t>(qe + fmt.bias) << fmt.mant_bits) | mant;
    }
  }
  if (neg && !(fmt.fnuz && code == 0)) code |= 0x80;
  return static_cast<uint8_t>(code);
}

float fp8_bits_to_float(uint8_t b, DType t) {
  const Fp8Format fmt = fp8_format(t);
  const int exp_bits = 7 - fmt.mant_bits;
  const uint32_t exp_mask = (1u << exp_bits) - 1;
  if (fmt.fnuz && b == 0x80) return std::numeric_limits<float>::quiet_NaN();
  const bool neg = (b & 0x80) != 0;
  const uint32_t exp = (b >> fmt.mant_bits) & exp_mask;
  const uint32_t mant = b & ((1u << fmt.mant_bits) - 1);
  if (!fmt.fnuz) {
    if (fmt.ieee && exp == exp_mask)
      return mant ? std::numeric_limits<float>::quiet_NaN()
                  : (neg ? -std::numeric_limits<float>::infinity() : std::numeric_limits<float>::infinity());
    if (!fmt.ieee && exp == exp_mask && mant == ((1u << fmt.mant_bits) - 1)) return std::numeric_limits<float>::quiet_NaN();
  }
  double v = exp == 0 ? std::ldexp(static_cast<double>(mant), 1 - fmt.bias - fmt.mant_bits)
                      : std::ldexp(static_cast<double>(mant + (1u << fmt.mant_bits)), static_cast<int>(exp) - fmt.bias - fmt.mant_bits);
  return static_cast<float>(neg ? -v : v);
}

std::string_view fp8_encoding_name(Fp8Encoding e) { return e == Fp8Encoding::fnuz ? "FNUZ" : "OCP"; }

DType fp8_in_encoding(DType t, Fp8Encoding encoding) {
  const bool fnuz = encoding == Fp8Encoding::fnuz;
  switch (t) {
    case DType::e4m3: case DType::e4m3fnuz: return fnuz ? DType::e4m3fnuz : DType::e4m3;
    case DType::e5m2: case DType::e5m2fnuz: return fnuz ? DType::e5m2fnuz : DType::e5m2;
    default: return t;
  }
}

DType fp8_for_target(DType t, const TargetInfo& target) { return fp8_in_encoding(t, target.fp8_encoding); }

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

float e8m0_bits_to_float(uint8_t b) {
  return b == 0xFF ? std::numeric_limits<float>::quiet_NaN() : std::ldexp(1.0f, int{b} - 127);
}

uint8_t float_to_e8m0_bits(float f) {
  if (!(f > 0.0f) || std::isinf(f)) return 0xFF;
  int e = 0;
  const float m = std::frexp(f, &e);  // f = m 2^e, m in [0.5, 1)
  const int exponent = (m >= 0.75f ? e : e - 1);  // nearest power of two, 1.5 x 2^k rounds up
  return static_cast<uint8_t>(std::clamp(exponent + 127, 0, 254));
}

float round_to_dtype(float f, DType t) {
  switch (t) {
    case DType::f32: return f;
    case DType::f16: return f16_bits_to_float(float_to_f16_bits(f));
    case DType::bf16: return bf16_bits_to_float(float_to_bf16_bits(f));
    case DType::i32: case DType::i64: return std::nearbyint(f);
    case DType::e8m0: return e8m0_bits_to_float(float_to_e8m0_bits(f));
    default: return fp8_bits_to_float(float_to_fp8_bits(f, t), t);
  }
}

std::string to_string(const KernelSpec& spec) {
  std::string s = fmt::format("{} {}", spec.op, dtype_name(spec.dtype));
  if (spec.out_dtype != spec.dtype) s += fmt::format("->{}", dtype_name(spec.out_dtype));
  for (const auto& [k, v] : spec.params) s += fmt::format(" {}={}", k, v);
  return s;
}

}  // namespace kiln
