// Helpers shared by the tests.
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <filesystem>
#include <string>

#include "kiln/runtime.h"
#include "kiln/spec.h"
#include "kiln/target.h"

namespace kiln::testing {

/// A fresh private directory, removed with everything in it at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "kiln-test-XXXXXX").string();
    path_ = mkdtemp(tmpl.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::permissions(path_, std::filesystem::perms::owner_all, ec);
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

/// A runtime without a device (compile, cache and prewarm only) on the cache directory `dir`.
inline std::unique_ptr<Runtime> compile_only_runtime(const std::string& dir) {
  RuntimeOptions o;
  o.backend = "none";
  o.cache_dir = dir;
  auto rt = Runtime::create(o);
  EXPECT_TRUE(rt.ok()) << rt.error().message;
  return std::move(rt).value();
}

/// A target of the table by name (the tests name only real ones).
inline const TargetInfo& target(const char* name) { return **find_target(name); }

/// A target this build can compile for without a GPU: an AMD one with LLVM, else sm_90a (NVRTC).
inline const char* compilable_target() { return KILN_WITH_LLVM ? "gfx942" : "sm_90a"; }
/// Skips the test in builds without LLVM (AMD code objects need clang/lld).
#define KILN_REQUIRE_LLVM() \
  if (!KILN_WITH_LLVM) GTEST_SKIP() << "built without LLVM (KILN_WITH_LLVM=OFF): no AMD code objects"

inline KernelSpec gemm_spec(int64_t M, int64_t N, int64_t K, bool ta, bool tb, DType dt = DType::bf16,
                            DType out = DType::bf16) {
  return {"gemm", dt, out, {{"M", M}, {"N", N}, {"K", K}, {"trans_a", ta}, {"trans_b", tb}}};
}
inline KernelSpec rmsnorm_spec(int64_t rows, int64_t hidden, DType dt = DType::bf16) {
  return {"rmsnorm", dt, dt, {{"rows", rows}, {"hidden", hidden}}};
}
inline KernelSpec swiglu_spec(int64_t rows, int64_t I, DType dt = DType::bf16) {
  return {"swiglu", dt, dt, {{"rows", rows}, {"intermediate", I}}};
}

}  // namespace kiln::testing
