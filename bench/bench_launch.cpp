// Launch overhead on the GPU, host time per launch, against the raw driver call in the same run:
//   RawCuLaunchKernel  cuLaunchKernel on the kernel's own CUfunction (the floor);
//   RawKilnGeometry    the same with the block size Kiln's plan picks (device work, not host work);
//   KernelLaunch       kiln::Kernel::launch on a kernel handle held by the application;
//   RuntimeLaunch      kiln::Runtime::launch(spec, ...) (spec -> in-memory cache -> launch);
//   TypedOp            kiln::ops::swiglu(...) (builds the spec, then as RuntimeLaunch).
// The kernel is a tiny swiglu (1 row), so device time is negligible against host time; launches
// are synchronized every 1000 to keep the queue from filling. Ratios to the raw call are printed
// last. Skips (exit 0) with a message when there is no NVIDIA GPU.
// The sm_90a TMA GEMM takes tensor maps (CUtensorMap) by value, which Kernel::launch encodes for
// every launch from the buffers. A 64 x 64 x 64 bf16 GEMM measures what that costs:
//   GemmRawPreEncoded  cuLaunchKernel with the three maps encoded once, outside the loop (the floor);
//   GemmRawEncodeEach  cuTensorMapEncodeTiled x 3 + cuLaunchKernel per launch (the driver's cost);
//   GemmKernelLaunch   kiln::Kernel::launch.
//
//   build/bench/bench_launch
#include <benchmark/benchmark.h>
#include <cuda.h>

#include <cstdio>
#include <map>

#include "kiln/kiln.h"
#include "runtime/driver/cuda_api.h"
#include "templates/gemm/gemm.h"

