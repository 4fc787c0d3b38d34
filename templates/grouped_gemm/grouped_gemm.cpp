#include "templates/grouped_gemm/grouped_gemm.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "support/embedded.h"
#include "templates/lib/epilogue_sm90.h"
#include "templates/lib/fp8_sm90.h"
#include "templates/lib/grouped_offsets.h"

namespace kiln {
namespace {
constexpr std::string_view kModes[] = {"nt", "nn", "tn"};
enum Mode : int64_t { kNt = 0, kNn = 1, kTn = 2 };
constexpr int64_t kInt32Max = (int64_t{1} << 31) - 1;
const ParamInfo kParams[] = {
    {"mode",
     "nt: c = a b[g]^T with b [G, N, K] (forward); nn: c = a b[g] with b [G, K, N] (dgrad); tn: c[g] = a_g^T b_g "
     "(k-grouped wgrad)",
     true, false, 0, 2, kModes, 0},
    {"groups", "groups G (experts)", true, false, 1, 4096},
    {"N", "columns of c (nt, nn); rows of each c[g] (tn)", true, false, 1, kInt32Max},
    {"K", "the reduction dimension (nt, nn); columns of each c[g] (tn)", true, false, 1, kInt32Max},
    {"tokens", "rows of the grouped operands, offsets[G]; a runtime argument (0 is a no-op)", false, false, 0,
     kInt32Max},
    {"accumulate", "tn only: c[g] += a_g^T b_g, c_in read and c written over it (fp32 c; default 0)", true, true, 0, 1,
     {}, 0},
};
// bf16 and fp16; fp8 e4m3 (OCP on gfx950 and sm_90a, FNUZ on gfx942): blockwise-scaled, m-grouped nt.
const DType kDTypes[] = {DType::bf16, DType::f16, DType::e4m3, DType::e4m3fnuz};
constexpr int64_t kScaleBlock = 128;  // fp8: 1 x 128 blocks of a, 128 x 128 blocks of b

bool tn(const KernelSpec& s) { return s.param("mode") == kTn; }
bool accumulate(const KernelSpec& s) { return s.param("accumulate", 0) != 0; }
bool fp8(const KernelSpec& s) { return is_fp8(s.dtype); }
// fp8 scales: sa [tokens, KB] (1 x 128 blocks of a's rows), sb [G, NB, KB] (128 x 128 blocks of b[g]).
int64_t kb(const KernelSpec& s) { return ceil_div(s.param("K"), kScaleBlock); }
int64_t nb(const KernelSpec& s) { return ceil_div(s.param("N"), kScaleBlock); }
// fp8 tn (k-grouped wgrad): a [P, N, 128] and b [P, K, 128], dy^T and x^T in group-aligned
// 128-token panels (quantize_fp8 groups=G), P = ceil(tokens / 128) + G; sa [P, N], sb [P, K].
int64_t panels(const KernelSpec& s) { return ceil_div(s.param("tokens"), kScaleBlock) + s.param("groups"); }
std::vector<int64_t> sa_shape(const KernelSpec& s) {
  if (tn(s)) return {panels(s), s.param("N")};
  return {s.param("tokens"), kb(s)};
}
std::vector<int64_t> sb_shape(const KernelSpec& s) {
  if (tn(s)) return {panels(s), s.param("K")};
  return {s.param("groups"), nb(s), kb(s)};
}
// The index of c among the tensors: after a, b, offsets, [sa, sb,] [c_in].
uint32_t c_index(const KernelSpec& s) { return 3 + (fp8(s) ? 2 : 0) + (accumulate(s) ? 1 : 0); }
std::vector<int64_t> a_shape(const KernelSpec& s) {
  if (tn(s) && fp8(s)) return {panels(s), s.param("N"), kScaleBlock};
  return {s.param("tokens"), tn(s) ? s.param("N") : s.param("K")};
}
std::vector<int64_t> b_shape(const KernelSpec& s) {
  if (tn(s) && fp8(s)) return {panels(s), s.param("K"), kScaleBlock};
  if (tn(s)) return {s.param("tokens"), s.param("K")};
  if (s.param("mode") == kNt) return {s.param("groups"), s.param("N"), s.param("K")};
  return {s.param("groups"), s.param("K"), s.param("N")};
}
std::vector<int64_t> offsets_shape(const KernelSpec& s) { return {s.param("groups") + 1}; }
std::vector<int64_t> c_shape(const KernelSpec& s) {
  if (tn(s)) return {s.param("groups"), s.param("N"), s.param("K")};
  return {s.param("tokens"), s.param("N")};
}
const TensorDecl kSignature[] = {
    {"a", Role::input, DTypeRule::in, DType::f32,
     "[tokens, K] (nt, nn); [tokens, N] (tn); fp8 tn: [P, N, 128], P = ceil(tokens/128) + G", a_shape},
    {"b", Role::input, DTypeRule::in, DType::f32,
     "[G, N, K] (nt); [G, K, N] (nn); [tokens, K] (tn); fp8 tn: [P, K, 128]", b_shape},
    {"offsets", Role::input, DTypeRule::fixed, DType::i32, "[G + 1]", offsets_shape, nullptr,
     "group g is rows offsets[g] .. offsets[g + 1] - 1 of the grouped operands (0 = offsets[0] <= ... <= offsets[G] "
     "= tokens)"},
    {"sa", Role::input, DTypeRule::fixed, DType::f32, "[tokens, ceil(K/128)] (nt); [P, N] (tn)", sa_shape, fp8,
     "fp8: a's scales per row and 128 k (1 x 128 blocks; tn: per panel and row): a * sa is the operand"},
    {"sb", Role::input, DTypeRule::fixed, DType::f32, "[G, ceil(N/128), ceil(K/128)] (nt); [P, K] (tn)", sb_shape, fp8,
     "fp8: b[g]'s scales per 128 x 128 block (tn: per panel and row): b * sb is the operand"},
    {"c_in", Role::input, DTypeRule::out, DType::f32, "[G, N, K]", c_shape, accumulate,
     "the fp32 c accumulated into (tn, accumulate=1); c is written over it"},
    {"c", Role::output, DTypeRule::out, DType::f32, "[tokens, N] (nt, nn); [G, N, K] (tn)", c_shape, nullptr,
     "(c_in +) the grouped product", "c_in"},
};
}  // namespace

std::span<const ParamInfo> GroupedGemmOp::params() const { return kParams; }
std::span<const DType> GroupedGemmOp::dtypes() const { return kDTypes; }
std::span<const TensorDecl> GroupedGemmOp::signature() const { return kSignature; }

Result<void> GroupedGemmOp::validate_rules(const KernelSpec& spec, const TargetInfo& target) const {
  const KernelSpec s = with_defaults(spec);
  if (accumulate(s) && !tn(s))
    return make_error(Errc::invalid_argument,
                      fmt::format("grouped_gemm: accumulate=1 adds into the k-grouped (tn, wgrad) c[g], but mode is "
                                  "{}: set mode tn, or accumulate=0",
                                  kModes[static_cast<size_t>(s.param("mode"))]));
  if (fp8(s) && s.param("mode") == kNn)
    return make_error(Errc::invalid_argument,
                      fmt::format("grouped_gemm: fp8 ({}) takes K-major operands: the forward and the dgrad are mode "
                                  "nt (the dgrad's b is W^T from quantize_fp8 only_qt), the wgrad mode tn; mode nn has "
                                  "an N-major b: set mode nt with b = W^T, or give bf16/fp16 operands",
                                  dtype_name(s.dtype)));
  if (fp8(s) && !tn(s) && target.vendor == Vendor::nvidia && s.param("K") % 16 != 0)
    return make_error(Errc::invalid_argument,
                      fmt::format("grouped_gemm: fp8 on {} copies 16-byte rows of a and b, but K = {} is not a multiple "
                                  "of 16: pad K to a multiple of 16",
                                  target.name, s.param("K")));
  // fp8 tn on sm_90a's TMA kernel (where c's rows are 16-byte multiples): the panels' rows, P N
  // and P K, are 32-bit TMA coordinates. P follows the runtime tokens (absent when a kernel is
  // built, then 0).
  if (fp8(s) && tn(s) && target.vendor == Vendor::nvidia &&
      s.param("K") * static_cast<int64_t>(dtype_size(s.out_dtype)) % 16 == 0 && s.param("tokens") > 0 &&
      panels(s) * std::max(s.param("N"), s.param("K")) > kInt32Max)
    return make_error(Errc::invalid_argument,
                      fmt::format("grouped_gemm: fp8 tn with tokens = {} gives {} panels of up to {} rows, more than "
                                  "the 2^31 rows TMA addresses on {}: split the tokens over several calls (accumulate=1 "
                                  "adds them up)",
                                  s.param("tokens"), panels(s), std::max(s.param("N"), s.param("K")), target.name));
  if (accumulate(s) && s.out_dtype != DType::f32)
    return make_error(Errc::invalid_argument,
                      fmt::format("grouped_gemm: accumulate=1 adds into an fp32 c (wgrad accumulation), but out_dtype "
                                  "is {}: set out_dtype fp32, or accumulate=0",
                                  dtype_name(s.out_dtype)));
  return ok();
}

// The bf16/fp16 kernels (the fp8 ones: variants() and docs/grouped-gemm.md):
//  - AMD MFMA (grouped_gemm_mfma.kernel, gfx942 and gfx950): 128 x 128 tiles, four wavefronts of
//    64 x 64 (2 x 2 blocks of 32 x 32 MFMA), 32-deep k-tiles in two LDS stages (40 KiB), the
//    structure of the bf16 GEMM's MFMA kernel with bounds from the group's rows; 16-byte aligned a
//    and b (the portable kernel serves other bases).
//  - Hopper (grouped_gemm_sm90_tma.kernel, sm_90a, N and K multiples of 8, nn also K % 64 == 0,
//    at most 1024 groups): TMA loads by a producer warpgroup, two consumer warpgroups of WGMMA, a
//    persistent scheduler over every group's tiles; 128 x 256 tiles in 4 stages (128 x 128 in 6
//    where c has fewer than 256 columns; fewer stages where many groups' offsets take shared
//    memory); TMA stores of c through shared memory where a warpgroup's 64 rows lie in one group
//    (tn: in c[g]), TMA reductions for tn's accumulation; 16-byte aligned a, b and c. tn zeroes
//    the next group's rows of a group's last slice in shared memory.
//  - Hopper, what the TMA kernel refuses (grouped_gemm_sm90.kernel, N and K multiples of 8):
//    WGMMA on 128 x 128 tiles, 64-deep slices in a 4-stage cp.async pipeline (129 KiB of shared
//    memory), the structure of the bf16 GEMM's cp.async kernel, one block per tile; 16-byte
//    aligned a, b and c.
//  - portable (grouped_gemm.kernel, every target; the fallback on sm_90a): 64 x 64 tiles of c,
//    16-deep slices through LDS in fp32, 4 x 4 outputs per thread (256 threads).
namespace {
bool wgmma(const KernelConfig& c) { return c.count("WGMMA") && c.at("WGMMA") != 0; }
bool tma(const KernelConfig& c) { return c.count("TMA") && c.at("TMA") != 0; }
constexpr int64_t kTmaMaxGroups = 1024;  // the offsets and row-tile prefix live in shared memory
bool mfma(const KernelConfig& c) { return c.count("MFMA") && c.at("MFMA") != 0; }
// The columns of c a tile spans: N (nt, nn) or K (tn: c[g] is [N, K]).
int64_t c_cols(const KernelSpec& s) { return tn(s) ? s.param("K") : s.param("N"); }
// The TMA kernel's shared memory besides its stages: 1 KiB of alignment slack, the epilogue's
// staging buffers (lib/epilogue_sm90), the offsets and row-tile prefix.
int64_t tma_fixed_bytes(const KernelSpec& s, int64_t bm) {
  return 1024 + epilogue_sm90_bytes(bm) + 8 * (s.param("groups") + 1);
}
// fp8 with TMA: tn keeps each slice's scales in its stage (sa of the tile's rows, then sb of its BN
// columns); nt copies them into the scale ring of lib/fp8_sm90.h, an entry per row of the tile and
// one for b's 128 x 128 block.
int64_t fp8_scale_stage_bytes(const KernelSpec& s, int64_t bm, int64_t bn) { return tn(s) ? (bm + bn) * 4 : 0; }
int64_t fp8_scale_ring_bytes(const KernelSpec& s, int64_t bm, int64_t stages) {
  return tn(s) ? 0 : scale_ring_bytes(kb(s), bm + 1, stages);  // lib/fp8_sm90.h
}
int64_t sm90_shared_bytes(const KernelSpec& s, const KernelConfig& c) {
  const int64_t stages = c.at("STAGES") * (c.at("BM") + c.at("BN")) * c.at("BK") * (fp8(s) ? 1 : 2);
  if (!tma(c)) return 1024 + stages;
  const int64_t scales = fp8(s) ? c.at("STAGES") * fp8_scale_stage_bytes(s, c.at("BM"), c.at("BN")) +
                                      fp8_scale_ring_bytes(s, c.at("BM"), c.at("STAGES"))
                                : 0;
  return tma_fixed_bytes(s, c.at("BM")) + stages + scales + 16 * c.at("STAGES");  // + the stages' mbarriers
}
// fp8 with TMA (grouped_gemm_fp8_sm90_tma.kernel): sm_90a, c's rows 16-byte multiples (its TMA
// stores), the offsets in shared memory, 32-bit rows of b as [G N, K] (nt) or of c as [G N, K]
// (tn); nt also K % 16 == 0 (16-byte rows of a and b, which validation requires on NVIDIA anyway).
// tn's panel rows (P N and P K) must also fit 32-bit coordinates: validate_rules checks that per
// call, since P follows the runtime tokens.
bool fp8_tma_applies(const KernelSpec& s, const TargetInfo& target) {
  const int64_t G = s.param("groups"), N = s.param("N"), K = s.param("K");
  return target.vendor == Vendor::nvidia && target.cpu == "sm_90a" && fp8(s) && (tn(s) || K % 16 == 0) &&
         c_cols(s) * static_cast<int64_t>(dtype_size(s.out_dtype)) % 16 == 0 && G <= kTmaMaxGroups &&
         G * N <= kInt32Max;
}
// As many 128 x 128-deep stages as fit next to the epilogue and the offsets (at most 6).
KernelConfig fp8_tma_config(const KernelSpec& s) {
  constexpr int64_t bm = 128, bn = 128, bk = 128;
  const int64_t stage = (bm + bn) * bk + fp8_scale_stage_bytes(s, bm, bn) + 16;
  const int64_t room = kSm90MaxDynamicShared - tma_fixed_bytes(s, bm);
  int64_t stages = 6;
  while (stages > 2 && stages * stage + fp8_scale_ring_bytes(s, bm, stages) > room) --stages;
  KernelConfig c = {{"FP8", 1}, {"WGMMA", 1}, {"TMA", 1},        {"BM", bm},
                    {"BN", bn}, {"BK", bk},   {"STAGES", stages}, {"THREADS", 384}};
  if (tn(s)) c["TN"] = 1;
  return c;
}
const KernelConfig kFp8CpAsync = {{"FP8", 1}, {"WGMMA", 1}, {"BM", 128}, {"BN", 128},
                                  {"BK", 128}, {"STAGES", 4},  {"THREADS", 256}};
// The TMA kernel: sm_90a, 16-byte row strides, nn slices inside a group's b, 32-bit TMA
// coordinates (rows of b as [G N, K] or [G K, N]; tn: rows of c as [G N, K]).
bool tma_applies(const KernelSpec& s, const TargetInfo& target) {
  const int64_t G = s.param("groups"), N = s.param("N"), K = s.param("K"), mode = s.param("mode");
  return target.vendor == Vendor::nvidia && target.cpu == "sm_90a" && !fp8(s) && N % 8 == 0 && K % 8 == 0 &&
         (mode != kNn || K % 64 == 0) && G <= kTmaMaxGroups && G * (mode == kNn ? K : N) <= kInt32Max;
}
// 4 stages of 128 x 256 (6 of 128 x 128), fewer where many groups' offsets leave less than
// Hopper's 227 KiB of shared memory per block.
KernelConfig tma_config(const KernelSpec& s, int64_t bn) {
  constexpr int64_t bm = 128, bk = 64;
  const int64_t stage = (bm + bn) * bk * 2 + 16;
  const int64_t stages = std::min<int64_t>(bn == 256 ? 4 : 6, (kSm90MaxDynamicShared - tma_fixed_bytes(s, bm)) / stage);
  return {{"WGMMA", 1}, {"TMA", 1}, {"BM", bm}, {"BN", bn}, {"BK", bk}, {"STAGES", stages}, {"THREADS", 384}};
}
const KernelConfig kCpAsync = {{"WGMMA", 1}, {"BM", 128}, {"BN", 128}, {"BK", 64}, {"STAGES", 4}, {"THREADS", 256}};
bool fp8_kernel(const KernelConfig& c) { return c.count("FP8") && c.at("FP8") != 0; }
bool fp8_tn_kernel(const KernelConfig& c) { return fp8_kernel(c) && c.count("TN") && c.at("TN") != 0; }
// fp8 tn (k-grouped wgrad) without TMA: the m-grouped fp8 kernels' structure over a group's
// 128-token panels (grouped_gemm_fp8_tn_sm90.kernel: 128 x 128 tiles, one panel per 128-deep
// slice, the fallback of the TMA kernel on sm_90a; grouped_gemm_fp8_tn_mfma.kernel: 64 x 64 tiles
// of 2 x 2 waves, as the nt MFMA kernel).
KernelConfig fp8_tn_config(const TargetInfo& target) {
  if (target.vendor == Vendor::nvidia)
    return {{"FP8", 1}, {"TN", 1}, {"WGMMA", 1}, {"BM", 128}, {"BN", 128}, {"BK", 128}, {"STAGES", 4}, {"THREADS", 256}};
  return {{"FP8", 1},     {"TN", 1},      {"MFMA", 1},        {"BM", 64},       {"BN", 64},
          {"BK", 64},     {"WAVES_M", 2}, {"WAVES_N", 2},     {"THREADS", 256}, {"MFMA_K", 16}};
}
}  // namespace

std::vector<KernelConfig> GroupedGemmOp::variants(const KernelSpec& spec, const TargetInfo& target) const {
  // fp8 blockwise: on sm_90a the TMA kernel with the persistent scheduler, nt and tn (128-deep
  // slices: one scale block or panel each; H100, 2026-11-26: 788-963 TFLOP/s on DeepSeek-V3's
  // forward and dgrad, 421-526 on the cp.async kernel; wgrad 471-549, 266-317 on the cp.async tn
  // kernel; the cp.async kernels serve what it refuses), the MFMA kernel on AMD (2 x 2 waves of the 32x32x16 fp8 MFMA, as gemm_fp8 chooses) on
  // 64 x 64 tiles: at 128 x 128 (378 VGPRs) the CDNA emulator gave NaN rows for K a multiple of
  // 64 above 128 (docs/grouped-gemm.md), which 64 x 64 (158 VGPRs) passes. gfx950's 32x32x64
  // f8f6f4 (MFMA_K 64) is a tuning candidate, not the choice, for gemm_fp8's reason: the shared
  // emulator misdecodes it (docs/emulator-repro/f8f6f4-decode/; one of the four fp8 specs fails
  // there, all pass with the decoder fixed); the choice is then `target.name == "gfx950" ? 64 : 16`.
  if (fp8(spec)) {
    // sm_90a: the TMA kernel with the persistent scheduler where it applies, else the cp.async one.
    if (fp8_tma_applies(spec, target)) return {fp8_tma_config(spec), tn(spec) ? fp8_tn_config(target) : kFp8CpAsync};
    if (tn(spec)) return {fp8_tn_config(target)};
    if (target.vendor == Vendor::nvidia) return {kFp8CpAsync};
    return {{{"FP8", 1},
             {"MFMA", 1},
             {"BM", 64},
             {"BN", 64},
             {"BK", 64},
             {"WAVES_M", 2},
             {"WAVES_N", 2},
             {"THREADS", 256},
             {"MFMA_K", 16}}};
  }
  KernelConfig portable = {{"BM", 64}, {"BN", 64}, {"BK", 16}, {"TM", 4}, {"TN", 4}, {"THREADS", 256}};
  if (tma_applies(spec, target)) return {tma_config(spec, c_cols(spec) >= 256 ? 256 : 128), portable};
  if (target.vendor == Vendor::nvidia && target.cpu == "sm_90a" && spec.param("N") % 8 == 0 &&
      spec.param("K") % 8 == 0)
    return {kCpAsync, portable};
  if (target.vendor == Vendor::amd && (target.name == "gfx942" || target.name == "gfx950"))
    return {{{"MFMA", 1},
             {"BM", 128},
             {"BN", 128},
             {"BK", 32},
             {"WAVES_M", 2},
             {"WAVES_N", 2},
             {"THREADS", 256},
             {"MFMA_K", target.name == "gfx950" ? 16 : 8}},
            portable};
  return {portable};
}

std::vector<uint32_t> GroupedGemmOp::base_alignment(const KernelSpec& spec, const KernelConfig& c) const {
  if (fp8_kernel(c)) {  // a, b, offsets, sa, sb, [c_in,] c: 16-byte rows of a and b (nt MFMA: where K % 16 == 0;
                        // tn: 128-byte panel rows)
    const uint32_t ab = wgmma(c) || fp8_tn_kernel(c) || spec.param("K") % 16 == 0 ? 16 : 1;
    std::vector<uint32_t> out = {ab, ab, 1, 1, 1};
    if (accumulate(with_defaults(spec))) out.push_back(tma(c) ? 16u : 1u);  // c_in: c's buffer
    out.push_back(tma(c) ? 16u : 1u);                                      // TMA: c's tensor map
    return out;
  }
  std::vector<uint32_t> out = {1, 1, 1, 1};
  if (wgmma(c)) out = {16, 16, 1, 16};  // a, b, offsets, c: 16-byte rows through cp.async
  if (tma(c)) out = {16, 16, 1, 16};    // a, b and c: TMA (c also stores two neighbouring outputs)
  if (mfma(c)) out = {16, 16, 1, 1};    // a, b: 16-byte loads
  if (accumulate(with_defaults(spec))) out.insert(out.begin() + 3, out[3]);  // c_in: c's buffer
  return out;
}

uint32_t GroupedGemmOp::dynamic_shared_bytes(const KernelSpec& spec, const KernelConfig& c) const {
  return wgmma(c) ? static_cast<uint32_t>(sm90_shared_bytes(spec, c)) : 0;
}

std::vector<KernelConfig> GroupedGemmOp::tuning_candidates(const KernelSpec& spec, const TargetInfo& target) const {
  if (fp8(spec) && target.name == "gfx950") {  // the 32x32x64 f8f6f4 form as well (see variants())
    const KernelConfig first = choose_config(spec, target);
    if (!first.count("MFMA_K")) return {first};
    KernelConfig k64 = first;
    k64["MFMA_K"] = 64;
    return {first, k64};
  }
  if (fp8_tma_applies(spec, target)) return {fp8_tma_config(spec), tn(spec) ? fp8_tn_config(target) : kFp8CpAsync};
  if (!tma_applies(spec, target)) return {choose_config(spec, target)};
  const KernelConfig first = choose_config(spec, target);
  return {first, tma_config(spec, first.at("BN") == 256 ? 128 : 256), kCpAsync};
}

std::string_view GroupedGemmOp::device_template(const KernelConfig& c) const {
  if (fp8_kernel(c) && tma(c)) return embedded_file("templates/grouped_gemm/grouped_gemm_fp8_sm90_tma.kernel");
  if (fp8_tn_kernel(c))
    return embedded_file(wgmma(c) ? "templates/grouped_gemm/grouped_gemm_fp8_tn_sm90.kernel"
                                  : "templates/grouped_gemm/grouped_gemm_fp8_tn_mfma.kernel");
  if (fp8_kernel(c) && tma(c)) return embedded_file("templates/grouped_gemm/grouped_gemm_fp8_sm90_tma.kernel");
  if (fp8_kernel(c))
    return embedded_file(wgmma(c) ? "templates/grouped_gemm/grouped_gemm_fp8_sm90.kernel"
                                  : "templates/grouped_gemm/grouped_gemm_fp8_mfma.kernel");
  return embedded_file(tma(c)    ? "templates/grouped_gemm/grouped_gemm_sm90_tma.kernel"
                       : wgmma(c) ? "templates/grouped_gemm/grouped_gemm_sm90.kernel"
                       : mfma(c) ? "templates/grouped_gemm/grouped_gemm_mfma.kernel"
                                 : "templates/grouped_gemm/grouped_gemm.kernel");
}

std::string GroupedGemmOp::specialize(const KernelSpec& spec, const KernelConfig& c) const {
  const char* acc = accumulate(with_defaults(spec)) ? "true" : "false";
  if (fp8_kernel(c)) {
    const bool e5m2 = spec.dtype == DType::e5m2 || spec.dtype == DType::e5m2fnuz;
    // The fp8 kernels' tile constants: WGMMA (sm_90a) or MFMA (AMD), both operands in dtype's format.
    const std::string tile =
        wgmma(c) ? fmt::format("constexpr bool A_E5M2 = {0}, B_E5M2 = {0};\n"
                               "constexpr int BM = {1}, BN = {2}, BK = {3}, STAGES = {4}, THREADS = {5};\n",
                               e5m2, c.at("BM"), c.at("BN"), c.at("BK"), c.at("STAGES"), c.at("THREADS"))
                 : fmt::format("constexpr bool A_BF8 = {0}, B_BF8 = {0};\nconstexpr int BM = {1}, BN = {2}, BK = {3}, "
                               "WAVES_M = {4}, WAVES_N = {5}, THREADS = {6}, MFMA_K = {7};\n",
                               e5m2, c.at("BM"), c.at("BN"), c.at("BK"), c.at("WAVES_M"), c.at("WAVES_N"),
                               c.at("THREADS"), c.at("MFMA_K"));
    if (tma(c)) {  // both modes: TN and ACCUMULATE select tn's tiles, scales and stores
      std::string out = fmt::format(
          "constexpr int GROUPS = {};\nconstexpr long long N = {}, K = {}, KB = {}, NB = {};\n"
          "constexpr bool TN = {}, ACCUMULATE = {};\ntypedef {} a_t;\ntypedef {} out_t;\n",
          spec.param("groups"), spec.param("N"), spec.param("K"), kb(spec), nb(spec), tn(spec) ? "true" : "false",
          acc, device_type_name(spec.dtype), device_type_name(spec.out_dtype));
      return out + tile;
    }
    if (fp8_tn_kernel(c)) {  // no KB, NB: the scales are per panel and row
      std::string out = fmt::format(
          "constexpr int GROUPS = {};\nconstexpr long long N = {}, K = {};\nconstexpr bool ACCUMULATE = {};\n"
          "typedef {} a_t;\ntypedef {} out_t;\n",
          spec.param("groups"), spec.param("N"), spec.param("K"), acc, device_type_name(spec.dtype),
          device_type_name(spec.out_dtype));
      return out + tile;
    }
    std::string out = fmt::format(
        "constexpr int GROUPS = {};\nconstexpr long long N = {}, K = {}, KB = {}, NB = {};\n"
        "typedef {} a_t;\ntypedef {} out_t;\n",
        spec.param("groups"), spec.param("N"), spec.param("K"), kb(spec), nb(spec), device_type_name(spec.dtype),
        device_type_name(spec.out_dtype));
    return out + tile;
  }
  if (wgmma(c))
    return fmt::format(
        "constexpr int MODE = {}, GROUPS = {};\nconstexpr long long N = {}, K = {};\n"
        "constexpr int BM = {}, BN = {}, BK = {}, STAGES = {}, THREADS = {};\nconstexpr bool IN_BF16 = {}, "
        "ACCUMULATE = {};\ntypedef {} in_t;\ntypedef {} out_t;\n",
        spec.param("mode"), spec.param("groups"), spec.param("N"), spec.param("K"), c.at("BM"), c.at("BN"),
        c.at("BK"), c.at("STAGES"), c.at("THREADS"), spec.dtype == DType::bf16 ? "true" : "false", acc,
        device_type_name(spec.dtype), device_type_name(spec.out_dtype));
  if (mfma(c))
    return fmt::format(
        "constexpr int MODE = {}, GROUPS = {};\nconstexpr long long N = {}, K = {};\n"
        "constexpr int BM = {}, BN = {}, BK = {}, WAVES_M = {}, WAVES_N = {}, THREADS = {}, MFMA_K = {};\n"
        "constexpr bool IN_BF16 = {}, ACCUMULATE = {};\ntypedef {} in_t;\ntypedef {} out_t;\n",
        spec.param("mode"), spec.param("groups"), spec.param("N"), spec.param("K"), c.at("BM"), c.at("BN"),
        c.at("BK"), c.at("WAVES_M"), c.at("WAVES_N"), c.at("THREADS"), c.at("MFMA_K"),
        spec.dtype == DType::bf16 ? "true" : "false", acc, device_type_name(spec.dtype),
        device_type_name(spec.out_dtype));
  return fmt::format(
      "constexpr int MODE = {}, GROUPS = {};\nconstexpr long long N = {}, K = {};\n"
      "constexpr int BM = {}, BN = {}, BK = {}, TM = {}, TN = {}, THREADS = {};\nconstexpr bool ACCUMULATE = {};\n"
      "typedef {} in_t;\ntypedef {} out_t;\n",
      spec.param("mode"), spec.param("groups"), spec.param("N"), spec.param("K"), c.at("BM"), c.at("BN"), c.at("BK"),
      c.at("TM"), c.at("TN"), c.at("THREADS"), acc, device_type_name(spec.dtype), device_type_name(spec.out_dtype));
}

// nt, nn: grid.x covers every group's row tiles (at most ceil(tokens / BM) + G - 1 of them: each
// group wastes less than one tile), grid.y the column tiles; a block finds its group from the
// offsets and blocks past the last tile exit. tn: one block per (BM x BN tile of c[g], g). The
// TMA kernels are persistent over the same tiles.
Plan GroupedGemmOp::plan(const KernelSpec& call, const KernelConfig& c) const {
  Plan p;
  const int64_t tokens = call.param("tokens");
  const uint64_t N = call.param("N"), K = call.param("K"), G = call.param("groups");
  LaunchGeometry g;
  g.block.x = static_cast<uint32_t>(c.at("THREADS"));
  if (tn(call)) {  // every c[g] is written, zeros for empty groups, even with no tokens
    g.grid.x = static_cast<uint32_t>(ceil_div(call.param("N"), c.at("BM")) * ceil_div(call.param("K"), c.at("BN")));
    g.grid.y = static_cast<uint32_t>(G);
  } else {
    if (tokens == 0) return p;
    g.grid.x = static_cast<uint32_t>(ceil_div(tokens, c.at("BM")) + static_cast<int64_t>(G) - 1);
    g.grid.y = static_cast<uint32_t>(ceil_div(call.param("N"), c.at("BN")));
  }
  if (wgmma(c)) g.dynamic_shared_bytes = static_cast<uint32_t>(sm90_shared_bytes(call, c));
  const uint32_t out = c_index(with_defaults(call));  // c: with accumulate the buffer of c_in
  // c's TMA map: boxes of one 128-byte line x 64 rows, over `rows` rows of `cols` columns.
  const auto map_of_c = [&](uint64_t cols, uint64_t rows) {
    return TensorMapInfo{out, cols, rows, static_cast<uint32_t>(128 / dtype_size(call.out_dtype)), 64};
  };
  const auto launch = [&](std::vector<KernelArg> args, bool persistent) {
    if (persistent) {  // grid.x bounds the tiles of every group; the launch caps it at one block per SM
      g.grid.x = static_cast<uint32_t>(std::min<int64_t>(static_cast<int64_t>(g.grid.x) * g.grid.y, kInt32Max));
      g.grid.y = 1;
      g.persistent = true;
    }
    Launch l;
    l.kernel = "kiln_grouped_gemm";
    l.geometry = g;
    l.args = std::move(args);
    p.launches.push_back(std::move(l));
    return p;
  };
  using A = KernelArg;
  if (fp8_kernel(c) && tma(c) && tn(call)) {
    // Over the G x ceil(N / 128) x ceil(K / 128) tiles of c; maps of the panels a [P N, 128] and b
    // [P K, 128] (boxes of 128 bytes x 128 rows) and of c as [G N, K], then offsets, sa, sb, c,
    // tokens.
    const uint64_t P = panels(call);
    return launch({A::tensor_map_of({0, 128, P * N, 128, 128}), A::tensor_map_of({1, 128, P * K, 128, 128}),
                   A::tensor_map_of(map_of_c(K, G * N)), A::tensor(2), A::tensor(3), A::tensor(4), A::tensor(out),
                   A::i32(tokens)},
                  true);
  }
  if (fp8_kernel(c) && tma(c)) {
    // As the bf16 TMA kernel: maps of a [tokens, K], b [G N, K] (boxes of 128 K bytes x 128 rows)
    // and c, then offsets, sa, sb, c, tokens.
    const uint64_t rows = static_cast<uint64_t>(std::max<int64_t>(tokens, 1));
    return launch({A::tensor_map_of({0, K, rows, 128, 128}), A::tensor_map_of({1, K, G * N, 128, 128}),
                   A::tensor_map_of(map_of_c(N, rows)), A::tensor(2), A::tensor(3), A::tensor(4), A::tensor(out),
                   A::i32(tokens)},
                  true);
  }
  if (fp8_kernel(c))  // a, b, offsets, sa, sb, c, tokens
    return launch({A::tensor(0), A::tensor(1), A::tensor(2), A::tensor(3), A::tensor(4), A::tensor(out),
                   A::i32(tokens)},
                  false);
  if (tma(c) && tn(call)) {
    // Over the G x ceil(N / BM) x ceil(K / BN) tiles of c; maps of a [tokens, N] and b [tokens, K]
    // (boxes of 64 columns x 64 rows) and of c as [G N, K]. With no tokens, a and b may have no
    // storage: their maps are c's (the kernel loads nothing then).
    const TensorMapInfo map_c = map_of_c(K, G * N);
    const uint64_t rows = static_cast<uint64_t>(tokens);
    return launch({A::tensor_map_of(tokens == 0 ? map_c : TensorMapInfo{0, N, rows, 64, 64}),
                   A::tensor_map_of(tokens == 0 ? map_c : TensorMapInfo{1, K, rows, 64, 64}), A::tensor_map_of(map_c),
                   A::tensor(2), A::tensor(out), A::i32(tokens)},
                  true);
  }
  if (tma(c)) {
    // a and b as TMA tensor maps (b as [G N, K] for nt, [G K, N] for nn).
    const uint32_t bn = static_cast<uint32_t>(c.at("BN"));
    const uint64_t rows = static_cast<uint64_t>(tokens);
    return launch({A::tensor_map_of({0, K, rows, 64, 128}),
                   A::tensor_map_of(call.param("mode") == kNt ? TensorMapInfo{1, K, G * N, 64, bn}
                                                              : TensorMapInfo{1, N, G * K, 64, 64}),
                   A::tensor_map_of(map_of_c(N, rows)), A::tensor(2), A::tensor(out), A::i32(tokens)},
                  true);
  }
  // a, b, offsets, c (read and written with accumulate), tokens.
  return launch({A::tensor(0), A::tensor(1), A::tensor(2), A::tensor(out), A::i32(tokens)}, false);
}

// Random rows, and offsets that split the tokens over the groups unevenly (a Zipf-like law: group
// g gets a share 1 / (g + 1), shuffled), with some groups empty when G > 2.
void GroupedGemmOp::init_inputs(const KernelSpec& spec, std::span<const TensorInfo> inputs,
                                std::vector<std::vector<float>>& values, std::mt19937_64& rng) const {
  OpTemplate::init_inputs(spec, inputs, values, rng);
  const int64_t G = spec.param("groups"), tokens = spec.param("tokens");
  if (fp8(spec)) {
    // fp8 codes over the whole range of the format (as quantize_fp8 writes them), and scales of
    // about amax / fp8_max with amax in [2^-2, 2^2], a different binade per block; b's also by
    // 1 / sqrt(K) so that c stays O(1). gemm_fp8's test inputs.
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f), mant(0.5f, 1.0f);
    const float max = static_cast<float>(fp8_max(spec.dtype));
    for (size_t i : {size_t{0}, size_t{1}})
      for (float& x : values[i]) {
        do x = round_to_dtype(dist(rng) * max, spec.dtype);
        while (x == 0.0f);
      }
    const double k_scale = 1.0 / std::sqrt(static_cast<double>(spec.param("K")));
    for (size_t i : {size_t{3}, size_t{4}})
      for (size_t j = 0; j < values[i].size(); ++j)
        values[i][j] = static_cast<float>(std::ldexp(mant(rng), static_cast<int>(j % 5) - 2) / max *
                                          (i == 4 ? k_scale : 1.0));
  }
  values[2] = grouped_test_offsets(G, tokens, rng);
}

