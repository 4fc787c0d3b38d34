// GPU tests: every op, on many shapes (tails included) and every dtype, against its CPU reference,
// for NVRTC-built and clang-built sm_90a kernels. Skipped, saying why, where no GPU is present.
//
// Clang-built kernels reach a GPU machine without LLVM as a prewarmed cache: on a machine with
// LLVM, `KILN_GPU_CLANG_CACHE=DIR test_gpu --gtest_filter=GpuPrewarm.*` fills DIR; on the GPU,
// the same variable points the clang tests at it (tools/gpu_check.sh does both halves).
#include <array>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <thread>

#include "cache/tuning.h"
#include "fp8_moe_recipe.h"
#include "kiln/kiln.h"
#include "runtime/device_tensors.h"
#include "templates/lib/fp8_scaling.h"
#include "templates/registry.h"
#include "test_util.h"

namespace kiln {
namespace {
using testing::gemm_spec;
using testing::rmsnorm_spec;
using testing::swiglu_spec;

std::vector<KernelSpec> all_gpu_specs() {
  std::vector<KernelSpec> s;
  const struct {
    int64_t M, N, K;
  } gemm_shapes[] = {{1, 1, 1}, {7, 127, 33}, {128, 128, 64}, {127, 1, 4097}, {1000, 3000, 200}, {2048, 2048, 1024}};
  for (auto [M, N, K] : gemm_shapes)
    for (auto [ta, tb] : {std::pair{false, true}, std::pair{false, false}, std::pair{true, false}})
      s.push_back(gemm_spec(M, N, K, ta, tb));
  for (DType dt : {DType::f16, DType::f32}) {
    s.push_back(gemm_spec(129, 257, 65, false, true, dt, dt));
    s.push_back(gemm_spec(129, 257, 65, true, false, dt, dt));
  }
  s.push_back(gemm_spec(200, 300, 1000, false, true, DType::bf16, DType::f32));
  // The sm_90a tensor-core (WGMMA) path for 16-bit inputs: odd M, N, K (1, 7, 127, 4097) in every
  // layout, bf16/fp16 in, bf16/fp16/fp32 out; leading dimensions that are not a multiple of 8
  // take the element-wise copy; 1536 x 5632 fills every SM with 128 x 256 tiles.
  const struct {
    int64_t M, N, K;
    DType in, out;
  } tc_shapes[] = {{127, 4097, 7, DType::bf16, DType::bf16}, {4097, 7, 127, DType::bf16, DType::f32},
                   {7, 127, 4097, DType::f16, DType::f16},   {1, 4097, 127, DType::f16, DType::f32},
                   {4097, 1, 1, DType::bf16, DType::bf16},   {1537, 5632, 200, DType::bf16, DType::bf16},
                   {256, 512, 4096, DType::f16, DType::f32}};
  for (auto [M, N, K, in, out] : tc_shapes)
    for (auto [ta, tb] : {std::pair{false, true}, std::pair{false, false}, std::pair{true, false}})
      s.push_back(gemm_spec(M, N, K, ta, tb, in, out));
  // The TMA kernel (leading dimensions multiples of 8): boxes larger than the whole matrix
  // (8 x 8 x 8), M = 1, tails in M, N and K, and more tiles than SMs (persistent blocks loop).
  const struct {
    int64_t M, N, K;
    DType in, out;
  } tma_shapes[] = {{8, 8, 8, DType::bf16, DType::bf16},        {1, 4104, 136, DType::bf16, DType::bf16},
                    {4104, 24, 8, DType::f16, DType::f32},      {1000, 2056, 4104, DType::bf16, DType::bf16},
                    {3000, 5000, 264, DType::f16, DType::f16}};
  for (auto [M, N, K, in, out] : tma_shapes)
    for (auto [ta, tb] : {std::pair{false, true}, std::pair{false, false}, std::pair{true, false}})
      s.push_back(gemm_spec(M, N, K, ta, tb, in, out));
  s.push_back(gemm_spec(200, 300, 100, false, false, DType::f32, DType::bf16));
  // Every op's own test specs (its paths, tails, dtypes and 0-row calls), as ggml's
  // test-backend-ops runs every op: a new op is tested here without a line in this file.
  for (const OpTemplate* op : all_ops())
    for (const TestSpec& t : op->test_specs(**find_target("sm_90a"))) s.push_back(t.spec);
  // Real widths and enough rows to fill the GPU: Llama hidden 4096/8192/16384 and intermediate
  // 14336, the odd Llama-3.1-405B-like 5120 and 18944 (Qwen2.5-7B), and rows not a multiple of
  // any block.
  for (DType dt : {DType::bf16, DType::f16, DType::f32}) {
    for (int64_t hidden : {4096, 5120, 8192, 16384}) {
      KernelSpec r = rmsnorm_spec(1025, hidden, dt);
      s.push_back(r);
      r.params["residual"] = 1;
      r.params["save_rstd"] = 1;
      s.push_back(r);
    }
    for (int64_t I : {14336, 18944}) s.push_back(swiglu_spec(513, I, dt));
  }
  // gemm_fp8's TMA kernel (K % 16 == 0): more tiles than SMs (persistent blocks loop over tiles
  // and the producer runs ahead across them), many K slices, K not a multiple of 128, boxes larger
  // than the matrix, every granularity and the hybrid formats.
  const struct {
    int64_t M, N, K, gran;
    DType a, out;
    int64_t b_format, accumulate;
  } fp8_shapes[] = {{8, 8, 16, 0, DType::e4m3, DType::bf16, 0, 0},
                    {1000, 2056, 4104, 2, DType::e4m3, DType::bf16, 0, 0},
                    {3000, 5000, 272, 3, DType::e5m2, DType::f32, 0, 1},
                    {4097, 136, 1024, 1, DType::e4m3, DType::f16, 1, 0},
                    {2048, 4096, 2048, 0, DType::e5m2, DType::bf16, 0, 0},
                    // block scales copied four K blocks (KB % 4 == 0) or two (KB % 2 == 0) per
                    // cp.async into the scale ring: M and N tails, many tiles.
                    {1500, 2000, 1024, 3, DType::e5m2, DType::bf16, 0, 0},
                    {600, 3000, 768, 2, DType::e4m3, DType::bf16, 0, 0}};
  // grouped_gemm's TMA kernel (nt, and nn with K % 64 == 0): more tiles than SMs over many
  // uneven groups (some empty: the op's init_inputs), N not a multiple of the tile, K tails.
  const struct {
    int64_t mode, G, tokens, N, K;
    DType in, out;
  } grouped_shapes[] = {{0, 32, 6000, 1000, 520, DType::bf16, DType::bf16},
                        {1, 8, 4000, 776, 1024, DType::bf16, DType::bf16},
                        {0, 64, 3000, 264, 64, DType::f16, DType::f32},
                        {0, 3, 5000, 4096, 136, DType::bf16, DType::bf16},
                        // fp8 blockwise: the forward / dgrad (nt, cp.async WGMMA) and the k-grouped
                        // wgrad (tn, group-aligned panels) over many uneven groups, N and K tails.
                        {0, 8, 4000, 1048, 2064, DType::e4m3, DType::bf16},
                        // the nt scale ring with four and two K blocks per copy (KB % 4, KB % 2 == 0)
                        {0, 8, 4000, 1000, 1024, DType::e4m3, DType::bf16},
                        {0, 6, 3000, 520, 768, DType::e4m3, DType::bf16},
                        {2, 8, 4000, 1000, 520, DType::e4m3, DType::f32}};
  for (const auto& g : grouped_shapes)
    s.push_back({"grouped_gemm", g.in, g.out,
                 {{"mode", g.mode}, {"groups", g.G}, {"tokens", g.tokens}, {"N", g.N}, {"K", g.K}}});
  for (const auto& f : fp8_shapes)
    s.push_back({"gemm_fp8", f.a, f.out,
                 {{"M", f.M}, {"N", f.N}, {"K", f.K}, {"granularity", f.gran}, {"b_format", f.b_format},
                  {"accumulate", f.accumulate}}});
  s.push_back(rmsnorm_spec(8191, 4096));
  return s;
}

// KILN_GPU_TEST_OPS=op1,op2 keeps only those ops' specs (a quick check of one op on the GPU
// machine); unset: every spec.
std::vector<KernelSpec> gpu_specs() {
  std::vector<KernelSpec> all = all_gpu_specs();
  const char* ops = std::getenv("KILN_GPU_TEST_OPS");
  if (!ops || !*ops) return all;
  const std::string list = std::string(",") + ops + ",";
  std::vector<KernelSpec> kept;
  for (KernelSpec& spec : all)
    if (list.find("," + spec.op + ",") != std::string::npos) kept.push_back(std::move(spec));
  return kept;
}

const char* clang_cache() { return std::getenv("KILN_GPU_CLANG_CACHE"); }
// NVRTC-built kernels may come prewarmed too (NVRTC runs without a GPU): the GPU machine then
// spends its time on the checks, not on ~200 compiles. Same NVRTC version, same keys.
const char* nvrtc_cache() { return std::getenv("KILN_GPU_NVRTC_CACHE"); }

TEST(GpuPrewarm, ClangKernelsForTheGpuTests) {
#if !KILN_WITH_LLVM
  GTEST_SKIP() << "built without LLVM: clang-built kernels come from a cache prewarmed elsewhere";
#else
  if (!clang_cache()) GTEST_SKIP() << "set KILN_GPU_CLANG_CACHE=DIR to prewarm clang-built sm_90a kernels into DIR";
  RuntimeOptions o;
  o.backend = "none";
  o.cache_dir = clang_cache();
  o.nvidia_compiler = "clang";
  auto rt = std::move(Runtime::create(o)).value();
  for (const KernelSpec& spec : gpu_specs()) {
    auto c = rt->compile(spec, "sm_90a");
    EXPECT_TRUE(c.ok()) << to_string(spec) << ": " << c.error().message;
  }
#endif
}

TEST(GpuPrewarm, NvrtcKernelsForTheGpuTests) {
  if (!nvrtc_cache()) GTEST_SKIP() << "set KILN_GPU_NVRTC_CACHE=DIR to prewarm NVRTC-built sm_90a kernels into DIR";
  RuntimeOptions o;
  o.backend = "none";
  o.cache_dir = nvrtc_cache();
  o.nvidia_compiler = "nvrtc";
  auto rt = std::move(Runtime::create(o)).value();
  for (const KernelSpec& spec : gpu_specs()) {
    auto c = rt->compile(spec, "sm_90a");
    EXPECT_TRUE(c.ok()) << to_string(spec) << ": " << c.error().message;
  }
}

class Gpu : public ::testing::TestWithParam<const char*> {};

TEST_P(Gpu, EveryOpMatchesItsReference) {
  const std::string compiler = GetParam();
  RuntimeOptions o;
  o.nvidia_compiler = compiler;
  testing::TempDir scratch;
  o.cache_dir = scratch.path();
  if (compiler == "clang" && !KILN_WITH_LLVM) {
    if (!clang_cache()) GTEST_SKIP() << "built without LLVM and KILN_GPU_CLANG_CACHE is unset: no clang-built kernels";
    o.cache_dir = clang_cache();
  }
  if (compiler == "nvrtc" && nvrtc_cache()) o.cache_dir = nvrtc_cache();
  auto rt = Runtime::create(o);
  ASSERT_TRUE(rt.ok()) << rt.error().message;
  if (!(*rt)->device()) GTEST_SKIP() << "no GPU: no NVIDIA or AMD device found (these tests run on the GPU machine)";
  Device& dev = *(*rt)->device();
  std::printf("device: %s (%s), compiler: %s\n", dev.name().c_str(), std::string(dev.target().name).c_str(),
              compiler.c_str());
  int passed = 0;
  for (const KernelSpec& spec : gpu_specs()) {
    CheckOptions opts;
    opts.scalars = {{"eps", 1e-6f}};
    auto report = check_on_device(**rt, spec, opts);
    ASSERT_TRUE(report.ok()) << to_string(spec) << ": " << report.error().message;
    EXPECT_TRUE(report->pass) << format_report(*report);
    EXPECT_EQ(report->nonfinite, 0) << "poisoned outputs left unwritten: " << format_report(*report);
    passed += report->pass;
  }
  const CacheStats s = (*rt)->stats();
  std::printf("%d/%zu specs pass; compiles %lu, disk hits %lu, memory hits %lu\n", passed, gpu_specs().size(),
              (unsigned long)s.compiles, (unsigned long)s.disk_hits, (unsigned long)s.memory_hits);
  if (compiler == "clang" && !KILN_WITH_LLVM) {
    EXPECT_EQ(s.compiles, 0u) << "every clang kernel came from the cache";
  }
}

INSTANTIATE_TEST_SUITE_P(Compilers, Gpu, ::testing::Values("nvrtc", "clang"));

// The tests below run on this machine's GPU through a runtime over a fresh cache directory
// (the default compiler); SetUp skips them, saying why, where there is no GPU.
class OnGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    options.cache_dir = scratch.path();
    auto created = Runtime::create(options);
    ASSERT_TRUE(created.ok()) << created.error().message;
    rt = std::move(created).value();
    if (!rt->device()) GTEST_SKIP() << "no GPU: no NVIDIA or AMD device found";
  }
  void expect_bitwise_reproducible(const KernelSpec& spec, std::initializer_list<size_t> outputs);

