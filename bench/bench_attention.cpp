// Attention forward and backward on the GPU (issue 15, section 5): Kiln's `attention` and
// `attention_bwd` ops on the attention shapes of shared/reference/models.json, bf16, FlashAttention's
// fixed-length layout (bshd), at batch 1, 2 and 4, causal and full, plus one packed variable-length
// batch (thd) compared with the dense rate of its longest sequence's shape. PyTorch's
// scaled_dot_product_attention (cuDNN and flash backends) is timed on the same cases by
// bench/attention_peers.py, which reads this program's CSV and prints the ratios.
//
// How to run it (GPU machine; NVRTC build, no LLVM needed):
//   ninja -C build bench_attention
//   build/bench/bench_attention out/kiln_attention.csv --quick   # 12 rows + varlen, < 3 min
//   build/bench/bench_attention out/kiln_attention.csv           # 36 rows + varlen
//   python3 bench/attention_peers.py out/kiln_attention.csv out/  # cuDNN and FA2, ratios, geomeans
// or both in one step with logs under $OUT: scripts/gpu_bench_steps.sh build attention
// (attention_full for the full list). Without a GPU:
//   build/bench/bench_attention --dry-run [--quick] [--target sm_90a] [--compiler nvrtc|clang]
// compiles every distinct kernel spec the run would launch (forward and backward) with a
// compile-only runtime and lists them (ctest bench_attention_dry_run runs it with --quick);
// `--list` prints the cases; and the check path runs end to end in the CDNA emulator on small
// shapes (no timing), e.g.
//   build/bench/bench_attention /tmp/a.csv --backend emulator --shape 4/2/64/40 --varlen 150/10/70
//
// Cases: (Hq, Hkv, D, S) from models.json's "attention" list, copied below. Inputs are one set per
// shape at its largest batch (a smaller batch uses the leading sequences of the same tensors),
// uniform bf16, never zero (q in [-3, 3] so that softmax rows are not flat, k, v and dout in
// [-1, 1]), drawn on all cores by counter-seeded generators in 32 MiB chunks and streamed to the
// device: no host copy of a whole tensor is kept (Kiln's public API has no device-side fill, and
// DeviceTensors' fp32 host copies and CPU-forward backward inputs are what made the earlier
// benchmarks slow). The backward's `out` and `lse` are the forward kernel's, on the device.
// Varlen: lengths drawn in [128, 8192] summing to 16384 tokens (fixed seed 15), heads of
// Llama-3.1-8B (32/8, D 128), layout thd; its dense comparison is B = 1, S = the longest length.
//
// Check (first case of each shape and mask, or every case with --check-all): outputs poisoned with
// NaN (0xff bytes), one forward and one backward launch, then sampled tokens (first, last and
// random ones, all heads) of the first and last sequence (and the longest, varlen) against a CPU
// reference in float64 computed here: out and lse of sampled query tokens from q, k, v; dq of
// sampled query tokens and dk, dv of sampled key tokens (summed over each GQA group) with P from
// the forward's lse and D = rowsum(dout * out) from its out, as the op defines its backward
// (FlashAttention's). Gates (shared/reference/BENCHMARKS.md): SNR > 40 dB on out, dq, dk, dv
// over the sampled values; lse within 1e-4 absolute + 1e-4 relative; no non-finite value.
// Unchecked rows report Check "-" (same kernel and inputs as the checked row of their shape).
// --softcap N runs every case with that logit softcap, unchecked (the reference here has none).
//
// Timing: device events around one launch (the op's whole call: the backward is its 3 kernels),
// a 256 MiB memset before each to evict L2 (as triton.testing.do_bench does for the peers);
// 1 warm-up, then repetitions until about --budget-ms of device time (at least --min-reps, at most
// --max-reps). The median is reported; the stddev is that of the per-repetition TFLOP/s.
// FLOPs (BENCHMARKS.md): forward 4 * B * Hq * S^2 * D, halved when causal (varlen: the sum over
// sequences of 4 * Hq * L^2 * D); backward 2.5x the forward.
//
// Output: one CSV row per case, written as soon as the case ends:
//   label,B,S,Hq/Hkv,D,causal,Check,Forward TFLOPS,Forward TFLOPS_stddev,Backward TFLOPS,
//   Backward TFLOPS_stddev,Forward Time (ms),Backward Time (ms),out_snr,dq_snr,dk_snr,dv_snr
// (varlen rows: B = sequences, S = the longest; the lengths go to CSV.varlen.json for the peers).
// A case whose tensors the device memory estimate refuses is skipped with the figures. Exits 0
// without a GPU, and when the attention ops are not built into this Kiln.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_common.h"
#include "kiln/kiln.h"
#include "runtime/device_impl.h"
#include "support/memory.h"
#include "templates/registry.h"

namespace {

using kiln::DType;
using kiln::Result;

// ---- cases -------------------------------------------------------------------------------------

/// Query heads, key/value heads, head dim, sequence length.
struct Shape {
  int64_t hq, hkv, d, seq;
};

/// shared/reference/models.json, "attention" -> "cases": (q_heads, kv_heads, head_dim, seq),
/// batch in {1, 2, 4}, causal and non-causal, bf16 (copied 2026-11-26).
const std::vector<Shape> kShapes = {{32, 32, 128, 4096}, {64, 8, 128, 4096}, {32, 8, 128, 8192},
                                    {128, 8, 128, 8192}, {64, 8, 64, 4096},  {32, 4, 64, 8192}};
constexpr int64_t kBatches[] = {1, 2, 4};
/// The packed variable-length batch: Llama-3.1-8B's heads, lengths in [128, 8192], 16k tokens.
constexpr Shape kVarlenHeads = {32, 8, 128, 0};
constexpr int64_t kVarlenTokens = 16384, kVarlenMin = 128, kVarlenMax = 8192;
constexpr uint64_t kVarlenSeed = 15;

/// What the run covers: models.json's list and the varlen batch above, unless --shape / --varlen
/// give others (small ones, e.g. to run the check path in the CDNA emulator).
struct CaseList {
  std::vector<Shape> shapes = kShapes;
  Shape varlen_heads = kVarlenHeads;
  int64_t varlen_tokens = kVarlenTokens, varlen_min = kVarlenMin, varlen_max = kVarlenMax;
  bool quick = false, check_all = false;
  int64_t softcap = 0;  // --softcap: every case with this logit softcap, unchecked
};

struct Case {
  std::string label;
  Shape shape;                // seq: S (dense) or the longest sequence (varlen)
  int64_t batch = 1;          // sequences
  bool causal = false;
  int64_t softcap = 0;        // logit softcap (0: none)
  std::vector<int64_t> lens;  // varlen (layout thd): every sequence's length; empty: dense (bshd)
  bool check = false;
  size_t group = 0;           // index of the tensor set it runs on

