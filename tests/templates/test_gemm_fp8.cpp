// gemm_fp8 on the CPU: its signature (B's derived dtype, the scale shapes of each granularity, the
// in-place accumulation), its validation, its reference by hand, and the fp8 training recipe end to
// end: bf16 operands quantized by quantize_fp8's definition (its reference), multiplied by
// gemm_fp8's reference, against the unquantized product, with the BENCHMARKS.md fp8 gates (e4m3
// > 25 dB, hybrid > 20 dB).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "fp8_moe_recipe.h"
#include "kiln/kiln.h"
#include "templates/lib/fp8_scaling.h"
#include "templates/registry.h"

namespace kiln {
namespace {

const OpTemplate& op() { return **find_op("gemm_fp8"); }
const TargetInfo& target(const char* name) { return **find_target(name); }

KernelSpec spec(int64_t M, int64_t N, int64_t K, int64_t g, DType a, int64_t b_format, DType out, int64_t acc = 0) {
  return {"gemm_fp8", a, out, {{"M", M}, {"N", N}, {"K", K}, {"granularity", g}, {"b_format", b_format}, {"accumulate", acc}}};
}

TEST(GemmFp8, SignatureFollowsTheGranularityAndTheFormats) {
  // blockwise, e5m2 x e4m3 in FNUZ: B is e4m3fnuz, sa [M, ceil(K/128)], sb [ceil(N/128), ceil(K/128)].
  auto t = op().tensors(spec(7, 130, 300, kGemmBlockwise, DType::e5m2fnuz, 0, DType::bf16));
  ASSERT_EQ(t.size(), 5u);
  EXPECT_EQ(t[0].dtype, DType::e5m2fnuz);
  EXPECT_EQ(t[1].dtype, DType::e4m3fnuz);
  EXPECT_EQ(t[1].shape, (std::vector<int64_t>{130, 300}));
  EXPECT_EQ(t[2].shape, (std::vector<int64_t>{7, 3}));
  EXPECT_EQ(t[3].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(t[4].name, "C");
  EXPECT_EQ(t[4].overwrites, -1);
  // rowwise, e4m3 x e5m2 in OCP, accumulating: C_in is C's buffer.
  t = op().tensors(spec(7, 130, 300, kGemmRowwise, DType::e4m3, 1, DType::f32, 1));
  ASSERT_EQ(t.size(), 6u);
  EXPECT_EQ(t[1].dtype, DType::e5m2);
  EXPECT_EQ(t[2].shape, (std::vector<int64_t>{7}));
  EXPECT_EQ(t[3].shape, (std::vector<int64_t>{130}));
  EXPECT_EQ(t[4].name, "C_in");
  EXPECT_EQ(t[5].overwrites, 4);
  t = op().tensors(spec(7, 130, 300, kGemmBlock1x128, DType::e5m2, 0, DType::f32));
  EXPECT_EQ(t[2].shape, (std::vector<int64_t>{7, 3}));
  EXPECT_EQ(t[3].shape, (std::vector<int64_t>{130, 3}));
  t = op().tensors(spec(7, 130, 300, kGemmTensorwise, DType::e4m3, 0, DType::f16));
  EXPECT_EQ(t[2].shape, (std::vector<int64_t>{1}));
  EXPECT_EQ(t[3].shape, (std::vector<int64_t>{1}));
  EXPECT_EQ(t[2].dtype, DType::f32);
  // mx: e8m0 scales per 32 along K, [M, ceil(K/32)] and [N, ceil(K/32)].
  t = op().tensors(spec(7, 130, 300, kGemmMx, DType::e5m2, 0, DType::bf16));
  EXPECT_EQ(t[2].shape, (std::vector<int64_t>{7, 10}));
  EXPECT_EQ(t[3].shape, (std::vector<int64_t>{130, 10}));
  EXPECT_EQ(t[2].dtype, DType::e8m0);
  EXPECT_EQ(t[3].dtype, DType::e8m0);
}

// mx needs gfx950's scaled MFMA: gfx942 and sm_90a refuse it, naming the target and what serves
// there; gfx950 takes it, with the scaled 32x32x64 MFMA.
TEST(GemmFp8, MxIsServedOnGfx950AndRefusedElsewhere) {
  EXPECT_TRUE(op().validate(spec(96, 72, 80, kGemmMx, DType::e5m2, 0, DType::f32), target("gfx950")).ok());
  const KernelConfig c = op().choose_config(spec(96, 72, 80, kGemmMx, DType::e5m2, 0, DType::f32), target("gfx950"));
  EXPECT_EQ(c.at("MFMA_K"), 64);
  for (const char* name : {"gfx942", "sm_90a"}) {
    const DType e4 = fp8_for_target(DType::e4m3, target(name));
    auto r = op().validate(spec(64, 64, 96, kGemmMx, e4, 0, DType::bf16), target(name));
    ASSERT_FALSE(r.ok()) << name;
    EXPECT_EQ(r.error().code, Errc::unsupported);
    EXPECT_NE(r.error().message.find(std::string("which ") + name), std::string::npos) << r.error().message;
    EXPECT_NE(r.error().message.find("gfx950's scaled MFMA"), std::string::npos) << r.error().message;
    EXPECT_NE(r.error().message.find("use blockwise"), std::string::npos) << r.error().message;
  }
}

// gfx950 without mx: the 32x32x16 fp8 MFMA is the choice and the 32x32x64 f8f6f4 form a tuning
// candidate (the shared CDNA emulator misdecodes it: docs/emulator-repro/f8f6f4-decode/); gfx942
// has one candidate; mx takes the scaled 32x32x64 form and nothing else.
TEST(GemmFp8, Gfx950OffersThe32x32x64MfmaAsATuningCandidate) {
  for (int64_t g : {kGemmTensorwise, kGemmRowwise, kGemmBlockwise, kGemmBlock1x128}) {
    SCOPED_TRACE(g);
    const KernelSpec s = spec(130, 136, 300, g, DType::e4m3, 0, DType::bf16);
    EXPECT_EQ(op().choose_config(s, target("gfx950")).at("MFMA_K"), 16);
    const std::vector<KernelConfig> c = op().tuning_candidates(s, target("gfx950"));
    ASSERT_EQ(c.size(), 2u);
    EXPECT_EQ(c[0], op().choose_config(s, target("gfx950")));
    KernelConfig k64 = c[0];
    k64["MFMA_K"] = 64;
    EXPECT_EQ(c[1], k64);
    const KernelSpec fnuz = spec(130, 136, 300, g, DType::e4m3fnuz, 0, DType::bf16);
    EXPECT_EQ(op().tuning_candidates(fnuz, target("gfx942")),
              std::vector<KernelConfig>{op().choose_config(fnuz, target("gfx942"))});
  }
  const KernelSpec mx = spec(96, 72, 80, kGemmMx, DType::e5m2, 0, DType::f32);
  const std::vector<KernelConfig> c = op().tuning_candidates(mx, target("gfx950"));
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].at("MFMA_K"), 64);
}

TEST(GemmFp8, ValidationNamesTheParameterAndTheFix) {
  EXPECT_TRUE(op().validate(spec(1, 1, 1, kGemmTensorwise, DType::e4m3fnuz, 1, DType::bf16), target("gfx942")).ok());
  EXPECT_TRUE(op().validate(spec(1, 1, 1, kGemmBlockwise, DType::e5m2, 0, DType::f32, 1), target("sm_90a")).ok());
  auto acc = op().validate(spec(8, 8, 8, kGemmRowwise, DType::e4m3, 0, DType::bf16, 1), target("gfx950"));
  ASSERT_FALSE(acc.ok());
  EXPECT_NE(acc.error().message.find("out_dtype fp32"), std::string::npos) << acc.error().message;
  // OCP data on gfx942 (FNUZ), for A and, through b_format, for B.
  auto ocp = op().validate(spec(8, 8, 8, kGemmRowwise, DType::e4m3, 0, DType::bf16), target("gfx942"));
  ASSERT_FALSE(ocp.ok());
  EXPECT_NE(ocp.error().message.find("'A'"), std::string::npos) << ocp.error().message;
  auto fnuz = op().validate(spec(8, 8, 8, kGemmRowwise, DType::e4m3fnuz, 1, DType::bf16), target("gfx950"));
  ASSERT_FALSE(fnuz.ok());
  auto out = op().validate(spec(8, 8, 8, kGemmRowwise, DType::e4m3, 0, DType::e4m3), target("sm_90a"));
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.error().message.find("out_dtype"), std::string::npos) << out.error().message;
  auto bf16 = op().validate(spec(8, 8, 8, kGemmRowwise, DType::bf16, 0, DType::bf16), target("sm_90a"));
  ASSERT_FALSE(bf16.ok());
  EXPECT_NE(bf16.error().message.find("fp8_e4m3"), std::string::npos) << bf16.error().message;
}

