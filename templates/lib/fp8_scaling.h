// fp8 scaling granularities and scale-tensor layouts (host side of the library): shared by
// quantize_fp8, dequantize_fp8, gemm_fp8 and `kiln manifest --fp8`. Tensorwise, rowwise
// and blockwise (1x128 for activations and gradients, 128x128 for weights, as DeepGEMM and
// Primus-Turbo use them).
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/dtype.h"
#include "kiln/spec.h"
#include "kiln/target.h"
#include "templates/op_template.h"

namespace kiln {

/// Values of the `granularity` parameter of quantize_fp8 and dequantize_fp8. kMx is OCP
/// Microscaling (MXFP8, OCP MX spec v1.0): one e8m0 scale (a power of two) per 32 consecutive
/// elements of a row; quantize_fp8 only.
enum Fp8Granularity : int64_t { kTensorwise = 0, kRowwise = 1, kBlock1x128 = 2, kBlock128x128 = 3, kMx = 4 };
/// The names of the fp32-scale granularities, in value order: "tensorwise", "rowwise",
/// "block1x128", "block128x128" (dequantize_fp8, `kiln manifest --fp8`).
std::span<const std::string_view> fp8_granularity_names();
/// The same and "mx" (quantize_fp8).
std::span<const std::string_view> fp8_granularity_names_with_mx();
/// Elements along a row that share one MX scale (OCP MX spec v1.0: k = 32).
constexpr int64_t kMxBlock = 32;
/// The scale tensor's shape for a spec with rows, cols and granularity:
/// tensorwise [1]; rowwise [rows]; block1x128 [rows, ceil(cols/128)];
/// block128x128 [ceil(rows/128), ceil(cols/128)] (all fp32); mx [rows, ceil(cols/32)] (e8m0).
std::vector<int64_t> fp8_scale_shape(const KernelSpec& spec);
/// The same for a granularity and a [rows, cols] tensor.
std::vector<int64_t> fp8_scale_shape(int64_t granularity, int64_t rows, int64_t cols);
/// The index into the scale tensor of element (r, c).
int64_t fp8_scale_index(int64_t granularity, int64_t cols, int64_t r, int64_t c);
/// Values of gemm_fp8's `granularity` parameter: how its two operands are scaled. kGemmMx: both
/// operands MXFP8 (e8m0 scales per 32 along K; gfx950's scaled MFMA).
enum Fp8GemmScaling : int64_t {
  kGemmTensorwise = 0,
  kGemmRowwise = 1,
  kGemmBlockwise = 2,
  kGemmBlock1x128 = 3,
  kGemmMx = 4
};
/// Their names, in value order: "tensorwise", "rowwise", "blockwise", "block1x128", "mx".
std::span<const std::string_view> fp8_gemm_scaling_names();
/// The quantize_fp8 granularity of a gemm_fp8 operand (A [M, K], the activation or gradient, or
/// B [N, K], the weight, both K-major): tensorwise and rowwise as named; blockwise is block1x128
/// for A and block128x128 for B (DeepSeek-V3's recipe); block1x128 is block1x128 for both (the
/// wgrad GEMM, whose B is an activation quantized along tokens); mx is mx for both.
Fp8Granularity fp8_gemm_operand_granularity(int64_t scaling, bool operand_b);
/// Values of quantize_fp8's `scaling` parameter (tensorwise): the scale from this tensor's amax
/// (current scaling, two passes over x) or from the amax history of earlier calls (delayed scaling,
/// TransformerEngine's recipe, one pass). Names: "current", "delayed".
enum Fp8Scaling : int64_t { kCurrentScaling = 0, kDelayedScaling = 1 };
std::span<const std::string_view> fp8_scaling_names();
/// The longest amax history of delayed scaling (TransformerEngine's default amax_history_len): one
/// block of this many threads pushes a call's amax into it.
constexpr int64_t kFp8MaxHistory = 1024;
/// [history_len] of a spec with delayed scaling.
std::vector<int64_t> fp8_history_shape(const KernelSpec& spec);
/// The delayed scale of a history, as the kernels compute it in fp32: amax_h = max(0, entries)
/// (NaN entries ignored); scale = (amax_h / FP8_MAX) * 2^margin, 1 where amax_h is 0 or infinite.
float fp8_delayed_scale(std::span<const float> history, int64_t margin, DType fp8);
/// The history after a call whose max |x| was `amax`: [amax, history[0], ..., history[len - 2]].
std::vector<double> fp8_history_pushed(std::span<const float> history, float amax);
/// Test inputs of an amax history for values whose max |x| is about `amax`: entries between 0.25
/// and 0.9 of it (so that the largest values saturate), entry 2 2^-20 of it (a call with almost
/// no data; inputs are never zero).
void fp8_init_history(float amax, std::vector<float>& history, std::mt19937_64& rng);
/// The last launch of a delayed-scaling call: kiln_fp8_amax_history, one block of kFp8MaxHistory
/// threads, args (workspace partials [n_partials] fp32 at offset 0, n_partials, the history tensor,
/// history_len, margin, the scale tensor): writes the scale the call used and pushes the max of
/// the partials into the history.
Launch fp8_history_launch(int64_t n_partials, uint32_t history_tensor, uint32_t scale_tensor, int64_t history_len,
                          int64_t margin);
// ---- fp8 outputs fused into the op that produces the values (rmsnorm, swiglu, and their backward
// ops for the gradient they write) --------------------------------------------------------------
/// Values of their baked `fp8_out` parameter: "none" (the default: no fp8 output, the op's code
/// unchanged), then the fp8 dtype of y_fp8 by its name: fp8_e4m3, fp8_e5m2 (OCP: sm_90a, gfx950),
/// fp8_e4m3fnuz, fp8_e5m2fnuz (gfx942).
std::span<const std::string_view> fp8_out_names();
/// The dtype of y_fp8 for a spec with fp8_out > 0.
DType fp8_out_dtype(const KernelSpec& spec);
/// The fp8_out value of an fp8 dtype.
int64_t fp8_out_value(DType fp8);
/// Values of their `fp8_granularity` parameter, as Fp8Granularity: tensorwise (always with delayed
/// scaling: the op cannot know the tensor's amax before it writes y_fp8), rowwise (the default),
/// block1x128.
std::span<const std::string_view> fp8_fused_granularity_names();
/// Whether a spec has an fp8 output, and one with delayed tensorwise scaling.
bool fp8_fused(const KernelSpec& spec);
bool fp8_fused_delayed(const KernelSpec& spec);
/// One block per row, the row in registers: VEC elements per access (16 bytes, or 1), about 4
/// accesses per thread, whole wavefronts (multiples of 128 threads for VEC 1, so that a 1x128
/// group never straddles the items of a thread), at most 1024 threads; FP8 = 1.
KernelConfig fp8_row_config(int64_t columns, int64_t vec, const TargetInfo& target);

/// What a row op with a fused fp8 output (rmsnorm, swiglu, rmsnorm_bwd, swiglu_bwd) declares once
/// for the helpers below, which serve all four. Its fused outputs are named after the tensor they
/// quantize, its first output: y_fp8 and y_scale (rmsnorm, swiglu), dx_fp8 and dx_scale (the
/// backward ops); configurations with "FP8" (fp8_row_config) are the fused ones.
struct Fp8FusedRowOp {
  std::string_view name;                 ///< The op's name, for messages: "swiglu".
  std::string_view device_template;      ///< Its template without fp8_out: "templates/swiglu/swiglu.kernel".
  std::string_view fp8_device_template;  ///< With fp8_out: "templates/swiglu/swiglu_fp8.kernel".
  std::string_view kernel;               ///< The kernel of each: "kiln_swiglu" ...
  std::string_view fp8_kernel;           ///< ... and "kiln_swiglu_fp8".
  /// About the largest |value| of the quantized tensor for the default test inputs (uniform in
  /// [-1, 1]): the scale of the test amax history (fp8_init_history).
  float test_amax;
};
/// The device template of a configuration: with "FP8" the op's fp8 template, so that the one
/// without stays byte for byte what it was, and so do the cache keys of every kernel without fp8_out.
std::string_view fp8_fused_device_template(const Fp8FusedRowOp& op, const KernelConfig& config);
/// The kernel of a configuration (fp8_kernel with "FP8").
std::string_view fp8_fused_kernel_name(const Fp8FusedRowOp& op, const KernelConfig& config);
/// The rule of the fused output's parameters (`spec` with its defaults): fp8_granularity only with
/// fp8_out (Errc::invalid_argument naming both).
Result<void> fp8_fused_validate(const Fp8FusedRowOp& op, const KernelSpec& spec);
/// The test inputs of a spec with delayed tensorwise scaling (`spec` with its defaults): the amax
/// history, the last input, for values whose max |x| is about op.test_amax. Nothing otherwise.
void fp8_fused_init_history(const Fp8FusedRowOp& op, const KernelSpec& spec, std::vector<std::vector<float>>& values,
                            std::mt19937_64& rng);
/// The base alignment of a configuration's tensors: 16 bytes for a vector variant
/// (vector_variant_alignment), but the fp32 scales (*_scale) and amax history are accessed one
/// element at a time (1).
std::vector<uint32_t> fp8_fused_alignment(const KernelConfig& config, std::span<const TensorInfo> tensors);
/// The baked constants of a configuration with "FP8" (FP8_GRAN and fp8_t; "" without it).
std::string fp8_fused_defines(const KernelSpec& spec_with_defaults, const KernelConfig& config);
/// Delayed scaling's arguments of the fused row kernel, after its tensors (nothing without delayed
/// scaling): the history (tensor `history`), the workspace (each row's max |y|, one fp32 a row, at
/// offset 0), history_len, margin.
void fp8_fused_delayed_args(const KernelSpec& call, uint32_t history, std::vector<KernelArg>& args);
/// ... and after the row kernel, kiln_fp8_amax_history over the `rows` partials (fp8_history_launch;
/// `scale` the *_scale tensor), with the workspace of those partials at least (nothing without
/// delayed scaling).
void fp8_fused_delayed_push(const KernelSpec& call, int64_t rows, uint32_t history, uint32_t scale, Plan& plan);
/// The rows a fused op's reference computes: `sampled`, or every row (the `rows` parameter) where
/// none is asked for or delayed scaling needs them all (max |y| of every row enters the history).
std::vector<int64_t> fp8_fused_reference_rows(const KernelSpec& spec, std::span<const int64_t> sampled);
/// The reference of the fused outputs, appended to `outputs` (nothing without fp8_out). outputs[0]
/// holds the tensor quantized (y or dx, [rows, cols]; the rows of outputs[0].rows) in fp64: it is
/// rounded to out_dtype as the op stores it, then quantized as quantize_fp8 defines it: *_fp8
/// (those rows), *_scale (those rows; [1] with delayed tensorwise) and, with delayed tensorwise,
/// amax_history_out from the history, the last input (its amax needs every row:
/// fp8_fused_reference_rows).
void fp8_fused_reference(const KernelSpec& spec, int64_t cols, std::span<const std::vector<float>> inputs,
                         std::vector<RefOutput>& outputs);
/// The gate of an output (`spec` with its defaults): of the fused outputs (*_fp8, *_scale,
/// amax_history_out; with fp8_out) the codes within one code (the stored value's own rounding may
/// differ from the reference's by one unit, and the code with it); *_scale and the history's new
/// entry within out_dtype's gate, the delayed scale bitwise (it depends on the history alone).
/// Any other output: Gate::for_dtype.
Gate fp8_fused_gate(const KernelSpec& spec, const TensorInfo& output);

/// The MX scale of a group whose max |x| is `amax`, for elements of fp8 format `fp8` (OCP MX spec
/// v1.0, section 6.3): the e8m0 code of 2^(floor(log2(amax)) - emax), emax the exponent of the
/// format's largest value (e4m3 8, e5m2 15, e4m3fnuz 7, e5m2fnuz 15), clamped to [2^-127, 2^127];
/// 127 (a scale of 1) where amax is 0; 0xFF (NaN) where amax is NaN or infinite. Computed from
/// amax's fp32 exponent field, as the kernels do: a subnormal amax gives code 0.
uint8_t fp8_mx_scale_bits(float amax, DType fp8);
/// emax of an fp8 element format (above).
int fp8_emax(DType fp8);

/// The test formats of a target: {e4m3, e5m2} in the encodings it converts (FNUZ on gfx942).
std::pair<DType, DType> fp8_test_formats(const TargetInfo& target);

}  // namespace kiln
