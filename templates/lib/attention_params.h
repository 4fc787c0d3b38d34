// Host helpers of the attention ops (attention, attention_bwd): parameters, shapes, validation,
// masks, variable-length offsets, the fp64 forward reference and the test specs. Part of the
// library (templates/lib/): no op folder includes another's. Header-only (inline).
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <map>
#include <new>
#include <random>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "support/parallel.h"
#include "templates/op_template.h"

namespace kiln::attention_params {

inline constexpr std::string_view kLayouts[] = {"bshd", "thd"};
enum Layout : int64_t { kBshd = 0, kThd = 1 };
inline constexpr int64_t kInt32Max = (int64_t{1} << 31) - 1;
inline constexpr int64_t kNoWindow = -1;  // window_left / window_right: every key on that side

// The parameters shared by attention and attention_bwd, in `kiln ops` order.
inline const ParamInfo kParams[] = {
    {"layout", "bshd: [batch, seqlen, heads, dim], fixed length; thd: [total, heads, dim] packed with cu_seqlens offsets",
     true, false, 0, 1, kLayouts, 0},
    {"batch", "sequences; a runtime argument (0 is a no-op)", false, false, 0, kInt32Max},
    {"seqlen_q", "bshd: query length (runtime)", false, false, 0, kInt32Max, {}, 0},
    {"seqlen_k", "bshd: key length (runtime)", false, false, 0, kInt32Max, {}, 0},
    {"total_q", "thd: query tokens, rows of q (runtime)", false, false, 0, kInt32Max, {}, 0},
    {"total_k", "thd: key tokens, rows of k and v (runtime)", false, false, 0, kInt32Max, {}, 0},
    {"max_seqlen_q", "thd: longest query sequence (runtime; sizes the grid)", false, false, 0, kInt32Max, {}, 0},
    {"max_seqlen_k", "thd: longest key sequence (runtime)", false, false, 0, kInt32Max, {}, 0},
    {"heads", "query heads Hq", true, false, 1, 1024},
    {"kv_heads", "key/value heads Hkv (heads % kv_heads == 0; GQA, MQA = 1)", true, false, 1, 1024},
    {"head_dim", "D of q and k: 64, 128, 192 or 256", true, false, 1, 256},
    {"head_dim_v", "D of v and out (0 = head_dim): 64, 128, 192 or 256", true, false, 0, 256, {}, 0},
    {"causal", "bottom-right aligned causal mask (FlashAttention 2.1+)", true, true, 0, 1, {}, 0},
    {"window_left", "sliding window: keys before the diagonal a query sees (-1 = all)", true, false, -1, kInt32Max, {},
     kNoWindow},
    {"window_right", "sliding window: keys after the diagonal a query sees (-1 = all)", true, false, -1, kInt32Max, {},
     kNoWindow},
    {"softcap", "logit softcap (an integer; 0 = none): score = softcap * tanh(score / softcap)", true, false, 0, 100000,
     {}, 0},
    {"q_row_stride",
     "elements between consecutive tokens' rows of q (and dq); 0 = contiguous (heads * head_dim); a multiple of 8 "
     "(runtime; a column view of a fused qkv)",
     false, false, 0, kInt32Max, {}, 0},
    {"k_row_stride",
     "elements between consecutive tokens' rows of k (and dk); 0 = contiguous (kv_heads * head_dim); a multiple of 8 "
     "(runtime)",
     false, false, 0, kInt32Max, {}, 0},
    {"v_row_stride",
     "elements between consecutive tokens' rows of v (and dv); 0 = contiguous (kv_heads * head_dim_v); a multiple of "
     "8 (runtime)",
     false, false, 0, kInt32Max, {}, 0},
};

inline const ScalarInfo kScalars[] = {
    {"softmax_scale", 0.0f, "multiplies q k^T; 0 = 1 / sqrt(head_dim)"},
};
inline const DType kDTypes[] = {DType::bf16, DType::f16};

inline bool thd(const KernelSpec& s) { return s.param("layout") == kThd; }
inline int64_t tokens_q(const KernelSpec& s) { return thd(s) ? s.param("total_q") : s.param("batch") * s.param("seqlen_q"); }
inline int64_t tokens_k(const KernelSpec& s) { return thd(s) ? s.param("total_k") : s.param("batch") * s.param("seqlen_k"); }
inline int64_t dim_v(const KernelSpec& s) { return s.param("head_dim_v") ? s.param("head_dim_v") : s.param("head_dim"); }
// The sliding window's limits, kNoWindow where the spec leaves them out (a spec that has not been
// through with_defaults, or a baked one: KernelSpec::param reads an absent parameter as 0, a window
// of no key).
inline int64_t window_left(const KernelSpec& s) { return s.param("window_left", kNoWindow); }
inline int64_t window_right(const KernelSpec& s) { return s.param("window_right", kNoWindow); }
// Whether some query sees only part of the keys: causal, or a sliding window on either side (the
// kernel heuristics of both ops: item orders, key blocks, the backward's atomic dQ).
inline bool masked(const KernelSpec& s) { return s.param("causal") || window_left(s) >= 0 || window_right(s) >= 0; }
// The longest sequence (the grid's extent).
inline int64_t max_len_q(const KernelSpec& s) { return thd(s) ? s.param("max_seqlen_q") : s.param("seqlen_q"); }
inline int64_t max_len_k(const KernelSpec& s) { return thd(s) ? s.param("max_seqlen_k") : s.param("seqlen_k"); }

// (query, key) pairs of one head before masking, for flops(): bshd batch * seqlen_q * seqlen_k;
// thd the sum over sequences of their lengths' product, which the spec does not carry: the least
// of total_q * max_seqlen_k, max_seqlen_q * total_k and total_q * total_k, exact with one sequence
// and where every query (or key) sequence has the longest length, else an upper bound.
inline double pairs(const KernelSpec& s) {
  if (!thd(s)) return static_cast<double>(s.param("batch")) * static_cast<double>(s.param("seqlen_q")) *
                      static_cast<double>(s.param("seqlen_k"));
  const double tq = static_cast<double>(s.param("total_q")), tk = static_cast<double>(s.param("total_k"));
  const double mq = static_cast<double>(s.param("max_seqlen_q")), mk = static_cast<double>(s.param("max_seqlen_k"));
  return std::min({tq * mk, mq * tk, tq * tk});
}

// Row strides (elements between consecutive tokens) of q, k, v and of dq, dk, dv: the parameter,
// or the contiguous one when it is 0.
inline int64_t q_stride(const KernelSpec& s) {
  return s.param("q_row_stride") ? s.param("q_row_stride") : s.param("heads") * s.param("head_dim");
}
inline int64_t k_stride(const KernelSpec& s) {
  return s.param("k_row_stride") ? s.param("k_row_stride") : s.param("kv_heads") * s.param("head_dim");
}
inline int64_t v_stride(const KernelSpec& s) {
  return s.param("v_row_stride") ? s.param("v_row_stride") : s.param("kv_heads") * dim_v(s);
}

inline std::vector<int64_t> rows3(const KernelSpec& s, int64_t tokens, int64_t seqlen, int64_t heads, int64_t dim) {
  if (thd(s)) return {tokens, heads, dim};
  return {s.param("batch"), seqlen, heads, dim};
}
// A strided view's shape is the memory its rows span: [tokens, stride] (bshd: [batch, seqlen,
// stride]), the heads in the first heads * dim columns of each row.
inline std::vector<int64_t> strided(const KernelSpec& s, int64_t tokens, int64_t seqlen, int64_t stride) {
  if (thd(s)) return {tokens, stride};
  return {s.param("batch"), seqlen, stride};
}
inline std::vector<int64_t> q_shape(const KernelSpec& s) {
  if (s.param("q_row_stride")) return strided(s, tokens_q(s), s.param("seqlen_q"), s.param("q_row_stride"));
  return rows3(s, tokens_q(s), s.param("seqlen_q"), s.param("heads"), s.param("head_dim"));
}
inline std::vector<int64_t> k_shape(const KernelSpec& s) {
  if (s.param("k_row_stride")) return strided(s, tokens_k(s), s.param("seqlen_k"), s.param("k_row_stride"));
  return rows3(s, tokens_k(s), s.param("seqlen_k"), s.param("kv_heads"), s.param("head_dim"));
}
inline std::vector<int64_t> v_shape(const KernelSpec& s) {
  if (s.param("v_row_stride")) return strided(s, tokens_k(s), s.param("seqlen_k"), s.param("v_row_stride"));
  return rows3(s, tokens_k(s), s.param("seqlen_k"), s.param("kv_heads"), dim_v(s));
}
inline std::vector<int64_t> o_shape(const KernelSpec& s) {
  return rows3(s, tokens_q(s), s.param("seqlen_q"), s.param("heads"), dim_v(s));
}
inline std::vector<int64_t> lse_shape(const KernelSpec& s) { return {s.param("heads"), tokens_q(s)}; }
inline std::vector<int64_t> cu_shape(const KernelSpec& s) { return {s.param("batch") + 1}; }

inline constexpr std::string_view kQDoc =
    "[total_q, heads, head_dim] (thd) or [batch, seqlen_q, heads, head_dim] (bshd); with q_row_stride: [total_q, "
    "q_row_stride] or [batch, seqlen_q, q_row_stride], heads x head_dim used per row";
inline constexpr std::string_view kKDoc =
    "[total_k, kv_heads, head_dim] (thd) or [batch, seqlen_k, kv_heads, head_dim] (bshd); with k_row_stride: "
    "[total_k, k_row_stride] or [batch, seqlen_k, k_row_stride], kv_heads x head_dim used per row";
inline constexpr std::string_view kVDoc =
    "[total_k, kv_heads, head_dim_v] (thd) or [batch, seqlen_k, kv_heads, head_dim_v] (bshd); with v_row_stride: "
    "[total_k, v_row_stride] or [batch, seqlen_k, v_row_stride], kv_heads x head_dim_v used per row";
inline constexpr std::string_view kODoc =
    "[total_q, heads, head_dim_v] (thd) or [batch, seqlen_q, heads, head_dim_v] (bshd)";
inline constexpr std::string_view kLseDoc = "[heads, total_q] (bshd: total_q = batch * seqlen_q)";

inline bool supported_dim(int64_t d) { return d == 64 || d == 128 || d == 192 || d == 256; }

// The rules of both ops; `op` names the op in messages.
inline Result<void> validate_rules(std::string_view op, const KernelSpec& given, const KernelSpec& s) {
  auto bad = [&](std::string msg) { return make_error(Errc::invalid_argument, fmt::format("{}: {}", op, msg)); };
  const int64_t h = s.param("heads"), hkv = s.param("kv_heads");
  if (h % hkv != 0)
    return bad(fmt::format("heads = {} is not a multiple of kv_heads = {}; each key/value head serves heads / kv_heads "
                           "query heads (GQA): use a kv_heads that divides heads",
                           h, hkv));
  if (!supported_dim(s.param("head_dim")))
    return bad(fmt::format("head_dim = {} is not supported; use 64, 128, 192 or 256", s.param("head_dim")));
  if (s.param("head_dim_v") != 0 && !supported_dim(s.param("head_dim_v")))
    return bad(fmt::format("head_dim_v = {} is not supported; use 0 (= head_dim), 64, 128, 192 or 256",
                           s.param("head_dim_v")));
  if (s.param("causal") && window_right(s) > 0)
    return bad(fmt::format("causal with window_right = {}: a causal query sees no key after the diagonal; use "
                           "window_right = 0 or -1 with causal, or causal = 0 for a two-sided window",
                           window_right(s)));
  const std::pair<const char*, int64_t> strides[] = {{"q_row_stride", h * s.param("head_dim")},
                                                     {"k_row_stride", hkv * s.param("head_dim")},
                                                     {"v_row_stride", hkv * dim_v(s)}};
  for (auto [p, contiguous] : strides) {
    const int64_t v = s.param(p);
    if (v != 0 && v < contiguous)
      return bad(fmt::format("{} = {} is below the {} elements of a token's heads; give 0 (contiguous) or a stride >= "
                             "{}",
                             p, v, contiguous, contiguous));
    if (v % 8 != 0)
      return bad(fmt::format("{} = {} is not a multiple of 8 elements: rows are read and written 16 bytes at a time; "
                             "give a multiple of 8 (or 0, contiguous)",
                             p, v));
  }
  const char* other[] = {"total_q", "total_k", "max_seqlen_q", "max_seqlen_k"};
  const char* mine[] = {"seqlen_q", "seqlen_k"};
  if (thd(s)) {
    for (const char* p : mine)
      if (given.params.count(p) && given.param(p) != 0)  // 0, the default, is not giving it
        return bad(fmt::format("'{}' belongs to layout=bshd; with layout=thd give total_q, total_k, max_seqlen_q and "
                               "max_seqlen_k",
                               p));
    const int64_t b = s.param("batch");
    for (auto [total, max] : {std::pair{"total_q", "max_seqlen_q"}, std::pair{"total_k", "max_seqlen_k"}}) {
      if (s.param(total) > b * s.param(max))
        return bad(fmt::format("{} = {} tokens cannot fit batch = {} sequences of at most {} = {}; raise {} to the "
                               "longest sequence",
                               total, s.param(total), b, max, s.param(max), max));
    }
  } else {
    for (const char* p : other)
      if (given.params.count(p) && given.param(p) != 0)
        return bad(fmt::format("'{}' belongs to layout=thd; with layout=bshd give seqlen_q and seqlen_k", p));
    for (const char* p : mine)
      if (s.param("batch") * s.param(p) > kInt32Max)
        return bad(fmt::format("batch x {} = {} tokens is above the 2^31 - 1 that int32 token offsets hold; split "
                               "the batch",
                               p, s.param("batch") * s.param(p)));
  }
  return ok();
}

// Where sequence b starts and how long it is, from the inputs' offsets (thd) or the fixed lengths.
struct Seq {
  int64_t q0, lq, k0, lk;
};
inline Seq sequence(const KernelSpec& s, std::span<const float> cu_q, std::span<const float> cu_k, int64_t b) {
  if (thd(s)) {
    const int64_t q0 = static_cast<int64_t>(cu_q[b]), k0 = static_cast<int64_t>(cu_k[b]);
    return {q0, static_cast<int64_t>(cu_q[b + 1]) - q0, k0, static_cast<int64_t>(cu_k[b + 1]) - k0};
  }
  const int64_t lq = s.param("seqlen_q"), lk = s.param("seqlen_k");
  return {b * lq, lq, b * lk, lk};
}

// Whether query i sees key j of a sequence with lq queries and lk keys (bottom-right aligned).
inline bool visible(const KernelSpec& s, int64_t i, int64_t j, int64_t lq, int64_t lk) {
  const int64_t d = j - (i + lk - lq);
  if (s.param("causal") && d > 0) return false;
  if (window_right(s) >= 0 && d > window_right(s)) return false;
  if (window_left(s) >= 0 && d < -window_left(s)) return false;
  return true;
}

inline double softmax_scale(const KernelSpec& s, float given) {
  return given != 0.0f ? static_cast<double>(given) : 1.0 / std::sqrt(static_cast<double>(s.param("head_dim")));
}

// Random offsets [batch + 1] for `total` tokens, no sequence longer than `max_len`; with 3 or more
// sequences and room to spare, sequence 1 is empty.
inline std::vector<float> random_offsets(int64_t batch, int64_t total, int64_t max_len, std::mt19937_64& rng) {
  std::vector<int64_t> len(static_cast<size_t>(batch), 0);
  const bool empty_one = batch >= 3 && total <= (batch - 1) * max_len;
  std::vector<int64_t> open;
  for (int64_t b = 0; b < batch; ++b)
    if (!(empty_one && b == 1)) open.push_back(b);
  // The first open sequence gets the longest length it can, so that max_len is reached.
  int64_t left = total;
  if (!open.empty() && left > 0) {
    len[open.front()] = std::min(max_len, left);
    left -= len[open.front()];
  }
  while (left > 0) {
    std::uniform_int_distribution<size_t> pick(0, open.size() - 1);
    const size_t i = pick(rng);
    if (len[open[i]] < max_len) {
      ++len[open[i]];
      --left;
    }
  }
  std::shuffle(len.begin() + (empty_one ? 2 : 0), len.end(), rng);  // keep sequence 1 empty
  std::vector<float> cu(static_cast<size_t>(batch + 1), 0.0f);
  for (int64_t b = 0; b < batch; ++b) cu[b + 1] = cu[b] + static_cast<float>(len[b]);
  return cu;
}

// The references' work items: one sequence, one head and up to 64 of its query rows (or key
// rows), so that parallel_for spreads a long sequence of one head over every core (the fp64
// references at model sizes took minutes on one thread).
struct RefItem {
  Seq seq;
  int64_t h, r0, r1;
};
inline std::vector<RefItem> ref_items(const KernelSpec& s, std::span<const float> cu_q, std::span<const float> cu_k,
                                      int64_t heads, bool key_rows) {
  constexpr int64_t kRows = 64;
  std::vector<RefItem> items;
  for (int64_t b = 0; b < s.param("batch"); ++b) {
    const Seq sq = sequence(s, cu_q, cu_k, b);
    const int64_t n = key_rows ? sq.lk : sq.lq;
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t r = 0; r < n; r += kRows) items.push_back({sq, h, r, std::min(n, r + kRows)});
  }
  return items;
}

