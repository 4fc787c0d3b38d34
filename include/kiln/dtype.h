// Element types of Kiln's tensors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "kiln/result.h"

namespace kiln {

struct TargetInfo;

/// Tensor element types. bf16 and fp16 are stored as 16-bit patterns (IEEE binary16 and
/// bfloat16); arithmetic inside kernels is fp32.
/// fp8 (one byte per element):
///   e4m3, e5m2:         the OCP 8-bit floating point formats (OCP OFP8 spec v1.0, 2023), used by
///                       sm_90a and gfx950: e4m3 is "e4m3fn" (bias 7, max 448, no infinities, NaN =
///                       S.1111.111), e5m2 is IEEE-like (bias 15, max 57344, infinities and NaNs).
///   e4m3fnuz, e5m2fnuz: the FNUZ formats of gfx942 (MI300): bias 8 / 16, max 240 / 57344, no
///                       infinities, no negative zero, one NaN (0x80).
/// i32, i64: two's-complement integers (indices, counts).
/// e8m0: the OCP Microscaling scale type (OCP MX spec v1.0, 2023; PyTorch's float8_e8m0fnu): one
///   byte, an unsigned biased exponent, value 2^(bits - 127), 0xFF = NaN; no sign, no zero, no
///   mantissa. The shared scales of MXFP8 (quantize_fp8 and gemm_fp8 granularity mx). Not an fp8
///   element format (is_fp8 is false).
enum class DType : uint8_t { f32, f16, bf16, e4m3, e5m2, e4m3fnuz, e5m2fnuz, i32, i64, e8m0 };

/// Every dtype, in enum order.
inline constexpr DType kAllDTypes[] = {DType::f32,  DType::f16,      DType::bf16,     DType::e4m3, DType::e5m2,
                                       DType::e4m3fnuz, DType::e5m2fnuz, DType::i32, DType::i64, DType::e8m0};

/// Canonical name: "fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2", "fp8_e4m3fnuz", "fp8_e5m2fnuz",
/// "int32", "int64", "e8m0".
std::string_view dtype_name(DType t);
/// Parses the canonical names and the usual aliases ("f32", "float32", "bfloat16", "e4m3",
/// "float8_e4m3fn", "e4m3fnuz", "i32", ...). Errors: Errc::not_found, listing the names.
Result<DType> parse_dtype(std::string_view name);
/// Bytes per element.
std::size_t dtype_size(DType t);
/// fp32, fp16 or bf16.
bool is_float16_or_32(DType t);
/// One of the four fp8 formats.
bool is_fp8(DType t);
/// int32 or int64.
bool is_integer(DType t);
/// Largest finite value of an fp8 format (448, 57344, 240, 57344); 0 for other dtypes.
double fp8_max(DType t);
/// Rounds |f| to the nearest fp8 value of `t` (ties to even), saturating at +-fp8_max(t) (the
/// "satfinite" conversion of PTX cvt.rn.satfinite and of DeepGEMM/Transformer Engine); NaN gives
/// the format's NaN. FNUZ formats have no negative zero: -0 and negative values rounding to zero
/// give 0x00. Returns the code byte.
uint8_t float_to_fp8_bits(float f, DType t);
/// The value of an fp8 code byte (NaN for the NaN codes, +-inf for e5m2's infinities).
float fp8_bits_to_float(uint8_t b, DType t);

/// The two encodings of the fp8 formats: OCP (fp8_e4m3, fp8_e5m2; sm_90a and gfx950) and FNUZ
/// (fp8_e4m3fnuz, fp8_e5m2fnuz; gfx942). A target converts one of them natively
/// (TargetInfo::fp8_encoding) and OpTemplate::validate refuses fp8 tensors in the other.
enum class Fp8Encoding : uint8_t { ocp, fnuz };
/// "OCP" or "FNUZ".
std::string_view fp8_encoding_name(Fp8Encoding e);
/// The dtype of fp8 format `t` in `encoding`: e4m3 and e4m3fnuz give e4m3 (OCP) or e4m3fnuz
/// (FNUZ); e5m2 and e5m2fnuz give e5m2 or e5m2fnuz. Any other dtype is returned unchanged.
/// Only the format (exponent and mantissa widths) carries over: the encodings differ in bias,
/// largest value (e4m3 448 vs. 240), infinities and negative zero, so fp8 bits are not
/// interchangeable between them.
DType fp8_in_encoding(DType t, Fp8Encoding encoding);
/// The one mapping from an fp8 format to a target's fp8 dtype:
/// fp8_in_encoding(t, target.fp8_encoding). gfx942: e4m3 -> fp8_e4m3fnuz, e5m2 -> fp8_e5m2fnuz;
/// gfx950 and sm_90a: e4m3fnuz -> fp8_e4m3, e5m2fnuz -> fp8_e5m2; other dtypes unchanged. Used to
/// decide what validate accepts, and to compile a target-neutral manifest for a target
/// (manifest_spec_for_target, docs/manifest.md).
DType fp8_for_target(DType t, const TargetInfo& target);

/// e8m0 (the MX scale): 2^(b - 127) for b < 0xFF, NaN for 0xFF.
float e8m0_bits_to_float(uint8_t b);
/// The e8m0 code nearest to f > 0 (ties away from zero: 1.5 x 2^e rounds up), saturating to
/// [2^-127, 2^127]; NaN, infinities, zero and negative values give the NaN code 0xFF.
uint8_t float_to_e8m0_bits(float f);

/// Host conversions used by tests, `kiln run` and references (round to nearest even).
uint16_t float_to_bf16_bits(float f);
float bf16_bits_to_float(uint16_t b);
uint16_t float_to_f16_bits(float f);
float f16_bits_to_float(uint16_t h);
/// Rounds f to the nearest value representable in t (identity for f32; fp8 as float_to_fp8_bits;
/// e8m0 as float_to_e8m0_bits; integers round to nearest).
float round_to_dtype(float f, DType t);

}  // namespace kiln
