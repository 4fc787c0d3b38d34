// Kiln on the fake CUDA driver (tests/fake_driver), a CUDA 13 driver: a real NVRTC compile, then
// launches the fake records. Needs no GPU; the tests that compile need NVRTC (they skip without).
#include <cmath>

#include "fake_driver/fake_cuda_test.h"
#include "kiln/check.h"
#include "runtime/driver/cuda_api.h"
#include "test_util.h"

namespace kiln {
namespace {

using testing::fake_last_launch;
using testing::fake_launch_count;

const bool kUseFake = testing::use_fake_cuda();  // before main: Kiln loads libcuda once

TEST(FakeCuda, LoadsTheOverrideWithItsOptionalSymbols) {
  ASSERT_TRUE(kUseFake);
  auto api = cuda_api();
  ASSERT_TRUE(api.ok()) << api.error().message;
  EXPECT_EQ((*api)->path, KILN_FAKE_CUDA);
  EXPECT_EQ((*api)->driver_version, 13000);
  EXPECT_NE((*api)->cuTensorMapEncodeTiled, nullptr);
  EXPECT_NE((*api)->cuLaunchKernelEx, nullptr);
}

TEST(FakeCuda, OpensAnSm90aDeviceAndLaunchesRmsnorm) {
  ASSERT_TRUE(kUseFake);
  KILN_REQUIRE_NVRTC();
  kiln::testing::TempDir dir;
  auto rt = testing::fake_runtime(dir.path());
  ASSERT_TRUE(rt);
  ASSERT_NE(rt->device(), nullptr);
  EXPECT_EQ(rt->device()->target().name, "sm_90a");
  EXPECT_EQ(rt->device()->compute_units(), 132);

  const int64_t rows = 64, hidden = 1024;
  testing::FakeBuffers buffers(rt->device(), {rows * hidden * 2, hidden * 2, rows * hidden * 2});
  const int before = fake_launch_count();
  auto launched = rt->launch(testing::rmsnorm_spec(rows, hidden), buffers.pointers);
  ASSERT_TRUE(launched.ok()) << launched.error().message;
  EXPECT_EQ(fake_launch_count(), before + 1);
  const FakeCudaLaunch last = fake_last_launch();
  EXPECT_STREQ(last.kernel, "kiln_rmsnorm");
  EXPECT_GE(last.grid[0], 1u);
  EXPECT_GE(last.block[0], 32u);
  EXPECT_EQ(last.cluster[0] * last.cluster[1] * last.cluster[2], 1u);
  EXPECT_EQ(last.via_launch_ex, 0) << "a launch without attributes is a plain cuLaunchKernel";
  EXPECT_GT(last.params, 0) << "the fake reads the parameter count from the cubin";
}

// The TMA gemm on a driver with cuTensorMapEncodeTiled: three tensor maps per launch, and the
// dynamic shared memory of its stages (beyond 48 KiB, after raising the function's limit).
TEST(FakeCuda, TmaGemmEncodesItsTensorMaps) {
  ASSERT_TRUE(kUseFake);
  KILN_REQUIRE_NVRTC();
  kiln::testing::TempDir dir;
  auto rt = testing::fake_runtime(dir.path());
  ASSERT_TRUE(rt);
  const KernelSpec spec = testing::gemm_spec(256, 256, 256, false, true);
  auto kernel = rt->kernel(spec);
  ASSERT_TRUE(kernel.ok()) << kernel.error().message;
  ASSERT_NE((*kernel)->compiled().info().config.find("TMA=1"), std::string::npos)
      << "expected the TMA variant: " << (*kernel)->compiled().info().config;
  testing::FakeBuffers buffers(rt->device(), {256 * 256 * 2, 256 * 256 * 2, 256 * 256 * 2});
  auto maps = testing::fake_cuda<FakeCudaCountFn>("fake_cuda_tensor_map_count");
  const int maps_before = maps();
  auto launched = (*kernel)->launch(spec, buffers.pointers);
  ASSERT_TRUE(launched.ok()) << launched.error().message;
  EXPECT_EQ(maps(), maps_before + 3);
  const FakeCudaLaunch last = fake_last_launch();
  EXPECT_STREQ(last.kernel, "kiln_gemm");
  EXPECT_GT(last.shared_bytes, 48u * 1024);
  EXPECT_EQ(last.params, 3);
}

// A caller's workspace must be 16-byte aligned: the attention backward's fp32 dQ accumulator (head
// dim 64 on sm_90a) is read and written in 16-byte vectors, which fault on the device at a
// misaligned address. Refused before any launch, with the fix in the message; the kernel's own
// workspace and an aligned one launch D, dK/dV with dQ (causal GQA: KV_SPLIT 2, dK and dV added
// into the workspace too), dk and dv's conversion, and dq's.
TEST(FakeCuda, AMisalignedWorkspaceIsRefusedBeforeTheLaunch) {
  ASSERT_TRUE(kUseFake);
  KILN_REQUIRE_NVRTC();
  kiln::testing::TempDir dir;
  auto rt = testing::fake_runtime(dir.path());
  ASSERT_TRUE(rt);
  const KernelSpec spec{"attention_bwd", DType::bf16, DType::bf16,
                        {{"batch", 1}, {"seqlen_q", 128}, {"seqlen_k", 128}, {"heads", 4}, {"kv_heads", 2},
                         {"head_dim", 64}, {"causal", 1}}};
  auto kernel = rt->kernel(spec);
  ASSERT_TRUE(kernel.ok()) << kernel.error().message;
  ASSERT_NE((*kernel)->compiled().info().config.find("ATOMIC_DQ=1"), std::string::npos)
      << (*kernel)->compiled().info().config;
  ASSERT_NE((*kernel)->compiled().info().config.find("KV_SPLIT=2"), std::string::npos)
      << (*kernel)->compiled().info().config;
  const uint64_t q = 128 * 4 * 64 * 2, kv = 128 * 2 * 64 * 2, ws = (*kernel)->workspace_bytes(spec);
  ASSERT_GT(ws, uint64_t{4 * 4 * 128}) << "D and the dQ, dK and dV accumulators";
  // dout, q, k, v, out, lse, dq, dk, dv, then a workspace with room for an offset
  testing::FakeBuffers buffers(rt->device(), {q, q, kv, kv, q, 4 * 128 * 4, q, kv, kv, ws + 16});
  std::vector<void*> tensors(buffers.pointers.begin(), buffers.pointers.end() - 1);
  char* const base = static_cast<char*>(buffers.pointers.back());

  const int before = fake_launch_count();
  auto own = (*kernel)->launch(spec, tensors);
  ASSERT_TRUE(own.ok()) << own.error().message;
  EXPECT_EQ(fake_launch_count(), before + 4);
  EXPECT_STREQ(fake_last_launch().kernel, "kiln_attention_bwd_dq_convert");

  std::vector<void*> with = tensors;
  with.push_back(base + 4);
  const int at = fake_launch_count();
  auto refused = (*kernel)->launch(spec, with);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code, Errc::invalid_argument);
  EXPECT_NE(refused.error().message.find("workspace"), std::string::npos) << refused.error().message;
  EXPECT_NE(refused.error().message.find("16-byte aligned"), std::string::npos) << refused.error().message;
  EXPECT_EQ(fake_launch_count(), at) << "nothing launched";