// parallel_for over the items; body(item, scratch) must not throw, and an allocation failure in a
// worker (its scratch) is rethrown here as std::bad_alloc, in the calling thread, where the check
// path turns it into an error.
template <class Body>
void for_each_ref_item(const std::vector<RefItem>& items, size_t scratch_size, Body&& body) {
  std::atomic<bool> failed{false};
  parallel_for(items.size(), 1, [&](size_t begin, size_t end) {
    try {
      std::vector<double> scratch(scratch_size);
      for (size_t w = begin; w < end; ++w) body(items[w], scratch);
    } catch (...) {
      failed = true;
    }
  });
  if (failed) throw std::bad_alloc();
}

// The fp64 forward of query row i of sequence sq and head h: out_row [Dv] and the row's lse
// (out 0 and lse -inf where no key is visible). scratch: the row's scores [sq.lk], then an
// accumulator [Dv].
inline void forward_row(const KernelSpec& s, double scale, std::span<const float> q, std::span<const float> k,
                        std::span<const float> v, const Seq& sq, int64_t h, int64_t i, double* scratch,
                        double* out_row, double& lse) {
  const int64_t H = s.param("heads"), Hkv = s.param("kv_heads"), D = s.param("head_dim"), Dv = dim_v(s);
  const int64_t hk = h / (H / Hkv), qs = q_stride(s), ks = k_stride(s), vs = v_stride(s);
  const double cap = static_cast<double>(s.param("softcap"));
  double* sc = scratch;
  double* acc = scratch + sq.lk;
  const float* qi = &q[static_cast<size_t>((sq.q0 + i) * qs + h * D)];
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t j = 0; j < sq.lk; ++j) {
    if (!visible(s, i, j, sq.lq, sq.lk)) continue;
    const float* kj = &k[static_cast<size_t>((sq.k0 + j) * ks + hk * D)];
    double dot = 0;
    for (int64_t c = 0; c < D; ++c) dot += double(qi[c]) * kj[c];
    double x = dot * scale;
    if (cap > 0) x = cap * std::tanh(x / cap);
    sc[j] = x;
    mx = std::max(mx, x);
  }
  std::fill(out_row, out_row + Dv, 0.0);
  lse = mx;
  if (mx == -std::numeric_limits<double>::infinity()) return;  // no visible key: out 0, lse -inf
  double sum = 0;
  std::fill(acc, acc + Dv, 0.0);
  for (int64_t j = 0; j < sq.lk; ++j) {
    if (!visible(s, i, j, sq.lq, sq.lk)) continue;
    const double p = std::exp(sc[j] - mx);
    sum += p;
    const float* vj = &v[static_cast<size_t>((sq.k0 + j) * vs + hk * Dv)];
    for (int64_t c = 0; c < Dv; ++c) acc[c] += p * vj[c];
  }
  for (int64_t c = 0; c < Dv; ++c) out_row[c] = acc[c] / sum;
  lse = mx + std::log(sum);
}

