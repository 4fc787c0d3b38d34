// HipDevice on the fake HIP runtime (tests/fake_driver/fake_hip.cpp): events are destroyed on
// every error path of time_ms, and a refused code object's loader log reaches the error.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include "runtime/device_impl.h"

namespace kiln {
namespace {

const bool kUseFake = setenv("KILN_HIP_LIB", KILN_FAKE_HIP, 1) == 0;  // before main: loaded once

template <typename Fn>
Fn fake_hip(const char* name) {
  void* handle = dlopen(KILN_FAKE_HIP, RTLD_NOW | RTLD_NOLOAD);
  EXPECT_NE(handle, nullptr) << "the fake HIP runtime is not loaded";
  Fn fn = handle ? reinterpret_cast<Fn>(dlsym(handle, name)) : nullptr;
  EXPECT_NE(fn, nullptr) << name;
  return fn;
}

TEST(FakeHip, TimeMsDestroysItsEventsWhenARecordFails) {
  ASSERT_TRUE(kUseFake);
  auto device = open_hip_device(0);
  ASSERT_TRUE(device.ok()) << device.error().message;
  EXPECT_EQ((*device)->target().name, "gfx942");
  auto live = fake_hip<int (*)()>("fake_hip_live_events");
  auto fail_next = fake_hip<void (*)(const char*)>("fake_hip_fail_next");
  const int before = live();
  fail_next("hipEventRecord");
  auto timed = (*device)->time_ms(nullptr, [] { return ok(); });
  ASSERT_FALSE(timed.ok());
  EXPECT_NE(timed.error().message.find("hipEventRecord"), std::string::npos) << timed.error().message;
  EXPECT_EQ(live(), before) << "time_ms leaked its events on an error path";
  // And when the body fails.
  auto body_failed =
      (*device)->time_ms(nullptr, [] { return Result<void>(make_error(Errc::invalid_argument, "the body")); });
  ASSERT_FALSE(body_failed.ok());
  EXPECT_EQ(body_failed.error().message, "the body");
  EXPECT_EQ(live(), before);
  auto fine = (*device)->time_ms(nullptr, [] { return ok(); });
  ASSERT_TRUE(fine.ok()) << fine.error().message;
  EXPECT_EQ(live(), before);
}

TEST(FakeHip, ModuleLoadErrorCarriesTheLoaderLog) {
  ASSERT_TRUE(kUseFake);
  auto device = open_hip_device(0);
  ASSERT_TRUE(device.ok()) << device.error().message;
  const std::string text = "fake hsaco of kiln_probe";
  const CodeObject code{"hsaco", std::vector<uint8_t>(text.begin(), text.end() + 1)};
  auto loaded = (*device)->load(code, "kiln_probe");
  ASSERT_TRUE(loaded.ok()) << loaded.error().message;

  fake_hip<void (*)(const char*)>("fake_hip_fail_next")("hipModuleLoadDataEx");
  auto refused = (*device)->load(code, "kiln_probe");
  ASSERT_FALSE(refused.ok());
  const std::string& m = refused.error().message;
  for (const char* part : {"hipModuleLoadDataEx", "fake loader log: the code object is for gfx000", "kiln_probe"})
    EXPECT_NE(m.find(part), std::string::npos) << "no '" << part << "' in: " << m;
}

TEST(FakeHip, ClusterLaunchIsRefused) {
  ASSERT_TRUE(kUseFake);
  auto device = open_hip_device(0);
  ASSERT_TRUE(device.ok()) << device.error().message;
  const std::string text = "fake hsaco of kiln_probe";
  auto module = (*device)->load({"hsaco", std::vector<uint8_t>(text.begin(), text.end() + 1)}, "kiln_probe");
  ASSERT_TRUE(module.ok()) << module.error().message;
  LaunchGeometry g;
  g.grid = {4, 1, 1};
  g.block = {64, 1, 1};
  EXPECT_TRUE((*module)->launch(g, nullptr, nullptr).ok());
  g.cluster = {2, 1, 1};
  auto clustered = (*module)->launch(g, nullptr, nullptr);
  ASSERT_FALSE(clustered.ok());
  EXPECT_EQ(clustered.error().code, Errc::unsupported);
}

}  // namespace
}  // namespace kiln