  with.back() = base + 16;
  auto aligned = (*kernel)->launch(spec, with);
  ASSERT_TRUE(aligned.ok()) << aligned.error().message;
  EXPECT_EQ(fake_launch_count(), at + 4);
}

// Cluster dimensions and programmatic dependent launch reach cuLaunchKernelEx.
TEST(FakeCuda, ClusterAndProgrammaticLaunchGoThroughCuLaunchKernelEx) {
  ASSERT_TRUE(kUseFake);
  auto device = open_cuda_device(0);
  ASSERT_TRUE(device.ok()) << device.error().message;
  auto module = (*device)->load(testing::fake_cubin("kiln_probe"), "kiln_probe");
  ASSERT_TRUE(module.ok()) << module.error().message;
  LaunchGeometry g;
  g.grid = {8, 2, 1};
  g.block = {128, 1, 1};
  g.cluster = {2, 2, 1};
  ASSERT_TRUE((*module)->launch(g, nullptr, nullptr).ok());
  FakeCudaLaunch last = fake_last_launch();
  EXPECT_EQ(last.via_launch_ex, 1);
  EXPECT_EQ(last.cluster[0], 2u);
  EXPECT_EQ(last.cluster[1], 2u);
  EXPECT_EQ(last.cluster[2], 1u);
  EXPECT_EQ(last.grid[0], 8u);
  EXPECT_EQ(last.programmatic, 0);

  g.cluster = {};
  g.programmatic_dependent_launch = true;
  ASSERT_TRUE((*module)->launch(g, nullptr, nullptr).ok());
  last = fake_last_launch();
  EXPECT_EQ(last.via_launch_ex, 1);
  EXPECT_EQ(last.programmatic, 1);
  EXPECT_EQ(last.cluster[0] * last.cluster[1] * last.cluster[2], 1u);

  // A grid that is not a whole number of clusters: the driver's error, with the call.
  g.cluster = {3, 1, 1};
  auto bad = (*module)->launch(g, nullptr, nullptr);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, Errc::driver_error);
  EXPECT_NE(bad.error().message.find("cuLaunchKernelEx"), std::string::npos) << bad.error().message;
}