// The longest key sequence (the forward rows' scratch).
inline int64_t longest_k(const KernelSpec& s, std::span<const float> cu_q, std::span<const float> cu_k) {
  int64_t longest = 0;
  for (int64_t b = 0; b < s.param("batch"); ++b) longest = std::max(longest, sequence(s, cu_q, cu_k, b).lk);
  return longest;
}

// The fp64 forward of every row: out [tokens_q, heads, dv] and lse [heads, tokens_q].
inline void forward(const KernelSpec& s, double scale, std::span<const float> q, std::span<const float> k,
                    std::span<const float> v, std::span<const float> cu_q, std::span<const float> cu_k,
                    std::vector<double>& out, std::vector<double>& lse) {
  const int64_t H = s.param("heads"), Dv = dim_v(s), Tq = tokens_q(s);
  out.assign(static_cast<size_t>(Tq * H * Dv), 0.0);
  lse.assign(static_cast<size_t>(H * Tq), -std::numeric_limits<double>::infinity());
  const int64_t longest = longest_k(s, cu_q, cu_k);
  for_each_ref_item(ref_items(s, cu_q, cu_k, H, false), static_cast<size_t>(longest + Dv),
                    [&](const RefItem& it, std::vector<double>& scratch) {
    for (int64_t i = it.r0; i < it.r1; ++i)
      forward_row(s, scale, q, k, v, it.seq, it.h, i, scratch.data(),
                  &out[static_cast<size_t>(((it.seq.q0 + i) * H + it.h) * Dv)],
                  lse[static_cast<size_t>(it.h * Tq + it.seq.q0 + i)]);
  });
}

