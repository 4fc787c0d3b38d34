// Op templates: validation, tensors, geometry, and CPU references on hand-computed cases.
#include <cmath>
#include <set>

#include "templates/op_template.h"
#include "test_util.h"

namespace kiln {
namespace {
using testing::gemm_spec;
using testing::rmsnorm_spec;
using testing::swiglu_spec;
using testing::target;

TEST(Templates, RegistryListsTheThreeOps) {
  std::vector<std::string> names;
  for (const OpTemplate* op : all_ops()) names.emplace_back(op->name());
  EXPECT_EQ(names, (std::vector<std::string>{"gemm", "rmsnorm", "swiglu"}));
  auto missing = find_op("conv2d");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.error().code, Errc::unknown);
  EXPECT_NE(missing.error().message.find("known ops: gemm, rmsnorm, swiglu"), std::string::npos);
}

TEST(Templates, ValidationNamesTheParameterAndTheFix) {
  const OpTemplate* gemm = *find_op("gemm");
  const TargetInfo& t = target("sm_90a");
  EXPECT_TRUE(gemm->validate(gemm_spec(1, 1, 1, false, false), t).ok());

  auto zero = gemm->validate(gemm_spec(0, 16, 16, false, true), t);
  ASSERT_FALSE(zero.ok());
  EXPECT_NE(zero.error().message.find("'M' = 0 is out of range"), std::string::npos) << zero.error().message;

  auto bad_bool = gemm->validate(gemm_spec(4, 4, 4, false, true), t);
  EXPECT_TRUE(bad_bool.ok());
  KernelSpec s = gemm_spec(4, 4, 4, false, true);
  s.params["trans_a"] = 2;
  auto r = gemm->validate(s, t);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("must be true or false"), std::string::npos);

  s = gemm_spec(4, 4, 4, false, true);
  s.params.erase("K");
  r = gemm->validate(s, t);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("missing parameter 'K'"), std::string::npos);

  s = gemm_spec(4, 4, 4, false, true);
  s.params["L"] = 3;
  r = gemm->validate(s, t);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("unknown parameter 'L'"), std::string::npos);

  // Only gemm lets the output dtype differ.
  KernelSpec norm = rmsnorm_spec(8, 64);
  norm.out_dtype = DType::f32;
  r = (*find_op("rmsnorm"))->validate(norm, t);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("out_dtype"), std::string::npos);
  EXPECT_TRUE(gemm->validate(gemm_spec(4, 4, 4, false, true, DType::bf16, DType::f32), t).ok());

  // A grid that would not fit: M needs more than 65535 row blocks.
  r = gemm->validate(gemm_spec(65535LL * 64 + 1, 8, 8, false, true), t);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("split M"), std::string::npos);
}

TEST(Templates, TensorShapesFollowTheLayouts) {
  const OpTemplate* gemm = *find_op("gemm");
  auto nt = gemm->tensors(gemm_spec(5, 7, 3, false, true));
  EXPECT_EQ(nt[0].shape, (std::vector<int64_t>{5, 3}));  // x [M,K]
  EXPECT_EQ(nt[1].shape, (std::vector<int64_t>{7, 3}));  // W [N,K]
  EXPECT_EQ(nt[2].shape, (std::vector<int64_t>{5, 7}));
  EXPECT_TRUE(nt[2].output);
  auto tn = gemm->tensors(gemm_spec(5, 7, 3, true, false));
  EXPECT_EQ(tn[0].shape, (std::vector<int64_t>{3, 5}));  // dy [K,M] read transposed
  EXPECT_EQ(tn[1].shape, (std::vector<int64_t>{3, 7}));
  auto sw = (*find_op("swiglu"))->tensors(swiglu_spec(4, 6));
  EXPECT_EQ(sw[0].shape, (std::vector<int64_t>{4, 12}));
  EXPECT_EQ(sw[1].shape, (std::vector<int64_t>{4, 6}));
}

