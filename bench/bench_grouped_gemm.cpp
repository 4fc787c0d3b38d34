// bench_grouped_gemm: Kiln's grouped_gemm (mode nt, the MoE forward y_g = x_g W_g^T) on the
// grouped-GEMM cases of ../shared/reference/BENCHMARKS.md, with balanced and skewed (Zipf) loads,
// in the BENCHMARKS.md GEMM format; bench/grouped_gemm_peers.py times torch._grouped_mm on the
// same group sizes (CSV.groups.json) in the same job and prints the ratios.
//
//   build/bench/bench_grouped_gemm OUT.csv [--quick | --models all|MODEL] [--tune] [--wgrad | --fp8]
//                                           # GPU; --list prints the cases
//
// Cases (bf16 in and out, fp32 accumulation; weights [G, N, K]):
//   Mixtral-8x7B gate_up / down, G 8, 16384 tokens; DeepSeek-V3 gate_up / down, G 32 local
//   experts, 32768 tokens; each with balanced loads (tokens split evenly) and Zipf loads
//   (exponent 1.2 over the experts, the last expert empty), as BENCHMARKS.md's peers.
//   --quick: the DeepSeek-V3 cases only.
//   --fp8: instead, the fp8 blockwise (e4m3) GEMMs of each case's MoE backward and forward, three
//   rows per case: fp8_fwd (nt), fp8_dgrad (nt with N and K swapped: b = W^T) and fp8_wgrad (tn
//   into fp32 over group-aligned 128-token panels, docs/grouped-gemm.md). Inputs: random e4m3
//   codes (finite), every scale 1/64; check as below against the fp64 product of the codes times
//   the scales (wgrad: 16 (group, row) pairs of c x 256 columns, over each group's whole panels).
//   No torch peer is timed for these rows (torch._grouped_mm has no blockwise fp8 form).
//   --models all|MODEL: instead, the sweep of models.json's "moe" section (every model, or one):
//   gate_up and down for each G of the model's list, tokens per group 512 .. 16384 (powers of
//   two), balanced and Zipf loads; issue 18's table.
//   --wgrad: after each bf16 forward row, the case's bf16 wgrad (row LABEL_wgrad): tn, dW[g] =
//   dy_g^T x_g into bf16 [G, N, K] with dy [tokens, N] and x [tokens, K] as a training step holds
//   them; checked on 16 (group, row) pairs of dW (the empty group's included) x 256 columns;
//   grouped_gemm_peers.py times torch._grouped_mm(dy.t(), x, offs) on it.
// Inputs: a fixed table of random bf16 values tiled over a and W (so that the check can recompute
// any element on the host), copied to the GPU once per size and reused as a prefix by smaller
// rows (TablePool); c poisoned with NaN. Check: 16 rows spread over the tokens (the last
// one included) x 256 columns against an fp64 reference, SNR > 40 dB, no
// non-finite value.
// Timing: device events around each launch, L2 evicted (a 256 MiB memset) before each, 1 warm-up,
// repetitions until about 300 ms of device time (5 .. 100); median. FLOPs 2 tokens N K.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_common.h"
#include "kiln/kiln.h"