// ---- Sampled references (reference()'s `rows`): a row is a token, b * seqlen + s in the bshd
// layout (the tensors' first dimension there is the batch, so the check's rows are tokens through
// sample_dimension). Each sampled token's rows are computed whole (every head), and reported as
// elements (RefOutput::elements): the token rows of out / dq / dk / dv and the token's entries of
// lse [heads, tokens_q].

// Where token t (a query token, or with `key` a key token) lies: its sequence and its place in it;
// false for a thd token past the last offset (no sequence: the full reference leaves it at zero).
inline bool locate(const KernelSpec& s, std::span<const float> cu_q, std::span<const float> cu_k, int64_t t, bool key,
                   Seq& seq, int64_t& i) {
  const int64_t batch = s.param("batch");
  if (!thd(s)) {
    const int64_t len = s.param(key ? "seqlen_k" : "seqlen_q");
    if (len <= 0 || t / len >= batch) return false;
    seq = sequence(s, cu_q, cu_k, t / len);
    i = t % len;
    return true;
  }
  const std::span<const float> cu = key ? cu_k : cu_q;
  // The last sequence that starts at or before t (an empty one holds no token: the next non-empty
  // one starts at the same offset and is found instead).
  const auto after = std::upper_bound(cu.begin(), cu.begin() + batch + 1, static_cast<float>(t));
  const int64_t b = static_cast<int64_t>(after - cu.begin()) - 1;
  if (b < 0 || b >= batch) return false;
  seq = sequence(s, cu_q, cu_k, b);
  i = t - (key ? seq.k0 : seq.q0);
  return i >= 0 && i < (key ? seq.lk : seq.lq);
}

