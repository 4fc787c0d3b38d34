// Op templates: validation, tensors, geometry, and CPU references on hand-computed cases.
#include <fmt/format.h>

#include <cmath>
#include <limits>
#include <set>

#include "templates/quantize_fp8/quantize_fp8.h"
#include "templates/registry.h"
#include "test_util.h"

namespace kiln {
namespace {
using testing::gemm_spec;
using testing::rmsnorm_spec;
using testing::swiglu_spec;
using testing::target;

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

// An op reads a parameter left out of a spec as its declared default, not as KernelSpec::param's 0:
// a spec without its optional parameters (baked_spec() drops those of unkeyed defaults; a caller or
// a test may hand a spec to choose_config, tuning_candidates or specialize as written) gets the
// same kernels and the same code as the spec that with_defaults() completes. attention_bwd's
// wants_atomic_dq read an absent window_left as 0 (a window), so a test's MQA spec without a mask
// got the deterministic kernels' candidates while the runtime compiled the atomic dQ's (found by
// GpuTuning on the H200, 2026-11-29); the attention ops' and cross_entropy's specialize wrote
// WINDOW_LEFT = 0 and IGNORE_INDEX = 0 for such specs.
TEST(Templates, OpsReadAbsentParametersAsTheirDefaults) {
  int checked = 0;
  for (const OpTemplate* op : all_ops())
    for (const char* t : {"gfx942", "gfx950", "sm_90a"})
      for (const TestSpec& ts : op->test_specs(target(t))) {
        const KernelSpec full = op->with_defaults(ts.spec);
        KernelSpec bare = full;
        for (const ParamInfo& p : op->params())
          if (p.default_value && full.param(std::string(p.name)) == *p.default_value)
            bare.params.erase(std::string(p.name));
        if (bare.params.size() == full.params.size()) continue;
        SCOPED_TRACE(fmt::format("{} on {}: {}", to_string(full), t, ts.why));
        EXPECT_EQ(op->variants(bare, target(t)), op->variants(full, target(t)));
        EXPECT_EQ(op->choose_config(bare, target(t)), op->choose_config(full, target(t)));
        EXPECT_EQ(op->tuning_candidates(bare, target(t)), op->tuning_candidates(full, target(t)));
        for (const KernelConfig& c : op->variants(full, target(t)))
          EXPECT_EQ(op->specialize(bare, c), op->specialize(full, c)) << config_string(c);
        ++checked;
      }
  EXPECT_GT(checked, 100);
}

TEST(Templates, GeometryCoversEveryOutput) {
  const OpTemplate* gemm = *find_op("gemm");
  for (const char* t : {"gfx942", "sm_90a"}) {
    const KernelSpec s = gemm_spec(1000, 3000, 64, false, true);
    const KernelConfig c = gemm->choose_config(s, target(t));
    const Plan plan = gemm->plan(s, c);
    ASSERT_EQ(plan.launches.size(), 1u);
    const LaunchGeometry g = plan.launches[0].geometry;
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
  const KernelConfig c = norm->choose_config(rmsnorm_spec(77, 4096), target("gfx942"));
  EXPECT_EQ(c.at("THREADS") % 64, 0) << "whole wavefronts on AMD";
  EXPECT_EQ(norm->plan(norm->with_defaults(rmsnorm_spec(77, 4096)), c).launches.at(0).geometry.grid.x, 77u);
  EXPECT_TRUE(norm->plan(norm->with_defaults(rmsnorm_spec(0, 4096)), c).launches.empty()) << "0 rows launch nothing";
}

TEST(Templates, TuningCandidatesStartWithTheHeuristicAndAreDistinct) {
  const OpTemplate* gemm = *find_op("gemm");
  const TargetInfo& sm90 = target("sm_90a");
  // The TMA path: the heuristic's tile width and the other one, each with groups of 8 and 16.
  for (const KernelSpec& s : {gemm_spec(1024, 1024, 1024, false, true), gemm_spec(8192, 6144, 4096, false, true)}) {
    SCOPED_TRACE(to_string(s));
    const KernelConfig heuristic = gemm->choose_config(s, sm90);
    ASSERT_EQ(heuristic.at("TMA"), 1);
    const std::vector<KernelConfig> c = gemm->tuning_candidates(s, sm90);
    ASSERT_EQ(c.size(), 4u);
    EXPECT_EQ(c.front(), heuristic);
    for (size_t i = 0; i < c.size(); ++i)
      for (size_t j = i + 1; j < c.size(); ++j) EXPECT_NE(c[i], c[j]) << i << " and " << j;
    std::set<std::pair<int64_t, int64_t>> tiles;
    for (const KernelConfig& t : c) {
      tiles.insert({t.at("BN"), t.at("STAGES")});
      // GROUP_M only where it differs from the default 8, which the heuristic leaves implicit.
      if (t.count("GROUP_M")) {
        EXPECT_EQ(t.at("GROUP_M"), 16);
      }
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
  EXPECT_EQ(gemm->tuning_candidates(cp_async, sm90), std::vector<KernelConfig>{gemm->choose_config(cp_async, sm90)});
  // rmsnorm: the heuristic's, then 1, 2, 4, 8 accesses per thread (hidden 4096 bf16: 512 vectors;
  // the heuristic's is the 2-access one on sm_90a), then on NVIDIA the heuristic's with the three
  // other ways of loading x and gamma (LOAD 1-3), each distinct; AMD has no LOAD candidates.
  const OpTemplate* norm = *find_op("rmsnorm");
  const std::vector<KernelConfig> nc = norm->tuning_candidates(rmsnorm_spec(8, 4096), sm90);
  ASSERT_EQ(nc.size(), 7u);
  EXPECT_EQ(nc.front(), norm->choose_config(rmsnorm_spec(8, 4096), sm90));
  for (int64_t load = 1; load <= 3; ++load) {
    KernelConfig c = nc.front();
    c["LOAD"] = load;
    EXPECT_EQ(nc[static_cast<size_t>(3 + load)], c) << load;
  }
  for (const KernelConfig& c : norm->tuning_candidates(rmsnorm_spec(8, 4096), target("gfx942")))
    EXPECT_EQ(c.count("LOAD"), 0u) << config_string(c);
  // The fused residual keeps the plain loads.
  KernelSpec residual = rmsnorm_spec(8, 4096);
  residual.params["residual"] = 1;
  for (const KernelConfig& c : norm->tuning_candidates(residual, sm90)) EXPECT_EQ(c.count("LOAD"), 0u) << config_string(c);
  for (size_t i = 0; i < nc.size(); ++i)
    for (size_t j = i + 1; j < nc.size(); ++j) EXPECT_NE(nc[i], nc[j]) << i << " and " << j;
}

// rmsnorm_bwd's row pass: the heuristic keeps the next row in flight (PREFETCH 1, ITEMS 4) with
// 512 threads per block on the hidden sizes, sizes the grid to the compute units, and
// its plans give every launched block the same number of row slots, with every row covered.
TEST(Templates, RmsNormBwdConfigAndPlanCoverEveryRow) {
  const OpTemplate* op = *find_op("rmsnorm_bwd");
  auto spec = [](int64_t rows, int64_t hidden, DType t = DType::bf16) {
    return KernelSpec{"rmsnorm_bwd", t, t, {{"rows", rows}, {"hidden", hidden}, {"recompute_rstd", 0}}};
  };
  const TargetInfo& sm90 = target("sm_90a");
  for (int64_t h : {4096, 8192, 16384}) {
    SCOPED_TRACE(h);
    const KernelConfig c = op->choose_config(spec(8192, h), sm90);
    EXPECT_EQ(c.at("VEC"), 8);
    EXPECT_EQ(c.at("ITEMS"), 4);
    EXPECT_EQ(c.at("PREFETCH"), 1);
    EXPECT_EQ(c.at("GAMMA_LDS"), 1);
    EXPECT_EQ(c.at("ROW_THREADS") * c.at("ROWS"), 512);
    EXPECT_EQ(c.at("BLOCKS"), sm90.compute_units);
    const std::vector<KernelConfig> candidates = op->tuning_candidates(spec(8192, h), sm90);
    ASSERT_GE(candidates.size(), 3u);
    EXPECT_EQ(candidates.front(), c);
    for (size_t i = 0; i < candidates.size(); ++i)
      for (size_t j = i + 1; j < candidates.size(); ++j) EXPECT_NE(candidates[i], candidates[j]);
  }
  for (const char* t : {"sm_90a", "gfx942", "gfx950"}) {
    for (int64_t h : {1, 7, 1000, 4096, 5120}) {
      for (const KernelConfig& c : op->tuning_candidates(spec(8, h), target(t))) {
        SCOPED_TRACE(fmt::format("{} hidden {} {}", t, h, config_string(c)));
        const int64_t threads = c.at("ROW_THREADS") * c.at("ROWS");
        EXPECT_LE(threads, 1024);
        EXPECT_EQ(c.at("ROW_THREADS") % target(t).wave_size, 0);
        EXPECT_GE(c.at("ITEMS") * c.at("ROW_THREADS") * c.at("VEC"), h);
        for (int64_t rows : {0, 1, 7, 8191, 8192, 100003}) {
          const Plan p = op->plan(op->with_defaults(spec(rows, h)), c);
          ASSERT_EQ(p.launches.size(), rows == 0 ? 1u : 2u);
          if (rows == 0) continue;
          const int64_t blocks = p.launches[0].geometry.grid.x, per_slot = c.at("ROWS");
          EXPECT_EQ(p.launches[0].geometry.block.x, threads);
          EXPECT_LE(blocks, c.at("BLOCKS"));
          const int64_t slots_per_block = ceil_div(ceil_div(rows, per_slot), blocks);
          EXPECT_GE(blocks * slots_per_block * per_slot, rows) << "rows left over";
          EXPECT_LT((blocks - 1) * slots_per_block * per_slot, rows) << "a block without rows";
          EXPECT_EQ(p.workspace_bytes, static_cast<uint64_t>(blocks * round_up(h, 4) * 4));
          EXPECT_EQ(p.launches[1].args.back().value, blocks);  // the reduction sums every partial
        }
      }
    }
  }
}

// residual_grad: the row pass takes dres after dy, x, gamma (and rstd) and writes the dx after it;
// the reduction writes dgamma, the last tensor. The heuristic keeps the prefetch at the Llama
// hidden sizes, with fewer rows per block where dres's staged buffers take registers.
TEST(Templates, RmsNormBwdResidualGradPassesDresAndKeepsThePrefetch) {
  const OpTemplate* op = *find_op("rmsnorm_bwd");
  const TargetInfo& sm90 = target("sm_90a");
  for (int recompute = 0; recompute < 2; ++recompute) {
    SCOPED_TRACE(recompute);
    const KernelSpec spec{"rmsnorm_bwd",
                          DType::bf16,
                          DType::bf16,
                          {{"rows", 8192}, {"hidden", 4096}, {"recompute_rstd", recompute}, {"residual_grad", 1}}};
    const auto tensors = op->tensors(op->with_defaults(spec));
    ASSERT_EQ(tensors.size(), recompute ? 6u : 7u);
    const uint32_t dres = recompute ? 3 : 4;
    EXPECT_EQ(tensors[dres].name, "dres");
    const KernelConfig c = op->choose_config(spec, sm90);
    const Plan p = op->plan(op->with_defaults(spec), c);
    ASSERT_EQ(p.launches.size(), 2u);
    std::vector<uint32_t> row_tensors;
    for (const KernelArg& a : p.launches[0].args)
      if (a.kind == KernelArg::Kind::tensor) row_tensors.push_back(a.index);
    std::vector<uint32_t> expect = {0, 1, 2};
    if (!recompute) expect.push_back(3);
    expect.insert(expect.end(), {dres, dres + 1});
    EXPECT_EQ(row_tensors, expect);
    EXPECT_EQ(tensors[dres + 1].name, "dx");
    EXPECT_EQ(p.launches[1].args[1].index, dres + 2);  // dgamma
    EXPECT_EQ(tensors[dres + 2].name, "dgamma");
  }
  for (int64_t h : {4096, 8192}) {
    SCOPED_TRACE(h);
    const KernelSpec spec{"rmsnorm_bwd", DType::bf16, DType::bf16, {{"rows", 8192}, {"hidden", h}, {"residual_grad", 1}}};
    const KernelConfig c = op->choose_config(spec, sm90);
    EXPECT_EQ(c.at("PREFETCH"), 1);
    EXPECT_EQ(c.at("ITEMS"), 4);
    EXPECT_EQ(c.at("ROW_THREADS") * c.at("ROWS"), 256);
  }
}

TEST(Templates, GemmReferenceMatchesHandComputedProducts) {
  const OpTemplate* gemm = *find_op("gemm");
  // op(A) = [[1,2],[3,4]], op(B) = [[5,6],[7,8]]: C = [[19,22],[43,50]] in every layout.
  const std::vector<float> a_n = {1, 2, 3, 4}, a_t = {1, 3, 2, 4};
  const std::vector<float> b_n = {5, 6, 7, 8}, b_t = {5, 7, 6, 8};
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      std::vector<std::vector<float>> in = {ta ? a_t : a_n, tb ? b_t : b_n};
      std::vector<RefOutput> out;
      gemm->reference(gemm_spec(2, 2, 2, ta, tb), {}, in, {}, out);
      EXPECT_EQ(out.at(0).values, (std::vector<double>{19, 22, 43, 50})) << "trans_a=" << ta << " trans_b=" << tb;
      const int64_t row1[] = {1};
      gemm->reference(gemm_spec(2, 2, 2, ta, tb), {}, in, row1, out);
      EXPECT_EQ(out.at(0).values, (std::vector<double>{43, 50}));
      EXPECT_EQ(out.at(0).rows, (std::vector<int64_t>{1}));
    }
}

TEST(Templates, RmsNormAndSwiGluReferences) {
  std::vector<RefOutput> refs;
  const OpTemplate* norm = *find_op("rmsnorm");
  // x = [3, 4]: mean(x^2) = 12.5; with eps = 0, y = x / sqrt(12.5) * gamma.
  std::vector<std::vector<float>> in = {{3, 4}, {1, 2}};
  norm->reference(norm->with_defaults(rmsnorm_spec(1, 2)), {{"eps", 0.0f}}, in, {}, refs);
  ASSERT_EQ(refs.size(), 1u);
  std::vector<double> out = refs[0].values;
  ASSERT_EQ(out.size(), 2u);
  EXPECT_NEAR(out[0], 3 / std::sqrt(12.5), 1e-12);
  EXPECT_NEAR(out[1], 2 * 4 / std::sqrt(12.5), 1e-12);
  // Default eps (1e-5) is applied when the scalar is absent.
  norm->reference(norm->with_defaults(rmsnorm_spec(1, 2)), {}, in, {}, refs);
  EXPECT_NEAR(refs[0].values[0], 3 / std::sqrt(12.5 + 1e-5), 1e-9);
  // Residual and rstd: h = x + residual = [3, 4] from [1, 1] + [2, 3]; outputs y, h, rstd.
  KernelSpec fused = rmsnorm_spec(1, 2);
  fused.params["residual"] = 1;
  fused.params["save_rstd"] = 1;
  fused.dtype = fused.out_dtype = DType::f32;
  std::vector<std::vector<float>> in3 = {{1, 1}, {2, 3}, {1, 2}};
  norm->reference(norm->with_defaults(fused), {{"eps", 0.0f}}, in3, {}, refs);
  ASSERT_EQ(refs.size(), 3u);
  EXPECT_NEAR(refs[0].values[1], 2 * 4 / std::sqrt(12.5), 1e-12);
  EXPECT_EQ(refs[1].values, (std::vector<double>{3, 4}));
  EXPECT_NEAR(refs[2].values.at(0), 1 / std::sqrt(12.5), 1e-12);

  // gate = [0, 2], up = [5, 3]: y = [0 * 5, silu(2) * 3].
  std::vector<std::vector<float>> x = {{0, 2, 5, 3}};
  (*find_op("swiglu"))->reference(swiglu_spec(1, 2), {}, x, {}, refs);
  EXPECT_DOUBLE_EQ(refs[0].values[0], 0.0);
  EXPECT_NEAR(refs[0].values[1], 2.0 / (1.0 + std::exp(-2.0)) * 3.0, 1e-12);
}

// rope on views of a fused qkv buffer: row strides, in place.
KernelSpec rope_spec(std::string op, DType t, int64_t head_dim, int64_t rotary_dim, int64_t q_stride, int64_t k_stride,
                     int64_t inplace) {
  return {std::move(op), t, t,
          {{"tokens", 2}, {"heads", 1}, {"kv_heads", 1}, {"head_dim", head_dim}, {"rotary_dim", rotary_dim},
           {"positions", 1}, {"cos_sin", 1}, {"max_pos", 2}, {"inplace", inplace}, {"q_row_stride", q_stride},
           {"k_row_stride", k_stride}}};
}

TEST(Templates, RopeRowStridesAreValidated) {
  const TargetInfo& t = target("gfx942");
  for (const char* op_name : {"rope", "rope_bwd"}) {
    const OpTemplate* op = *find_op(op_name);
    // bf16, head_dim 64: the 16-byte kernel (8 elements).
    EXPECT_TRUE(op->validate(rope_spec(op_name, DType::bf16, 64, 0, 512, 512, 1), t).ok());
    EXPECT_TRUE(op->validate(rope_spec(op_name, DType::bf16, 64, 0, 0, 64, 1), t).ok());
    auto r = op->validate(rope_spec(op_name, DType::bf16, 64, 0, 63, 0, 1), t);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message.find("q_row_stride = 63 is less than heads * head_dim = 64"), std::string::npos)
        << r.error().message;
    r = op->validate(rope_spec(op_name, DType::bf16, 64, 0, 0, 516, 1), t);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message.find("k_row_stride = 516 is not a multiple of 8"), std::string::npos)
        << r.error().message;
    r = op->validate(rope_spec(op_name, DType::bf16, 64, 0, 512, 0, 0), t);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message.find("q_row_stride = 512 needs inplace = 1"), std::string::npos) << r.error().message;
    // fp16, head_dim 80, rotary 40: the scalar kernel takes any stride.
    EXPECT_TRUE(op->validate(rope_spec(op_name, DType::f16, 80, 40, 163, 81, 1), t).ok());
  }
}

TEST(Templates, RopeReferenceWithRowStridesKeepsTheColumnsBetweenRows) {
  for (const char* op_name : {"rope", "rope_bwd"}) {
    const OpTemplate* op = *find_op(op_name);
    const double sign = std::string(op_name) == "rope" ? 1 : -1;
    // head_dim 2; q rows 3 apart (one column between rows), k contiguous (2, given).
    // Token 0 at position 0 (cos 1, sin 0): unchanged. Token 1 at position 1 (cos 0, sin 1):
    // (x1, x2) -> (-x2 sin, x1 sin), sin = +-1.
    const KernelSpec spec = op->with_defaults(rope_spec(op_name, DType::f32, 2, 0, 3, 2, 1));
    const auto tensors = op->tensors(spec);
    EXPECT_EQ(tensors[0].shape, (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(tensors[1].shape, (std::vector<int64_t>{2, 2}));
    EXPECT_EQ(op->bytes(spec), op->bytes(rope_spec(op_name, DType::f32, 2, 0, 0, 0, 1)));
    std::vector<std::vector<float>> in = {{1, 2, 9, 3, 4, 8}, {5, 6, 7, 1}, {0, 1}, {1, 0}, {0, 1}};
    std::vector<RefOutput> refs;
    op->reference(spec, {}, in, {}, refs);
    ASSERT_EQ(refs.size(), 2u);
    EXPECT_EQ(refs[0].values, (std::vector<double>{1, 2, 9, -4 * sign, 3 * sign, 8}));
    EXPECT_EQ(refs[1].values, (std::vector<double>{5, 6, -1 * sign, 7 * sign}));
  }
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
  EXPECT_EQ(bad.error().message, "unknown dtype 'bf17'; use one of: fp32, fp16, bf16, fp8_e4m3, fp8_e5m2, fp8_e4m3fnuz, fp8_e5m2fnuz, int32, int64, e8m0");
}


// quantize_fp8 and dequantize_fp8 references on hand-computed cases: scales that are powers of two
// (so 1 / scale is exact), a rounding tie, saturation, zero groups and the transposed output.
TEST(Templates, QuantizeFp8ReferenceByHand) {
  const OpTemplate* quant = *find_op("quantize_fp8");
  auto spec = [](DType fp8, int64_t rows, int64_t cols, int64_t g, int64_t t = 0) {
    return KernelSpec{"quantize_fp8", DType::f32, fp8, {{"rows", rows}, {"cols", cols}, {"granularity", g}, {"transpose", t}}};
  };
  std::vector<RefOutput> refs;
  // Tensorwise: amax 896 = 2 * 448: scale 2, q = x / 2, 448 the largest e4m3 value.
  std::vector<std::vector<float>> x = {{1, -2, 896}};
  quant->reference(spec(DType::e4m3, 1, 3, kTensorwise), {}, x, {}, refs);
  ASSERT_EQ(refs.size(), 2u);
  EXPECT_EQ(refs[0].values, (std::vector<double>{0.5, -1, 448}));
  EXPECT_EQ(refs[1].values, (std::vector<double>{2}));
  // The same in the other formats: FNUZ e4m3 (max 240) and e5m2 (max 57344).
  x = {{1, -2, 480}};
  quant->reference(spec(DType::e4m3fnuz, 1, 3, kTensorwise), {}, x, {}, refs);
  EXPECT_EQ(refs[0].values, (std::vector<double>{0.5, -1, 240}));
  EXPECT_EQ(refs[1].values, (std::vector<double>{2}));
  x = {{1, -2, 114688}};
  for (DType t : {DType::e5m2, DType::e5m2fnuz}) {
    quant->reference(spec(t, 1, 3, kTensorwise), {}, x, {}, refs);
    EXPECT_EQ(refs[0].values, (std::vector<double>{0.5, -1, 57344})) << dtype_name(t);
  }
  // Rowwise: a row of zeros has scale 1 and zero codes.
  x = {{1, -2, 896, 0, 0, 0}};
  quant->reference(spec(DType::e4m3, 2, 3, kRowwise), {}, x, {}, refs);
  EXPECT_EQ(refs[0].values, (std::vector<double>{0.5, -1, 448, 0, 0, 0}));
  EXPECT_EQ(refs[1].values, (std::vector<double>{2, 1}));
  // Rows sampled: q and the rowwise scales of row 1 only.
  const int64_t row1[] = {1};
  quant->reference(spec(DType::e4m3, 2, 3, kRowwise), {}, x, row1, refs);
  EXPECT_EQ(refs[0].rows, (std::vector<int64_t>{1}));
  EXPECT_EQ(refs[0].values, (std::vector<double>{0, 0, 0}));
  EXPECT_EQ(refs[1].values, (std::vector<double>{1}));
  // block1x128, cols 130: 128 ones (amax 1: scale 1/448, 1 * inv saturates at 448), then a group
  // of two columns with amax 448 (scale 1).
  std::vector<float> row(128, 1.0f);
  row.push_back(224);
  row.push_back(-448);
  x = {row};
  quant->reference(spec(DType::e4m3, 1, 130, kBlock1x128), {}, x, {}, refs);
  std::vector<double> want(128, 448.0);
  want.push_back(224);
  want.push_back(-448);
  EXPECT_EQ(refs[0].values, want);
  EXPECT_EQ(refs[1].values, (std::vector<double>{1.0f / 448.0f, 1}));
  // block128x128 with the transpose: amax 3.5 = 448 / 128, scale 2^-7, inv 128. 2.625 * 128 = 336
  // is a tie between 320 (mantissa 010) and 352 (011): even, 320. 0.3 * 128 = 38.4 -> 40.
  x = {{1, 2.625f, -3.5f, 0.3f}};
  quant->reference(spec(DType::e4m3, 2, 2, kBlock128x128, 1), {}, x, {}, refs);
  ASSERT_EQ(refs.size(), 3u);
  EXPECT_EQ(refs[0].values, (std::vector<double>{128, 320, -448, 40}));
  EXPECT_EQ(refs[1].values, (std::vector<double>{1.0 / 128}));
  EXPECT_EQ(refs[2].values, (std::vector<double>{128, -448, 320, 40}));
  // Scale shapes.
  EXPECT_EQ(fp8_scale_shape(spec(DType::e4m3, 300, 129, kBlock1x128)), (std::vector<int64_t>{300, 2}));
  EXPECT_EQ(fp8_scale_shape(spec(DType::e4m3, 300, 129, kBlock128x128)), (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(fp8_scale_shape(spec(DType::e4m3, 300, 129, kRowwise)), (std::vector<int64_t>{300}));

  // Dequantize: x = float(q) * scale, each element with its group's scale.
  const OpTemplate* dequant = *find_op("dequantize_fp8");
  KernelSpec d{"dequantize_fp8", DType::e4m3, DType::f32, {{"rows", 1}, {"cols", 130}, {"granularity", kBlock1x128}}};
  std::vector<float> q(130, 2.0f);
  std::vector<std::vector<float>> in = {q, {0.5f, 4.0f}};
  dequant->reference(d, {}, in, {}, refs);
  ASSERT_EQ(refs.size(), 1u);
  std::vector<double> deq(128, 1.0);
  deq.push_back(8);
  deq.push_back(8);
  EXPECT_EQ(refs[0].values, deq);
}

// mx (OCP MXFP8, MX spec v1.0 section 6.3): per 32 elements of a row the e8m0 scale
// 2^(floor(log2 amax) - emax), elements x / scale with saturation; the e8m0 type itself.
TEST(Templates, QuantizeFp8MxReferenceByHand) {
  const OpTemplate* quant = *find_op("quantize_fp8");
  auto spec = [](DType fp8, int64_t rows, int64_t cols, int64_t t = 0) {
    return KernelSpec{"quantize_fp8", DType::f32, fp8, {{"rows", rows}, {"cols", cols}, {"granularity", kMx}, {"transpose", t}}};
  };
  // e4m3 (emax 8), two rows of 40: groups of 32 and 8. Row 0: amax 1000 (floor log2 = 9): scale
  // 2^1 (code 128), 1000 / 2 = 500 saturates at 448, 3 / 2 = 1.5; amax 0.75 (floor log2 = -1):
  // scale 2^-9 (code 118), 0.75 * 512 = 384, -0.1 * 512 = -51.2 -> -52 (spacing 4 in [32, 64)).
  // Row 1: zeros, scale 1 (code 127).
  std::vector<float> x(80, 0.0f);
  x[0] = 1000;
  x[1] = 3;
  x[32] = 0.75f;
  x[33] = -0.1f;
  std::vector<std::vector<float>> in = {x};
  std::vector<RefOutput> refs;
  quant->reference(spec(DType::e4m3, 2, 40), {}, in, {}, refs);
  ASSERT_EQ(refs.size(), 2u);
  std::vector<double> q(80, 0.0);
  q[0] = 448;
  q[1] = 1.5;
  q[32] = 384;
  q[33] = -52;
  EXPECT_EQ(refs[0].values, q);
  EXPECT_EQ(refs[1].values, (std::vector<double>{2, std::ldexp(1.0, -9), 1, 1}));
  const auto t = quant->tensors(spec(DType::e4m3, 2, 40));
  EXPECT_EQ(t[2].name, "scale");
  EXPECT_EQ(t[2].dtype, DType::e8m0);
  EXPECT_EQ(t[2].shape, (std::vector<int64_t>{2, 2}));
  // The shared exponent per format (emax: e4m3 8, e5m2 15, e4m3fnuz 7, e5m2fnuz 15): amax 1.
  EXPECT_EQ(fp8_mx_scale_bits(1.0f, DType::e4m3), 127 - 8);
  EXPECT_EQ(fp8_mx_scale_bits(1.0f, DType::e5m2), 127 - 15);
  EXPECT_EQ(fp8_mx_scale_bits(1.0f, DType::e4m3fnuz), 127 - 7);
  EXPECT_EQ(fp8_mx_scale_bits(1.0f, DType::e5m2fnuz), 127 - 15);
  EXPECT_EQ(fp8_mx_scale_bits(0.0f, DType::e4m3), 127);                   // scale 1
  EXPECT_EQ(fp8_mx_scale_bits(1e-40f, DType::e4m3), 0);                   // clamped at 2^-127
  EXPECT_EQ(fp8_mx_scale_bits(3e38f, DType::e4m3), 127 + 127 - 8);        // floor log2 = 127
  EXPECT_EQ(fp8_mx_scale_bits(INFINITY, DType::e4m3), 0xFF);              // NaN
  // e4m3fnuz: amax 240 (floor log2 = 7 = emax): scale 1, q = x.
  in = {{240, -3, 1}};
  quant->reference(spec(DType::e4m3fnuz, 1, 3), {}, in, {}, refs);
  EXPECT_EQ(refs[0].values, (std::vector<double>{240, -3, 1}));
  EXPECT_EQ(refs[1].values, (std::vector<double>{1}));
  // e8m0 itself: 2^(b - 127), 0xFF NaN; the nearest power of two (1.5 x 2^k rounds up).
  EXPECT_EQ(e8m0_bits_to_float(127), 1.0f);
  EXPECT_EQ(e8m0_bits_to_float(0), std::ldexp(1.0f, -127));
  EXPECT_TRUE(std::isnan(e8m0_bits_to_float(0xFF)));
  EXPECT_EQ(float_to_e8m0_bits(0.75f), 127);
  EXPECT_EQ(float_to_e8m0_bits(0.7f), 126);
  EXPECT_EQ(float_to_e8m0_bits(0.0f), 0xFF);
  EXPECT_EQ(round_to_dtype(3.0f, DType::e8m0), 4.0f);
  EXPECT_EQ(*parse_dtype("float8_e8m0fnu"), DType::e8m0);
  // mx groups lie along rows: no transposed output.
  auto r = quant->validate(spec(DType::e4m3, 2, 40, 1), **find_target("gfx950"));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("with mx the scales"), std::string::npos) << r.error().message;
}

// Delayed tensorwise scaling (TransformerEngine's recipe): the scale of the history's max, values
// above its range saturating, the call's amax pushed at [0]; a margin of m doubles the scale m times;
// a history of zeros, or with an infinity, gives scale 1; NaN entries are ignored.
TEST(Templates, QuantizeFp8DelayedScalingReferenceByHand) {
  const OpTemplate* quant = *find_op("quantize_fp8");
  auto spec = [](int64_t len, int64_t margin) {
    return KernelSpec{"quantize_fp8", DType::f32, DType::e4m3,
                      {{"rows", 1}, {"cols", 3}, {"granularity", kTensorwise}, {"scaling", kDelayedScaling},
                       {"history_len", len}, {"margin", margin}}};
  };
  std::vector<RefOutput> refs;
  const float nan = std::nanf("");
  std::vector<std::vector<float>> in = {{1, -2, 896}, {224, 0, 112}};
  quant->reference(spec(3, 0), {}, in, {}, refs);
  ASSERT_EQ(refs.size(), 3u);  // q, scale, amax_history_out
  EXPECT_EQ(refs[0].values, (std::vector<double>{2, -4, 448}));  // scale 224 / 448: 896 saturates
  EXPECT_EQ(refs[1].values, (std::vector<double>{0.5}));
  EXPECT_EQ(refs[2].values, (std::vector<double>{896, 224, 0}));
  quant->reference(spec(3, 1), {}, in, {}, refs);
  EXPECT_EQ(refs[0].values, (std::vector<double>{1, -2, 448}));
  EXPECT_EQ(refs[1].values, (std::vector<double>{1}));
  for (const std::vector<float>& h : {std::vector<float>{0, 0}, std::vector<float>{1, INFINITY}}) {
    in[1] = h;
    quant->reference(spec(2, 0), {}, in, {}, refs);
    EXPECT_EQ(refs[1].values, (std::vector<double>{1}));
    EXPECT_EQ(refs[2].values, (std::vector<double>{896, h[0]}));
  }
  in[1] = {nan, 224};
  quant->reference(spec(2, 0), {}, in, {}, refs);
  EXPECT_EQ(refs[1].values, (std::vector<double>{0.5}));
  // A history whose max is this tensor's amax gives current scaling's result, bit for bit.
  KernelSpec current{"quantize_fp8", DType::f32, DType::e4m3, {{"rows", 1}, {"cols", 3}, {"granularity", kTensorwise}}};
  in = {{0.3f, -1.7f, 5.1f}, {5.1f, 2.0f}};
  std::vector<RefOutput> want;
  quant->reference(current, {}, std::span<const std::vector<float>>(in).first(1), {}, want);
  quant->reference(spec(2, 0), {}, in, {}, refs);
  EXPECT_EQ(refs[0].values, want[0].values);
  EXPECT_EQ(refs[1].values, want[1].values);
  // Delayed scaling is tensorwise only.
  KernelSpec rowwise = spec(2, 0);
  rowwise.params["granularity"] = kRowwise;
  auto r = quant->validate(rowwise, target("sm_90a"));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("scaling=current"), std::string::npos) << r.error().message;
}

// rmsnorm and swiglu with an fp8 output: y_fp8 and y_scale are quantize_fp8's definition applied to
// y as stored (the references agree bit for bit), for every granularity and both formats; and an
// fp8 output changes nothing of the op's other outputs.
TEST(Templates, FusedFp8OutputsAreQuantizeFp8OfTheStoredOutput) {
  const OpTemplate* quant = *find_op("quantize_fp8");
  std::mt19937_64 rng(5);
  // The forward ops quantize y, the backward ops dx (swiglu_bwd's dx has 2 I columns).
  for (const char* op_name : {"rmsnorm", "swiglu", "rmsnorm_bwd", "swiglu_bwd"}) {
    const OpTemplate* op = *find_op(op_name);
    const std::string name = op_name;
    const bool norm = name.rfind("rmsnorm", 0) == 0;
    // The plain op's inputs: x, gamma | x | dy, x, gamma, rstd | dy, x.
    const size_t plain_inputs = name == "rmsnorm" ? 2 : name == "swiglu" ? 1 : name == "rmsnorm_bwd" ? 4 : 2;
    for (DType fp8 : {DType::e4m3, DType::e5m2fnuz})
      for (int64_t g : {kTensorwise, kRowwise, kBlock1x128}) {
        const int64_t rows = 3, cols = 300;
        KernelSpec plain{op_name, DType::bf16, DType::bf16,
                         {{"rows", rows}, {norm ? "hidden" : "intermediate", name == "swiglu_bwd" ? cols / 2 : cols}}};
        KernelSpec spec = plain;
        spec.params["fp8_out"] = fp8_out_value(fp8);
        spec.params["fp8_granularity"] = g;
        if (g == kTensorwise) spec.params["history_len"] = 5;
        SCOPED_TRACE(to_string(spec));
        const std::vector<TensorInfo> ts = op->tensors(spec);
        std::vector<TensorInfo> inputs;
        for (const TensorInfo& t : ts)
          if (!t.output) inputs.push_back(t);
        std::vector<std::vector<float>> values;
        op->init_inputs(spec, inputs, values, rng);
        std::vector<RefOutput> fused, base;
        op->reference(spec, {}, values, {}, fused);
        op->reference(plain, {}, std::span<const std::vector<float>>(values).first(plain_inputs), {}, base);
        ASSERT_EQ(fused.size(), base.size() + (g == kTensorwise ? 3 : 2));
        for (size_t i = 0; i < base.size(); ++i) EXPECT_EQ(fused[i].values, base[i].values);
        // quantize_fp8 of y rounded to bf16, as the kernel stores it.
        std::vector<std::vector<float>> y(1);
        for (double v : base[0].values) y[0].push_back(round_to_dtype(static_cast<float>(v), DType::bf16));
        KernelSpec q{"quantize_fp8", DType::bf16, fp8, {{"rows", rows}, {"cols", cols}, {"granularity", g}}};
        if (g == kTensorwise) {
          q.params["scaling"] = kDelayedScaling;
          q.params["history_len"] = 5;
          y.push_back(values.back());
        }
        std::vector<RefOutput> want;
        quant->reference(q, {}, y, {}, want);
        const size_t f = base.size();
        EXPECT_EQ(fused[f].values, want[0].values);
        EXPECT_EQ(fused[f + 1].values, want[1].values);
        if (g == kTensorwise) {
          EXPECT_EQ(fused[f + 2].values, want[2].values);
        }
      }
  }
}

// only_qt of x is, by definition, the block1x128 quantization of x^T (1x128 blocks along the rows
// of x): the same codes and scales as a plain call on the transposed tensor.
TEST(Templates, QuantizeFp8OnlyQtIsBlock1x128OfTheTranspose) {
  const OpTemplate* quant = *find_op("quantize_fp8");
  std::mt19937_64 rng(9);
  for (DType fp8 : {DType::e4m3, DType::e5m2fnuz}) {
    const int64_t rows = 300, cols = 5;  // 128 + 128 + 44 rows: a short last block
    KernelSpec t{"quantize_fp8", DType::bf16, fp8,
                 {{"rows", rows}, {"cols", cols}, {"granularity", kBlock1x128}, {"transpose", 1}, {"only_qt", 1}}};
    SCOPED_TRACE(to_string(t));
    ASSERT_TRUE(quant->validate(t, *find_target(fp8 == DType::e4m3 ? "gfx950" : "gfx942").value()).ok());
    std::vector<TensorInfo> inputs = {quant->tensors(t)[0]};
    std::vector<std::vector<float>> x;
    quant->init_inputs(t, inputs, x, rng);
    std::vector<std::vector<float>> xt(1, std::vector<float>(x[0].size()));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) xt[0][static_cast<size_t>(c * rows + r)] = x[0][static_cast<size_t>(r * cols + c)];
    const KernelSpec plain{"quantize_fp8", DType::bf16, fp8, {{"rows", cols}, {"cols", rows}, {"granularity", kBlock1x128}}};
    std::vector<RefOutput> got, want;
    quant->reference(t, {}, x, {}, got);
    quant->reference(plain, {}, xt, {}, want);
    ASSERT_EQ(got.size(), 2u);
    EXPECT_EQ(got[0].values, want[0].values);  // qt = q of x^T
    EXPECT_EQ(got[1].values, want[1].values);  // qt_scale [cols, ceil(rows/128)] = its scales
    EXPECT_EQ(got[1].values.size(), static_cast<size_t>(cols * 3));
  }
  // only_qt needs block1x128 or block128x128 with transpose=1.
  for (auto [g, tr] : {std::pair{kBlock1x128, 0}, {kBlock128x128, 0}, {kTensorwise, 1}}) {
    KernelSpec bad{"quantize_fp8", DType::bf16, DType::e4m3,
                   {{"rows", 4}, {"cols", 8}, {"granularity", g}, {"transpose", tr}, {"only_qt", 1}}};
    auto r = quant->validate(bad, *find_target("gfx950").value());
    ASSERT_FALSE(r.ok()) << to_string(bad);
    EXPECT_NE(r.error().message.find("only_qt"), std::string::npos) << r.error().message;
  }
}

// only_qt in 128x128 blocks is the qt of block128x128's transpose=1 call, its scales transposed into
// qt's block order; with batch, each batch on its own (the experts of an MoE weight [G, N, K]).
TEST(Templates, QuantizeFp8OnlyQt128x128IsTheTransposedCopyPerBatch) {
  const OpTemplate* quant = *find_op("quantize_fp8");
  std::mt19937_64 rng(11);
  const int64_t G = 3, rows = 200, cols = 136;  // tails in both: 2 x 2 blocks per batch
  for (DType fp8 : {DType::e4m3, DType::e4m3fnuz}) {
    KernelSpec t{"quantize_fp8", DType::bf16, fp8,
                 {{"rows", rows}, {"cols", cols}, {"granularity", kBlock128x128}, {"transpose", 1}, {"only_qt", 1},
                  {"batch", G}}};
    SCOPED_TRACE(to_string(t));
    ASSERT_TRUE(quant->validate(t, *find_target(fp8 == DType::e4m3 ? "gfx950" : "gfx942").value()).ok());
    ASSERT_EQ(quant->tensors(t)[0].shape, (std::vector<int64_t>{G, rows, cols}));
    ASSERT_EQ(quant->tensors(t)[2].shape, (std::vector<int64_t>{G, 2, 2}));
    std::vector<TensorInfo> inputs = {quant->tensors(t)[0]};
    std::vector<std::vector<float>> x;
    quant->init_inputs(t, inputs, x, rng);
    std::vector<RefOutput> got;
    quant->reference(t, {}, x, {}, got);
    ASSERT_EQ(got.size(), 2u);
    ASSERT_EQ(got[0].values.size(), static_cast<size_t>(G * rows * cols));
    for (int64_t z = 0; z < G; ++z) {
      const KernelSpec plain{"quantize_fp8", DType::bf16, fp8,
                             {{"rows", rows}, {"cols", cols}, {"granularity", kBlock128x128}, {"transpose", 1}}};
      std::vector<std::vector<float>> xz(1, std::vector<float>(x[0].begin() + z * rows * cols,
                                                               x[0].begin() + (z + 1) * rows * cols));
      std::vector<RefOutput> want;
      quant->reference(plain, {}, xz, {}, want);  // q, scale [2 (rows), 2 (cols)], qt
      for (int64_t i = 0; i < rows * cols; ++i)
        ASSERT_EQ(got[0].values[static_cast<size_t>(z * rows * cols + i)], want[2].values[static_cast<size_t>(i)]);
      for (int64_t j = 0; j < 2; ++j)
        for (int64_t b = 0; b < 2; ++b)
          EXPECT_EQ(got[1].values[static_cast<size_t>(z * 4 + j * 2 + b)], want[1].values[static_cast<size_t>(b * 2 + j)]);
    }
  }
  KernelSpec bad{"quantize_fp8", DType::bf16, DType::e4m3,
                 {{"rows", 4}, {"cols", 8}, {"granularity", kBlock128x128}, {"transpose", 1}, {"batch", 2}}};
  auto r = quant->validate(bad, *find_target("gfx950").value());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("only_qt=1"), std::string::npos) << r.error().message;
}

// groups: each group's panels are the only_qt 1x128 quantization of that group's rows alone (its
// blocks restart at its first row), zero-padded to whole panels at offsets[g] / 128 + g; panels
// of no group are zero with scale 1.
TEST(Templates, QuantizeFp8GroupedPanelsRestartAtEachGroup) {
  const OpTemplate* quant = *find_op("quantize_fp8");
  std::mt19937_64 rng(13);
  const int64_t G = 4, rows = 470, cols = 136;
  const std::vector<float> off = {0, 0, 150, 170, 470};  // 0, 150 (a mid-block end), 20, 300 rows
  KernelSpec t{"quantize_fp8", DType::bf16, DType::e4m3,
               {{"rows", rows}, {"cols", cols}, {"granularity", kBlock1x128}, {"transpose", 1}, {"only_qt", 1},
                {"groups", G}}};
  ASSERT_TRUE(quant->validate(t, *find_target("gfx950").value()).ok());
  const int64_t P = 4 + G;
  ASSERT_EQ(quant->tensors(t)[1].name, "offsets");
  ASSERT_EQ(quant->tensors(t)[2].shape, (std::vector<int64_t>{P, cols, 128}));
  ASSERT_EQ(quant->tensors(t)[3].shape, (std::vector<int64_t>{P, cols}));
  std::vector<TensorInfo> inputs = {quant->tensors(t)[0], quant->tensors(t)[1]};
  std::vector<std::vector<float>> x;
  quant->init_inputs(t, inputs, x, rng);
  x[1] = off;
  std::vector<RefOutput> got;
  quant->reference(t, {}, x, {}, got);
  ASSERT_EQ(got[0].values.size(), static_cast<size_t>(P * cols * 128));
  std::vector<bool> used(static_cast<size_t>(P), false);
  for (int64_t g = 0; g < G; ++g) {
    const int64_t r0 = static_cast<int64_t>(off[g]), n = static_cast<int64_t>(off[g + 1]) - r0, p0 = r0 / 128 + g;
    if (n == 0) continue;
    KernelSpec one{"quantize_fp8", DType::bf16, DType::e4m3,
                   {{"rows", n}, {"cols", cols}, {"granularity", kBlock1x128}, {"transpose", 1}, {"only_qt", 1}}};
    std::vector<std::vector<float>> xg(1, std::vector<float>(x[0].begin() + r0 * cols, x[0].begin() + (r0 + n) * cols));
    std::vector<RefOutput> want;  // qt [cols, n], qt_scale [cols, ceil(n / 128)]
    quant->reference(one, {}, xg, {}, want);
    const int64_t nb = (n + 127) / 128;
    for (int64_t b = 0; b < nb; ++b) {
      used[static_cast<size_t>(p0 + b)] = true;
      for (int64_t c = 0; c < cols; ++c) {
        EXPECT_EQ(got[1].values[static_cast<size_t>((p0 + b) * cols + c)], want[1].values[static_cast<size_t>(c * nb + b)]);
        for (int64_t i = 0; i < 128; ++i) {
          const int64_t r = b * 128 + i;
          const double w = r < n ? want[0].values[static_cast<size_t>(c * n + r)] : 0.0;
          ASSERT_EQ(got[0].values[static_cast<size_t>(((p0 + b) * cols + c) * 128 + i)], w)
              << "group " << g << " panel " << p0 + b << " row " << c << " token " << i;
        }
      }
    }
  }
  for (int64_t p = 0; p < P; ++p)
    if (!used[static_cast<size_t>(p)])
      for (int64_t c = 0; c < cols; ++c) {
        EXPECT_EQ(got[1].values[static_cast<size_t>(p * cols + c)], 1.0);
        for (int64_t i = 0; i < 128; ++i) ASSERT_EQ(got[0].values[static_cast<size_t>((p * cols + c) * 128 + i)], 0.0);
      }
  KernelSpec bad = t;
  bad.params["granularity"] = kBlock128x128;
  auto r = quant->validate(bad, *find_target("gfx950").value());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("groups"), std::string::npos) << r.error().message;
}

