#include "templates/gemm_fp8/gemm_fp8.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "support/embedded.h"
#include "templates/lib/epilogue_sm90.h"
#include "templates/lib/fp8_sm90.h"

namespace kiln {
namespace {
constexpr int64_t kMaxDim = int64_t{1} << 24;
constexpr int64_t kMaxGridY = kMaxGridYZ;  // grid.y (row blocks), plan.h
constexpr int64_t kBlock = 128;       // K (and B's N) extent of a blockwise scale
constexpr std::string_view kFormats[] = {"e4m3", "e5m2"};

const ParamInfo kParams[] = {
    {"M", "rows of A and C (tokens in forward and dgrad)", true, false, 1, kMaxDim},
    {"N", "rows of B, columns of C", true, false, 1, kMaxDim},
    {"K", "reduction dimension (contiguous in A and B)", true, false, 1, kMaxDim},
    {"granularity",
     "what one scale covers: tensorwise, rowwise (sa [M], sb [N]), blockwise (A 1x128, B 128x128), block1x128 "
     "(both 1x128: wgrad), all fp32; or mx (both 1x32, e8m0: OCP MXFP8, gfx950)",
     true, false, 0, 4, fp8_gemm_scaling_names()},
    {"b_format", "B's fp8 format in dtype's encoding (default e4m3; e5m2 for a gradient operand)", true, false, 0, 1,
     kFormats, 0},
    {"accumulate", "C += the product: C_in is read and C written over it (fp32 C only; default 0)", true, true, 0, 1,
     {}, 0},
};
const DType kDTypes[] = {DType::e4m3, DType::e5m2, DType::e4m3fnuz, DType::e5m2fnuz};

bool accumulate(const KernelSpec& s) { return s.param("accumulate") != 0; }
bool mx(const KernelSpec& s) { return s.param("granularity") == kGemmMx; }
DType scale_dtype(const KernelSpec& s) { return mx(s) ? DType::e8m0 : DType::f32; }
std::vector<int64_t> a_shape(const KernelSpec& s) { return {s.param("M"), s.param("K")}; }
std::vector<int64_t> b_shape(const KernelSpec& s) { return {s.param("N"), s.param("K")}; }
std::vector<int64_t> c_shape(const KernelSpec& s) { return {s.param("M"), s.param("N")}; }
std::vector<int64_t> sa_shape(const KernelSpec& s) {
  return fp8_scale_shape(fp8_gemm_operand_granularity(s.param("granularity"), false), s.param("M"), s.param("K"));
}
std::vector<int64_t> sb_shape(const KernelSpec& s) {
  return fp8_scale_shape(fp8_gemm_operand_granularity(s.param("granularity"), true), s.param("N"), s.param("K"));
}
const TensorDecl kSignature[] = {
    {"A", Role::input, DTypeRule::in, DType::f32, "[M, K]", a_shape, nullptr, "fp8, K contiguous"},
    {"B", Role::input, DTypeRule::derived, DType::f32, "[N, K]", b_shape, nullptr, "fp8, K contiguous", {}, nullptr,
     gemm_fp8_b_dtype, "b_format in dtype's encoding"},
    {"sa", Role::input, DTypeRule::derived, DType::f32,
     "[1] | [M] | [M, ceil(K/128)] | [M, ceil(K/32)] (tensorwise | rowwise | blockwise, block1x128 | mx)", sa_shape,
     nullptr, "A's scales: A * sa is the operand", {}, nullptr, scale_dtype, "fp32; e8m0 with granularity mx"},
    {"sb", Role::input, DTypeRule::derived, DType::f32,
     "[1] | [N] | [ceil(N/128), ceil(K/128)] | [N, ceil(K/128)] | [N, ceil(K/32)] (tensorwise | rowwise | blockwise | "
     "block1x128 | mx)",
     sb_shape, nullptr, "B's scales: B * sb is the operand", {}, nullptr, scale_dtype, "fp32; e8m0 with granularity mx"},
    {"C_in", Role::input, DTypeRule::out, DType::f32, "[M, N]", c_shape, accumulate,
     "the fp32 C accumulated into (accumulate=1); C is written over it"},
    {"C", Role::output, DTypeRule::out, DType::f32, "[M, N]", c_shape, nullptr, "(C_in +) (A*sa) @ (B*sb)^T", "C_in"},
};

bool flag(const KernelConfig& c, const char* key) {
  auto it = c.find(key);
  return it != c.end() && it->second != 0;
}

// The TMA kernel's C store: through lib/epilogue_sm90 (converted in shared memory, one TMA store
// per 64 x 128-byte chunk, drained under the next tile's main loop) where C's rows are 16-byte
// multiples (TMA's global strides) and C is only written; else from registers, bounds-checked
// (accumulate reads C_in).
bool sm90_tma_store(const KernelSpec& spec) {
  return !accumulate(spec) && spec.param("N") * static_cast<int64_t>(dtype_size(spec.out_dtype)) % 16 == 0;
}

// Dynamic shared memory of the Hopper kernels: 1024 bytes of alignment slack, the stages (A and B
// slices, and the TMA kernel's two mbarriers each), with TMA and block scales the scale ring and,
// with EPI_TMA, the epilogue's staging buffers.
int64_t sm90_stage_bytes(int64_t bm, int64_t bn, int64_t bk, bool tma) { return (bm + bn) * bk + (tma ? 16 : 0); }
// The TMA kernel's scale ring with block scales (lib/fp8_sm90.h): an entry per row of the tile
// and per column (block1x128) or block (blockwise) of B's.
int64_t sm90_scale_ring_bytes(const KernelSpec& spec, int64_t bm, int64_t bn, int64_t stages) {
  const int64_t gran = spec.param("granularity");
  if (gran < kGemmBlockwise) return 0;
  return scale_ring_bytes(ceil_div(spec.param("K"), 128), bm + (gran == kGemmBlock1x128 ? bn : 1), stages);
}
int64_t sm90_shared_bytes(const KernelSpec& spec, const KernelConfig& c) {
  const bool tma = flag(c, "TMA");
  const int64_t stages = c.at("STAGES");
  return 1024 + stages * sm90_stage_bytes(c.at("BM"), c.at("BN"), c.at("BK"), tma) +
         (tma ? sm90_scale_ring_bytes(spec, c.at("BM"), c.at("BN"), stages) : 0) +
         (flag(c, "EPI_TMA") ? epilogue_sm90_bytes(c.at("BM")) : 0);
}

// The TMA kernel's configuration: BM = 128 (two consumer warpgroups) or 192 (three), 128 x 128-deep
// slices, as many stages as fit Hopper's 227 KiB next to the epilogue's staging (at most 6).
KernelConfig sm90_tma_config(const KernelSpec& spec, bool dbuf, int64_t bm = 128, bool pingpong = false,
                             int64_t scale_warps = 3) {
  const bool epi = sm90_tma_store(spec);
  const int64_t room = kSm90MaxDynamicShared - 1024 - (epi ? epilogue_sm90_bytes(bm) : 0);
  int64_t stages = 6;
  while (stages > 2 && stages * sm90_stage_bytes(bm, 128, 128, true) + sm90_scale_ring_bytes(spec, bm, 128, stages) > room)
    --stages;
  return {{"WGMMA", 1},   {"TMA", 1},   {"DBUF", dbuf ? 1 : 0},      {"EPI_TMA", epi ? 1 : 0},
          {"BM", bm},     {"BN", 128},  {"BK", 128},                  {"STAGES", stages},
          {"THREADS", 128 * (1 + bm / 64)}, {"PINGPONG", pingpong ? 1 : 0},
          {"SCALE_WARPS", spec.param("granularity") >= kGemmBlockwise ? scale_warps : 0}};
}
// The Hopper kernels: K a multiple of 16 (TMA's 16-byte row strides), 32-bit tile indices.
bool sm90_tma(const KernelSpec& spec, const TargetInfo& target) {
  return target.vendor == Vendor::nvidia && target.cpu == "sm_90a" && spec.param("K") % 16 == 0 &&
         ceil_div(spec.param("M"), 128) * ceil_div(spec.param("N"), 128) < INT32_MAX;
}
}  // namespace

DType gemm_fp8_b_dtype(const KernelSpec& s) {
  const DType format = s.param("b_format") ? DType::e5m2 : DType::e4m3;
  const bool fnuz = s.dtype == DType::e4m3fnuz || s.dtype == DType::e5m2fnuz;
  return fp8_in_encoding(format, fnuz ? Fp8Encoding::fnuz : Fp8Encoding::ocp);
}

std::span<const ParamInfo> GemmFp8Op::params() const { return kParams; }
std::span<const DType> GemmFp8Op::dtypes() const { return kDTypes; }
std::span<const TensorDecl> GemmFp8Op::signature() const { return kSignature; }

Result<void> GemmFp8Op::validate_rules(const KernelSpec& spec, const TargetInfo& target) const {
  const KernelSpec s = with_defaults(spec);
  if (mx(s) && !(target.vendor == Vendor::amd && target.cpu == "gfx950"))
    return make_error(
        Errc::unsupported,
        fmt::format("gemm_fp8: granularity mx (OCP MXFP8, e8m0 scales per 32 along K) needs gfx950's scaled MFMA "
                    "(v_mfma_scale_f32_32x32x64_f8f6f4), which {} does not have: use blockwise (1x128 and 128x128 fp32 "
                    "scales) or block1x128 on {}, or compile for gfx950",
                    target.cpu, target.cpu));
  if (accumulate(s) && s.out_dtype != DType::f32)
    return make_error(Errc::invalid_argument,
                      fmt::format("gemm_fp8: accumulate=1 adds into an fp32 C (wgrad accumulation), but out_dtype is "
                                  "{}: set out_dtype fp32, or accumulate=0",
                                  dtype_name(s.out_dtype)));
  if (ceil_div(s.param("M"), 64) > kMaxGridY)
    return make_error(Errc::invalid_argument,
                      fmt::format("gemm_fp8: M = {} needs more than {} row blocks; split M into GEMMs of at most {} rows",
                                  s.param("M"), kMaxGridY, kMaxGridY * 64));
  return ok();
}

std::vector<KernelConfig> GemmFp8Op::variants(const KernelSpec& spec, const TargetInfo& target) const {
  const int64_t M = spec.param("M"), N = spec.param("N");
  // 128 x 128 tiles where they still give every compute unit a block, else 64 x 64.
  const bool big = ceil_div(M, 128) * ceil_div(N, 128) >= target.compute_units;
  const int64_t bm = big ? 128 : 64, t = big ? 8 : 4;
  // The portable kernel: a TM x TN = t x t register tile per thread.
  const KernelConfig portable = {{"BM", bm}, {"BN", bm}, {"BK", 16}, {"TM", t}, {"TN", t}, {"THREADS", (bm / t) * (bm / t)}};
  // sm_90a, K a multiple of 16 (16-byte rows, as TMA's strides need): the TMA warp-specialized
  // persistent kernel (gemm_fp8_sm90_tma.kernel), 128 x 128 tiles in a ring of 128-deep slices
  // (6 stages, or 5 next to the TMA-store epilogue's 32 KiB) or 192 x 128 (5, or 4); the portable
  // kernel serves unaligned views. Tuning candidates (tuning_candidates): PINGPONG flipped, the
  // block scales copied by one producer warp instead of three (SCALE_WARPS 1), the other consumer
  // count, DBUF (two partial accumulators, the next slice's WGMMAs issued before a
  // promotion) and the cp.async WGMMA kernel (gemm_fp8_sm90.kernel). On the H100 (2026-11-26,
  // bench_gemm_fp8 --only square --tune) DBUF was 2-6% slower at 8192^3 and the cp.async kernel
  // 20-45% slower, so neither is the default.
  // Three consumer warpgroups (192 x 128 tiles) where those still fill every SM: the H100's tuner
  // found them 11% / 6% faster than two for tensorwise / rowwise (2026-11-26, 8192^3), and, once
  // three producer warps copy the block scales (SCALE_WARPS 3), 8% faster for blockwise at 8192^3
  // and 7% for block1x128 at qkv's wgrad (2026-11-27; with one copying warp they had been 40%
  // slower).
  // Their last wave weighs too: with R(bm) = ceil(tiles / SMs) rounds of bm-row tiles, three are
  // taken where R(192) * 192 < 1.1 * R(128) * 128 (a 192-row tile's rows cost about 1/1.1 of the
  // 128-row tiles' on the H100). Measured with --tune (2026-11-27, h100-2026-11-27-session14,
  // tune-consumers/): qwen2.5-7b's attn_out wgrad (3584 x 3584 x 8192: 5 rounds of 192 against 6
  // of 128) ran 12-14% faster with two consumers, llama3.1-8b's (4096^2 x 8192) 2-4%; qwen2.5-7b's
  // attn_out forward (8192 x 3584 x 3584: 10 rounds against 14, a tie without the factor) 2-3%
  // faster with three.
  if (sm90_tma(spec, target)) {
    const int64_t sms = target.compute_units, tiles_n = ceil_div(N, 128);
    const int64_t rounds_192 = ceil_div(ceil_div(M, 192) * tiles_n, sms);
    const int64_t rounds_128 = ceil_div(ceil_div(M, 128) * tiles_n, sms);
    const bool three =
        ceil_div(M, 192) * tiles_n >= sms && rounds_192 * 192 * 10 < rounds_128 * 128 * 11;
    // Ping-pong consumers (PINGPONG) for tensorwise: on the H100 (2026-11-27, --tune) 3-4% faster
    // at 8192^3 and lm_head's dgrad, 1% at qkv's wgrad; for rowwise a tie (-1% to 0%), for
    // blockwise 2% slower, for block1x128 a tie, so those keep it as the tuning candidate only.
    const bool pingpong = spec.param("granularity") == kGemmTensorwise;
    return {sm90_tma_config(spec, false, three ? 192 : 128, pingpong), portable};
  }
  if (target.vendor != Vendor::amd) return {portable};
  // gfx942 and gfx950: the MFMA kernel on 2 x 2 waves with the 32x32x16 fp8 MFMAs, which both
  // have, 64-k tiles (two per 128-k scale block; 2 stages of 128 x 128 tiles are 40 KiB of LDS);
  // the portable kernel serves A or B views that are not 16-byte aligned (base_alignment).
  // mx (gfx950 only, check()): the scaled 32x32x64 MFMA, MFMA_K 64.
  // gfx950's unscaled 32x32x64 f8f6f4 (MFMA_K 64, twice the modelled peak) is a tuning candidate,
  // not the choice, because CI could not check it: the shared CDNA emulator decodes that MFMA as
  // the 16-byte scaled form whenever an instruction starts 8 bytes before it, and 7 of the 12 test
  // specs then fail on gfx950 (docs/emulator-repro/f8f6f4-decode/). With the emulator's decoder
  // fixed, all 12 pass; the choice is then `mx(spec) || target.name == "gfx950" ? 64 : 16` here
  // (docs/gemm-fp8.md, "gfx950's 32x32x64 MFMA").
  const KernelConfig mfma = {{"MFMA", 1},      {"MFMA_K", mx(spec) ? 64 : 16},
                           {"BM", bm},       {"BN", bm},
                           {"BK", 64},       {"WAVES_M", 2},
                           {"WAVES_N", 2},   {"THREADS", 256}};
  return {mfma, portable};
}

std::vector<uint32_t> GemmFp8Op::base_alignment(const KernelSpec& spec, const KernelConfig& c) const {
  std::vector<uint32_t> out(tensors(spec).size(), 1);
  // The MFMA kernel's 16-byte loads of A and B rows (when K % 16 == 0 makes the rows aligned).
  if (flag(c, "MFMA") && spec.param("K") % 16 == 0) out[0] = out[1] = 16;
  if (flag(c, "WGMMA")) out[0] = out[1] = 16;  // TMA's and cp.async's 16-byte aligned bases
  if (flag(c, "EPI_TMA")) out.back() = 16;     // C's tensor map
  return out;
}

uint32_t GemmFp8Op::dynamic_shared_bytes(const KernelSpec& spec, const KernelConfig& c) const {
  return flag(c, "WGMMA") ? static_cast<uint32_t>(sm90_shared_bytes(with_defaults(spec), c)) : 0;
}

std::vector<KernelConfig> GemmFp8Op::tuning_candidates(const KernelSpec& spec, const TargetInfo& target) const {
  if (!sm90_tma(spec, target)) {
    KernelConfig first = choose_config(spec, target);
    // gfx950, non-mx: the 32x32x64 f8f6f4 form as well (one MFMA per 64 k instead of four); see
    // variants() for why it is not the choice.
    if (target.name != "gfx950" || !flag(first, "MFMA") || first.at("MFMA_K") != 16) return {first};
    KernelConfig k64 = first;
    k64["MFMA_K"] = 64;
    return {first, k64};
  }
  const KernelConfig first = choose_config(spec, target);
  KernelConfig flipped = first;  // the default with ping-pong consumers flipped
  flipped["PINGPONG"] = flag(first, "PINGPONG") ? 0 : 1;
  std::vector<KernelConfig> out = {first, flipped};
  if (first.at("SCALE_WARPS") == 3) {  // the block scales copied by one producer warp, as before
    KernelConfig one = first;
    one["SCALE_WARPS"] = 1;
    out.push_back(one);
  }
  out.push_back(first.at("BM") == 192 ? sm90_tma_config(spec, false) : sm90_tma_config(spec, false, 192));
  out.push_back(sm90_tma_config(spec, true));
  out.push_back({{"WGMMA", 1}, {"BM", 128}, {"BN", 128}, {"BK", 128}, {"STAGES", 4}, {"THREADS", 256}});
  return out;
}

std::string_view GemmFp8Op::device_template(const KernelConfig& c) const {
  static const std::string portable = std::string(embedded_file("templates/gemm_fp8/gemm_fp8_common.kernel")) + "\n" +
                                      std::string(embedded_file("templates/gemm_fp8/gemm_fp8.kernel"));
  static const std::string mfma = std::string(embedded_file("templates/gemm_fp8/gemm_fp8_common.kernel")) + "\n" +
                                  std::string(embedded_file("templates/gemm_fp8/gemm_fp8_mfma.kernel"));
  static const std::string sm90 = std::string(embedded_file("templates/gemm_fp8/gemm_fp8_common.kernel")) + "\n" +
                                  std::string(embedded_file("templates/gemm_fp8/gemm_fp8_sm90.kernel"));
  static const std::string sm90_tma = std::string(embedded_file("templates/gemm_fp8/gemm_fp8_common.kernel")) + "\n" +
                                      std::string(embedded_file("templates/gemm_fp8/gemm_fp8_sm90_tma.kernel"));
  return flag(c, "TMA") ? sm90_tma : flag(c, "WGMMA") ? sm90 : flag(c, "MFMA") ? mfma : portable;
}

std::string GemmFp8Op::specialize(const KernelSpec& spec, const KernelConfig& c) const {
  const KernelSpec s = with_defaults(spec);
  std::string out = fmt::format(
      "constexpr long long M = {}, N = {}, K = {}, KB = {};\n"
      "constexpr int GRAN = {};  // 0 tensorwise, 1 rowwise, 2 blockwise, 3 block1x128, 4 mx\n"
      "constexpr bool ACCUMULATE = {};\n"
      "typedef {} a_t;\ntypedef {} b_t;\ntypedef {} out_t;\ntypedef {} scale_t;\n",
      s.param("M"), s.param("N"), s.param("K"), ceil_div(s.param("K"), kBlock), s.param("granularity"),
      accumulate(s) ? "true" : "false", device_type_name(s.dtype), device_type_name(gemm_fp8_b_dtype(s)),
      device_type_name(s.out_dtype), device_type_name(scale_dtype(s)));
  if (flag(c, "WGMMA")) {
    const bool a_e5m2 = s.dtype == DType::e5m2 || s.dtype == DType::e5m2fnuz;
    out += fmt::format("constexpr bool A_E5M2 = {}, B_E5M2 = {};\n"
                       "constexpr int BM = {}, BN = {}, BK = {}, STAGES = {}, THREADS = {};\n",
                       a_e5m2 ? "true" : "false", s.param("b_format") ? "true" : "false", c.at("BM"), c.at("BN"),
                       c.at("BK"), c.at("STAGES"), c.at("THREADS"));
    if (flag(c, "TMA"))
      out += fmt::format("constexpr bool DBUF = {}, PINGPONG = {};\nconstexpr int SCALE_WARPS = {};\n#define EPI_TMA {}\n",
                         flag(c, "DBUF") ? "true" : "false", flag(c, "PINGPONG") ? "true" : "false",
                         c.count("SCALE_WARPS") ? c.at("SCALE_WARPS") : 0, flag(c, "EPI_TMA") ? 1 : 0);
  } else if (flag(c, "MFMA")) {
    const bool a_bf8 = s.dtype == DType::e5m2 || s.dtype == DType::e5m2fnuz;
    out += fmt::format("constexpr bool A_BF8 = {}, B_BF8 = {};\n"
                       "constexpr int BM = {}, BN = {}, BK = {}, WAVES_M = {}, WAVES_N = {}, THREADS = {}, MFMA_K = {};\n",
                       a_bf8 ? "true" : "false", s.param("b_format") ? "true" : "false", c.at("BM"), c.at("BN"),
                       c.at("BK"), c.at("WAVES_M"), c.at("WAVES_N"), c.at("THREADS"), c.at("MFMA_K"));
  } else {
    out += fmt::format("constexpr int BM = {}, BN = {}, BK = {}, TM = {}, TN = {}, THREADS = {};\n", c.at("BM"),
                       c.at("BN"), c.at("BK"), c.at("TM"), c.at("TN"), c.at("THREADS"));
  }
  return out;
}

Plan GemmFp8Op::plan(const KernelSpec& call, const KernelConfig& c) const {
  Plan p;
  Launch l;
  l.kernel = "kiln_gemm_fp8";
  const int64_t M = call.param("M"), N = call.param("N"), K = call.param("K");
  // C is the output tensor (after C_in with accumulate: the same buffer, read and written).
  const uint32_t out = accumulate(with_defaults(call)) ? 5 : 4;
  if (flag(c, "TMA")) {
    // Persistent: one block per tile at most; the launch caps it at one block per SM. A and B as
    // TMA tensor maps (inner extent K bytes; boxes of one 128-byte line x the tile's rows).
    l.geometry.grid.x = static_cast<uint32_t>(std::min<int64_t>(ceil_div(M, c.at("BM")) * ceil_div(N, c.at("BN")),
                                                                INT32_MAX));
    l.geometry.persistent = true;
    const uint32_t bk = static_cast<uint32_t>(c.at("BK"));
    l.args = {KernelArg::tensor_map_of({0, static_cast<uint64_t>(K), static_cast<uint64_t>(M), bk,
                                        static_cast<uint32_t>(c.at("BM"))}),
              KernelArg::tensor_map_of({1, static_cast<uint64_t>(K), static_cast<uint64_t>(N), bk,
                                        static_cast<uint32_t>(c.at("BN"))}),
              KernelArg::tensor(2), KernelArg::tensor(3), KernelArg::tensor(out)};
    // EPI_TMA: C also as a tensor map, 64-row boxes of one 128-byte line (64 bf16/fp16 or 32 fp32).
    if (flag(c, "EPI_TMA"))
      l.args.push_back(KernelArg::tensor_map_of({out, static_cast<uint64_t>(N), static_cast<uint64_t>(M),
                                                 static_cast<uint32_t>(128 / dtype_size(call.out_dtype)), 64}));
  } else {
    l.geometry.grid.x = static_cast<uint32_t>(ceil_div(N, c.at("BN")));
    l.geometry.grid.y = static_cast<uint32_t>(ceil_div(M, c.at("BM")));
    l.args = {KernelArg::tensor(0), KernelArg::tensor(1), KernelArg::tensor(2), KernelArg::tensor(3),
              KernelArg::tensor(out)};
  }
  l.geometry.block.x = static_cast<uint32_t>(c.at("THREADS"));
  l.geometry.dynamic_shared_bytes = dynamic_shared_bytes(call, c);
  p.launches.push_back(std::move(l));
  return p;
}

void GemmFp8Op::init_inputs(const KernelSpec& spec, std::span<const TensorInfo> inputs,
                            std::vector<std::vector<float>>& values, std::mt19937_64& rng) const {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f), mant(0.5f, 1.0f);
  values.resize(inputs.size());
  const double k_scale = 1.0 / std::sqrt(double(spec.param("K")));
  for (size_t i = 0; i < inputs.size(); ++i) {
    const TensorInfo& t = inputs[i];
    std::vector<float>& v = values[i];
    v.resize(static_cast<size_t>(t.elements()));
    if (is_fp8(t.dtype)) {
      // Codes over the whole range of the format, as quantize_fp8 writes them; never zero.
      const float max = static_cast<float>(fp8_max(t.dtype));
      for (float& x : v) {
        do x = round_to_dtype(dist(rng) * max, t.dtype);
        while (x == 0.0f);
      }
    } else if (mx(spec) && (t.name == "sa" || t.name == "sb")) {
      // e8m0: 2^(X) with X = -emax + [-2, 2] per group (x / 2^X spans the format's range), B's
      // also 2^-round(log2(sqrt(K))), so that C stays O(1); neighbouring groups differ.
      const DType fmt = t.name == "sa" ? spec.dtype : gemm_fp8_b_dtype(spec);
      const int k_shift = t.name == "sb" ? static_cast<int>(std::lround(0.5 * std::log2(double(spec.param("K"))))) : 0;
      for (size_t g = 0; g < v.size(); ++g)
        v[g] = std::ldexp(1.0f, static_cast<int>(g % 5) - 2 - fp8_emax(fmt) - k_shift);
    } else if (t.name == "sa" || t.name == "sb") {
      // About amax / FP8_MAX with amax in [2^-2, 2^2], a different binade per group; B's scaled
      // by 1 / sqrt(K) so that C stays O(1).
      const float fp8max = static_cast<float>(fp8_max(t.name == "sa" ? spec.dtype : gemm_fp8_b_dtype(spec)));
      for (size_t g = 0; g < v.size(); ++g)
        v[g] = static_cast<float>(std::ldexp(mant(rng), static_cast<int>(g % 5) - 2) / fp8max *
                                  (t.name == "sb" ? k_scale : 1.0));
    } else {
      for (float& x : v) {
        do x = round_to_dtype(dist(rng), t.dtype);
        while (x == 0.0f);
      }
    }
  }
}