// The sampled rows as tokens of a side with `tokens` tokens out of the `n` rows sampled from
// (sample_dimension): row r is token r tokens / n (the first and last rows map to the first and
// last tokens), ascending and without repeats.
inline std::vector<int64_t> sampled_tokens(std::span<const int64_t> rows, int64_t n, int64_t tokens) {
  std::vector<int64_t> t;
  for (int64_t r : rows) {
    const int64_t x = n > 0 ? r * tokens / n : 0;  // below 2^62: both are int32 counts
    if (x >= 0 && x < tokens && (t.empty() || t.back() != x)) t.push_back(x);
  }
  return t;
}

// The elements of whole token rows `stride` elements long, with the values of row n (token
// tokens[n]) from row_values(n, double* row), on every core: ascending when the tokens are. An
// allocation failure in a worker is rethrown here as std::bad_alloc (as for_each_ref_item).
template <class RowValues>
void token_rows(std::span<const int64_t> tokens, int64_t stride, RefOutput& out, RowValues&& row_values) {
  const size_t w = static_cast<size_t>(stride);
  out.rows.clear();
  out.elements.resize(tokens.size() * w);
  out.values.resize(tokens.size() * w);
  for (size_t n = 0; n < tokens.size(); ++n)
    for (size_t c = 0; c < w; ++c) out.elements[n * w + c] = tokens[n] * stride + static_cast<int64_t>(c);
  std::atomic<bool> failed{false};
  parallel_for(tokens.size(), 1, [&](size_t begin, size_t end) {
    try {
      for (size_t n = begin; n < end; ++n) row_values(n, &out.values[n * w]);
    } catch (...) {
      failed = true;
    }
  });
  if (failed) throw std::bad_alloc();
}

