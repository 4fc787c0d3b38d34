// Kiln on the fake CUDA driver built as a driver older than CUDA 12.0 (no cuTensorMapEncodeTiled,
// no cuLaunchKernelEx): what needs no TMA still runs, and what does gets a clear error.
#include "fake_driver/fake_cuda_test.h"
#include "runtime/driver/cuda_api.h"
#include "test_util.h"

namespace kiln {
namespace {

using testing::fake_last_launch;
using testing::fake_launch_count;

const bool kUseFake = testing::use_fake_cuda();  // before main: Kiln loads libcuda once

TEST(FakeCudaOld, LoadsWithoutTheOptionalSymbols) {
  ASSERT_TRUE(kUseFake);
  auto api = cuda_api();
  ASSERT_TRUE(api.ok()) << "a driver without cuTensorMapEncodeTiled must still load: " << api.error().message;
  EXPECT_EQ((*api)->path, KILN_FAKE_CUDA);
  EXPECT_EQ((*api)->driver_version, 11080);
  EXPECT_EQ((*api)->cuTensorMapEncodeTiled, nullptr);
  EXPECT_EQ((*api)->cuLaunchKernelEx, nullptr);
}

TEST(FakeCudaOld, RmsnormStillLaunches) {
  ASSERT_TRUE(kUseFake);
  KILN_REQUIRE_NVRTC();
  kiln::testing::TempDir dir;
  auto rt = testing::fake_runtime(dir.path());
  ASSERT_TRUE(rt);
  ASSERT_NE(rt->device(), nullptr);
  const int64_t rows = 3, hidden = 4096;
  testing::FakeBuffers buffers(rt->device(), {rows * hidden * 2, hidden * 2, rows * hidden * 2});
  const int before = fake_launch_count();
  auto launched = rt->launch(testing::rmsnorm_spec(rows, hidden), buffers.pointers);
  ASSERT_TRUE(launched.ok()) << launched.error().message;
  EXPECT_EQ(fake_launch_count(), before + 1);
  const FakeCudaLaunch last = fake_last_launch();
  EXPECT_STREQ(last.kernel, "kiln_rmsnorm");
  EXPECT_EQ(last.via_launch_ex, 0);
}

// The TMA gemm's launch fails with an error that names the missing entry point, the driver and
// the version needed; nothing is launched.
TEST(FakeCudaOld, TmaGemmNamesTheMissingSymbolAndTheDriverNeeded) {
  ASSERT_TRUE(kUseFake);
  KILN_REQUIRE_NVRTC();
  kiln::testing::TempDir dir;
  auto rt = testing::fake_runtime(dir.path());
  ASSERT_TRUE(rt);
  const KernelSpec spec = testing::gemm_spec(256, 256, 256, false, true);
  testing::FakeBuffers buffers(rt->device(), {256 * 256 * 2, 256 * 256 * 2, 256 * 256 * 2});
  const int before = fake_launch_count();
  auto launched = rt->launch(spec, buffers.pointers);
  ASSERT_FALSE(launched.ok());
  const Error& e = launched.error();
  EXPECT_EQ(e.code, Errc::unsupported) << e.message;
  for (const char* part : {"cuTensorMapEncodeTiled", KILN_FAKE_CUDA, "CUDA 11.8", "CUDA 12.0"})
    EXPECT_NE(e.message.find(part), std::string::npos) << "no '" << part << "' in: " << e.message;
  EXPECT_EQ(fake_launch_count(), before);
}

// Clusters need cuLaunchKernelEx: refused, by name. A launch without them still goes through
// cuLaunchKernel, and so does one asking for programmatic dependent launch (an overlap the kernel
// does not need: its griddepcontrol.wait returns at once; rmsnorm_bwd's reduction asks for it).
// Before 2026-11-27 that one was refused too, so rmsnorm_bwd failed on such a driver.
TEST(FakeCudaOld, ClusterLaunchIsRefusedWithoutCuLaunchKernelEx) {
  ASSERT_TRUE(kUseFake);
  auto device = open_cuda_device(0);
  ASSERT_TRUE(device.ok()) << device.error().message;
  auto module = (*device)->load(testing::fake_cubin("kiln_probe"), "kiln_probe");
  ASSERT_TRUE(module.ok()) << module.error().message;
  LaunchGeometry g;
  g.grid = {8, 1, 1};
  g.block = {128, 1, 1};
  const int before = fake_launch_count();
  ASSERT_TRUE((*module)->launch(g, nullptr, nullptr).ok());
  EXPECT_EQ(fake_launch_count(), before + 1);

  g.cluster = {2, 1, 1};
  auto clustered = (*module)->launch(g, nullptr, nullptr);
  ASSERT_FALSE(clustered.ok());
  EXPECT_EQ(clustered.error().code, Errc::unsupported);
  EXPECT_NE(clustered.error().message.find("cuLaunchKernelEx"), std::string::npos) << clustered.error().message;
  EXPECT_NE(clustered.error().message.find("cluster"), std::string::npos) << clustered.error().message;

  g.cluster = {};
  g.programmatic_dependent_launch = true;
  auto programmatic = (*module)->launch(g, nullptr, nullptr);
  ASSERT_TRUE(programmatic.ok()) << programmatic.error().message;
  EXPECT_EQ(fake_launch_count(), before + 2) << "a plain cuLaunchKernel";
}

}  // namespace
}  // namespace kiln
