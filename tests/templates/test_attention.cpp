// attention and attention_bwd: validation messages, the fp64 references (a hand-computed case, and
// the backward against finite differences of the forward), and the two folders' shared host header.
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <fstream>
#include <random>
#include <sstream>

#include "templates/registry.h"
#include "test_util.h"

namespace kiln {
namespace {
using testing::target;

KernelSpec bshd(std::string op, int64_t b, int64_t sq, int64_t sk, int64_t h, int64_t hkv, int64_t d) {
  return {std::move(op), DType::bf16, DType::bf16,
          {{"batch", b}, {"seqlen_q", sq}, {"seqlen_k", sk}, {"heads", h}, {"kv_heads", hkv}, {"head_dim", d}}};
}

// The op's input tensors, in signature order.
std::vector<TensorInfo> inputs_of(const OpTemplate& op, const KernelSpec& s) {
  std::vector<TensorInfo> ins;
  for (const TensorInfo& t : op.tensors(s))
    if (!t.output) ins.push_back(t);
  return ins;
}

void expect_error(const KernelSpec& s, const std::string& needle) {
  const OpTemplate* op = *find_op(s.op);
  auto r = op->validate(s, target("sm_90a"));
  ASSERT_FALSE(r.ok()) << to_string(s);
  EXPECT_NE(r.error().message.find(needle), std::string::npos) << r.error().message;
}

TEST(Attention, ValidationNamesTheParameterAndTheFix) {
  for (const char* op : {"attention", "attention_bwd"}) {
    SCOPED_TRACE(op);
    const OpTemplate* o = *find_op(op);
    EXPECT_TRUE(o->validate(bshd(op, 2, 16, 16, 32, 8, 128), target("gfx942")).ok());
    expect_error(bshd(op, 2, 16, 16, 32, 5, 128), "heads = 32 is not a multiple of kv_heads = 5");
    expect_error(bshd(op, 2, 16, 16, 4, 4, 96), "head_dim = 96 is not supported; use 64, 128, 192 or 256");
    KernelSpec s = bshd(op, 2, 16, 16, 4, 4, 128);
    s.params["head_dim_v"] = 100;
    expect_error(s, "head_dim_v = 100 is not supported");
    s = bshd(op, 2, 16, 16, 4, 4, 128);
    s.params["causal"] = 1;
    s.params["window_right"] = 4;
    expect_error(s, "causal with window_right = 4");
    s.params["window_right"] = 0;
    EXPECT_TRUE(o->validate(s, target("sm_90a")).ok());
    expect_error(bshd(op, 70000, 40000, 16, 4, 4, 128), "above the 2^31 - 1 that int32 token offsets hold");
    s = bshd(op, 2, 16, 16, 4, 4, 128);
    s.params["total_q"] = 32;
    expect_error(s, "'total_q' belongs to layout=thd");
    KernelSpec t{op, DType::bf16, DType::bf16,
                 {{"layout", 1}, {"batch", 2}, {"total_q", 40}, {"total_k", 10}, {"max_seqlen_q", 16},
                  {"max_seqlen_k", 8}, {"heads", 4}, {"kv_heads", 2}, {"head_dim", 64}}};
    expect_error(t, "total_q = 40 tokens cannot fit batch = 2 sequences of at most max_seqlen_q = 16");
    t.params["max_seqlen_q"] = 20;
    EXPECT_TRUE(o->validate(t, target("gfx950")).ok());
    t.params["seqlen_q"] = 20;
    expect_error(t, "'seqlen_q' belongs to layout=bshd");
    t.params.erase("seqlen_q");
    t.params["q_row_stride"] = 4 * 64 + 2 * 2 * 64;  // a fused qkv: (Hq + 2 Hkv) D
    t.params["k_row_stride"] = 512;
    t.params["v_row_stride"] = 512;
    EXPECT_TRUE(o->validate(t, target("gfx942")).ok());
    t.params["k_row_stride"] = 100;
    expect_error(t, "k_row_stride = 100 is below the 128 elements of a token's heads; give 0 (contiguous) or a stride");
    t.params["k_row_stride"] = 0;
    t.params["v_row_stride"] = 132;
    expect_error(t, "v_row_stride = 132 is not a multiple of 8 elements");
    s = bshd(op, 2, 16, 16, 4, 4, 128);
    s.params["q_row_stride"] = 256;
    expect_error(s, "q_row_stride = 256 is below the 512 elements");
  }
}

// q, k, v with row strides (columns of one fused qkv buffer): the references read the strided
// rows as the contiguous tensors they hold, and attention_bwd's dq, dk, dv have the same strides,
// their columns past the heads NaN (unwritten; the check path expects the NaN poison there).
// A spec with its defaults filled in (what OpInterface::with_defaults, the CLI and the runtime
// hand around) is as valid as the spec as given: the other layout's parameters then stand at
// their defaults (0), which is not giving them.
TEST(Attention, ValidateAcceptsASpecWithItsDefaults) {
  for (const char* op : {"attention", "attention_bwd"}) {
    SCOPED_TRACE(op);
    const OpTemplate* o = *find_op(op);
    const KernelSpec t{op, DType::bf16, DType::bf16,
                       {{"layout", 1}, {"batch", 2}, {"total_q", 30}, {"total_k", 10}, {"max_seqlen_q", 20},
                        {"max_seqlen_k", 8}, {"heads", 4}, {"kv_heads", 2}, {"head_dim", 64}}};
    ASSERT_TRUE(o->validate(t, target("sm_90a")).ok());
    auto r = o->validate(o->with_defaults(t), target("sm_90a"));
    EXPECT_TRUE(r.ok()) << r.error().message;
    const KernelSpec s = bshd(op, 2, 16, 16, 4, 4, 128);
    ASSERT_TRUE(o->validate(s, target("gfx942")).ok());
    r = o->validate(o->with_defaults(s), target("gfx942"));
    EXPECT_TRUE(r.ok()) << r.error().message;
    // A non-zero parameter of the other layout is still refused.
    KernelSpec u = o->with_defaults(t);
    u.params["seqlen_q"] = 20;
    expect_error(u, "'seqlen_q' belongs to layout=bshd");
  }
}

// FLOPs: bshd counts seqlen_q x seqlen_k pairs per sequence; thd, whose spec does not carry each
// sequence's length, counts what total_q, total_k, max_seqlen_q and max_seqlen_k allow: exact for
// one sequence and where every query (or key) sequence has the longest length, else the least
// upper bound of those, never total_q x max_seqlen_k for ragged keys.
TEST(Attention, FlopsCountTheLengthsTheSpecKnows) {
  for (const char* op : {"attention", "attention_bwd"}) {
    SCOPED_TRACE(op);
    const OpTemplate* o = *find_op(op);
    const double per_pair = 2.0 * (64 + 64) * 2 /* heads */ * (std::string(op) == "attention_bwd" ? 2.5 : 1.0);
    auto thd = [&](int64_t b, int64_t tq, int64_t tk, int64_t mq, int64_t mk) {
      return o->with_defaults({op, DType::bf16, DType::bf16,
                               {{"layout", 1}, {"batch", b}, {"total_q", tq}, {"total_k", tk}, {"max_seqlen_q", mq},
                                {"max_seqlen_k", mk}, {"heads", 2}, {"kv_heads", 1}, {"head_dim", 64}}});
    };
    EXPECT_DOUBLE_EQ(o->flops(o->with_defaults(bshd(op, 3, 16, 20, 2, 1, 64))), per_pair * 3 * 16 * 20);
    // One sequence of 30 queries and 50 keys (the longest lengths given larger): 30 x 50 pairs.
    EXPECT_DOUBLE_EQ(o->flops(thd(1, 30, 50, 40, 60)), per_pair * 30 * 50);
    // Three query sequences of 16 (all full) and 20 keys in all: 16 x 20 pairs.
    EXPECT_DOUBLE_EQ(o->flops(thd(3, 48, 20, 16, 16)), per_pair * 16 * 20);
    // Ragged both ways: the bound min(total_q x max_seqlen_k, max_seqlen_q x total_k), 600 both
    // times (the old count, total_q x max_seqlen_k, gave 800 for the second).
    EXPECT_DOUBLE_EQ(o->flops(thd(3, 30, 40, 20, 20)), per_pair * 600);
    EXPECT_DOUBLE_EQ(o->flops(thd(3, 40, 30, 20, 20)), per_pair * 600);
    KernelSpec causal = thd(1, 30, 50, 40, 60);
    causal.params["causal"] = 1;
    EXPECT_DOUBLE_EQ(o->flops(causal), per_pair * 30 * 50 / 2);
  }
}

TEST(Attention, ReferencesWithRowStridesMatchTheContiguousOnes) {
  const int64_t H = 4, Hkv = 2, D = 64, stride = (H + 2 * Hkv) * D, T = 10;
  for (const char* name : {"attention", "attention_bwd"}) {
    SCOPED_TRACE(name);
    const OpTemplate* op = *find_op(name);
    KernelSpec c{name, DType::bf16, DType::bf16,
                 {{"layout", 1}, {"batch", 3}, {"total_q", T}, {"total_k", T}, {"max_seqlen_q", 6},
                  {"max_seqlen_k", 6}, {"heads", H}, {"kv_heads", Hkv}, {"head_dim", D}, {"causal", 1}}};
    KernelSpec st = c;
    st.params.insert({{"q_row_stride", stride}, {"k_row_stride", stride}, {"v_row_stride", stride}});
    auto valid = op->validate(st, target("gfx950"));
    ASSERT_TRUE(valid.ok()) << valid.error().message;
    c = op->with_defaults(c);
    st = op->with_defaults(st);
    std::vector<TensorInfo> ins, outs;
    for (const TensorInfo& t : op->tensors(st)) (t.output ? outs : ins).push_back(t);
    std::mt19937_64 rng(11);
    std::vector<std::vector<float>> strided;
    op->init_inputs(st, ins, strided, rng);
    // The contiguous copies of q, k, v: the first H*D (Hkv*D) columns of each strided row.
    std::vector<std::vector<float>> contiguous = strided;
    for (size_t i = 0; i < ins.size(); ++i) {
      const int64_t used = ins[i].name == "q" ? H * D : (ins[i].name == "k" || ins[i].name == "v") ? Hkv * D : 0;
      if (!used) continue;
      ASSERT_EQ(ins[i].shape, (std::vector<int64_t>{T, stride})) << ins[i].name;
      contiguous[i].clear();
      for (int64_t t = 0; t < T; ++t)
        contiguous[i].insert(contiguous[i].end(), strided[i].begin() + t * stride, strided[i].begin() + t * stride + used);
    }
    std::vector<RefOutput> a, b;
    op->reference(st, {}, strided, {}, a);
    op->reference(c, {}, contiguous, {}, b);
    ASSERT_EQ(a.size(), b.size());
    for (size_t o = 0; o < a.size(); ++o) {
      SCOPED_TRACE(outs[o].name);
      if (a[o].values.size() == b[o].values.size()) {  // out, lse: contiguous in both
        EXPECT_EQ(a[o].values, b[o].values);
        continue;
      }
      const int64_t used = int64_t(b[o].values.size()) / T;  // dq, dk, dv
      ASSERT_EQ(int64_t(a[o].values.size()), T * stride);
      int64_t nonzero = 0;
      for (int64_t t = 0; t < T; ++t)
        for (int64_t col = 0; col < stride; ++col) {
          const double got = a[o].values[t * stride + col];
          if (col >= used) {
            EXPECT_TRUE(std::isnan(got)) << "row " << t << " column " << col << " is past the heads";
            continue;
          }
          EXPECT_EQ(got, b[o].values[t * used + col]) << "row " << t << " column " << col;
          nonzero += got != 0.0;
        }
      EXPECT_GT(nonzero, 0);
    }
  }
}

// A sample of rows (reference()'s `rows`, the check path's sample_rows) is a sample of tokens: in
// the bshd layout the tensors' first dimension is the batch, and a row of dk costs a pass over the
// queries. The sampled references give, for each sampled token, its whole rows of out / dq / dk /
// dv and its lse entries, bitwise the whole reference's values there: bshd with two sequences,
// seqlen_q != seqlen_k (the backward maps row r to query token r Tq / N and key token r Tk / N),
// GQA, causal and a softcap; thd with an empty sequence and strided q, k, v.
TEST(Attention, SampledReferencesAreTheWholeOnesAtTheSampledTokens) {
  std::vector<KernelSpec> specs;
  for (const char* name : {"attention", "attention_bwd"}) {
    KernelSpec b = bshd(name, 2, 7, 11, 4, 2, 64);
    b.params.insert({{"causal", 1}, {"softcap", 3}});
    specs.push_back(b);
    specs.push_back({name, DType::bf16, DType::bf16,
                     {{"layout", 1}, {"batch", 4}, {"total_q", 13}, {"total_k", 12}, {"max_seqlen_q", 7},
                      {"max_seqlen_k", 7}, {"heads", 2}, {"kv_heads", 1}, {"head_dim", 64}, {"q_row_stride", 192},
                      {"k_row_stride", 192}, {"v_row_stride", 192}}});
  }
  for (const KernelSpec& spec : specs) {
    SCOPED_TRACE(to_string(spec));
    const OpTemplate* op = *find_op(spec.op);
    const KernelSpec full = op->with_defaults(spec);
    ASSERT_TRUE(op->validate(full, target("gfx950")).ok());
    std::vector<TensorInfo> ins, outs;
    for (const TensorInfo& t : op->tensors(full)) (t.output ? outs : ins).push_back(t);
    std::mt19937_64 rng(3);
    std::vector<std::vector<float>> in;
    op->init_inputs(full, ins, in, rng);
    const int64_t n = op->sample_dimension(full);
    EXPECT_EQ(n, spec.op == "attention" ? (full.param("layout") ? 13 : 14) : (full.param("layout") ? 13 : 22));
    std::vector<RefOutput> whole, sampled;
    op->reference(full, {}, in, {}, whole);
    const std::vector<int64_t> rows = {0, 5, 6, n - 1};
    op->reference(full, {}, in, rows, sampled);
    ASSERT_EQ(sampled.size(), whole.size());
    for (size_t o = 0; o < outs.size(); ++o) {
      SCOPED_TRACE(outs[o].name);
      const RefOutput& r = sampled[o];
      EXPECT_TRUE(r.rows.empty());
      ASSERT_EQ(r.elements.size(), r.values.size());
      ASSERT_FALSE(r.elements.empty());
      EXPECT_LT(r.elements.size(), whole[o].values.size()) << "a sample, not the whole output";
      EXPECT_TRUE(std::is_sorted(r.elements.begin(), r.elements.end()));
      int64_t finite = 0;
      for (size_t e = 0; e < r.elements.size(); ++e) {
        ASSERT_GE(r.elements[e], 0);
        ASSERT_LT(r.elements[e], outs[o].elements());
        const double want = whole[o].values[size_t(r.elements[e])], got = r.values[e];
        if (std::isnan(want)) {
          EXPECT_TRUE(std::isnan(got)) << "element " << r.elements[e];
        } else {
          EXPECT_EQ(got, want) << "element " << r.elements[e];
          finite += std::isfinite(got) && got != 0.0;
        }
      }
      EXPECT_GT(finite, 0);
      // Whole token rows: the tokens' count times the row length (lse: one entry per head).
      const bool thd = full.param("layout") == 1, key = outs[o].name == "dk" || outs[o].name == "dv";
      const int64_t tq = thd ? full.param("total_q") : full.param("batch") * full.param("seqlen_q");
      const int64_t tk = thd ? full.param("total_k") : full.param("batch") * full.param("seqlen_k");
      const int64_t row = outs[o].name == "lse" ? full.param("heads") : outs[o].elements() / (key ? tk : tq);
      EXPECT_EQ(int64_t(r.elements.size()) % row, 0);
      EXPECT_GE(int64_t(r.elements.size()) / row, 3) << "tokens sampled";
    }
  }
}

// At a model size a sample of the backward's rows takes seconds, where the whole reference (every
// key row a pass over 8192 queries of 4 heads) takes minutes on this 2-core machine.
TEST(Attention, ASampleOfTheBackwardAtModelSizeIsQuick) {
  const OpTemplate* op = *find_op("attention_bwd");
  KernelSpec s = op->with_defaults(bshd("attention_bwd", 1, 8192, 8192, 8, 2, 128));
  s.params["causal"] = 1;
  std::mt19937_64 rng(9);
  std::vector<std::vector<float>> v;
  op->init_inputs(s, inputs_of(*op, s), v, rng);
  std::vector<RefOutput> refs;
  const auto t0 = std::chrono::steady_clock::now();
  op->reference(s, {}, v, std::vector<int64_t>{0, 1000, 4095, 8191}, refs);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 20.0);
  ASSERT_EQ(refs.size(), 3u);
  EXPECT_EQ(refs[0].elements.size(), 4u * 8 * 128);  // dq: 4 tokens x 8 heads x 128
  EXPECT_EQ(refs[1].elements.size(), 4u * 2 * 128);  // dk: 4 tokens x 2 kv heads x 128
  for (const RefOutput& r : refs) {
    double norm = 0;
    for (double x : r.values) norm += x * x;
    EXPECT_GT(norm, 0.0);
  }
}

// attention_bwd's inputs at a model size (the tuner's, bench_attention --tune's) come without the
// fp64 forward, which took minutes per spec there: lse bounds every visible score, so P = exp(S -
// lse) lies in (0, 1]. A small spec keeps the exact lse (a row's P sums to 1).
TEST(Attention, BackwardInputsAtModelSizeAreQuickAndBoundP) {
  const OpTemplate* op = *find_op("attention_bwd");
  for (const int64_t seq : {int64_t{8192}, int64_t{24}}) {
    SCOPED_TRACE(seq);
    KernelSpec s = op->with_defaults(bshd("attention_bwd", 1, seq, seq, 8, 2, 128));
    s.params["causal"] = 1;
    std::mt19937_64 rng(5);
    std::vector<std::vector<float>> v;
    const auto t0 = std::chrono::steady_clock::now();
    op->init_inputs(s, inputs_of(*op, s), v, rng);
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 20.0);
    const double scale = 1.0 / std::sqrt(128.0);
    std::uniform_int_distribution<int64_t> pick(0, seq - 1);
    for (int n = 0; n < 64; ++n) {  // sampled rows: every visible key's P, and their sum
      const int64_t t = pick(rng), h = n % 8;
      const double lse = v[5][size_t(h * seq + t)];
      ASSERT_TRUE(std::isfinite(lse)) << "row " << t << " head " << h;
      double sum = 0;
      for (int64_t j = 0; j <= t; ++j) {
        double dot = 0;
        for (int64_t c = 0; c < 128; ++c) dot += double(v[1][size_t((t * 8 + h) * 128 + c)]) * v[2][size_t((j * 2 + h / 4) * 128 + c)];
        const double p = std::exp(dot * scale - lse);
        ASSERT_LE(p, 1.0 + 1e-6) << "row " << t << " key " << j;
        sum += p;
      }
      if (seq == 24) {  // the exact forward's lse
        EXPECT_NEAR(sum, 1.0, 1e-5) << "row " << t;
      }
    }
  }
}