  testing::TempDir scratch;
  RuntimeOptions options;
  std::unique_ptr<Runtime> rt;
};
class GpuRuntime : public OnGpu {};
class GpuFp8Moe : public OnGpu {};
class GpuEmbedding : public OnGpu {};
class GpuAttention : public OnGpu {};
class GpuTuning : public OnGpu {};

TEST_F(GpuRuntime, TypedOpsAndLaunchesFromManyThreads) {
  Device& dev = *rt->device();
  const int64_t rows = 64, I = 256;
  std::vector<uint16_t> host(rows * 2 * I);
  for (size_t i = 0; i < host.size(); ++i) host[i] = float_to_bf16_bits(0.01f * float(i % 97) - 0.4f);
  void* x = *dev.malloc(host.size() * 2);
  void* y = *dev.malloc(rows * I * 2);
  ASSERT_TRUE(dev.copy_to_device(x, host.data(), host.size() * 2).ok());
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 50; ++i)
        if (!ops::swiglu(*rt, rows, I, DType::bf16, x, y).ok()) ++failures;
    });
  for (auto& th : threads) th.join();
  ASSERT_TRUE(dev.synchronize().ok());
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(rt->stats().compiles, 1u);
  std::vector<uint16_t> out(rows * I);
  ASSERT_TRUE(dev.copy_to_host(out.data(), y, out.size() * 2).ok());
  for (int64_t r = 0; r < rows; r += 13)
    for (int64_t c = 0; c < I; c += 17) {
      const double g = bf16_bits_to_float(host[r * 2 * I + c]), u = bf16_bits_to_float(host[r * 2 * I + I + c]);
      EXPECT_NEAR(bf16_bits_to_float(out[r * I + c]), g / (1 + std::exp(-g)) * u, 1e-2);
    }
  // A launch with the wrong number of buffers is an error, not a crash.
  auto k = rt->kernel(swiglu_spec(rows, I));
  ASSERT_TRUE(k.ok());
  void* one[] = {x};
  auto bad = (*k)->launch(swiglu_spec(rows, I), one);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message.find("takes 2 device buffers (x, y), and optionally a workspace, got 1"), std::string::npos)
      << bad.error().message;
  (void)dev.free(x);
  (void)dev.free(y);
}