namespace {
using kiln::Result;
using kiln::bench::DeviceBuffer;

struct Case {
  std::string label;
  int64_t groups, tokens, N, K;
  bool zipf;
  std::vector<int64_t> sizes;  // tokens per group
};

std::vector<int64_t> group_sizes(int64_t G, int64_t tokens, bool zipf) {
  std::vector<int64_t> sizes(static_cast<size_t>(G), tokens / G);
  if (!zipf) {
    for (int64_t g = 0; g < tokens % G; ++g) ++sizes[g];
    return sizes;
  }
  // Zipf, exponent 1.2, over the first G - 1 experts (the last stays empty).
  std::vector<double> w(static_cast<size_t>(G), 0.0);
  double total = 0;
  for (int64_t g = 0; g + 1 < G || G == 1; ++g) {
    w[g] = 1.0 / std::pow(static_cast<double>(g + 1), 1.2);
    total += w[g];
    if (G == 1) break;
  }
  int64_t used = 0;
  for (int64_t g = 0; g < G; ++g) {
    sizes[g] = static_cast<int64_t>(static_cast<double>(tokens) * w[g] / total);
    used += sizes[g];
  }
  sizes[0] += tokens - used;
  return sizes;
}

// --models: the grouped-GEMM sweep of models.json's "moe" section (copied here from
// models/models.json): each model's gate_up and down (N x K), each G of its experts-per-rank list,
// tokens per group M in {512, ..., 16384} (tokens = M G), balanced and Zipf loads (one group:
// balanced only). `only`: one model's name, or empty for all.
std::vector<Case> model_cases(const std::string& only) {
  struct Model {
    const char* name;
    std::vector<int64_t> G;
    int64_t gate_up[2], down[2];
  };
  const Model models[] = {{"deepseek-v3", {8, 16, 32}, {4096, 7168}, {7168, 2048}},
                          {"deepseek-v2-lite", {2, 4, 8}, {2816, 2048}, {2048, 1408}},
                          {"mixtral-8x7b", {1}, {28672, 4096}, {4096, 14336}},
                          {"qwen3-235b-a22b", {4, 8, 16}, {8192, 4096}, {4096, 4096}}};
  std::vector<Case> out;
  for (const Model& m : models) {
    if (!only.empty() && only != m.name) continue;
    // Largest first (G and M descending): the operands' table pools fill once per model.
    for (auto g = m.G.rbegin(); g != m.G.rend(); ++g)
      for (int proj = 0; proj < 2; ++proj)
        for (int64_t M = 16384; M >= 512; M /= 2)
          for (bool zipf : {false, true}) {
            const int64_t G = *g;
            if (zipf && G == 1) continue;  // one group: Zipf loads are the balanced ones
            const int64_t* nk = proj == 0 ? m.gate_up : m.down;
            out.push_back({fmt::format("{}_{}_G{}_M{}_{}", m.name, proj == 0 ? "gate_up" : "down", G, M,
                                       zipf ? "zipf" : "balanced"),
                           G, M * G, nk[0], nk[1], zipf, group_sizes(G, M * G, zipf)});
          }
  }
  return out;
}

std::vector<Case> cases(bool quick) {
  struct Shape {
    const char* name;
    int64_t G, tokens, N, K;
  };
  const Shape shapes[] = {{"mixtral-8x7b_gate_up", 8, 16384, 28672, 4096},
                          {"mixtral-8x7b_down", 8, 16384, 4096, 14336},
                          {"deepseek-v3_gate_up", 32, 32768, 4096, 7168},
                          {"deepseek-v3_down", 32, 32768, 7168, 2048}};
  std::vector<Case> out;
  for (const Shape& s : shapes) {
    if (quick && std::string(s.name).rfind("deepseek", 0) != 0) continue;
    for (bool zipf : {false, true})
      out.push_back({fmt::format("{}_G{}_{}", s.name, s.G, zipf ? "zipf" : "balanced"), s.G, s.tokens, s.N, s.K, zipf,
                     group_sizes(s.G, s.tokens, zipf)});
  }
  return out;
}

// The value of element i of a tensor: a table of 1,000,003 random bf16 values (as bits), tiled;
// `salt` shifts the tiling so that a and W differ.
struct Table {
  std::vector<uint16_t> bits;
  explicit Table(uint64_t seed) : bits(1000003) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> d(-1.0f, 1.0f);
    for (uint16_t& b : bits) {
      float x;
      do x = d(rng);
      while (x == 0.0f);
      uint32_t u;
      std::memcpy(&u, &x, 4);
      b = static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);  // round to nearest even
    }
  }
  uint16_t at(int64_t i, int64_t salt) const { return bits[static_cast<size_t>((i + salt) % 1000003)]; }
  static double value(uint16_t b) {
    const uint32_t u = static_cast<uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

Result<void> fill(kiln::Device& dev, void* dst, int64_t n, const Table& t, int64_t salt) {
  constexpr int64_t kChunk = int64_t{1} << 24;
  std::vector<uint16_t> stage;
  for (int64_t off = 0; off < n; off += kChunk) {
    const int64_t len = std::min(kChunk, n - off);
    stage.resize(static_cast<size_t>(len));
    for (int64_t i = 0; i < len; ++i) stage[static_cast<size_t>(i)] = t.at(off + i, salt);
    KILN_TRY(dev.copy_to_device(static_cast<uint16_t*>(dst) + off, stage.data(), static_cast<size_t>(len) * 2));
  }
  return kiln::ok();
}

struct Row {
  std::string check = "-";
  double snr = 0;
  kiln::bench::Timing timing;
};

// A device copy of the table's values from element 0 on (`salt` fixed), grown on demand: element i
// of any tensor filled from the table is the same whatever its shape, so a row reuses the prefix
// that earlier (larger or equal) rows filled instead of copying gigabytes from the host again (the
// --models sweep's largest operands hold 3.8 G elements).
struct TablePool {
  int64_t salt = 0;
  DeviceBuffer buf;
  int64_t filled = 0;
  Result<void*> get(kiln::Device& dev, int64_t n, const Table& table) {
    if (n > filled) {
      filled = 0;
      KILN_TRY(buf.allocate(dev, static_cast<size_t>(n) * 2));
      KILN_TRY(fill(dev, buf.ptr, n, table, salt));
      filled = n;
    }
    return buf.ptr;
  }
};

// The 40 dB check of a row's sampled outputs against their fp64 references: every value finite.
struct Snr {
  double sig = 0, err = 0;
  bool finite = true;
  void add(double x, double ref) {
    if (!std::isfinite(x)) finite = false;
    sig += ref * ref;
    err += (x - ref) * (x - ref);
  }
  void verdict(Row& row) const {
    row.snr = err > 0 ? 10 * std::log10(sig / err) : 200;
    row.check = finite && row.snr > 40 ? "PASS" : "FAIL";
  }
};

// The case's group offsets [G + 1] (its sizes summed), copied to the device buffer `off`.
Result<std::vector<int32_t>> upload_offsets(kiln::Device& dev, const DeviceBuffer& off, const Case& c) {
  std::vector<int32_t> offsets(static_cast<size_t>(c.groups + 1), 0);
  for (int64_t g = 0; g < c.groups; ++g) offsets[g + 1] = offsets[g] + static_cast<int32_t>(c.sizes[g]);
  KILN_TRY(dev.copy_to_device(off.ptr, offsets.data(), offsets.size() * 4));
  return offsets;
}

constexpr int64_t kSaltA = 0, kSaltW = 499979;
constexpr size_t kFlushBytes = size_t{256} << 20;

Result<Row> run_case(kiln::Runtime& rt, const Case& c, const Table& table, TablePool& pool_a, TablePool& pool_w,
                     DeviceBuffer& flush, bool tune) {
  kiln::Device& dev = *rt.device();
  const kiln::KernelSpec spec{"grouped_gemm", kiln::DType::bf16, kiln::DType::bf16,
                              {{"mode", 0}, {"groups", c.groups}, {"N", c.N}, {"K", c.K}, {"tokens", c.tokens}}};
  if (tune) KILN_TRY(kiln::bench::tune_and_print(rt, spec, c.label));  // on the op's own random group sizes
  KILN_ASSIGN_OR_RETURN(auto kernel, rt.kernel(spec));
  DeviceBuffer off, out;
  KILN_ASSIGN_OR_RETURN(void* const a, pool_a.get(dev, c.tokens * c.K, table));
  KILN_ASSIGN_OR_RETURN(void* const w, pool_w.get(dev, c.groups * c.N * c.K, table));
  KILN_TRY(off.allocate(dev, static_cast<size_t>(c.groups + 1) * 4));
  KILN_TRY(out.allocate(dev, static_cast<size_t>(c.tokens * c.N) * 2));
  KILN_ASSIGN_OR_RETURN(const std::vector<int32_t> offsets, upload_offsets(dev, off, c));
  KILN_TRY(out.poison());
  const std::vector<void*> buffers = {a, w, off.ptr, out.ptr};
  auto launch = [&]() -> Result<void> { return kernel->launch(spec, buffers); };
  KILN_TRY(launch());
  KILN_TRY(dev.synchronize(nullptr));

  // Check: 16 rows spread over the tokens, 256 columns spread over N, fp64.
  Row row;
  Snr snr;
  std::vector<uint16_t> got(static_cast<size_t>(c.N));
  for (int s = 0; s < 16; ++s) {
    const int64_t t = s == 15 ? c.tokens - 1 : s * (c.tokens / 16) + s;
    int64_t g = 0;
    while (g + 1 < c.groups && offsets[g + 1] <= t) ++g;
    KILN_TRY(dev.copy_to_host(got.data(), static_cast<const uint16_t*>(out.ptr) + t * c.N, got.size() * 2));
    for (int64_t j = 0; j < std::min<int64_t>(c.N, 256); ++j) {
      const int64_t n = c.N <= 256 ? j : j * (c.N / 256) + j % 7;
      double ref = 0;
      for (int64_t k = 0; k < c.K; ++k)
        ref += Table::value(table.at(t * c.K + k, kSaltA)) * Table::value(table.at((g * c.N + n) * c.K + k, kSaltW));
      snr.add(Table::value(got[static_cast<size_t>(n)]), ref);
    }
  }
  snr.verdict(row);

  KILN_ASSIGN_OR_RETURN(row.timing, kiln::bench::time_flushed(dev, flush, launch,
                                                               2.0 * double(c.tokens) * double(c.N) * double(c.K), 100));
  return row;
}

// The bf16 wgrad (--wgrad): dW[g] = dy_g^T x_g, tn, into bf16 c [G, N, K].
Result<Row> run_wgrad_case(kiln::Runtime& rt, const Case& c, const Table& table, TablePool& pool_a,
                           TablePool& pool_w, DeviceBuffer& flush, bool tune) {
  kiln::Device& dev = *rt.device();
  const int64_t G = c.groups, T = c.tokens, N = c.N, K = c.K;
  const kiln::KernelSpec spec{"grouped_gemm", kiln::DType::bf16, kiln::DType::bf16,
                              {{"mode", 2}, {"groups", G}, {"N", N}, {"K", K}, {"tokens", T}}};
  if (tune) KILN_TRY(kiln::bench::tune_and_print(rt, spec, c.label + "_wgrad"));
  KILN_ASSIGN_OR_RETURN(auto kernel, rt.kernel(spec));
  DeviceBuffer off, dw;
  KILN_ASSIGN_OR_RETURN(void* const dy, pool_a.get(dev, T * N, table));  // dy's values: the table with a's salt
  KILN_ASSIGN_OR_RETURN(void* const x, pool_w.get(dev, T * K, table));   // x's: with W's
  KILN_TRY(off.allocate(dev, static_cast<size_t>(G + 1) * 4));
  KILN_TRY(dw.allocate(dev, static_cast<size_t>(G * N * K) * 2));
  KILN_ASSIGN_OR_RETURN(const std::vector<int32_t> offsets, upload_offsets(dev, off, c));
  KILN_TRY(dw.poison());
  const std::vector<void*> buffers = {dy, x, off.ptr, dw.ptr};
  auto launch = [&]() -> Result<void> { return kernel->launch(spec, buffers); };
  KILN_TRY(launch());
  KILN_TRY(dev.synchronize(nullptr));

  // Check: 16 (group, row n) pairs of dW (the last group, empty under Zipf loads, included) x 256
  // columns spread over K, fp64 over the group's tokens.
  Row row;
  Snr snr;
  std::vector<uint16_t> got(static_cast<size_t>(K));
  for (int s = 0; s < 16; ++s) {
    const int64_t g = s == 15 ? G - 1 : (s * G) / 16, n = s == 15 ? N - 1 : (s * 7919) % N;
    KILN_TRY(dev.copy_to_host(got.data(), static_cast<const uint16_t*>(dw.ptr) + (g * N + n) * K, got.size() * 2));
    for (int64_t j = 0; j < std::min<int64_t>(K, 256); ++j) {
      const int64_t k = K <= 256 ? j : j * (K / 256) + j % 7;
      double ref = 0;
      for (int64_t t = offsets[g]; t < offsets[g + 1]; ++t)
        ref += Table::value(table.at(t * N + n, kSaltA)) * Table::value(table.at(t * K + k, kSaltW));
      snr.add(Table::value(got[static_cast<size_t>(k)]), ref);
    }
  }
  snr.verdict(row);
  KILN_ASSIGN_OR_RETURN(row.timing,
                        kiln::bench::time_flushed(dev, flush, launch, 2.0 * double(T) * double(N) * double(K), 100));
  return row;
}

// ---- fp8 blockwise rows (--fp8) ------------------------------------------------------------
enum class Fp8Pass { fwd, dgrad, wgrad };
constexpr float kFp8Scale = 1.0f / 64;

// A table of 1,000,003 random finite fp8 codes of `t`, tiled like Table.
struct Fp8Table {
  std::vector<uint8_t> codes;
  Fp8Table(uint64_t seed, kiln::DType t) : codes(1000003) {
    std::mt19937_64 rng(seed);
    for (uint8_t& b : codes) {
      do b = static_cast<uint8_t>(rng() & 0xff);
      while (!std::isfinite(kiln::fp8_bits_to_float(b, t)));
    }
  }
  uint8_t at(int64_t i, int64_t salt) const { return codes[static_cast<size_t>((i + salt) % 1000003)]; }
};

Result<void> fill_fp8(kiln::Device& dev, void* dst, int64_t n, const Fp8Table& t, int64_t salt) {
  constexpr int64_t kChunk = int64_t{1} << 24;
  std::vector<uint8_t> stage;
  for (int64_t off = 0; off < n; off += kChunk) {
    const int64_t len = std::min(kChunk, n - off);
    stage.resize(static_cast<size_t>(len));
    for (int64_t i = 0; i < len; ++i) stage[static_cast<size_t>(i)] = t.at(off + i, salt);
    KILN_TRY(dev.copy_to_device(static_cast<uint8_t*>(dst) + off, stage.data(), static_cast<size_t>(len)));
  }
  return kiln::ok();
}

Result<void> fill_scales(kiln::Device& dev, void* dst, int64_t n) {
  const std::vector<float> v(static_cast<size_t>(n), kFp8Scale);
  return dev.copy_to_device(dst, v.data(), v.size() * 4);
}

Result<Row> run_fp8_case(kiln::Runtime& rt, const Case& c, Fp8Pass pass, DeviceBuffer& flush) {
  kiln::Device& dev = *rt.device();
  const kiln::DType e4 = kiln::fp8_for_target(kiln::DType::e4m3, dev.target());
  const bool wgrad = pass == Fp8Pass::wgrad;
  const int64_t G = c.groups, T = c.tokens, N = pass == Fp8Pass::dgrad ? c.K : c.N,
                K = pass == Fp8Pass::dgrad ? c.N : c.K;
  const int64_t P = (T + 127) / 128 + G, KB = (K + 127) / 128, NB = (N + 127) / 128;
  const kiln::KernelSpec spec{"grouped_gemm", e4, wgrad ? kiln::DType::f32 : kiln::DType::bf16,
                              {{"mode", wgrad ? 2 : 0}, {"groups", G}, {"N", N}, {"K", K}, {"tokens", T}}};
  KILN_ASSIGN_OR_RETURN(auto kernel, rt.kernel(spec));
  const int64_t a_n = wgrad ? P * N * 128 : T * K, b_n = wgrad ? P * K * 128 : G * N * K;
  const int64_t sa_n = wgrad ? P * N : T * KB, sb_n = wgrad ? P * K : G * NB * KB;
  const int64_t c_bytes = wgrad ? G * N * K * 4 : T * N * 2;
  const Fp8Table table(20261127, e4);
  DeviceBuffer a, b, off, sa, sb, out;
  KILN_TRY(a.allocate(dev, static_cast<size_t>(a_n)));
  KILN_TRY(b.allocate(dev, static_cast<size_t>(b_n)));
  KILN_TRY(off.allocate(dev, static_cast<size_t>(G + 1) * 4));
  KILN_TRY(sa.allocate(dev, static_cast<size_t>(sa_n) * 4));
  KILN_TRY(sb.allocate(dev, static_cast<size_t>(sb_n) * 4));
  KILN_TRY(out.allocate(dev, static_cast<size_t>(c_bytes)));
  KILN_TRY(fill_fp8(dev, a.ptr, a_n, table, kSaltA));
  KILN_TRY(fill_fp8(dev, b.ptr, b_n, table, kSaltW));
  KILN_TRY(fill_scales(dev, sa.ptr, sa_n));
  KILN_TRY(fill_scales(dev, sb.ptr, sb_n));
  KILN_ASSIGN_OR_RETURN(const std::vector<int32_t> offsets, upload_offsets(dev, off, c));
  KILN_TRY(out.poison());
  const std::vector<void*> buffers = {a.ptr, b.ptr, off.ptr, sa.ptr, sb.ptr, out.ptr};
  auto launch = [&]() -> Result<void> { return kernel->launch(spec, buffers); };
  KILN_TRY(launch());
  KILN_TRY(dev.synchronize(nullptr));

  auto code = [&](int64_t i, int64_t salt) { return double(kiln::fp8_bits_to_float(table.at(i, salt), e4)); };
  const double s2 = double(kFp8Scale) * double(kFp8Scale);
  Row row;
  Snr snr;
  if (!wgrad) {  // 16 rows spread over the tokens x 256 columns
    std::vector<uint16_t> got(static_cast<size_t>(N));
    for (int s = 0; s < 16; ++s) {
      const int64_t t = s == 15 ? T - 1 : s * (T / 16) + s;
      int64_t g = 0;
      while (g + 1 < G && offsets[g + 1] <= t) ++g;
      KILN_TRY(dev.copy_to_host(got.data(), static_cast<const uint16_t*>(out.ptr) + t * N, got.size() * 2));
      for (int64_t j = 0; j < std::min<int64_t>(N, 256); ++j) {
        const int64_t n = N <= 256 ? j : j * (N / 256) + j % 7;
        double ref = 0;
        for (int64_t k = 0; k < K; ++k) ref += code(t * K + k, kSaltA) * code((g * N + n) * K + k, kSaltW);
        snr.add(Table::value(got[static_cast<size_t>(n)]), ref * s2);
      }
    }
  } else {  // 16 (group, row) pairs over the non-empty groups x 256 columns, each group's whole panels
    std::vector<int64_t> nonempty;
    for (int64_t g = 0; g < G; ++g)
      if (c.sizes[g] > 0) nonempty.push_back(g);
    std::vector<float> got(static_cast<size_t>(K));
    for (int s = 0; s < 16 && !nonempty.empty(); ++s) {
      const int64_t g = nonempty[static_cast<size_t>(s) % nonempty.size()], n = (s * 7919) % N;
      const int64_t p0 = offsets[g] / 128 + g, panels = (c.sizes[g] + 127) / 128;
      KILN_TRY(dev.copy_to_host(got.data(), static_cast<const float*>(out.ptr) + (g * N + n) * K, got.size() * 4));
      for (int64_t j = 0; j < std::min<int64_t>(K, 256); ++j) {
        const int64_t k = K <= 256 ? j : j * (K / 256) + j % 7;
        double ref = 0;
        for (int64_t p = p0; p < p0 + panels; ++p)
          for (int64_t t = 0; t < 128; ++t) ref += code((p * N + n) * 128 + t, kSaltA) * code((p * K + k) * 128 + t, kSaltW);
        snr.add(got[static_cast<size_t>(k)], ref * s2);
      }
    }
  }
  snr.verdict(row);
  KILN_ASSIGN_OR_RETURN(row.timing,
                        kiln::bench::time_flushed(dev, flush, launch, 2.0 * double(T) * double(N) * double(K), 100));
  return row;
}
}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Kiln grouped_gemm (MoE forward) on the BENCHMARKS.md grouped-GEMM cases"};
  std::string csv;
  bool quick = false, list = false, tune = false, fp8 = false, wgrad = false;
  std::string models;
  app.add_option("csv", csv, "Output CSV (group sizes in CSV.groups.json)");
  app.add_flag("--quick", quick, "The DeepSeek-V3 cases only");
  app.add_flag("--list", list, "Print the cases and exit");
  app.add_flag("--tune", tune, "Time every tuning candidate first (Runtime::tune) and print them");
  app.add_flag("--fp8", fp8, "The fp8 blockwise forward, dgrad and wgrad of each case instead (Kiln only)");
  app.add_flag("--wgrad", wgrad, "After each bf16 forward row, the case's bf16 wgrad (tn) row");
  app.add_option("--models", models,
                 "Instead of BENCHMARKS.md's cases, models.json's sweep: 'all', or one model (deepseek-v3, "
                 "deepseek-v2-lite, mixtral-8x7b, qwen3-235b-a22b)");
  CLI11_PARSE(app, argc, argv);
  const std::vector<Case> all = models.empty() ? cases(quick) : model_cases(models == "all" ? "" : models);
  if (all.empty()) {
    std::fprintf(stderr, "bench_grouped_gemm: --models %s names no model of models.json's moe section\n",
                 models.c_str());
    return 2;
  }
  if (list) {
    for (const Case& c : all)
      std::printf("%-40s G=%-3lld tokens=%-6lld N=%-6lld K=%-6lld largest group %lld\n", c.label.c_str(),
                  (long long)c.groups, (long long)c.tokens, (long long)c.N, (long long)c.K,
                  (long long)*std::max_element(c.sizes.begin(), c.sizes.end()));
    return 0;
  }
  if (csv.empty()) {
    std::fprintf(stderr, "bench_grouped_gemm: give the output CSV; --help\n");
    return 2;
  }
  auto rt = kiln::Runtime::create();
  if (!rt || !(*rt)->device()) {
    std::fprintf(stderr, "bench_grouped_gemm: no GPU (%s)\n", rt ? "the runtime has no device" : rt.error().message.c_str());
    return 77;
  }
  kiln::Runtime& runtime = **rt;
  DeviceBuffer flush;
  if (auto r = flush.allocate(*runtime.device(), kFlushBytes); !r) {
    std::fprintf(stderr, "bench_grouped_gemm: %s\n", r.error().message.c_str());
    return 1;
  }
  const Table table(20261126);
  TablePool pool_a, pool_w;  // a and dy; W and x
  pool_a.salt = kSaltA;
  pool_w.salt = kSaltW;
  std::FILE* out = std::fopen(csv.c_str(), "w");
  std::ofstream groups(csv + ".groups.json");
  if (!out || !groups) {
    std::fprintf(stderr, "bench_grouped_gemm: cannot write %s\n", csv.c_str());
    return 1;
  }
  const std::string header = "label,G,tokens,N,K,loads,Check,snr_db,TFLOPS,TFLOPS_stddev,Time (ms)";
  std::fprintf(out, "%s\n", header.c_str());
  groups << "{";
  std::vector<std::vector<std::string>> rows;
  int failed = 0;
  // Each case once (bf16 forward; then its bf16 wgrad with --wgrad), or three times with --fp8
  // (forward, dgrad, wgrad).
  struct Run {
    size_t index;
    int pass;  // -1: bf16; -2: bf16 wgrad; else Fp8Pass
  };
  std::vector<Run> runs;
  for (size_t i = 0; i < all.size(); ++i) {
    for (int p = fp8 ? 0 : -1; p < (fp8 ? 3 : 0); ++p) runs.push_back({i, p});
    if (wgrad && !fp8) runs.push_back({i, -2});
  }
  for (const Run& run : runs) {
    const Case& c = all[run.index];
    if (run.pass == 0 || run.pass == -1) {
      groups << (run.index ? ",\n" : "\n") << "\"" << c.label << "\": [";
      for (size_t g = 0; g < c.sizes.size(); ++g) groups << (g ? ", " : "") << c.sizes[g];
      groups << "]";
    }
    static const char* const kPass[] = {"fp8_fwd", "fp8_dgrad", "fp8_wgrad"};
    const std::string label = run.pass == -1 ? c.label : run.pass == -2 ? c.label + "_wgrad" : c.label + "_" + kPass[run.pass];
    const bool dgrad = run.pass == static_cast<int>(Fp8Pass::dgrad);
    auto r = run.pass == -1   ? run_case(runtime, c, table, pool_a, pool_w, flush, tune)
             : run.pass == -2 ? run_wgrad_case(runtime, c, table, pool_a, pool_w, flush, tune)
                              : run_fp8_case(runtime, c, static_cast<Fp8Pass>(run.pass), flush);
    if (!r) {
      std::fprintf(stderr, "%s: %s\n", label.c_str(), r.error().message.c_str());
      ++failed;
      continue;
    }
    if (r->check != "PASS") ++failed;
    const std::vector<std::string> cells = {label,
                                            std::to_string(c.groups),
                                            std::to_string(c.tokens),
                                            std::to_string(dgrad ? c.K : c.N),
                                            std::to_string(dgrad ? c.N : c.K),
                                            c.zipf ? "zipf" : "balanced",
                                            r->check,
                                            fmt::format("{:.1f}", r->snr),
                                            fmt::format("{:.1f}", r->timing.tflops),
                                            fmt::format("{:.2f}", r->timing.stddev),
                                            fmt::format("{:.4f}", r->timing.median_ms)};
    std::string line;
    for (size_t k = 0; k < cells.size(); ++k) line += (k ? "," : "") + cells[k];
    std::fprintf(out, "%s\n", line.c_str());
    std::fflush(out);
    std::printf("%-40s %s snr %.1f dB  %.1f TFLOP/s (%.3f ms)\n", label.c_str(), r->check.c_str(), r->snr,
                r->timing.tflops, r->timing.median_ms);
    rows.push_back(cells);
  }
  groups << "\n}\n";
  std::fclose(out);
  std::printf("\n");
  kiln::bench::print_table(stdout, kiln::bench::split_header(header), rows);
  std::printf("device: %s; %zu rows written to %s; %d failed\n", runtime.device()->name().c_str(), rows.size(),
              csv.c_str(), failed);
  return failed ? 1 : 0;
}