// One query, two keys, head_dim 64: out = softmax(s) v and lse = log(e^s0 + e^s1), by hand.
TEST(Attention, ReferenceMatchesAHandComputedCase) {
  const OpTemplate* op = *find_op("attention");
  const KernelSpec s = op->with_defaults(bshd("attention", 1, 1, 2, 1, 1, 64));
  std::vector<std::vector<float>> in(3);
  in[0].assign(64, 0.5f);  // q
  in[1].assign(128, 0.25f);  // k: key 0 all 0.25, key 1 all -0.5
  std::fill(in[1].begin() + 64, in[1].end(), -0.5f);
  in[2].resize(128);  // v: key 0 = 1, key 1 = 3
  std::fill(in[2].begin(), in[2].begin() + 64, 1.0f);
  std::fill(in[2].begin() + 64, in[2].end(), 3.0f);
  std::vector<RefOutput> out;
  op->reference(s, {}, in, {}, out);
  const double s0 = 64 * 0.5 * 0.25 / 8, s1 = 64 * 0.5 * -0.5 / 8;  // scale 1/sqrt(64)
  const double p0 = std::exp(s0) / (std::exp(s0) + std::exp(s1));
  ASSERT_EQ(out.size(), 2u);
  EXPECT_NEAR(out[0].values[0], p0 * 1 + (1 - p0) * 3, 1e-12);
  EXPECT_NEAR(out[1].values[0], std::log(std::exp(s0) + std::exp(s1)), 1e-12);
  // Causal with 1 query and 2 keys (bottom-right): the query sees both keys, the same result.
  KernelSpec c = s;
  c.params["causal"] = 1;
  op->reference(c, {}, in, {}, out);
  EXPECT_NEAR(out[0].values[0], p0 * 1 + (1 - p0) * 3, 1e-12);
  // 2 queries and 1 key, causal: query 0 sees no key (out 0, lse -inf), query 1 sees key 0.
  KernelSpec c2 = op->with_defaults(bshd("attention", 1, 2, 1, 1, 1, 64));
  c2.params["causal"] = 1;
  in[0].assign(128, 0.5f);
  in[1].resize(64);
  in[2].resize(64);
  op->reference(c2, {}, in, {}, out);
  EXPECT_EQ(out[0].values[0], 0.0);
  EXPECT_EQ(out[1].values[0], -INFINITY);
  EXPECT_NEAR(out[0].values[64], 1.0, 1e-12);
}