void GemmFp8Op::reference(const KernelSpec& spec, const Scalars&, std::span<const std::vector<float>> inputs,
                          std::span<const int64_t> rows, std::vector<RefOutput>& outputs) const {
  const KernelSpec s = with_defaults(spec);
  const int64_t M = s.param("M"), N = s.param("N"), K = s.param("K");
  const Fp8Granularity ga = fp8_gemm_operand_granularity(s.param("granularity"), false);
  const Fp8Granularity gb = fp8_gemm_operand_granularity(s.param("granularity"), true);
  const std::vector<float>& A = inputs[0];
  const std::vector<float>& B = inputs[1];
  const std::vector<float>& sa = inputs[2];
  const std::vector<float>& sb = inputs[3];
  // B dequantized once, row n of B * sb.
  std::vector<double> b(static_cast<size_t>(N * K));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k)
      b[static_cast<size_t>(n * K + k)] = double(B[static_cast<size_t>(n * K + k)]) *
                                          double(sb[static_cast<size_t>(fp8_scale_index(gb, K, n, k))]);
  outputs.assign(1, {});
  outputs[0].rows.assign(rows.begin(), rows.end());
  const int64_t count = rows.empty() ? M : static_cast<int64_t>(rows.size());
  std::vector<double>& out = outputs[0].values;
  out.assign(static_cast<size_t>(count * N), 0.0);
  std::vector<double> a(static_cast<size_t>(K));
  for (int64_t r = 0; r < count; ++r) {
    const int64_t m = rows.empty() ? r : rows[static_cast<size_t>(r)];
    for (int64_t k = 0; k < K; ++k)
      a[static_cast<size_t>(k)] = double(A[static_cast<size_t>(m * K + k)]) *
                                  double(sa[static_cast<size_t>(fp8_scale_index(ga, K, m, k))]);
    for (int64_t n = 0; n < N; ++n) {
      const double* bn = &b[static_cast<size_t>(n * K)];
      double acc = accumulate(s) ? double(inputs[4][static_cast<size_t>(m * N + n)]) : 0.0;
      for (int64_t k = 0; k < K; ++k) acc += a[static_cast<size_t>(k)] * bn[k];
      out[static_cast<size_t>(r * N + n)] = acc;
    }
  }
}

