#include "bench/bench_common.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace kiln::bench {

DeviceBuffer::~DeviceBuffer() {
  if (ptr) (void)device->free(ptr);
}

Result<void> DeviceBuffer::allocate(kiln::Device& d, size_t n) {
  if (ptr) {  // a larger buffer replaces this one
    (void)device->free(ptr);
    ptr = nullptr;
  }
  device = &d;
  bytes = n;
  KILN_ASSIGN_OR_RETURN(ptr, d.malloc(std::max<size_t>(n, 256)));
  return kiln::ok();
}

Result<void> DeviceBuffer::poison() { return device->memset(ptr, 0xff, bytes); }

Timing summarize(std::vector<double> ms, double flops) {
  Timing t;
  if (ms.empty()) return t;
  std::vector<double> rates;
  for (double m : ms) rates.push_back(flops / (m * 1e9));
  std::sort(ms.begin(), ms.end());
  const size_t n = ms.size();
  t.median_ms = n % 2 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]);
  t.tflops = flops / (t.median_ms * 1e9);
  if (n > 1) {
    double mean = 0, var = 0;
    for (double r : rates) mean += r / double(n);
    for (double r : rates) var += (r - mean) * (r - mean) / double(n - 1);
    t.stddev = std::sqrt(var);
  }
  return t;
}

std::vector<std::string> split_header(std::string_view csv) {
  std::vector<std::string> header;
  for (std::string_view rest = csv; !rest.empty();) {
    const size_t comma = rest.find(',');
    header.emplace_back(rest.substr(0, comma));
    rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
  }
  return header;
}

void print_table(std::FILE* out, const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> w(header.size());
  for (size_t i = 0; i < header.size(); ++i) w[i] = header[i].size();
  for (const auto& r : rows)
    for (size_t i = 0; i < r.size(); ++i) {
      if (i == w.size()) w.push_back(0);  // a row longer than the header
      w[i] = std::max(w[i], r[i].size());
    }
  auto line = [&](const std::vector<std::string>& r) {
    std::string s;
    for (size_t i = 0; i < r.size(); ++i)
      s += i == 0 ? fmt::format("{:<{}}", r[i], w[i]) : fmt::format("  {:>{}}", r[i], w[i]);
    std::fprintf(out, "%s\n", s.c_str());
  };
  line(header);
  for (const auto& r : rows) line(r);
}

BackgroundCompile::BackgroundCompile(kiln::Runtime& rt, std::string target, std::vector<kiln::KernelSpec> specs)
    : thread_([this, &rt, target = std::move(target), specs = std::move(specs)] {
        for (const kiln::KernelSpec& s : specs) {
          if (stop_) return;
          (void)rt.compile(s, target);
        }
      }) {}

BackgroundCompile::~BackgroundCompile() {
  stop_ = true;
  thread_.join();
}

Result<Timing> time_flushed(kiln::Device& dev, DeviceBuffer& flush, const std::function<Result<void>()>& launch,
                            double flops, int max_reps) {
  std::vector<double> ms;
  int reps = max_reps;
  for (int r = 0; r < reps; ++r) {
    KILN_TRY(dev.memset(flush.ptr, static_cast<uint8_t>(r), flush.bytes));
    KILN_ASSIGN_OR_RETURN(float t, dev.time_ms(nullptr, launch));
    ms.push_back(t);
    if (r == 0) reps = std::clamp(static_cast<int>(300.0 / std::max(double(t), 1e-3)), 5, max_reps);
  }
  return summarize(std::move(ms), flops);
}

Result<void> tune_and_print(kiln::Runtime& rt, const kiln::KernelSpec& spec, const std::string& label) {
  kiln::TuneOptions opt;
  opt.force = true;
  KILN_ASSIGN_OR_RETURN(kiln::TuneReport rep, rt.tune(spec, opt));
  for (size_t i = 0; i < rep.candidates.size(); ++i) {
    std::string cfg;
    for (const auto& [k, v] : rep.candidates[i].config) cfg += fmt::format("{}{}={}", cfg.empty() ? "" : " ", k, v);
    const kiln::TuneCandidate& c = rep.candidates[i];
    const std::string time = !c.error.empty()             ? "skipped: " + c.error
                             : c.median_ms > 0            ? fmt::format("{:.4f} ms", c.median_ms)
                             : rep.candidates.size() == 1 ? std::string("the only candidate (not timed)")
                                                          : std::string("not timed");
    std::fprintf(stderr, "  tune %s: %s  %s%s\n", label.c_str(), cfg.c_str(), time.c_str(),
                 i == rep.winner && rep.candidates.size() > 1 ? "  <- winner" : "");
  }
  return kiln::ok();
}

}  // namespace kiln::bench
