// Launch overhead on the GPU, host time per launch, against the raw driver call in the same run:
//   RawCuLaunchKernel  cuLaunchKernel on the kernel's own CUfunction (the floor);
//   KernelLaunch       kiln::Kernel::launch on a kernel handle held by the application;
//   RuntimeLaunch      kiln::Runtime::launch(spec, ...) (spec -> in-memory cache -> launch);
//   TypedOp            kiln::ops::swiglu(...) (builds the spec, then as RuntimeLaunch).
// The kernel is a tiny swiglu (1 row), so device time is negligible against host time; launches
// are synchronized every 1000 to keep the queue from filling. Ratios to the raw call are printed
// last. Skips (exit 0) with a message when there is no NVIDIA GPU.
//
//   build/bench/bench_launch
#include <benchmark/benchmark.h>
#include <cuda.h>

#include <cstdio>
#include <map>

#include "kiln/kiln.h"
#include "runtime/driver/cuda_api.h"

namespace {

struct Fixture {
  std::unique_ptr<kiln::Runtime> rt;
  std::shared_ptr<const kiln::Kernel> kernel;
  const kiln::CudaApi* api = nullptr;
  CUmodule module = nullptr;
  CUfunction raw = nullptr;
  void* x = nullptr;
  void* y = nullptr;
};
Fixture* g = nullptr;
const kiln::KernelSpec kSpec{"swiglu", kiln::DType::bf16, kiln::DType::bf16, {{"rows", 1}, {"intermediate", 256}}};

void sync_every(int64_t i) {
  if (i % 1000 == 999) (void)g->rt->device()->synchronize();
}

void RawCuLaunchKernel(benchmark::State& state) {
  int rows = 1;
  void* args[] = {&g->x, &g->y, &rows};
  int64_t i = 0;
  for (auto _ : state) {
    g->api->cuLaunchKernel(g->raw, 1, 1, 1, 256, 1, 1, 0, nullptr, args, nullptr);
    sync_every(i++);
  }
  (void)g->rt->device()->synchronize();
}

void KernelLaunch(benchmark::State& state) {
  void* buffers[] = {g->x, g->y};
  int64_t i = 0;
  for (auto _ : state) {
    if (!g->kernel->launch(kSpec, buffers)) state.SkipWithError("launch failed");
    sync_every(i++);
  }
  (void)g->rt->device()->synchronize();
}

void RuntimeLaunch(benchmark::State& state) {
  void* buffers[] = {g->x, g->y};
  int64_t i = 0;
  for (auto _ : state) {
    if (!g->rt->launch(kSpec, buffers)) state.SkipWithError("launch failed");
    sync_every(i++);
  }
  (void)g->rt->device()->synchronize();
}

void TypedOp(benchmark::State& state) {
  int64_t i = 0;
  for (auto _ : state) {
    if (!kiln::ops::swiglu(*g->rt, 1, 256, kiln::DType::bf16, g->x, g->y)) state.SkipWithError("launch failed");
    sync_every(i++);
  }
  (void)g->rt->device()->synchronize();
}

BENCHMARK(RawCuLaunchKernel)->Unit(benchmark::kMicrosecond)->MinTime(0.5);
BENCHMARK(KernelLaunch)->Unit(benchmark::kMicrosecond)->MinTime(0.5);
BENCHMARK(RuntimeLaunch)->Unit(benchmark::kMicrosecond)->MinTime(0.5);
BENCHMARK(TypedOp)->Unit(benchmark::kMicrosecond)->MinTime(0.5);

// Prints the table as usual, then each benchmark's ratio to the raw driver call.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& r : runs) {
      const std::string name = r.benchmark_name();
      times_[name.substr(0, name.find('/'))] = r.GetAdjustedRealTime();
    }
  }
  void Finalize() override {
    ConsoleReporter::Finalize();
    const double raw = times_["RawCuLaunchKernel"];
    std::printf("\nhost time per launch, ratio to raw cuLaunchKernel (%.2f us):\n", raw);
    for (const auto& [name, t] : times_) std::printf("  %-20s %7.2f us  %5.2fx\n", name.c_str(), t, t / raw);
  }

 private:
  std::map<std::string, double> times_;
};

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  kiln::RuntimeOptions o;
  o.backend = "cuda";
  auto rt = kiln::Runtime::create(o);
  if (!rt) {
    std::printf("bench_launch: skipped, no NVIDIA GPU: %s\n", rt.error().message.c_str());
    return 0;
  }
  Fixture f;
  g = &f;
  f.rt = std::move(rt).value();
  f.api = *kiln::cuda_api();
  auto k = f.rt->kernel(kSpec);
  if (!k) {
    std::printf("bench_launch: %s\n", k.error().message.c_str());
    return 1;
  }
  f.kernel = *k;
  // The same code object, loaded directly through the driver for the raw baseline.
  auto code = f.kernel->compiled().code_object();
  if (f.api->cuModuleLoadData(&f.module, code.data()) != CUDA_SUCCESS ||
      f.api->cuModuleGetFunction(&f.raw, f.module, "kiln_swiglu") != CUDA_SUCCESS) {
    std::printf("bench_launch: cannot load the cubin directly\n");
    return 1;
  }
  f.x = *f.rt->device()->malloc(2 * 256 * 2);
  f.y = *f.rt->device()->malloc(256 * 2);
  RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  (void)f.rt->device()->free(f.x);
  (void)f.rt->device()->free(f.y);
  f.api->cuModuleUnload(f.module);
  return 0;
}