Gate GemmFp8Op::gate(const KernelSpec&, const TensorInfo&) const {
  Gate g;
  g.kind = Gate::Kind::snr;
  g.min_snr_db = 40;
  return g;
}

// The MFMA kernel's throughput model (modelled, not measured; docs/gemm-fp8.md). Datasheet figures
// (as docs/amd-gemm-model.md takes them): MI300X (gfx942) 304 CUs at 2.1 GHz, 2615 TFLOP/s dense
// fp8 = 1024 FLOPs per SIMD per cycle (v_mfma_f32_32x32x16_fp8_fp8: 32768 FLOPs in 32 cycles),
// 5.3 TB/s HBM; MI355X (gfx950) 256 CUs at 2.4 GHz, 5.0 PFLOP/s dense fp8 and MXFP8 = 2048 FLOPs per
// SIMD per cycle with v_mfma_(scale_)f32_32x32x64_f8f6f4, while the 32x32x16 fp8 forms keep
// gfx942's rate per cycle (1024), 8 TB/s. L2 to CU 64 bytes per cycle per CU, an assumption.
// Per block k-tile (BM x BN x BK): MFMA cycles = 2 BM BN BK / (4 SIMDs x FLOPs per SIMD-cycle);
// L2 cycles = the staged (BM + BN) BK bytes (mx: plus the lanes' scale bytes) / 64; one block per
// CU at a time (2 x 2 waves, one per SIMD), tiles in rounds of the CU count; blockwise and
// block1x128 add their promotion (16 FMAs per accumulator register per 128 k, VALU at 64 lanes per
// cycle per SIMD). The kernel's time is the larger of that and the HBM time of A, B, the scales
// and C; the latency between k-tiles is not modelled (an upper bound).
std::vector<ModelLine> GemmFp8Op::throughput_model(const KernelSpec& call, const KernelConfig& c, const TargetInfo& target,
                                                   int /*registers_per_lane*/) const {
  if (!flag(c, "MFMA") || target.vendor != Vendor::amd) return {};
  const KernelSpec s = with_defaults(call);
  const bool cdna4 = target.cpu == "gfx950";
  const char* device = cdna4 ? "MI355X" : "MI300X";
  const double cus = cdna4 ? 256 : 304, ghz = cdna4 ? 2.4 : 2.1, hbm_tb_s = cdna4 ? 8.0 : 5.3;
  const double flops_per_simd_cycle = c.at("MFMA_K") == 64 ? 2048 : 1024;
  const double peak = cus * 4 * flops_per_simd_cycle * ghz * 1e-3;  // TFLOP/s of the MFMA form used
  const double M = double(s.param("M")), N = double(s.param("N")), K = double(s.param("K"));
  const double bm = double(c.at("BM")), bn = double(c.at("BN")), bk = double(c.at("BK"));
  const double k_tiles = std::ceil(K / bk);
  const double tiles = std::ceil(M / bm) * std::ceil(N / bn), rounds = std::ceil(tiles / cus);
  const double mfma_cycles = 2 * bm * bn * bk / (4 * flops_per_simd_cycle);
  const int64_t g = s.param("granularity");
  const double scale_bytes = g == kGemmMx ? (bm + bn) * (bk / 32) : 0;
  const double l2_cycles = ((bm + bn) * bk + scale_bytes) / 64;
  const double promote_cycles = g == kGemmBlockwise || g == kGemmBlock1x128 ? bm * bn / 64 / 4 * (bk / 128) : 0;
  const double tile_cycles = k_tiles * std::max(mfma_cycles + promote_cycles, l2_cycles);
  const double compute_s = rounds * tile_cycles / (ghz * 1e9);
  const double scales = g == kGemmMx ? (M + N) * std::ceil(K / 32) : g == kGemmRowwise ? 4 * (M + N) : 4 * (M + N) * std::ceil(K / 128);
  const double hbm_s = (M * K + N * K + scales + M * N * double(dtype_size(s.out_dtype)) * (accumulate(s) ? 2 : 1)) /
                       (hbm_tb_s * 1e12);
  const double seconds = std::max(compute_s, hbm_s);
  const double tflops = 2 * M * N * K / seconds * 1e-12;
  const char* bound = hbm_s >= compute_s ? "HBM" : l2_cycles > mfma_cycles + promote_cycles ? "L2" : "MFMA";
  return {{"model",
           fmt::format("modelled, not measured: {:.4g} TFLOP/s on {} ({:.0f} peak of {}; {}-bound; {} tiles in {} "
                       "rounds; per k-tile {:.0f} MFMA{} / {:.0f} L2 cycles; an upper bound: latency not modelled); see "
                       "docs/gemm-fp8.md",
                       tflops, device, peak,
                       g == kGemmMx ? "v_mfma_scale_f32_32x32x64_f8f6f4"
                       : c.at("MFMA_K") == 64 ? "v_mfma_f32_32x32x64_f8f6f4"
                                              : "v_mfma_f32_32x32x16 fp8",
                       bound, tiles, rounds, mfma_cycles,
                       promote_cycles > 0 ? fmt::format(" + {:.0f} promotion", promote_cycles) : std::string(),
                       l2_cycles)}};
}

