#include "templates/gemm/gemm.h"

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <string>

#include "support/embedded.h"
#include "templates/gemm/gemm_mfma.h"
#include "templates/lib/epilogue_sm90.h"

namespace kiln {
namespace {
constexpr int64_t kMaxDim = int64_t{1} << 24;
// The grid is (ceil(N / BN), ceil(M / BM)); grid.y is limited to kMaxGridYZ blocks (plan.h).
constexpr int64_t kMaxGridY = kMaxGridYZ;

const ParamInfo kParams[] = {
    {"M", "rows of C and of op(A)", true, false, 1, kMaxDim},
    {"N", "columns of C and of op(B)", true, false, 1, kMaxDim},
    {"K", "reduction dimension", true, false, 1, kMaxDim},
    {"trans_a", "A is stored [K,M] (wgrad: TN)", true, true, 0, 1},
    {"trans_b", "B is stored [N,K] (forward: NT)", true, true, 0, 1},
};
const DType kDTypes[] = {DType::bf16, DType::f16, DType::f32};
std::vector<int64_t> a_shape(const KernelSpec& s) {
  return s.param("trans_a") ? std::vector<int64_t>{s.param("K"), s.param("M")} : std::vector<int64_t>{s.param("M"), s.param("K")};
}
std::vector<int64_t> b_shape(const KernelSpec& s) {
  return s.param("trans_b") ? std::vector<int64_t>{s.param("N"), s.param("K")} : std::vector<int64_t>{s.param("K"), s.param("N")};
}
std::vector<int64_t> c_shape(const KernelSpec& s) { return {s.param("M"), s.param("N")}; }
const TensorDecl kSignature[] = {
    {"A", Role::input, DTypeRule::in, DType::f32, "[M, K] ([K, M] with trans_a)", a_shape},
    {"B", Role::input, DTypeRule::in, DType::f32, "[K, N] ([N, K] with trans_b)", b_shape},
    {"C", Role::output, DTypeRule::out, DType::f32, "[M, N]", c_shape},
};
}  // namespace

std::span<const ParamInfo> GemmOp::params() const { return kParams; }
std::span<const DType> GemmOp::dtypes() const { return kDTypes; }
std::span<const TensorDecl> GemmOp::signature() const { return kSignature; }
namespace {
bool flag(const KernelConfig& c, const char* key) {
  auto it = c.find(key);
  return it != c.end() && it->second != 0;
}
}  // namespace

std::string_view GemmOp::device_template(const KernelConfig& c) const {
  // The Hopper kernels share their WGMMA pieces (gemm_sm90_common.kernel, on the library's
  // WGMMA), placed before their own text.
  static const std::string tma = std::string(embedded_file("templates/gemm/gemm_sm90_common.kernel")) + "\n" +
                                 std::string(embedded_file("templates/gemm/gemm_sm90_tma.kernel"));
  static const std::string cp_async = std::string(embedded_file("templates/gemm/gemm_sm90_common.kernel")) + "\n" +
                                      std::string(embedded_file("templates/gemm/gemm_sm90.kernel"));
  // The AMD matrix-core kernel shares the portable kernel's tile, tail and epilogue pieces.
  static const std::string mfma = std::string(embedded_file("templates/gemm/gemm_common.kernel")) + "\n" +
                                  std::string(embedded_file("templates/gemm/gemm_mfma.kernel"));
  // The portable kernel uses the shared tile, tail and epilogue pieces (gemm_common.kernel).
  static const std::string portable = std::string(embedded_file("templates/gemm/gemm_common.kernel")) + "\n" +
                                      std::string(embedded_file("templates/gemm/gemm.kernel"));
  if (flag(c, "MFMA")) return mfma;
  if (flag(c, "TMA")) return tma;
  if (flag(c, "WGMMA")) return cp_async;
  return portable;
}

namespace {
// The WGMMA path: Hopper tensor cores (sm_90a) for 16-bit inputs.
bool use_wgmma(const KernelSpec& spec, const TargetInfo& target) {
  return target.vendor == Vendor::nvidia && target.cpu == "sm_90a" &&
         (spec.dtype == DType::bf16 || spec.dtype == DType::f16);
}
// TMA needs 16-byte global strides: leading dimensions of A and B, and N (C's), that are
// multiples of 8 elements.
bool tma_strides(const KernelSpec& spec) {
  const int64_t lda = spec.param("trans_a") ? spec.param("M") : spec.param("K");
  const int64_t ldb = spec.param("trans_b") ? spec.param("K") : spec.param("N");
  return lda % 8 == 0 && ldb % 8 == 0 && spec.param("N") % 8 == 0;
}
// Dynamic shared memory of the WGMMA kernels: the stages, 1 KiB to align them to 1024 bytes, and
// the TMA kernel's mbarriers.
int64_t wgmma_shared_bytes(const KernelConfig& c) {
  const int64_t stages = c.at("STAGES") * (c.at("BM") + c.at("BN")) * c.at("BK") * 2 + 1024;
  // The TMA kernel adds the epilogue's staging buffers (lib/epilogue_sm90) and its mbarriers.
  return flag(c, "TMA") ? stages + epilogue_sm90_bytes(c.at("BM")) + 256 : stages;
}
}  // namespace

Result<void> GemmOp::validate_rules(const KernelSpec& spec, const TargetInfo&) const {
  const int64_t M = spec.param("M");
  if (ceil_div(M, 64) > kMaxGridY)
    return make_error(Errc::invalid_argument,
                      fmt::format("gemm: M = {} needs more than {} row blocks; split M into GEMMs "
                                  "of at most {} rows",
                                  M, kMaxGridY, kMaxGridY * 64));
  return ok();
}

KernelConfig GemmOp::choose_config(const KernelSpec& spec, const TargetInfo& target) const {
  const int64_t M = spec.param("M"), N = spec.param("N");
  if (use_wgmma(spec, target)) {
    // 128 x 256 tiles (two warpgroups of m64n256) when they still fill every SM, else 128 x 128.
    // Stages: 4 x 48 KiB or 6 x 32 KiB, 193 KiB of the 227 KiB a block may opt into.
    // TMA (gemm_sm90_tma.kernel: a producer warpgroup, persistent) where the strides allow it,
    // else the cp.async kernel (gemm_sm90.kernel).
    const bool wide = ceil_div(M, 128) * ceil_div(N, 256) >= target.compute_units;
    const bool tma = tma_strides(spec);
    KernelConfig c = {{"WGMMA", 1}, {"BM", 128}, {"BN", wide ? 256 : 128}, {"BK", 64},
                    {"STAGES", wide ? 4 : 6}, {"THREADS", tma ? 384 : 256}};
    if (tma) c["TMA"] = 1;
    return c;
  }
  // AMD matrix cores (gemm_mfma.kernel) for 16-bit inputs on gfx942 and gfx950.
  if (mfma_applies(spec, target)) return mfma_choose_config(spec, target);
  // Large tiles (128x128, an 8x8 register tile per thread) reuse each staged element 128 times;
  // use them when they still give every compute unit a block, else 64x64 with 4x4 per thread.
  const int64_t big_tiles = ceil_div(M, 128) * ceil_div(N, 128);
  const bool big = big_tiles >= target.compute_units && ceil_div(M, 128) <= kMaxGridY;
  const int64_t bm = big ? 128 : 64, bn = bm, tm = big ? 8 : 4, tn = tm;
  return {{"BM", bm}, {"BN", bn}, {"BK", 16}, {"TM", tm}, {"TN", tn},
          {"THREADS", (bm / tm) * (bn / tn)}};
}

std::vector<KernelConfig> GemmOp::tuning_candidates(const KernelSpec& spec, const TargetInfo& target) const {
  const KernelConfig heuristic = choose_config(spec, target);
  if (flag(heuristic, "MFMA")) return mfma_candidates(spec, target);
  if (!flag(heuristic, "TMA")) return {heuristic};
  KernelConfig other = heuristic;
  const bool wide = heuristic.at("BN") == 256;
  other["BN"] = wide ? 128 : 256;
  other["STAGES"] = wide ? 6 : 4;  // the same 192 KiB of stages either way
  std::vector<KernelConfig> out;
  for (const KernelConfig& tile : {heuristic, other})
    for (int64_t group : {8, 16}) {
      KernelConfig c = tile;
      if (group != 8) c["GROUP_M"] = group;  // 8 is the default: the heuristic leaves it implicit
      out.push_back(std::move(c));
    }
  return out;
}

std::string GemmOp::specialize(const KernelSpec& spec, const KernelConfig& c) const {
  const bool wgmma = flag(c, "WGMMA");
  std::string out = fmt::format("constexpr long long M = {}, N = {}, K = {};\n"
                                "constexpr bool TRANS_A = {}, TRANS_B = {}",
                                spec.param("M"), spec.param("N"), spec.param("K"),
                                spec.param("trans_a") ? "true" : "false", spec.param("trans_b") ? "true" : "false");
  if (flag(c, "MFMA")) {
    out += fmt::format(", IN_BF16 = {};\n"
                       "constexpr int BM = {}, BN = {}, BK = {}, WAVES_M = {}, WAVES_N = {}, THREADS = {}, MFMA_K = {};\n",
                       spec.dtype == DType::bf16 ? "true" : "false", c.at("BM"), c.at("BN"), c.at("BK"),
                       c.at("WAVES_M"), c.at("WAVES_N"), c.at("THREADS"), c.at("MFMA_K"));
  } else if (wgmma) {
    // GROUP_M: row tiles per group of the tile order (8 unless a tuned configuration says).
    out += fmt::format(", IN_BF16 = {};\n"
                       "constexpr int BM = {}, BN = {}, BK = {}, STAGES = {}, THREADS = {}, GROUP_M = {};\n",
                       spec.dtype == DType::bf16 ? "true" : "false", c.at("BM"), c.at("BN"), c.at("BK"),
                       c.at("STAGES"), c.at("THREADS"), c.count("GROUP_M") ? c.at("GROUP_M") : 8);
  } else {
    out += fmt::format(";\nconstexpr int BM = {}, BN = {}, BK = {}, TM = {}, TN = {}, THREADS = {};\n", c.at("BM"),
                       c.at("BN"), c.at("BK"), c.at("TM"), c.at("TN"), c.at("THREADS"));
  }
  out += fmt::format("typedef {} in_t;\ntypedef {} out_t;\n", device_type_name(spec.dtype),
                     device_type_name(spec.out_dtype));
  return out;
}

LaunchGeometry GemmOp::geometry(const KernelSpec& spec, const KernelConfig& c) const {
  LaunchGeometry g;
  if (flag(c, "TMA")) {
    // Persistent: one block per tile at most; the launch caps it at one block per SM.
    const int64_t tiles = ceil_div(spec.param("M"), c.at("BM")) * ceil_div(spec.param("N"), c.at("BN"));
    g.grid.x = static_cast<uint32_t>(std::min<int64_t>(tiles, INT32_MAX));
    g.block.x = static_cast<uint32_t>(c.at("THREADS"));
    g.dynamic_shared_bytes = static_cast<uint32_t>(wgmma_shared_bytes(c));
    g.persistent = true;
    return g;
  }
  // The LDS-tiled and MFMA kernels: one block per BM x BN tile (their LDS is static).
  g.grid.x = static_cast<uint32_t>(ceil_div(spec.param("N"), c.at("BN")));
  g.grid.y = static_cast<uint32_t>(ceil_div(spec.param("M"), c.at("BM")));
  g.block.x = static_cast<uint32_t>(c.at("THREADS"));
  if (flag(c, "WGMMA")) g.dynamic_shared_bytes = static_cast<uint32_t>(wgmma_shared_bytes(c));
  return g;
}

uint32_t GemmOp::dynamic_shared_bytes(const KernelSpec&, const KernelConfig& c) const {
  return flag(c, "WGMMA") ? static_cast<uint32_t>(wgmma_shared_bytes(c)) : 0;
}

std::vector<KernelConfig> GemmOp::variants(const KernelSpec& spec, const TargetInfo& target) const {
  KernelConfig first = choose_config(spec, target);
  if (!flag(first, "TMA")) return {first};
  // The cp.async kernel serves what TMA cannot: bases that are not 16-byte aligned.
  KernelConfig fallback = first;
  fallback.erase("TMA");
  fallback.erase("GROUP_M");
  fallback["THREADS"] = 256;
  return {first, fallback};
}

std::vector<uint32_t> GemmOp::base_alignment(const KernelSpec& spec, const KernelConfig& config) const {
  // TMA descriptors need 16-byte aligned bases (cuTensorMapEncodeTiled); cp.async needs none.
  return std::vector<uint32_t>(tensors(spec).size(), flag(config, "TMA") ? 16 : 1);
}

Plan GemmOp::plan(const KernelSpec& call, const KernelConfig& c) const {
  Plan p;
  Launch l;
  l.kernel = "kiln_gemm";
  l.geometry = geometry(call, c);
  const std::vector<TensorMapInfo> maps = tensor_maps(call, c);
  for (uint32_t i = 0; i < 3; ++i) l.args.push_back(maps.empty() ? KernelArg::tensor(i) : KernelArg::tensor_map_of(maps[i]));
  p.launches.push_back(std::move(l));
  return p;
}

void GemmOp::init_inputs(const KernelSpec& spec, std::span<const TensorInfo> inputs,
                         std::vector<std::vector<float>>& values, std::mt19937_64& rng) const {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  values.resize(inputs.size());
  const double b_scale = 1.0 / std::sqrt(double(spec.param("K")));
  for (size_t i = 0; i < inputs.size(); ++i) {
    const double scale = i == 1 ? b_scale : 1.0;
    values[i].resize(static_cast<size_t>(inputs[i].elements()));
    for (float& v : values[i]) {
      do v = round_to_dtype(static_cast<float>(dist(rng) * scale), inputs[i].dtype);
      while (v == 0.0f);
    }
  }
}

std::string GemmOp::short_form(const KernelSpec& spec) const {
  return fmt::format("{}x{}x{} {}{}", spec.param("M"), spec.param("N"), spec.param("K"), spec.param("trans_a") ? 'T' : 'N',
                     spec.param("trans_b") ? 'T' : 'N');
}

std::vector<TestSpec> GemmOp::test_specs(const TargetInfo& /*target*/) const {
  std::vector<TestSpec> out;
  auto add = [&](int64_t M, int64_t N, int64_t K, int ta, int tb, DType in, DType o, std::string_view why) {
    out.push_back({{"gemm", in, o, {{"M", M}, {"N", N}, {"K", K}, {"trans_a", ta}, {"trans_b", tb}}}, why});
  };
  for (auto [ta, tb] : {std::pair{0, 1}, std::pair{0, 0}, std::pair{1, 0}}) {
    add(64, 64, 64, ta, tb, DType::bf16, DType::bf16, "one tile");
    add(129, 72, 40, ta, tb, DType::bf16, DType::f32, "tails in M and K");
    add(7, 7, 7, ta, tb, DType::f16, DType::f16, "7 x 7 x 7: unaligned rows");
    add(1, 64, 129, ta, tb, DType::bf16, DType::bf16, "M = 1");
    add(65, 130, 24, ta, tb, DType::f32, DType::f32, "fp32");
  }
  add(256, 512, 128, 0, 1, DType::bf16, DType::bf16, "several tiles");
  add(8, 8, 8, 0, 1, DType::f16, DType::bf16, "boxes larger than the matrix");
  return out;
}

std::vector<TensorMapInfo> GemmOp::tensor_maps(const KernelSpec& spec, const KernelConfig& c) const {
  if (!flag(c, "TMA")) return {};
  const uint64_t M = spec.param("M"), N = spec.param("N"), K = spec.param("K");
  const uint32_t bm = static_cast<uint32_t>(c.at("BM")), bn = static_cast<uint32_t>(c.at("BN"));
  // K-major operands load one box of 64 K x the tile's rows; MN-major ones 64 x 64 boxes, one per
  // 64 M (or N) of the tile (the 128-byte swizzle spans 64 contiguous elements).
  const TensorMapInfo a = spec.param("trans_a") ? TensorMapInfo{0, M, K, 64, 64} : TensorMapInfo{0, K, M, 64, bm};
  const TensorMapInfo b = spec.param("trans_b") ? TensorMapInfo{1, K, N, 64, bn} : TensorMapInfo{1, N, K, 64, 64};
  // C: 64-row boxes of one 128-byte line (64 bf16/fp16 or 32 fp32 columns).
  const TensorMapInfo out{2, N, M, static_cast<uint32_t>(128 / dtype_size(spec.out_dtype)), 64};
  return {a, b, out};
}

void GemmOp::reference(const KernelSpec& spec, const Scalars&, std::span<const std::vector<float>> inputs,
                       std::span<const int64_t> rows, std::vector<RefOutput>& outputs) const {
  outputs.assign(1, {});
  outputs[0].rows.assign(rows.begin(), rows.end());
  std::vector<double>& out = outputs[0].values;
  const int64_t M = spec.param("M"), N = spec.param("N"), K = spec.param("K");
  const bool ta = spec.param("trans_a") != 0, tb = spec.param("trans_b") != 0;
  const std::vector<float>& A = inputs[0];
  const std::vector<float>& B = inputs[1];
  const int64_t count = rows.empty() ? M : static_cast<int64_t>(rows.size());
  out.assign(static_cast<size_t>(count * N), 0.0);
  std::vector<double> a(static_cast<size_t>(K));
  for (int64_t r = 0; r < count; ++r) {
    const int64_t m = rows.empty() ? r : rows[r];
    for (int64_t k = 0; k < K; ++k) a[k] = ta ? A[k * M + m] : A[m * K + k];
    double* c = &out[static_cast<size_t>(r * N)];
    if (tb) {
      for (int64_t n = 0; n < N; ++n) {
        const float* b = &B[static_cast<size_t>(n * K)];
        double s = 0.0;
        for (int64_t k = 0; k < K; ++k) s += a[k] * b[k];
        c[n] = s;
      }
    } else {
      for (int64_t k = 0; k < K; ++k) {
        const float* b = &B[static_cast<size_t>(k * N)];
        for (int64_t n = 0; n < N; ++n) c[n] += a[k] * b[n];
      }
    }
  }
}

std::vector<ModelLine> GemmOp::throughput_model(const KernelSpec& spec, const KernelConfig& config,
                                                const TargetInfo& target, int registers_per_lane) const {
  if (!config.count("MFMA") || !config.at("MFMA")) return {};
  std::vector<ModelLine> out;
  const MfmaModel m = mfma_model(spec, config, target, registers_per_lane);
  out.push_back({"model", fmt::format("modelled, not measured: {:.4g} TFLOP/s on {} ({:.0f} peak; {}-bound; {} tiles in {} "
                                      "rounds of {} per CU; per k-tile {:.0f} MFMA / {:.0f} LDS / {:.0f} L2 cycles; "
                                      "{} MFMA per wave per k-tile); see docs/amd-gemm-model.md",
                                      m.tflops, m.device, m.peak_tflops, m.bound, m.tiles, m.rounds, m.blocks_per_cu,
                                      m.mfma_cycles, m.lds_cycles, m.global_cycles, m.mfma_per_k_tile)});
  std::string all;
  for (const KernelConfig& c : mfma_configs(target)) {
    const MfmaModel o = mfma_model(spec, c, target);  // registers estimated
    all += fmt::format("{}{}x{}x{} {} waves {:.4g}", all.empty() ? "" : ", ", c.at("BM"), c.at("BN"), c.at("BK"),
                       c.at("THREADS") / 64, o.tflops);
  }
  out.push_back({"model, all", "modelled, not measured, TFLOP/s: " + all});
  return out;
}

}  // namespace kiln