// fp64. nt, nn: the sampled rows of c (every row when none are asked for); tn: every c[g].
void GroupedGemmOp::reference(const KernelSpec& s, const Scalars&, std::span<const std::vector<float>> in,
                              std::span<const int64_t> sample, std::vector<RefOutput>& outputs) const {
  const int64_t G = s.param("groups"), N = s.param("N"), K = s.param("K"), tokens = s.param("tokens");
  const std::vector<float>&a = in[0], &b = in[1], &off = in[2];
  outputs.assign(1, {});
  RefOutput& out = outputs[0];
  if (tn(s) && fp8(s)) {  // over each group's whole panels: (a[p] * sa[p]) (b[p] * sb[p])^T
    const std::vector<float>&sa = in[3], &sb = in[4];
    out.values.assign(static_cast<size_t>(G * N * K), 0.0);
    if (accumulate(s)) std::copy(in[5].begin(), in[5].end(), out.values.begin());
    for (int64_t g = 0; g < G; ++g) {
      const int64_t r0 = static_cast<int64_t>(off[g]), rows = static_cast<int64_t>(off[g + 1]) - r0;
      for (int64_t p = r0 / kScaleBlock + g; p < r0 / kScaleBlock + g + ceil_div(rows, kScaleBlock); ++p)
        for (int64_t n = 0; n < N; ++n) {
          const float* ar = &a[static_cast<size_t>((p * N + n) * kScaleBlock)];
          double* row = &out.values[static_cast<size_t>((g * N + n) * K)];
          for (int64_t k = 0; k < K; ++k) {
            const float* br = &b[static_cast<size_t>((p * K + k) * kScaleBlock)];
            double dot = 0;
            for (int64_t t = 0; t < kScaleBlock; ++t) dot += double(ar[t]) * double(br[t]);
            row[k] += dot * sa[static_cast<size_t>(p * N + n)] * sb[static_cast<size_t>(p * K + k)];
          }
        }
    }
    return;
  }
  if (tn(s)) {
    out.values.assign(static_cast<size_t>(G * N * K), 0.0);
    if (accumulate(s)) std::copy(in[3].begin(), in[3].end(), out.values.begin());
    for (int64_t g = 0; g < G; ++g)
      for (int64_t t = static_cast<int64_t>(off[g]); t < static_cast<int64_t>(off[g + 1]); ++t)
        for (int64_t n = 0; n < N; ++n) {
          const double x = a[static_cast<size_t>(t * N + n)];
          double* row = &out.values[static_cast<size_t>((g * N + n) * K)];
          for (int64_t k = 0; k < K; ++k) row[k] += x * b[static_cast<size_t>(t * K + k)];
        }
    return;
  }
  out.rows.assign(sample.begin(), sample.end());
  if (out.rows.empty())
    for (int64_t t = 0; t < tokens; ++t) out.rows.push_back(t);
  const bool nt = s.param("mode") == kNt;
  if (fp8(s)) {  // (a * sa) (b[g] * sb[g])^T with the scales of each element's blocks
    const std::vector<float>&sa = in[3], &sb = in[4];
    const int64_t KB = kb(s), NB = nb(s);
    for (int64_t t : out.rows) {
      int64_t g = 0;
      while (g + 1 < G && static_cast<int64_t>(off[g + 1]) <= t) ++g;
      for (int64_t n = 0; n < N; ++n) {
        double acc = 0;
        for (int64_t k = 0; k < K; ++k)
          acc += double(a[static_cast<size_t>(t * K + k)]) * sa[static_cast<size_t>(t * KB + k / kScaleBlock)] *
                 double(b[static_cast<size_t>((g * N + n) * K + k)]) *
                 sb[static_cast<size_t>((g * NB + n / kScaleBlock) * KB + k / kScaleBlock)];
        out.values.push_back(acc);
      }
    }
    return;
  }
  for (int64_t t : out.rows) {
    int64_t g = 0;
    while (g + 1 < G && static_cast<int64_t>(off[g + 1]) <= t) ++g;  // the group holding row t
    for (int64_t n = 0; n < N; ++n) {
      double acc = 0;
      for (int64_t k = 0; k < K; ++k)
        acc += double(a[static_cast<size_t>(t * K + k)]) *
               b[static_cast<size_t>(nt ? (g * N + n) * K + k : (g * K + k) * N + n)];
      out.values.push_back(acc);
    }
  }
}