  bool varlen() const { return !lens.empty(); }
  int64_t tokens() const {
    int64_t t = 0;
    for (int64_t l : lens) t += l;
    return varlen() ? t : batch * shape.seq;
  }
  int64_t seq_start(int64_t b) const {
    if (!varlen()) return b * shape.seq;
    int64_t t = 0;
    for (int64_t i = 0; i < b; ++i) t += lens[size_t(i)];
    return t;
  }
  int64_t seq_len(int64_t b) const { return varlen() ? lens[size_t(b)] : shape.seq; }
  /// BENCHMARKS.md: 4 * Hq * S^2 * D per sequence, halved when causal.
  double forward_flops() const {
    double f = 0;
    for (int64_t b = 0; b < batch; ++b) {
      const double l = double(seq_len(b));
      f += 4.0 * double(shape.hq) * l * l * double(shape.d);
    }
    return causal ? f / 2 : f;
  }
};

/// One set of device tensors, sized for the largest of its cases.
struct Group {
  Shape shape;
  std::vector<int64_t> lens;  // varlen
  std::vector<size_t> cases;
  int64_t tokens = 0;
};

/// Lengths in [lo, hi] summing to `total` (total >= lo), from a fixed seed: the engine's output
/// sequence is fixed by the standard, and the mapping below does not use a distribution (whose
/// results differ between standard libraries).
std::vector<int64_t> varlen_lengths(int64_t total, int64_t lo, int64_t hi, uint64_t seed) {
  std::mt19937_64 gen(seed);
  std::vector<int64_t> lens;
  for (int64_t left = total; left > 0;) {
    const int64_t top = std::min(hi, left);
    int64_t l = lo + static_cast<int64_t>(gen() % static_cast<uint64_t>(top - lo + 1));
    if (left - l > 0 && left - l < lo) l = left <= hi ? left : left - lo;  // never leave a stub < lo
    lens.push_back(l);
    left -= l;
  }
  return lens;
}

std::string shape_label(const Shape& s) { return fmt::format("hq{}_hkv{}_d{}", s.hq, s.hkv, s.d); }
const char* mask_name(bool causal) { return causal ? "causal" : "full"; }

/// The cases of a run and the tensor sets they share, in run order.
void build_cases(const CaseList& list, std::vector<Case>& cases, std::vector<Group>& groups) {
  const bool quick = list.quick, check_all = list.check_all;
  for (const Shape& s : list.shapes) {
    Group g{s, {}, {}, 0};
    for (int64_t b : kBatches) {
      if (quick && b > 2) continue;
      for (bool causal : {true, false}) {
        if (quick && !causal) continue;
        Case c;
        c.label = fmt::format("{}_s{}_b{}_{}", shape_label(s), s.seq, b, mask_name(causal));
        c.shape = s;
        c.batch = b;
        c.causal = causal;
        c.check = check_all || b == kBatches[0];
        c.group = groups.size();
        g.cases.push_back(cases.size());
        cases.push_back(std::move(c));
      }
    }
    groups.push_back(std::move(g));
  }
  // The varlen batch, then the dense case of its longest sequence.
  const std::vector<int64_t> lens = varlen_lengths(list.varlen_tokens, list.varlen_min, list.varlen_max, kVarlenSeed);
  const int64_t longest = *std::max_element(lens.begin(), lens.end());
  Shape vs = list.varlen_heads;
  vs.seq = longest;
  Group vg{vs, lens, {}, 0}, dg{vs, {}, {}, 0};
  for (bool causal : {true, false}) {
    if (quick && !causal) continue;
    Case v;
    v.label = fmt::format("varlen_thd{}_{}_{}", list.varlen_tokens, shape_label(vs), mask_name(causal));
    v.shape = vs;
    v.batch = static_cast<int64_t>(lens.size());
    v.causal = causal;
    v.lens = lens;
    v.check = true;
    v.group = groups.size();
    vg.cases.push_back(cases.size());
    cases.push_back(v);
    Case d;
    d.label = fmt::format("varlen_dense_{}_s{}_b1_{}", shape_label(vs), longest, mask_name(causal));
    d.shape = vs;
    d.batch = 1;
    d.causal = causal;
    d.check = check_all;
    d.group = groups.size() + 1;
    dg.cases.push_back(cases.size());
    cases.push_back(d);
  }
  groups.push_back(std::move(vg));
  groups.push_back(std::move(dg));
  for (Group& g : groups)
    for (size_t i : g.cases) g.tokens = std::max(g.tokens, cases[i].tokens());
  if (list.softcap > 0)  // this file's fp64 reference has no softcap: the GPU tests check the op's softcap specs
    for (Case& c : cases) {
      c.label += fmt::format("_softcap{}", list.softcap);
      c.softcap = list.softcap;
      c.check = false;
    }
}

kiln::KernelSpec make_spec(const Case& c, bool backward) {
  kiln::KernelSpec s{backward ? "attention_bwd" : "attention", DType::bf16, DType::bf16,
                     {{"heads", c.shape.hq},
                      {"kv_heads", c.shape.hkv},
                      {"head_dim", c.shape.d},
                      {"causal", c.causal ? 1 : 0},
                      {"batch", c.batch}}};
  if (c.softcap > 0) s.params["softcap"] = c.softcap;
  if (c.varlen()) {
    s.params["layout"] = 1;  // thd
    s.params["total_q"] = s.params["total_k"] = c.tokens();
    s.params["max_seqlen_q"] = s.params["max_seqlen_k"] = c.shape.seq;
  } else {
    s.params["seqlen_q"] = s.params["seqlen_k"] = c.shape.seq;
  }
  return s;
}

// ---- device memory -----------------------------------------------------------------------------

using kiln::bench::DeviceBuffer;

/// Byte sizes of a group's tensors: q, k, v, out, lse, dout, dq, dk, dv, cu_seqlens, workspace.
struct Sizes {
  size_t q, kv, lse, cu, workspace;
  size_t total() const { return 4 * q + 4 * kv + lse + 2 * cu + workspace; }  // q,out,dout,dq; k,v,dk,dv
};
Sizes sizes(const Shape& s, int64_t tokens, int64_t sequences) {
  const size_t t = static_cast<size_t>(tokens);
  return {t * size_t(s.hq * s.d) * 2, t * size_t(s.hkv * s.d) * 2, t * size_t(s.hq) * 4,
          size_t(sequences + 1) * 4, t * size_t(s.hq) * 4};  // workspace: D = rowsum(dO O), fp32
}

struct Tensors {
  DeviceBuffer q, k, v, out, lse, dout, dq, dk, dv, cu, workspace;
};

// ---- inputs ------------------------------------------------------------------------------------

/// body(i) for i in [0, n) on all cores (fork-join; the items are independent).
template <class F>
void parallel_for(int64_t n, F&& body) {
  const int64_t threads = std::min<int64_t>(n, std::max(1u, std::thread::hardware_concurrency()));
  std::atomic<int64_t> next{0};
  auto worker = [&] {
    for (int64_t i; (i = next.fetch_add(1)) < n;) body(i);
  };
  if (threads <= 1) return worker();
  std::vector<std::thread> pool;
  for (int64_t t = 0; t < threads; ++t) pool.emplace_back(worker);
  for (auto& t : pool) t.join();
}

/// n bf16 values uniform in [-scale, scale], never zero, at `dst`. Element i comes from the
/// generator of its 64k-element block (seeded by `seed` and the block index), so the values do not
/// depend on the thread count; generated on all cores 32 MiB at a time and copied to the device.
Result<void> fill_uniform_bf16(kiln::Device& dev, void* dst, int64_t n, double scale, uint64_t seed) {
  constexpr int64_t kBlock = int64_t{1} << 16, kChunk = int64_t{1} << 24;  // kChunk % kBlock == 0
  std::vector<uint16_t> stage(static_cast<size_t>(std::min(n, kChunk)));
  for (int64_t off = 0; off < n; off += kChunk) {
    const int64_t len = std::min(kChunk, n - off);
    parallel_for((len + kBlock - 1) / kBlock, [&](int64_t b) {
      std::mt19937_64 gen(seed ^ (0x9e3779b97f4a7c15ull * static_cast<uint64_t>((off / kBlock) + b + 1)));
      for (int64_t i = b * kBlock; i < std::min(len, (b + 1) * kBlock); ++i) {
        uint16_t bits;
        do {
          const double u = static_cast<double>(gen() >> 11) * 0x1.0p-53;  // [0, 1)
          bits = kiln::float_to_bf16_bits(static_cast<float>((2.0 * u - 1.0) * scale));
        } while ((bits & 0x7fff) == 0);
        stage[static_cast<size_t>(i)] = bits;
      }
    });
    KILN_TRY(dev.copy_to_device(static_cast<uint16_t*>(dst) + off, stage.data(), static_cast<size_t>(len) * 2));
  }
  return kiln::ok();
}

// ---- accuracy ----------------------------------------------------------------------------------

/// Sums for the SNR of one output over the sampled values.
struct Accum {
  double ref_sq = 0, err_sq = 0;
  int64_t compared = 0, nonfinite = 0;
  void add(double ref, double got) {
    ++compared;
    if (!std::isfinite(ref) || !std::isfinite(got)) {
      ++nonfinite;
      return;
    }
    ref_sq += ref * ref;
    err_sq += (got - ref) * (got - ref);
  }
  void merge(const Accum& o) {
    ref_sq += o.ref_sq;
    err_sq += o.err_sq;
    compared += o.compared;
    nonfinite += o.nonfinite;
  }
  /// 10 log10(|ref|^2 / |ref - out|^2); NaN when a value is not finite or nothing was compared.
  double snr_db() const {
    if (nonfinite || compared == 0) return std::numeric_limits<double>::quiet_NaN();
    return err_sq > 0 ? 10.0 * std::log10(ref_sq / err_sq) : 999.0;
  }
  bool pass() const { return snr_db() > 40.0; }  // NaN compares false
};

struct Accuracy {
  bool checked = false;
  std::string error;  // the check could not run (launch error, ...)
  Accum out, dq, dk, dv;
  int64_t lse_compared = 0, lse_outside = 0;  // lse gate: |err| <= 1e-4 + 1e-4 |ref|, finite
  double lse_max_err = 0;
  void merge(const Accuracy& o) {
    out.merge(o.out);
    dq.merge(o.dq);
    dk.merge(o.dk);
    dv.merge(o.dv);
    lse_compared += o.lse_compared;
    lse_outside += o.lse_outside;
    lse_max_err = std::max(lse_max_err, o.lse_max_err);
  }
  bool pass() const {
    return checked && error.empty() && out.pass() && dq.pass() && dk.pass() && dv.pass() && lse_outside == 0 &&
           lse_compared > 0;
  }
  std::string describe() const {
    if (!checked) return "not checked";
    if (!error.empty()) return "FAIL: " + error;
    auto one = [](const char* n, const Accum& a) {
      return fmt::format("{} snr {:.1f} dB ({} values, {} non-finite)", n, a.snr_db(), a.compared, a.nonfinite);
    };
    return fmt::format("{}: {}; lse max err {:.2e}, {} of {} outside 1e-4 + 1e-4|ref|; {}; {}; {}",
                       pass() ? "PASS" : "FAIL", one("out", out), lse_max_err, lse_outside, lse_compared,
                       one("dq", dq), one("dk", dk), one("dv", dv));
  }
};

/// One sequence's tensors read back from the device, as floats: q, dout, out, dq [L, Hq, D];
/// k, v, dk, dv [L, Hkv, D]; lse [Hq, L].
struct SeqData {
  int64_t len = 0;
  std::vector<float> q, k, v, dout, out, dq, dk, dv, lse;
};

Result<std::vector<float>> fetch_bf16(kiln::Device& dev, const void* base, int64_t offset, int64_t n) {
  std::vector<uint16_t> bits(static_cast<size_t>(n));
  KILN_TRY(dev.copy_to_host(bits.data(), static_cast<const uint16_t*>(base) + offset, bits.size() * 2));
  std::vector<float> out(bits.size());
  for (size_t i = 0; i < bits.size(); ++i) out[i] = kiln::bf16_bits_to_float(bits[i]);
  return out;
}

Result<SeqData> fetch_sequence(kiln::Device& dev, const Tensors& t, const Case& c, int64_t b) {
  const Shape& s = c.shape;
  const int64_t t0 = c.seq_start(b), len = c.seq_len(b), total = c.tokens();
  SeqData d;
  d.len = len;
  const int64_t qrow = s.hq * s.d, krow = s.hkv * s.d;
  KILN_ASSIGN_OR_RETURN(d.q, fetch_bf16(dev, t.q.ptr, t0 * qrow, len * qrow));
  KILN_ASSIGN_OR_RETURN(d.dout, fetch_bf16(dev, t.dout.ptr, t0 * qrow, len * qrow));
  KILN_ASSIGN_OR_RETURN(d.out, fetch_bf16(dev, t.out.ptr, t0 * qrow, len * qrow));
  KILN_ASSIGN_OR_RETURN(d.dq, fetch_bf16(dev, t.dq.ptr, t0 * qrow, len * qrow));
  KILN_ASSIGN_OR_RETURN(d.k, fetch_bf16(dev, t.k.ptr, t0 * krow, len * krow));
  KILN_ASSIGN_OR_RETURN(d.v, fetch_bf16(dev, t.v.ptr, t0 * krow, len * krow));
  KILN_ASSIGN_OR_RETURN(d.dk, fetch_bf16(dev, t.dk.ptr, t0 * krow, len * krow));
  KILN_ASSIGN_OR_RETURN(d.dv, fetch_bf16(dev, t.dv.ptr, t0 * krow, len * krow));
  d.lse.resize(static_cast<size_t>(s.hq * len));
  for (int64_t h = 0; h < s.hq; ++h)  // lse is [Hq, total tokens]
    KILN_TRY(dev.copy_to_host(&d.lse[size_t(h * len)], static_cast<const float*>(t.lse.ptr) + h * total + t0,
                              size_t(len) * 4));
  return d;
}

double dot(const float* a, const float* b, int64_t n) {
  double s = 0;
  for (int64_t i = 0; i < n; ++i) s += double(a[i]) * double(b[i]);
  return s;
}

/// out, lse and dq of query token i (every head) against float64. Self-attention (lq = lk), so
/// the bottom-right causal mask is j <= i.
Accuracy check_query(const Case& c, const SeqData& s, int64_t i) {
  const Shape& sh = c.shape;
  const int64_t D = sh.d, group = sh.hq / sh.hkv, last = c.causal ? i : s.len - 1;
  const double scale = 1.0 / std::sqrt(double(D));
  Accuracy a;
  std::vector<double> sc(static_cast<size_t>(last + 1)), o(static_cast<size_t>(D)), g(static_cast<size_t>(D));
  for (int64_t h = 0; h < sh.hq; ++h) {
    const int64_t hk = h / group;
    const float* qi = &s.q[size_t((i * sh.hq + h) * D)];
    const float* doi = &s.dout[size_t((i * sh.hq + h) * D)];
    const float* oi = &s.out[size_t((i * sh.hq + h) * D)];
    double mx = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j <= last; ++j) {
      sc[size_t(j)] = scale * dot(qi, &s.k[size_t((j * sh.hkv + hk) * D)], D);
      mx = std::max(mx, sc[size_t(j)]);
    }
    double sum = 0;
    std::fill(o.begin(), o.end(), 0.0);
    for (int64_t j = 0; j <= last; ++j) {
      const double p = std::exp(sc[size_t(j)] - mx);
      sum += p;
      const float* vj = &s.v[size_t((j * sh.hkv + hk) * D)];
      for (int64_t e = 0; e < D; ++e) o[size_t(e)] += p * vj[e];
    }
    for (int64_t e = 0; e < D; ++e) a.out.add(o[size_t(e)] / sum, oi[e]);
    const double lse_ref = mx + std::log(sum), lse_got = s.lse[size_t(h * s.len + i)];
    const double err = std::fabs(lse_got - lse_ref);
    ++a.lse_compared;
    if (!std::isfinite(lse_got) || !(err <= 1e-4 + 1e-4 * std::fabs(lse_ref))) ++a.lse_outside;
    a.lse_max_err = std::max(a.lse_max_err, std::isfinite(err) ? err : std::numeric_limits<double>::infinity());
    // dq = scale * sum_j P_ij (dO_i . v_j - D_i) k_j, with the forward's lse and out.
    const double dd = dot(doi, oi, D), lse_saved = lse_got;
    std::fill(g.begin(), g.end(), 0.0);
    for (int64_t j = 0; j <= last; ++j) {
      const float* vj = &s.v[size_t((j * sh.hkv + hk) * D)];
      const float* kj = &s.k[size_t((j * sh.hkv + hk) * D)];
      const double ds = std::exp(sc[size_t(j)] - lse_saved) * (dot(doi, vj, D) - dd);
      for (int64_t e = 0; e < D; ++e) g[size_t(e)] += ds * kj[e];
    }
    for (int64_t e = 0; e < D; ++e) a.dq.add(scale * g[size_t(e)], s.dq[size_t((i * sh.hq + h) * D + e)]);
  }
  a.checked = true;
  return a;
}

