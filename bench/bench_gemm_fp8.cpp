// bench_gemm_fp8: Kiln's gemm_fp8 on the GEMMs of a training step (issue 17 §5), in the
// BENCHMARKS.md GEMM format; bench/gemm_fp8_peers.py times torch._scaled_mm (cuBLASLt) on the same
// rows in the same job and prints the ratios.
//
//   build/bench/bench_gemm_fp8 OUT.csv [--quick] [--only SUBSTR] [--tune]   # GPU; --list prints the rows
//
// Rows: for llama3.1-8b and qwen2.5-7b (--quick: llama3.1-8b only) at M = 8192 tokens, the five
// GEMMs of a layer (qkv, attn_out, gate_up, down, lm_head: N x K from shared/reference/models.json),
// each as the three GEMMs of its training step with K-major fp8 operands (docs/gemm-fp8.md):
//   fwd    y  [M, N] = x [M, K] . W [N, K]^T            e4m3 x e4m3     M N K
//   dgrad  dx [M, K] = dy [M, N] . (W^T) [K, N]^T       e5m2 x e4m3     M K N
//   wgrad  dW [N, K] = (dy^T) [N, M] . (x^T) [K, M]^T   e5m2 x e4m3     N K M
// plus 8192 x 8192 x 8192 forward; each at the granularities tensorwise, rowwise and blockwise (A
// 1x128, B 128x128; the wgrad, whose B is an activation, uses block1x128 as a step does). C is
// bf16. FLOPs 2 M N K.
// Inputs: a fixed table of random nonzero fp8 codes tiled over A and B (so that the check can
// recompute any element on the host), scales about 1 / FP8_MAX spread over five binades per group
// (B's also 1 / sqrt(K)); C poisoned with NaN. Check: 8 rows (the last included) x 128 columns
// against an fp64 reference of the dequantized operands, SNR > 40 dB, no non-finite value.
// Timing: device events around each launch, L2 evicted (a 256 MiB memset) before each, 1 warm-up,
// repetitions until about 300 ms of device time (5 .. 50); median. --tune first runs Runtime::tune
// (every tuning candidate timed; printed) and then times the winner.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_common.h"
#include "kiln/kiln.h"

namespace {
using kiln::DType;
using kiln::Result;
using kiln::bench::DeviceBuffer;

constexpr int64_t kGranTensorwise = 0, kGranRowwise = 1, kGranBlockwise = 2, kGranBlock1x128 = 3;
const char* const kGranNames[] = {"tensorwise", "rowwise", "blockwise", "block1x128"};

struct Shape {
  std::string label;  // "llama3.1-8b/gate_up/fwd"
  int64_t M, N, K;
  bool a_e5m2;        // the gradient operand of dgrad and wgrad
  bool wgrad;         // B is an activation: blockwise means block1x128
};

std::vector<Shape> shapes(bool quick) {
  struct Layer {
    const char* model;
    int64_t hidden, intermediate, heads, kv_heads, head_dim, vocab;
  };
  const Layer layers[] = {{"llama3.1-8b", 4096, 14336, 32, 8, 128, 128256},
                          {"qwen2.5-7b", 3584, 18944, 28, 4, 128, 152064}};
  constexpr int64_t M = 8192;
  std::vector<Shape> out;
  out.push_back({"square/8192", 8192, 8192, 8192, false, false});
  for (const Layer& l : layers) {
    if (quick && std::string(l.model) != "llama3.1-8b") continue;
    const struct {
      const char* name;
      int64_t N, K;
    } gemms[] = {{"qkv", (l.heads + 2 * l.kv_heads) * l.head_dim, l.hidden},
                 {"attn_out", l.hidden, l.heads * l.head_dim},
                 {"gate_up", 2 * l.intermediate, l.hidden},
                 {"down", l.hidden, l.intermediate},
                 {"lm_head", l.vocab, l.hidden}};
    for (const auto& g : gemms) {
      const std::string base = fmt::format("{}/{}", l.model, g.name);
      out.push_back({base + "/fwd", M, g.N, g.K, false, false});
      out.push_back({base + "/dgrad", M, g.K, g.N, true, false});
      out.push_back({base + "/wgrad", g.N, g.K, M, true, true});
    }
  }
  return out;
}

// Element i of an operand: a table of 1,000,003 random nonzero codes, tiled; `salt` shifts the
// tiling so that A and B differ. The same uniform draws give the e4m3 and the e5m2 table.
struct Table {
  std::vector<uint8_t> e4m3, e5m2;
  explicit Table(uint64_t seed) : e4m3(1000003), e5m2(1000003) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> d(-1.0f, 1.0f);
    for (size_t i = 0; i < e4m3.size(); ++i) {
      float u;
      do u = d(rng);
      while (std::fabs(u) < 1e-3f);
      e4m3[i] = kiln::float_to_fp8_bits(u * 448.0f, DType::e4m3);
      e5m2[i] = kiln::float_to_fp8_bits(u * 57344.0f, DType::e5m2);
    }
  }
  uint8_t code(int64_t i, int64_t salt, bool e5m2_) const {
    return (e5m2_ ? e5m2 : e4m3)[static_cast<size_t>((i + salt) % 1000003)];
  }
  double value(int64_t i, int64_t salt, bool e5m2_) const {
    return kiln::fp8_bits_to_float(code(i, salt, e5m2_), e5m2_ ? DType::e5m2 : DType::e4m3);
  }
};