// 2 tokens N K: each token's row (nt, nn) or each token's contribution (tn) costs 2 N K.
double GroupedGemmOp::flops(const KernelSpec& s) const {
  return 2.0 * static_cast<double>(s.param("tokens")) * static_cast<double>(s.param("N")) *
         static_cast<double>(s.param("K"));
}

Gate GroupedGemmOp::gate(const KernelSpec& spec, const TensorInfo& output) const {
  if (!fp8(spec)) return Gate::for_dtype(output.dtype);
  Gate g;  // gemm_fp8's: the fp64 product of the dequantized operands, 40 dB
  g.kind = Gate::Kind::snr;
  g.min_snr_db = 40;
  return g;
}

std::vector<TestSpec> GroupedGemmOp::test_specs(const TargetInfo& target) const {
  std::vector<TestSpec> out;
  auto add = [&](DType t, DType o, int64_t mode, int64_t G, int64_t tokens, int64_t N, int64_t K, std::string_view why) {
    out.push_back({{"grouped_gemm", t, o, {{"mode", mode}, {"groups", G}, {"tokens", tokens}, {"N", N}, {"K", K}}}, why});
  };
  add(DType::bf16, DType::bf16, kNt, 4, 150, 72, 40, "nt forward, uneven groups (one empty), N and K tails");
  add(DType::f16, DType::f32, kNn, 3, 97, 65, 33, "nn dgrad, fp16 in, fp32 out, odd sizes");
  add(DType::bf16, DType::f32, kTn, 5, 120, 40, 70, "tn wgrad into fp32, empty groups give zeros");
  add(DType::bf16, DType::bf16, kNn, 3, 130, 48, 80, "nn dgrad, 16-byte rows (the WGMMA kernel on sm_90a)");
  add(DType::bf16, DType::f32, kTn, 4, 150, 64, 40, "tn wgrad into fp32, 16-byte rows (WGMMA on sm_90a)");
  add(DType::bf16, DType::bf16, kNt, 1, 64, 64, 64, "one group: a plain GEMM");
  add(DType::bf16, DType::bf16, kNt, 8, 0, 32, 32, "no tokens: a no-op");
  add(DType::bf16, DType::f32, kTn, 3, 0, 16, 24, "tn with no tokens: every c[g] is zero");
  add(DType::bf16, DType::bf16, kNt, 16, 700, 256, 128, "GPU size: 16 experts");
  add(DType::bf16, DType::bf16, kNn, 5, 300, 136, 128, "nn dgrad, K a multiple of 64 (the TMA kernel on sm_90a)");
  add(DType::bf16, DType::bf16, kTn, 6, 700, 200, 136,
      "tn wgrad into bf16 (the TMA kernel on sm_90a): several slices per group with tails, 8 rows of c[g] past "
      "its last 64, K tail");
  auto add_acc = [&](DType t, int64_t G, int64_t tokens, int64_t N, int64_t K, std::string_view why) {
    out.push_back({{"grouped_gemm", t, DType::f32,
                    {{"mode", kTn}, {"groups", G}, {"tokens", tokens}, {"N", N}, {"K", K}, {"accumulate", 1}}},
                   why});
  };
  add_acc(DType::bf16, 5, 120, 40, 70, "tn wgrad accumulated into fp32 c, odd K, empty groups keep c_in");
  add_acc(DType::f16, 3, 100, 48, 72, "tn wgrad accumulated, 16-byte rows (WGMMA on sm_90a), K tail of a tile");
  add_acc(DType::bf16, 3, 0, 16, 24, "tn accumulate with no tokens: c = c_in");
  add_acc(DType::bf16, 4, 500, 192, 264,
          "tn wgrad accumulated with TMA reductions (sm_90a), 256-column tiles with an 8-column tail");
  const DType e4 = fp8_for_target(DType::e4m3, target);
  add(e4, DType::bf16, kNt, 4, 150, 136, 256, "fp8 blockwise: uneven groups (one empty), N tail in a 2nd scale block");
  add(e4, DType::bf16, kNt, 3, 70, 64, 160, "fp8 blockwise: groups not multiples of the tile, K tail of a block");
  add(e4, DType::f32, kNt, 5, 200, 128, 128, "fp8 blockwise into fp32, one scale block, empty groups");
  add(e4, DType::bf16, kNt, 2, 0, 32, 128, "fp8 with no tokens: a no-op");
  // fp8 k-grouped wgrad (tn): group sizes 0, not multiples of 128, and above 128.
  add(e4, DType::f32, kTn, 4, 300, 40, 72, "fp8 tn wgrad: groups of 0, > 128 and odd sizes, N and K tails");
  add(e4, DType::bf16, kTn, 2, 130, 128, 64, "fp8 tn wgrad into bf16, a group of 1 or 2 panels");
  add(e4, DType::f32, kTn, 2, 0, 32, 48, "fp8 tn with no tokens: every c[g] is zero");
  auto add_fp8_acc = [&](int64_t G, int64_t tokens, int64_t N, int64_t K, std::string_view why) {
    out.push_back({{"grouped_gemm", e4, DType::f32,
                    {{"mode", kTn}, {"groups", G}, {"tokens", tokens}, {"N", N}, {"K", K}, {"accumulate", 1}}},
                   why});
  };
  add_fp8_acc(3, 200, 64, 96, "fp8 tn wgrad accumulated into fp32 c, empty groups keep c_in");
  add_fp8_acc(4, 300, 100, 136,
              "fp8 tn wgrad accumulated (the TMA kernel on sm_90a): TMA reductions and, past c[g]'s last 64 rows, "
              "register adds; a K tail");
  return out;
}

}  // namespace kiln