TEST(GemmFp8, ReferenceByHand) {
  // M = 1, N = 129 (B's second 128-row block), K = 130 (two k-blocks), blockwise: C[0][n] =
  // sum_k A[k] sa[k / 128] B[n][k] sb[n / 128][k / 128].
  const KernelSpec s = spec(1, 129, 130, kGemmBlockwise, DType::e4m3, 0, DType::f32, 1);
  std::vector<std::vector<float>> in(5);
  in[0].assign(130, 2.0f);
  in[1].assign(129 * 130, 0.5f);
  in[1][128 * 130 + 129] = 4.0f;  // B[128][129]
  in[2] = {1.0f, 3.0f};                 // sa [1, 2]
  in[3] = {1.0f, 10.0f, 100.0f, 1000.0f};  // sb [2, 2]
  in[4].assign(129, 0.25f);              // C_in
  std::vector<RefOutput> out;
  op().reference(s, {}, in, {}, out);
  ASSERT_EQ(out.size(), 1u);
  ASSERT_EQ(out[0].values.size(), 129u);
  EXPECT_DOUBLE_EQ(out[0].values[0], 0.25 + 128 * 2 * 1 * 0.5 * 1 + 2 * 2 * 3 * 0.5 * 10);
  EXPECT_DOUBLE_EQ(out[0].values[128], 0.25 + 128 * 2 * 1 * 0.5 * 100 + 2 * 3 * 1000 * (0.5 + 4.0));
}