TEST(Templates, QuantizeFp8RefusesTransposeWithPerRowScales) {
  const OpTemplate* quant = *find_op("quantize_fp8");
  for (int64_t g : {kRowwise, kBlock1x128, kMx}) {
    KernelSpec s{"quantize_fp8", DType::bf16, DType::e4m3, {{"rows", 4}, {"cols", 256}, {"granularity", g}, {"transpose", 1}}};
    auto r = quant->validate(s, target("sm_90a"));
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message.find("tensorwise or block128x128"), std::string::npos) << r.error().message;
    s.params["transpose"] = 0;
    EXPECT_TRUE(quant->validate(s, target("sm_90a")).ok());
  }
  // Named choices in the range error; OCP refused on gfx942.
  KernelSpec s{"quantize_fp8", DType::bf16, DType::e4m3, {{"rows", 4}, {"cols", 256}, {"granularity", 5}}};
  auto r = quant->validate(s, target("sm_90a"));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("block128x128 (3), mx (4)"), std::string::npos) << r.error().message;
  s.params["granularity"] = kRowwise;
  EXPECT_FALSE(quant->validate(s, target("gfx942")).ok());
  s.out_dtype = DType::e4m3fnuz;
  EXPECT_TRUE(quant->validate(s, target("gfx942")).ok());
  s.params["cols"] = 65537;
  r = quant->validate(s, target("gfx942"));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("block1x128"), std::string::npos) << r.error().message;
}

