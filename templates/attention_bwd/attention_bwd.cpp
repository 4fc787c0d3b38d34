#include "templates/attention_bwd/attention_bwd.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <iterator>

#include "support/embedded.h"
#include "templates/lib/attention_params.h"

namespace kiln {
namespace {
namespace ah = attention_params;

const std::vector<ParamInfo> kBwdParams = [] {
  std::vector<ParamInfo> p(std::begin(ah::kParams), std::end(ah::kParams));
  p.push_back({"deterministic",
               "bitwise equal dq, dk, dv across runs (0: sm_90a's head-dim-64 backward adds dq with fp32 atomics, "
               "0-13% faster)",
               true, true, 0, 1,
               {}, 0});
  return p;
}();

bool is_thd(const KernelSpec& s) { return ah::thd(s); }
const TensorDecl kSignature[] = {
    {"dout", Role::input, DTypeRule::in, DType::f32, ah::kODoc, ah::o_shape, nullptr, "gradient of out"},
    {"q", Role::input, DTypeRule::in, DType::f32, ah::kQDoc, ah::q_shape},
    {"k", Role::input, DTypeRule::in, DType::f32, ah::kKDoc, ah::k_shape},
    {"v", Role::input, DTypeRule::in, DType::f32, ah::kVDoc, ah::v_shape},
    {"out", Role::input, DTypeRule::in, DType::f32, ah::kODoc, ah::o_shape, nullptr, "the forward's out"},
    {"lse", Role::input, DTypeRule::fixed, DType::f32, ah::kLseDoc, ah::lse_shape, nullptr, "the forward's lse"},
    {"cu_seqlens_q", Role::input, DTypeRule::fixed, DType::i32, "[batch + 1]", ah::cu_shape, is_thd,
     "thd: sequence b's queries are rows cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1 of q"},
    {"cu_seqlens_k", Role::input, DTypeRule::fixed, DType::i32, "[batch + 1]", ah::cu_shape, is_thd,
     "thd: sequence b's keys are rows cu_seqlens_k[b] .. cu_seqlens_k[b + 1] - 1 of k and v"},
    {"dq", Role::output, DTypeRule::out, DType::f32, ah::kQDoc, ah::q_shape},
    {"dk", Role::output, DTypeRule::out, DType::f32, ah::kKDoc, ah::k_shape, nullptr,
     "summed over the query heads of each key/value head"},
    {"dv", Role::output, DTypeRule::out, DType::f32, ah::kVDoc, ah::v_shape, nullptr,
     "summed over the query heads of each key/value head"},
};
constexpr int64_t kDotLanes = 16;  // attention_bwd.kernel's DOT_LANES
}  // namespace

std::span<const ParamInfo> AttentionBwdOp::params() const { return kBwdParams; }
std::span<const ScalarInfo> AttentionBwdOp::scalars() const { return ah::kScalars; }
std::span<const DType> AttentionBwdOp::dtypes() const { return ah::kDTypes; }
std::span<const TensorDecl> AttentionBwdOp::signature() const { return kSignature; }
namespace {
bool wgmma(const KernelConfig& c) { return c.count("WGMMA") && c.at("WGMMA") != 0; }
bool mfma(const KernelConfig& c) { return c.count("MFMA") && c.at("MFMA") != 0; }
// The Hopper kernels; L2_GROUP_MIB, L2_MIN_MIB: the launch order's L2 groups
// (attention_bwd_sm90.kernel, longest_first), about L2_GROUP_MIB of streamed tiles per group once
// a launch streams more than L2_MIN_MIB (0, 0: one group).
// ATOMIC_DQ: the dK/dV kernel also computes dQ and adds it into an fp32 workspace
// (FlashAttention-3's five GEMMs per tile pair; attention_bwd_sm90.kernel), a tuning candidate
// wherever deterministic = 0 (see wants_atomic_dq for the heuristic's choice).
// KV_SPLIT 2 (with ATOMIC_DQ, an even group): two blocks per (128 keys, kv head), each over half of
// the group's query heads, adding dK and dV into an fp32 workspace (attention_bwd_sm90.kernel).
KernelConfig sm90_config(int64_t group_mib, int64_t min_mib, bool atomic_dq = false, int64_t kv_split = 1) {
  return {{"WGMMA", 1},           {"STAGES", 3},           {"THREADS", 256},     {"L2_GROUP_MIB", group_mib},
          {"L2_MIN_MIB", min_mib}, {"ATOMIC_DQ", atomic_dq}, {"KV_SPLIT", kv_split}};
}
bool atomic_dq(const KernelConfig& c) { return c.count("ATOMIC_DQ") && c.at("ATOMIC_DQ") != 0; }
int64_t kv_split(const KernelConfig& c) { return c.count("KV_SPLIT") ? c.at("KV_SPLIT") : 1; }
bool may_atomic_dq(const KernelSpec& spec) { return spec.param("deterministic") == 0; }
// The heuristic's choice (the other kernels then a tuning candidate), H200, docs/attention.md:
// - packed (thd) batches: the deterministic kernels, at head dim 128 8-15% ahead of the atomic dQ
//   (16384 tokens in six sequences, causal and not), at 64 2-17% (heads 32/4 and 64/8, causal;
//   2026-11-29; suspected, not measured: the launch order's L2 groups, which bound the dQ
//   workspace that the reductions touch at once, serve fixed-length batches only);
// - fixed-length batches at head dim 64: the atomic dQ, from 0.5% behind to 13% ahead of the
//   deterministic kernels over six rows (2026-11-28);
// - at head dim 128: the atomic dQ for MHA or unmasked batches (4% ahead on MHA s4096 causal, 8%
//   on hq32/8 s8192 without a mask); the deterministic kernels for causal GQA, where the two were
//   within 2.4% either way over six rows (geomean 0.997: a tie goes to the bitwise-reproducible
//   dq; 2026-11-29).
bool wants_atomic_dq(const KernelSpec& spec) {
  if (!may_atomic_dq(spec) || ah::thd(spec)) return false;
  if (spec.param("head_dim") == 64) return true;
  return spec.param("heads") == spec.param("kv_heads") || !ah::masked(spec);  // MHA or no mask
}
bool may_kv_split(const KernelSpec& spec) { return (spec.param("heads") / spec.param("kv_heads")) % 2 == 0; }
// The heuristic splits the groups of a causal GQA backward (KV_SPLIT 2) where the atomic dQ is the
// choice: the first key blocks of each kv head see every query of the group (without a mask the
// blocks are equal and twice as many only add the workspace's traffic; a tuning candidate there).
int64_t wanted_kv_split(const KernelSpec& spec) {
  return wants_atomic_dq(spec) && may_kv_split(spec) && spec.param("causal") != 0 ? 2 : 1;
}
// The MFMA kernels serve head dims up to 128 (both of q/k and v): K, V (or Q, dO) resident for
// 64 rows and Q, dO (or K, V) streamed for 32 keep LDS at 52 KiB at 128/128; the accumulators
// dK^T and dV^T take 128 VGPRs there. Above 128 the portable kernels serve.
bool has_mfma(const KernelSpec& spec, const TargetInfo& t) {
  return t.vendor == Vendor::amd && (t.name == "gfx942" || t.name == "gfx950") &&
         std::max(spec.param("head_dim"), ah::dim_v(spec)) <= 128;
}
bool has_wgmma(const KernelSpec& spec, const TargetInfo& t) {
  const int64_t d = spec.param("head_dim");
  return t.vendor == Vendor::nvidia && t.cpu == "sm_90a" && ah::dim_v(spec) == d && (d == 64 || d == 128);
}
// Dynamic shared memory of the Hopper kernels: 1 KiB of alignment slack, two resident tiles of
// 128 rows, STAGES pairs of streamed tiles of 64 rows, the mbarriers, and per stage the streamed
// queries' lse and D (2 x 64 fp32).
int64_t sm90_shared_bytes(const KernelSpec& spec, const KernelConfig& c) {
  const int64_t d = spec.param("head_dim"), stages = c.at("STAGES");
  // dS^T and P^T of each consumer; at head dim 128 dS^T double-buffered
  const int64_t atomic = atomic_dq(c) ? 1024 + (d == 128 ? 6 : 4) * 64 * 128 : 0;
  return 1024 + 2 * 128 * d * 2 + 2 * stages * 64 * d * 2 + 8 * (1 + 3 * stages) + stages * 2 * 64 * 4 + atomic;
}
// ATOMIC_DQ's fp32 workspace: per 64-query tile and query head 64 x head_dim; sequence b's tiles
// start at tile cu_seqlens_q[b] / 64 + b (attention_bwd_sm90.kernel), so tokens / 64 + batch + 1
// tiles hold every sequence's.
int64_t dq_workspace_tiles(const KernelSpec& call) { return ah::tokens_q(call) / 64 + call.param("batch") + 1; }
// KV_SPLIT 2's fp32 dK and dV workspace: per 128-key tile and kv head 2 x 128 x head_dim; sequence
// b's tiles start at tile cu_seqlens_k[b] / 128 + b.
int64_t dkv_workspace_tiles(const KernelSpec& call) { return ah::tokens_k(call) / 128 + call.param("batch") + 1; }
}  // namespace

// Tuning on sm_90a times the launch order's L2 groups always (the default), above 160 MiB, and never,
// of the heuristic's kernels (atomic dQ or deterministic), then with deterministic = 0 the other
// ones; with an even group, last, the atomic-dQ kernels with the KV_SPLIT that the heuristic did
// not take.
std::vector<KernelConfig> AttentionBwdOp::tuning_candidates(const KernelSpec& spec, const TargetInfo& target) const {
  if (!has_wgmma(spec, target)) return {choose_config(spec, target)};
  const bool a = wants_atomic_dq(spec);
  const int64_t split = wanted_kv_split(spec);
  std::vector<KernelConfig> c = {sm90_config(24, 0, a, split), sm90_config(24, 160, a, split),
                                 sm90_config(0, 0, a, split)};  // 24: kL2GroupMib
  if (a) c.push_back(sm90_config(24, 0));  // the deterministic kernels
  else if (may_atomic_dq(spec)) c.push_back(sm90_config(24, 0, true));  // the atomic dQ where not the choice
  if (may_atomic_dq(spec) && may_kv_split(spec)) c.push_back(sm90_config(24, 0, true, 3 - split));  // the other split
  return c;
}

std::string_view AttentionBwdOp::device_template(const KernelConfig& c) const {
  if (wgmma(c)) return embedded_file("templates/attention_bwd/attention_bwd_sm90.kernel");
  return embedded_file(mfma(c) ? "templates/attention_bwd/attention_bwd_mfma.kernel"
                               : "templates/attention_bwd/attention_bwd.kernel");
}

uint32_t AttentionBwdOp::dynamic_shared_bytes(const KernelSpec& spec, const KernelConfig& c) const {
  return wgmma(c) ? static_cast<uint32_t>(sm90_shared_bytes(spec, c)) : 0;
}

Result<void> AttentionBwdOp::validate_rules(const KernelSpec& spec, const TargetInfo&) const {
  return ah::validate_rules(name(), spec, with_defaults(spec));
}

// The portable kernels (attention_bwd.kernel): QB query rows and KB keys per tile pair, 256
// threads. 16 x 16 tiles for head dims above 128 keep Q, dO, K, V, P and dS within 48 KiB of
// static shared memory (36 KiB at 256/256; 43 KiB with 32 x 32 tiles at 128/128).
// sm_90a, head dims 64 and 128 (equal): the TMA + WGMMA kernels (attention_bwd_sm90.kernel),
// resident tiles of 128 rows, streamed tiles of 64 in a 3-stage ring (165 KiB of shared memory at
// head dim 128: the dq kernel's pipeline holds two stages while the third loads); THREADS is the D = rowsum(dO O) launch's.
// With deterministic = 0, for fixed-length batches, ATOMIC_DQ (dQ added into fp32 by the dK/dV
// kernel, then converted) at head dim 64, and at 128 for MHA or unmasked ones (wants_atomic_dq); with it, for
// a causal GQA backward with an even group, KV_SPLIT 2 (H200, 2026-11-28: 1.3-2.8% faster on the
// three causal GQA rows at head dim 64, docs/attention.md). The portable kernels follow as the
// fallback and serve every other case.
// gfx942 and gfx950, head dims up to 128: the MFMA kernels (attention_bwd_mfma.kernel), WAVES = 2
// wavefronts of 32 resident rows each, streamed tiles of 32 rows; MFMA_K 8 (gfx942's 32x32x8) or
// 16 (gfx950's 32x32x16); THREADS is the D launch's. The portable kernels follow, as in the
// forward (a tuning candidate), and serve the larger head dims.
std::vector<KernelConfig> AttentionBwdOp::variants(const KernelSpec& spec, const TargetInfo& target) const {
  const int64_t dmax = std::max(spec.param("head_dim"), ah::dim_v(spec));
  const int64_t tile = dmax <= 128 ? 32 : 16;
  KernelConfig portable = {{"QB", tile}, {"KB", tile}, {"THREADS", 256}};
  if (has_wgmma(spec, target)) return {sm90_config(24, 0, wants_atomic_dq(spec), wanted_kv_split(spec)), portable};
  if (has_mfma(spec, target))
    return {{{"MFMA", 1}, {"WAVES", 2}, {"MFMA_K", target.name == "gfx950" ? 16 : 8}, {"THREADS", 256}}, portable};
  return {portable};
}

std::string AttentionBwdOp::specialize(const KernelSpec& spec, const KernelConfig& c) const {
  if (wgmma(c))
    return ah::specialize_common(spec) +
           fmt::format("constexpr int STAGES = {}, THREADS = {}, L2_GROUP_MIB = {}, L2_MIN_MIB = {};\n"
                       "constexpr bool IN_BF16 = {}, ATOMIC_DQ = {};\nconstexpr int KV_SPLIT = {};\n",
                       c.at("STAGES"), c.at("THREADS"), c.at("L2_GROUP_MIB"), c.at("L2_MIN_MIB"),
                       spec.dtype == DType::bf16 ? "true" : "false", atomic_dq(c) ? "true" : "false", kv_split(c));
  if (mfma(c))
    return ah::specialize_common(spec) +
           fmt::format("constexpr int WAVES = {}, MFMA_K = {}, DOT_THREADS = {};\nconstexpr bool IN_BF16 = {};\n",
                       c.at("WAVES"), c.at("MFMA_K"), c.at("THREADS"), spec.dtype == DType::bf16 ? "true" : "false");
  return ah::specialize_common(spec) + fmt::format("constexpr int QB = {}, KB = {}, THREADS = {};\n", c.at("QB"),
                                                   c.at("KB"), c.at("THREADS"));
}

Plan AttentionBwdOp::plan(const KernelSpec& call, const KernelConfig& c) const {
  Plan p;
  const int64_t batch = call.param("batch"), tq = ah::tokens_q(call), tk = ah::tokens_k(call);
  const int64_t heads = call.param("heads"), threads = c.at("THREADS");
  const bool thd = ah::thd(call);
  p.workspace_bytes = static_cast<uint64_t>(std::max<int64_t>(1, heads * tq)) * 4;  // D = rowsum(dO O), fp32
  // Tensors: dout, q, k, v, out, lse, [cu_seqlens_q, cu_seqlens_k], dq, dk, dv.
  const uint32_t dq = thd ? 8 : 6, dk = dq + 1, dv = dq + 2;
  auto common = [&](Launch& l) {
    l.args = {KernelArg::tensor(0), KernelArg::tensor(1), KernelArg::tensor(2), KernelArg::tensor(3),
              KernelArg::tensor(5)};
    if (thd) l.args.insert(l.args.end(), {KernelArg::tensor(6), KernelArg::tensor(7)});
    l.geometry.block.x = static_cast<uint32_t>(mfma(c) ? 64 * c.at("WAVES") : threads);
  };
  // Rows per block of the dK/dV and dQ launches of the MFMA and portable kernels: keys, queries.
  auto rows = [&](const char* portable) { return mfma(c) ? 32 * c.at("WAVES") : c.at(portable); };
  auto tail = [&](Launch& l, int64_t blocks) {
    l.args.insert(l.args.end(), {KernelArg::workspace(0), KernelArg::i32(call.param("seqlen_q")),
                                 KernelArg::i32(call.param("seqlen_k")), KernelArg::i32(blocks), KernelArg::i32(tq),
                                 KernelArg::i32(ah::q_stride(call)), KernelArg::i32(ah::k_stride(call)),
                                 KernelArg::i32(ah::v_stride(call)), KernelArg::scalar(0)});
  };
  // ATOMIC_DQ: the dQ workspace after D's, 256-byte aligned (without it the kernels' dQ workspace
  // argument is D's, unused).
  const bool atomic = wgmma(c) && atomic_dq(c);
  const int64_t dq_offset = atomic ? (static_cast<int64_t>(p.workspace_bytes) + 255) / 256 * 256 : 0;
  const int64_t dq_words = atomic ? dq_workspace_tiles(call) * heads * 64 * call.param("head_dim") / 4 : 0;
  // KV_SPLIT 2: dK and dV's workspace right after dQ's, zeroed with it by the D launch.
  const bool split = atomic && kv_split(c) > 1;
  const int64_t dkv_offset = split ? dq_offset + 16 * dq_words : 0;
  const int64_t dkv_words =
      split ? dkv_workspace_tiles(call) * call.param("kv_heads") * 2 * 128 * call.param("head_dim") / 4 : 0;
  if (atomic) p.workspace_bytes = static_cast<uint64_t>(dq_offset + 16 * (dq_words + dkv_words));
  if (batch == 0) return p;
  const bool dkdv = tk > 0 && ah::max_len_k(call) > 0;
  if (tq > 0 || (split && dkdv)) {  // without queries, only to zero the dK/dV workspace
    Launch dot;
    dot.kernel = "kiln_attention_bwd_dot";
    dot.geometry.grid.x = static_cast<uint32_t>(std::max<int64_t>(1, ceil_div(tq * heads, threads / kDotLanes)));
    dot.geometry.block.x = static_cast<uint32_t>(threads);
    dot.args = {KernelArg::tensor(0), KernelArg::tensor(4), KernelArg::workspace(0), KernelArg::i32(tq)};
    if (wgmma(c))
      dot.args.insert(dot.args.end(), {KernelArg::workspace(dq_offset), KernelArg::i64(dq_words + dkv_words)});
    p.launches.push_back(std::move(dot));
  }
  if (wgmma(c)) {
    // dout, q, k, v as TMA tensor maps (boxes of 64 columns by 128 resident or 64 streamed rows),
    // then lse, [cu_seqlens_q, cu_seqlens_k], the outputs, the D workspace.
    auto map = [&](uint32_t t, int64_t stride, int64_t rows, uint32_t box_rows) {
      return KernelArg::tensor_map_of(TensorMapInfo{t, static_cast<uint64_t>(stride),
                                                    static_cast<uint64_t>(std::max<int64_t>(rows, 1)), 64, box_rows});
    };
    const int64_t o_stride = heads * ah::dim_v(call);
    const uint32_t q_box = 0, k_box = 1;  // which of q / k is resident (128 rows)
    auto maps = [&](Launch& l, uint32_t resident) {
      const uint32_t qb = resident == q_box ? 128 : 64, kb = resident == k_box ? 128 : 64;
      l.args = {map(0, o_stride, tq, qb), map(1, ah::q_stride(call), tq, qb), map(2, ah::k_stride(call), tk, kb),
                map(3, ah::v_stride(call), tk, kb), KernelArg::tensor(5)};
      if (thd) l.args.insert(l.args.end(), {KernelArg::tensor(6), KernelArg::tensor(7)});
      l.geometry.block.x = 384;
      l.geometry.dynamic_shared_bytes = static_cast<uint32_t>(sm90_shared_bytes(call, c));
    };
    const int64_t k_blocks = ceil_div(ah::max_len_k(call), 128);  // of the dK/dV launch and of dK/dV's workspace
    if (dkdv) {
      Launch l;
      l.kernel = "kiln_attention_bwd_dkdv";
      maps(l, k_box);
      l.args.insert(l.args.end(), {KernelArg::tensor(dk), KernelArg::tensor(dv), KernelArg::workspace(0),
                                   KernelArg::i32(call.param("seqlen_q")), KernelArg::i32(call.param("seqlen_k")),
                                   KernelArg::i32(k_blocks), KernelArg::i32(tq), KernelArg::i32(ah::k_stride(call)),
                                   KernelArg::i32(ah::v_stride(call)), KernelArg::scalar(0),
                                   KernelArg::workspace(dq_offset), KernelArg::workspace(dkv_offset)});
      l.geometry.grid.x = static_cast<uint32_t>(k_blocks * batch);
      l.geometry.grid.y = static_cast<uint32_t>(call.param("kv_heads") * (split ? 2 : 1));
      // Programmatic dependent launch: after the D launch, and the dq launch after this one (the
      // kernels' wait_prior_grid and release_dependents say what each waits for).
      l.geometry.programmatic_dependent_launch = tq > 0;
      p.launches.push_back(std::move(l));
    }
    if (split && dkdv) {  // dk and dv from the workspace, after the dK/dV launch
      Launch l;
      l.kernel = "kiln_attention_bwd_dkdv_convert";
      l.args = {KernelArg::workspace(dkv_offset)};
      if (thd) l.args.insert(l.args.end(), {KernelArg::tensor(6), KernelArg::tensor(7)});
      l.args.insert(l.args.end(), {KernelArg::tensor(dk), KernelArg::tensor(dv), KernelArg::i32(call.param("seqlen_q")),
                                   KernelArg::i32(call.param("seqlen_k")), KernelArg::i32(k_blocks),
                                   KernelArg::i32(ah::k_stride(call)), KernelArg::i32(ah::v_stride(call))});
      l.geometry.grid.x = static_cast<uint32_t>(k_blocks * batch);
      l.geometry.grid.y = static_cast<uint32_t>(call.param("kv_heads"));
      l.geometry.block.x = 256;
      p.launches.push_back(std::move(l));
    }
    if (atomic && tq > 0 && ah::max_len_q(call) > 0) {  // dq from the workspace, after the dK/dV launch
      const int64_t q_tiles = ceil_div(ah::max_len_q(call), 64);
      Launch l;
      l.kernel = "kiln_attention_bwd_dq_convert";
      l.args = {KernelArg::workspace(dq_offset)};
      if (thd) l.args.insert(l.args.end(), {KernelArg::tensor(6), KernelArg::tensor(7)});
      l.args.insert(l.args.end(), {KernelArg::tensor(dq), KernelArg::i32(call.param("seqlen_q")),
                                   KernelArg::i32(call.param("seqlen_k")), KernelArg::i32(q_tiles),
                                   KernelArg::i32(ah::q_stride(call))});
      l.geometry.grid.x = static_cast<uint32_t>(q_tiles * batch);
      l.geometry.grid.y = static_cast<uint32_t>(heads);
      l.geometry.block.x = 128;
      p.launches.push_back(std::move(l));
    } else if (tq > 0 && ah::max_len_q(call) > 0) {
      const int64_t q_blocks = ceil_div(ah::max_len_q(call), 128);
      Launch l;
      l.kernel = "kiln_attention_bwd_dq";
      maps(l, q_box);
      l.args.insert(l.args.end(), {KernelArg::tensor(dq), KernelArg::workspace(0),
                                   KernelArg::i32(call.param("seqlen_q")), KernelArg::i32(call.param("seqlen_k")),
                                   KernelArg::i32(q_blocks), KernelArg::i32(tq), KernelArg::i32(ah::q_stride(call)),
                                   KernelArg::scalar(0)});
      l.geometry.grid.x = static_cast<uint32_t>(q_blocks * batch);
      l.geometry.grid.y = static_cast<uint32_t>(heads);
      // Beside the dK/dV launch's last blocks, only when that launch is there: its blocks waited
      // for D (after the D launch alone, this launch must start after it).
      l.geometry.programmatic_dependent_launch = dkdv;
      p.launches.push_back(std::move(l));
    }
    return p;
  }
  if (tk > 0 && ah::max_len_k(call) > 0) {  // every key row gets dk, dv (0 where no query sees it)
    const int64_t k_blocks = ceil_div(ah::max_len_k(call), rows("KB"));
    Launch l;
    l.kernel = "kiln_attention_bwd_dkdv";
    common(l);
    l.args.insert(l.args.end(), {KernelArg::tensor(dk), KernelArg::tensor(dv)});
    tail(l, k_blocks);
    l.geometry.grid.x = static_cast<uint32_t>(k_blocks * batch);
    l.geometry.grid.y = static_cast<uint32_t>(call.param("kv_heads"));
    p.launches.push_back(std::move(l));
  }
  if (tq > 0 && ah::max_len_q(call) > 0) {
    const int64_t q_blocks = ceil_div(ah::max_len_q(call), rows("QB"));
    Launch l;
    l.kernel = "kiln_attention_bwd_dq";
    common(l);
    l.args.push_back(KernelArg::tensor(dq));
    tail(l, q_blocks);
    l.geometry.grid.x = static_cast<uint32_t>(q_blocks * batch);
    l.geometry.grid.y = static_cast<uint32_t>(heads);
    p.launches.push_back(std::move(l));
  }
  return p;
}

std::vector<uint32_t> AttentionBwdOp::base_alignment(const KernelSpec& spec, const KernelConfig&) const {
  return ah::alignment(tensors(spec));
}

// dout, q, k, v random; out and lse from q, k, v by the fp64 forward (out rounded to the dtype,
// lse to fp32). A row that sees no key keeps a random out (the backward never reads it: P = 0)
// and gets lse = -inf.
// Above kExactWork multiply-adds that forward would keep the host busy for minutes to hours (the
// tuner's inputs at model sizes: Runtime::tune, bench_attention --tune), so there out stays
// random and lse is an upper bound of the row's scores instead, scale |q_i| max_j |k_j| (at most
// the softcap): P = exp(S - lse) then lies in (0, 1] as in real use, but its rows do not sum to
// 1. The backward's reference follows whatever lse and out it is given, so a check still holds;
// such sizes are for timing.
// out and lse come from the forward at the launch's softmax_scale (init_inputs_with_scalars; the
// default scale for init_inputs): with any other scale they would not be a forward's, and with a
// negative one P = exp(S - lse) would overflow.
void AttentionBwdOp::init_inputs(const KernelSpec& spec, std::span<const TensorInfo> inputs,
                                 std::vector<std::vector<float>>& values, std::mt19937_64& rng) const {
  init_inputs_with_scalars(spec, {}, inputs, values, rng);
}

void AttentionBwdOp::init_inputs_with_scalars(const KernelSpec& spec, const Scalars& scalars,
                                              std::span<const TensorInfo> inputs,
                                              std::vector<std::vector<float>>& values, std::mt19937_64& rng) const {
  const double scale = ah::softmax_scale(spec, scalar(scalars, "softmax_scale"));
  ah::init_qkv(spec, inputs, values, rng);
  constexpr double kExactWork = 4e9;
  const int64_t d = spec.param("head_dim"), heads = spec.param("heads"), kv_heads = spec.param("kv_heads");
  if (ah::pairs(spec) * static_cast<double>(heads) * static_cast<double>(d + ah::dim_v(spec)) > kExactWork) {
    const int64_t tq = ah::tokens_q(spec), tk = ah::tokens_k(spec), qs = ah::q_stride(spec), ks = ah::k_stride(spec);
    auto norm = [d](const float* x) {
      double n = 0;
      for (int64_t c = 0; c < d; ++c) n += double(x[c]) * x[c];
      return std::sqrt(n);
    };
    std::vector<double> kmax(static_cast<size_t>(kv_heads), 0.0);
    for (int64_t u = 0; u < tk; ++u)
      for (int64_t hk = 0; hk < kv_heads; ++hk)
        kmax[size_t(hk)] = std::max(kmax[size_t(hk)], norm(&values[2][size_t(u * ks + hk * d)]));
    const double cap = static_cast<double>(spec.param("softcap"));
    for (int64_t t = 0; t < tq; ++t)
      for (int64_t h = 0; h < heads; ++h) {
        double bound = std::abs(scale) * norm(&values[1][size_t(t * qs + h * d)]) * kmax[size_t(h / (heads / kv_heads))];
        if (cap > 0) bound = std::min(bound, cap);
        values[5][size_t(h * tq + t)] = static_cast<float>(bound);
      }
    return;
  }
  std::vector<double> out, lse;
  ah::forward(spec, scale, values[1], values[2], values[3],
              ah::input(values, inputs, "cu_seqlens_q"), ah::input(values, inputs, "cu_seqlens_k"), out, lse);
  const int64_t per_row = ah::dim_v(spec), tq = ah::tokens_q(spec);
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t t = 0; t < tq; ++t) {
      const size_t li = static_cast<size_t>(h * tq + t);
      values[5][li] = static_cast<float>(lse[li]);
      if (std::isinf(lse[li])) continue;
      for (int64_t c = 0; c < per_row; ++c) {
        const size_t oi = static_cast<size_t>((t * heads + h) * per_row + c);
        float x = round_to_dtype(static_cast<float>(out[oi]), inputs[4].dtype);
        values[4][oi] = x != 0.0f ? x : round_to_dtype(1e-3f, inputs[4].dtype);  // never exactly zero
      }
    }
}