// mx by hand: K = 40, two 32-k groups (the second 8 long); C[0][n] = sum_g 2^(ea_g + eb_g - 254)
// sum_{k in g} A[k] B[n][k].
TEST(GemmFp8, MxReferenceByHand) {
  const KernelSpec s = spec(1, 2, 40, kGemmMx, DType::e4m3, 0, DType::f32);
  std::vector<std::vector<float>> in(4);
  in[0].assign(40, 1.0f);
  in[1].assign(2 * 40, 2.0f);
  in[2] = {0.5f, 4.0f};                // sa [1, 2]: e8m0 values
  in[3] = {1.0f, 0.25f, 8.0f, 2.0f};  // sb [2, 2]
  std::vector<RefOutput> out;
  op().reference(s, {}, in, {}, out);
  ASSERT_EQ(out[0].values.size(), 2u);
  EXPECT_DOUBLE_EQ(out[0].values[0], 32 * 2 * 0.5 * 1.0 + 8 * 2 * 4.0 * 0.25);
  EXPECT_DOUBLE_EQ(out[0].values[1], 32 * 2 * 0.5 * 8.0 + 8 * 2 * 4.0 * 2.0);
}

// The recipe against the unquantized product: x [M, K] and W [N, K] in bf16 (Gaussian, rows and
// 128-column blocks of x at different magnitudes, as activations are), each quantized as
// quantize_fp8 defines it (its CPU reference: scales amax / FP8_MAX per group), then gemm_fp8's
// reference on the quantized operands, against the fp64 product of the bf16 ones.
double recipe_snr(DType fa, DType fb, int64_t g, uint64_t seed) {
  constexpr int64_t M = 48, N = 256, K = 320;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(M * K), w(N * K);
  for (int64_t i = 0; i < M * K; ++i)
    x[i] = round_to_dtype(std::ldexp(normal(rng), static_cast<int>((i / K) % 7 - (i % K) / 128 % 3)), DType::bf16);
  for (float& v : w) v = round_to_dtype(normal(rng) / std::sqrt(float(K)), DType::bf16);
  const OpTemplate& quantize = **find_op("quantize_fp8");
  // q and scale of one operand, as floats.
  auto quantized = [&](const std::vector<float>& v, int64_t rows, DType fp8, Fp8Granularity gran) {
    const KernelSpec q{"quantize_fp8", DType::bf16, fp8, {{"rows", rows}, {"cols", K}, {"granularity", gran}}};
    std::vector<RefOutput> out;
    const std::vector<std::vector<float>> in = {v};
    quantize.reference(q, {}, in, {}, out);
    std::vector<float> values(out[0].values.begin(), out[0].values.end());
    std::vector<float> scales(out[1].values.begin(), out[1].values.end());
    return std::pair{values, scales};
  };
  auto [qa, sa] = quantized(x, M, fa, fp8_gemm_operand_granularity(g, false));
  auto [qb, sb] = quantized(w, N, fb, fp8_gemm_operand_granularity(g, true));
  const bool b_e5m2 = fb == DType::e5m2 || fb == DType::e5m2fnuz;
  std::vector<RefOutput> out;
  op().reference(spec(M, N, K, g, fa, b_e5m2 ? 1 : 0, DType::bf16), {}, std::vector<std::vector<float>>{qa, qb, sa, sb},
                 {}, out);
  double signal = 0, noise = 0;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t n = 0; n < N; ++n) {
      double ref = 0;
      for (int64_t k = 0; k < K; ++k) ref += double(x[m * K + k]) * double(w[n * K + k]);
      const double got = round_to_dtype(static_cast<float>(out[0].values[m * N + n]), DType::bf16);  // C in bf16
      signal += ref * ref;
      noise += (ref - got) * (ref - got);
    }
  return 10 * std::log10(signal / noise);
}

