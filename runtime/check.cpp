#include "kiln/check.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <random>

#include "templates/op_template.h"

namespace kiln {
namespace {

struct DeviceBuffer {
  Device* device = nullptr;
  void* ptr = nullptr;
  ~DeviceBuffer() {
    if (ptr) (void)device->free(ptr);
  }
};

std::vector<uint8_t> encode(const std::vector<float>& values, DType t) {
  std::vector<uint8_t> out(values.size() * dtype_size(t));
  for (size_t i = 0; i < values.size(); ++i) {
    if (t == DType::f32) {
      std::memcpy(&out[i * 4], &values[i], 4);
    } else {
      const uint16_t h = t == DType::bf16 ? float_to_bf16_bits(values[i]) : float_to_f16_bits(values[i]);
      std::memcpy(&out[i * 2], &h, 2);
    }
  }
  return out;
}

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
  const std::vector<TensorInfo> tensors = op->tensors(spec);
  std::vector<std::vector<float>> inputs;
  std::vector<DeviceBuffer> buffers(tensors.size());
  std::vector<void*> ptrs;
  const TensorInfo* output = nullptr;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorInfo& t = tensors[i];
    const size_t bytes = static_cast<size_t>(t.elements()) * dtype_size(t.dtype);
    report.bytes += static_cast<double>(bytes);
    buffers[i].device = device;
    KILN_ASSIGN_OR_RETURN(buffers[i].ptr, device->malloc(bytes));
    ptrs.push_back(buffers[i].ptr);
    if (t.output) {
      output = &t;
      KILN_TRY(device->memset(buffers[i].ptr, 0xff, bytes));  // 0xff.. is NaN in fp32, fp16 and bf16
      continue;
    }
    // Uniform in [-1, 1], scaled for GEMM's B so that outputs stay O(1) for any K; rounded to the
    // tensor's dtype so the reference sees exactly what the GPU sees.
    const double scale = (op->name() == "gemm" && t.name == "B") ? 1.0 / std::sqrt(double(spec.param("K"))) : 1.0;
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<float> values(static_cast<size_t>(t.elements()));
    for (float& v : values) {
      do v = round_to_dtype(static_cast<float>(dist(rng) * scale), t.dtype);
      while (v == 0.0f);
    }
    const auto encoded = encode(values, t.dtype);
    KILN_TRY(device->copy_to_device(buffers[i].ptr, encoded.data(), encoded.size()));
    inputs.push_back(std::move(values));
  }
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
  op->reference(spec, options.scalars, inputs, sample, ref);

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