// fp64: P = exp(S - lse) from the lse input, D from the out input, as the op defines them. dq by
// query rows, then dk and dv by key rows (S and dP computed in both), on every core
// (ah::for_each_ref_item), each element summed in the order of the one-pass loop (keys for dq;
// query heads, then queries for dk and dv). With `rows` (a sample of N = max(tokens_q, tokens_k)
// rows), only the token rows r tokens_q / N of dq and r tokens_k / N of dk and dv, each of them
// whole and summed as above (bitwise the full reference's values there), reported as elements:
// a row of dk costs a pass over the queries, so a sample of 256 rows at 8192 tokens costs about
// 1/32 of the whole.
void AttentionBwdOp::reference(const KernelSpec& s, const Scalars& scalars, std::span<const std::vector<float>> in,
                               std::span<const int64_t> rows, std::vector<RefOutput>& outputs) const {
  const auto ts = tensors(s);
  const auto dout = ah::input(in, ts, "dout"), q = ah::input(in, ts, "q"), k = ah::input(in, ts, "k"),
             v = ah::input(in, ts, "v"), out = ah::input(in, ts, "out"), lse = ah::input(in, ts, "lse"),
             cu_q = ah::input(in, ts, "cu_seqlens_q"), cu_k = ah::input(in, ts, "cu_seqlens_k");
  const double scale = ah::softmax_scale(s, scalar(scalars, "softmax_scale"));
  const double cap = static_cast<double>(s.param("softcap"));
  const int64_t H = s.param("heads"), Hkv = s.param("kv_heads"), D = s.param("head_dim"), Dv = ah::dim_v(s);
  const int64_t Tq = ah::tokens_q(s), Tk = ah::tokens_k(s), group = H / Hkv;
  const int64_t qs = ah::q_stride(s), ks = ah::k_stride(s), vs = ah::v_stride(s);
  // D = rowsum(dout * out) [heads, tokens_q], every row (dk's rows need every query's).
  std::vector<double> dd(static_cast<size_t>(H * Tq), 0.0);
  parallel_for(static_cast<size_t>(Tq), 256, [&](size_t begin, size_t end) {
    for (size_t t = begin; t < end; ++t)
      for (int64_t h = 0; h < H; ++h) {
        const float* doi = &dout[(t * static_cast<size_t>(H) + static_cast<size_t>(h)) * static_cast<size_t>(Dv)];
        const float* oi = &out[(t * static_cast<size_t>(H) + static_cast<size_t>(h)) * static_cast<size_t>(Dv)];
        double sum = 0;
        for (int64_t c = 0; c < Dv; ++c) sum += double(doi[c]) * oi[c];
        dd[static_cast<size_t>(h * Tq) + t] = sum;
      }
  });
  auto no_key = [&](int64_t t, int64_t h) { return std::isinf(lse[static_cast<size_t>(h * Tq + t)]); };
  // p = P and ds = dS of query token t of head h and key token u.
  auto pair = [&](int64_t t, int64_t h, int64_t u, double& p, double& ds) {
    const int64_t hk = h / group;
    const float* qi = &q[static_cast<size_t>(t * qs + h * D)];
    const float* doi = &dout[static_cast<size_t>((t * H + h) * Dv)];
    const float* kj = &k[static_cast<size_t>(u * ks + hk * D)];
    const float* vj = &v[static_cast<size_t>(u * vs + hk * Dv)];
    double dot = 0, dp = 0;
    for (int64_t c = 0; c < D; ++c) dot += double(qi[c]) * kj[c];
    for (int64_t c = 0; c < Dv; ++c) dp += double(doi[c]) * vj[c];
    double x = dot * scale, dcap = 1.0;
    if (cap > 0) {
      const double th = std::tanh(x / cap);
      x = cap * th;
      dcap = 1.0 - th * th;
    }
    p = std::exp(x - static_cast<double>(lse[static_cast<size_t>(h * Tq + t)]));
    ds = p * (dp - dd[static_cast<size_t>(h * Tq + t)]) * dcap * scale;
  };
  // dq of query row i of sequence sq and head h, added into row [D] (zeros).
  auto dq_row = [&](const ah::Seq& sq, int64_t h, int64_t i, double* row) {
    const int64_t t = sq.q0 + i, hk = h / group;
    if (no_key(t, h)) return;
    for (int64_t j = 0; j < sq.lk; ++j) {
      if (!ah::visible(s, i, j, sq.lq, sq.lk)) continue;
      const int64_t u = sq.k0 + j;
      double p, ds;
      pair(t, h, u, p, ds);
      const float* kj = &k[static_cast<size_t>(u * ks + hk * D)];
      for (int64_t c = 0; c < D; ++c) row[c] += ds * kj[c];
    }
  };
  // dk and dv of key row j of sequence sq and kv head hk, added into dk_row [D] and dv_row [Dv].
  auto dkdv_row = [&](const ah::Seq& sq, int64_t hk, int64_t j, double* dk_row, double* dv_row) {
    const int64_t u = sq.k0 + j;
    for (int64_t h = hk * group; h < (hk + 1) * group; ++h)
      for (int64_t i = 0; i < sq.lq; ++i) {
        const int64_t t = sq.q0 + i;
        if (!ah::visible(s, i, j, sq.lq, sq.lk) || no_key(t, h)) continue;
        double p, ds;
        pair(t, h, u, p, ds);
        const float* qi = &q[static_cast<size_t>(t * qs + h * D)];
        const float* doi = &dout[static_cast<size_t>((t * H + h) * Dv)];
        for (int64_t c = 0; c < Dv; ++c) dv_row[c] += p * doi[c];
        for (int64_t c = 0; c < D; ++c) dk_row[c] += ds * qi[c];
      }
  };
  outputs.assign(3, {});
  if (!rows.empty()) {
    const int64_t n = sample_dimension(s);
    const std::vector<int64_t> tq = ah::sampled_tokens(rows, n, Tq), tk = ah::sampled_tokens(rows, n, Tk);
    const double nan = std::numeric_limits<double>::quiet_NaN();
    // dq, dk, dv have q, k, v's row strides; columns past the heads stay unwritten (NaN here).
    ah::token_rows(tq, qs, outputs[0], [&](size_t m, double* row) {
      std::fill(row, row + qs, nan);
      std::fill(row, row + H * D, 0.0);
      ah::Seq sq;
      int64_t i;
      if (ah::locate(s, cu_q, cu_k, tq[m], false, sq, i))
        for (int64_t h = 0; h < H; ++h) dq_row(sq, h, i, row + h * D);
    });
    // dk's and dv's rows in one pass (they share S and dP), then each output's elements.
    std::vector<double> dkv(tk.size() * static_cast<size_t>(Hkv * (D + Dv)), 0.0);
    parallel_for(tk.size(), 1, [&](size_t begin, size_t end) {
      for (size_t m = begin; m < end; ++m) {
        ah::Seq sq;
        int64_t j;
        if (!ah::locate(s, cu_q, cu_k, tk[m], true, sq, j)) continue;
        double* dk_row = &dkv[m * static_cast<size_t>(Hkv * (D + Dv))];
        for (int64_t hk = 0; hk < Hkv; ++hk) dkdv_row(sq, hk, j, dk_row + hk * D, dk_row + Hkv * D + hk * Dv);
      }
    });
    auto place = [&](RefOutput& o, int64_t stride, int64_t used, int64_t offset) {
      ah::token_rows(tk, stride, o, [&](size_t m, double* row) {
        std::fill(row, row + stride, nan);
        std::copy_n(&dkv[m * static_cast<size_t>(Hkv * (D + Dv)) + static_cast<size_t>(offset)], used, row);
      });
    };
    place(outputs[1], ks, Hkv * D, 0);
    place(outputs[2], vs, Hkv * Dv, Hkv * D);
    return;
  }
  std::vector<double>&dq = outputs[0].values, &dk = outputs[1].values, &dv = outputs[2].values;
  // dq, dk, dv have q, k, v's row strides; columns past the heads stay unwritten (NaN here).
  dq = ah::strided_zeros(Tq, qs, H * D);
  dk = ah::strided_zeros(Tk, ks, Hkv * D);
  dv = ah::strided_zeros(Tk, vs, Hkv * Dv);
  ah::for_each_ref_item(ah::ref_items(s, cu_q, cu_k, H, false), 0, [&](const ah::RefItem& it, std::vector<double>&) {
    for (int64_t i = it.r0; i < it.r1; ++i) dq_row(it.seq, it.h, i, &dq[static_cast<size_t>((it.seq.q0 + i) * qs + it.h * D)]);
  });
  ah::for_each_ref_item(ah::ref_items(s, cu_q, cu_k, Hkv, true), 0, [&](const ah::RefItem& it, std::vector<double>&) {
    for (int64_t j = it.r0; j < it.r1; ++j) {
      const int64_t u = it.seq.k0 + j;
      dkdv_row(it.seq, it.h, j, &dk[static_cast<size_t>(u * ks + it.h * D)], &dv[static_cast<size_t>(u * vs + it.h * Dv)]);
    }
  });
}