TEST(GemmFp8, RecipeMeetsTheFp8GatesAgainstTheBf16Product) {
  for (Fp8Encoding enc : {Fp8Encoding::ocp, Fp8Encoding::fnuz}) {
    const DType e4 = fp8_in_encoding(DType::e4m3, enc), e5 = fp8_in_encoding(DType::e5m2, enc);
    for (int64_t g : {kGemmTensorwise, kGemmRowwise, kGemmBlockwise, kGemmBlock1x128, kGemmMx}) {
      const double fwd = recipe_snr(e4, e4, g, 1), dgrad = recipe_snr(e5, e4, g, 2), other = recipe_snr(e4, e5, g, 3);
      const std::string what = fmt::format("{} {}: e4m3 x e4m3 {:.1f} dB, e5m2 x e4m3 {:.1f} dB, e4m3 x e5m2 {:.1f} dB",
                                           fp8_encoding_name(enc), fp8_gemm_scaling_names()[g], fwd, dgrad, other);
      std::printf("%s\n", what.c_str());
      EXPECT_GT(fwd, 25) << what;
      EXPECT_GT(dgrad, 20) << what;
      EXPECT_GT(other, 20) << what;
    }
  }
}

// grouped_gemm's fp8 dgrad of an MoE layer on the CPU, as a caller runs it (tests/fp8_moe_recipe.h):
// bf16 dy [tokens, N] and W [G, N, K] (Gaussian; dy's rows and 128-column blocks at different
// magnitudes, W's 128 x 128 blocks too), dy quantized 1x128 and W^T by the batched only_qt 128x128 call (quantize_fp8's
// reference), multiplied by grouped_gemm's nt reference, against the bf16 product: BENCHMARKS.md's
// e4m3 gate (25 dB). Groups of 0, 150 (not a multiple of 128), 20 and 300 (> 128) tokens; N and K
// with tails of a scale block. A W^T that were W (its scales not transposed, or the codes not)
// gives about 0 dB: the test fails for it (checked below).
TEST(GroupedGemmFp8, DgradRecipeMeetsTheFp8GateAgainstTheBf16Product) {
  constexpr int64_t G = 4, tokens = 470, N = 200, K = 136;
  const std::vector<float> offsets = {0, 0, 150, 170, 470};
  for (Fp8Encoding enc : {Fp8Encoding::ocp, Fp8Encoding::fnuz}) {
    const DType e4 = fp8_in_encoding(DType::e4m3, enc);
    std::mt19937_64 rng(7);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> dy(tokens * N), w(G * N * K);
    for (int64_t i = 0; i < tokens * N; ++i)
      dy[i] = round_to_dtype(std::ldexp(normal(rng), static_cast<int>((i / N) % 7 - (i % N) / 128 % 3)), DType::bf16);
    for (int64_t i = 0; i < G * N * K; ++i)  // 128 x 128 blocks (n / 128, k / 128) at 2^(n / 128 - 2 k / 128)
      w[i] = round_to_dtype(std::ldexp(normal(rng) / std::sqrt(float(N)),
                                       static_cast<int>((i / K % N) / 128 - 2 * (i % K / 128))),
                            DType::bf16);
    const testing::Fp8DgradSpecs s = testing::fp8_dgrad_specs(G, tokens, N, K, e4, DType::bf16);
    const OpTemplate &quant = **find_op("quantize_fp8"), &grouped = **find_op("grouped_gemm");
    for (const KernelSpec* k : {&s.quantize_dy, &s.quantize_w, &s.gemm})
      ASSERT_TRUE(find_op(k->op).value()->validate(*k, target(enc == Fp8Encoding::ocp ? "gfx950" : "gfx942")).ok())
          << to_string(*k);
    std::vector<RefOutput> qdy, qw, dx;
    quant.reference(quant.with_defaults(s.quantize_dy), {}, std::vector<std::vector<float>>{dy}, {}, qdy);
    quant.reference(quant.with_defaults(s.quantize_w), {}, std::vector<std::vector<float>>{w}, {}, qw);
    auto f = [](const RefOutput& o) { return std::vector<float>(o.values.begin(), o.values.end()); };
    grouped.reference(grouped.with_defaults(s.gemm), {},
                      std::vector<std::vector<float>>{f(qdy[0]), f(qw[0]), offsets, f(qdy[1]), f(qw[1])}, {}, dx);
    std::vector<double> got;
    for (double v : dx[0].values) got.push_back(round_to_dtype(static_cast<float>(v), DType::bf16));  // dx in bf16
    const double snr = testing::snr_db(testing::bf16_dgrad(dy, w, offsets, G, N, K), got);
    std::printf("%s fp8 grouped dgrad against the bf16 product: %.1f dB\n", fp8_encoding_name(enc).data(), snr);
    EXPECT_GT(snr, 25);
    // W^T's scales in W's block order (not transposed) fail the gate.
    std::vector<float> wrong = f(qw[1]);
    for (int64_t g = 0; g < G; ++g) std::swap(wrong[g * 4 + 1], wrong[g * 4 + 2]);  // [2, 2] blocks per expert
    std::vector<RefOutput> bad;
    grouped.reference(grouped.with_defaults(s.gemm), {},
                      std::vector<std::vector<float>>{f(qdy[0]), f(qw[0]), offsets, f(qdy[1]), wrong}, {}, bad);
    EXPECT_LT(testing::snr_db(testing::bf16_dgrad(dy, w, offsets, G, N, K), bad[0].values), 25);
  }
}