std::string GemmFp8Op::short_form(const KernelSpec& spec) const {
  const KernelSpec s = with_defaults(spec);
  return fmt::format("{}x{}x{} {} {}x{}{}", s.param("M"), s.param("N"), s.param("K"),
                     fp8_gemm_scaling_names()[static_cast<size_t>(s.param("granularity"))],
                     s.dtype == DType::e4m3 || s.dtype == DType::e4m3fnuz ? "e4m3" : "e5m2",
                     kFormats[static_cast<size_t>(s.param("b_format"))], accumulate(s) ? " accumulate" : "");
}

std::vector<TestSpec> GemmFp8Op::test_specs(const TargetInfo& target) const {
  const auto [e4, e5] = fp8_test_formats(target);
  std::vector<TestSpec> out;
  auto add = [&](int64_t M, int64_t N, int64_t K, int64_t g, DType a, int64_t bf, DType o, int64_t acc,
                 std::string_view why) {
    out.push_back({{"gemm_fp8", a, o, {{"M", M}, {"N", N}, {"K", K}, {"granularity", g}, {"b_format", bf},
                                       {"accumulate", acc}}},
                   why});
  };
  const DType bf16 = DType::bf16, f16 = DType::f16, f32 = DType::f32;
  add(64, 64, 128, kGemmTensorwise, e4, 0, bf16, 0, "tensorwise e4m3 x e4m3, one tile");
  add(129, 72, 200, kGemmRowwise, e4, 0, f32, 0, "rowwise, tails in M, N and K (K not a multiple of 128)");
  add(130, 136, 300, kGemmBlockwise, e4, 0, bf16, 0, "blockwise, two 128-row blocks of B, K tail");
  add(7, 9, 33, kGemmBlockwise, e5, 0, f16, 0, "blockwise e5m2 x e4m3 (dgrad), 7 x 9 x 33");
  add(65, 33, 129, kGemmRowwise, e4, 1, bf16, 0, "rowwise e4m3 x e5m2, K 129");
  add(1, 1, 1, kGemmTensorwise, e5, 0, f32, 0, "tensorwise e5m2 x e4m3, 1 x 1 x 1");
  add(64, 130, 256, kGemmBlockwise, e5, 0, f32, 1, "blockwise e5m2 x e4m3, accumulate into fp32 C (wgrad)");
  add(33, 17, 100, kGemmTensorwise, e5, 1, f32, 1, "tensorwise e5m2 x e5m2, accumulate");
  add(130, 72, 257, kGemmBlock1x128, e5, 0, f32, 1, "block1x128 e5m2 x e4m3 (wgrad), accumulate, K tail");
  add(256, 256, 512, kGemmBlockwise, e4, 0, bf16, 0, "blockwise, several tiles and k-blocks");
  add(100, 72, 384, kGemmRowwise, e4, 1, bf16, 0, "rowwise e4m3 x e5m2, K 384 (the WGMMA kernel on sm_90a)");
  add(72, 130, 256, kGemmBlock1x128, e5, 0, f32, 1, "block1x128 (wgrad), accumulate, K 256 (WGMMA on sm_90a)");
  add(100, 136, 256, kGemmRowwise, e4, 0, f32, 0, "rowwise into fp32 C, M and N tails (sm_90a: the TMA-store epilogue in fp32)");
  // mx (gfx950 only; check() refuses it elsewhere) has no test spec here: the CDNA emulator that CI
  // runs applies each output lane's own e8m0 bytes to the whole 64-k dot of the scaled MFMA (the
  // hardware scales each 32-k group by the lanes holding its A row and B column), so every mx
  // GEMM fails there at about -93 dB. docs/gemm-fp8.md gives the one-instruction reproducer, the
  // emulator patch, and the kiln run commands of the four mx cases, which pass with the patched
  // emulator (55.7-158 dB); test_gemm_fp8 checks mx's CPU reference and recipe.
  return out;
}

}  // namespace kiln
