// The launch path on the fake CUDA driver (tests/fake_driver): once a kernel is resolved, every
// public launch form (Kernel::launch, Runtime::launch, the typed kiln::ops calls, the TMA gemm)
// allocates nothing and makes one driver launch per kernel of its plan (issue 8 §3; the host time
// is in bench/bench_launch). Allocations are counted by replacing the global operator new in this
// executable. Needs no GPU; skips without NVRTC (nothing compiles for sm_90a then).
#include <atomic>
#include <cstdlib>
#include <new>
#include <thread>

#include "fake_driver/fake_cuda_test.h"
#include "kiln/ops.h"
#include "runtime/driver/cuda_api.h"
#include "test_util.h"

// This file replaces the global allocation functions; GCC's heuristic cannot tell they pair up.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

namespace {
std::atomic<long> g_allocations{0};
}  // namespace

void* operator new(std::size_t n) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](std::size_t n) { return operator new(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

namespace kiln {
namespace {

using testing::fake_launch_count;

const bool kUseFake = testing::use_fake_cuda();  // before main: Kiln loads libcuda once

const KernelSpec kSwiglu{"swiglu", DType::bf16, DType::bf16, {{"rows", 3}, {"intermediate", 256}}};
const KernelSpec kRmsnorm{"rmsnorm", DType::bf16, DType::bf16, {{"rows", 3}, {"hidden", 1024}}};
const KernelSpec kGemm{"gemm", DType::bf16, DType::bf16, {{"M", 128}, {"N", 128}, {"K", 64}, {"trans_a", 0}, {"trans_b", 1}}};
constexpr int kLaunches = 1000;

// Runs `launch` once to resolve everything, then kLaunches times; returns the allocations made by
// those launches, and checks each launched exactly one kernel.
template <typename F>
long allocations_per_form(F&& launch) {
  if (!launch()) return -1;
  const int launches_before = fake_launch_count();
  const long before = g_allocations.load();
  bool all_ok = true;
  for (int i = 0; i < kLaunches; ++i) all_ok &= launch();
  const long made = g_allocations.load() - before;
  EXPECT_TRUE(all_ok);
  EXPECT_EQ(fake_launch_count() - launches_before, kLaunches);
  return made;
}

TEST(LaunchPath, NoFormAllocatesOnceTheKernelIsResolved) {
  ASSERT_TRUE(kUseFake);
  KILN_REQUIRE_NVRTC();
  kiln::testing::TempDir dir;
  auto rt = testing::fake_runtime(dir.path());
  ASSERT_TRUE(rt);
  testing::FakeBuffers sw(rt->device(), {3 * 512 * 2, 3 * 256 * 2});
  testing::FakeBuffers rms(rt->device(), {3 * 1024 * 2, 1024 * 2, 3 * 1024 * 2});
  testing::FakeBuffers mm(rt->device(), {128 * 64 * 2, 128 * 64 * 2, 128 * 128 * 2});
  auto swiglu = rt->kernel(kSwiglu);
  auto gemm = rt->kernel(kGemm);
  ASSERT_TRUE(swiglu.ok()) << swiglu.error().message;
  ASSERT_TRUE(gemm.ok()) << gemm.error().message;
  ASSERT_NE((*gemm)->compiled().info().config.find("TMA=1"), std::string::npos) << "expected the TMA variant";

  EXPECT_EQ(allocations_per_form([&] { return (*swiglu)->launch(kSwiglu, sw.pointers).ok(); }), 0) << "Kernel::launch";
  EXPECT_EQ(allocations_per_form([&] { return rt->launch(kSwiglu, sw.pointers).ok(); }), 0) << "Runtime::launch";
  const std::map<std::string, float> eps{{"eps", 1e-6f}};
  EXPECT_EQ(allocations_per_form([&] { return rt->launch(kRmsnorm, rms.pointers, eps).ok(); }), 0)
      << "Runtime::launch with a scalar";
  EXPECT_EQ(allocations_per_form([&] {
              return ops::swiglu(*rt, 3, 256, DType::bf16, sw.pointers[0], sw.pointers[1]).ok();
            }),
            0)
      << "ops::swiglu";
  EXPECT_EQ(allocations_per_form([&] {
              return ops::rmsnorm(*rt, 3, 1024, DType::bf16, rms.pointers[0], rms.pointers[1], rms.pointers[2]).ok();
            }),
            0)
      << "ops::rmsnorm";
  EXPECT_EQ(allocations_per_form([&] {
              return ops::gemm(*rt, 128, 128, 64, false, true, DType::bf16, DType::bf16, mm.pointers[0],
                               mm.pointers[1], mm.pointers[2])
                  .ok();
            }),
            0)
      << "ops::gemm";
  EXPECT_EQ(allocations_per_form([&] { return (*gemm)->launch(kGemm, mm.pointers).ok(); }), 0) << "TMA gemm";
  // Alternating two kernels on one thread: the last-hit shortcut misses, the memo still serves.
  bool flip = false;
  EXPECT_EQ(allocations_per_form([&] {
              flip = !flip;
              return flip ? rt->launch(kSwiglu, sw.pointers).ok() : rt->launch(kRmsnorm, rms.pointers).ok();
            }),
            0)
      << "Runtime::launch alternating two kernels";
}

// A TMA kernel encodes its tensor maps for an address once per thread, and again when the
// address changes (the maps hold the address).
TEST(LaunchPath, TensorMapsAreEncodedAgainOnlyForANewAddress) {
  ASSERT_TRUE(kUseFake);
  KILN_REQUIRE_NVRTC();
  kiln::testing::TempDir dir;
  auto rt = testing::fake_runtime(dir.path());
  ASSERT_TRUE(rt);
  auto gemm = rt->kernel(kGemm);
  ASSERT_TRUE(gemm.ok()) << gemm.error().message;
  testing::FakeBuffers mm(rt->device(), {128 * 64 * 2, 128 * 64 * 2, 128 * 128 * 2, 128 * 128 * 2});
  auto maps = testing::fake_cuda<FakeCudaCountFn>("fake_cuda_tensor_map_count");
  std::vector<void*> abc = {mm.pointers[0], mm.pointers[1], mm.pointers[2]};
  const int before = maps();
  ASSERT_TRUE((*gemm)->launch(kGemm, abc).ok());
  EXPECT_EQ(maps(), before + 3);
  ASSERT_TRUE((*gemm)->launch(kGemm, abc).ok());
  EXPECT_EQ(maps(), before + 3) << "the same addresses reuse the thread's encodings";
  abc[2] = mm.pointers[3];
  ASSERT_TRUE((*gemm)->launch(kGemm, abc).ok());
  EXPECT_EQ(maps(), before + 4) << "a new C is encoded again, A and B are not";
  // A view off the 16-byte grid goes to the cp.async variant: no tensor map at all.
  abc[0] = static_cast<char*>(mm.pointers[0]) + 2;
  ASSERT_TRUE((*gemm)->launch(kGemm, abc).ok());
  EXPECT_EQ(maps(), before + 4) << "the cp.async kernel takes pointers, not tensor maps";
}

// A launch makes one driver call; the context is bound only when the driver refuses a launch for
// want of it: on a thread that never used CUDA, and on one where another context is current.
TEST(LaunchPath, ALaunchBindsTheContextOnlyWhenTheDriverAsks) {
  ASSERT_TRUE(kUseFake);
  KILN_REQUIRE_NVRTC();
  kiln::testing::TempDir dir;
  auto rt = testing::fake_runtime(dir.path());
  ASSERT_TRUE(rt);
  auto swiglu = rt->kernel(kSwiglu);
  ASSERT_TRUE(swiglu.ok()) << swiglu.error().message;
  testing::FakeBuffers sw(rt->device(), {3 * 512 * 2, 3 * 256 * 2});
  const CudaApi* api = *cuda_api();
  const int before = fake_launch_count();
  bool fresh_ok = false, foreign_ok = false;
  CUcontext after = nullptr;
  std::thread([&] { fresh_ok = (*swiglu)->launch(kSwiglu, sw.pointers).ok(); }).join();
  std::thread([&] {
    static char other;  // another library's context, as far as this thread knows (an opaque handle)
    api->cuCtxSetCurrent(reinterpret_cast<CUcontext>(&other));
    foreign_ok = rt->launch(kSwiglu, sw.pointers).ok();
    api->cuCtxGetCurrent(&after);
  }).join();
  EXPECT_TRUE(fresh_ok) << "a thread without a current context";
  EXPECT_TRUE(foreign_ok) << "a thread with another context current";
  EXPECT_EQ(fake_launch_count(), before + 2);
  CUcontext primary = nullptr;
  ASSERT_EQ(api->cuDevicePrimaryCtxRetain(&primary, 0), CUDA_SUCCESS);
  EXPECT_EQ(after, primary);
  api->cuDevicePrimaryCtxRelease(0);
}

}  // namespace
}  // namespace kiln