/// dk and dv of key token u (every key/value head, summed over its GQA group of query heads).
Accuracy check_key(const Case& c, const SeqData& s, int64_t u) {
  const Shape& sh = c.shape;
  const int64_t D = sh.d, group = sh.hq / sh.hkv, first = c.causal ? u : 0;
  const double scale = 1.0 / std::sqrt(double(D));
  Accuracy a;
  std::vector<double> gk(static_cast<size_t>(D)), gv(static_cast<size_t>(D));
  for (int64_t hk = 0; hk < sh.hkv; ++hk) {
    const float* ku = &s.k[size_t((u * sh.hkv + hk) * D)];
    const float* vu = &s.v[size_t((u * sh.hkv + hk) * D)];
    std::fill(gk.begin(), gk.end(), 0.0);
    std::fill(gv.begin(), gv.end(), 0.0);
    for (int64_t h = hk * group; h < (hk + 1) * group; ++h)
      for (int64_t i = first; i < s.len; ++i) {
        const float* qi = &s.q[size_t((i * sh.hq + h) * D)];
        const float* doi = &s.dout[size_t((i * sh.hq + h) * D)];
        const float* oi = &s.out[size_t((i * sh.hq + h) * D)];
        const double p = std::exp(scale * dot(qi, ku, D) - double(s.lse[size_t(h * s.len + i)]));
        const double ds = p * (dot(doi, vu, D) - dot(doi, oi, D));
        for (int64_t e = 0; e < D; ++e) {
          gv[size_t(e)] += p * doi[e];
          gk[size_t(e)] += ds * qi[e];
        }
      }
    for (int64_t e = 0; e < D; ++e) {
      a.dv.add(gv[size_t(e)], s.dv[size_t((u * sh.hkv + hk) * D + e)]);
      a.dk.add(scale * gk[size_t(e)], s.dk[size_t((u * sh.hkv + hk) * D + e)]);
    }
  }
  a.checked = true;
  return a;
}

