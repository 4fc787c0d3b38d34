// Kiln on the fake CUDA driver (tests/fake_driver): a real NVRTC compile, a launch the fake
// records. Needs no GPU; needs NVRTC (skips without it).
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include "fake_driver/fake_cuda.h"
#include "runtime/driver/nvrtc_api.h"
#include "test_util.h"

namespace kiln {
namespace {

// Before main, hence before Kiln reads its environment and loads libcuda (once per process).
const bool kUseFake = [] { return setenv("KILN_CUDA_LIB", KILN_FAKE_CUDA, 1) == 0; }();

// The fake's C API, from the copy Kiln loaded.
template <typename Fn>
Fn fake(const char* name) {
  void* handle = dlopen(KILN_FAKE_CUDA, RTLD_NOW | RTLD_NOLOAD);
  EXPECT_NE(handle, nullptr) << "the fake driver is not loaded";
  Fn fn = handle ? reinterpret_cast<Fn>(dlsym(handle, name)) : nullptr;
  EXPECT_NE(fn, nullptr) << name;
  return fn;
}

std::unique_ptr<Runtime> fake_runtime(const std::string& cache_dir) {
  RuntimeOptions o;
  o.backend = "cuda";
  o.cache_dir = cache_dir;
  auto rt = Runtime::create(o);
  EXPECT_TRUE(rt.ok()) << rt.error().message;
  return rt.ok() ? std::move(rt).value() : nullptr;
}

#define KILN_REQUIRE_NVRTC()                                                       \
  if (auto nvrtc = nvrtc_api(); !nvrtc.ok())                                       \
  GTEST_SKIP() << "NVRTC is unavailable, so nothing compiles for sm_90a: " << nvrtc.error().message

TEST(FakeCuda, OpensAnSm90aDeviceAndLaunchesRmsnorm) {
  ASSERT_TRUE(kUseFake);
  KILN_REQUIRE_NVRTC();
  testing::TempDir dir;
  auto rt = fake_runtime(dir.path());
  ASSERT_TRUE(rt);
  ASSERT_NE(rt->device(), nullptr);
  EXPECT_EQ(rt->device()->target().name, "sm_90a");
  EXPECT_EQ(rt->device()->compute_units(), 132);

  const int64_t rows = 64, hidden = 1024;
  const KernelSpec spec = testing::rmsnorm_spec(rows, hidden);
  std::vector<void*> buffers;
  for (uint64_t bytes : {rows * hidden * 2, hidden * 2, rows * hidden * 2}) {
    auto p = rt->device()->malloc(bytes);
    ASSERT_TRUE(p.ok()) << p.error().message;
    buffers.push_back(*p);
  }
  const int before = fake<FakeCudaCountFn>("fake_cuda_launch_count")();
  auto launched = rt->launch(spec, buffers);
  ASSERT_TRUE(launched.ok()) << launched.error().message;
  EXPECT_EQ(fake<FakeCudaCountFn>("fake_cuda_launch_count")(), before + 1);
  FakeCudaLaunch last{};
  ASSERT_EQ(fake<FakeCudaLastLaunchFn>("fake_cuda_last_launch")(&last), 1);
  EXPECT_STREQ(last.kernel, "kiln_rmsnorm");
  EXPECT_GE(last.grid[0], 1u);
  EXPECT_GE(last.block[0], 32u);
  EXPECT_EQ(last.cluster[0] * last.cluster[1] * last.cluster[2], 1u);
  EXPECT_GT(last.params, 0) << "the fake reads the parameter count from the cubin";
  for (void* p : buffers) EXPECT_TRUE(rt->device()->free(p).ok());
}

}  // namespace
}  // namespace kiln
