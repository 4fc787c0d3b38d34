// Checks a kernel on the device against the op's CPU reference, and times it. Used by `kiln run`,
// the GPU and emulator tests and the examples: fresh random inputs (never zeros), outputs poisoned
// with NaN before the launch, a float64 reference on the dtype-rounded inputs, and each output's
// accuracy gate (the op's, by default those of shared/reference/BENCHMARKS.md):
//   fp32 output:       |out - ref| <= 1e-4 + 1e-4 * |ref| for every element
//   bf16/fp16 output:  |out - ref| <= 1e-2 + 1e-2 * |ref| for every element, and
//                      ||out - ref||_F / ||ref||_F < 1e-2
//   fp8 and integer outputs: the same codes as the reference (bitwise)
// A NaN reference value marks an element the op must not write (the unused columns of a strided
// view, attention's dq with q_row_stride): the output there must still hold the NaN poison.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "kiln/runtime.h"

namespace kiln {

struct CheckOptions {
  uint64_t seed = 0;          ///< 0: a fresh seed from std::random_device.
  int64_t sample_rows = 0;    ///< Output rows compared with the reference (0: all rows): rows of the
                              ///< outputs' first dimension, or of the op's own (attention: tokens).
  std::map<std::string, float> scalars;
  /// > 0: also time this many launches, each alone after writing twice Device::cache_bytes (so
  /// that no input is found cached; where that memory cannot be had, with the caches warm and
  /// CheckReport::kernel_flushed false); their median is CheckReport::kernel_ms.
  int bench_iterations = 0;
  /// With bench_iterations: device time, milliseconds, of back-to-back launches before the timed
  /// ones (at most 1000 launches; 0: one warm-up launch only), so that the kernel is timed at the
  /// clock the GPU holds under sustained load, as TuneOptions::settle_ms does for the tuner (its
  /// note has the H200's figures). Negative or NaN: an invalid_argument error.
  double bench_settle_ms = 200;
  /// Optional: called once after the comparison with `launch`, which launches the checked kernel
  /// once on the checked tensors (the default stream, nothing synchronized), so that a benchmark
  /// times the kernel on the inputs already made instead of making GPU-sized inputs a second
  /// time (bench_membound: L2 flushed before each launch). Its result, milliseconds per launch,
  /// becomes CheckReport::kernel_ms; an error it returns is check_on_device's error.
  std::function<Result<double>(const std::function<Result<void>()>& launch)> timer;
};

/// The comparison of one output tensor with its reference.
struct OutputCheck {
  std::string name;            ///< "y", "rstd", ...
  bool pass = false;
  int64_t compared = 0;
  int64_t nonfinite = 0;
  int64_t gate_failures = 0;
  double max_abs_err = 0;
  double max_rel_err = 0;
  double rel_frobenius = 0;
  double snr_db = 0;
  std::string gate;
};

/// What check_on_device found. The totals cover every output (errors: the largest; SNR: the
/// lowest); `outputs` has each output's own figures.
struct CheckReport {
  std::string spec;            ///< to_string(spec).
  bool pass = false;
  std::vector<OutputCheck> outputs;
  int64_t compared = 0;        ///< Elements compared.
  int64_t nonfinite = 0;       ///< Non-finite outputs (e.g. poison left unwritten).
  int64_t gate_failures = 0;   ///< Elements outside the per-element gate.
  double max_abs_err = 0;
  double max_rel_err = 0;      ///< max |out - ref| / max(|ref|, 1e-6).
  double rel_frobenius = 0;    ///< ||out - ref||_F / ||ref||_F.
  double snr_db = 0;           ///< 10 log10(||ref||^2 / ||ref - out||^2).
  std::string gate;            ///< The gate applied, in words.
  double first_call_ms = 0;    ///< kernel(): compile or cache load + module load, host wall time.
  double cached_call_ms = 0;   ///< A second kernel() call (memory hit), host wall time.
  double kernel_ms = 0;        ///< Median device time per launch (with bench_iterations), or the timer's result.
  bool kernel_flushed = false; ///< kernel_ms (bench_iterations) was timed after cache flushes.
  double bytes = 0;            ///< Bytes moved by one launch (inputs read + outputs written).
  double flops = 0;            ///< Floating-point operations of one launch (GEMM: 2*M*N*K).
  std::string origin;          ///< "compiled", "disk" or "memory".
  /// What the op's own comparison accepted beyond the reference's values (moe_router: tokens whose
  /// top-k order differs from the fp64 reference's at a near-tie of fp32 selection values; their
  /// weights are then compared per chosen expert): a count and its words. 0: none.
  int64_t accepted = 0;
  std::string accepted_what;
};

/// Allocates the op's tensors on the runtime's device, runs the kernel of `spec` and compares it.
/// Before compiling or allocating, it estimates the device memory (every tensor) and the host
/// memory (the inputs as fp32 and one dtype copy, an output read back, the fp64 reference of the
/// rows compared) and refuses a spec that does not fit the device's free memory (where the driver
/// tells it) or what this process may still allocate (MemAvailable, RLIMIT_AS, RLIMIT_DATA).
/// Errors: driver_unavailable (no GPU), invalid_argument (does not fit: the message gives the
/// bytes needed and the limit; or a host allocation failed), anything kernel() or launch() returns.
Result<CheckReport> check_on_device(Runtime& runtime, const KernelSpec& spec, const CheckOptions& options = {});

/// Compares outputs that an application computed with the op's CPU reference, under the gates
/// and the op's own comparison that check_on_device applies: `inputs` in the op's tensor order
/// (values as float), `outputs` every output tensor whole in signature order, as the bytes of its
/// dtype. Fills the comparison fields of the report (not the timings).
/// Errors: Errc::not_found (op), invalid_argument (spec, wrong input or output counts or sizes, a
/// host allocation that failed).
Result<CheckReport> check_outputs(const KernelSpec& spec, const std::map<std::string, float>& scalars,
                                  std::span<const std::vector<float>> inputs,
                                  std::span<const std::vector<uint8_t>> outputs);

/// One output of the op's CPU reference.
struct ReferenceOutput {
  std::string name;               ///< The output tensor ("y").
  std::vector<int64_t> rows;      ///< Rows of its first dimension computed, in order; empty: all of it, or `elements`.
  std::vector<double> values;     ///< Row after row (or the elements, or every element), row-major; NaN: an
                                  ///< element the op leaves unwritten.
  std::vector<int64_t> elements;  ///< With `rows` empty: the elements computed (flat row-major indices,
                                  ///< ascending), one value each (attention's sampled tokens); empty: all.
};

/// The op's CPU reference (float64 or fp32-accumulated), for applications that check their own
/// results: computes `spec`'s outputs from host copies of its input tensors (in the op's tensor
/// order, values as float), one ReferenceOutput per output tensor. `rows` (optional) asks for only
/// those rows of row-shaped outputs (an op may compute more, and reports which): rows of the first
/// dimension, or of what the op samples (attention and attention_bwd: tokens, batch x seqlen in the
/// bshd layout; attention_bwd takes row r as query token r Tq / N and key token r Tk / N, N the
/// larger token count), reported as `elements`.
/// Errors: Errc::not_found (op), invalid_argument (spec, wrong input count/sizes, a row outside, a
/// host allocation that failed).
Result<std::vector<ReferenceOutput>> reference(const KernelSpec& spec, const std::map<std::string, float>& scalars,
                                               std::span<const std::vector<float>> inputs,
                                               std::span<const int64_t> rows = {});

/// One-line summary: "PASS gemm bf16 ... max_abs 1.2e-03 max_rel ... rel_fro ... snr ... dB", with
/// one clause per output when there are several.
std::string format_report(const CheckReport& report);

}  // namespace kiln
