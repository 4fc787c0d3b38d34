// Launch overhead on the GPU, host time per launch, against the raw driver call in the same run:
//   RawCuLaunchKernel  cuLaunchKernel on the kernel's own CUfunction, with the geometry of Kiln's
//                      plan (the floor);
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

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>

#include "kiln/kiln.h"
#include "runtime/driver/cuda_api.h"
#include "templates/registry.h"
#include "templates/registry.h"

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
  kiln::LaunchGeometry swiglu_geometry;  // of Kiln's plan for kSpec (its preferred variant)
};
Fixture* g = nullptr;
const kiln::KernelSpec kSpec{"swiglu", kiln::DType::bf16, kiln::DType::bf16, {{"rows", 1}, {"intermediate", 256}}};

const kiln::KernelSpec kGemm{"gemm", kiln::DType::bf16, kiln::DType::bf16,
                             {{"M", 64}, {"N", 64}, {"K", 64}, {"trans_a", 0}, {"trans_b", 1}}};

void sync_every(int64_t i) {
  if (i % 1000 == 999) (void)g->rt->device()->synchronize();
}

// The raw call on the kernel's own CUfunction with the geometry of Kiln's plan (a launch that
// fails, e.g. with a block larger than the kernel's bound, would return at once: checked).
bool launch_raw() {
  static int rows = 1;
  static void* args[] = {&g->x, &g->y, &rows};
  const kiln::LaunchGeometry& geo = g->swiglu_geometry;
  return g->api->cuLaunchKernel(g->raw, geo.grid.x, geo.grid.y, geo.grid.z, geo.block.x, geo.block.y, geo.block.z,
                                0, nullptr, args, nullptr) == CUDA_SUCCESS;
}

