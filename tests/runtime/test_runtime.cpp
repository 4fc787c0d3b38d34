// The public runtime API without a GPU: compile-only runtimes, errors as values, thread safety.
#include <thread>

#include "templates/registry.h"
#include "cache/tuning.h"
#include "kiln/kiln.h"
#include "support/env.h"
#include "test_util.h"

namespace kiln {
namespace {
using testing::gemm_spec;
using testing::rmsnorm_spec;
using testing::compile_only_runtime;
using testing::TempDir;

TEST(Runtime, CompileOnlyRuntimeCompilesButCannotLaunch) {
  TempDir dir;
  auto rt = compile_only_runtime(dir.path());
  EXPECT_EQ(rt->device(), nullptr);
  EXPECT_TRUE(rt->compile(rmsnorm_spec(1, 128), testing::compilable_target()).ok());
  auto k = rt->kernel(rmsnorm_spec(1, 128));
  ASSERT_FALSE(k.ok());
  EXPECT_EQ(k.error().code, Errc::driver_unavailable);
  EXPECT_NE(k.error().message.find("compile-only"), std::string::npos);
  auto launched = ops::rmsnorm(*rt, 1, 128, DType::bf16, nullptr, nullptr, nullptr);
  ASSERT_FALSE(launched.ok());
  EXPECT_EQ(launched.error().code, Errc::driver_unavailable);
#if !KILN_WITH_LLVM
  auto amd = rt->compile(rmsnorm_spec(1, 128), "gfx942");
  ASSERT_FALSE(amd.ok());
  EXPECT_EQ(amd.error().code, Errc::unsupported);
  EXPECT_NE(amd.error().message.find("built without LLVM"), std::string::npos);
#endif
}

TEST(Runtime, BadRequestsAreErrorsNotCrashes) {
  TempDir dir;
  auto rt = compile_only_runtime(dir.path());
  auto unknown_target = rt->compile(rmsnorm_spec(1, 128), "gfx1100");
  ASSERT_FALSE(unknown_target.ok());
  EXPECT_EQ(unknown_target.error().code, Errc::not_found);
  EXPECT_NE(unknown_target.error().message.find("known targets: gfx942, gfx950, sm_90a"), std::string::npos);
  auto unknown_op = rt->compile(KernelSpec{"conv", DType::bf16, DType::bf16, {}}, "sm_90a");
  ASSERT_FALSE(unknown_op.ok());
  EXPECT_EQ(unknown_op.error().code, Errc::not_found);
  auto bad_shape = rt->compile(gemm_spec(1, 1, 0, false, false), "sm_90a");
  ASSERT_FALSE(bad_shape.ok());
  EXPECT_EQ(bad_shape.error().code, Errc::invalid_argument);
  EXPECT_EQ(rt->stats().compiles, 0u);
  RuntimeOptions opencl;
  opencl.backend = "opencl";
  auto bad_backend = Runtime::create(opencl);
  ASSERT_FALSE(bad_backend.ok());
  EXPECT_NE(bad_backend.error().message.find("unknown backend 'opencl'"), std::string::npos);
}

TEST(Runtime, ConcurrentRequestsForManyKernelsAreSafe) {
  TempDir dir;
  auto rt = compile_only_runtime(dir.path());
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 6; ++i)
        if (!rt->compile(rmsnorm_spec(1, 64 * (1 + (i + t) % 6)), i % 2 ? "sm_90a" : testing::compilable_target()).ok())
          ++failures;
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  const uint64_t distinct = KILN_WITH_LLVM ? 12 : 6;  // 6 hidden sizes x (2 targets, or sm_90a alone)
  EXPECT_EQ(rt->stats().compiles, distinct) << "each distinct kernel compiled once";
  EXPECT_EQ(rt->stats().compiles + rt->stats().memory_hits + rt->stats().disk_hits, 24u);
}

TEST(Runtime, DiskCacheCanBeTurnedOff) {
  RuntimeOptions o;
  o.backend = "none";
  o.disk_cache = false;
  auto rt = std::move(Runtime::create(o)).value();
  EXPECT_EQ(rt->cache_dir(), "");
  EXPECT_TRUE(rt->compile(rmsnorm_spec(1, 64), "sm_90a").ok());
}

TEST(Runtime, TuningNeedsAGpu) {
  TempDir dir;
  auto rt = compile_only_runtime(dir.path());
  auto r = rt->tune(gemm_spec(1024, 1024, 1024, false, true));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::driver_unavailable);
  EXPECT_NE(r.error().message.find("no GPU: tuning times kernels on a device"), std::string::npos) << r.error().message;
  EXPECT_EQ(rt->stats().tunings, 0u);
  EXPECT_EQ(rt->stats().compiles, 0u);
}