/// `count` distinct tokens of [0, len): the first, the last and random ones.
std::vector<int64_t> sample_tokens(int64_t len, int64_t count, std::mt19937_64& rng) {
  std::set<int64_t> s;
  if (len > 0) s.insert({int64_t{0}, len - 1});
  while (int64_t(s.size()) < std::min(count, len)) s.insert(static_cast<int64_t>(rng() % uint64_t(len)));
  return {s.begin(), s.end()};
}

// ---- timing ------------------------------------------------------------------------------------

using kiln::bench::summarize;
using kiln::bench::Timing;

// ---- the run -----------------------------------------------------------------------------------

struct Options {
  std::string csv;
  bool quick = false, dry_run = false, list = false, check_all = false;
  double budget_ms = 1000;
  int min_reps = 3, max_reps = 100;
  int64_t check_tokens = 8;
  uint64_t seed = 0;
  int device = 0;
  std::string only;
  std::string target = "sm_90a";
  std::string compiler;
  std::string backend = "cuda", emulator_target = "gfx942";
  bool timing = true, tune = false;
  std::vector<std::string> shapes;  // "HQ/HKV/D/S"
  std::string varlen;               // "TOTAL/MIN/MAX"
  int64_t softcap = 0;
};

struct Bench {
  Options opt;
  kiln::Runtime* rt = nullptr;
  kiln::Device* dev = nullptr;
  const kiln::OpTemplate* fwd_op = nullptr;
  const kiln::OpTemplate* bwd_op = nullptr;
  DeviceBuffer flush;
  std::mt19937_64 rng;
};