// The fp8 blockwise backward GEMMs of an MoE layer as a caller runs them (tests/fp8_moe_recipe.h):
// quantize_fp8 (dy 1x128; W^T of every expert in one batched only_qt 128x128 launch), then
// grouped_gemm nt (sm_90a: the cp.async WGMMA fp8 kernel), uneven groups with empty ones, many
// tiles, N and K not multiples of 128. Gates: 40 dB against the dequantized product, 25 dB
// against the bf16 product.
TEST_F(GpuFp8Moe, DgradAsACallerRunsIt) {
  const DType e4 = fp8_for_target(DType::e4m3, rt->device()->target());
  for (auto [G, tokens, N, K] : {std::array<int64_t, 4>{8, 3000, 1040, 528}, {3, 500, 256, 4096}}) {
    const testing::Fp8RecipeResult r = testing::run_fp8_dgrad(*rt, G, tokens, N, K, e4, DType::bf16, 5);
    ASSERT_TRUE(r.error.empty()) << r.error;
    std::printf("[ gpu ] fp8 grouped dgrad G %lld tokens %lld N %lld K %lld: %.1f dB (dequantized), %.1f dB (bf16)\n",
                (long long)G, (long long)tokens, (long long)N, (long long)K, r.snr_dequantized, r.snr_bf16);
    EXPECT_GT(r.snr_dequantized, 40);
    EXPECT_GT(r.snr_bf16, 25);
  }
}