// time_ms destroys its events when the timed body fails.
// A check whose tensors cannot fit the device's free memory (the fake reports 80 GiB free, as an
// H100) is refused before anything is compiled or allocated, with the figures and the limit
// (issue 19: huge sizes reached allocation before any check). Needs no NVRTC: nothing compiles.
TEST(FakeCuda, ACheckTooLargeForTheDeviceIsRefusedWithTheFigures) {
  ASSERT_TRUE(kUseFake);
  kiln::testing::TempDir dir;
  auto rt = testing::fake_runtime(dir.path());
  ASSERT_TRUE(rt);
  const int live = testing::fake_cuda<FakeCudaCountFn>("fake_cuda_live_allocations")();
  CheckOptions options;
  options.sample_rows = 16;
  // 131072^2 bf16 is 32 GiB per tensor: 96 GiB for A, B and C.
  auto r = check_on_device(*rt, testing::gemm_spec(131072, 131072, 131072, false, true), options);
  ASSERT_FALSE(r.ok()) << "a 96 GiB check was not refused";
  EXPECT_EQ(r.error().code, Errc::invalid_argument);
  for (const char* part : {"its tensors need 96.0 GiB of device memory", "A 32.0 GiB", "80.0 GiB", "cuMemGetInfo",
                           "give smaller sizes"})
    EXPECT_NE(r.error().message.find(part), std::string::npos) << part << " not in: " << r.error().message;
  EXPECT_EQ(testing::fake_cuda<FakeCudaCountFn>("fake_cuda_live_allocations")(), live) << "nothing was allocated";
  EXPECT_EQ(rt->stats().compiles, 0u) << "nothing was compiled";
}

// The tuner writes twice the device's caches (the fake reports a 1 MiB L2) before each timed
// launch, so that no candidate is timed on inputs that the launch before it left in L2; one
// buffer serves every candidate of the tuning.
TEST(FakeCuda, TheTunerFlushesTheCachesBeforeEachTimedLaunch) {
  ASSERT_TRUE(kUseFake);
  KILN_REQUIRE_NVRTC();
  kiln::testing::TempDir dir;
  auto rt = testing::fake_runtime(dir.path());
  ASSERT_TRUE(rt);
  auto memsets = testing::fake_cuda<FakeCudaCountFn>("fake_cuda_memset_count");
  using BytesFn = size_t (*)(void);
  auto flush_allocs = testing::fake_cuda<FakeCudaCountFn>("fake_cuda_flush_sized_allocations");
  const int live = testing::fake_cuda<FakeCudaCountFn>("fake_cuda_live_allocations")();
  const int before = memsets(), allocs_before = flush_allocs();
  TuneOptions options;
  options.reps = 3;
  options.force = true;
  auto report = rt->tune(testing::rmsnorm_spec(64, 4096), options);
  ASSERT_TRUE(report.ok()) << report.error().message;
  int timed = 0;
  for (const TuneCandidate& c : report->candidates) timed += c.error.empty() ? 1 : 0;
  ASSERT_GE(timed, 2) << "rmsnorm has several candidates on sm_90a";
  EXPECT_GE(memsets() - before, timed * options.reps);
  EXPECT_EQ(testing::fake_cuda<BytesFn>("fake_cuda_last_memset_bytes")(), size_t{2} << 20);
  EXPECT_EQ(flush_allocs() - allocs_before, 1) << "one flush buffer for the whole tuning, not one per candidate";
  EXPECT_EQ(testing::fake_cuda<FakeCudaCountFn>("fake_cuda_live_allocations")(), live) << "the flush buffer is freed";
}

// The tuner launches each candidate back to back for about TuneOptions::settle_ms before timing
// it (so that it is timed at the clock of sustained load); 0 turns that off; a negative or NaN
// value is an error.
TEST(FakeCuda, TuningSettlesEachCandidateBeforeTimingIt) {
  ASSERT_TRUE(kUseFake);
  KILN_REQUIRE_NVRTC();
  kiln::testing::TempDir dir;
  auto rt = testing::fake_runtime(dir.path());
  ASSERT_TRUE(rt);
  const KernelSpec spec = testing::rmsnorm_spec(64, 4096);
  auto launches = [&](double settle_ms, int& timed) {
    TuneOptions options;
    options.reps = 3;
    options.force = true;
    options.settle_ms = settle_ms;
    const int before = fake_launch_count();
    auto report = rt->tune(spec, options);
    EXPECT_TRUE(report.ok()) << report.error().message;
    timed = 0;
    if (report.ok())
      for (const TuneCandidate& c : report->candidates) timed += c.error.empty() ? 1 : 0;
    return fake_launch_count() - before;
  };
  int timed = 0, timed_settled = 0;
  const int plain = launches(0, timed);
  ASSERT_GE(timed, 2) << "rmsnorm has several candidates on sm_90a";
  EXPECT_EQ(plain, timed * (1 + 3)) << "without settling: a warm-up and the timed launches per candidate";
  const int settled = launches(50, timed_settled);
  EXPECT_EQ(timed_settled, timed);
  EXPECT_GE(settled, plain + timed) << "at least one settling launch per candidate";
  EXPECT_LE(settled, plain + 1000 * timed) << "at most 1000 per candidate";
  for (double bad : {-1.0, std::nan("")}) {
    TuneOptions options;
    options.settle_ms = bad;
    auto report = rt->tune(spec, options);
    ASSERT_FALSE(report.ok());
    EXPECT_EQ(report.error().code, Errc::invalid_argument);
    EXPECT_NE(report.error().message.find("settle_ms"), std::string::npos) << report.error().message;
  }
}