// The fp64 forward of the query tokens `tokens` (ascending): out's token rows and their lse
// entries (lse [heads, tokens_q]: head-major, so its elements are h * tokens_q + t).
inline void forward_tokens(const KernelSpec& s, double scale, std::span<const float> q, std::span<const float> k,
                           std::span<const float> v, std::span<const float> cu_q, std::span<const float> cu_k,
                           std::span<const int64_t> tokens, RefOutput& out, RefOutput& lse) {
  const int64_t H = s.param("heads"), Dv = dim_v(s), Tq = tokens_q(s);
  const size_t n = tokens.size(), heads = static_cast<size_t>(H);
  std::vector<double> lse_of(n * heads, -std::numeric_limits<double>::infinity());  // [token][head]
  const size_t scratch = static_cast<size_t>(longest_k(s, cu_q, cu_k) + Dv);
  token_rows(tokens, H * Dv, out, [&](size_t m, double* row) {
    std::fill(row, row + H * Dv, 0.0);
    Seq sq;
    int64_t i;
    if (!locate(s, cu_q, cu_k, tokens[m], false, sq, i)) return;
    std::vector<double> work(scratch);
    for (int64_t h = 0; h < H; ++h)
      forward_row(s, scale, q, k, v, sq, h, i, work.data(), row + h * Dv, lse_of[m * heads + static_cast<size_t>(h)]);
  });
  lse.rows.clear();
  lse.elements.clear();
  lse.values.clear();
  for (size_t h = 0; h < heads; ++h)
    for (size_t m = 0; m < n; ++m) {
      lse.elements.push_back(static_cast<int64_t>(h) * Tq + tokens[m]);
      lse.values.push_back(lse_of[m * heads + h]);
    }
}