// The fp8 k-grouped wgrad as a caller runs it (tests/fp8_moe_recipe.h): dy and x quantized into
// group-aligned 128-token panels by quantize_fp8 groups=G, then grouped_gemm tn (sm_90a: the
// cp.async WGMMA fp8 wgrad kernel); uneven groups with empty ones, N and K not multiples of 128,
// into bf16 and accumulated into fp32.
TEST_F(GpuFp8Moe, WgradAsACallerRunsIt) {
  const DType e4 = fp8_for_target(DType::e4m3, rt->device()->target());
  for (auto [G, tokens, N, K, acc] : {std::array<int64_t, 5>{8, 3000, 520, 264, 0}, {5, 2000, 256, 1040, 1}}) {
    const testing::Fp8RecipeResult r =
        testing::run_fp8_wgrad(*rt, G, tokens, N, K, e4, acc ? DType::f32 : DType::bf16, acc, 6);
    ASSERT_TRUE(r.error.empty()) << r.error;
    std::printf("[ gpu ] fp8 grouped wgrad G %lld tokens %lld N %lld K %lld accumulate %lld: %.1f dB (dequantized), "
                "%.1f dB (bf16)\n",
                (long long)G, (long long)tokens, (long long)N, (long long)K, (long long)acc, r.snr_dequantized,
                r.snr_bf16);
    EXPECT_GT(r.snr_dequantized, 40);
    EXPECT_GT(r.snr_bf16, 25);
  }
}

// Launches `spec` five times on the same random inputs, the `outputs` (tensor indices) poisoned
// with a different byte before each launch, and expects every output bitwise equal to the first
// run's.
void OnGpu::expect_bitwise_reproducible(const KernelSpec& spec, std::initializer_list<size_t> outputs) {
  Device& dev = *rt->device();
  const OpTemplate* op = *find_op(spec.op);
  std::mt19937_64 rng(std::random_device{}());
  auto tensors = DeviceTensors::make(dev, *op, op->with_defaults(spec), rng);
  ASSERT_TRUE(tensors.ok()) << tensors.error().message;
  auto k = rt->kernel(spec);
  ASSERT_TRUE(k.ok()) << k.error().message;
  std::printf("[ gpu ] %s: %s\n", spec.op.c_str(), (*k)->compiled().info().config.c_str());
  const std::vector<TensorInfo>& ts = tensors->tensors();
  std::vector<std::vector<uint8_t>> first;
  for (int run = 0; run < 5; ++run) {
    for (size_t i : outputs)
      ASSERT_TRUE(dev.memset(tensors->pointers()[i], static_cast<uint8_t>(0xff - run), ts[i].bytes()).ok());
    ASSERT_TRUE((*k)->launch(spec, tensors->pointers()).ok());
    ASSERT_TRUE(dev.synchronize().ok());
    size_t n = 0;
    for (size_t i : outputs) {
      std::vector<uint8_t> out(ts[i].bytes());
      ASSERT_TRUE(dev.copy_to_host(out.data(), tensors->pointers()[i], out.size()).ok());
      if (run == 0) {
        first.push_back(std::move(out));
      } else {
        EXPECT_EQ(std::memcmp(first[n].data(), out.data(), out.size()), 0)
            << ts[i].name << " of run " << run << " differs";
      }
      ++n;
    }
  }
}