// The backward reference against central differences of the forward's loss sum(out * dout), on
// a GQA spec with a causal window and softcap, every element of q, k and v.
TEST(Attention, BackwardReferenceMatchesFiniteDifferences) {
  const OpTemplate* fwd = *find_op("attention");
  const OpTemplate* bwd = *find_op("attention_bwd");
  KernelSpec f = bshd("attention", 1, 3, 5, 2, 1, 64);
  f.params.insert({{"causal", 1}, {"window_left", 2}, {"softcap", 2}});
  f = fwd->with_defaults(f);
  KernelSpec b = f;
  b.op = "attention_bwd";
  b = bwd->with_defaults(b);
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  auto fill = [&](size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = u(rng);
    return v;
  };
  std::vector<std::vector<float>> qkv = {fill(3 * 2 * 64), fill(5 * 64), fill(5 * 64)};
  const std::vector<float> dout = fill(3 * 2 * 64);
  auto loss = [&](const std::vector<std::vector<float>>& x) {
    std::vector<RefOutput> o;
    fwd->reference(f, {}, x, {}, o);
    double sum = 0;
    for (size_t i = 0; i < dout.size(); ++i) sum += o[0].values[i] * dout[i];
    return sum;
  };
  std::vector<RefOutput> o;
  fwd->reference(f, {}, qkv, {}, o);
  std::vector<std::vector<float>> in = {dout, qkv[0], qkv[1], qkv[2], {}, {}};
  for (double v : o[0].values) in[4].push_back(static_cast<float>(v));
  for (double v : o[1].values) in[5].push_back(static_cast<float>(v));
  std::vector<RefOutput> grads;
  bwd->reference(b, {}, in, {}, grads);
  ASSERT_EQ(grads.size(), 3u);
  const float eps = 1.0f / 64;
  for (size_t t = 0; t < 3; ++t) {
    double err = 0, norm = 0;
    for (size_t i = 0; i < qkv[t].size(); ++i) {
      auto x = qkv;
      x[t][i] += eps;
      const double up = loss(x);
      x[t][i] -= 2 * eps;
      const double down = loss(x);
      const double fd = (up - down) / (2 * eps);
      err = std::max(err, std::fabs(fd - grads[t].values[i]));
      norm = std::max(norm, std::fabs(fd));
    }
    EXPECT_LT(err, 1e-3 * std::max(norm, 1.0)) << "tensor " << t << " (q, k, v): max error " << err;
    EXPECT_GT(norm, 1e-3) << "a gradient that is not zero";
  }
}

