// Where a disk-cache hit's time goes (issue 19, section 5), phase by phase, for the kernels of
// bench_compile (gemm, rmsnorm, swiglu; bf16) on each target:
//   Codegen        generate(): validation, heuristic, the kernel's full source (and its SHA-256)
//   Key            CacheKey::make + digest(): the key's canonical JSON and its SHA-256
//   OpenRead       the entry's directories opened from the cache root, meta.json locked, every
//                  file read (DiskCache::read_entry_files: the same descriptor walk as a load)
//   MetaJson       meta.json parsed and checked (parse_entry_metadata)
//   Sha256         the SHA-256 of the code object and of the source, as a full check (kiln cache
//                  verify, an import) verifies them, and as a load did before 2026-11-27
//   Xxh3           the XXH3-128 of the code object, as a hit verifies it (its source is not read)
//   CodeCheck      validate_code_object: the ELF header (or PTX text) against the target
//   Load           DiskCache::load: everything a load does (open, lock, read, parse, verify, check)
//   LoadHit        DiskCache::load as a hit calls it, with the source it has just generated (the
//                  entry's source file is neither read nor hashed: meta.json must record its hash)
//   Hit            Runtime::compile on a new runtime: memo key, codegen, key, load, the result
//   LoadModule     DeviceImpl::load of the code object (cuModuleLoadDataEx + cuModuleGetFunction):
//                  the driver's part; needs KILN_CUDA_LIB (the fake driver of tests/fake_driver
//                  here, libcuda on a GPU machine); sm_90a only
//   KernelHit      Runtime::kernel on a new runtime of that driver: a hit and the module load
//   KernelHitNoTuning  the same with RuntimeOptions::use_tuning off: without the tuning-record
//                  lookup (a spec with several tuning candidates, as gemm, hashes each candidate's
//                  template and looks for a record in the cache), so the difference is its cost
//
//   build/bench/bench_disk_hit [--benchmark_filter=...]
//   KILN_CUDA_LIB=build/tests/libkiln_fake_cuda.so build/bench/bench_disk_hit
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "cache/cache_key.h"
#include "cache/disk_cache.h"
#include "codegen/codegen.h"
#include "kiln/kiln.h"
#include "compile/compiler.h"
#include "runtime/device_impl.h"
#include "support/sha256.h"
#include "support/xxh3.h"