// Zeros for an output view of `tokens` rows `stride` elements apart with `used` columns written,
// NaN in the columns the op leaves unwritten (the check path compares those with the NaN poison:
// they must keep it).
inline std::vector<double> strided_zeros(int64_t tokens, int64_t stride, int64_t used) {
  std::vector<double> v(static_cast<size_t>(tokens * stride), 0.0);
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t c = used; c < stride; ++c) v[static_cast<size_t>(t * stride + c)] = std::numeric_limits<double>::quiet_NaN();
  return v;
}

// Fills q, k, v uniformly (q three times wider, so that softmax rows are not flat) and, with
// thd, random offsets with an empty sequence.
inline void init_qkv(const KernelSpec& s, std::span<const TensorInfo> inputs, std::vector<std::vector<float>>& values,
                     std::mt19937_64& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  values.resize(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    values[i].resize(static_cast<size_t>(inputs[i].elements()));
    if (is_integer(inputs[i].dtype)) continue;
    const float width = inputs[i].name == "q" ? 3.0f : 1.0f;
    for (float& x : values[i]) {
      do x = round_to_dtype(width * dist(rng), inputs[i].dtype);
      while (x == 0.0f);
    }
  }
  if (!thd(s)) return;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].name == "cu_seqlens_q")
      values[i] = random_offsets(s.param("batch"), s.param("total_q"), s.param("max_seqlen_q"), rng);
    if (inputs[i].name == "cu_seqlens_k")
      values[i] = random_offsets(s.param("batch"), s.param("total_k"), s.param("max_seqlen_k"), rng);
  }
}

inline std::span<const float> input(std::span<const std::vector<float>> in, std::span<const TensorInfo> ts,
                                    std::string_view name) {
  for (size_t i = 0; i < ts.size() && i < in.size(); ++i)
    if (ts[i].name == name) return in[i];
  return {};
}

// 16 bytes for the bf16/fp16 tensors (16-byte accesses), 1 for the offsets and fp32 lse.
inline std::vector<uint32_t> alignment(std::span<const TensorInfo> ts) {
  std::vector<uint32_t> out;
  for (const TensorInfo& t : ts) out.push_back(t.dtype == DType::bf16 || t.dtype == DType::f16 ? 16 : 1);
  return out;
}

// Baked constants both ops' device templates read.
inline std::string specialize_common(const KernelSpec& s) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.param("head_dim")));
  return fmt::format(
      "constexpr int HEADS = {}, KV_HEADS = {}, HEAD_DIM = {}, HEAD_DIM_V = {};\n#define THD {}\n"
      "constexpr bool CAUSAL = {};\nconstexpr int WINDOW_LEFT = {}, WINDOW_RIGHT = {};\n"
      "constexpr float SOFTCAP = {}.0f;\nconstexpr float DEFAULT_SCALE = {:.9e}f;\ntypedef {} in_t;\n",
      s.param("heads"), s.param("kv_heads"), s.param("head_dim"), dim_v(s), thd(s) ? 1 : 0,
      s.param("causal") ? "true" : "false", window_left(s), window_right(s), s.param("softcap"), scale,
      device_type_name(s.dtype));
}