// float_to_fp8_bits: the host encoder behind every fp8 reference and every fp8 input.
TEST(DTypes, Fp8EncoderRoundsToNearestEvenAndSaturates) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  struct Case {
    float value;
    uint8_t code;
    const char* why;
  };
  auto check = [](DType t, std::initializer_list<Case> cases) {
    for (const Case& c : cases)
      EXPECT_EQ(int(float_to_fp8_bits(c.value, t)), int(c.code)) << dtype_name(t) << ": " << c.why << " (" << c.value << ")";
  };
  // OCP e4m3 (e4m3fn): bias 7, 3 mantissa bits, max 448 = 0x7e, NaN 0x7f, subnormal quantum 2^-9.
  check(DType::e4m3, {{1.0f, 0x38, "one"},
                      {448, 0x7e, "max"},
                      {464, 0x7e, "halfway to the next binade: saturates"},
                      {1e6f, 0x7e, "overflow: satfinite"},
                      {inf, 0x7e, "+inf: satfinite"},
                      {-inf, 0xfe, "-inf: satfinite"},
                      {nan, 0x7f, "NaN"},
                      {0.0f, 0x00, "+0"},
                      {-0.0f, 0x80, "-0 keeps its sign"},
                      {std::ldexp(1.0f, -6), 0x08, "smallest normal"},
                      {std::ldexp(1.0f, -9), 0x01, "smallest subnormal"},
                      {-std::ldexp(1.0f, -9), 0x81, "negative smallest subnormal"},
                      {std::ldexp(1.0f, -10), 0x00, "tie between 0 and the smallest subnormal: even (0)"},
                      {-std::ldexp(1.0f, -10), 0x80, "negative tie to zero: -0"},
                      {std::ldexp(3.0f, -10), 0x02, "tie between subnormal codes 1 and 2: even (2)"},
                      {std::ldexp(0.6f, -9), 0x01, "above half a quantum: rounds up"},
                      {1.0625f, 0x38, "tie between 1 and 1.125: even (1)"},
                      {1.1875f, 0x3a, "tie between 1.125 and 1.25: even (1.25)"},
                      {1.07f, 0x39, "above the tie: 1.125"},
                      {-3.0f, 0xc4, "negative normal"}});
  // OCP e5m2: bias 15, 2 mantissa bits, max 57344 = 0x7b, infinities 0x7c, subnormal quantum 2^-16.
  check(DType::e5m2, {{1.0f, 0x3c, "one"},
                      {57344, 0x7b, "max"},
                      {61440, 0x7b, "halfway to the next binade: saturates, not inf"},
                      {inf, 0x7b, "+inf: satfinite"},
                      {-inf, 0xfb, "-inf: satfinite"},
                      {-0.0f, 0x80, "-0"},
                      {std::ldexp(1.0f, -16), 0x01, "smallest subnormal"},
                      {std::ldexp(1.0f, -17), 0x00, "tie to zero: even"},
                      {std::ldexp(1.0f, -14), 0x04, "smallest normal"},
                      {1.125f, 0x3c, "tie between 1 and 1.25: even (1)"},
                      {1.375f, 0x3e, "tie between 1.25 and 1.5: even (1.5)"}});
  EXPECT_TRUE(std::isnan(fp8_bits_to_float(float_to_fp8_bits(nan, DType::e5m2), DType::e5m2)));
  // FNUZ e4m3: bias 8, max 240 = 0x7f, NaN 0x80, no -0, subnormal quantum 2^-10.
  check(DType::e4m3fnuz, {{1.0f, 0x40, "one"},
                          {240, 0x7f, "max"},
                          {1e6f, 0x7f, "overflow: satfinite"},
                          {-inf, 0xff, "-inf: satfinite"},
                          {nan, 0x80, "NaN"},
                          {-0.0f, 0x00, "no -0 in FNUZ"},
                          {-std::ldexp(1.0f, -11), 0x00, "negative tie to zero: +0 in FNUZ"},
                          {std::ldexp(1.0f, -10), 0x01, "smallest subnormal"},
                          {-std::ldexp(1.0f, -10), 0x81, "negative smallest subnormal"},
                          {1.0625f, 0x40, "tie: even"}});
  // FNUZ e5m2: bias 16, max 57344 = 0x7f, NaN 0x80, subnormal quantum 2^-17.
  check(DType::e5m2fnuz, {{1.0f, 0x40, "one"},
                          {57344, 0x7f, "max"},
                          {inf, 0x7f, "+inf: satfinite"},
                          {nan, 0x80, "NaN"},
                          {-0.0f, 0x00, "no -0 in FNUZ"},
                          {std::ldexp(1.0f, -17), 0x01, "smallest subnormal"},
                          {std::ldexp(1.0f, -18), 0x00, "tie to zero: even"},
                          {1.375f, 0x42, "tie between 1.25 and 1.5: even (1.5)"}});
  EXPECT_EQ(fp8_max(DType::e4m3), 448.0);
  EXPECT_EQ(fp8_max(DType::e5m2), 57344.0);
  EXPECT_EQ(fp8_max(DType::e4m3fnuz), 240.0);
  EXPECT_EQ(fp8_max(DType::e5m2fnuz), 57344.0);
  EXPECT_TRUE(std::isnan(fp8_bits_to_float(0x7f, DType::e4m3)));
  EXPECT_TRUE(std::isnan(fp8_bits_to_float(0x80, DType::e4m3fnuz)));
  EXPECT_EQ(fp8_bits_to_float(0x7c, DType::e5m2), inf);
  // Every finite code decodes and encodes back to itself.
  for (DType t : {DType::e4m3, DType::e5m2, DType::e4m3fnuz, DType::e5m2fnuz})
    for (int b = 0; b < 256; ++b) {
      const float v = fp8_bits_to_float(static_cast<uint8_t>(b), t);
      if (!std::isfinite(v)) continue;
      EXPECT_EQ(int(float_to_fp8_bits(v, t)), b) << dtype_name(t) << " code " << b;
      EXPECT_EQ(round_to_dtype(v, t), v);
    }
}

}  // namespace
// fill_random draws GPU-sized inputs on every core: one seed gives the same values whatever the
// thread count (each 64 Ki-element chunk has its own generator, seeded in chunk order), and the
// chunks are not copies of each other.
TEST(FillRandom, OneSeedGivesTheSameValuesAndChunksDiffer) {
  constexpr size_t n = (size_t{1} << 16) * 3 + 123;
  auto draw = [](std::mt19937_64& g) {
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    return u(g);
  };
  std::vector<float> a, b, c;
  std::mt19937_64 r1(5), r2(5), r3(6);
  fill_random(a, n, r1, draw);
  fill_random(b, n, r2, draw);
  fill_random(c, n, r3, draw);
  ASSERT_EQ(a.size(), n);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_FALSE(std::equal(a.begin(), a.begin() + 1000, a.begin() + (size_t{1} << 16)));
  EXPECT_EQ(r1(), r2()) << "the caller's generator advances the same way";
  for (float v : a) ASSERT_TRUE(v >= -1.0f && v <= 1.0f);
  // The default init_inputs draws through it: never zero, rounded to the dtype.
  const OpTemplate& swiglu = **find_op("swiglu");
  const KernelSpec spec{"swiglu", DType::bf16, DType::bf16, {{"rows", 300}, {"intermediate", 256}}};
  std::vector<TensorInfo> inputs;
  for (const TensorInfo& t : swiglu.tensors(spec))
    if (!t.output) inputs.push_back(t);
  std::vector<std::vector<float>> values;
  std::mt19937_64 rng(1);
  swiglu.init_inputs(spec, inputs, values, rng);
  ASSERT_EQ(values.size(), 1u);
  ASSERT_EQ(values[0].size(), size_t{300 * 512});
  for (float v : values[0]) ASSERT_TRUE(v != 0.0f && v == round_to_dtype(v, DType::bf16) && std::fabs(v) <= 1.0f);
}

}  // namespace kiln