// grouped_gemm's fp8 k-grouped wgrad on the CPU, as a caller runs it (tests/fp8_moe_recipe.h): bf16
// dy [tokens, N] and x [tokens, K] (Gaussian, tokens at different magnitudes), each quantized into
// group-aligned 128-token panels by quantize_fp8 groups=G (its reference), multiplied by
// grouped_gemm's tn reference, against the bf16 product dW_g = dy_g^T x_g: the e4m3 gate (25 dB).
// Groups of 0, 150, 20 and 300 tokens: the third group starts mid-block (at 150), so its panels
// restart there. Panels quantized without the groups' offsets (one group of every token) fail the
// gate: the GEMM then reads other tokens, or padding, for each group (checked below).
TEST(GroupedGemmFp8, WgradRecipeMeetsTheFp8GateAgainstTheBf16Product) {
  constexpr int64_t G = 4, tokens = 470, N = 72, K = 136;
  const std::vector<float> offsets = {0, 0, 150, 170, 470};
  for (Fp8Encoding enc : {Fp8Encoding::ocp, Fp8Encoding::fnuz}) {
    const DType e4 = fp8_in_encoding(DType::e4m3, enc);
    std::mt19937_64 rng(8);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> dy(tokens * N), x(tokens * K);
    for (int64_t i = 0; i < tokens * N; ++i)
      dy[i] = round_to_dtype(std::ldexp(normal(rng), static_cast<int>((i / N) % 5 - 2)), DType::bf16);
    for (int64_t i = 0; i < tokens * K; ++i)
      x[i] = round_to_dtype(std::ldexp(normal(rng), static_cast<int>((i / K) % 3)), DType::bf16);
    const testing::Fp8WgradSpecs s = testing::fp8_wgrad_specs(G, tokens, N, K, e4, DType::f32);
    const OpTemplate &quant = **find_op("quantize_fp8"), &grouped = **find_op("grouped_gemm");
    for (const KernelSpec* k : {&s.quantize_dy, &s.quantize_x, &s.gemm})
      ASSERT_TRUE(find_op(k->op).value()->validate(*k, target(enc == Fp8Encoding::ocp ? "gfx950" : "gfx942")).ok())
          << to_string(*k);
    std::vector<RefOutput> qdy, qx, dw;
    quant.reference(quant.with_defaults(s.quantize_dy), {}, std::vector<std::vector<float>>{dy, offsets}, {}, qdy);
    quant.reference(quant.with_defaults(s.quantize_x), {}, std::vector<std::vector<float>>{x, offsets}, {}, qx);
    auto f = [](const RefOutput& o) { return std::vector<float>(o.values.begin(), o.values.end()); };
    ASSERT_EQ(qdy[0].values.size(), static_cast<size_t>((4 + G) * N * 128));  // P = ceil(470 / 128) + G panels
    grouped.reference(grouped.with_defaults(s.gemm), {},
                      std::vector<std::vector<float>>{f(qdy[0]), f(qx[0]), offsets, f(qdy[1]), f(qx[1])}, {}, dw);
    const std::vector<double> want = testing::bf16_wgrad(dy, x, offsets, G, N, K);
    const double snr = testing::snr_db(want, dw[0].values);
    std::printf("%s fp8 grouped wgrad against the bf16 product: %.1f dB\n", fp8_encoding_name(enc).data(), snr);
    EXPECT_GT(snr, 25);
    // Panels of the whole tensor's 128-token blocks (one group of every token) read with the
    // groups' offsets.
    const std::vector<float> one_group = {0, 0, 0, 0, 470};
    std::vector<RefOutput> bad_dy, bad_x, bad;
    quant.reference(quant.with_defaults(s.quantize_dy), {}, std::vector<std::vector<float>>{dy, one_group}, {}, bad_dy);
    quant.reference(quant.with_defaults(s.quantize_x), {}, std::vector<std::vector<float>>{x, one_group}, {}, bad_x);
    grouped.reference(grouped.with_defaults(s.gemm), {},
                      std::vector<std::vector<float>>{f(bad_dy[0]), f(bad_x[0]), offsets, f(bad_dy[1]), f(bad_x[1])}, {},
                      bad);
    EXPECT_LT(testing::snr_db(want, bad[0].values), 25);
  }
}

}  // namespace
}  // namespace kiln