// embedding_bwd's dW is bitwise the same on every run: 8192 tokens over 1000 ids (a quarter of
// them over 8 ids: hundreds of tokens per row), hidden 4096, five launches on the same inputs.
// A dW accumulated with float atomics would differ in the last bits between runs.
TEST_F(GpuEmbedding, TheBackwardIsBitwiseDeterministic) {
  expect_bitwise_reproducible({"embedding_bwd", DType::bf16, DType::bf16,
                               {{"tokens", 8192}, {"vocab", 1000}, {"hidden", 4096}, {"ids_dtype", 1}}},
                              {2});  // dW
}

// attention_bwd with deterministic = 1 gives the same dq, dk, dv bits on every run (the kernels that
// serve it sum in a fixed order): causal GQA at head dim 128. On sm_90a this is the TMA + WGMMA
// backward.
TEST_F(GpuAttention, TheDeterministicBackwardIsBitwiseReproducible) {
  expect_bitwise_reproducible({"attention_bwd", DType::bf16, DType::bf16,
                               {{"batch", 2}, {"seqlen_q", 700}, {"seqlen_k", 700}, {"heads", 8}, {"kv_heads", 2},
                                {"head_dim", 128}, {"causal", 1}, {"deterministic", 1}}},
                              {6, 7, 8});  // dq, dk, dv
}

// With deterministic = 0 on sm_90a (the atomic dQ), dk and dv are still bitwise the same on every
// run: written once per key row, or (KV_SPLIT 2, the causal GQA head-dim-64 choice) the sum of two
// fp32 terms added into a zeroed workspace, where 0 + a + b = 0 + b + a. dq is not (the order of
// its reductions), so it is not compared.
TEST_F(GpuAttention, TheAtomicBackwardKeepsDkAndDvBitwiseReproducible) {
  expect_bitwise_reproducible({"attention_bwd", DType::bf16, DType::bf16,
                               {{"batch", 2}, {"seqlen_q", 700}, {"seqlen_k", 700}, {"heads", 8}, {"kv_heads", 2},
                                {"head_dim", 64}, {"causal", 1}, {"deterministic", 0}}},
                              {7, 8});  // dk, dv
}

// A negative softmax_scale: the row max of the softmax is scale times the raw scores' minimum.
// The Hopper forward flips Q's signs in shared memory and runs on |scale| (attention_sm90.kernel,
// negate_q_rows); with the raw maximum, P = 2^((s - max) scale log2 e) overflows at -6 (scores of
// standard deviation about 8 at head dim 64) and out and lse are non-finite. Head dim 64 (a block
// per item) and 128 (persistent, causal), and the backward, which takes lse and needs no max.
TEST_F(GpuAttention, ANegativeScaleGivesTheSoftmaxOfTheScaledScores) {
  const std::vector<KernelSpec> specs = {
      {"attention", DType::bf16, DType::bf16,
       {{"batch", 2}, {"seqlen_q", 300}, {"seqlen_k", 300}, {"heads", 4}, {"kv_heads", 2}, {"head_dim", 64}, {"causal", 0}}},
      {"attention", DType::bf16, DType::bf16,
       {{"batch", 2}, {"seqlen_q", 300}, {"seqlen_k", 400}, {"heads", 4}, {"kv_heads", 1}, {"head_dim", 128}, {"causal", 1}}},
      {"attention_bwd", DType::bf16, DType::bf16,
       {{"batch", 2}, {"seqlen_q", 300}, {"seqlen_k", 300}, {"heads", 4}, {"kv_heads", 2}, {"head_dim", 128}, {"causal", 1}}},
  };
  for (const KernelSpec& spec : specs) {
    CheckOptions options;
    options.seed = 11;
    options.scalars["softmax_scale"] = -6.0f;
    auto report = check_on_device(*rt, spec, options);
    ASSERT_TRUE(report.ok()) << to_string(spec) << ": " << report.error().message;
    EXPECT_TRUE(report->pass) << to_string(spec) << ", softmax_scale -6: " << format_report(*report);
    EXPECT_EQ(report->nonfinite, 0) << to_string(spec) << ": " << format_report(*report);
  }
}