constexpr size_t kFlushBytes = size_t{256} << 20;

struct Row {
  Accuracy acc;
  std::vector<double> fwd_ms, bwd_ms;
  std::string error;  // set when the case could not run to the end
};

/// Device pointers in the op's tensor order (names from its signature), then the workspace.
Result<std::vector<void*>> buffers(const kiln::OpTemplate& op, const kiln::KernelSpec& spec, const Tensors& t,
                                   bool with_workspace) {
  const std::map<std::string, void*> by_name = {
      {"q", t.q.ptr},     {"k", t.k.ptr},       {"v", t.v.ptr},   {"out", t.out.ptr},
      {"lse", t.lse.ptr}, {"dout", t.dout.ptr}, {"dq", t.dq.ptr}, {"dk", t.dk.ptr},
      {"dv", t.dv.ptr},   {"cu_seqlens_q", t.cu.ptr}, {"cu_seqlens_k", t.cu.ptr}};
  std::vector<void*> out;
  for (const kiln::TensorInfo& ti : op.tensors(spec)) {
    auto it = by_name.find(ti.name);
    if (it == by_name.end() || !it->second)
      return kiln::make_error(kiln::Errc::invalid_argument,
                              fmt::format("{} has a tensor '{}' that bench_attention does not provide; update "
                                          "bench/bench_attention.cpp's buffers()",
                                          op.name(), ti.name));
    out.push_back(it->second);
  }
  if (with_workspace) out.push_back(t.workspace.ptr);
  return out;
}

/// Repetitions of `launch` timed with device events, L2 evicted before each: 1 warm-up, then
/// until about budget_ms of device time (min_reps .. max_reps).
Result<std::vector<double>> time_launches(Bench& b, const std::function<Result<void>()>& launch) {
  KILN_TRY(launch());
  KILN_TRY(b.dev->synchronize(nullptr));
  std::vector<double> ms;
  int reps = b.opt.max_reps;
  for (int r = 0; r < reps; ++r) {
    KILN_TRY(b.dev->memset(b.flush.ptr, static_cast<uint8_t>(r), kFlushBytes));  // asynchronous
    KILN_ASSIGN_OR_RETURN(float t, b.dev->time_ms(nullptr, launch));
    ms.push_back(t);
    if (r == 0) reps = std::clamp(static_cast<int>(b.opt.budget_ms / std::max(double(t), 1e-3)), b.opt.min_reps,
                                  b.opt.max_reps);
  }
  return ms;
}

/// Poisons every output, runs the forward and the backward once, and compares sampled tokens.
Result<Accuracy> run_check(Bench& b, const Case& c, const Tensors& t, const std::function<Result<void>()>& fwd,
                           const std::function<Result<void>()>& bwd) {
  for (const DeviceBuffer* o : {&t.out, &t.lse, &t.dq, &t.dk, &t.dv})
    KILN_TRY(b.dev->memset(o->ptr, 0xff, o->bytes));
  KILN_TRY(fwd());
  KILN_TRY(bwd());
  KILN_TRY(b.dev->synchronize(nullptr));
  std::vector<int64_t> seqs = {0, c.batch - 1};
  if (c.varlen()) seqs.push_back(std::max_element(c.lens.begin(), c.lens.end()) - c.lens.begin());
  std::sort(seqs.begin(), seqs.end());
  seqs.erase(std::unique(seqs.begin(), seqs.end()), seqs.end());
  Accuracy total;
  total.checked = true;
  for (int64_t sb : seqs) {
    KILN_ASSIGN_OR_RETURN(SeqData s, fetch_sequence(*b.dev, t, c, sb));
    const std::vector<int64_t> qs = sample_tokens(s.len, b.opt.check_tokens, b.rng);
    const std::vector<int64_t> ks = sample_tokens(s.len, b.opt.check_tokens, b.rng);
    std::vector<Accuracy> parts(qs.size() + ks.size());
    parallel_for(static_cast<int64_t>(parts.size()), [&](int64_t i) {
      const size_t n = static_cast<size_t>(i);
      parts[n] = n < qs.size() ? check_query(c, s, qs[n]) : check_key(c, s, ks[n - qs.size()]);
    });
    for (const Accuracy& p : parts) total.merge(p);
  }
  return total;
}

Result<void> run_case(Bench& b, const Case& c, Tensors& t, Row& row) {
  const kiln::KernelSpec fs = make_spec(c, false), bs = make_spec(c, true);
  if (b.opt.tune) {  // the tuning records then serve kernel()
    KILN_TRY(kiln::bench::tune_and_print(*b.rt, fs, c.label + " forward"));
    KILN_TRY(kiln::bench::tune_and_print(*b.rt, bs, c.label + " backward"));
  }
  KILN_ASSIGN_OR_RETURN(auto fk, b.rt->kernel(fs));
  KILN_ASSIGN_OR_RETURN(auto bk, b.rt->kernel(bs));
  // The group's workspace is sized for D = rowsum(dO O); a backward variant that wants more (an
  // fp32 dQ accumulator, say) gets a larger one.
  if (bk->workspace_bytes(bs) > t.workspace.bytes) KILN_TRY(t.workspace.allocate(*b.dev, bk->workspace_bytes(bs)));
  KILN_ASSIGN_OR_RETURN(const std::vector<void*> fbuf, buffers(*b.fwd_op, fs, t, false));
  KILN_ASSIGN_OR_RETURN(const std::vector<void*> bbuf, buffers(*b.bwd_op, bs, t, true));
  const std::function<Result<void>()> fwd = [&] { return fk->launch(fs, fbuf); };
  const std::function<Result<void>()> bwd = [&] { return bk->launch(bs, bbuf); };
  if (c.check) {
    auto acc = run_check(b, c, t, fwd, bwd);
    if (!acc) {
      row.acc.checked = true;
      row.acc.error = acc.error().message;
      return acc.take_error();
    }
    row.acc = *acc;
  }
  if (!b.opt.timing) return kiln::ok();
  KILN_ASSIGN_OR_RETURN(row.fwd_ms, time_launches(b, fwd));  // leaves the forward's out and lse
  KILN_ASSIGN_OR_RETURN(row.bwd_ms, time_launches(b, bwd));
  return kiln::ok();
}