Result<void> fill(kiln::Device& dev, void* dst, int64_t n, const Table& t, int64_t salt, bool e5m2) {
  constexpr int64_t kChunk = int64_t{1} << 24;
  std::vector<uint8_t> stage;
  for (int64_t off = 0; off < n; off += kChunk) {
    const int64_t len = std::min(kChunk, n - off);
    stage.resize(static_cast<size_t>(len));
    for (int64_t i = 0; i < len; ++i) stage[static_cast<size_t>(i)] = t.code(off + i, salt, e5m2);
    KILN_TRY(dev.copy_to_device(static_cast<uint8_t*>(dst) + off, stage.data(), static_cast<size_t>(len)));
  }
  return kiln::ok();
}

// Scales of one operand: `count` values about 1 / fp8_max, a different binade per group; B's
// also divided by sqrt(K) so that C stays O(1).
std::vector<float> make_scales(int64_t count, double fp8max, double extra, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> mant(0.5, 1.0);
  std::vector<float> v(static_cast<size_t>(count));
  for (int64_t g = 0; g < count; ++g)
    v[static_cast<size_t>(g)] = static_cast<float>(std::ldexp(mant(rng), static_cast<int>(g % 5) - 2) / fp8max * extra);
  return v;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Scale of operand element (row, k) at granularity `gran` for rows x K (is_b: 128 x 128 blocks
// for blockwise).
size_t scale_index(int64_t gran, bool is_b, int64_t row, int64_t k, int64_t K) {
  const int64_t kb = ceil_div(K, 128);
  if (gran == kGranTensorwise) return 0;
  if (gran == kGranRowwise) return static_cast<size_t>(row);
  if (gran == kGranBlockwise && is_b) return static_cast<size_t>((row / 128) * kb + k / 128);
  return static_cast<size_t>(row * kb + k / 128);
}
int64_t scale_count(int64_t gran, bool is_b, int64_t rows, int64_t K) {
  if (gran == kGranTensorwise) return 1;
  if (gran == kGranRowwise) return rows;
  if (gran == kGranBlockwise && is_b) return ceil_div(rows, 128) * ceil_div(K, 128);
  return rows * ceil_div(K, 128);
}

struct Row {
  std::string check = "-";
  double snr = 0;
  kiln::bench::Timing timing;
  std::string config;
};

constexpr int64_t kSaltA = 0, kSaltB = 499979;
constexpr size_t kFlushBytes = size_t{256} << 20;

Result<Row> run_gran(kiln::Runtime& rt, const Shape& s, int64_t gran, const Table& table, void* a, void* b,
                     void* c, DeviceBuffer& flush, bool tune) {
  kiln::Device& dev = *rt.device();
  const kiln::KernelSpec spec{"gemm_fp8", s.a_e5m2 ? DType::e5m2 : DType::e4m3, DType::bf16,
                              {{"M", s.M}, {"N", s.N}, {"K", s.K}, {"granularity", gran}, {"b_format", 0}}};
  Row row;
  if (tune) KILN_TRY(kiln::bench::tune_and_print(rt, spec, s.label + " " + kGranNames[gran]));
  KILN_ASSIGN_OR_RETURN(auto kernel, rt.kernel(spec));
  row.config = kernel->compiled().info().config;
  const bool b_is_1x128 = gran == kGranBlock1x128;
  const std::vector<float> sa = make_scales(scale_count(gran, false, s.M, s.K), s.a_e5m2 ? 57344.0 : 448.0, 1.0, 11);
  const std::vector<float> sb =
      make_scales(scale_count(gran, !b_is_1x128, s.N, s.K), 448.0, 1.0 / std::sqrt(double(s.K)), 12);
  DeviceBuffer dsa, dsb;
  KILN_TRY(dsa.allocate(dev, sa.size() * 4));
  KILN_TRY(dsb.allocate(dev, sb.size() * 4));
  KILN_TRY(dev.copy_to_device(dsa.ptr, sa.data(), sa.size() * 4));
  KILN_TRY(dev.copy_to_device(dsb.ptr, sb.data(), sb.size() * 4));
  KILN_TRY(dev.memset(c, 0xff, static_cast<size_t>(s.M * s.N) * 2));
  const std::vector<void*> buffers = {a, b, dsa.ptr, dsb.ptr, c};
  auto launch = [&]() -> Result<void> { return kernel->launch(spec, buffers); };
  KILN_TRY(launch());
  KILN_TRY(dev.synchronize(nullptr));

  // Check: 8 rows x 128 columns, fp64 on the dequantized operands.
  double sig = 0, err = 0;
  bool finite = true;
  std::vector<uint16_t> got(static_cast<size_t>(s.N));
  std::vector<double> arow(static_cast<size_t>(s.K));
  for (int r = 0; r < 8; ++r) {
    const int64_t m = r == 7 ? s.M - 1 : r * (s.M / 8) + 3 * r;
    KILN_TRY(dev.copy_to_host(got.data(), static_cast<const uint16_t*>(c) + m * s.N, got.size() * 2));
    for (int64_t k = 0; k < s.K; ++k)
      arow[static_cast<size_t>(k)] =
          table.value(m * s.K + k, kSaltA, s.a_e5m2) * sa[scale_index(gran, false, m, k, s.K)];
    for (int64_t j = 0; j < std::min<int64_t>(s.N, 128); ++j) {
      const int64_t n = s.N <= 128 ? j : j * (s.N / 128) + j % 5;
      double ref = 0;
      for (int64_t k = 0; k < s.K; ++k)
        ref += arow[static_cast<size_t>(k)] * table.value(n * s.K + k, kSaltB, false) *
               sb[scale_index(gran, !b_is_1x128, n, k, s.K)];
      const uint32_t bits = static_cast<uint32_t>(got[static_cast<size_t>(n)]) << 16;
      float x;
      std::memcpy(&x, &bits, 4);
      if (!std::isfinite(x)) finite = false;
      sig += ref * ref;
      err += (x - ref) * (x - ref);
    }
  }
  row.snr = err > 0 ? 10 * std::log10(sig / err) : 200;
  row.check = finite && row.snr > 40 ? "PASS" : "FAIL";

  KILN_ASSIGN_OR_RETURN(row.timing, kiln::bench::time_flushed(dev, flush, launch,
                                                               2.0 * double(s.M) * double(s.N) * double(s.K), 50));
  return row;
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Kiln gemm_fp8 on the GEMMs of a training step (forward, dgrad, wgrad)"};
  std::string csv, only;
  bool quick = false, list = false, tune = false;
  app.add_option("csv", csv, "Output CSV");
  app.add_flag("--quick", quick, "llama3.1-8b and the 8192^3 square only");
  app.add_option("--only", only, "Only the rows whose label contains this");
  app.add_flag("--tune", tune, "Time every tuning candidate first (Runtime::tune) and print them");
  app.add_flag("--list", list, "Print the rows and exit");
  CLI11_PARSE(app, argc, argv);
  std::vector<Shape> all;
  for (const Shape& s : shapes(quick))
    if (only.empty() || s.label.find(only) != std::string::npos) all.push_back(s);
  if (list) {
    for (const Shape& s : all)
      std::printf("%-32s M=%-6lld N=%-6lld K=%-6lld %s x e4m3\n", s.label.c_str(), (long long)s.M, (long long)s.N,
                  (long long)s.K, s.a_e5m2 ? "e5m2" : "e4m3");
    return 0;
  }
  if (csv.empty()) {
    std::fprintf(stderr, "bench_gemm_fp8: give the output CSV; --help\n");
    return 2;
  }
  auto rt = kiln::Runtime::create();
  if (!rt || !(*rt)->device()) {
    std::fprintf(stderr, "bench_gemm_fp8: no GPU (%s)\n", rt ? "the runtime has no device" : rt.error().message.c_str());
    return 77;
  }
  kiln::Runtime& runtime = **rt;
  kiln::Device& dev = *runtime.device();
  DeviceBuffer flush;
  if (auto r = flush.allocate(dev, kFlushBytes); !r) {
    std::fprintf(stderr, "bench_gemm_fp8: %s\n", r.error().message.c_str());
    return 1;
  }
  const Table table(20261126);
  std::FILE* out = std::fopen(csv.c_str(), "w");
  if (!out) {
    std::fprintf(stderr, "bench_gemm_fp8: cannot write %s\n", csv.c_str());
    return 1;
  }
  const std::string header = "label,M,N,K,granularity,formats,Check,snr_db,TFLOPS,TFLOPS_stddev,Time (ms),config";
  std::fprintf(out, "%s\n", header.c_str());
  std::vector<std::vector<std::string>> rows;
  int failed = 0;
  for (const Shape& s : all) {
    DeviceBuffer a, b, c;
    auto prepared = [&]() -> Result<void> {
      KILN_TRY(a.allocate(dev, static_cast<size_t>(s.M * s.K)));
      KILN_TRY(b.allocate(dev, static_cast<size_t>(s.N * s.K)));
      KILN_TRY(c.allocate(dev, static_cast<size_t>(s.M * s.N) * 2));
      KILN_TRY(fill(dev, a.ptr, s.M * s.K, table, kSaltA, s.a_e5m2));
      return fill(dev, b.ptr, s.N * s.K, table, kSaltB, false);
    }();
    if (!prepared) {
      std::fprintf(stderr, "%s: %s\n", s.label.c_str(), prepared.error().message.c_str());
      ++failed;
      continue;
    }
    for (int64_t gran : {kGranTensorwise, kGranRowwise, kGranBlockwise}) {
      const int64_t g = gran == kGranBlockwise && s.wgrad ? kGranBlock1x128 : gran;
      auto r = run_gran(runtime, s, g, table, a.ptr, b.ptr, c.ptr, flush, tune);
      if (!r) {
        std::fprintf(stderr, "%s %s: %s\n", s.label.c_str(), kGranNames[g], r.error().message.c_str());
        ++failed;
        continue;
      }
      if (r->check != "PASS") ++failed;
      const std::vector<std::string> cells = {s.label,
                                              std::to_string(s.M),
                                              std::to_string(s.N),
                                              std::to_string(s.K),
                                              kGranNames[g],
                                              s.a_e5m2 ? "e5m2xe4m3" : "e4m3xe4m3",
                                              r->check,
                                              fmt::format("{:.1f}", r->snr),
                                              fmt::format("{:.1f}", r->timing.tflops),
                                              fmt::format("{:.2f}", r->timing.stddev),
                                              fmt::format("{:.4f}", r->timing.median_ms),
                                              r->config};
      std::string line;
      for (size_t k = 0; k < cells.size(); ++k) line += (k ? "," : "") + cells[k];
      std::fprintf(out, "%s\n", line.c_str());
      std::fflush(out);
      std::fprintf(stderr, "%-32s %-10s %s snr %.1f dB  %.1f TFLOP/s (%.3f ms)\n", s.label.c_str(), kGranNames[g],
                   r->check.c_str(), r->snr, r->timing.tflops, r->timing.median_ms);
      rows.push_back(cells);
    }
  }
  std::fclose(out);
  kiln::bench::print_table(stdout, kiln::bench::split_header(header), rows);
  std::printf("device: %s; %zu rows written to %s; %d failed\n", dev.name().c_str(), rows.size(), csv.c_str(), failed);
  return failed ? 1 : 0;
}