// check_on_device's bench_iterations (`kiln run --bench`): each timed launch alone after a cache
// flush, as the tuner and bench/ time kernels, after back-to-back launches for bench_settle_ms.
TEST(FakeCuda, TheCheckTimesEachLaunchAfterACacheFlush) {
  ASSERT_TRUE(kUseFake);
  KILN_REQUIRE_NVRTC();
  kiln::testing::TempDir dir;
  auto rt = testing::fake_runtime(dir.path());
  ASSERT_TRUE(rt);
  EXPECT_EQ(rt->device()->cache_bytes(), size_t{1} << 20) << "the fake's L2";
  auto memsets = testing::fake_cuda<FakeCudaCountFn>("fake_cuda_memset_count");
  using BytesFn = size_t (*)(void);
  const int live = testing::fake_cuda<FakeCudaCountFn>("fake_cuda_live_allocations")();
  CheckOptions options;
  options.bench_iterations = 5;
  options.bench_settle_ms = 0;
  int before_launches = fake_launch_count();
  const int before = memsets();
  auto report = check_on_device(*rt, testing::rmsnorm_spec(64, 1024), options);
  ASSERT_TRUE(report.ok()) << report.error().message;
  EXPECT_TRUE(report->kernel_flushed);
  EXPECT_GE(memsets() - before, options.bench_iterations);
  EXPECT_EQ(testing::fake_cuda<BytesFn>("fake_cuda_last_memset_bytes")(), size_t{2} << 20);
  EXPECT_EQ(fake_launch_count() - before_launches, 1 + 1 + options.bench_iterations)
      << "the checked launch, one warm-up, then each timed launch once";
  EXPECT_EQ(testing::fake_cuda<FakeCudaCountFn>("fake_cuda_live_allocations")(), live) << "the flush buffer is freed";
  // By default (`kiln run --bench`) back-to-back launches for about 200 ms come first, as the
  // tuner's settle_ms: at least one, at most 1000.
  EXPECT_EQ(CheckOptions{}.bench_settle_ms, 200);
  options.bench_settle_ms = CheckOptions{}.bench_settle_ms;
  before_launches = fake_launch_count();
  report = check_on_device(*rt, testing::rmsnorm_spec(64, 1024), options);
  ASSERT_TRUE(report.ok()) << report.error().message;
  const int settled = fake_launch_count() - before_launches;
  EXPECT_GE(settled, 1 + 1 + 1 + options.bench_iterations);
  EXPECT_LE(settled, 1 + 1 + 1000 + options.bench_iterations);
  for (double bad : {-1.0, std::nan("")}) {
    options.bench_settle_ms = bad;
    auto refused = check_on_device(*rt, testing::rmsnorm_spec(64, 1024), options);
    ASSERT_FALSE(refused.ok());
    EXPECT_EQ(refused.error().code, Errc::invalid_argument);
    EXPECT_NE(refused.error().message.find("bench_settle_ms"), std::string::npos) << refused.error().message;
  }
}

TEST(FakeCuda, TimeMsDestroysItsEventsOnError) {
  ASSERT_TRUE(kUseFake);
  auto device = open_cuda_device(0);
  ASSERT_TRUE(device.ok()) << device.error().message;
  auto live = testing::fake_cuda<FakeCudaCountFn>("fake_cuda_live_events");
  const int before = live();
  auto timed = (*device)->time_ms(nullptr, [] { return Result<void>(make_error(Errc::invalid_argument, "body")); });
  EXPECT_FALSE(timed.ok());
  EXPECT_EQ(live(), before);
  auto fine = (*device)->time_ms(nullptr, [] { return ok(); });
  EXPECT_TRUE(fine.ok());
  EXPECT_EQ(live(), before);
}

}  // namespace
}  // namespace kiln
