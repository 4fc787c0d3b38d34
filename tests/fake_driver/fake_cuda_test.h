// Helpers of the tests on the fake CUDA driver (tests/fake_driver/fake_cuda.cpp). Each test
// executable defines KILN_FAKE_CUDA (the fake's path) and sets KILN_CUDA_LIB to it before main,
// since Kiln loads libcuda once per process.
#pragma once

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <memory>
#include <string>
#include <vector>

#include "fake_driver/fake_cuda.h"
#include "kiln/runtime.h"
#include "runtime/device_impl.h"
#include "compile/nvrtc_api.h"

namespace kiln::testing {

/// Points KILN_CUDA_LIB at the fake; call from a namespace-scope initializer (before main).
inline bool use_fake_cuda() { return setenv("KILN_CUDA_LIB", KILN_FAKE_CUDA, 1) == 0; }

/// An entry point of the fake's C API, from the copy Kiln loaded.
template <typename Fn>
Fn fake_cuda(const char* name) {
  void* handle = dlopen(KILN_FAKE_CUDA, RTLD_NOW | RTLD_NOLOAD);
  EXPECT_NE(handle, nullptr) << "the fake driver " << KILN_FAKE_CUDA << " is not loaded";
  Fn fn = handle ? reinterpret_cast<Fn>(dlsym(handle, name)) : nullptr;
  EXPECT_NE(fn, nullptr) << name;
  return fn;
}
inline int fake_launch_count() { return fake_cuda<FakeCudaCountFn>("fake_cuda_launch_count")(); }
inline FakeCudaLaunch fake_last_launch() {
  FakeCudaLaunch last{};
  EXPECT_EQ(fake_cuda<FakeCudaLastLaunchFn>("fake_cuda_last_launch")(&last), 1) << "no launch recorded";
  return last;
}

/// A runtime on the fake device, with its own cache directory.
inline std::unique_ptr<Runtime> fake_runtime(const std::string& cache_dir) {
  RuntimeOptions o;
  o.backend = "cuda";
  o.cache_dir = cache_dir;
  auto rt = Runtime::create(o);
  EXPECT_TRUE(rt.ok()) << rt.error().message;
  return rt.ok() ? std::move(rt).value() : nullptr;
}

/// `bytes` of fake device memory per tensor, freed with the object.
struct FakeBuffers {
  Device* device;
  std::vector<void*> pointers;
  FakeBuffers(Device* d, std::initializer_list<uint64_t> sizes) : device(d) {
    for (uint64_t bytes : sizes) {
      auto p = device->malloc(bytes);
      EXPECT_TRUE(p.ok()) << p.error().message;
      pointers.push_back(p.ok() ? *p : nullptr);
    }
  }
  ~FakeBuffers() {
    for (void* p : pointers)
      if (p) (void)device->free(p);
  }
};

/// A "module" for the fake: any bytes that contain the kernel's name.
inline CodeObject fake_cubin(const std::string& kernel) {
  const std::string text = "fake cubin of " + kernel;
  return {"cubin", std::vector<uint8_t>(text.begin(), text.end() + 1)};
}

}  // namespace kiln::testing

#define KILN_REQUIRE_NVRTC()                                                         \
  if (auto nvrtc = ::kiln::nvrtc_api(); !nvrtc.ok())                                 \
  GTEST_SKIP() << "NVRTC is unavailable, so nothing compiles for sm_90a: " << nvrtc.error().message