namespace {

const kiln::KernelSpec kSpecs[] = {
    {"gemm", kiln::DType::bf16, kiln::DType::bf16, {{"M", 8192}, {"N", 6144}, {"K", 4096}, {"trans_a", 0}, {"trans_b", 1}}},
    {"rmsnorm", kiln::DType::bf16, kiln::DType::bf16, {{"rows", 8192}, {"hidden", 4096}}},
    {"swiglu", kiln::DType::bf16, kiln::DType::bf16, {{"rows", 8192}, {"intermediate", 14336}}},
};
const char* kTargets[] = {"gfx942", "gfx950", "sm_90a"};

std::string scratch_dir() {
  static const std::string dir = [] {
    std::string t = (std::filesystem::temp_directory_path() / "kiln-bench-XXXXXX").string();
    return std::string(mkdtemp(t.data()));
  }();
  return dir;
}

std::unique_ptr<kiln::Runtime> runtime(const char* backend, bool use_tuning = true) {
  kiln::RuntimeOptions o;
  o.backend = backend;
  o.use_tuning = use_tuning;
  o.cache_dir = scratch_dir();
  auto rt = kiln::Runtime::create(o);
  return rt ? std::move(rt).value() : nullptr;
}

// One kernel in the scratch cache, and what a hit works on.
struct Prepared {
  kiln::KernelSource source;
  kiln::Compiler* compiler = nullptr;
  std::string key;
  std::string meta;
  kiln::CacheEntry entry;
};

bool prepare(benchmark::State& state, Prepared& p) {
  const kiln::KernelSpec& spec = kSpecs[state.range(0)];
  const char* target_name = kTargets[state.range(1)];
  state.SetLabel(std::string(spec.op) + "/" + target_name);
  auto rt = runtime("none");
  auto target = kiln::find_target(target_name);
  if (!rt || !target || !rt->compile(spec, target_name)) {
    state.SkipWithError("cannot compile the kernel here (no LLVM?)");
    return false;
  }
  auto src = kiln::generate(spec, **target);
  auto compiler = kiln::compiler_for(**target, "nvrtc");
  if (!src || !compiler) {
    state.SkipWithError("no source or compiler");
    return false;
  }
  p.source = std::move(*src);
  p.compiler = *compiler;
  p.key = kiln::CacheKey::make(p.source, *p.compiler).digest();
  auto cache = kiln::DiskCache::open(scratch_dir());
  auto files = cache ? (*cache)->read_entry_files(p.key) : kiln::make_error(kiln::Errc::io_error, "no cache");
  auto entry = cache ? (*cache)->load(p.key) : std::nullopt;
  if (!files || !entry || !files->count("meta.json")) {
    state.SkipWithError("the entry is not in the cache");
    return false;
  }
  p.meta = files->at("meta.json");
  p.entry = std::move(*entry);
  return true;
}

void Codegen(benchmark::State& state) {
  Prepared p;
  if (!prepare(state, p)) return;
  const kiln::TargetInfo& target = **kiln::find_target(kTargets[state.range(1)]);
  for (auto _ : state) benchmark::DoNotOptimize(kiln::generate(kSpecs[state.range(0)], target));
}

void Key(benchmark::State& state) {
  Prepared p;
  if (!prepare(state, p)) return;
  for (auto _ : state) benchmark::DoNotOptimize(kiln::CacheKey::make(p.source, *p.compiler).digest());
}

void OpenRead(benchmark::State& state) {
  Prepared p;
  if (!prepare(state, p)) return;
  auto cache = std::move(kiln::DiskCache::open(scratch_dir())).value();
  for (auto _ : state) benchmark::DoNotOptimize(cache->read_entry_files(p.key));
}

void MetaJson(benchmark::State& state) {
  Prepared p;
  if (!prepare(state, p)) return;
  for (auto _ : state) benchmark::DoNotOptimize(kiln::parse_entry_metadata(p.meta, p.key));
}

void Sha256(benchmark::State& state) {
  Prepared p;
  if (!prepare(state, p)) return;
  const auto& code = p.entry.compiled.code.bytes;
  for (auto _ : state) {
    benchmark::DoNotOptimize(kiln::sha256_hex(code));
    benchmark::DoNotOptimize(kiln::sha256_hex(p.entry.source));
  }
  state.counters["bytes"] = static_cast<double>(code.size() + p.entry.source.size());
}

void Xxh3(benchmark::State& state) {
  Prepared p;
  if (!prepare(state, p)) return;
  const auto& code = p.entry.compiled.code.bytes;
  for (auto _ : state) benchmark::DoNotOptimize(kiln::xxh3_128_hex(code));
  state.counters["bytes"] = static_cast<double>(code.size());
}

void CodeCheck(benchmark::State& state) {
  Prepared p;
  if (!prepare(state, p)) return;
  const kiln::TargetInfo& target = **kiln::find_target(kTargets[state.range(1)]);
  for (auto _ : state) benchmark::DoNotOptimize(kiln::validate_code_object(p.entry.compiled.code, target));
}

void Load(benchmark::State& state) {
  Prepared p;
  if (!prepare(state, p)) return;
  auto cache = std::move(kiln::DiskCache::open(scratch_dir())).value();
  for (auto _ : state) benchmark::DoNotOptimize(cache->load(p.key));
}

void LoadHit(benchmark::State& state) {
  Prepared p;
  if (!prepare(state, p)) return;
  auto cache = std::move(kiln::DiskCache::open(scratch_dir())).value();
  const kiln::DiskCache::KnownSource known{p.source.text, p.source.source_sha256};
  for (auto _ : state) benchmark::DoNotOptimize(cache->load(p.key, &known));
}

void Hit(benchmark::State& state) {
  Prepared p;
  if (!prepare(state, p)) return;
  std::unique_ptr<kiln::Runtime> rt;
  for (auto _ : state) {
    state.PauseTiming();
    rt.reset();  // a runtime's teardown is not part of a hit
    rt = runtime("none");
    state.ResumeTiming();
    auto c = rt->compile(kSpecs[state.range(0)], kTargets[state.range(1)]);
    if (!c || (*c)->origin() != "disk") state.SkipWithError("expected a disk hit");
  }
}

bool have_driver(benchmark::State& state) {
  if (std::getenv("KILN_CUDA_LIB")) return true;
  state.SkipWithError("set KILN_CUDA_LIB (tests/fake_driver's libkiln_fake_cuda.so, or libcuda) to time the module load");
  return false;
}

void LoadModule(benchmark::State& state) {
  Prepared p;
  if (!have_driver(state) || !prepare(state, p)) return;
  auto device = kiln::open_cuda_device(0);
  if (!device) {
    state.SkipWithError(device.error().message.c_str());
    return;
  }
  for (auto _ : state) {
    auto module = (*device)->load(p.entry.compiled.code, p.entry.kernel_name);
    if (!module) state.SkipWithError(module.error().message.c_str());
    state.PauseTiming();
    module = kiln::make_error(kiln::Errc::io_error, "unloaded");  // cuModuleUnload outside the timing
    state.ResumeTiming();
  }
}

void kernel_hit(benchmark::State& state, bool use_tuning) {
  Prepared p;
  if (!have_driver(state) || !prepare(state, p)) return;
  // Holds the device's primary context for the whole loop: without it, each runtime's teardown
  // released the context and the next one created it again (seconds on an H100, outside the
  // timing but inside the benchmark's run). A second process pays that once, not per kernel.
  auto keep = kiln::open_cuda_device(0);
  if (!keep) {
    state.SkipWithError(keep.error().message.c_str());
    return;
  }
  std::unique_ptr<kiln::Runtime> rt;
  for (auto _ : state) {
    state.PauseTiming();
    rt.reset();
    rt = runtime("cuda", use_tuning);
    state.ResumeTiming();
    auto k = rt ? rt->kernel(kSpecs[state.range(0)]) : kiln::make_error(kiln::Errc::driver_unavailable, "no runtime");
    if (!k) state.SkipWithError(k.error().message.c_str());
  }
}
void KernelHit(benchmark::State& state) { kernel_hit(state, true); }
void KernelHitNoTuning(benchmark::State& state) { kernel_hit(state, false); }

void AllTargets(benchmark::internal::Benchmark* b) {
  for (int op = 0; op < 3; ++op)
    for (int t = 0; t < 3; ++t) b->Args({op, t});
}

void Nvidia(benchmark::internal::Benchmark* b) {
  for (int op = 0; op < 3; ++op) b->Args({op, 2});
}

BENCHMARK(Codegen)->Apply(AllTargets)->Unit(benchmark::kMicrosecond);
BENCHMARK(Key)->Apply(AllTargets)->Unit(benchmark::kMicrosecond);
BENCHMARK(OpenRead)->Apply(AllTargets)->Unit(benchmark::kMicrosecond);
BENCHMARK(MetaJson)->Apply(AllTargets)->Unit(benchmark::kMicrosecond);
BENCHMARK(Sha256)->Apply(AllTargets)->Unit(benchmark::kMicrosecond);
BENCHMARK(Xxh3)->Apply(AllTargets)->Unit(benchmark::kMicrosecond);
BENCHMARK(CodeCheck)->Apply(AllTargets)->Unit(benchmark::kMicrosecond);
BENCHMARK(Load)->Apply(AllTargets)->Unit(benchmark::kMicrosecond);
BENCHMARK(LoadHit)->Apply(AllTargets)->Unit(benchmark::kMicrosecond);
BENCHMARK(Hit)->Apply(AllTargets)->Unit(benchmark::kMicrosecond);
BENCHMARK(LoadModule)->Apply(Nvidia)->Unit(benchmark::kMicrosecond);
// A fixed count: each iteration creates a runtime outside the timing, and google-benchmark's
// minimum time counts timed time only, so that reaching it (thousands of hits of 100 us, each
// with a runtime made and torn down: over 3 s each on the H100 before the context was held, so
// that 20 iterations did not end in 60 s) kept the disk_hit step of scripts/gpu_bench_steps.sh
// from finishing within a 10-minute call.
BENCHMARK(KernelHit)->Apply(Nvidia)->Unit(benchmark::kMicrosecond)->Iterations(200);
BENCHMARK(KernelHitNoTuning)->Apply(Nvidia)->Unit(benchmark::kMicrosecond)->Iterations(200);

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  std::error_code ec;
  std::filesystem::remove_all(scratch_dir(), ec);
}
