#include "templates/quantize_fp8/quantize_fp8.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "support/embedded.h"
#include "templates/lib/elementwise_row.h"
#include "templates/lib/grouped_offsets.h"

namespace kiln {
namespace {
const ParamInfo kParams[] = {
    {"rows", "rows (tokens); a runtime argument, not baked; 0 is a no-op", false, false, 0, (int64_t{1} << 31) - 1},
    {"cols", "columns (the last dimension)", true, false, 1, int64_t{1} << 22},
    {"granularity",
     "what one scale covers: the tensor, a row, 1x128 or 128x128 elements (fp32 scales), or mx: 1x32 elements (OCP "
     "MXFP8, e8m0 scales)",
     true, false, 0, 4, fp8_granularity_names_with_mx()},
    {"transpose", "also write qt = quantized x^T [cols, rows] (tensorwise and block128x128; block1x128 with only_qt; "
                  "default 0)",
     true, true, 0, 1, {}, 0},
    {"scaling", "tensorwise: current (the exact amax of x, two passes over x; default) or delayed (TransformerEngine's "
                "recipe: the scale from amax_history, one pass)",
     true, false, 0, 1, fp8_scaling_names(), 0, true},
    {"history_len", "delayed scaling: entries of amax_history (TransformerEngine's amax_history_len; default 1024)", false,
     false, 1, kFp8MaxHistory, {}, 1024},
    {"margin", "delayed scaling: the scale keeps amax_h at 2^-margin of the format's largest value (default 0)", false,
     false, 0, 64, {}, 0},
    {"only_qt",
     "write qt alone with qt_scale in qt's own layout, and not q: block1x128, x^T in 1x128 blocks of its own rows "
     "(along the rows of x; the wgrad copy of a tensor whose q a fused fp8 output already wrote); block128x128, x^T in "
     "128x128 blocks (the dgrad copy W^T of a weight) (transpose=1; default 0)",
     true, true, 0, 1, {}, 0, true},
    {"batch",
     "only_qt: quantize batch tensors [rows, cols] in one launch, x [batch, rows, cols] -> qt [batch, cols, rows] (the "
     "experts of an MoE layer's weight [G, N, K]); a runtime argument (default 1)",
     false, false, 1, 65535, {}, 1},
    {"groups",
     "only_qt block1x128: x's rows are G groups by offsets (the tokens of an MoE layer's experts); qt is written in "
     "group-aligned 128-row panels, each group's 1x128 blocks starting at its first row (the fp8 k-grouped wgrad's "
     "operand; default 0: not grouped)",
     true, false, 0, 4096, {}, 0, true},
};
const DType kDTypes[] = {DType::bf16, DType::f16, DType::f32};
constexpr int64_t kTileThreads = 512;  // one 128x128 tile: 16 lanes x 8 columns, 32 x 4 rows
constexpr int64_t kMaxPartials = 256;  // tensorwise: amax partials (blocks of kiln_fp8_amax)
constexpr int64_t kAmaxThreads = 256;
constexpr int64_t kRowwiseMaxCols = 65536;

std::vector<int64_t> rows_cols(const KernelSpec& s) { return {s.param("rows"), s.param("cols")}; }
std::vector<int64_t> cols_rows(const KernelSpec& s) { return {s.param("cols"), s.param("rows")}; }
bool with_transpose(const KernelSpec& s) { return s.param("transpose") != 0; }
bool delayed(const KernelSpec& s) { return s.param("scaling") == kDelayedScaling; }
DType scale_dtype(const KernelSpec& s) { return s.param("granularity") == kMx ? DType::e8m0 : DType::f32; }
bool only_qt(const KernelSpec& s) { return s.param("only_qt") != 0; }
bool writes_q(const KernelSpec& s) { return !only_qt(s); }
int64_t batch(const KernelSpec& s) { return s.param("batch", 1); }
// With batch > 1 the tensors of only_qt gain a leading dimension.
std::vector<int64_t> batched(const KernelSpec& s, std::vector<int64_t> shape) {
  if (batch(s) > 1) shape.insert(shape.begin(), batch(s));
  return shape;
}
std::vector<int64_t> x_shape(const KernelSpec& s) { return batched(s, rows_cols(s)); }
int64_t groups(const KernelSpec& s) { return s.param("groups", 0); }
bool grouped(const KernelSpec& s) { return groups(s) > 0; }
// The tile kernel's grid with the column block in x (quantize_fp8.kernel, COL_MAJOR_GRID).
bool col_major_grid(const KernelConfig& c) { return c.count("COL_MAJOR_GRID") && c.at("COL_MAJOR_GRID") != 0; }
// Grouped: 128-row panels of x, ceil(rows / 128) + G of them (each group wastes less than one).
int64_t panels(const KernelSpec& s) { return ceil_div(s.param("rows"), 128) + groups(s); }
std::vector<int64_t> qt_shape(const KernelSpec& s) {
  if (grouped(s)) return {panels(s), s.param("cols"), 128};
  return batched(s, cols_rows(s));
}
std::vector<int64_t> offsets_shape(const KernelSpec& s) { return {groups(s) + 1}; }
// qt's scales in qt's layout: block1x128 [cols, ceil(rows/128)], block128x128 [ceil(cols/128), ceil(rows/128)].
std::vector<int64_t> qt_scale_shape(const KernelSpec& s) {
  if (grouped(s)) return {panels(s), s.param("cols")};
  const int64_t c = s.param("granularity") == kBlock128x128 ? ceil_div(s.param("cols"), 128) : s.param("cols");
  return batched(s, {c, ceil_div(s.param("rows"), 128)});
}
const TensorDecl kSignature[] = {
    {"x", Role::input, DTypeRule::in, DType::f32, "[rows, cols]; [batch, rows, cols] with batch > 1", x_shape},
    {"amax_history", Role::input, DTypeRule::fixed, DType::f32, "[history_len]", fp8_history_shape, delayed,
     "delayed scaling: max |x| of earlier calls, [0] the latest"},
    {"offsets", Role::input, DTypeRule::fixed, DType::i32, "[groups + 1]", offsets_shape, grouped,
     "groups: group g is rows offsets[g] .. offsets[g + 1] - 1 of x (0 = offsets[0] <= ... <= offsets[G] = rows), on "
     "the device"},
    {"q", Role::output, DTypeRule::out, DType::f32, "[rows, cols]", rows_cols, writes_q, "fp8(x / scale)"},
    {"scale", Role::output, DTypeRule::derived, DType::f32,
     "[1] | [rows] | [rows, ceil(cols/128)] | [ceil(rows/128), ceil(cols/128)] | [rows, ceil(cols/32)] (tensorwise | "
     "rowwise | block1x128 | block128x128 | mx)",
     fp8_scale_shape, writes_q,
     "amax / FP8_MAX per group (1 where amax = 0); mx: 2^(floor(log2 amax) - emax); x ~ float(q) * scale", {}, nullptr,
     scale_dtype, "fp32; e8m0 with granularity mx"},
    {"qt", Role::output, DTypeRule::out, DType::f32,
     "[cols, rows]; [batch, cols, rows] with batch > 1; [ceil(rows/128) + groups, cols, 128] with groups", qt_shape,
     with_transpose, "x^T quantized with the same scales (with transpose=1), or with qt_scale (only_qt)"},
    {"qt_scale", Role::output, DTypeRule::fixed, DType::f32,
     "[cols, ceil(rows/128)] | [ceil(cols/128), ceil(rows/128)] (block1x128 | block128x128); [batch, ...] with "
     "batch > 1; [ceil(rows/128) + groups, cols] with groups",
     qt_scale_shape, only_qt,
     "only_qt: qt's block scales in qt's layout (block1x128: 128 rows of a column of x; block128x128: a 128x128 tile, "
     "W's scale tensor transposed); x^T ~ float(qt) * qt_scale"},
    {"amax_history_out", Role::output, DTypeRule::fixed, DType::f32, "[history_len]", fp8_history_shape, delayed,
     "the history with this call's max |x| pushed at [0] (written over amax_history)", "amax_history"},
};

// The amax partial blocks of a tensorwise call: each thread of kiln_fp8_amax reads about 8
// accesses or more, at most kMaxPartials blocks (every quantize block reduces them).
int64_t amax_partials(int64_t rows, int64_t cols, int64_t vec) {
  const int64_t accesses = rows * cols / vec;
  return std::clamp<int64_t>(ceil_div(accesses, kAmaxThreads * 8), 1, kMaxPartials);
}
}  // namespace

std::span<const ParamInfo> QuantizeFp8Op::params() const { return kParams; }
std::span<const DType> QuantizeFp8Op::dtypes() const { return kDTypes; }
bool QuantizeFp8Op::supports_out_dtype(DType in, DType out) const { return is_float16_or_32(in) && is_fp8(out); }
std::span<const TensorDecl> QuantizeFp8Op::signature() const { return kSignature; }
std::string_view QuantizeFp8Op::device_template(const KernelConfig& c) const {
  // only_qt has its own template: quantize_fp8.kernel, and every other kernel's cache key, stay as
  // they were.
  return embedded_file(c.count("QT") ? "templates/quantize_fp8/quantize_fp8_qt.kernel"
                                     : "templates/quantize_fp8/quantize_fp8.kernel");
}
std::string_view QuantizeFp8Op::kernel_name(const KernelConfig& c) const {
  // An empty configuration (`kiln ops`) names the kernel of most granularities.
  if (c.count("QT")) return "kiln_quantize_fp8_qt";
  if (c.count("ROW_BLOCKS")) return "kiln_quantize_fp8_row_blocks";
  const auto tiled = c.find("TILED");
  return tiled != c.end() && tiled->second == 0 ? "kiln_quantize_fp8_rows" : "kiln_quantize_fp8_tiles";
}

Result<void> QuantizeFp8Op::validate_rules(const KernelSpec& spec, const TargetInfo&) const {
  const KernelSpec s = with_defaults(spec);
  const int64_t g = s.param("granularity");
  if (delayed(s) && g != kTensorwise)
    return make_error(Errc::invalid_argument,
                      fmt::format("quantize_fp8: scaling=delayed is a tensorwise recipe (one scale from the amax "
                                  "history); granularity {} computes its scales from x in the same pass already: use "
                                  "scaling=current",
                                  fp8_granularity_names_with_mx()[static_cast<size_t>(g)]));
  if (only_qt(s) && ((g != kBlock1x128 && g != kBlock128x128) || !s.param("transpose")))
    return make_error(Errc::invalid_argument,
                      "quantize_fp8: only_qt writes x^T alone, in 1x128 blocks along the rows of x or in 128x128 "
                      "blocks: it needs granularity block1x128 or block128x128 and transpose=1 (tensorwise writes q "
                      "and qt in one call)");
  if (grouped(s) && (!only_qt(s) || g != kBlock1x128 || batch(s) > 1))
    return make_error(Errc::invalid_argument,
                      fmt::format("quantize_fp8: groups = {} writes x^T in group-aligned 1x128 blocks along the rows "
                                  "(the fp8 k-grouped wgrad's operand): it needs granularity block1x128, transpose=1, "
                                  "only_qt=1 and batch=1",
                                  groups(s)));
  if (batch(s) > 1 && !only_qt(s))
    return make_error(Errc::invalid_argument,
                      fmt::format("quantize_fp8: batch = {} quantizes several tensors in one launch with only_qt (the "
                                  "transposed copies of an MoE layer's experts); set only_qt=1 (granularity "
                                  "block1x128 or block128x128, transpose=1), or batch=1",
                                  batch(s)));
  if (s.param("transpose") && !only_qt(s) && (g == kRowwise || g == kBlock1x128 || g == kMx))
    return make_error(Errc::invalid_argument,
                      fmt::format("quantize_fp8: transpose=1 needs a scale shared by the rows and the columns of x "
                                  "(granularity tensorwise or block128x128); with {} the scales of x^T would differ "
                                  "from those of x: quantize x^T with its own call instead, or for block1x128 pass "
                                  "only_qt=1 (x^T in 1x128 blocks of its own rows, without q)",
                                  fp8_granularity_names_with_mx()[static_cast<size_t>(g)]));
  if (g == kRowwise && s.param("cols") > kRowwiseMaxCols)
    return make_error(Errc::invalid_argument,
                      fmt::format("quantize_fp8: rowwise keeps a row in registers: cols = {} must be at most {}; use "
                                  "block1x128 for longer rows",
                                  s.param("cols"), kRowwiseMaxCols));
  return ok();
}

std::vector<KernelConfig> QuantizeFp8Op::variants(const KernelSpec& spec, const TargetInfo& target) const {
  const KernelSpec s = with_defaults(spec);
  const int64_t cols = s.param("cols");
  const int64_t vec = 16 / static_cast<int64_t>(dtype_size(s.dtype));
  std::vector<KernelConfig> out;
  for (int64_t v : {vec, int64_t{1}}) {
    if (v > 1 && cols % 8 != 0) continue;  // whole 8-element chunks: 16-byte loads, 8-byte fp8 stores
    if (s.param("granularity") == kRowwise) {
      // One block per row; each thread ITEMS chunks of 8 elements, about 4 chunks per thread.
      const int64_t chunks = ceil_div(cols, 8);
      const int64_t threads =
          std::clamp<int64_t>(round_up(ceil_div(chunks, 4), target.wave_size), target.wave_size, 1024);
      out.push_back({{"TILED", 0}, {"THREADS", threads}, {"VEC", v}, {"ITEMS", ceil_div(chunks, threads)}});
    } else if (s.param("granularity") == kBlock1x128 && !only_qt(s)) {
      // Without qt, a 1x128 block stays inside a row: blocks over (row, chunks of the row), no tile.
      KernelConfig c = elementwise_row_config(ceil_div(cols, 8), 1, target, {.max_threads = 256, .items = 4});
      c["VEC"] = v;
      c["TILED"] = 0;
      c["ROW_BLOCKS"] = 1;
      out.push_back(std::move(c));
    } else if (only_qt(s)) {
      out.push_back({{"QT", 1}, {"TILED", 1}, {"THREADS", kTileThreads}, {"VEC", v}, {"ITEMS", 1}});
    } else {
      out.push_back({{"TILED", 1}, {"THREADS", kTileThreads}, {"VEC", v}, {"ITEMS", 1}, {"COL_MAJOR_GRID", 1}});
    }
  }
  return out;
}

// Tuning: the tile kernel's grid in either order (COL_MAJOR_GRID). Column blocks in x is the
// default: H100, 2026-11-27, 8192 rows, tuner medians of 20 launches: block1x128 0.1360 -> 0.1266 ms
// at 14336 columns and 0.0434 -> 0.0421 at 4096, block128x128 0.1305 -> 0.1220 and 0.0422 ->
// 0.0399, tensorwise 0.2497 -> 0.2420 at 14336 (0.0788 against 0.0804 at 4096, the one loss)
// (bench/results/h100-2026-11-27-quantize-grid/).
std::vector<KernelConfig> QuantizeFp8Op::tuning_candidates(const KernelSpec& spec, const TargetInfo& target) const {
  const KernelConfig d = choose_config(spec, target);
  if (d.count("ROW_BLOCKS")) {
    // block1x128's row blocks: THREADS 64 to 1024 with ITEMS 1, 2 or 4 where a row holds them,
    // then the tile kernel that served block1x128 before them.
    const int64_t chunks = ceil_div(with_defaults(spec).param("cols"), 8);
    std::vector<KernelConfig> out = thread_item_candidates(d, chunks, {1, 2, 4}, target);
    out.push_back({{"TILED", 1}, {"THREADS", kTileThreads}, {"VEC", d.at("VEC")}, {"ITEMS", 1}, {"COL_MAJOR_GRID", 1}});
    return out;
  }
  if (!d.count("TILED") || !d.at("TILED") || d.count("QT")) return {d};
  KernelConfig other = d;
  if (col_major_grid(d))
    other.erase("COL_MAJOR_GRID");
  else
    other["COL_MAJOR_GRID"] = 1;
  return {d, other};
}

std::vector<uint32_t> QuantizeFp8Op::base_alignment(const KernelSpec& spec, const KernelConfig& config) const {
  // scale and the history: scalar accesses.
  const size_t n = tensors(spec).size();
  if (grouped(with_defaults(spec))) return vector_variant_alignment(config, n, {1, 3});  // offsets, qt_scale
  return delayed(with_defaults(spec)) ? vector_variant_alignment(config, n, {1, 3, n - 1})
                                      : vector_variant_alignment(config, n, {2});
}

std::string QuantizeFp8Op::specialize(const KernelSpec& spec, const KernelConfig& c) const {
  const KernelSpec s = with_defaults(spec);
  // GRAN, TRANSPOSE and VECTOR (VEC > 1) are macros: the template selects code with #if.
  // GROUPED only where set: the source, and the cache key, of every other spec stay as they were.
  return fmt::format("constexpr int COLS = {};\n#define GRAN {}\n#define TRANSPOSE {}\n#define DELAYED {}\n"
                     "#define VECTOR {}\nconstexpr int THREADS = {}, VEC = {}, ITEMS = {};\n"
                     "typedef {} in_t;\ntypedef {} out_t;\n",
                     s.param("cols"), s.param("granularity"), s.param("transpose"), s.param("scaling"),
                     c.at("VEC") > 1 ? 1 : 0,
                     c.at("THREADS"), c.at("VEC"), c.at("ITEMS"), device_type_name(s.dtype), device_type_name(s.out_dtype)) +
         (grouped(s) ? fmt::format("#define GROUPED 1\nconstexpr int GROUPS = {};\n", groups(s)) : std::string()) +
         (col_major_grid(c) ? "#define COL_MAJOR_GRID 1\n" : "") + (c.count("ROW_BLOCKS") ? "#define ROW_BLOCKS 1\n" : "");
}

Plan QuantizeFp8Op::plan(const KernelSpec& call, const KernelConfig& c) const {
  Plan p;
  const int64_t rows = call.param("rows"), cols = call.param("cols"), g = call.param("granularity");
  // 0 rows: nothing to quantize; tensorwise still writes its scale (amax 0 gives scale 1), with
  // one tile block that reduces no partials.
  if (rows == 0 && g != kTensorwise && !grouped(call)) return p;
  const bool transpose = call.param("transpose") != 0;
  if (c.count("QT") && grouped(call)) {  // x, offsets -> qt panels, qt_scale; every panel written
    Launch l;
    l.kernel = "kiln_quantize_fp8_qt";
    l.geometry.grid.x = static_cast<uint32_t>(panels(call));
    l.geometry.grid.y = static_cast<uint32_t>(ceil_div(cols, 128));
    l.geometry.block.x = static_cast<uint32_t>(kTileThreads);
    l.args = {KernelArg::tensor(0), KernelArg::tensor(1), KernelArg::tensor(2), KernelArg::tensor(3),
              KernelArg::i32(rows)};
    p.launches.push_back(l);
    return p;
  }
  if (c.count("QT")) {  // x -> qt, qt_scale
    Launch l;
    l.kernel = "kiln_quantize_fp8_qt";
    l.geometry.grid.x = static_cast<uint32_t>(ceil_div(rows, 128));
    l.geometry.grid.y = static_cast<uint32_t>(ceil_div(cols, 128));
    l.geometry.grid.z = static_cast<uint32_t>(batch(call));
    l.geometry.block.x = static_cast<uint32_t>(kTileThreads);
    l.args = {KernelArg::tensor(0), KernelArg::tensor(1), KernelArg::tensor(2), KernelArg::i32(rows)};
    p.launches.push_back(l);
    return p;
  }
  if (c.count("ROW_BLOCKS")) {  // block1x128 without qt: grid (rows, chunks of a row)
    Launch l;
    l.kernel = "kiln_quantize_fp8_row_blocks";
    l.geometry.grid.x = static_cast<uint32_t>(rows);
    l.geometry.grid.y = static_cast<uint32_t>(ceil_div(ceil_div(cols, 8), c.at("THREADS") * c.at("ITEMS")));
    l.geometry.block.x = static_cast<uint32_t>(c.at("THREADS"));
    l.args = {KernelArg::tensor(0), KernelArg::tensor(1), KernelArg::tensor(2), KernelArg::i32(rows)};
    p.launches.push_back(l);
    return p;
  }
  if (!c.at("TILED")) {
    Launch rowwise;
    rowwise.kernel = "kiln_quantize_fp8_rows";
    rowwise.geometry.grid.x = static_cast<uint32_t>(rows);
    rowwise.geometry.block.x = static_cast<uint32_t>(c.at("THREADS"));
    rowwise.args = {KernelArg::tensor(0), KernelArg::tensor(1), KernelArg::tensor(2), KernelArg::i32(rows)};
    p.launches.push_back(rowwise);
    return p;
  }
  // Tensors: 0 x, 1 amax_history (delayed), then q, scale, qt (with transpose), amax_history_out.
  const uint32_t h = delayed(call) ? 1 : 0;
  Launch tiles;
  tiles.kernel = "kiln_quantize_fp8_tiles";
  const int64_t row_tiles = std::max<int64_t>(ceil_div(rows, 128), 1);
  if (col_major_grid(c)) {  // column block x, row tile y + kMaxGridYZ z (the kernel's 65535)
    tiles.geometry.grid.x = static_cast<uint32_t>(ceil_div(cols, 128));
    tiles.geometry.grid.y = static_cast<uint32_t>(std::min(row_tiles, kMaxGridYZ));
    tiles.geometry.grid.z = static_cast<uint32_t>(ceil_div(row_tiles, kMaxGridYZ));
  } else {
    tiles.geometry.grid.x = static_cast<uint32_t>(row_tiles);
    tiles.geometry.grid.y = static_cast<uint32_t>(ceil_div(cols, 128));
  }
  tiles.geometry.block.x = static_cast<uint32_t>(kTileThreads);
  tiles.args.push_back(KernelArg::tensor(0));
  for (uint32_t i = 1; i < (transpose ? 4u : 3u); ++i) tiles.args.push_back(KernelArg::tensor(i + h));
  if (h) {
    // One pass over x with the scale of the history; each tile block's max |x| goes into the
    // workspace, and one block (kiln_fp8_amax_history) pushes their max into the history.
    const int64_t tiles_n = rows == 0 ? 0 : row_tiles * ceil_div(cols, 128);
    const int64_t len = call.param("history_len"), margin = call.param("margin");
    tiles.args.push_back(KernelArg::workspace(0));
    tiles.args.push_back(KernelArg::tensor(1));
    tiles.args.push_back(KernelArg::i32(len));
    tiles.args.push_back(KernelArg::i32(margin));
    tiles.args.push_back(KernelArg::i32(rows));
    if (tiles_n > 0) p.launches.push_back(tiles);
    p.launches.push_back(fp8_history_launch(tiles_n, 1, 2 + h, len, margin));
    p.workspace_bytes = static_cast<uint64_t>(std::max<int64_t>(tiles_n, 1)) * sizeof(float);
    return p;
  }
  if (g == kTensorwise) {
    const int64_t partials = rows == 0 ? 0 : amax_partials(rows, cols, c.at("VEC"));
    Launch amax;
    amax.kernel = "kiln_fp8_amax";
    amax.geometry.grid.x = static_cast<uint32_t>(partials);
    amax.geometry.block.x = static_cast<uint32_t>(kAmaxThreads);
    amax.args = {KernelArg::tensor(0), KernelArg::workspace(0), KernelArg::i32(rows), KernelArg::i32(partials)};
    if (partials > 0) p.launches.push_back(amax);
    tiles.args.push_back(KernelArg::workspace(0));
    tiles.args.push_back(KernelArg::i32(rows));
    tiles.args.push_back(KernelArg::i32(partials));
    p.workspace_bytes = static_cast<uint64_t>(kMaxPartials) * sizeof(float);
  } else {
    tiles.args.push_back(KernelArg::i32(rows));
  }
  p.launches.push_back(tiles);
  return p;
}

void QuantizeFp8Op::init_inputs(const KernelSpec& spec, std::span<const TensorInfo> inputs,
                                std::vector<std::vector<float>>& values, std::mt19937_64& rng) const {
  // Uniform in [-1, 1] (magnitudes below 2^-8 raised to 2^-8), row r scaled by 2^(r % 5) and
  // 128-column block b by 2^-(b % 3), so that rowwise and block scales differ between groups.
  OpTemplate::init_inputs(spec, inputs, values, rng);
  const int64_t cols = spec.param("cols");
  std::vector<float>& x = values.at(0);
  for (size_t i = 0; i < x.size(); ++i) {
    const int64_t r = static_cast<int64_t>(i) / cols, c = static_cast<int64_t>(i) % cols;
    // |x| >= 2^-8 first, so that the scaled value is never a zero or a subnormal of fp16.
    const float v = std::fabs(x[i]) < 1.0f / 256 ? std::copysign(1.0f / 256, x[i]) : x[i];
    // mx: 32-column groups also 2^-(c / 32 % 4), so that neighbouring groups take different scales.
    const int mx = spec.param("granularity") == kMx ? static_cast<int>(c / kMxBlock % 4) : 0;
    x[i] = round_to_dtype(std::ldexp(v, static_cast<int>(r % 5 - (c / 128) % 3) - mx), inputs[0].dtype);
  }
  if (grouped(with_defaults(spec))) values.at(1) = grouped_test_offsets(groups(spec), spec.param("rows"), rng);
  if (delayed(with_defaults(spec))) {
    float amax = 0.0f;
    for (float v : x) amax = std::fmax(amax, std::fabs(v));
    fp8_init_history(amax, values.at(1), rng);
  }
}

void QuantizeFp8Op::reference(const KernelSpec& spec, const Scalars&, std::span<const std::vector<float>> inputs,
                              std::span<const int64_t> sample, std::vector<RefOutput>& outputs) const {
  const KernelSpec s = with_defaults(spec);
  const int64_t rows = s.param("rows"), cols = s.param("cols"), g = s.param("granularity");
  const bool transpose = with_transpose(s);
  const DType fp8 = s.out_dtype;
  const float fp8_max_f = static_cast<float>(fp8_max(fp8));
  const std::vector<float>& x = inputs[0];
  if (grouped(s)) {  // panels [P/128, cols, 128] and qt_scale [P/128, cols], zeros outside the groups
    outputs.assign(2, {});
    const std::vector<float>& off = inputs[1];
    const int64_t G = groups(s), P = panels(s);
    std::vector<int64_t> first(static_cast<size_t>(P), 0), last(static_cast<size_t>(P), 0);  // x's rows of panel p
    for (int64_t g = 0; g < G; ++g) {
      const int64_t r0 = static_cast<int64_t>(off[g]), r1 = static_cast<int64_t>(off[g + 1]);
      for (int64_t p = r0 / 128 + g, r = r0; r < r1; ++p, r += 128) {
        first[static_cast<size_t>(p)] = r;
        last[static_cast<size_t>(p)] = std::min(r1, r + 128);
      }
    }
    outputs[0].values.assign(static_cast<size_t>(P * cols * 128), 0.0);
    for (int64_t p = 0; p < P; ++p)
      for (int64_t c = 0; c < cols; ++c) {
        float amax = 0.0f;
        for (int64_t r = first[p]; r < last[p]; ++r) amax = std::fmax(amax, std::fabs(x[static_cast<size_t>(r * cols + c)]));
        const float sc = amax == 0.0f ? 1.0f : amax / fp8_max_f, inv = 1.0f / sc;
        outputs[1].values.push_back(sc);
        for (int64_t r = first[p]; r < last[p]; ++r)
          outputs[0].values[static_cast<size_t>((p * cols + c) * 128 + r - first[p])] =
              fp8_bits_to_float(float_to_fp8_bits(x[static_cast<size_t>(r * cols + c)] * inv, fp8), fp8);
      }
    return;
  }
  if (only_qt(s)) {  // per batch: qt [cols, rows] and qt_scale in qt's layout
    outputs.assign(2, {});
    const int64_t nb = ceil_div(rows, 128), cb = ceil_div(cols, 128);
    for (int64_t z = 0; z < batch(s); ++z) {
      const float* xz = x.data() + z * rows * cols;
      auto scale_of = [&](int64_t r_lo, int64_t r_hi, int64_t c_lo, int64_t c_hi) {
        float amax = 0.0f;
        for (int64_t r = r_lo; r < r_hi; ++r)
          for (int64_t c = c_lo; c < c_hi; ++c) amax = std::fmax(amax, std::fabs(xz[r * cols + c]));
        return amax == 0.0f ? 1.0f : amax / fp8_max_f;
      };
      auto code = [&](int64_t r, int64_t c, float sc) {
        return fp8_bits_to_float(float_to_fp8_bits(xz[r * cols + c] * (1.0f / sc), fp8), fp8);
      };
      if (g == kBlock128x128) {  // qt_scale [cb, nb]: tile (column block, row block) of x
        std::vector<float> sc(static_cast<size_t>(cb * nb));
        for (int64_t j = 0; j < cb; ++j)
          for (int64_t b = 0; b < nb; ++b) {
            sc[static_cast<size_t>(j * nb + b)] =
                scale_of(b * 128, std::min(rows, (b + 1) * 128), j * 128, std::min(cols, (j + 1) * 128));
            outputs[1].values.push_back(sc[static_cast<size_t>(j * nb + b)]);
          }
        for (int64_t c = 0; c < cols; ++c)
          for (int64_t r = 0; r < rows; ++r) outputs[0].values.push_back(code(r, c, sc[static_cast<size_t>((c / 128) * nb + r / 128)]));
        continue;
      }
      for (int64_t c = 0; c < cols; ++c)  // 1x128 blocks along the rows of x: qt_scale [cols, nb]
        for (int64_t b = 0; b < nb; ++b) {
          const int64_t end = std::min(rows, (b + 1) * 128);
          const float sc = scale_of(b * 128, end, c, c + 1);
          outputs[1].values.push_back(sc);
          for (int64_t r = b * 128; r < end; ++r) outputs[0].values.push_back(code(r, c, sc));
        }
    }
    return;
  }
  int64_t groups = 1;
  for (int64_t d : fp8_scale_shape(s)) groups *= d;
  // fp32, as the kernels compute it: amax, scale = amax / FP8_MAX (1 for amax 0), inv = 1 / scale.
  std::vector<float> amax(static_cast<size_t>(groups), 0.0f), scale(amax.size()), inv(amax.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      float& m = amax[static_cast<size_t>(fp8_scale_index(g, cols, r, c))];
      m = std::fmax(m, std::fabs(x[static_cast<size_t>(r * cols + c)]));
    }
  for (size_t i = 0; i < amax.size(); ++i) {
    if (g == kMx) {  // a power of two: 1 / scale is exact
      const uint8_t e = fp8_mx_scale_bits(amax[i], fp8);
      scale[i] = e8m0_bits_to_float(e);
      inv[i] = e == 0xFF ? scale[i] : std::ldexp(1.0f, 127 - int{e});
      continue;
    }
    scale[i] = amax[i] == 0.0f ? 1.0f : amax[i] / fp8_max_f;
    if (delayed(s)) scale[i] = fp8_delayed_scale(inputs[1], s.param("margin"), fp8);
    inv[i] = 1.0f / scale[i];
  }
  auto quantize = [&](int64_t r, int64_t c) -> double {
    const float v = x[static_cast<size_t>(r * cols + c)] * inv[static_cast<size_t>(fp8_scale_index(g, cols, r, c))];
    return fp8_bits_to_float(float_to_fp8_bits(v, fp8), fp8);
  };
  outputs.assign((transpose ? 3 : 2) + (delayed(s) ? 1 : 0), {});
  std::vector<int64_t> rs(sample.begin(), sample.end());
  if (rs.empty())
    for (int64_t r = 0; r < rows; ++r) rs.push_back(r);
  RefOutput& q = outputs[0];
  q.rows = sample.empty() ? std::vector<int64_t>{} : rs;
  for (int64_t r : rs)
    for (int64_t c = 0; c < cols; ++c) q.values.push_back(quantize(r, c));
  RefOutput& sc = outputs[1];
  if ((g == kRowwise || g == kBlock1x128 || g == kMx) && !sample.empty()) {
    sc.rows = rs;
    const int64_t per_row = g == kRowwise ? 1 : g == kMx ? ceil_div(cols, kMxBlock) : ceil_div(cols, 128);
    for (int64_t r : rs)
      for (int64_t b = 0; b < per_row; ++b) sc.values.push_back(scale[static_cast<size_t>(r * per_row + b)]);
  } else {
    sc.values.assign(scale.begin(), scale.end());
  }
  if (transpose)
    for (int64_t c = 0; c < cols; ++c)
      for (int64_t r = 0; r < rows; ++r) outputs[2].values.push_back(quantize(r, c));
  if (delayed(s)) outputs.back().values = fp8_history_pushed(inputs[1], amax[0]);
}

Gate QuantizeFp8Op::gate(const KernelSpec& /*spec*/, const TensorInfo& output) const {
  if (output.name != "scale" && output.name != "qt_scale" && output.name != "amax_history_out")
    return Gate::for_dtype(output.dtype);
  // The scales are defined in fp32 with IEEE divisions, the history holds maxima: bitwise equal.
  Gate g;
  g.atol = g.rtol = 0;
  g.max_rel_fro = -1;
  return g;
}

std::vector<TestSpec> QuantizeFp8Op::test_specs(const TargetInfo& target) const {
  const auto [e4, e5] = fp8_test_formats(target);
  std::vector<TestSpec> out;
  auto add = [&](DType in, DType fp8, int64_t rows, int64_t cols, int64_t g, int64_t t, std::string_view why) {
    out.push_back(
        {{"quantize_fp8", in, fp8, {{"rows", rows}, {"cols", cols}, {"granularity", g}, {"transpose", t}}}, why});
  };
  const DType bf16 = DType::bf16, f16 = DType::f16, f32 = DType::f32;
  add(bf16, e4, 3, 300, kTensorwise, 0, "tensorwise, cols 300 (vector loads, tail tile)");
  add(bf16, e4, 3, 4096, kRowwise, 0, "rowwise, cols 4096");
  add(bf16, e4, 130, 256, kBlock1x128, 0, "block1x128, rows 130");
  add(bf16, e4, 130, 300, kBlock128x128, 0, "block128x128, tails in rows and cols");
  add(bf16, e4, 130, 256, kTensorwise, 1, "tensorwise, transpose, rows 130 (scalar qt stores)");
  add(bf16, e5, 136, 256, kBlock128x128, 1, "block128x128, transpose, rows 136 (8-byte qt stores)");
  add(bf16, e5, 130, 129, kBlock128x128, 1, "block128x128, transpose, cols 129 (scalar variant)");
  add(f16, e5, 1, 1, kTensorwise, 0, "tensorwise, 1x1");
  add(f16, e5, 3, 7, kRowwise, 0, "rowwise, cols 7 (scalar variant)");
  add(f16, e4, 1, 129, kBlock1x128, 0, "block1x128, cols 129");
  add(f16, e5, 1, 128, kBlock128x128, 0, "block128x128, rows 1");
  add(f32, e5, 130, 128, kTensorwise, 0, "tensorwise fp32, rows 130");
  add(f32, e4, 1, 300, kRowwise, 0, "rowwise fp32, cols 300 (scalar variant)");
  add(f32, e5, 3, 300, kBlock1x128, 0, "block1x128 fp32, cols 300");
  add(bf16, e4, 3, 4104, kBlock1x128, 0, "block1x128, cols 4104: a second row block of one chunk, a 1x8 block");
  add(f32, e4, 130, 256, kBlock128x128, 0, "block128x128 fp32");
  add(f32, e4, 3, 7, kBlock128x128, 1, "block128x128 fp32, transpose, 3x7");
  add(bf16, e4, 0, 128, kTensorwise, 0, "0 rows: a no-op");
  add(bf16, e4, 0, 128, kBlock128x128, 1, "0 rows, transpose: a no-op");
  add(bf16, e4, 130, 96, kMx, 0, "mx (e8m0 scales per 32), rows 130");
  add(bf16, e5, 3, 300, kMx, 0, "mx e5m2, cols 300 (a group of 12 at the tail)");
  add(f16, e4, 2, 80, kMx, 0, "mx fp16, cols 80 (a group of 16)");
  add(f32, e5, 3, 7, kMx, 0, "mx fp32, 3x7 (scalar variant, one short group)");
  add(bf16, e4, 0, 64, kMx, 0, "mx, 0 rows: a no-op");
  // only_qt: x^T in 1x128 blocks along the rows of x (the wgrad GEMM's operand), without q.
  auto qt_only = [&](DType in, DType fp8, int64_t rows, int64_t cols, std::string_view why) {
    out.push_back({{"quantize_fp8", in, fp8,
                    {{"rows", rows}, {"cols", cols}, {"granularity", kBlock1x128}, {"transpose", 1}, {"only_qt", 1}}},
                   why});
  };
  qt_only(bf16, e5, 264, 256, "only_qt, rows 264 (8-byte qt stores, tail row block)");
  qt_only(bf16, e4, 130, 300, "only_qt, tails in rows and cols (scalar qt stores)");
  qt_only(f16, e5, 3, 7, "only_qt fp16, 3x7 (scalar variant)");
  qt_only(f32, e4, 129, 136, "only_qt fp32, rows 129");
  qt_only(bf16, e5, 0, 128, "only_qt, 0 rows: a no-op");
  // only_qt in 128x128 blocks, batched: W^T [G, K, N] of an MoE layer's weight W [G, N, K] (the fp8
  // grouped dgrad's b).
  auto qt_batch = [&](DType in, DType fp8, int64_t g, int64_t batch, int64_t rows, int64_t cols, std::string_view why) {
    out.push_back({{"quantize_fp8", in, fp8,
                    {{"rows", rows}, {"cols", cols}, {"granularity", g}, {"transpose", 1}, {"only_qt", 1},
                     {"batch", batch}}},
                   why});
  };
  qt_batch(bf16, e4, kBlock128x128, 3, 136, 200, "only_qt 128x128, 3 experts, tails in rows and cols (8-byte qt stores)");
  qt_batch(bf16, e4, kBlock128x128, 1, 130, 300, "only_qt 128x128, rows 130 (scalar qt stores)");
  qt_batch(f32, e4, kBlock128x128, 2, 3, 7, "only_qt 128x128 fp32, 2 x 3x7 (scalar variant)");
  qt_batch(bf16, e5, kBlock1x128, 2, 129, 72, "only_qt 1x128, 2 batches, rows 129");
  // groups: x^T in group-aligned 128-row panels (the fp8 k-grouped wgrad's operands x and dy).
  auto qt_grouped = [&](DType in, DType fp8, int64_t G, int64_t rows, int64_t cols, std::string_view why) {
    out.push_back({{"quantize_fp8", in, fp8,
                    {{"rows", rows}, {"cols", cols}, {"granularity", kBlock1x128}, {"transpose", 1}, {"only_qt", 1},
                     {"groups", G}}},
                   why});
  };
  qt_grouped(bf16, e4, 5, 300, 136, "groups: 5 uneven groups (some empty, one > 128), cols tail");
  qt_grouped(f32, e4, 2, 7, 24, "groups fp32, 7 rows (scalar variant: cols % 8 == 0 but fp32 vectors)");
  qt_grouped(bf16, e4, 3, 0, 64, "groups, 0 rows: every panel zero");
  auto delayed_spec = [&](DType in, DType fp8, int64_t rows, int64_t cols, int64_t t, int64_t len, int64_t margin,
                          std::string_view why) {
    out.push_back({{"quantize_fp8", in, fp8,
                    {{"rows", rows}, {"cols", cols}, {"granularity", kTensorwise}, {"transpose", t},
                     {"scaling", kDelayedScaling}, {"history_len", len}, {"margin", margin}}},
                   why});
  };
  delayed_spec(bf16, e4, 130, 300, 0, 16, 0, "delayed tensorwise, history 16, tails (saturates)");
  delayed_spec(bf16, e5, 136, 256, 1, kFp8MaxHistory, 1, "delayed tensorwise, transpose, history 1024, margin 1");
  delayed_spec(f32, e4, 3, 7, 0, 1, 0, "delayed tensorwise fp32, 3x7 (scalar variant), history 1");
  delayed_spec(f16, e4, 2, 64, 1, 3, 2, "delayed tensorwise fp16, transpose, margin 2");
  delayed_spec(bf16, e4, 0, 128, 0, 8, 0, "delayed, 0 rows: the scale of the history, amax 0 pushed");
  return out;
}

}  // namespace kiln
