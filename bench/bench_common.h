// What the GPU benchmarks share (bench_gemm, bench_attention): device buffers freed on scope exit,
// the timing summary (median, TFLOP/s, stddev) and the aligned text table. One source,
// bench/bench_common.cpp, linked into each benchmark.
#pragma once

#include <atomic>
#include <functional>
#include <cstddef>
#include <cstdio>
#include <string>
#include <thread>
#include <string_view>
#include <vector>

#include "kiln/kiln.h"

namespace kiln::bench {

/// Device memory freed on scope exit; `bytes` as asked (the allocation is at least 256 bytes, so
/// that an empty tensor still has an address).
struct DeviceBuffer {
  kiln::Device* device = nullptr;
  void* ptr = nullptr;
  size_t bytes = 0;
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();
  /// (Re)allocates n bytes (at least 256 are allocated), freeing the previous buffer.
  Result<void> allocate(kiln::Device& d, size_t n);
  /// 0xff bytes: NaN in bf16 (0xffff) and fp32.
  Result<void> poison();
};

/// A timed case: the median time in ms, the TFLOP/s at the median and the sample standard
/// deviation of the per-repetition TFLOP/s.
struct Timing {
  double median_ms = 0, tflops = 0, stddev = 0;
};
/// The Timing of repetitions `ms` (milliseconds each) of `flops` floating-point operations; all
/// zero without repetitions.
Timing summarize(std::vector<double> ms, double flops);

/// Times `launch` with device events, the L2 evicted before each repetition (`flush` written by a
/// memset): the first repetition sets the count, about 300 ms of device time (5 .. max_reps).
Result<Timing> time_flushed(kiln::Device& dev, DeviceBuffer& flush, const std::function<Result<void>()>& launch,
                            double flops, int max_reps);
/// Runtime::tune of `spec` (timed again even with a record), each candidate's configuration and
/// median printed to stderr under `label`, the winner marked; kernel(spec) then loads the winner.
Result<void> tune_and_print(kiln::Runtime& rt, const kiln::KernelSpec& spec, const std::string& label);

/// The fields of a CSV header line ("a,b,c" -> a, b, c).
std::vector<std::string> split_header(std::string_view csv);
/// Prints `header` and `rows` to `out` as columns: the first left-aligned, the others right-aligned,
/// two spaces apart, each as wide as its widest cell.
void print_table(std::FILE* out, const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows);

/// Compiles `specs` in order for `target` on a thread of its own, into the runtime's caches, so
/// that a case's kernels are ready when it starts (errors are left for the case's own call to
/// report). Destroying it stops after the spec being compiled and joins the thread.
class BackgroundCompile {
 public:
  BackgroundCompile(kiln::Runtime& rt, std::string target, std::vector<kiln::KernelSpec> specs);
  ~BackgroundCompile();
  BackgroundCompile(const BackgroundCompile&) = delete;
  BackgroundCompile& operator=(const BackgroundCompile&) = delete;

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;  // after stop_: it reads stop_ from its first instruction
};

}  // namespace kiln::bench
