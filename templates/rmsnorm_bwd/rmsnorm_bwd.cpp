#include "templates/rmsnorm_bwd/rmsnorm_bwd.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "templates/lib/fp8_scaling.h"

namespace kiln {
namespace {
const ParamInfo kParams[] = {
    {"rows", "rows (tokens); a runtime argument, not baked; 0 is a no-op", false, false, 0, (int64_t{1} << 31) - 1},
    {"hidden", "normalized (last) dimension", true, false, 1, 65536},
    {"recompute_rstd", "recompute rstd from x and eps instead of reading it (default 0)", true, true, 0, 1, {}, 0},
    {"residual_grad", "add dres, the residual stream's gradient, to dx in the same pass (default 0)", true, true, 0, 1,
     {}, 0},
    {"fp8_out",
     "also write dx_fp8 = dx quantized to this fp8 dtype (e5m2 for the dgrad GEMM), with its scales, in the same pass "
     "(default none)",
     true, false, 0, 4, fp8_out_names(), 0, true},
    {"fp8_granularity", "dx_fp8's scales: tensorwise (delayed scaling, from amax_history), rowwise (default), block1x128",
     true, false, 0, 2, fp8_fused_granularity_names(), kRowwise, true},
    {"history_len", "delayed scaling: entries of amax_history (default 1024)", false, false, 1, kFp8MaxHistory, {}, 1024},
    {"margin", "delayed scaling: the scale keeps amax_h at 2^-margin of the format's largest value (default 0)", false,
     false, 0, 64, {}, 0},
};
const ScalarInfo kScalars[] = {{"eps", 1e-5f, "with recompute_rstd: added to mean(x^2)"}};
const DType kDTypes[] = {DType::bf16, DType::f16, DType::f32};

std::vector<int64_t> rows_hidden(const KernelSpec& s) { return {s.param("rows"), s.param("hidden")}; }
std::vector<int64_t> hidden(const KernelSpec& s) { return {s.param("hidden")}; }
std::vector<int64_t> rows(const KernelSpec& s) { return {s.param("rows")}; }
bool reads_rstd(const KernelSpec& s) { return s.param("recompute_rstd") == 0; }
bool adds_dres(const KernelSpec& s) { return s.param("residual_grad") != 0; }
DType dx_fp8_dtype(const KernelSpec& s) { return fp8_out_dtype(s); }
std::vector<int64_t> dx_scale_shape(const KernelSpec& s) {
  return fp8_scale_shape(s.param("fp8_granularity"), s.param("rows"), s.param("hidden"));
}

const TensorDecl kSignature[] = {
    {"dy", Role::input, DTypeRule::in, DType::f32, "[rows, hidden]", rows_hidden},
    {"x", Role::input, DTypeRule::in, DType::f32, "[rows, hidden]", rows_hidden},
    {"gamma", Role::input, DTypeRule::in, DType::f32, "[hidden]", hidden},
    {"rstd", Role::input, DTypeRule::fixed, DType::f32, "[rows]", rows, reads_rstd, "saved by rmsnorm save_rstd"},
    {"dres", Role::input, DTypeRule::in, DType::f32, "[rows, hidden]", rows_hidden, adds_dres,
     "with residual_grad: the gradient along the residual connection, added to dx"},
    {"amax_history", Role::input, DTypeRule::fixed, DType::f32, "[history_len]", fp8_history_shape, fp8_fused_delayed,
     "delayed scaling: max |dx| of earlier calls, [0] the latest"},
    {"dx", Role::output, DTypeRule::out, DType::f32, "[rows, hidden]", rows_hidden},
    {"dgamma", Role::output, DTypeRule::out, DType::f32, "[hidden]", hidden},
    {"dx_fp8", Role::output, DTypeRule::derived, DType::f32, "[rows, hidden]", rows_hidden, fp8_fused,
     "dx (as stored) quantized as quantize_fp8 defines it", {}, nullptr, dx_fp8_dtype, "fp8_out"},
    {"dx_scale", Role::output, DTypeRule::fixed, DType::f32, "[1] | [rows] | [rows, ceil(hidden/128)]", dx_scale_shape,
     fp8_fused, "dx ~ float(dx_fp8) * dx_scale, per fp8_granularity (tensorwise | rowwise | block1x128)"},
    {"amax_history_out", Role::output, DTypeRule::fixed, DType::f32, "[history_len]", fp8_history_shape,
     fp8_fused_delayed, "the history with this call's max |dx| pushed at [0] (written over amax_history)",
     "amax_history"},
};
// |dx| stays below about 3 for inputs in [-1, 1] (rstd about sqrt(3)).
constexpr Fp8FusedRowOp kFused = {"rmsnorm_bwd", "templates/rmsnorm_bwd/rmsnorm_bwd.kernel",
                                  "templates/rmsnorm_bwd/rmsnorm_bwd_fp8.kernel", "kiln_rmsnorm_bwd",
                                  "kiln_rmsnorm_bwd_fp8", 3.0f};
// The fp8 kernel's row blocks per compute unit (persistent; each writes a row of dgamma partials).
constexpr int64_t kFp8BlocksPerCu = 4;

// The second launch: one block of kReduceCols x kReduceLanes threads per kReduceCols columns
// (256 threads: 1024-thread blocks crashed the AMD emulator at hidden 4100-4132, grid 129-130).
constexpr int64_t kReduceCols = 16, kReduceLanes = 16;

// Blocks of the first launch for `rows` rows: at most BLOCKS, and no more than needed for the
// same number of row slots per block (fewer partial sums, the same time).
int64_t row_blocks(int64_t rows, const KernelConfig& c) {
  if (rows == 0) return 0;
  const int64_t per_slot = c.at("ROWS");
  const int64_t slots = ceil_div(rows, per_slot);                 // row slots of ROWS rows
  const int64_t per_block = ceil_div(slots, c.at("BLOCKS"));      // slots per block
  return ceil_div(slots, per_block);
}
}  // namespace

std::span<const ParamInfo> RmsNormBwdOp::params() const { return kParams; }
std::span<const ScalarInfo> RmsNormBwdOp::scalars() const { return kScalars; }
std::span<const DType> RmsNormBwdOp::dtypes() const { return kDTypes; }
std::span<const TensorDecl> RmsNormBwdOp::signature() const { return kSignature; }
std::string_view RmsNormBwdOp::device_template(const KernelConfig& c) const {
  return fp8_fused_device_template(kFused, c);
}
std::string_view RmsNormBwdOp::kernel_name(const KernelConfig& c) const { return fp8_fused_kernel_name(kFused, c); }
Result<void> RmsNormBwdOp::validate_rules(const KernelSpec& spec, const TargetInfo&) const {
  return fp8_fused_validate(kFused, with_defaults(spec));
}

namespace {
// ---- configuration ---------------------------------------------------------------------------
// The knobs of the row pass (rmsnorm_bwd.kernel), chosen per hidden size by bwd_config():
//   ITEMS        accesses of VEC elements per thread per row (the row's share of a thread);
//   ROW_THREADS  threads per row: ITEMS x ROW_THREADS >= hidden / VEC, whole wavefronts;
//   ROWS         rows a block works on at once (ROW_THREADS x ROWS threads per block);
//   PREFETCH     row slots loaded ahead into registers (0: none; 1: double buffer; 2: triple);
//   GAMMA_LDS    gamma in LDS (1) or in registers (0);
//   BLOCKS       at most this many blocks (BLOCKS_PER_CU x compute units): each block writes one
//                row of fp32 partial sums of dgamma to the workspace, read again by the second
//                launch, so they cost 8 x BLOCKS x hidden bytes of traffic.
// To try another configuration on the GPU, edit kDefaultKnobs (the heuristic's choice) or
// kTuningKnobs (what `kiln run --bench` times); `kiln inspect ... --emit meta` shows the result.
struct BwdKnobs {
  int64_t items;          // ITEMS wanted (more if a row needs more than 1024 threads)
  int64_t prefetch;       // PREFETCH wanted (0 where the registers would not hold it)
  int64_t block_threads;  // threads per block wanted: ROWS = block_threads / ROW_THREADS
  int64_t blocks_per_cu;  // 0: as many blocks as the estimated registers let reside
};
// Bytes in flight per SM on an H100 with the default: one block of 512 threads (ITEMS 4, 128
// registers), each thread with the next row's 4 x 16 bytes of dy and of x loading while it
// reduces and writes the current row: 512 x 128 B = 64 KiB per SM, continuously (the previous
// kernel had 256-512 threads per SM and nothing in flight during the reduction).
constexpr BwdKnobs kDefaultKnobs = {4, 1, 512, 0};
// The alternatives the autotuner times after the heuristic (duplicates are dropped).
constexpr BwdKnobs kTuningKnobs[] = {
    {4, 0, 512, 0},  // no prefetch: more bytes per load phase, nothing in flight across the reduction
    {2, 1, 256, 0},  // smaller rows per thread, more blocks per SM
    {2, 2, 256, 0},  // two rows ahead
    {1, 1, 512, 0},  // one access per thread per row: fewest registers, most threads
};

// Estimated 32-bit registers per thread (NVIDIA) or VGPRs per lane (AMD) of the row pass.
// Calibrated with ptxas -v on sm_90a (bf16, uncapped; NVRTC and clang alike): ITEMS 1/2/4 with
// PREFETCH 1 take 58/82/128 registers, ITEMS 4 with PREFETCH 0 98. Irregular rows take more: a
// partial last access (hidden 1000: an address per access, no immediate offsets) 167-168, and
// row threads that are not a power of two (hidden 5120: 160) 167; under a cap of 128-136 clang's
// code spilled 16-32 bytes there, so these count 12 and 4 registers more per access.
// residual_grad stages dres like dy and x: one more access per stage, and 3 registers more per
// access: at hidden 4096 bf16 (ITEMS 4, PREFETCH 1, 384 threads, a cap of 170) NVRTC took 168
// registers, but clang's code spilled 20 bytes; counted so, the block has 256 threads there.
int64_t estimated_registers(int64_t items, int64_t vec, int64_t in_size, int64_t prefetch, bool gamma_lds,
                            bool partial, bool pow2, bool dres) {
  const int64_t access = std::max<int64_t>(1, vec * in_size / 4);  // registers of one access
  const int64_t irregular = (partial ? 12 : 0) + (pow2 ? 0 : 4);
  const int64_t staged = dres ? 3 * (prefetch + 1) * access + 3 : 2 * (prefetch + 1) * access;
  return items * (vec + staged + (gamma_lds ? 0 : access) + irregular) + 30;
}
// Blocks of `threads` threads with `regs` registers each that fit one compute unit's register
// file. The compilers allocate registers for a block in groups of 4 wavefronts (ptxas: 480
// threads get 128 registers, not 136), hence the rounding.
int64_t blocks_that_fit(int64_t threads, int64_t regs, const TargetInfo& target) {
  regs = round_up(regs, 8);
  const int64_t lanes = round_up(threads, 4 * target.wave_size);
  if (target.vendor == Vendor::nvidia) return std::min<int64_t>(2048 / threads, 65536 / (lanes * regs));
  // CDNA: 4 SIMDs per CU, 512 VGPRs per lane of a SIMD, at most 8 wavefronts per SIMD.
  return std::min<int64_t>(32 * target.wave_size / threads, 4 * target.wave_size * 512 / (lanes * regs));
}

KernelConfig bwd_config(int64_t hidden, int64_t vec, DType dtype, bool dres, const TargetInfo& target,
                      const BwdKnobs& k) {
  const int64_t in_size = static_cast<int64_t>(dtype_size(dtype));
  const int64_t nvec = ceil_div(hidden, vec);
  const int64_t wave = target.wave_size;
  const int64_t row_threads =
      std::clamp<int64_t>(round_up(ceil_div(nvec, k.items), wave), wave, target.max_threads_per_block);
  const int64_t items = ceil_div(nvec, row_threads);
  const bool partial = nvec % row_threads != 0, pow2 = (row_threads & (row_threads - 1)) == 0;
  // gamma in LDS up to 32 KiB (hidden 16384 in bf16), which leaves room for a second block.
  const bool gamma_lds = nvec * vec * in_size <= 32768;
  // The prefetch wanted, unless a single row's threads would not fit the register file with it.
  int64_t prefetch = k.prefetch;
  auto regs = [&] { return estimated_registers(items, vec, in_size, prefetch, gamma_lds, partial, pow2, dres); };
  while (prefetch > 0 && blocks_that_fit(row_threads, regs(), target) < 1) --prefetch;
  // Rows per block: block_threads wanted, no more than the registers hold (the launch bound then
  // gives the compiler the registers it needs).
  int64_t rows = std::max<int64_t>(1, std::min<int64_t>(k.block_threads, target.max_threads_per_block) / row_threads);
  while (rows > 1 && blocks_that_fit(rows * row_threads, regs(), target) < 1) --rows;
  const int64_t threads = row_threads * rows;
  const int64_t per_cu =
      k.blocks_per_cu > 0 ? k.blocks_per_cu : std::max<int64_t>(1, blocks_that_fit(threads, regs(), target));
  return {{"VEC", vec},
          {"ITEMS", items},
          {"ROW_THREADS", row_threads},
          {"ROWS", rows},
          {"PREFETCH", prefetch},
          {"GAMMA_LDS", gamma_lds ? 1 : 0},
          {"BLOCKS", per_cu * target.compute_units}};
}

// 16-byte accesses where hidden is a whole number of them, else one element per access.
int64_t vector_width(const KernelSpec& spec) {
  const int64_t vec = 16 / static_cast<int64_t>(dtype_size(spec.dtype));
  return spec.param("hidden") % vec == 0 ? vec : 1;
}
}  // namespace

// The fp8 kernel (rmsnorm_bwd_fp8.kernel): one row per block at a time, the row in registers.
KernelConfig fp8_config(const KernelSpec& spec, int64_t vec, const TargetInfo& target) {
  KernelConfig c = fp8_row_config(spec.param("hidden"), vec, target);
  c["BLOCKS"] = kFp8BlocksPerCu * target.compute_units;
  return c;
}

std::vector<KernelConfig> RmsNormBwdOp::variants(const KernelSpec& given, const TargetInfo& target) const {
  const KernelSpec spec = with_defaults(given);
  if (fp8_fused(spec)) {
    std::vector<KernelConfig> out = {fp8_config(spec, vector_width(spec), target)};
    if (out.front().at("VEC") > 1) out.push_back(fp8_config(spec, 1, target));
    return out;
  }
  std::vector<KernelConfig> out = {choose_config(spec, target)};
  if (out.front().at("VEC") > 1)
    out.push_back(bwd_config(spec.param("hidden"), 1, spec.dtype, adds_dres(spec), target, kDefaultKnobs));
  return out;
}
KernelConfig RmsNormBwdOp::choose_config(const KernelSpec& given, const TargetInfo& target) const {
  const KernelSpec spec = with_defaults(given);
  if (fp8_fused(spec)) return fp8_config(spec, vector_width(spec), target);
  return bwd_config(spec.param("hidden"), vector_width(spec), spec.dtype, adds_dres(spec), target, kDefaultKnobs);
}
std::vector<KernelConfig> RmsNormBwdOp::tuning_candidates(const KernelSpec& spec, const TargetInfo& target) const {
  std::vector<KernelConfig> out = {choose_config(spec, target)};
  if (fp8_fused(with_defaults(spec))) return out;
  for (const BwdKnobs& k : kTuningKnobs) {
    KernelConfig c = bwd_config(spec.param("hidden"), vector_width(spec), spec.dtype, adds_dres(spec), target, k);
    if (std::find(out.begin(), out.end(), c) == out.end()) out.push_back(std::move(c));
  }
  return out;
}
std::vector<uint32_t> RmsNormBwdOp::base_alignment(const KernelSpec& spec, const KernelConfig& config) const {
  return fp8_fused_alignment(config, tensors(spec));
}

std::string RmsNormBwdOp::specialize(const KernelSpec& given, const KernelConfig& c) const {
  const KernelSpec spec = with_defaults(given);
  if (c.count("FP8"))
    return fp8_fused_defines(spec, c) +
           fmt::format("constexpr int HIDDEN = {};\nconstexpr int THREADS = {}, VEC = {}, ITEMS = {};\n"
                       "constexpr int REDUCE_COLS = {}, REDUCE_LANES = {};\n#define RECOMPUTE_RSTD {}\n"
                       "#define RESIDUAL_GRAD {}\ntypedef {} in_t;\ntypedef {} out_t;\n",
                       spec.param("hidden"), c.at("THREADS"), c.at("VEC"), c.at("ITEMS"), kReduceCols, kReduceLanes,
                       spec.param("recompute_rstd"), spec.param("residual_grad"), device_type_name(spec.dtype),
                       device_type_name(spec.out_dtype));
  return fmt::format("constexpr int HIDDEN = {};\nconstexpr int VEC = {}, ITEMS = {}, ROW_THREADS = {}, ROWS = {};\n"
                     "#define PREFETCH {}\n#define GAMMA_LDS {}\nconstexpr int REDUCE_COLS = {}, REDUCE_LANES = {};\n"
                     "#define RECOMPUTE_RSTD {}\n#define RESIDUAL_GRAD {}\ntypedef {} in_t;\ntypedef {} out_t;\n",
                     spec.param("hidden"), c.at("VEC"), c.at("ITEMS"), c.at("ROW_THREADS"), c.at("ROWS"),
                     c.at("PREFETCH"), c.at("GAMMA_LDS"), kReduceCols, kReduceLanes, spec.param("recompute_rstd"),
                     spec.param("residual_grad"),
                     device_type_name(spec.dtype), device_type_name(spec.out_dtype));
}

namespace {
// The fp8 kernel's plan. Tensors: dy, x, gamma, rstd?, dres?, amax_history? -> dx, dgamma, dx_fp8,
// dx_scale, amax_history_out?. Workspace: with delayed scaling each row's max |dx| (offset 0, as
// kiln_fp8_amax_history reads it), then the blocks' dgamma partials.
Plan fp8_plan(const KernelSpec& call, const std::vector<TensorInfo>& ts, const KernelConfig& c) {
  Plan p;
  const int64_t n_rows = call.param("rows"), H = call.param("hidden");
  const int64_t blocks = std::min<int64_t>(n_rows, c.at("BLOCKS"));
  const bool delayed = fp8_fused_delayed(call);
  const uint64_t amax_bytes = delayed ? static_cast<uint64_t>(round_up(std::max<int64_t>(n_rows, 1) * 4, 256)) : 0;
  p.workspace_bytes = amax_bytes + static_cast<uint64_t>(std::max<int64_t>(blocks, 1) * round_up(H, 4)) * 4;
  auto index = [&](std::string_view name) {
    for (uint32_t i = 0; i < ts.size(); ++i)
      if (ts[i].name == name) return i;
    return uint32_t{0};
  };
  Launch rows_pass;
  rows_pass.kernel = "kiln_rmsnorm_bwd_fp8";
  rows_pass.geometry.grid.x = static_cast<uint32_t>(blocks);
  rows_pass.geometry.block.x = static_cast<uint32_t>(c.at("THREADS"));
  for (uint32_t i = 0; i < ts.size(); ++i)  // dy, x, gamma, rstd?, dres?, dx, dx_fp8, dx_scale
    if (ts[i].name != "amax_history" && ts[i].name != "amax_history_out" && ts[i].name != "dgamma")
      rows_pass.args.push_back(KernelArg::tensor(i));
  fp8_fused_delayed_args(call, index("amax_history"), rows_pass.args);
  rows_pass.args.insert(rows_pass.args.end(),
                        {KernelArg::workspace(static_cast<int64_t>(amax_bytes)), KernelArg::i32(n_rows),
                         KernelArg::i32(blocks), KernelArg::scalar(0)});
  Launch reduce;
  reduce.kernel = "kiln_rmsnorm_bwd_dgamma";
  reduce.geometry.grid.x = static_cast<uint32_t>(ceil_div(H, kReduceCols));
  reduce.geometry.block.x = static_cast<uint32_t>(kReduceCols * kReduceLanes);
  reduce.args = {KernelArg::workspace(static_cast<int64_t>(amax_bytes)), KernelArg::tensor(index("dgamma")),
                 KernelArg::i32(blocks)};
  if (n_rows > 0) p.launches.push_back(std::move(rows_pass));
  p.launches.push_back(std::move(reduce));  // 0 rows: dgamma is a sum over no rows, zeros
  fp8_fused_delayed_push(call, n_rows, index("amax_history"), index("dx_scale"), p);
  return p;
}
}  // namespace

Plan RmsNormBwdOp::plan(const KernelSpec& given, const KernelConfig& c) const {
  if (c.count("FP8")) {
    const KernelSpec call = with_defaults(given);
    return fp8_plan(call, tensors(call), c);
  }
  const KernelSpec& call = given;
  Plan p;
  const int64_t n_rows = call.param("rows"), H = call.param("hidden");
  const int64_t blocks = row_blocks(n_rows, c);
  const bool recompute = call.param("recompute_rstd") != 0, dres = adds_dres(call);
  // Tensors in signature order: dy, x, gamma, [rstd], [dres], dx, dgamma.
  const uint32_t dres_index = recompute ? 3 : 4;
  const uint32_t dx = dres_index + (dres ? 1 : 0), dgamma = dx + 1;
  p.workspace_bytes = static_cast<uint64_t>(std::max<int64_t>(blocks, 1) * round_up(H, 4)) * 4;
  Launch rows_pass;
  rows_pass.kernel = "kiln_rmsnorm_bwd";
  rows_pass.geometry.grid.x = static_cast<uint32_t>(blocks);
  rows_pass.geometry.block.x = static_cast<uint32_t>(c.at("ROW_THREADS") * c.at("ROWS"));
  rows_pass.args = {KernelArg::tensor(0), KernelArg::tensor(1), KernelArg::tensor(2)};
  if (!recompute) rows_pass.args.push_back(KernelArg::tensor(3));
  if (dres) rows_pass.args.push_back(KernelArg::tensor(dres_index));
  rows_pass.args.insert(rows_pass.args.end(), {KernelArg::tensor(dx), KernelArg::workspace(0), KernelArg::i32(n_rows),
                                               KernelArg::i32(blocks), KernelArg::scalar(0)});
  Launch reduce;
  reduce.kernel = "kiln_rmsnorm_bwd_dgamma";
  reduce.geometry.grid.x = static_cast<uint32_t>(ceil_div(H, kReduceCols));
  reduce.geometry.block.x = static_cast<uint32_t>(kReduceCols * kReduceLanes);
  reduce.args = {KernelArg::workspace(0), KernelArg::tensor(dgamma), KernelArg::i32(blocks)};
  // After the row pass, the reduction is launched with programmatic dependent launch (sm_90a;
  // ignored elsewhere): its launch overlaps the row pass's last blocks, and it waits for them
  // (kiln::wait_prior_grid) before reading the partials.
  reduce.geometry.programmatic_dependent_launch = n_rows > 0;
  // 0 rows: no row blocks, and dgamma is a sum over no rows: the reduction alone writes zeros.
  if (n_rows == 0) p.launches = {std::move(reduce)};
  else p.launches = {std::move(rows_pass), std::move(reduce)};
  return p;
}

void RmsNormBwdOp::init_inputs(const KernelSpec& spec, std::span<const TensorInfo> inputs,
                               std::vector<std::vector<float>>& values, std::mt19937_64& rng) const {
  OpTemplate::init_inputs(spec, inputs, values, rng);
  fp8_fused_init_history(kFused, with_defaults(spec), values, rng);
  if (spec.param("recompute_rstd")) return;
  // rstd as the forward saves it: from x, with the default eps, in fp32.
  const int64_t H = spec.param("hidden");
  std::vector<float>& rstd = values[3];
  for (size_t r = 0; r < rstd.size(); ++r) {
    double sum = 0;
    for (int64_t c = 0; c < H; ++c) sum += double(values[1][r * H + c]) * values[1][r * H + c];
    rstd[r] = static_cast<float>(1.0 / std::sqrt(sum / H + kScalars[0].default_value));
  }
}

void RmsNormBwdOp::reference(const KernelSpec& given, const Scalars& scalars, std::span<const std::vector<float>> in,
                             std::span<const int64_t> sampled, std::vector<RefOutput>& outputs) const {
  const KernelSpec spec = with_defaults(given);
  const int64_t n_rows = spec.param("rows"), H = spec.param("hidden");
  const bool recompute = spec.param("recompute_rstd") != 0;
  const double eps = scalar(scalars, "eps");
  const std::vector<float>&dy = in[0], &x = in[1], &gamma = in[2];
  const std::vector<float>* dres = adds_dres(spec) ? &in[recompute ? 3 : 4] : nullptr;
  outputs.assign(2, {});
  const std::vector<int64_t> rows = fp8_fused_reference_rows(spec, sampled);
  outputs[0].rows = rows;
  std::vector<double> dgamma(static_cast<size_t>(H), 0.0);
  size_t next = 0;
  for (int64_t r = 0; r < n_rows; ++r) {  // dgamma needs every row
    const float* xr = &x[static_cast<size_t>(r * H)];
    const float* dyr = &dy[static_cast<size_t>(r * H)];
    double rstd;
    if (recompute) {
      double sum = 0;
      for (int64_t c = 0; c < H; ++c) sum += double(xr[c]) * xr[c];
      rstd = 1.0 / std::sqrt(sum / H + eps);
    } else {
      rstd = in[3][static_cast<size_t>(r)];
    }
    for (int64_t c = 0; c < H; ++c) dgamma[c] += double(dyr[c]) * xr[c] * rstd;
    if (next < rows.size() && rows[next] == r) {
      ++next;
      double dot = 0;
      for (int64_t c = 0; c < H; ++c) dot += double(dyr[c]) * gamma[c] * xr[c];
      const float* dresr = dres ? &(*dres)[static_cast<size_t>(r * H)] : nullptr;
      for (int64_t c = 0; c < H; ++c)
        outputs[0].values.push_back(rstd * gamma[c] * dyr[c] - xr[c] * rstd * rstd * rstd / H * dot +
                                    (dresr ? double(dresr[c]) : 0.0));
    }
  }
  outputs[1].values = std::move(dgamma);
  fp8_fused_reference(spec, H, in, outputs);
}

Gate RmsNormBwdOp::gate(const KernelSpec& spec, const TensorInfo& output) const {
  Gate g = fp8_fused_gate(with_defaults(spec), output);
  // hidden = 1: dx = r gamma dy eps / (x^2 + eps) exactly, a cancellation to about 1e-5 of the
  // terms, where fp16 is subnormal: the per-element gate holds, the relative norm does not apply.
  if (output.name == "dx" && spec.param("hidden") == 1) g.max_rel_fro = -1;
  return g;
}

std::vector<TestSpec> RmsNormBwdOp::test_specs(const TargetInfo& target) const {
  std::vector<TestSpec> out;
  auto add = [&](DType t, int64_t rows, int64_t hidden, int recompute, std::string_view why, int dres = 0) {
    out.push_back({{"rmsnorm_bwd",
                    t,
                    t,
                    {{"rows", rows}, {"hidden", hidden}, {"recompute_rstd", recompute}, {"residual_grad", dres}}},
                   why});
  };
  for (DType t : kDTypes) {
    add(t, 3, 1, 0, "hidden 1");
    add(t, 5, 7, 1, "hidden 7, rstd recomputed (scalar variant)");
    add(t, 4, 1000, 0, "hidden 1000");
    add(t, 5, 1000, t == DType::f32 ? 0 : 1,
        "5 rows, hidden 1000: a partial row block past the first four rows (issue 19: an emulator crash, "
        "fixed in the emulator)");
    add(t, 6, 4096, 0, "hidden 4096, vector loads");
    // residual_grad: dres staged with dy and x, added to dx before the output conversion.
    add(t, 5, 1, 0, "residual_grad, hidden 1", 1);
    add(t, 5, 7, 1, "residual_grad, hidden 7, rstd recomputed (dres is tensor 3; scalar variant)", 1);
    add(t, 5, 1000, 0, "residual_grad, 5 rows, hidden 1000: the partial row block of issue 19", 1);
    add(t, 6, 4096, 0, "residual_grad, hidden 4096, vector loads", 1);
  }
  add(DType::bf16, 0, 64, 0, "0 rows: a no-op");
  add(DType::bf16, 1, 64, 1, "1 row");
  add(DType::bf16, 700, 5120, 0, "more rows than row blocks");
  add(DType::bf16, 0, 64, 0, "residual_grad, 0 rows: a no-op", 1);
  add(DType::bf16, 700, 5120, 0, "residual_grad, more rows than row blocks (the prefetch carries dres)", 1);
  add(DType::f16, 8191, 1000, 1, "residual_grad, 8191 rows, rstd recomputed: several slots per block", 1);
  add(DType::bf16, 8191, 1000, 1, "8191 rows: several row slots per block through the prefetch, the last one partial");
  // The fp8 output of dx in the same pass (e5m2 is the gradient's format; e4m3 served too).
  const auto [e4, e5] = fp8_test_formats(target);
  auto fp8 = [&](DType t, int64_t rows, int64_t H, int recompute, int dres, DType f, int64_t g, int64_t len,
                 std::string_view why) {
    KernelSpec s{"rmsnorm_bwd", t, t,
                 {{"rows", rows}, {"hidden", H}, {"recompute_rstd", recompute}, {"residual_grad", dres},
                  {"fp8_out", fp8_out_value(f)}, {"fp8_granularity", g}}};
    if (g == kTensorwise) s.params["history_len"] = len;
    out.push_back({s, why});
  };
  fp8(DType::bf16, 3, 1024, 0, 0, e5, kRowwise, 0, "fp8 rowwise, hidden 1024");
  fp8(DType::bf16, 5, 1000, 0, 1, e5, kBlock1x128, 0, "fp8 1x128, hidden 1000 (tail group), residual_grad");
  fp8(DType::f16, 3, 7, 1, 0, e5, kRowwise, 0, "fp8 rowwise, hidden 7, rstd recomputed (scalar variant)");
  fp8(DType::bf16, 3, 300, 0, 1, e4, kBlock1x128, 0,
      "fp8 1x128, hidden 300 (scalar variant: groups across wavefronts), residual_grad");
  fp8(DType::f32, 2, 200, 0, 0, e5, kBlock1x128, 0, "fp8 1x128 from fp32, hidden 200");
  fp8(DType::bf16, 700, 512, 0, 1, e5, kRowwise, 0, "fp8 rowwise, more rows than row blocks");
  fp8(DType::bf16, 6, 512, 0, 1, e5, kTensorwise, 16, "fp8 delayed tensorwise, history 16, residual_grad");
  fp8(DType::bf16, 0, 64, 0, 0, e5, kTensorwise, 4, "fp8 delayed, 0 rows: zero dgamma, the history's scale");
  return out;
}

}  // namespace kiln