TEST(Templates, GeometryCoversEveryOutput) {
  const OpTemplate* gemm = *find_op("gemm");
  for (const char* t : {"gfx942", "sm_90a"}) {
    const KernelSpec s = gemm_spec(1000, 3000, 64, false, true);
    const TileConfig c = gemm->choose_config(s, target(t));
    const LaunchGeometry g = gemm->geometry(s, c);
    EXPECT_EQ(int64_t(g.block.x), c.at("THREADS"));
    if (g.persistent) {
      // Blocks stride over the tiles: grid.x counts the tiles (the launch caps it at the SMs).
      EXPECT_EQ(int64_t(g.grid.x), ceil_div(1000, c.at("BM")) * ceil_div(3000, c.at("BN"))) << t;
      EXPECT_EQ(g.grid.y, 1u);
      continue;
    }
    EXPECT_GE(int64_t(g.grid.x) * c.at("BN"), 3000);
    EXPECT_GE(int64_t(g.grid.y) * c.at("BM"), 1000);
  }
  const OpTemplate* norm = *find_op("rmsnorm");
  const TileConfig c = norm->choose_config(rmsnorm_spec(77, 4096), target("gfx942"));
  EXPECT_EQ(c.at("THREADS") % 64, 0) << "whole wavefronts on AMD";
  EXPECT_EQ(norm->geometry(rmsnorm_spec(77, 4096), c).grid.x, 77u);
}

TEST(Templates, TuningCandidatesStartWithTheHeuristicAndAreDistinct) {
  const OpTemplate* gemm = *find_op("gemm");
  const TargetInfo& sm90 = target("sm_90a");
  // The TMA path: the heuristic's tile width and the other one, each with groups of 8 and 16.
  for (const KernelSpec& s : {gemm_spec(1024, 1024, 1024, false, true), gemm_spec(8192, 6144, 4096, false, true)}) {
    SCOPED_TRACE(to_string(s));
    const TileConfig heuristic = gemm->choose_config(s, sm90);
    ASSERT_EQ(heuristic.at("TMA"), 1);
    const std::vector<TileConfig> c = gemm->tuning_candidates(s, sm90);
    ASSERT_EQ(c.size(), 4u);
    EXPECT_EQ(c.front(), heuristic);
    for (size_t i = 0; i < c.size(); ++i)
      for (size_t j = i + 1; j < c.size(); ++j) EXPECT_NE(c[i], c[j]) << i << " and " << j;
    std::set<std::pair<int64_t, int64_t>> tiles;
    for (const TileConfig& t : c) {
      tiles.insert({t.at("BN"), t.at("STAGES")});
      // GROUP_M only where it differs from the default 8, which the heuristic leaves implicit.
      if (t.count("GROUP_M")) EXPECT_EQ(t.at("GROUP_M"), 16);
      EXPECT_EQ(t.at("TMA"), 1);
      EXPECT_EQ(t.at("THREADS"), heuristic.at("THREADS"));
    }
    EXPECT_EQ(tiles, (std::set<std::pair<int64_t, int64_t>>{{128, 6}, {256, 4}}));
  }
  // AMD's MFMA kernel: the heuristic's tile first, then its other usable tiles.
  const auto amd = gemm->tuning_candidates(gemm_spec(1024, 1024, 1024, false, true), target("gfx942"));
  EXPECT_EQ(amd.size(), 4u);
  EXPECT_EQ(amd.front(), gemm->choose_config(gemm_spec(1024, 1024, 1024, false, true), target("gfx942")));
  // Everything else has the heuristic's configuration only: fp32 (AMD and NVIDIA), the cp.async
  // WGMMA kernel (K = 33 rules out TMA), and the other ops.
  EXPECT_EQ(gemm->tuning_candidates(gemm_spec(64, 64, 64, false, true, DType::f32, DType::f32), target("gfx942")).size(), 1u);
  EXPECT_EQ(gemm->tuning_candidates(gemm_spec(1024, 1024, 1024, false, true, DType::f32, DType::f32), sm90).size(), 1u);
  const KernelSpec cp_async = gemm_spec(100, 70, 33, false, true);
  EXPECT_EQ(gemm->tuning_candidates(cp_async, sm90), std::vector<TileConfig>{gemm->choose_config(cp_async, sm90)});
  const OpTemplate* norm = *find_op("rmsnorm");
  EXPECT_EQ(norm->tuning_candidates(rmsnorm_spec(8, 4096), sm90).size(), 1u);
}