namespace {

struct Fixture {
  std::unique_ptr<kiln::Runtime> rt;
  std::shared_ptr<const kiln::Kernel> kernel;
  const kiln::CudaApi* api = nullptr;
  CUmodule module = nullptr;
  CUfunction raw = nullptr;
  void* x = nullptr;
  void* y = nullptr;
  // The TMA GEMM.
  std::shared_ptr<const kiln::Kernel> gemm;
  CUmodule gemm_module = nullptr;
  CUfunction gemm_raw = nullptr;
  void* abc[3] = {};
  std::vector<kiln::TensorMapInfo> maps;
  kiln::LaunchGeometry geometry;
};
Fixture* g = nullptr;
const kiln::KernelSpec kSpec{"swiglu", kiln::DType::bf16, kiln::DType::bf16, {{"rows", 1}, {"intermediate", 256}}};

const kiln::KernelSpec kGemm{"gemm", kiln::DType::bf16, kiln::DType::bf16,
                             {{"M", 64}, {"N", 64}, {"K", 64}, {"trans_a", 0}, {"trans_b", 1}}};

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

// The raw call with the geometry Kiln's plan chooses for this spec (16-byte variant: 32 threads),
// to tell a difference in device work from one in host work.
void RawKilnGeometry(benchmark::State& state) {
  int rows = 1;
  void* args[] = {&g->x, &g->y, &rows};
  int64_t i = 0;
  for (auto _ : state) {
    g->api->cuLaunchKernel(g->raw, 1, 1, 1, 32, 1, 1, 0, nullptr, args, nullptr);
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

bool encode(const kiln::TensorMapInfo& m, void* address, CUtensorMap* out) {
  const cuuint64_t dims[2] = {m.inner, m.outer}, strides[1] = {m.inner * 2};
  const cuuint32_t box[2] = {m.box_inner, m.box_outer}, ones[2] = {1, 1};
  return g->api->cuTensorMapEncodeTiled(out, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, address, dims, strides, box, ones,
                                        CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                        CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

void launch_raw_gemm(CUtensorMap* maps) {
  void* args[] = {&maps[0], &maps[1], &maps[2]};
  const kiln::LaunchGeometry& geo = g->geometry;
  g->api->cuLaunchKernel(g->gemm_raw, geo.grid.x, 1, 1, geo.block.x, 1, 1, geo.dynamic_shared_bytes, nullptr, args,
                         nullptr);
}

void GemmRawPreEncoded(benchmark::State& state) {
  CUtensorMap maps[3];
  for (int t = 0; t < 3; ++t)
    if (!encode(g->maps[t], g->abc[g->maps[t].tensor], &maps[t])) state.SkipWithError("encode failed");
  int64_t i = 0;
  for (auto _ : state) {
    launch_raw_gemm(maps);
    sync_every(i++);
  }
  (void)g->rt->device()->synchronize();
}

void GemmRawEncodeEach(benchmark::State& state) {
  int64_t i = 0;
  for (auto _ : state) {
    CUtensorMap maps[3];
    for (int t = 0; t < 3; ++t) encode(g->maps[t], g->abc[g->maps[t].tensor], &maps[t]);
    launch_raw_gemm(maps);
    sync_every(i++);
  }
  (void)g->rt->device()->synchronize();
}

void GemmKernelLaunch(benchmark::State& state) {
  int64_t i = 0;
  for (auto _ : state) {
    if (!g->gemm->launch(kGemm, g->abc)) state.SkipWithError("launch failed");
    sync_every(i++);
  }
  (void)g->rt->device()->synchronize();
}

BENCHMARK(RawCuLaunchKernel)->Unit(benchmark::kMicrosecond)->MinTime(0.5);
BENCHMARK(RawKilnGeometry)->Unit(benchmark::kMicrosecond)->MinTime(0.5);
BENCHMARK(KernelLaunch)->Unit(benchmark::kMicrosecond)->MinTime(0.5);
BENCHMARK(RuntimeLaunch)->Unit(benchmark::kMicrosecond)->MinTime(0.5);
BENCHMARK(TypedOp)->Unit(benchmark::kMicrosecond)->MinTime(0.5);
BENCHMARK(GemmRawPreEncoded)->Unit(benchmark::kMicrosecond)->MinTime(0.5);
BENCHMARK(GemmRawEncodeEach)->Unit(benchmark::kMicrosecond)->MinTime(0.5);
BENCHMARK(GemmKernelLaunch)->Unit(benchmark::kMicrosecond)->MinTime(0.5);

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
    const double raw = times_["RawCuLaunchKernel"], gemm_raw = times_["GemmRawPreEncoded"];
    std::printf("\nhost time per launch, ratio to raw cuLaunchKernel (swiglu %.2f us, TMA gemm %.2f us):\n", raw,
                gemm_raw);
    for (const auto& [name, t] : times_) {
      const double base = name.rfind("Gemm", 0) == 0 ? gemm_raw : raw;
      std::printf("  %-20s %7.2f us  %5.2fx\n", name.c_str(), t, t / base);
    }
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
  // The TMA GEMM, loaded the same two ways.
  auto gk = f.rt->kernel(kGemm);
  if (!gk) {
    std::printf("bench_launch: %s\n", gk.error().message.c_str());
    return 1;
  }
  f.gemm = *gk;
  const kiln::GemmOp gemm_op;
  const kiln::TileConfig config = gemm_op.choose_config(kGemm, f.rt->device()->target());
  f.maps = gemm_op.tensor_maps(kGemm, config);
  f.geometry = gemm_op.geometry(kGemm, config);
  auto gcode = f.gemm->compiled().code_object();
  if (f.maps.size() != 3 || f.api->cuModuleLoadData(&f.gemm_module, gcode.data()) != CUDA_SUCCESS ||
      f.api->cuModuleGetFunction(&f.gemm_raw, f.gemm_module, "kiln_gemm") != CUDA_SUCCESS ||
      f.api->cuFuncSetAttribute(f.gemm_raw, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                static_cast<int>(f.geometry.dynamic_shared_bytes)) != CUDA_SUCCESS) {
    std::printf("bench_launch: cannot load the TMA GEMM directly (tensor maps: %zu)\n", f.maps.size());
    return 1;
  }
  for (void*& p : f.abc) p = *f.rt->device()->malloc(64 * 64 * 2);
  f.x = *f.rt->device()->malloc(2 * 256 * 2);
  f.y = *f.rt->device()->malloc(256 * 2);
  RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  (void)f.rt->device()->free(f.x);
  (void)f.rt->device()->free(f.y);
  for (void* p : f.abc) (void)f.rt->device()->free(p);
  f.api->cuModuleUnload(f.module);
  f.api->cuModuleUnload(f.gemm_module);
  return 0;
}