/// Allocates a group's tensors for `tokens` tokens and fills the inputs.
Result<void> make_tensors(Bench& b, const Group& g, int64_t tokens, Tensors& t) {
  const Sizes z = sizes(g.shape, tokens, static_cast<int64_t>(g.lens.size()));
  kiln::Device& d = *b.dev;
  for (DeviceBuffer* q : {&t.q, &t.out, &t.dout, &t.dq}) KILN_TRY(q->allocate(d, z.q));
  for (DeviceBuffer* k : {&t.k, &t.v, &t.dk, &t.dv}) KILN_TRY(k->allocate(d, z.kv));
  KILN_TRY(t.lse.allocate(d, z.lse));
  KILN_TRY(t.workspace.allocate(d, z.workspace));
  const uint64_t seed = b.rng();
  const int64_t qn = int64_t(z.q / 2), kn = int64_t(z.kv / 2);
  KILN_TRY(fill_uniform_bf16(d, t.q.ptr, qn, 3.0, seed + 1));  // scores of unit scale: rows not flat
  KILN_TRY(fill_uniform_bf16(d, t.k.ptr, kn, 1.0, seed + 2));
  KILN_TRY(fill_uniform_bf16(d, t.v.ptr, kn, 1.0, seed + 3));
  KILN_TRY(fill_uniform_bf16(d, t.dout.ptr, qn, 1.0, seed + 4));
  if (!g.lens.empty()) {
    std::vector<int32_t> cu = {0};
    for (int64_t l : g.lens) cu.push_back(cu.back() + static_cast<int32_t>(l));
    KILN_TRY(t.cu.allocate(d, cu.size() * 4));
    KILN_TRY(d.copy_to_device(t.cu.ptr, cu.data(), cu.size() * 4));
  }
  return d.synchronize(nullptr);
}

const char* kHeader =
    "label,B,S,Hq/Hkv,D,causal,Check,Forward TFLOPS,Forward TFLOPS_stddev,Backward TFLOPS,Backward "
    "TFLOPS_stddev,Forward Time (ms),Backward Time (ms),out_snr,dq_snr,dk_snr,dv_snr";

/// PASS / FAIL (the gates; also FAIL when the case could not run or be timed) / "-" (not checked).
std::string check_text(const Row& r) {
  if (!r.error.empty()) return "FAIL";
  if (!r.acc.checked) return "-";
  return r.acc.pass() ? "PASS" : "FAIL";
}

std::vector<std::string> row_fields(const Case& c, const Row& r) {
  const Timing f = summarize(r.fwd_ms, c.forward_flops()), g = summarize(r.bwd_ms, 2.5 * c.forward_flops());
  auto snr = [&](const Accum& a) {
    return r.acc.checked && a.compared ? (std::isnan(a.snr_db()) ? "nan" : fmt::format("{:.1f}", a.snr_db())) : "";
  };
  return {c.label,
          std::to_string(c.batch),
          std::to_string(c.shape.seq),
          fmt::format("{}/{}", c.shape.hq, c.shape.hkv),
          std::to_string(c.shape.d),
          c.causal ? "1" : "0",
          check_text(r),
          fmt::format("{:.2f}", f.tflops),
          fmt::format("{:.2f}", f.stddev),
          fmt::format("{:.2f}", g.tflops),
          fmt::format("{:.2f}", g.stddev),
          fmt::format("{:.4f}", f.median_ms),
          fmt::format("{:.4f}", g.median_ms),
          snr(r.acc.out),
          snr(r.acc.dq),
          snr(r.acc.dk),
          snr(r.acc.dv)};
}

void print_table(const std::vector<std::vector<std::string>>& rows) {
  kiln::bench::print_table(stdout, kiln::bench::split_header(kHeader), rows);
}

/// The exit code of a dry run without a compiler for the target (ctest's SKIP_RETURN_CODE).
constexpr int kSkipped = 77;

/// Compiles every distinct spec of the run with a compile-only runtime and lists them. Exit code:
/// 0, 1 when a spec fails, kSkipped when the target's compiler is missing (NVRTC not found, AMD or
/// clang without LLVM).
int dry_run(const Options& opt, const std::vector<Case>& cases) {
  kiln::RuntimeOptions o;
  o.backend = "none";
  o.nvidia_compiler = opt.compiler;
  auto rt = kiln::Runtime::create(o);
  if (!rt) {
    std::fprintf(stderr, "bench_attention: %s\n", rt.error().message.c_str());
    return 1;
  }
  std::set<std::string> seen;
  int failures = 0, compiled = 0;
  for (const Case& c : cases)
    for (bool backward : {false, true}) {
      const kiln::KernelSpec spec = make_spec(c, backward);
      auto op = kiln::find_op(spec.op);
      if (!op) {
        std::printf("FAIL %s: %s\n", kiln::to_string(spec).c_str(), op.error().message.c_str());
        ++failures;
        continue;
      }
      if (!seen.insert(kiln::to_string((*op)->baked_spec(spec))).second) continue;
      const auto t0 = std::chrono::steady_clock::now();
      auto k = (*rt)->compile(spec, opt.target);
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (!k && compiled == 0 && failures == 0 &&
          (k.error().code == kiln::Errc::driver_unavailable || k.error().code == kiln::Errc::unsupported)) {
        std::printf("bench_attention: dry run skipped: no compiler for %s here: %s\n", opt.target.c_str(),
                    k.error().message.c_str());
        return kSkipped;
      }
      if (!k) {
        std::printf("FAIL %s: %s\n", kiln::to_string(spec).c_str(), k.error().message.c_str());
        ++failures;
        continue;
      }
      ++compiled;
      const kiln::KernelInfo& info = (*k)->info();
      std::printf("OK   %-4s %s  [%s, %s, %s, %.0f ms, %d registers, %d B static shared, %s]\n",
                  backward ? "bwd" : "fwd", kiln::to_string(spec).c_str(), opt.target.c_str(), info.compiler.c_str(),
                  std::string((*k)->origin()).c_str(), ms, info.registers, info.shared_bytes, info.config.c_str());
      std::fflush(stdout);
    }
  std::printf("dry run: %d distinct kernel specs compiled for %s, %d failed\n", compiled, opt.target.c_str(),
              failures);
  return failures ? 1 : 0;
}

