#include "templates/attention/attention.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "support/embedded.h"
#include "templates/lib/attention_params.h"

namespace kiln {
namespace {
namespace ah = attention_params;

bool is_thd(const KernelSpec& s) { return ah::thd(s); }
const TensorDecl kSignature[] = {
    {"q", Role::input, DTypeRule::in, DType::f32, ah::kQDoc, ah::q_shape},
    {"k", Role::input, DTypeRule::in, DType::f32, ah::kKDoc, ah::k_shape},
    {"v", Role::input, DTypeRule::in, DType::f32, ah::kVDoc, ah::v_shape},
    {"cu_seqlens_q", Role::input, DTypeRule::fixed, DType::i32, "[batch + 1]", ah::cu_shape, is_thd,
     "thd: sequence b's queries are rows cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1 of q"},
    {"cu_seqlens_k", Role::input, DTypeRule::fixed, DType::i32, "[batch + 1]", ah::cu_shape, is_thd,
     "thd: sequence b's keys are rows cu_seqlens_k[b] .. cu_seqlens_k[b + 1] - 1 of k and v"},
    {"out", Role::output, DTypeRule::out, DType::f32, ah::kODoc, ah::o_shape},
    {"lse", Role::output, DTypeRule::fixed, DType::f32, ah::kLseDoc, ah::lse_shape, nullptr,
     "log-sum-exp of each row's scores (natural log), for the backward; -inf where a row sees no key"},
};
}  // namespace

std::span<const ParamInfo> AttentionOp::params() const { return ah::kParams; }
std::span<const ScalarInfo> AttentionOp::scalars() const { return ah::kScalars; }
std::span<const DType> AttentionOp::dtypes() const { return ah::kDTypes; }
std::span<const TensorDecl> AttentionOp::signature() const { return kSignature; }

Result<void> AttentionOp::validate_rules(const KernelSpec& spec, const TargetInfo&) const {
  return ah::validate_rules(name(), spec, with_defaults(spec));
}

// Three kernels:
//  - Hopper (attention_sm90.kernel, sm_90a; head_dim == head_dim_v, 64 or 128): FlashAttention-3's
//    structure, TMA + WGMMA, a producer warpgroup and two consumer warpgroups of 64 query rows,
//    128-key blocks in a STAGES-deep ring (3 at head dim 128: 225 KiB of shared memory; 4 at 64),
//    the softmax of one block overlapped with the GEMMs of the next.
//    TMA needs 16-byte row strides and bases, which the op requires of every layout anyway.
//  - portable (attention.kernel, every target): BM query rows of one head per block, key/value
//    tiles of BN rows through LDS, THREADS threads (THREADS / BM per query row). BM = 16 for head
//    dims above 128 keeps Q, K, V and P within 48 KiB of static shared memory (44 KiB at 256/256).
//  - MFMA (attention_mfma.kernel, gfx942 and gfx950): WAVES wavefronts of 32 query rows each,
//    32-key tiles; 2 waves up to head dim 128 (45 KiB of LDS at 128/128), 1 above (55 KiB at
//    256/256, within gfx942's 64 KiB). MFMA_K 8 (gfx942's 32x32x8) or 16 (gfx950's 32x32x16).
// The first variant of a target is its kernel; the portable one follows on AMD (same alignment,
// so it serves as a tuning candidate, not as a fallback).
namespace {
bool mfma(const KernelConfig& c) { return c.count("MFMA") && c.at("MFMA") != 0; }
bool wgmma(const KernelConfig& c) { return c.count("WGMMA") && c.at("WGMMA") != 0; }
// Consumer warpgroups of the Hopper kernel (64 query rows each): 2, or 3 at head dim 64.
int64_t consumers(const KernelConfig& c) { return c.count("CONSUMERS") ? c.at("CONSUMERS") : 2; }
int64_t block_rows(const KernelConfig& c) {
  return wgmma(c) ? 64 * consumers(c) : mfma(c) ? 32 * c.at("WAVES") : c.at("BM");
}
int64_t block_threads(const KernelConfig& c) {
  return wgmma(c) ? 128 * (1 + consumers(c)) : mfma(c) ? 64 * c.at("WAVES") : c.at("THREADS");
}
// Keys per block of the Hopper kernel: 128, or 176 (FlashAttention-3's block at head dim 128
// without a mask; two stages then fit).
int64_t sm90_keys(const KernelConfig& c) { return c.count("BN") ? c.at("BN") : 128; }
// Dynamic shared memory of the Hopper kernel: 1 KiB of alignment slack, Q (128 rows), STAGES K
// and V tiles of BN keys, the mbarriers.
int64_t sm90_shared_bytes(const KernelSpec& spec, const KernelConfig& c) {
  const int64_t d = spec.param("head_dim");
  return 1024 + block_rows(c) * d * 2 + 2 * c.at("STAGES") * sm90_keys(c) * d * 2 + 8 * (2 + 4 * c.at("STAGES"));
}
// PINGPONG: the consumer warpgroups take turns on the tensor cores (FlashAttention-3). STAGES: the
// K/V ring's depth, 3 at head dim 128 (225 KiB of shared memory, under the 227 KiB a block may opt
// in to), 4 at 64. PERSISTENT: at most one block per SM, each taking every grid-th non-empty work
// item (else every item gets a block; the kernel orders the items differently, see its tile_of
// and next_item). CONSUMERS: 64-row consumer warpgroups, 2 (240 registers each) or, at head dim
// 64, 3 (160 registers; 192-row blocks, as FlashAttention-3 uses there). Measured with
// bench_attention --quick (--tune), H100 and H200, 2026-11-26, causal, after the WGMMA
// serialization fix: at head dim 128 three stages beat two by 4-7% on dense batches, ping-pong
// lost 0-5%, and persistence won up to 12% on 7 of the 8 dense rows (lost 3% on one) and 6% on the
// packed varlen batch; at 64 ping-pong won 16%, persistence lost 4-8%, and three consumers won
// 0-7% at seq 4096 and 7% at 8192. The others stay tuning candidates.
// SNAKE and L2_MIN_MIB: the persistent item order (attention_sm90.kernel, next_item and kv_group):
// alternate the direction of each round of items, and group the (sequence, kv head) pairs for L2
// once the launch's K and V exceed L2_MIN_MIB: 160 under a mask or for packed batches, whose items
// differ in length, 0 (always) for dense batches without a mask, whose items are all alike.
using ah::masked;
int64_t l2_min_mib(const KernelSpec& spec) { return masked(spec) || ah::thd(spec) ? 160 : 0; }
KernelConfig sm90_config(const KernelSpec& spec, bool pingpong, int64_t stages, bool persistent, int64_t consumers = 2,
                         bool snake = true) {
  KernelConfig c = {{"WGMMA", 1}, {"STAGES", stages}, {"PINGPONG", pingpong ? 1 : 0}, {"PERSISTENT", persistent ? 1 : 0}};
  if (consumers != 2) c["CONSUMERS"] = consumers;  // absent: 2 (the configurations tuned before it existed)
  if (persistent) {
    c["SNAKE"] = snake ? 1 : 0;
    c["L2_MIN_MIB"] = l2_min_mib(spec);
  }
  return c;
}
// Packed batches without a mask take a block per item: on the bench's varlen batch (H100,
// 2026-11-27, bench_attention --tune) 1.931 ms against 1.991 persistent (1.943 persistent with L2
// groups always); with a causal mask persistence stays ahead (1.060 against 1.195).
KernelConfig sm90_default(const KernelSpec& spec) {
  const bool d64 = spec.param("head_dim") == 64;
  return sm90_config(spec, d64, d64 ? 4 : 3, !d64 && !(ah::thd(spec) && !masked(spec)), d64 ? 3 : 2);
}
bool has_wgmma(const KernelSpec& spec, const TargetInfo& t) {
  const int64_t d = spec.param("head_dim");
  return t.vendor == Vendor::nvidia && t.cpu == "sm_90a" && ah::dim_v(spec) == d && (d == 64 || d == 128);
}
KernelConfig portable_config(const KernelSpec& spec) {
  const int64_t dmax = std::max(spec.param("head_dim"), ah::dim_v(spec));
  return {{"BM", dmax <= 128 ? 32 : 16}, {"BN", 32}, {"THREADS", 128}};
}
bool has_mfma(const TargetInfo& t) { return t.vendor == Vendor::amd && (t.name == "gfx942" || t.name == "gfx950"); }
}  // namespace

std::vector<KernelConfig> AttentionOp::variants(const KernelSpec& spec, const TargetInfo& target) const {
  if (has_wgmma(spec, target)) {
    const KernelConfig d = sm90_default(spec);
    return {d, sm90_config(spec, !d.at("PINGPONG"), d.at("STAGES"), d.at("PERSISTENT")), portable_config(spec)};
  }
  if (!has_mfma(target)) return {portable_config(spec)};
  const int64_t dmax = std::max(spec.param("head_dim"), ah::dim_v(spec));
  return {{{"MFMA", 1}, {"WAVES", dmax <= 128 ? 2 : 1}, {"BN", 32}, {"MFMA_K", target.name == "gfx950" ? 16 : 8}},
          portable_config(spec)};
}

std::string_view AttentionOp::device_template(const KernelConfig& c) const {
  if (wgmma(c)) return embedded_file("templates/attention/attention_sm90.kernel");
  return embedded_file(mfma(c) ? "templates/attention/attention_mfma.kernel" : "templates/attention/attention.kernel");
}

std::string AttentionOp::specialize(const KernelSpec& spec, const KernelConfig& c) const {
  if (wgmma(c))
    return ah::specialize_common(spec) +
           fmt::format("constexpr int BM = {}, BN = {}, STAGES = {}, CONSUMERS = {};\n"
                       "constexpr bool IN_BF16 = {}, PINGPONG = {}, PERSISTENT = {}, SNAKE = {};\n"
                       "constexpr int L2_MIN_MIB = {};\n",
                       block_rows(c), sm90_keys(c), c.at("STAGES"), consumers(c), spec.dtype == DType::bf16 ? "true" : "false",
                       c.at("PINGPONG") ? "true" : "false",
                       c.count("PERSISTENT") && c.at("PERSISTENT") ? "true" : "false",
                       c.count("SNAKE") && c.at("SNAKE") ? "true" : "false",
                       c.count("L2_MIN_MIB") ? c.at("L2_MIN_MIB") : 160);
  if (mfma(c))
    return ah::specialize_common(spec) +
           fmt::format("constexpr int WAVES = {}, BN = {}, MFMA_K = {};\nconstexpr bool IN_BF16 = {};\n", c.at("WAVES"),
                       c.at("BN"), c.at("MFMA_K"), spec.dtype == DType::bf16 ? "true" : "false");
  return ah::specialize_common(spec) + fmt::format("constexpr int BM = {}, BN = {}, THREADS = {};\n", c.at("BM"),
                                                   c.at("BN"), c.at("THREADS"));
}

Plan AttentionOp::plan(const KernelSpec& call, const KernelConfig& c) const {
  Plan p;
  const int64_t batch = call.param("batch"), max_q = ah::max_len_q(call);
  if (batch == 0 || max_q == 0 || ah::tokens_q(call) == 0) return p;  // no query rows: nothing to write
  const int64_t q_blocks = ceil_div(max_q, block_rows(c));
  Launch l;
  l.kernel = "kiln_attention_fwd";
  l.geometry.grid.x = static_cast<uint32_t>(q_blocks * batch);
  l.geometry.grid.y = static_cast<uint32_t>(call.param("heads"));
  l.geometry.block.x = static_cast<uint32_t>(block_threads(c));
  const bool thd = ah::thd(call);
  const uint32_t out = thd ? 5 : 3;
  // Tensors: q, k, v, [cu_seqlens_q, cu_seqlens_k], out, lse.
  if (wgmma(c)) {
    // q, k, v as TMA tensor maps: rows of the full row stride, boxes of 64 columns (one head's
    // 64-column chunk) by the block's query rows (q) or BN keys (k, v). An empty tensor gets one
    // row: no box of it is ever loaded.
    auto map = [&](uint32_t t, int64_t stride, int64_t rows, int64_t box_rows) {
      return KernelArg::tensor_map_of(TensorMapInfo{t, static_cast<uint64_t>(stride),
                                                    static_cast<uint64_t>(std::max<int64_t>(rows, 1)), 64,
                                                    static_cast<uint32_t>(box_rows)});
    };
    l.args = {map(0, ah::q_stride(call), ah::tokens_q(call), block_rows(c)),
              map(1, ah::k_stride(call), ah::tokens_k(call), sm90_keys(c)),
              map(2, ah::v_stride(call), ah::tokens_k(call), sm90_keys(c))};
    if (thd) l.args.insert(l.args.end(), {KernelArg::tensor(3), KernelArg::tensor(4)});
    // seqlen_k: with thd the longest key sequence (the persistent item order's L2 budget).
    l.args.insert(l.args.end(), {KernelArg::tensor(out), KernelArg::tensor(out + 1), KernelArg::i32(call.param("seqlen_q")),
                                 KernelArg::i32(ah::max_len_k(call)), KernelArg::i32(q_blocks), KernelArg::i32(batch),
                                 KernelArg::i32(ah::tokens_q(call)), KernelArg::scalar(0)});
    l.geometry.dynamic_shared_bytes = static_cast<uint32_t>(sm90_shared_bytes(call, c));
    // Persistent: grid.x counts the work items (query blocks x sequences x heads); the launch caps
    // it at one block per SM, and the blocks stride over the items.
    l.geometry.grid.x = static_cast<uint32_t>(std::min<int64_t>(q_blocks * batch * call.param("heads"), INT32_MAX));
    l.geometry.grid.y = 1;
    l.geometry.persistent = c.count("PERSISTENT") && c.at("PERSISTENT") != 0;
    p.launches.push_back(std::move(l));
    return p;
  }
  l.args = {KernelArg::tensor(0), KernelArg::tensor(1), KernelArg::tensor(2)};
  if (thd) l.args.insert(l.args.end(), {KernelArg::tensor(3), KernelArg::tensor(4)});
  l.args.insert(l.args.end(), {KernelArg::tensor(out), KernelArg::tensor(out + 1), KernelArg::i32(call.param("seqlen_q")),
                               KernelArg::i32(call.param("seqlen_k")), KernelArg::i32(q_blocks),
                               KernelArg::i32(ah::tokens_q(call)), KernelArg::i32(ah::q_stride(call)),
                               KernelArg::i32(ah::k_stride(call)), KernelArg::i32(ah::v_stride(call)),
                               KernelArg::scalar(0)});
  p.launches.push_back(std::move(l));
  return p;
}

// Tuning on sm_90a times the Hopper kernel's default against it with the other persistence, the other
// ping-pong, and two stages (head dim 128) or two consumers (64); at head dim 128 without a mask
// also 176-key blocks in two stages (FlashAttention-3's tile there), persistent and not. As the
// default they won 1.8-3.2% at seqlen 8192 batch 1 and lost 1.2-3.5% at 4096 batch 2 and 4 (the
// last block of 4096 keys holds 48 of 176; H200, 2026-11-28, bench_attention, two rounds each,
// bench/results/h200-2026-11-28-session20/): a candidate, not the default.
std::vector<KernelConfig> AttentionOp::tuning_candidates(const KernelSpec& spec, const TargetInfo& target) const {
  if (!has_wgmma(spec, target)) return {choose_config(spec, target)};
  const KernelConfig d = sm90_default(spec);
  const bool pingpong = d.at("PINGPONG") != 0, persistent = d.at("PERSISTENT") != 0;
  const int64_t stages = d.at("STAGES");
  const int64_t n = consumers(d);
  std::vector<KernelConfig> c = {d, sm90_config(spec, pingpong, stages, !persistent, n),
                                 sm90_config(spec, !pingpong, stages, persistent, n)};
  if (stages == 3) c.push_back(sm90_config(spec, pingpong, 2, persistent));
  if (consumers(d) == 3) c.push_back(sm90_config(spec, pingpong, stages, persistent, 2));
  if (spec.param("head_dim") == 128 && !masked(spec))  // 176-key blocks (two stages), with and without persistence
    for (bool p : {true, false}) {
      KernelConfig k = sm90_config(spec, pingpong, 2, p, n);
      k["BN"] = 176;
      c.push_back(k);
    }
  if (persistent) {  // the item order: a plain stride, and the other L2 threshold
    c.push_back(sm90_config(spec, pingpong, stages, persistent, n, false));
    KernelConfig other = d;
    other["L2_MIN_MIB"] = d.at("L2_MIN_MIB") == 0 ? 160 : 0;
    c.push_back(other);
  }
  return c;
}

uint32_t AttentionOp::dynamic_shared_bytes(const KernelSpec& spec, const KernelConfig& c) const {
  return wgmma(c) ? static_cast<uint32_t>(sm90_shared_bytes(spec, c)) : 0;
}

// q, k, v and out are read and written 16 bytes at a time (and by TMA on Hopper).
std::vector<uint32_t> AttentionOp::base_alignment(const KernelSpec& spec, const KernelConfig&) const {
  return ah::alignment(tensors(spec));
}

void AttentionOp::init_inputs(const KernelSpec& spec, std::span<const TensorInfo> inputs,
                              std::vector<std::vector<float>>& values, std::mt19937_64& rng) const {
  ah::init_qkv(spec, inputs, values, rng);
}

// Every row, or with `rows` (a sample of the query tokens, sample_dimension) those tokens' rows of
// out and their lse entries, every head (the same values as the whole reference's there).
void AttentionOp::reference(const KernelSpec& spec, const Scalars& scalars, std::span<const std::vector<float>> in,
                            std::span<const int64_t> rows, std::vector<RefOutput>& outputs) const {
  const auto ts = tensors(spec);
  const double scale = ah::softmax_scale(spec, scalar(scalars, "softmax_scale"));
  const auto q = ah::input(in, ts, "q"), k = ah::input(in, ts, "k"), v = ah::input(in, ts, "v"),
             cu_q = ah::input(in, ts, "cu_seqlens_q"), cu_k = ah::input(in, ts, "cu_seqlens_k");
  outputs.assign(2, {});
  if (!rows.empty()) {
    const std::vector<int64_t> tokens = ah::sampled_tokens(rows, sample_dimension(spec), ah::tokens_q(spec));
    ah::forward_tokens(spec, scale, q, k, v, cu_q, cu_k, tokens, outputs[0], outputs[1]);
    return;
  }
  ah::forward(spec, scale, q, k, v, cu_q, cu_k, outputs[0].values, outputs[1].values);
}

// Samples are of query tokens (bshd: batch x seqlen_q; the tensors' first dimension is the batch).
int64_t AttentionOp::sample_dimension(const KernelSpec& spec) const { return ah::tokens_q(spec); }

Gate AttentionOp::gate(const KernelSpec&, const TensorInfo& output) const {
  Gate g;
  if (output.name == "lse") {  // BENCHMARKS.md: lse to 1e-4 relative
    g.kind = Gate::Kind::tolerance;
    g.atol = 1e-4;
    g.rtol = 1e-4;
    g.max_rel_fro = 1e-4;
    return g;
  }
  g.kind = Gate::Kind::snr;  // BENCHMARKS.md: attention out, dq, dk, dv SNR > 40 dB
  g.min_snr_db = 40;
  return g;
}

// 2 x (D + Dv) per visible (query, key) pair and head; causal halves a square: BENCHMARKS.md's
// 4 B Hq S^2 D (/ 2). thd: the pairs the spec's totals and longest lengths allow (ah::pairs:
// exact with one sequence or full-length sequences on one side, else an upper bound).
double AttentionOp::flops(const KernelSpec& spec) const {
  const double per_pair = 2.0 * static_cast<double>(spec.param("head_dim") + ah::dim_v(spec));
  const double pairs = ah::pairs(spec) * static_cast<double>(spec.param("heads"));
  return per_pair * pairs * (spec.param("causal") ? 0.5 : 1.0);
}

std::vector<TestSpec> AttentionOp::test_specs(const TargetInfo&) const {
  return ah::test_specs(name(), false);
}

}  // namespace kiln