void RawCuLaunchKernel(benchmark::State& state) {
  int64_t i = 0;
  for (auto _ : state) {
    if (!launch_raw()) state.SkipWithError("cuLaunchKernel failed");
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

bool launch_raw_gemm(CUtensorMap* maps) {
  void* args[] = {&maps[0], &maps[1], &maps[2]};
  const kiln::LaunchGeometry& geo = g->geometry;
  return g->api->cuLaunchKernel(g->gemm_raw, geo.grid.x, 1, 1, geo.block.x, 1, 1, geo.dynamic_shared_bytes, nullptr,
                                args, nullptr) == CUDA_SUCCESS;
}

void GemmRawPreEncoded(benchmark::State& state) {
  CUtensorMap maps[3];
  for (int t = 0; t < 3; ++t)
    if (!encode(g->maps[t], g->abc[g->maps[t].tensor], &maps[t])) state.SkipWithError("encode failed");
  int64_t i = 0;
  for (auto _ : state) {
    if (!launch_raw_gemm(maps)) state.SkipWithError("cuLaunchKernel failed");
    sync_every(i++);
  }
  (void)g->rt->device()->synchronize();
}

void GemmRawEncodeEach(benchmark::State& state) {
  int64_t i = 0;
  for (auto _ : state) {
    CUtensorMap maps[3];
    for (int t = 0; t < 3; ++t) encode(g->maps[t], g->abc[g->maps[t].tensor], &maps[t]);
    if (!launch_raw_gemm(maps)) state.SkipWithError("cuLaunchKernel failed");
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
BENCHMARK(KernelLaunch)->Unit(benchmark::kMicrosecond)->MinTime(0.5);
BENCHMARK(RuntimeLaunch)->Unit(benchmark::kMicrosecond)->MinTime(0.5);
BENCHMARK(TypedOp)->Unit(benchmark::kMicrosecond)->MinTime(0.5);
BENCHMARK(GemmRawPreEncoded)->Unit(benchmark::kMicrosecond)->MinTime(0.5);
BENCHMARK(GemmRawEncodeEach)->Unit(benchmark::kMicrosecond)->MinTime(0.5);
BENCHMARK(GemmKernelLaunch)->Unit(benchmark::kMicrosecond)->MinTime(0.5);

// The gate's figure: each form against its raw call, interleaved in rounds so that clock and
// queue drift hit both alike. A round times kBatch launches of the raw call, then kBatch of the
// form (each batch ends with a synchronize); the ratio of a round is form / raw, and a repeat's
// ratio is the median over kRounds rounds. The whole set of pairs is repeated kRepeats times
// (the forms take turns, so a slow stretch of the host hits each form in some repeat), and the
// median, min and max of the repeats' ratios are printed with the median times per launch: one
// run's figure moved by 5% between leases, so a single median is not a figure.
struct Paired {
  const char* name;
  std::function<bool()> raw, form;
};

void run_paired(const std::vector<Paired>& pairs) {
  constexpr int kRounds = 31, kBatch = 2000, kRepeats = 7;
  constexpr double kGate = 1.05;  // issue 19: every public form's median <= 1.05x raw
  auto batch = [](const std::function<bool()>& f) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kBatch; ++i) {
      if (!f()) return -1.0;
      sync_every(i);
    }
    (void)g->rt->device()->synchronize();
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / kBatch;
  };
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  struct Result {
    std::vector<double> raw, form, ratio;  // per repeat: median over its rounds
    bool failed = false;
  };
  std::vector<Result> results(pairs.size());
  for (int rep = 0; rep < kRepeats; ++rep)
    for (size_t i = 0; i < pairs.size(); ++i) {
      const Paired& p = pairs[i];
      Result& res = results[i];
      if (res.failed) continue;
      std::vector<double> raw, form, ratio;
      for (int r = 0; r < kRounds; ++r) {
        const double a = batch(p.raw), b = batch(p.form);
        if (a <= 0 || b <= 0) {
          res.failed = true;
          break;
        }
        raw.push_back(a);
        form.push_back(b);
        ratio.push_back(b / a);
      }
      if (res.failed) continue;
      res.raw.push_back(median(raw));
      res.form.push_back(median(form));
      res.ratio.push_back(median(ratio));
    }
  std::printf("\npaired, interleaved (%d repeats of %d rounds of %d launches each; per repeat the median over its "
              "rounds; below the median, min and max over repeats):\n",
              kRepeats, kRounds, kBatch);
  std::printf("  %-20s %9s %9s %8s %8s %8s  %s\n", "form", "raw us", "form us", "median", "min", "max", "gate <= 1.05x");
  for (size_t i = 0; i < pairs.size(); ++i) {
    const Result& res = results[i];
    if (res.failed) {
      std::printf("  %-20s failed (a launch returned an error)\n", pairs[i].name);
      continue;
    }
    const double med = median(res.ratio);
    std::printf("  %-20s %9.3f %9.3f %7.3fx %7.3fx %7.3fx  %s\n", pairs[i].name, median(res.raw), median(res.form), med,
                *std::min_element(res.ratio.begin(), res.ratio.end()),
                *std::max_element(res.ratio.begin(), res.ratio.end()), med <= kGate ? "PASS" : "FAIL");
  }
}

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
  {  // the geometry of Kiln's plan for kSpec, for the raw call
    const kiln::OpTemplate* op = *kiln::find_op("swiglu");
    const kiln::KernelConfig config = op->variants(kSpec, f.rt->device()->target()).front();
    f.swiglu_geometry = op->plan(kSpec, config).launches.at(0).geometry;
    std::printf("swiglu kernel %s, block %u, grid %u x %u\n", f.kernel->compiled().info().config.c_str(),
                f.swiglu_geometry.block.x, f.swiglu_geometry.grid.x, f.swiglu_geometry.grid.y);
  }
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
  // The maps and geometry of the kernel's one launch, from the op's plan (through the registry:
  // nothing outside templates/ includes an op's header).
  const kiln::OpTemplate* gemm_op = *kiln::find_op("gemm");
  const kiln::KernelConfig config = gemm_op->choose_config(kGemm, f.rt->device()->target());
  const kiln::Plan plan = gemm_op->plan(kGemm, config);
  f.maps.clear();
  for (const kiln::KernelArg& a : plan.launches.at(0).args)
    if (a.kind == kiln::KernelArg::Kind::tensor_map) f.maps.push_back(a.map);
  f.geometry = plan.launches.at(0).geometry;
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
  CUtensorMap pre[3];
  for (int t = 0; t < 3; ++t) encode(f.maps[t], f.abc[f.maps[t].tensor], &pre[t]);
  void* buffers[] = {f.x, f.y};
  run_paired({
      {"Kernel::launch", launch_raw, [&] { return bool(f.kernel->launch(kSpec, buffers)); }},
      {"Runtime::launch", launch_raw, [&] { return bool(f.rt->launch(kSpec, buffers)); }},
      {"ops::swiglu", launch_raw, [&] { return bool(kiln::ops::swiglu(*f.rt, 1, 256, kiln::DType::bf16, f.x, f.y)); }},
      {"gemm Kernel::launch", [&] { return launch_raw_gemm(pre); }, [&] { return bool(f.gemm->launch(kGemm, f.abc)); }},
  });
  benchmark::Shutdown();
  (void)f.rt->device()->free(f.x);
  (void)f.rt->device()->free(f.y);
  for (void* p : f.abc) (void)f.rt->device()->free(p);
  f.api->cuModuleUnload(f.module);
  f.api->cuModuleUnload(f.gemm_module);
  return 0;
}