int run(Bench& b, const std::vector<Case>& cases, std::vector<Group>& groups) {
  kiln::Device& dev = *b.dev;
  std::FILE* csv = std::fopen(b.opt.csv.c_str(), "w");
  if (!csv) {
    std::perror(b.opt.csv.c_str());
    return 1;
  }
  std::fprintf(csv, "%s\n", kHeader);
  std::fflush(csv);
  // The varlen lengths, for the peers (attention_peers.py).
  for (const Group& g : groups)
    if (!g.lens.empty())
      if (std::FILE* f = std::fopen((b.opt.csv + ".varlen.json").c_str(), "w")) {
        std::fprintf(f, "{\"hq\": %lld, \"hkv\": %lld, \"d\": %lld, \"lengths\": [", (long long)g.shape.hq,
                     (long long)g.shape.hkv, (long long)g.shape.d);
        for (size_t i = 0; i < g.lens.size(); ++i) std::fprintf(f, "%s%lld", i ? ", " : "", (long long)g.lens[i]);
        std::fprintf(f, "]}\n");
        std::fclose(f);
      }

  // Compiles the kernels ahead of the case that needs them, into the runtime's caches.
  std::vector<kiln::KernelSpec> specs;
  for (const Case& c : cases)
    for (bool backward : {false, true}) specs.push_back(make_spec(c, backward));
  const kiln::bench::BackgroundCompile prefetch(*b.rt, std::string(dev.target().name), std::move(specs));

  std::vector<Row> rows(cases.size());
  std::vector<bool> ran(cases.size(), false);
  int failures = 0, skipped = 0;
  const auto run0 = std::chrono::steady_clock::now();
  for (Group& g : groups) {
    // The memory estimate: the group's tensors for its largest case that fits the free memory.
    std::vector<size_t> order = g.cases;
    int64_t tokens = 0;
    std::string refusal;
    for (size_t i : order) {
      const Sizes z = sizes(g.shape, cases[i].tokens(), static_cast<int64_t>(g.lens.size()));
      auto* impl = dynamic_cast<kiln::DeviceImpl*>(&dev);
      const auto free = impl ? impl->free_memory() : std::nullopt;
      if (free && double(z.total()) > 0.9 * double(free->bytes)) {
        refusal = fmt::format("its tensors need {} of device memory, more than 90% of {} ({})",
                              kiln::format_bytes(z.total()), kiln::format_bytes(free->bytes), free->source);
        continue;
      }
      tokens = std::max(tokens, cases[i].tokens());
    }
    Tensors t;
    if (tokens > 0)
      if (auto r = make_tensors(b, g, tokens, t); !r) {
        refusal = r.error().message;
        tokens = 0;
      }
    for (size_t i : g.cases) {
      const Case& c = cases[i];
      if (c.tokens() > tokens) {
        std::fprintf(stderr, "%s: skipped: %s\n", c.label.c_str(), refusal.c_str());
        ++skipped;
        continue;
      }
      const auto t0 = std::chrono::steady_clock::now();
      Row& row = rows[i];
      if (auto r = run_case(b, c, t, row); !r) {
        row.error = r.error().message;
        if (!row.acc.checked) {  // a FAIL row: the case did not run
          row.acc.checked = true;
          row.acc.error = row.error;
        }
      }
      ran[i] = true;
      if (!row.error.empty() || (row.acc.checked && !row.acc.pass())) ++failures;
      const std::vector<std::string> f = row_fields(c, row);
      std::string line;
      for (size_t k = 0; k < f.size(); ++k) line += (k ? "," : "") + f[k];
      std::fprintf(csv, "%s\n", line.c_str());
      std::fflush(csv);  // a row survives a time limit
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - run0).count();
      std::fprintf(stderr, "%-44s %s fwd %8.1f TFLOP/s (%.3f ms, %zu reps) bwd %8.1f TFLOP/s (%.3f ms, %zu reps) "
                           "%.1f s, %.0f s in all\n",
                   c.label.c_str(), check_text(row).c_str(), std::stod(f[7]), std::stod(f[11]), row.fwd_ms.size(),
                   std::stod(f[9]), std::stod(f[12]), row.bwd_ms.size(), s, total);
      if (row.acc.checked) std::fprintf(stderr, "  check: %s\n", row.acc.describe().c_str());
      if (!row.error.empty()) std::fprintf(stderr, "  error: %s\n", row.error.c_str());
    }
  }
  std::fclose(csv);

  std::vector<std::vector<std::string>> table;
  for (size_t i = 0; i < cases.size(); ++i)
    if (ran[i]) table.push_back(row_fields(cases[i], rows[i]));
  std::printf("\n");
  print_table(table);
  // The varlen line: each varlen case against the dense case of its longest sequence, same mask.
  for (size_t i = 0; i < cases.size() && b.opt.timing; ++i) {
    if (!cases[i].varlen() || !ran[i]) continue;
    for (size_t j = 0; j < cases.size(); ++j) {
      const Case &v = cases[i], &d = cases[j];
      if (d.varlen() || !ran[j] || d.group != v.group + 1 || d.causal != v.causal) continue;
      const double vf = summarize(rows[i].fwd_ms, v.forward_flops()).tflops;
      const double vb = summarize(rows[i].bwd_ms, 2.5 * v.forward_flops()).tflops;
      const double df = summarize(rows[j].fwd_ms, d.forward_flops()).tflops;
      const double db = summarize(rows[j].bwd_ms, 2.5 * d.forward_flops()).tflops;
      std::printf("varlen %s (%lld sequences, %lld tokens, longest %lld): forward %.1f vs dense %.1f TFLOP/s = "
                  "%.3fx, backward %.1f vs %.1f = %.3fx (target >= 0.9x)\n",
                  mask_name(v.causal), (long long)v.batch, (long long)v.tokens(), (long long)v.shape.seq, vf, df,
                  df > 0 ? vf / df : 0.0, vb, db, db > 0 ? vb / db : 0.0);
    }
  }
  std::printf("%zu rows written to %s; %d failed, %d skipped\n", table.size(), b.opt.csv.c_str(), failures, skipped);
  return failures ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  CLI::App app{"Kiln attention forward and backward on the attention shapes of models.json (BENCHMARKS.md format)"};
  app.add_option("csv", opt.csv, "Output CSV (one row per case; lengths of the varlen batch in CSV.varlen.json)");
  app.add_flag("--quick", opt.quick, "One case per shape (causal) at batch 1 and 2, and the causal varlen batch");
  app.add_flag("--dry-run", opt.dry_run,
               "Compile every distinct kernel spec of the run for --target with a compile-only runtime (no GPU)");
  app.add_flag("--list", opt.list, "Print the cases and exit");
  app.add_flag("--check-all", opt.check_all, "Check every case (default: the first case of each shape and mask)");
  app.add_option("--budget-ms", opt.budget_ms, "Device time per measurement, about (repetitions after the first)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--min-reps", opt.min_reps, "Least timed repetitions per measurement")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-reps", opt.max_reps, "Most timed repetitions per measurement")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--check-tokens", opt.check_tokens, "Query and key tokens checked per checked sequence")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--only", opt.only, "Run only the cases whose label contains this text");
  app.add_option("--seed", opt.seed, "Random seed of the inputs and samples (0: a fresh one)");
  app.add_option("--device", opt.device, "GPU ordinal")->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--target", opt.target, "--dry-run: the target to compile for")->capture_default_str();
  app.add_option("--compiler", opt.compiler, "NVIDIA compiler, nvrtc or clang (default: KILN_NVIDIA_COMPILER, else nvrtc)");
  app.add_option("--shape", opt.shapes,
                 "HQ/HKV/D/S in place of models.json's list (repeatable); the varlen batch takes the first's heads");
  app.add_option("--varlen", opt.varlen, "TOTAL/MIN/MAX: the varlen batch's tokens and length range (16384/128/8192)");
  app.add_option("--backend", opt.backend,
                 "cuda (default), or emulator: the CDNA emulator (--emulator-target; no timing), to run the check "
                 "path on small --shape cases without a GPU")
      ->check(CLI::IsMember({"cuda", "emulator"}))
      ->capture_default_str();
  app.add_option("--emulator-target", opt.emulator_target, "gfx942 or gfx950 (--backend emulator)")
      ->capture_default_str();
  app.add_flag("--tune", opt.tune, "Time every tuning candidate of each case first (Runtime::tune) and print them");
  app.add_flag("!--no-timing", opt.timing, "Check only, no timed repetitions (implied by --backend emulator)");
  app.add_option("--softcap", opt.softcap,
                 "Every case with this logit softcap (score = N tanh(score / N), Gemma-2's; labels end _softcapN), "
                 "timed only: this bench's reference has none (the GPU tests check the op's softcap specs) and "
                 "SDPA has no softcap (bench/attention_peers.py skips these rows)")
      ->check(CLI::Range(int64_t{0}, int64_t{100000}));
  CLI11_PARSE(app, argc, argv);
  opt.max_reps = std::max(opt.max_reps, opt.min_reps);
  if (opt.backend == "emulator") opt.timing = false;

  if (opt.softcap > 0 && !opt.timing) {
    std::fprintf(stderr, "bench_attention: --softcap rows are timed only (no check), so they need timing "
                         "(not --no-timing, not --backend emulator)\n");
    return 2;
  }
  CaseList list;
  list.quick = opt.quick;
  list.check_all = opt.check_all;
  list.softcap = opt.softcap;
  auto numbers = [](const std::string& text, size_t count, std::vector<int64_t>& out) {
    out.clear();
    size_t pos = 0;
    while (pos <= text.size()) {
      const size_t slash = std::min(text.find('/', pos), text.size());
      const std::string part = text.substr(pos, slash - pos);
      if (part.empty() || part.find_first_not_of("0123456789") != std::string::npos) return false;
      out.push_back(std::stoll(part));
      pos = slash + 1;
    }
    return out.size() == count && std::all_of(out.begin(), out.end(), [](int64_t v) { return v > 0; });
  };
  std::vector<int64_t> v;
  if (!opt.shapes.empty()) list.shapes.clear();
  for (const std::string& text : opt.shapes) {
    if (!numbers(text, 4, v) || v[0] % v[1] != 0) {
      std::fprintf(stderr, "bench_attention: --shape '%s': give HQ/HKV/D/S, positive, HQ a multiple of HKV "
                           "(e.g. 32/8/128/8192)\n", text.c_str());
      return 2;
    }
    list.shapes.push_back({v[0], v[1], v[2], v[3]});
  }
  if (!list.shapes.empty() && !opt.shapes.empty()) list.varlen_heads = {list.shapes[0].hq, list.shapes[0].hkv, list.shapes[0].d, 0};
  if (!opt.varlen.empty()) {
    if (!numbers(opt.varlen, 3, v) || v[1] > v[2] || v[0] < v[1]) {
      std::fprintf(stderr, "bench_attention: --varlen '%s': give TOTAL/MIN/MAX with MIN <= MAX and MIN <= TOTAL "
                           "(e.g. 16384/128/8192)\n", opt.varlen.c_str());
      return 2;
    }
    list.varlen_tokens = v[0];
    list.varlen_min = v[1];
    list.varlen_max = v[2];
  }

  std::vector<Case> cases;
  std::vector<Group> groups;
  build_cases(list, cases, groups);
  if (!opt.only.empty()) {
    std::vector<Case> kept;
    std::vector<Group> kept_groups;
    for (const Group& g : groups) {
      Group n{g.shape, g.lens, {}, 0};
      for (size_t i : g.cases)
        if (cases[i].label.find(opt.only) != std::string::npos) {
          Case c = cases[i];
          c.group = kept_groups.size();
          n.cases.push_back(kept.size());
          n.tokens = std::max(n.tokens, c.tokens());
          kept.push_back(std::move(c));
        }
      kept_groups.push_back(std::move(n));  // empty groups keep the varlen/dense pairing by index
    }
    cases = std::move(kept);
    groups = std::move(kept_groups);
  }
  if (opt.list) {
    for (const Case& c : cases)
      std::printf("%-44s B=%lld S=%lld %lld/%lld D=%lld %s%s  %.3g forward FLOPs\n", c.label.c_str(),
                  (long long)c.batch, (long long)c.shape.seq, (long long)c.shape.hq, (long long)c.shape.hkv,
                  (long long)c.shape.d, mask_name(c.causal), c.check ? ", checked" : "", c.forward_flops());
    return 0;
  }

  for (const char* name : {"attention", "attention_bwd"})
    if (auto op = kiln::find_op(name); !op) {
      std::printf("bench_attention: the op '%s' is not built into this Kiln (%s); nothing to benchmark\n", name,
                  op.error().message.c_str());
      return 0;
    }
  if (opt.dry_run) return dry_run(opt, cases);
  if (opt.csv.empty()) {
    std::fprintf(stderr, "bench_attention: give the output CSV (bench_attention OUT.csv [--quick]); --help\n");
    return 2;
  }

  kiln::RuntimeOptions o;
  o.backend = opt.backend;
  o.emulator_target = opt.emulator_target;
  o.device = opt.device;
  o.nvidia_compiler = opt.compiler;
  auto rt = kiln::Runtime::create(o);
  if (!rt || !(*rt)->device()) {
    std::printf("bench_attention: skipped, no %s: %s\n", opt.backend == "cuda" ? "NVIDIA GPU" : "emulator",
                rt ? "the runtime has no device" : rt.error().message.c_str());
    return 0;
  }
  Bench b;
  b.opt = opt;
  b.rt = rt->get();
  b.dev = b.rt->device();
  b.fwd_op = *kiln::find_op("attention");
  b.bwd_op = *kiln::find_op("attention_bwd");
  const uint64_t seed = opt.seed ? opt.seed : std::random_device{}();
  b.rng.seed(seed);
  if (auto r = opt.timing ? b.flush.allocate(*b.dev, kFlushBytes) : kiln::ok(); !r) {
    std::fprintf(stderr, "bench_attention: %s\n", r.error().message.c_str());
    return 1;
  }
  std::printf("bench_attention: %s (%s, %d SMs), Kiln cache %s, %s run: %zu cases, seed %llu, ",
              b.dev->name().c_str(), std::string(b.dev->target().name).c_str(), b.dev->compute_units(),
              b.rt->cache_dir().empty() ? "(memory only)" : b.rt->cache_dir().c_str(), opt.quick ? "quick" : "full",
              cases.size(), static_cast<unsigned long long>(seed));
  if (opt.timing)
    std::printf("about %.0f ms of device time per measurement (%d..%d reps)\n", opt.budget_ms, opt.min_reps,
                opt.max_reps);
  else
    std::printf("no timing (check only)\n");
  std::fflush(stdout);
  return run(b, cases, groups);
}