TEST(Runtime, CompileKeepsTheHeuristicWhenATuningRecordExists) {
  // A record from a GPU machine in the cache: compile() (no device) still builds the heuristic's
  // configuration; only kernel() on that device reads records.
  TempDir dir;
  const KernelSpec spec = gemm_spec(1024, 1024, 1024, false, true);
  const OpTemplate& gemm = **find_op("gemm");
  const TargetInfo& sm90 = testing::target("sm_90a");
  const std::vector<KernelConfig> candidates = gemm.tuning_candidates(spec, sm90);
  {
    auto cache = std::move(DiskCache::open(dir.path())).value();
    TuningRecord r;
    r.key = TuningKey::make(tuning_subject(gemm, spec, sm90), sm90, "NVIDIA H200", "nvrtc");
    r.winner = candidates.back();
    r.candidates = {TuneCandidate{candidates.back(), 0.01, 0.009, 0.011, ""}};
    r.reps = 1;
    r.created_utc = utc_now();
    ASSERT_TRUE(store_tuning(*cache, r).ok());
  }
  auto rt = compile_only_runtime(dir.path());
  auto c = rt->compile(spec, "sm_90a");
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ((*c)->info().config, config_string(candidates.front()));
  EXPECT_EQ(rt->stats().tuning_hits, 0u);
}

// compile(spec, target, config): a tuning candidate of the caller's choice, memoized apart from
// the heuristic's kernel; a configuration the op does not offer is refused before any compile.
TEST(Runtime, CompileTakesOneOfTheOpsConfigurations) {
  TempDir dir;
  auto rt = compile_only_runtime(dir.path());
  const KernelSpec spec = rmsnorm_spec(8, 16384);
  const char* target = "sm_90a";
  const std::vector<KernelConfig> candidates =
      (**find_op("rmsnorm")).tuning_candidates(spec, testing::target(target));
  ASSERT_GE(candidates.size(), 2u);
  auto heuristic = rt->compile(spec, target);
  ASSERT_TRUE(heuristic.ok()) << heuristic.error().message;
  auto chosen = rt->compile(spec, target, candidates[1]);
  ASSERT_TRUE(chosen.ok()) << chosen.error().message;
  EXPECT_EQ((*chosen)->info().config, config_string(candidates[1]));
  EXPECT_NE((*chosen)->info().cache_key, (*heuristic)->info().cache_key);
  auto again = rt->compile(spec, target);  // the heuristic's is still what compile(spec) gives
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)->info().config, config_string(candidates[0]));
  const uint64_t compiles = rt->stats().compiles;
  auto bad = rt->compile(spec, target, KernelConfig{{"THREADS", 3}});
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code, Errc::invalid_argument);
  EXPECT_NE(bad.error().message.find("is not one of its variants or tuning candidates"), std::string::npos)
      << bad.error().message;
  EXPECT_NE(bad.error().message.find(config_string(candidates[1])), std::string::npos) << bad.error().message;
  EXPECT_EQ(rt->stats().compiles, compiles);
}

TEST(Runtime, KilnTuningZeroTurnsRecordsOff) {
  ::setenv("KILN_TUNING", "0", 1);
  EXPECT_FALSE(read_env().tuning);
  ::setenv("KILN_TUNING", "1", 1);
  EXPECT_TRUE(read_env().tuning);
  ::unsetenv("KILN_TUNING");
  EXPECT_TRUE(read_env().tuning) << "on by default";
  EXPECT_TRUE(RuntimeOptions{}.use_tuning);
}

TEST(Runtime, KernelInfoDescribesTheCodeObject) {
  KILN_REQUIRE_LLVM();
  TempDir dir;
  auto rt = compile_only_runtime(dir.path());
  auto c = rt->compile(gemm_spec(256, 256, 64, false, true), "gfx942");
  ASSERT_TRUE(c.ok());
  const KernelInfo& i = (*c)->info();
  EXPECT_EQ(i.kernel, "kiln_gemm");
  EXPECT_EQ(i.target, "gfx942");
  EXPECT_EQ(i.code_format, "hsaco");
  EXPECT_EQ(i.code_bytes, (*c)->code_object().size());
  EXPECT_EQ(i.wave_size, 64);
  EXPECT_GT(i.sgprs, 0);
  EXPECT_EQ(i.cache_key.size(), 64u);
  EXPECT_NE(i.config.find("BM="), std::string::npos);
  EXPECT_EQ(i.compiler.rfind("clang 22", 0), 0u) << i.compiler;
}

}  // namespace
}  // namespace kiln