// The Hopper backward overlaps its dq launch with the dK/dV launch's last blocks (programmatic
// dependent launch, each kernel waiting for what it reads): dK/dV after D, dq after dK/dV. With no
// keys the dq launch follows D alone and must wait for it as a plain launch does; AMD has no such
// launch. (deterministic = 1: the ordered dq launch, which the atomic dQ replaces where it is the
// choice.)
TEST(Attention, BackwardOverlapsDqWithTheDkDvLaunchOnHopperOnly) {
  const OpTemplate* op = *find_op("attention_bwd");
  auto launches = [&](KernelSpec s, const char* t) {
    s.params["deterministic"] = 1;
    const KernelSpec full = op->with_defaults(s);
    return op->plan(full, op->choose_config(full, target(t))).launches;
  };
  const auto hopper = launches(bshd("attention_bwd", 2, 300, 300, 4, 2, 128), "sm_90a");
  ASSERT_EQ(hopper.size(), 3u);
  EXPECT_EQ(hopper[0].kernel, "kiln_attention_bwd_dot");
  EXPECT_FALSE(hopper[0].geometry.programmatic_dependent_launch);
  EXPECT_EQ(hopper[1].kernel, "kiln_attention_bwd_dkdv");
  EXPECT_TRUE(hopper[1].geometry.programmatic_dependent_launch);
  EXPECT_EQ(hopper[2].kernel, "kiln_attention_bwd_dq");
  EXPECT_TRUE(hopper[2].geometry.programmatic_dependent_launch);
  for (const Launch& l : launches(bshd("attention_bwd", 2, 300, 0, 4, 2, 128), "sm_90a")) {
    EXPECT_NE(l.kernel, "kiln_attention_bwd_dkdv");
    EXPECT_FALSE(l.geometry.programmatic_dependent_launch) << l.kernel << " after D alone";
  }
  for (const Launch& l : launches(bshd("attention_bwd", 2, 300, 300, 4, 2, 128), "gfx942"))
    EXPECT_FALSE(l.geometry.programmatic_dependent_launch) << l.kernel;
}

}  // namespace
}  // namespace kiln
