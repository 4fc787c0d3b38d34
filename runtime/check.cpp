#include "kiln/check.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>

#include "runtime/device_tensors.h"
#include "templates/op_template.h"

namespace kiln {
namespace {

float decode(const uint8_t* p, DType t) {
  if (t == DType::f32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  return t == DType::bf16 ? bf16_bits_to_float(h) : f16_bits_to_float(h);
}

}  // namespace

Result<CheckReport> check_on_device(Runtime& rt, const KernelSpec& spec, const CheckOptions& options) {
  Device* device = rt.device();
  if (!device) return make_error(Errc::driver_unavailable, "no GPU: checking a kernel needs a device");
  KILN_ASSIGN_OR_RETURN(const OpTemplate* op, find_op(spec.op));
  KILN_TRY(op->validate(spec, device->target()));

  CheckReport report;
  report.spec = to_string(spec);
  auto t0 = std::chrono::steady_clock::now();
  KILN_ASSIGN_OR_RETURN(auto kernel, rt.kernel(spec));
  auto t1 = std::chrono::steady_clock::now();
  KILN_ASSIGN_OR_RETURN(auto again, rt.kernel(spec));
  auto t2 = std::chrono::steady_clock::now();
  report.first_call_ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
  report.cached_call_ms = std::chrono::duration<double, std::milli>(t2 - t1).count();
  report.origin = std::string(kernel->compiled().origin());
  (void)again;

  std::mt19937_64 rng(options.seed ? options.seed : std::random_device{}());
  KILN_ASSIGN_OR_RETURN(DeviceTensors tensors, DeviceTensors::make(*device, *op, spec, rng));
  report.bytes = tensors.bytes();
  const std::span<void* const> ptrs = tensors.pointers();
  const TensorInfo* output = nullptr;
  for (const TensorInfo& t : tensors.tensors())
    if (t.output) output = &t;
  if (!output) return make_error(Errc::invalid_argument, "op has no output tensor");

  KILN_TRY(kernel->launch(spec, ptrs, options.scalars, nullptr));
  KILN_TRY(device->synchronize(nullptr));

  std::vector<uint8_t> out_bytes(static_cast<size_t>(output->elements()) * dtype_size(output->dtype));
  KILN_TRY(device->copy_to_host(out_bytes.data(), ptrs.back(), out_bytes.size()));

  // Rows of the output to compare: all, or an evenly spread sample that includes the last row.
  const int64_t rows = output->shape.front();
  const int64_t cols = output->elements() / rows;
  std::vector<int64_t> sample;
  if (options.sample_rows > 0 && options.sample_rows < rows) {
    std::uniform_int_distribution<int64_t> pick(0, rows - 1);
    sample.push_back(0);
    sample.push_back(rows - 1);
    while (static_cast<int64_t>(sample.size()) < options.sample_rows) sample.push_back(pick(rng));
    std::sort(sample.begin(), sample.end());
    sample.erase(std::unique(sample.begin(), sample.end()), sample.end());
  }
  std::vector<double> ref;
  op->reference(spec, options.scalars, tensors.inputs(), sample, ref);

  const bool fp32 = output->dtype == DType::f32;
  const double tol = fp32 ? 1e-4 : 1e-2;
  report.gate = fp32 ? "fp32: |err| <= 1e-4 + 1e-4|ref|"
                     : "bf16/fp16: |err| <= 1e-2 + 1e-2|ref| and rel. Frobenius < 1e-2";
  double err_sq = 0, ref_sq = 0;
  const int64_t n_rows = sample.empty() ? rows : static_cast<int64_t>(sample.size());
  for (int64_t r = 0; r < n_rows; ++r) {
    const int64_t row = sample.empty() ? r : sample[r];
    for (int64_t c = 0; c < cols; ++c) {
      const double want = ref[static_cast<size_t>(r * cols + c)];
      const double got = decode(&out_bytes[static_cast<size_t>(row * cols + c) * dtype_size(output->dtype)], output->dtype);
      ++report.compared;
      if (!std::isfinite(got)) {
        ++report.nonfinite;
        continue;
      }
      const double err = std::fabs(got - want);
      report.max_abs_err = std::max(report.max_abs_err, err);
      report.max_rel_err = std::max(report.max_rel_err, err / std::max(std::fabs(want), 1e-6));
      if (err > tol + tol * std::fabs(want)) ++report.gate_failures;
      err_sq += err * err;
      ref_sq += want * want;
    }
  }
  report.rel_frobenius = ref_sq > 0 ? std::sqrt(err_sq / ref_sq) : std::sqrt(err_sq);
  report.snr_db = err_sq > 0 ? 10.0 * std::log10(ref_sq / err_sq) : 999.0;
  report.pass = report.nonfinite == 0 && report.gate_failures == 0 && (fp32 || report.rel_frobenius < 1e-2);
  if (op->name() == "gemm")
    report.flops = 2.0 * double(spec.param("M")) * double(spec.param("N")) * double(spec.param("K"));

  if (options.bench_iterations > 0) {
    for (int i = 0; i < 3; ++i) KILN_TRY(kernel->launch(spec, ptrs, options.scalars, nullptr));  // warm-up
    std::vector<float> batches;
    for (int b = 0; b < 5; ++b) {
      KILN_ASSIGN_OR_RETURN(float ms, device->time_ms(nullptr, [&]() -> Result<void> {
        for (int i = 0; i < options.bench_iterations; ++i) KILN_TRY(kernel->launch(spec, ptrs, options.scalars, nullptr));
        return ok();
      }));
      batches.push_back(ms / options.bench_iterations);
    }
    std::sort(batches.begin(), batches.end());
    report.kernel_ms = batches[batches.size() / 2];
  }
  return report;
}

Result<void> reference(const KernelSpec& spec, const std::map<std::string, float>& scalars,
                       std::span<const std::vector<float>> inputs, std::span<const int64_t> rows,
                       std::vector<double>& out) {
  KILN_ASSIGN_OR_RETURN(const OpTemplate* op, find_op(spec.op));
  KILN_TRY(op->validate(spec, all_targets().front()));
  const auto tensors = op->tensors(spec);
  size_t n_inputs = 0;
  for (const auto& t : tensors) {
    if (t.output) continue;
    if (n_inputs >= inputs.size() || static_cast<int64_t>(inputs[n_inputs].size()) != t.elements())
      return make_error(Errc::invalid_argument,
                        fmt::format("{}: input '{}' needs {} values", spec.op, t.name, t.elements()));
    ++n_inputs;
  }
  if (n_inputs != inputs.size())
    return make_error(Errc::invalid_argument, fmt::format("{}: takes {} inputs, got {}", spec.op, n_inputs, inputs.size()));
  const int64_t out_rows = tensors.back().shape.front();
  for (int64_t r : rows)
    if (r < 0 || r >= out_rows)
      return make_error(Errc::invalid_argument, fmt::format("{}: row {} is outside [0, {})", spec.op, r, out_rows));
  op->reference(spec, scalars, inputs, rows, out);
  return ok();
}

std::string format_report(const CheckReport& r) {
  return fmt::format("{} {}: compared {} elements, max_abs_err {:.3e}, max_rel_err {:.3e}, rel_frobenius {:.3e}, "
                     "snr {:.1f} dB, nonfinite {}, outside gate {} ({})",
                     r.pass ? "PASS" : "FAIL", r.spec, r.compared, r.max_abs_err, r.max_rel_err, r.rel_frobenius,
                     r.snr_db, r.nonfinite, r.gate_failures, r.gate);
}

}  // namespace kiln