TEST_F(GpuRuntime, AnUnalignedViewFallsBackFromTmaToTheCpAsyncKernel) {
  if (rt->device()->target().name != "sm_90a") GTEST_SKIP() << "the TMA GEMM is an sm_90a kernel";
  Device& dev = *rt->device();
  const int64_t n = 256;
  const KernelSpec spec = gemm_spec(n, n, n, false, true);
  auto k = rt->kernel(spec);
  ASSERT_TRUE(k.ok()) << k.error().message;
  ASSERT_NE((*k)->compiled().info().config.find("TMA=1"), std::string::npos) << "this shape takes the TMA kernel";
  // A and B: random bf16 values; A placed 2 bytes past a 16-byte boundary (a view TMA cannot read).
  std::mt19937_64 rng(std::random_device{}());
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> fa(n * n), fb(n * n);
  std::vector<uint16_t> ha(n * n), hb(n * n);
  for (int64_t i = 0; i < n * n; ++i) {
    ha[i] = float_to_bf16_bits(dist(rng));
    fa[i] = bf16_bits_to_float(ha[i]);
    hb[i] = float_to_bf16_bits(dist(rng) / 16);
    fb[i] = bf16_bits_to_float(hb[i]);
  }
  void* a = *dev.malloc(n * n * 2 + 16);
  void* b = *dev.malloc(n * n * 2);
  void* c = *dev.malloc(n * n * 2);
  char* a_view = static_cast<char*>(a) + 2;
  ASSERT_TRUE(dev.copy_to_device(a_view, ha.data(), ha.size() * 2).ok());
  ASSERT_TRUE(dev.copy_to_device(b, hb.data(), hb.size() * 2).ok());
  ASSERT_TRUE(dev.memset(c, 0xff, n * n * 2).ok());
  void* shifted[] = {a_view, b, c};
  auto launched = (*k)->launch(spec, shifted);
  ASSERT_TRUE(launched.ok()) << launched.error().message;
  ASSERT_TRUE(dev.synchronize().ok());
  std::vector<uint16_t> out(n * n);
  ASSERT_TRUE(dev.copy_to_host(out.data(), c, out.size() * 2).ok());
  std::vector<std::vector<float>> in = {fa, fb};
  auto ref = kiln::reference(spec, {}, in);
  ASSERT_TRUE(ref.ok()) << ref.error().message;
  int bad = 0;
  for (int64_t i = 0; i < n * n; ++i) {
    const double want = ref->front().values[i], got = bf16_bits_to_float(out[i]);
    bad += !(std::fabs(got - want) <= 1e-2 + 1e-2 * std::fabs(want));
  }
  EXPECT_EQ(bad, 0) << "the cp.async variant served the unaligned view";
  (void)dev.free(a);
  (void)dev.free(b);
  (void)dev.free(c);
}

// gemm_fp8's and grouped_gemm's fp8 TMA kernels copy a row's block scales of four K blocks with one
// 16-byte cp.async where sa and sb are 16-byte aligned, and with four 4-byte copies where they are
// not (here views 4 bytes into their buffers): both give the same C, bitwise (gemm_fp8 blockwise
// and block1x128, grouped_gemm nt over uneven groups; M, N and token tails). The aligned launch is
// checked against the reference by Gpu.EveryOpMatchesItsReference.
TEST_F(GpuRuntime, Fp8BlockScalesAtAnUnalignedViewGiveTheSameC) {
  if (rt->device()->target().name != "sm_90a") GTEST_SKIP() << "the scale ring is the sm_90a TMA kernels'";
  Device& dev = *rt->device();
  const std::vector<KernelSpec> specs = {
      {"gemm_fp8", DType::e4m3, DType::bf16,
       {{"M", 330}, {"N", 250}, {"K", 1024}, {"granularity", kGemmBlockwise}, {"b_format", 0}, {"accumulate", 0}}},
      {"gemm_fp8", DType::e4m3, DType::bf16,
       {{"M", 330}, {"N", 250}, {"K", 1024}, {"granularity", kGemmBlock1x128}, {"b_format", 0}, {"accumulate", 0}}},
      {"grouped_gemm", DType::e4m3, DType::bf16, {{"mode", 0}, {"groups", 5}, {"tokens", 900}, {"N", 264}, {"K", 1024}}},
  };
  for (const KernelSpec& spec : specs) {
    SCOPED_TRACE(to_string(spec));
    const OpTemplate* op = *find_op(spec.op);
    std::mt19937_64 rng(std::random_device{}());
    auto tensors = DeviceTensors::make(dev, *op, op->with_defaults(spec), rng);
    ASSERT_TRUE(tensors.ok()) << tensors.error().message;
    auto k = rt->kernel(spec);
    ASSERT_TRUE(k.ok()) << k.error().message;
    ASSERT_NE((*k)->compiled().info().config.find("TMA=1"), std::string::npos) << "this shape takes the TMA kernel";
    const std::vector<TensorInfo>& ts = tensors->tensors();
    std::vector<void*> ptrs(tensors->pointers().begin(), tensors->pointers().end());
    const size_t out = ts.size() - 1;  // C (c)
    const auto run = [&](std::vector<uint8_t>& host) {
      ASSERT_TRUE(dev.memset(ptrs[out], 0xff, ts[out].bytes()).ok());  // NaN
      ASSERT_TRUE((*k)->launch(spec, ptrs).ok());
      ASSERT_TRUE(dev.synchronize().ok());
      host.resize(ts[out].bytes());
      ASSERT_TRUE(dev.copy_to_host(host.data(), ptrs[out], host.size()).ok());
    };
    std::vector<uint8_t> aligned, shifted;
    run(aligned);
    std::vector<void*> buffers;
    for (size_t i = 0; i < ts.size(); ++i) {  // sa and sb copied 4 bytes into fresh buffers
      if (ts[i].name != "sa" && ts[i].name != "sb") continue;
      std::vector<uint8_t> host(ts[i].bytes());
      ASSERT_TRUE(dev.copy_to_host(host.data(), ptrs[i], host.size()).ok());
      void* b = *dev.malloc(host.size() + 16);
      buffers.push_back(b);
      ptrs[i] = static_cast<char*>(b) + 4;
      ASSERT_TRUE(dev.copy_to_device(ptrs[i], host.data(), host.size()).ok());
    }
    ASSERT_EQ(buffers.size(), 2u) << "sa and sb";
    run(shifted);
    EXPECT_EQ(std::memcmp(aligned.data(), shifted.data(), aligned.size()), 0)
        << "C differs with scales 4 bytes past a 16-byte boundary";
    int nonfinite = 0;
    for (size_t i = 0; i + 1 < aligned.size(); i += 2) {
      const uint16_t bits = static_cast<uint16_t>(aligned[i] | (aligned[i + 1] << 8));
      nonfinite += !std::isfinite(bf16_bits_to_float(bits));
    }
    EXPECT_EQ(nonfinite, 0) << "C not written everywhere";
    for (void* b : buffers) (void)dev.free(b);
  }
}