// Samples are of tokens (bshd: batch x seqlen), of both sides: row r of N = max(tokens_q,
// tokens_k) is query token r tokens_q / N and key token r tokens_k / N.
int64_t AttentionBwdOp::sample_dimension(const KernelSpec& spec) const {
  return std::max(ah::tokens_q(spec), ah::tokens_k(spec));
}

Gate AttentionBwdOp::gate(const KernelSpec&, const TensorInfo&) const {
  Gate g;  // BENCHMARKS.md: attention dq, dk, dv SNR > 40 dB
  g.kind = Gate::Kind::snr;
  g.min_snr_db = 40;
  return g;
}

// 2.5 x the forward's FLOPs (BENCHMARKS.md's count for the backward; thd as the forward's).
double AttentionBwdOp::flops(const KernelSpec& spec) const {
  const double per_pair = 2.0 * static_cast<double>(spec.param("head_dim") + ah::dim_v(spec));
  const double pairs = ah::pairs(spec) * static_cast<double>(spec.param("heads"));
  return 2.5 * per_pair * pairs * (spec.param("causal") ? 0.5 : 1.0);
}

std::vector<TestSpec> AttentionBwdOp::test_specs(const TargetInfo&) const { return ah::test_specs(name(), true); }

}  // namespace kiln
