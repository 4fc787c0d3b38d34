// quantize_fp8: bf16/fp16/fp32 -> fp8 (e4m3 or e5m2; OCP on sm_90a/gfx950, FNUZ on gfx942) with fp32
// scales, tensorwise, rowwise or blockwise (1x128 for activations, 128x128 for weights, as DeepGEMM
// and Primus-Turbo use them), and an optional transposed fp8 output for the wgrad GEMM.
#pragma once

#include "templates/lib/fp8_scaling.h"
#include "templates/op_template.h"

namespace kiln {

/// Parameters: rows (runtime; 0 is a no-op), cols (baked), granularity (baked: tensorwise,
/// rowwise, block1x128, block128x128, mx), transpose (0/1, baked, default 0), scaling (baked:
/// current, the default, or delayed, tensorwise only), history_len (runtime, 1..1024, default
/// 1024) and margin (runtime, default 0), both used by delayed scaling only.
/// KernelSpec: dtype = the input (bf16/fp16/fp32), out_dtype = the fp8 format.
/// Tensors: x [rows, cols], amax_history [history_len] (fp32, delayed) -> q [rows, cols] (fp8),
///   scale (fp32, shape as fp8_scale_shape; mx: [rows, ceil(cols/32)] e8m0, row-major, byte
///   r * ceil(cols/32) + c / 32 the scale of x[r][c]), qt [cols, rows] (fp8, with transpose=1: x^T
///   quantized with the same scales; tensorwise and block128x128 only, where a scale is shared by
///   the rows and columns of the transpose; mx's groups lie along rows, so x^T takes its own call), amax_history_out (delayed: written over amax_history).
/// only_qt (baked 0/1, default 0, unkeyed; granularity block1x128 or block128x128 with transpose=1):
///   x -> qt [cols, rows] and its scales in qt's own layout, and no q or scale:
///   - block1x128: qt in 1x128 blocks of its own rows (128 consecutive rows of one column of x
///     share a scale), qt_scale [cols, ceil(rows/128)] fp32: the wgrad GEMM's operand (x^T or dy^T
///     along the tokens, or W^T along N for gemm_fp8's dgrad) of a tensor whose q a fused fp8
///     output already wrote;
///   - block128x128: qt in 128x128 blocks, qt_scale [ceil(cols/128), ceil(rows/128)] fp32 (the
///     scales of block128x128's call on x, transposed): W^T for grouped_gemm's fp8 dgrad, whose b
///     takes 128x128 blocks in b's own block order.
///   batch (runtime, default 1; only_qt only): x [batch, rows, cols] -> qt [batch, cols, rows] and
///   qt_scale [batch, ...], each batch quantized on its own (blocks restart at each one): the G
///   experts of an MoE weight [G, N, K] in one launch (grid z).
///   groups (baked, default 0, unkeyed; only_qt block1x128, batch 1): x's rows are G groups by a
///   further input offsets [G + 1] int32 on the device (as moe_permute writes them), and x^T is
///   written in group-aligned 128-row panels: qt [P, cols, 128] and qt_scale [P, cols] with
///   P = ceil(rows/128) + G. Group g's rows fill panels offsets[g] / 128 + g onwards, 128 rows
///   each counted from the group's first row (never overlapping the next group's), so a 1 x 128
///   block never holds two groups' rows; the rest of the group's last panel is zero, and so is
///   every panel of no group (scale 1). Panel p's row c is qt[p][c][0..127], a 128-byte K-major
///   row: grouped_gemm's fp8 k-grouped wgrad (mode tn) reads dy^T and x^T in this layout.
///   Kernel kiln_quantize_fp8_qt (quantize_fp8_qt.kernel): one block of 512 threads per 128x128
///   tile (grouped: per panel and 128 columns), column amax over the tile's rows (and over its
///   columns for 128x128), LDS transpose.
/// Delayed scaling (TransformerEngine's DelayedScaling recipe, amax_compute_algo "max";
/// docs/gemm-fp8.md): the scale comes from the max of earlier calls' amax instead of x's own, so
/// x is read once: amax_h = max(0, amax_history) (NaN entries ignored);
///   scale = (amax_h / FP8_MAX) * 2^margin (fp32), 1 where amax_h is 0 or infinite; values above
///   FP8_MAX * scale saturate. The call then pushes its own max |x| into the history:
///   amax_history[i + 1] = amax_history[i], amax_history[0] = max |x| (0 for 0 rows); the oldest
///   entry drops out. Plan: kiln_quantize_fp8_tiles (one pass; each tile block's amax into the
///   workspace), then kiln_fp8_amax_history (one block: writes scale, pushes the amax).
/// Definition, in fp32 (the CPU reference computes exactly this; the gate is bit-exact):
///   amax  = max |x| over the group (the tensor, a row, 128 contiguous elements of a row, or a
///           128x128 tile; tails in rows and columns make smaller groups);
///   scale = amax / FP8_MAX (IEEE division; FP8_MAX = fp8_max(out_dtype)), or 1 when amax == 0;
///   inv   = 1 / scale (IEEE division);
///   mx (OCP Microscaling MXFP8, OCP MX spec v1.0, section 6.3): groups of 32 consecutive elements
///           of a row (the last group of a row may be shorter), scale = 2^X with the shared
///           exponent X = floor(log2(amax)) - emax (emax: the exponent of FP8_MAX, e4m3 8, e5m2
///           15, e4m3fnuz 7, e5m2fnuz 15), stored as e8m0 (X + 127, clamped to [0, 254]; 127 where
///           amax == 0, 0xFF where amax is NaN or infinite); inv = 2^-X exactly. The values of a
///           group above FP8_MAX * scale (amax / scale lies in [2^emax, 2^(emax+1))) saturate, as
///           the spec's conversion does;
///   q     = fp8(x * inv): one fp32 multiply, then round to nearest even, saturating to +-FP8_MAX
///           (satfinite); a value rounding to zero keeps its sign in the OCP formats (FNUZ has no
///           -0). The consumer dequantizes with x ~ float(q) * scale.
/// Kernels: mx runs the tile kernel below, its 32-column groups reduced over 4 lanes.
/// tensorwise plans two launches (kiln_fp8_amax writes per-block amax partials into the
/// workspace, then kiln_quantize_fp8_tiles, whose blocks each reduce the partials; block 0 writes
/// scale). rowwise: one block per row (kiln_quantize_fp8_rows). block1x128, block128x128 and
/// tensorwise: one block of 512 threads per 128x128 tile, each thread 4 rows x 8 columns; 1x128
/// groups reduce over 16 lanes with shfl_xor (wave32 and wave64 alike), 128x128 over the block;
/// the transposed output goes through an LDS transpose of the tile.
/// Variants: 16-byte loads when cols % 8 == 0 and x, q, qt are 16-byte aligned; else scalar.
/// Limits: rowwise keeps a row in registers: cols <= 65536.
class QuantizeFp8Op final : public OpTemplate {
 public:
  std::string_view name() const override { return "quantize_fp8"; }
  std::string_view summary() const override {
    return "x -> fp8 q and scales (fp32: tensorwise, rowwise, block1x128, block128x128; e8m0: mx), optional transposed qt";
  }
  std::span<const ParamInfo> params() const override;
  std::span<const DType> dtypes() const override;
  bool supports_out_dtype(DType in, DType out) const override;
  std::span<const TensorDecl> signature() const override;
  std::vector<KernelConfig> variants(const KernelSpec& spec, const TargetInfo& target) const override;
  std::vector<KernelConfig> tuning_candidates(const KernelSpec& spec, const TargetInfo& target) const override;
  std::string_view device_template(const KernelConfig& config) const override;
  std::string specialize(const KernelSpec& spec, const KernelConfig& config) const override;
  std::string_view kernel_name(const KernelConfig& config) const override;
  Plan plan(const KernelSpec& call, const KernelConfig& config) const override;
  std::vector<uint32_t> base_alignment(const KernelSpec& spec, const KernelConfig& config) const override;
  void init_inputs(const KernelSpec& spec, std::span<const TensorInfo> inputs, std::vector<std::vector<float>>& values,
                   std::mt19937_64& rng) const override;
  void reference(const KernelSpec& spec, const Scalars& scalars, std::span<const std::vector<float>> inputs,
                 std::span<const int64_t> rows, std::vector<RefOutput>& outputs) const override;
  Gate gate(const KernelSpec& spec, const TensorInfo& output) const override;
  std::vector<TestSpec> test_specs(const TargetInfo& target) const override;

 protected:
  Result<void> validate_rules(const KernelSpec& spec, const TargetInfo& target) const override;
};

}  // namespace kiln