TEST_F(GpuTuning, TheWinnerIsKeptForTheNextProcess) {
  if (rt->device()->target().name != "sm_90a") GTEST_SKIP() << "only sm_90a's TMA kernels have several tuning candidates";
  const KernelSpec spec = gemm_spec(1024, 1024, 1024, false, true);
  auto report = rt->tune(spec);
  ASSERT_TRUE(report.ok()) << report.error().message;
  EXPECT_FALSE(report->from_record);
  EXPECT_EQ(report->device, rt->device()->name());
  EXPECT_EQ(report->reps, 20);
  ASSERT_EQ(report->candidates.size(), 4u);
  for (const TuneCandidate& c : report->candidates) {
    EXPECT_TRUE(c.error.empty()) << config_string(c.config) << ": " << c.error;
    EXPECT_GT(c.median_ms, 0.0);
    EXPECT_LE(c.min_ms, c.median_ms);
    EXPECT_LE(c.median_ms, c.max_ms);
    EXPECT_LE(report->candidates[report->winner].median_ms, c.median_ms) << "the winner is the fastest";
  }
  const KernelConfig winner = report->candidates[report->winner].config;
  ASSERT_FALSE(report->record.empty());
  EXPECT_TRUE(std::filesystem::exists(report->record)) << report->record;
  EXPECT_EQ(rt->stats().tunings, 1u);
  // This runtime now serves the winner, and it is correct.
  auto k = rt->kernel(spec);
  ASSERT_TRUE(k.ok()) << k.error().message;
  EXPECT_EQ((*k)->compiled().info().config, config_string(winner));
  auto check = check_on_device(*rt, spec);
  ASSERT_TRUE(check.ok()) << check.error().message;
  EXPECT_TRUE(check->pass) << format_report(*check);

  // A second runtime on the same cache (another process, as far as the cache can tell) never
  // tunes again: kernel() finds the record, and tune() returns it without timing.
  auto second = std::move(Runtime::create(options)).value();
  auto k2 = second->kernel(spec);
  ASSERT_TRUE(k2.ok()) << k2.error().message;
  EXPECT_EQ((*k2)->compiled().info().config, config_string(winner));
  EXPECT_EQ(second->stats().tuning_hits, 1u);
  EXPECT_EQ(second->stats().tunings, 0u);
  EXPECT_EQ(second->stats().compiles, 0u) << "every candidate was compiled into the cache by the first runtime";
  auto again = second->tune(spec);
  ASSERT_TRUE(again.ok()) << again.error().message;
  EXPECT_TRUE(again->from_record);
  EXPECT_EQ(again->candidates[again->winner].config, winner);
  EXPECT_EQ(second->stats().tunings, 0u);

  // use_tuning = false: the heuristic's configuration, whatever the cache holds.
  RuntimeOptions untuned = options;
  untuned.use_tuning = false;
  auto third = std::move(Runtime::create(untuned)).value();
  auto k3 = third->kernel(spec);
  ASSERT_TRUE(k3.ok()) << k3.error().message;
  EXPECT_EQ((*k3)->compiled().info().config, config_string(report->candidates.front().config));
  EXPECT_EQ(third->stats().tuning_hits, 0u);
}

