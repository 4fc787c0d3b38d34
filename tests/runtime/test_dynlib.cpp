// The dlopen loader (support/dynlib.h): search order and required/optional symbols, on the fake
// CUDA driver (tests/fake_driver). KILN_FAKE_CUDA_PRELOADED is a copy of the fake whose soname is
// libcuda.so.1, loaded first as PyTorch would load the real libcuda.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include "runtime/driver/cuda_api.h"
#include "support/dynlib.h"

// Declared for the symbol tables below (decltype), defined nowhere: the fakes lack them.
extern "C" int kiln_test_absent_required(int);
extern "C" int kiln_test_absent_optional(int);

namespace kiln {
namespace {

// Before main: the "already loaded" copy, and KILN_CUDA_LIB pointing at another file.
void* const kPreloaded = dlopen(KILN_FAKE_CUDA_PRELOADED, RTLD_NOW | RTLD_GLOBAL);
const bool kOverride = setenv("KILN_CUDA_LIB", KILN_FAKE_CUDA, 1) == 0;

// KILN_CUDA_LIB wins over a libcuda the process has already loaded (README: "library to dlopen
// first").
TEST(DynLib, OverrideWinsOverAnAlreadyLoadedCopy) {
  ASSERT_NE(kPreloaded, nullptr) << dlerror();
  ASSERT_TRUE(kOverride);
  ASSERT_NE(dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD), nullptr) << "the preloaded copy is not found by soname";
  auto api = cuda_api();
  ASSERT_TRUE(api.ok()) << api.error().message;
  EXPECT_EQ((*api)->path, KILN_FAKE_CUDA);
}

// Without an override, the copy already loaded is used (found by soname), and its path says so.
TEST(DynLib, AlreadyLoadedCopyIsUsedWithoutAnOverride) {
  ASSERT_NE(kPreloaded, nullptr) << dlerror();
  auto lib = DynLib::open("libcuda", "", {"libcuda.so.1", "libcuda.so"});
  ASSERT_TRUE(lib.ok()) << lib.error().message;
  EXPECT_EQ((*lib)->path(), std::string(KILN_FAKE_CUDA_PRELOADED) + " (already loaded)");
}

// An override that does not load falls back to the default search, and the error (when nothing
// loads) lists every path tried, the override first.
TEST(DynLib, ABrokenOverrideFallsBackAndEveryPathTriedIsListed) {
  auto fallback = DynLib::open("libcuda", "/nonexistent/libcuda.so.1", {"libcuda.so.1"});
  ASSERT_TRUE(fallback.ok()) << fallback.error().message;
  EXPECT_NE((*fallback)->path().find("(already loaded)"), std::string::npos);
  auto none = DynLib::open("libnothing", "/nonexistent/libnothing.so", {"libkiln-no-such-lib.so.7"});
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.error().code, Errc::driver_unavailable);
  const std::string& m = none.error().message;
  EXPECT_NE(m.find("/nonexistent/libnothing.so"), std::string::npos) << m;
  EXPECT_LT(m.find("/nonexistent/libnothing.so"), m.find("libkiln-no-such-lib.so.7")) << m;
}

#define KILN_TEST_REQUIRED_SYMBOLS(REQUIRED, OPTIONAL) \
  REQUIRED(cuInit) REQUIRED(kiln_test_absent_required) OPTIONAL(kiln_test_absent_optional)
struct RequiredMissingApi {
  KILN_SYMBOL_TABLE(KILN_TEST_REQUIRED_SYMBOLS)
};
#define KILN_TEST_OPTIONAL_SYMBOLS(REQUIRED, OPTIONAL) \
  REQUIRED(cuInit) OPTIONAL(kiln_test_absent_optional) OPTIONAL(cuDriverGetVersion)
struct OptionalMissingApi {
  KILN_SYMBOL_TABLE(KILN_TEST_OPTIONAL_SYMBOLS)
};

// A missing required symbol fails the load, naming the symbol and the library's path.
TEST(DynLib, MissingRequiredSymbolNamesTheSymbolAndThePath) {
  auto api = load_library<RequiredMissingApi>({"the test library", KILN_FAKE_CUDA, {}, "the hint"});
  ASSERT_FALSE(api.ok());
  EXPECT_EQ(api.error().code, Errc::driver_unavailable);
  const std::string& m = api.error().message;
  for (const char* part : {"kiln_test_absent_required", KILN_FAKE_CUDA, "the test library", "the hint"})
    EXPECT_NE(m.find(part), std::string::npos) << "no '" << part << "' in: " << m;
}

// A missing optional symbol is null; the others are bound.
TEST(DynLib, MissingOptionalSymbolIsNull) {
  auto api = load_library<OptionalMissingApi>({"the test library", KILN_FAKE_CUDA, {}, ""});
  ASSERT_TRUE(api.ok()) << api.error().message;
  EXPECT_NE((*api)->cuInit, nullptr);
  EXPECT_NE((*api)->cuDriverGetVersion, nullptr);
  EXPECT_EQ((*api)->kiln_test_absent_optional, nullptr);
  EXPECT_EQ((*api)->path, KILN_FAKE_CUDA);
}

}  // namespace
}  // namespace kiln
