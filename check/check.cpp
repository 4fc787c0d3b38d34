#include "kiln/check.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <new>
#include <random>
#include <stdexcept>

#include "runtime/device_tensors.h"
#include "runtime/flushed_timing.h"
#include "templates/registry.h"

namespace kiln {
namespace {

// fp8 codes and integers compared as numbers on one line: the signed code index of an fp8 value.
int64_t code_index(double v, DType t) {
  if (is_integer(t)) return static_cast<int64_t>(v);
  const uint8_t b = float_to_fp8_bits(static_cast<float>(v), t);
  return (b & 0x80) ? -static_cast<int64_t>(b & 0x7f) : static_cast<int64_t>(b & 0x7f);
}

// Compares one output (host bytes) with its reference values under its gate. `out` holds the whole
// tensor, or with `compact` only the reference's rows, one after another.
OutputCheck compare(const TensorInfo& t, const uint8_t* out, bool compact, const RefOutput& ref, const Gate& gate) {
  OutputCheck c;
  c.name = t.name;
  c.gate = gate.describe();
  double err_sq = 0, ref_sq = 0;
  // Reference value ri against the output's element oi.
  auto one = [&](size_t ri, size_t oi) {
    if (ri >= ref.values.size()) return;
    const double want = ref.values[ri];
    const double got = decode_value(out, oi, t.dtype);
    ++c.compared;
    if (std::isnan(want)) {  // an element the op must not write: it keeps the NaN poison
      if (!std::isnan(got)) ++c.gate_failures;
      return;
    }
    if (std::isinf(want) && got == want) return;  // an expected infinity (attention's lse of an empty row)
    if (!std::isfinite(got)) {
      ++c.nonfinite;
      return;
    }
    const double err = std::fabs(got - want);
    c.max_abs_err = std::max(c.max_abs_err, err);
    c.max_rel_err = std::max(c.max_rel_err, err / std::max(std::fabs(want), 1e-6));
    if (gate.kind == Gate::Kind::tolerance && err > gate.atol + gate.rtol * std::fabs(want)) ++c.gate_failures;
    if (gate.kind == Gate::Kind::exact && std::llabs(code_index(got, t.dtype) - code_index(want, t.dtype)) > gate.max_code_diff)
      ++c.gate_failures;
    err_sq += err * err;
    ref_sq += want * want;
  };
  int64_t expected = 0;  // values the comparison must cover
  if (ref.rows.empty() && !ref.elements.empty()) {
    // Listed elements (read whole: compact is only for rows); one outside the tensor is a failure.
    expected = static_cast<int64_t>(ref.elements.size());
    for (size_t i = 0; i < ref.elements.size(); ++i) {
      const int64_t e = ref.elements[i];
      if (e < 0 || e >= t.elements())
        ++c.gate_failures;
      else
        one(i, static_cast<size_t>(e));
    }
  } else {
    const int64_t rows = t.shape.empty() ? 1 : t.shape.front();
    const int64_t cols = rows ? t.elements() / rows : 0;
    const int64_t n_rows = ref.rows.empty() ? rows : static_cast<int64_t>(ref.rows.size());
    expected = n_rows * cols;
    for (int64_t r = 0; r < n_rows; ++r) {
      const int64_t row = ref.rows.empty() ? r : ref.rows[r];
      for (int64_t col = 0; col < cols; ++col)
        one(static_cast<size_t>(r * cols + col), static_cast<size_t>((compact ? r : row) * cols + col));
    }
  }
  c.rel_frobenius = ref_sq > 0 ? std::sqrt(err_sq / ref_sq) : std::sqrt(err_sq);
  c.snr_db = err_sq > 0 ? 10.0 * std::log10(ref_sq / err_sq) : 999.0;
  c.pass = c.nonfinite == 0 && c.gate_failures == 0 && c.compared == expected;
  if (gate.kind == Gate::Kind::tolerance && gate.max_rel_fro >= 0) c.pass = c.pass && c.rel_frobenius < gate.max_rel_fro;
  if (gate.kind == Gate::Kind::snr) c.pass = c.pass && c.snr_db > gate.min_snr_db;
  return c;
}

// Host bytes of output tensor `index`: the whole tensor, or with `rows` only those rows, one
// after another.
using ReadOutput = std::function<Result<void>(size_t index, const std::vector<int64_t>* rows, std::vector<uint8_t>& bytes)>;

// Compares every output of `tensors` with its reference (refs, in output order): first the op's
// own comparison where it has one (every output read whole), then each output under its gate.
// Fills the report's comparison fields.
Result<void> compare_all(const OpTemplate& op, const KernelSpec& full, const Scalars& scalars,
                         std::span<const std::vector<float>> inputs, std::span<const TensorInfo> tensors,
                         std::vector<RefOutput>& refs, const ReadOutput& read, CheckReport& report) {
  std::vector<size_t> outputs;
  for (size_t i = 0; i < tensors.size(); ++i)
    if (tensors[i].output) outputs.push_back(i);
  if (refs.size() < outputs.size())
    return make_error(Errc::invalid_argument,
                      fmt::format("{}: the reference gave values for {} of its {} outputs", op.name(), refs.size(),
                                  outputs.size()));
  std::vector<std::vector<uint8_t>> whole;  // with the op's own comparison: every output, read once
  if (op.compares_outputs()) {
    std::vector<std::vector<double>> decoded(outputs.size());
    whole.resize(outputs.size());
    for (size_t o = 0; o < outputs.size(); ++o) {
      const TensorInfo& t = tensors[outputs[o]];
      KILN_TRY(read(outputs[o], nullptr, whole[o]));
      decoded[o].resize(static_cast<size_t>(t.elements()));
      for (size_t e = 0; e < decoded[o].size(); ++e) decoded[o][e] = decode_value(whole[o].data(), e, t.dtype);
    }
    const AcceptedOutputs accepted = op.compare_outputs(full, scalars, inputs, decoded, refs);
    report.accepted = accepted.count;
    report.accepted_what = accepted.what;
  }

  report.pass = true;
  report.snr_db = 999.0;
  std::vector<std::string> gates;
  for (size_t o = 0; o < outputs.size(); ++o) {
    const TensorInfo& t = tensors[outputs[o]];
    const RefOutput& ref = refs[o];
    // Only the rows compared come back when they are a few of many (a benchmark's 8 sampled rows
    // of a GPU-sized output): reading gigabytes back to compare kilobytes took seconds per check.
    const int64_t t_rows = t.shape.empty() ? 1 : t.shape.front();
    const bool compact = whole.empty() && !ref.rows.empty() && ref.rows.size() <= 64 &&
                         static_cast<int64_t>(ref.rows.size()) < t_rows &&
                         std::all_of(ref.rows.begin(), ref.rows.end(), [&](int64_t r) { return r >= 0 && r < t_rows; });
    std::vector<uint8_t> bytes;
    if (!whole.empty()) {
      bytes = std::move(whole[o]);
    } else {
      KILN_TRY(read(outputs[o], compact ? &ref.rows : nullptr, bytes));
    }
    OutputCheck c = compare(t, bytes.data(), compact, ref, op.gate(full, t));
    report.pass = report.pass && c.pass;
    report.compared += c.compared;
    report.nonfinite += c.nonfinite;
    report.gate_failures += c.gate_failures;
    report.max_abs_err = std::max(report.max_abs_err, c.max_abs_err);
    report.max_rel_err = std::max(report.max_rel_err, c.max_rel_err);
    report.rel_frobenius = std::max(report.rel_frobenius, c.rel_frobenius);
    report.snr_db = std::min(report.snr_db, c.snr_db);
    gates.push_back(fmt::format("{}: {}", c.name, c.gate));
    report.outputs.push_back(std::move(c));
  }
  report.gate = fmt::format("{}", fmt::join(gates, "; "));
  return ok();
}

}  // namespace

namespace {

Result<CheckReport> check_unguarded(Runtime& rt, const KernelSpec& spec, const CheckOptions& options) {
  Device* device = rt.device();
  if (!device) return make_error(Errc::driver_unavailable, "no GPU: checking a kernel needs a device");
  KILN_ASSIGN_OR_RETURN(const OpTemplate* op, find_op(spec.op));
  KILN_TRY(op->validate(spec, device->target()));
  const KernelSpec full = op->with_defaults(spec);

  // Host memory beyond the inputs (DeviceTensors estimates those): each output read back, one at
  // a time, and the reference values (fp64) of the rows compared. Refused before compiling.
  const double sampled = options.sample_rows > 0 && options.sample_rows < op->sample_dimension(full)
                             ? static_cast<double>(options.sample_rows) / static_cast<double>(op->sample_dimension(full))
                             : 1.0;
  double readback = 0, reference_bytes = 0;
  for (const TensorInfo& t : op->tensors(full)) {
    if (!t.output) continue;
    double elements = 1;
    for (int64_t d : t.shape) elements *= static_cast<double>(d);
    const double held = elements * static_cast<double>(dtype_size(t.dtype));
    // With the op's own comparison every output is held at once, with its values as doubles.
    readback = op->compares_outputs() ? readback + held + elements * sizeof(double) : std::max(readback, held);
    // A sample's values may come with their element indices (RefOutput::elements: attention).
    reference_bytes += elements * sampled * static_cast<double>(sizeof(double) + (sampled < 1.0 ? sizeof(int64_t) : 0));
  }
  const double extra_host = readback + reference_bytes;
  const char* extra_what = "an output read back and the fp64 reference of the rows compared";
  KILN_TRY(DeviceTensors::ensure_fits(*device, *op, full, extra_host, extra_what));

  CheckReport report;
  report.spec = spec_text(spec);
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
  KILN_ASSIGN_OR_RETURN(DeviceTensors tensors,
                        DeviceTensors::make(*device, *op, full, rng, extra_host, extra_what, options.scalars));
  report.bytes = op->bytes(full);
  report.flops = op->flops(full);
  const std::span<void* const> ptrs = tensors.pointers();

  KILN_TRY(kernel->launch(spec, ptrs, options.scalars, nullptr));
  KILN_TRY(device->synchronize(nullptr));

  // Rows to compare: all, or an evenly spread sample that includes the first and last row.
  const int64_t rows = op->sample_dimension(full);
  std::vector<int64_t> sample;
  if (options.sample_rows > 0 && options.sample_rows < rows) {
    std::uniform_int_distribution<int64_t> pick(0, rows - 1);
    sample.push_back(0);
    sample.push_back(rows - 1);
    while (static_cast<int64_t>(sample.size()) < options.sample_rows) sample.push_back(pick(rng));
    std::sort(sample.begin(), sample.end());
    sample.erase(std::unique(sample.begin(), sample.end()), sample.end());
  }
  std::vector<RefOutput> refs;
  op->reference(full, options.scalars, tensors.inputs(), sample, refs);

  const auto read = [&](size_t i, const std::vector<int64_t>* rows, std::vector<uint8_t>& bytes) -> Result<void> {
    const TensorInfo& t = tensors.tensors()[i];
    const int64_t t_rows = t.shape.empty() ? 1 : t.shape.front();
    const size_t row_bytes = t_rows > 0 ? static_cast<size_t>(t.bytes() / static_cast<uint64_t>(t_rows)) : 0;
    if (rows) {
      bytes.resize(rows->size() * row_bytes);
      for (size_t r = 0; r < rows->size() && row_bytes > 0; ++r)
        KILN_TRY(device->copy_to_host(bytes.data() + r * row_bytes,
                                      static_cast<const uint8_t*>(ptrs[i]) + static_cast<size_t>((*rows)[r]) * row_bytes,
                                      row_bytes));
      return ok();
    }
    bytes.resize(static_cast<size_t>(t.bytes()));
    if (!bytes.empty()) KILN_TRY(device->copy_to_host(bytes.data(), ptrs[i], bytes.size()));
    return ok();
  };
  KILN_TRY(compare_all(*op, full, options.scalars, tensors.inputs(), tensors.tensors(), refs, read, report));

  if (options.bench_iterations > 0) {
    // Each launch alone from cold caches, as Runtime::tune and bench/ time kernels (back-to-back
    // launches overlap and find the previous launch's inputs in L2, which read 5-10% fast under
    // about 100 us: H100, 2026-11-28, quantize_fp8 block1x128 at 8192 x 4096, 0.0369 ms back to
    // back, 0.0399-0.0405 flushed), after a warm-up and back-to-back launches for about
    // bench_settle_ms (the clock of sustained load, as the tuner).
    KILN_ASSIGN_OR_RETURN(FlushedTimes t, time_flushed_launches(*device, options.bench_iterations, options.bench_settle_ms, [&] {
      return kernel->launch(spec, ptrs, options.scalars, nullptr);
    }, to_string(spec)));
    report.kernel_ms = t.median_ms;
    report.kernel_flushed = t.flushed;
  }
  if (options.timer) {
    KILN_ASSIGN_OR_RETURN(report.kernel_ms,
                          options.timer([&]() -> Result<void> { return kernel->launch(spec, ptrs, options.scalars, nullptr); }));
  }
  return report;
}

// Sizes come from users: an allocation that fails is an error, never an exception out of the library.
template <class F>
auto guarded(const KernelSpec& spec, F&& body) -> decltype(body()) {
  try {
    return body();
  } catch (const std::bad_alloc&) {
    return make_error(Errc::invalid_argument,
                      fmt::format("{}: out of host memory (a host allocation failed); give smaller sizes", to_string(spec)));
  } catch (const std::length_error&) {
    return make_error(Errc::invalid_argument,
                      fmt::format("{}: a host buffer would be larger than this host allows; give smaller sizes",
                                  to_string(spec)));
  }
}

// What reference() and check_outputs() both start from: the op, the spec with its defaults, and its
// tensors, with `inputs` checked against the op's inputs (one vector of values per input, in order).
struct ReferenceCall {
  const OpTemplate* op = nullptr;
  KernelSpec full;
  std::vector<TensorInfo> tensors;
};

Result<ReferenceCall> reference_call(const KernelSpec& spec, std::span<const std::vector<float>> inputs) {
  ReferenceCall call;
  KILN_ASSIGN_OR_RETURN(call.op, find_op(spec.op));
  // Any target will do: the reference does not depend on it (an fp8 spec picks one that converts it).
  const TargetInfo* target = &all_targets().front();
  for (const TargetInfo& t : all_targets())
    if (call.op->validate(spec, t)) {
      target = &t;
      break;
    }
  KILN_TRY(call.op->validate(spec, *target));
  call.full = call.op->with_defaults(spec);
  call.tensors = call.op->tensors(call.full);
  size_t n_inputs = 0;
  for (const TensorInfo& t : call.tensors) {
    if (t.output) continue;
    if (n_inputs >= inputs.size() || static_cast<int64_t>(inputs[n_inputs].size()) != t.elements())
      return make_error(Errc::invalid_argument, fmt::format("{}: input '{}' needs {} values", spec.op, t.name, t.elements()));
    ++n_inputs;
  }
  if (n_inputs != inputs.size())
    return make_error(Errc::invalid_argument, fmt::format("{}: takes {} inputs, got {}", spec.op, n_inputs, inputs.size()));
  return call;
}

}  // namespace

Result<CheckReport> check_on_device(Runtime& rt, const KernelSpec& spec, const CheckOptions& options) {
  if (!(options.bench_settle_ms >= 0))
    return make_error(Errc::invalid_argument,
                      fmt::format("check: bench_settle_ms = {}; give 0 (one warm-up launch) or more", options.bench_settle_ms));
  return guarded(spec, [&] { return check_unguarded(rt, spec, options); });
}

Result<std::vector<ReferenceOutput>> reference(const KernelSpec& spec, const std::map<std::string, float>& scalars,
                                               std::span<const std::vector<float>> inputs, std::span<const int64_t> rows) {
  return guarded(spec, [&]() -> Result<std::vector<ReferenceOutput>> {
    KILN_ASSIGN_OR_RETURN(const ReferenceCall call, reference_call(spec, inputs));
    const int64_t out_rows = call.op->sample_dimension(call.full);
    for (int64_t r : rows)
      if (r < 0 || r >= out_rows)
        return make_error(Errc::invalid_argument, fmt::format("{}: row {} is outside [0, {})", spec.op, r, out_rows));
    std::vector<int64_t> sorted(rows.begin(), rows.end());
    std::sort(sorted.begin(), sorted.end());
    std::vector<RefOutput> refs;
    call.op->reference(call.full, scalars, inputs, sorted, refs);
    std::vector<ReferenceOutput> out;  // the op's outputs in order, named
    for (const TensorInfo& t : call.tensors) {
      if (!t.output) continue;
      if (out.size() >= refs.size()) break;
      RefOutput& ref = refs[out.size()];
      out.push_back({t.name, std::move(ref.rows), std::move(ref.values), std::move(ref.elements)});
    }
    return out;
  });
}

Result<CheckReport> check_outputs(const KernelSpec& spec, const std::map<std::string, float>& scalars,
                                  std::span<const std::vector<float>> inputs,
                                  std::span<const std::vector<uint8_t>> outputs) {
  return guarded(spec, [&]() -> Result<CheckReport> {
    KILN_ASSIGN_OR_RETURN(const ReferenceCall call, reference_call(spec, inputs));
    std::vector<size_t> output_of(call.tensors.size());  // tensor index -> position in `outputs`
    size_t n_outputs = 0;
    for (size_t i = 0; i < call.tensors.size(); ++i) {
      const TensorInfo& t = call.tensors[i];
      if (!t.output) continue;
      if (n_outputs < outputs.size() && outputs[n_outputs].size() != t.bytes())
        return make_error(Errc::invalid_argument, fmt::format("{}: output '{}' needs {} bytes ({} values), got {}",
                                                              spec.op, t.name, t.bytes(), t.elements(),
                                                              outputs[n_outputs].size()));
      output_of[i] = n_outputs++;
    }
    if (n_outputs != outputs.size())
      return make_error(Errc::invalid_argument,
                        fmt::format("{}: has {} outputs, got {}", spec.op, n_outputs, outputs.size()));
    std::vector<RefOutput> refs;
    call.op->reference(call.full, scalars, inputs, {}, refs);
    CheckReport report;
    report.spec = spec_text(spec);
    const auto read = [&](size_t i, const std::vector<int64_t>*, std::vector<uint8_t>& bytes) -> Result<void> {
      bytes = outputs[output_of[i]];
      return ok();
    };
    KILN_TRY(compare_all(*call.op, call.full, scalars, inputs, call.tensors, refs, read, report));
    return report;
  });
}

std::string format_report(const CheckReport& r) {
  std::string s = fmt::format("{} {}: compared {} elements, max_abs_err {:.3e}, max_rel_err {:.3e}, rel_frobenius {:.3e}, "
                              "snr {:.1f} dB, nonfinite {}, outside gate {} ({})",
                              r.pass ? "PASS" : "FAIL", r.spec, r.compared, r.max_abs_err, r.max_rel_err, r.rel_frobenius,
                              r.snr_db, r.nonfinite, r.gate_failures, r.gate);
  if (r.accepted > 0) s += fmt::format(", {} {} accepted", r.accepted, r.accepted_what);
  if (r.outputs.size() > 1)
    for (const OutputCheck& c : r.outputs)
      s += fmt::format("\n  {} {}: compared {}, max_abs_err {:.3e}, rel_frobenius {:.3e}, snr {:.1f} dB, nonfinite {}, "
                       "outside gate {}",
                       c.pass ? "PASS" : "FAIL", c.name, c.compared, c.max_abs_err, c.rel_frobenius, c.snr_db, c.nonfinite,
                       c.gate_failures);
  return s;
}

}  // namespace kiln