TEST_F(GpuTuning, EveryCandidateMatchesTheReference) {
  // Each candidate made the winner of a record by hand, then checked through kernel(): the tuned
  // configurations (the bf16 GEMM's other tile width and GROUP_M = 16; gemm_fp8's ping-pong
  // flipped, the other consumer count, DBUF, the cp.async kernel; attention's 176-key blocks, persistence
  // and item orders; cross-entropy's cluster shapes) are as correct as the heuristic's.
  RuntimeOptions o = options;
  o.nvidia_compiler = "nvrtc";  // the records below are NVRTC's
  Runtime* probe = rt.get();  // its device, target and name
  if (probe->device()->target().name != "sm_90a") GTEST_SKIP() << "only sm_90a's TMA kernels have several tuning candidates";
  const std::string device = probe->device()->name();
  auto cache = std::move(DiskCache::open(scratch.path())).value();
  // gemm_fp8: more tiles than the H100's 132 SMs, so that persistent blocks take two tiles (the
  // ping-pong consumers' chain of turns runs across tiles): 128 x 128 tiles with block scales, and
  // 192 x 128 (three consumers) for tensorwise.
  const auto fp8_spec = [](int64_t M, int64_t N, int64_t K, int64_t gran, DType out) {
    return KernelSpec{"gemm_fp8", DType::e4m3, out,
                      {{"M", M}, {"N", N}, {"K", K}, {"granularity", gran}, {"b_format", 0}, {"accumulate", 0}}};
  };
  std::vector<KernelSpec> specs = {gemm_spec(1000, 2056, 4104, false, true), gemm_spec(3000, 5000, 264, false, false),
                                 gemm_spec(1024, 1024, 1024, true, false, DType::f16, DType::f32),
                                 fp8_spec(2048, 1300, 400, kGemmBlock1x128, DType::bf16),
                                 fp8_spec(2000, 1280, 768, kGemmBlockwise, DType::f32),
                                 fp8_spec(3072, 1280, 272, kGemmTensorwise, DType::bf16),
                                 // attention at head dim 128 without a mask: 300 keys, so a 176-key block ends short
                                 KernelSpec{"attention", DType::bf16, DType::bf16,
                                            {{"batch", 2}, {"seqlen_q", 300}, {"seqlen_k", 300}, {"heads", 4},
                                             {"kv_heads", 2}, {"head_dim", 128}}},
                                 // cross_entropy's fused form: the row on chip in clusters of 2, 4 and 8 with 1, 3 or
                                 // 6 blocks per SM, rows looping (300 rows over 66-99 clusters), and the row kernels
                                 KernelSpec{"cross_entropy", DType::bf16, DType::bf16,
                                            {{"tokens", 300}, {"vocab", 128256}, {"grad_inplace", 1}}}};
  // attention_bwd at head dims 64 and 128: the atomic-dQ candidate (ATOMIC_DQ; at 128 dQ's columns
  // split between the consumers) among the item orders; queries of a sequence in several 64-row
  // workspace tiles, causal bottom-right with seqlen_q < seqlen_k, GQA; thd with its own tile
  // offsets; fp16 MQA without a mask.
  for (int64_t d : {64, 128}) {
    specs.push_back({"attention_bwd", DType::bf16, DType::bf16,
                     {{"batch", 2}, {"seqlen_q", 333}, {"seqlen_k", 400}, {"heads", 4}, {"kv_heads", 2},
                      {"head_dim", d}, {"causal", 1}}});
    specs.push_back({"attention_bwd", DType::bf16, DType::bf16,
                     {{"layout", 1 /* thd */}, {"batch", 4}, {"total_q", 700}, {"total_k", 900}, {"max_seqlen_q", 300},
                      {"max_seqlen_k", 400}, {"heads", 4}, {"kv_heads", 1}, {"head_dim", d}, {"causal", 1}}});
    specs.push_back({"attention_bwd", DType::f16, DType::f16,
                     {{"batch", 1}, {"seqlen_q", 200}, {"seqlen_k", 130}, {"heads", 4}, {"kv_heads", 1},
                      {"head_dim", d}}});
  }
  for (const KernelSpec& spec : specs) {
    const OpTemplate& gemm = **find_op(spec.op);
    for (const KernelConfig& c : gemm.tuning_candidates(spec, probe->device()->target())) {
      SCOPED_TRACE(to_string(spec) + ": " + config_string(c));
      TuningRecord r;
      r.key = TuningKey::make(tuning_subject(gemm, spec, probe->device()->target()), probe->device()->target(), device,
                                "nvrtc");
      r.winner = c;
      r.candidates = {TuneCandidate{c, 1.0, 1.0, 1.0, ""}};
      r.reps = 1;
      r.created_utc = utc_now();
      ASSERT_TRUE(store_tuning(*cache, r).ok());
      auto tuned = std::move(Runtime::create(o)).value();
      auto k = tuned->kernel(spec);
      ASSERT_TRUE(k.ok()) << k.error().message;
      EXPECT_EQ((*k)->compiled().info().config, config_string(c));
      auto report = check_on_device(*tuned, spec);
      ASSERT_TRUE(report.ok()) << report.error().message;
      EXPECT_TRUE(report->pass) << format_report(*report);
      EXPECT_EQ(report->nonfinite, 0);
    }
  }
}

}  // namespace
}  // namespace kiln