// The test specs of both ops (the backward adds `deterministic` to some): odd lengths, GQA, MQA,
// causal with seqlen_q < and > seqlen_k, sliding windows, softcap, thd with an empty sequence,
// head_dim 64, 128, 256 and 192/128, bf16 and fp16, no tokens; small enough for the CDNA
// emulator (at most 256 KiB moved), and larger ones for GPUs.
inline std::vector<TestSpec> test_specs(std::string_view op, bool backward) {
  std::vector<TestSpec> out;
  auto bshd = [&](DType t, int64_t b, int64_t sq, int64_t sk, int64_t h, int64_t hkv, int64_t d,
                  std::map<std::string, int64_t> extra, std::string_view why) {
    KernelSpec s{std::string(op), t, t, {{"batch", b}, {"seqlen_q", sq}, {"seqlen_k", sk}, {"heads", h},
                                         {"kv_heads", hkv}, {"head_dim", d}}};
    s.params.insert(extra.begin(), extra.end());
    out.push_back({std::move(s), why});
  };
  auto thd_spec = [&](DType t, int64_t b, int64_t tq, int64_t tk, int64_t mq, int64_t mk, int64_t h, int64_t hkv,
                      int64_t d, std::map<std::string, int64_t> extra, std::string_view why) {
    KernelSpec s{std::string(op), t, t, {{"layout", kThd}, {"batch", b}, {"total_q", tq}, {"total_k", tk},
                                         {"max_seqlen_q", mq}, {"max_seqlen_k", mk}, {"heads", h},
                                         {"kv_heads", hkv}, {"head_dim", d}}};
    s.params.insert(extra.begin(), extra.end());
    out.push_back({std::move(s), why});
  };
  const std::map<std::string, int64_t> none, causal = {{"causal", 1}};
  const std::map<std::string, int64_t> det = backward ? std::map<std::string, int64_t>{{"deterministic", 1}} : none;
  bshd(DType::bf16, 2, 17, 17, 2, 2, 64, none, "odd length 17, MHA, no mask");
  bshd(DType::f16, 1, 33, 80, 4, 1, 64, causal, "MQA, causal with seqlen_q < seqlen_k (bottom-right)");
  bshd(DType::bf16, 2, 45, 20, 4, 2, 64, causal, "GQA, causal with seqlen_q > seqlen_k: rows with no key");
  bshd(DType::bf16, 1, 40, 40, 2, 1, 64, {{"window_left", 7}, {"window_right", 3}}, "sliding window 7/3");
  bshd(DType::f16, 1, 37, 37, 2, 2, 128, {{"causal", 1}, {"window_left", 9}}, "causal sliding window 9, head_dim 128");
  bshd(DType::bf16, 1, 30, 50, 2, 1, 64, {{"softcap", 2}}, "logit softcap 2");
  bshd(DType::f16, 1, 40, 24, 4, 1, 128, none,
       "MQA without a mask at head_dim 128 (sm_90a's backward: the atomic dQ, dQ's columns split between the consumers)");
  std::map<std::string, int64_t> thd_causal = causal;
  thd_causal.insert(det.begin(), det.end());
  thd_spec(DType::bf16, 4, 70, 90, 40, 50, 4, 2, 64, thd_causal, "thd varlen with an empty sequence, GQA, causal");
  thd_spec(DType::f16, 3, 25, 30, 20, 20, 2, 1, 128, none, "thd varlen fp16, head_dim 128");
  bshd(DType::bf16, 1, 20, 24, 1, 1, 256, det, "head_dim 256");
  bshd(DType::bf16, 1, 19, 33, 2, 1, 192, {{"head_dim_v", 128}, {"causal", 1}}, "head_dim 192 / head_dim_v 128");
  thd_spec(DType::bf16, 2, 0, 0, 0, 0, 2, 1, 64, none, "no tokens");
  thd_spec(DType::bf16, 2, 0, 10, 0, 6, 2, 1, 64, none, "no queries, 10 keys (the backward writes dk = dv = 0)");
  bshd(DType::bf16, 0, 16, 16, 2, 1, 64, none, "batch 0");
  // Row strides: q, k, v as column views of one fused qkv [tokens, (Hq + 2 Hkv) D] (and, in the
  // backward, dq, dk, dv of one dqkv); then three different strides in bshd.
  std::map<std::string, int64_t> fused = {{"causal", 1}, {"q_row_stride", 512}, {"k_row_stride", 512},
                                          {"v_row_stride", 512}};
  thd_spec(DType::bf16, 3, 24, 24, 12, 12, 4, 2, 64, fused, "thd causal, q/k/v row strides of a fused qkv (Hq 4, Hkv 2)");
  bshd(DType::f16, 2, 9, 11, 2, 1, 64, {{"q_row_stride", 256}, {"k_row_stride", 136}, {"v_row_stride", 72}},
       "bshd, three different row strides");
  bshd(DType::bf16, 2, 300, 300, 8, 2, 128, causal, "GPU size: causal GQA, several tiles");
  bshd(DType::bf16, 1, 333, 333, 4, 2, 64, causal,
       "GPU size: causal GQA at head_dim 64, 1-6 key blocks per query block (odd and even counts: the "
       "sm_90a backward's two-step software pipeline and its tails)");
  thd_spec(DType::bf16, 5, 700, 900, 300, 400, 4, 1, 128, {{"window_left", 64}}, "GPU size: thd, window 64");
  bshd(DType::bf16, 1, 333, 333, 4, 2, 128, {{"causal", 1}, {"softcap", 30}},
       "GPU size: causal with logit softcap 30 at head_dim 128, several tiles");
  if (!backward)  // the persistent forward's later rounds (9 query blocks x 2 x 16 heads = 288 items, more
                  // than two per block of the grid: the snake order's backward rounds run)
    bshd(DType::bf16, 2, 1100, 1100, 16, 4, 128, causal, "GPU size: causal GQA, 288 work items");
  return out;
}

}  // namespace kiln::attention_params