TEST(Templates, GemmReferenceMatchesHandComputedProducts) {
  const OpTemplate* gemm = *find_op("gemm");
  // op(A) = [[1,2],[3,4]], op(B) = [[5,6],[7,8]]: C = [[19,22],[43,50]] in every layout.
  const std::vector<float> a_n = {1, 2, 3, 4}, a_t = {1, 3, 2, 4};
  const std::vector<float> b_n = {5, 6, 7, 8}, b_t = {5, 7, 6, 8};
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      std::vector<std::vector<float>> in = {ta ? a_t : a_n, tb ? b_t : b_n};
      std::vector<double> out;
      gemm->reference(gemm_spec(2, 2, 2, ta, tb), {}, in, {}, out);
      EXPECT_EQ(out, (std::vector<double>{19, 22, 43, 50})) << "trans_a=" << ta << " trans_b=" << tb;
      const int64_t row1[] = {1};
      gemm->reference(gemm_spec(2, 2, 2, ta, tb), {}, in, row1, out);
      EXPECT_EQ(out, (std::vector<double>{43, 50}));
    }
}

TEST(Templates, RmsNormAndSwiGluReferences) {
  std::vector<double> out;
  // x = [3, 4]: mean(x^2) = 12.5; with eps = 0, y = x / sqrt(12.5) * gamma.
  std::vector<std::vector<float>> in = {{3, 4}, {1, 2}};
  (*find_op("rmsnorm"))->reference(rmsnorm_spec(1, 2), {{"eps", 0.0f}}, in, {}, out);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_NEAR(out[0], 3 / std::sqrt(12.5), 1e-12);
  EXPECT_NEAR(out[1], 2 * 4 / std::sqrt(12.5), 1e-12);
  // Default eps (1e-5) is applied when the scalar is absent.
  (*find_op("rmsnorm"))->reference(rmsnorm_spec(1, 2), {}, in, {}, out);
  EXPECT_NEAR(out[0], 3 / std::sqrt(12.5 + 1e-5), 1e-9);

  // gate = [0, 2], up = [5, 3]: y = [0 * 5, silu(2) * 3].
  std::vector<std::vector<float>> x = {{0, 2, 5, 3}};
  (*find_op("swiglu"))->reference(swiglu_spec(1, 2), {}, x, {}, out);
  EXPECT_DOUBLE_EQ(out[0], 0.0);
  EXPECT_NEAR(out[1], 2.0 / (1.0 + std::exp(-2.0)) * 3.0, 1e-12);
}

TEST(Templates, BakedSpecDropsRuntimeParameters) {
  const OpTemplate* norm = *find_op("rmsnorm");
  const KernelSpec baked = norm->baked_spec(rmsnorm_spec(8192, 4096));
  EXPECT_EQ(baked.params.count("rows"), 0u);
  EXPECT_EQ(baked.params.at("hidden"), 4096);
}

TEST(DTypes, ConversionsRoundToNearestEven) {
  EXPECT_EQ(float_to_bf16_bits(1.0f), 0x3f80);
  EXPECT_EQ(bf16_bits_to_float(0x3f80), 1.0f);
  // 1 + 2^-8 is halfway between bf16 neighbours 1 and 1 + 2^-7: ties to even (1.0).
  EXPECT_EQ(float_to_bf16_bits(1.0f + 1.0f / 256), 0x3f80);
  EXPECT_EQ(float_to_f16_bits(1.0f), 0x3c00);
  EXPECT_EQ(float_to_f16_bits(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_f16_bits(1e6f), 0x7c00);
  EXPECT_EQ(f16_bits_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(float_to_f16_bits(std::ldexp(1.0f, -24)), 0x0001);
  for (float f : {0.1f, -3.75f, 1234.5f, 6.1e-5f}) {
    EXPECT_NEAR(f16_bits_to_float(float_to_f16_bits(f)), f, std::fabs(f) * 1e-3);
    EXPECT_NEAR(bf16_bits_to_float(float_to_bf16_bits(f)), f, std::fabs(f) * 8e-3);
  }
  EXPECT_TRUE(std::isnan(f16_bits_to_float(0xffff)));
  EXPECT_TRUE(std::isnan(bf16_bits_to_float(0xffff)));
  auto bad = parse_dtype("bf17");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().message, "unknown dtype 'bf17'; use one of: bf16, fp16, fp32");
}

}  // namespace
}  // namespace kiln
