// Dense GEMMs of real models on the GPU, Kiln against cuBLAS in the same run on the same tensors
// (the benchmark of "GEMM at cuBLAS speed on Hopper"). For every (model, micro-batch, GEMM):
//   forward   y[M,N]  = x[M,K] @ W[N,K]^T    Kiln gemm {M, N, K, trans_a=0, trans_b=1}   2MNK FLOPs
//   dgrad     dx[M,K] = dy[M,N] @ W[N,K]     Kiln gemm {M, K, N, trans_a=0, trans_b=0}
//   wgrad     dW[N,K] = dy[M,N]^T @ x[M,K]   Kiln gemm {N, K, M, trans_a=1, trans_b=0}
//   backward  = dgrad + wgrad, timed together                                          4MNK FLOPs
// with (N, K) from shared/reference/models.json (qkv, attn_out, gate_up, down, lm_head) and
// M = seq * micro_batch. bf16 inputs and outputs, fp32 accumulation; cuBLAS runs cublasGemmEx
// (CUDA_R_16BF, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) on the same device buffers.
//
// Per shape: fresh random bf16 inputs (uniform [-1, 1], W scaled by 1/sqrt(K)), outputs poisoned
// with 0xFF (NaN) before each checked launch, sampled output rows of all three GEMMs compared with
// the float64 CPU reference (kiln::reference) under the bf16 gate of BENCHMARKS.md, then 1
// warm-up and --reps timed repetitions (device events; the median time is reported, the stddev
// is that of the per-repetition TFLOP/s). A repetition times --batch back-to-back launches (default
// 1) and divides by the count: --batch 20 measures sustained throughput, with the clocks the
// card holds under continuous load, instead of single launches after an idle gap. Shapes that recur across models (Mistral-7B mb2 and
// Llama-3.1-8B mb1, ...) run once and are reported under every label.
//
// Output (BENCHMARKS.md "Benchmark report format"): the Kiln rows as a table on stdout and as
// OUT/gemm_report.csv, the cuBLAS rows (label "cublas:...", their own Check and SNRs) as
// OUT/gemm_report_cublas.csv, then the Kiln/cuBLAS ratio per row (also OUT/gemm_ratio.csv) and
// the geometric means (a FAIL row counts as zero). The CSVs are rewritten after every shape, so
// an interrupted run keeps what it finished. Progress goes to stderr.
//
//   build/bench/bench_gemm --out out/gemm                                   # all 5 models, mb 1,2
//   build/bench/bench_gemm --models llama3.1-8b --micro-batch 1 --out out/g  # 5 shapes
//   build/bench/bench_gemm --mapping-test       # the cuBLAS row-major mapping, emulated on the CPU
//
// Skips (exit 0) with a message when there is no NVIDIA GPU.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <limits>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_common.h"
#include "kiln/kiln.h"

namespace {

using kiln::DType;
using kiln::Result;

// ---- shapes ------------------------------------------------------------------------------------

/// The dense models of shared/reference/models.json that the benchmark covers.
struct Model {
  const char* name;
  int64_t hidden, intermediate, heads, kv_heads, head_dim, vocab, seq;
};
constexpr Model kModels[] = {
    {"llama2-7b", 4096, 11008, 32, 32, 128, 32000, 4096},
    {"llama2-70b", 8192, 28672, 64, 8, 128, 32000, 4096},
    {"llama3.1-8b", 4096, 14336, 32, 8, 128, 128256, 8192},
    {"qwen2.5-7b", 3584, 18944, 28, 4, 128, 152064, 8192},
    {"mistral-7b", 4096, 14336, 32, 8, 128, 32000, 4096},
};

/// One report row: a model's forward GEMM y[M,N] = x[M,K] @ W[N,K]^T at one micro-batch.
struct Case {
  std::string label;  // "llama3.1-8b/qkv/mb1"
  int64_t mb, M, N, K;
};

/// One distinct (M, N, K), run once, reported under every case that has it.
struct Shape {
  int64_t M, N, K;
  std::vector<size_t> cases;
};

std::vector<Case> model_cases(const Model& m, int64_t mb) {
  const int64_t M = m.seq * mb;
  auto c = [&](const char* gemm, int64_t N, int64_t K) {
    return Case{fmt::format("{}/{}/mb{}", m.name, gemm, mb), mb, M, N, K};
  };
  return {c("qkv", (m.heads + 2 * m.kv_heads) * m.head_dim, m.hidden),
          c("attn_out", m.hidden, m.heads * m.head_dim),
          c("gate_up", 2 * m.intermediate, m.hidden),
          c("down", m.hidden, m.intermediate),
          c("lm_head", m.vocab, m.hidden)};
}

// ---- the three GEMMs of a layer, row-major, and their cuBLAS form --------------------------------

/// A row-major Kiln GEMM: C[M,N] = op(A) @ op(B); A is [M,K] ([K,M] if ta), B is [K,N] ([N,K] if tb).
struct Gemm {
  int64_t M, N, K;
  bool ta, tb;
};
enum Pass { kFwd = 0, kDgrad = 1, kWgrad = 2 };
constexpr const char* kPassName[] = {"forward", "dgrad", "wgrad"};

std::array<Gemm, 3> layer_gemms(int64_t M, int64_t N, int64_t K) {
  return {Gemm{M, N, K, false, true},    // y = x @ W^T
          Gemm{M, K, N, false, false},   // dx = dy @ W
          Gemm{N, K, M, true, false}};   // dW = dy^T @ x
}

kiln::KernelSpec gemm_spec(const Gemm& g) {
  return {"gemm", DType::bf16, DType::bf16,
          {{"M", g.M}, {"N", g.N}, {"K", g.K}, {"trans_a", g.ta}, {"trans_b", g.tb}}};
}

/// The cublasGemmEx arguments of a row-major GEMM. A row-major [r, c] matrix is, to column-major
/// BLAS, the [c, r] matrix with leading dimension c; so row-major C = op(A) op(B) is column-major
/// C^T (N x M, ldc = N) = op(B)^T op(A)^T, and cuBLAS gets the row-major B as its first operand
/// and the row-major A as its second:
///   first  operand: op(B)^T is N x K. tb = 0: B row-major [K,N] is column-major N x K, ld N: OP_N.
///                   tb = 1: B row-major [N,K] is column-major K x N, ld K: OP_T.
///   second operand: op(A)^T is K x M. ta = 0: A row-major [M,K] is column-major K x M, ld K: OP_N.
///                   ta = 1: A row-major [K,M] is column-major M x K, ld M: OP_T.
struct CublasCall {
  cublasOperation_t transa, transb;  // of the first (row-major B) and second (row-major A) operand
  int m, n, k, lda, ldb, ldc;
};

CublasCall cublas_call(const Gemm& g) {
  CublasCall c;
  c.transa = g.tb ? CUBLAS_OP_T : CUBLAS_OP_N;
  c.lda = static_cast<int>(g.tb ? g.K : g.N);
  c.transb = g.ta ? CUBLAS_OP_T : CUBLAS_OP_N;
  c.ldb = static_cast<int>(g.ta ? g.M : g.K);
  c.m = static_cast<int>(g.N);
  c.n = static_cast<int>(g.M);
  c.k = static_cast<int>(g.K);
  c.ldc = static_cast<int>(g.N);
  return c;
}

Result<void> cublas_check(cublasStatus_t st, const char* what) {
  if (st == CUBLAS_STATUS_SUCCESS) return kiln::ok();
  return kiln::make_error(kiln::Errc::driver_error,
                          fmt::format("{} failed: {} ({})", what, cublasGetStatusName(st), cublasGetStatusString(st)));
}

/// Row-major C = op(A) @ op(B) through cublasGemmEx, bf16 in/out, fp32 compute, on `handle`'s stream.
Result<void> cublas_gemm(cublasHandle_t handle, const Gemm& g, const void* A, const void* B, void* C) {
  const CublasCall c = cublas_call(g);
  const float alpha = 1.0f, beta = 0.0f;
  return cublas_check(cublasGemmEx(handle, c.transa, c.transb, c.m, c.n, c.k, &alpha, B, CUDA_R_16BF, c.lda, A,
                                   CUDA_R_16BF, c.ldb, &beta, C, CUDA_R_16BF, c.ldc, CUBLAS_COMPUTE_32F,
                                   CUBLAS_GEMM_DEFAULT),
                      "cublasGemmEx");
}

/// What cublasGemmEx computes for `c` (column-major, beta = 0), in float64 on the CPU:
/// C[i + j*ldc] = sum_l opA(i,l) * opB(l,j), opA(i,l) = A[i + l*lda] (OP_N) or A[l + i*lda] (OP_T).
void emulate_cublas(const CublasCall& c, const float* A, const float* B, std::vector<double>& C) {
  C.assign(static_cast<size_t>(c.ldc) * c.n, 0.0);
  for (int j = 0; j < c.n; ++j)
    for (int i = 0; i < c.m; ++i) {
      double s = 0;
      for (int l = 0; l < c.k; ++l) {
        const double a = c.transa == CUBLAS_OP_N ? A[i + int64_t{l} * c.lda] : A[l + int64_t{i} * c.lda];
        const double b = c.transb == CUBLAS_OP_N ? B[l + int64_t{j} * c.ldb] : B[j + int64_t{l} * c.ldb];
        s += a * b;
      }
      C[i + int64_t{j} * c.ldc] = s;
    }
}

// ---- host data ---------------------------------------------------------------------------------

uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/// Runs body(begin, end) over [0, n) in blocks of `block` on all cores; blocks are handed out in
/// order, so a body that seeds by block index gives the same result for any thread count.
template <class F>
void parallel_blocks(int64_t n, int64_t block, F&& body) {
  const int64_t blocks = (n + block - 1) / block;
  const int64_t threads = std::min<int64_t>(blocks, std::max(1u, std::thread::hardware_concurrency()));
  std::atomic<int64_t> next{0};
  auto worker = [&] {
    for (int64_t b; (b = next.fetch_add(1)) < blocks;) body(b, b * block, std::min(n, (b + 1) * block));
  };
  if (threads <= 1) return worker();
  std::vector<std::thread> pool;
  for (int64_t t = 0; t < threads; ++t) pool.emplace_back(worker);
  for (auto& t : pool) t.join();
}

/// n values uniform in [-scale, scale], rounded to bf16 (so the reference sees what the GPU sees),
/// never zero.
std::vector<float> random_bf16(int64_t n, double scale, uint64_t seed) {
  std::vector<float> v(static_cast<size_t>(n));
  parallel_blocks(n, int64_t{1} << 20, [&](int64_t b, int64_t begin, int64_t end) {
    uint64_t s = seed ^ (0x5851f42d4c957f2dull * static_cast<uint64_t>(b + 1));
    for (int64_t i = begin; i < end; ++i) {
      float f;
      do {
        const double u = static_cast<double>(splitmix64(s) >> 11) * 0x1.0p-53;  // [0, 1)
        f = kiln::round_to_dtype(static_cast<float>((2.0 * u - 1.0) * scale), DType::bf16);
      } while (f == 0.0f);
      v[static_cast<size_t>(i)] = f;
    }
  });
  return v;
}

using kiln::bench::DeviceBuffer;

/// Bytes of n bf16 elements.
size_t bf16_bytes(int64_t n) { return static_cast<size_t>(n) * 2; }

/// Copies bf16-exact floats to the device as bf16, in chunks.
Result<void> upload_bf16(kiln::Device& d, DeviceBuffer& dst, const std::vector<float>& v) {
  constexpr int64_t kChunk = int64_t{1} << 26;
  const int64_t n = static_cast<int64_t>(v.size());
  std::vector<uint16_t> bits(static_cast<size_t>(std::min(n, kChunk)));
  for (int64_t off = 0; off < n; off += kChunk) {
    const int64_t len = std::min(kChunk, n - off);
    parallel_blocks(len, int64_t{1} << 20, [&](int64_t, int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) bits[size_t(i)] = kiln::float_to_bf16_bits(v[size_t(off + i)]);
    });
    KILN_TRY(d.copy_to_device(static_cast<uint16_t*>(dst.ptr) + off, bits.data(), static_cast<size_t>(len) * 2));
  }
  return kiln::ok();
}

/// Rows `rows` of the row-major bf16 matrix at `C` with `cols` columns, as floats, row after row.
Result<std::vector<float>> fetch_rows(kiln::Device& d, const void* C, int64_t cols, const std::vector<int64_t>& rows) {
  std::vector<uint16_t> bits(static_cast<size_t>(cols));
  std::vector<float> out;
  out.reserve(rows.size() * static_cast<size_t>(cols));
  for (int64_t r : rows) {
    KILN_TRY(d.copy_to_host(bits.data(), static_cast<const uint16_t*>(C) + r * cols, bits.size() * 2));
    for (uint16_t b : bits) out.push_back(kiln::bf16_bits_to_float(b));
  }
  return out;
}

/// `count` distinct rows of [0, rows): the first, the last and random ones, sorted (all if count >= rows).
std::vector<int64_t> sample_rows(int64_t rows, int64_t count, std::mt19937_64& rng) {
  std::vector<int64_t> s;
  if (count >= rows) {
    for (int64_t r = 0; r < rows; ++r) s.push_back(r);
    return s;
  }
  s.push_back(0);
  if (count > 1) s.push_back(rows - 1);
  std::uniform_int_distribution<int64_t> pick(0, rows - 1);
  while (static_cast<int64_t>(s.size()) < count) {
    const int64_t r = pick(rng);
    if (std::find(s.begin(), s.end(), r) == s.end()) s.push_back(r);
  }
  std::sort(s.begin(), s.end());
  return s;
}

/// kiln::reference of `rows` of `g` from its two inputs, rows in parallel.
Result<std::vector<double>> reference_rows(const Gemm& g, std::span<const std::vector<float>> inputs,
                                           const std::vector<int64_t>& rows) {
  const kiln::KernelSpec spec = gemm_spec(g);
  std::vector<double> ref(rows.size() * static_cast<size_t>(g.N));
  std::vector<Result<void>> status(rows.size(), kiln::ok());
  std::vector<std::thread> pool;
  for (size_t i = 0; i < rows.size(); ++i)
    pool.emplace_back([&, i] {
      auto one = kiln::reference(spec, {}, inputs, std::span<const int64_t>(&rows[i], 1));
      if (!one) {
        status[i] = one.take_error();
        return;
      }
      const std::vector<double>& v = one->front().values;
      std::copy(v.begin(), v.end(), ref.begin() + static_cast<ptrdiff_t>(i * g.N));
    });
  for (auto& t : pool) t.join();
  for (auto& s : status)
    if (!s) return s.take_error();
  return ref;
}

// ---- accuracy ----------------------------------------------------------------------------------

struct Accuracy {
  bool checked = false;
  bool pass = false;
  int64_t compared = 0, nonfinite = 0, gate_failures = 0;
  double max_abs = 0, rel_fro = std::numeric_limits<double>::quiet_NaN();
  double snr_db = std::numeric_limits<double>::quiet_NaN();  // NaN when an output is not finite
};

/// The bf16 gate of BENCHMARKS.md: |err| <= 1e-2 + 1e-2|ref| for every element and relative
/// Frobenius error < 1e-2; SNR = 10 log10(||ref||^2 / ||ref - out||^2).
Accuracy compare(const std::vector<double>& ref, const std::vector<float>& got) {
  Accuracy a;
  a.checked = true;
  double err_sq = 0, ref_sq = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    ++a.compared;
    if (!std::isfinite(got[i])) {
      ++a.nonfinite;
      continue;
    }
    const double err = std::fabs(double(got[i]) - ref[i]);
    a.max_abs = std::max(a.max_abs, err);
    if (err > 1e-2 + 1e-2 * std::fabs(ref[i])) ++a.gate_failures;
    err_sq += err * err;
    ref_sq += ref[i] * ref[i];
  }
  a.rel_fro = ref_sq > 0 ? std::sqrt(err_sq / ref_sq) : std::sqrt(err_sq);
  if (a.nonfinite == 0) a.snr_db = err_sq > 0 ? 10.0 * std::log10(ref_sq / err_sq) : 999.0;
  a.pass = a.nonfinite == 0 && a.gate_failures == 0 && a.rel_fro < 1e-2;
  return a;
}

std::string describe(const Accuracy& a) {
  if (!a.checked) return "not checked";
  return fmt::format("{} snr {:.1f} dB, rel_fro {:.2e}, max_abs {:.2e}, outside gate {}, nonfinite {} of {}",
                     a.pass ? "PASS" : "FAIL", a.snr_db, a.rel_fro, a.max_abs, a.gate_failures, a.nonfinite,
                     a.compared);
}

// ---- results -----------------------------------------------------------------------------------

using kiln::bench::summarize;
using kiln::bench::Timing;

/// One implementation's result on one shape.
struct Side {
  bool ran = false;     // false: kernel unavailable (error says why)
  std::string error;
  std::array<Accuracy, 3> acc;
  std::vector<double> fwd_ms, bwd_ms;
  bool pass() const {
    return ran && acc[kFwd].pass && acc[kDgrad].pass && acc[kWgrad].pass;
  }
};

struct ShapeResult {
  bool done = false;
  Side kiln, cublas;
  double seconds = 0;
};

const std::vector<std::string> kColumns = {
    "label", "B", "M", "N", "K", "Check", "Forward TFLOPS", "Forward TFLOPS_stddev", "Backward TFLOPS",
    "Backward TFLOPS_stddev", "Forward Time (ms)", "Backward Time (ms)", "out_snr", "da_snr", "db_snr"};

std::string fmt_snr(const Accuracy& a) { return std::isnan(a.snr_db) ? "nan" : fmt::format("{:.1f}", a.snr_db); }

std::vector<std::string> report_row(const std::string& label, const Case& c, const Side& s) {
  const double flops = 2.0 * double(c.M) * double(c.N) * double(c.K);
  const Timing f = summarize(s.fwd_ms, flops), b = summarize(s.bwd_ms, 2 * flops);
  return {label,
          std::to_string(c.mb),
          std::to_string(c.M),
          std::to_string(c.N),
          std::to_string(c.K),
          s.pass() ? "PASS" : "FAIL",
          fmt::format("{:.2f}", f.tflops),
          fmt::format("{:.2f}", f.stddev),
          fmt::format("{:.2f}", b.tflops),
          fmt::format("{:.2f}", b.stddev),
          fmt::format("{:.4f}", f.median_ms),
          fmt::format("{:.4f}", b.median_ms),
          fmt_snr(s.acc[kFwd]),
          fmt_snr(s.acc[kDgrad]),
          fmt_snr(s.acc[kWgrad])};
}

using kiln::bench::print_table;

Result<void> write_csv(const std::filesystem::path& path, const std::vector<std::string>& header,
                       const std::vector<std::vector<std::string>>& rows) {
  const auto tmp = path.string() + ".tmp";
  {
    std::ofstream f(tmp);
    auto line = [&](const std::vector<std::string>& r) {
      for (size_t i = 0; i < r.size(); ++i) f << (i ? "," : "") << r[i];
      f << '\n';
    };
    line(header);
    for (const auto& r : rows) line(r);
    if (!f) return kiln::make_error(kiln::Errc::io_error, fmt::format("cannot write {}", tmp));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return kiln::make_error(kiln::Errc::io_error, fmt::format("cannot write {}: {}", path.string(), ec.message()));
  return kiln::ok();
}

// ---- running -----------------------------------------------------------------------------------

struct Options {
  std::string out = "out";
  std::vector<std::string> models;
  std::vector<int64_t> micro_batch = {1, 2};
  int reps = 5;
  int batch = 1;
  int64_t max_rows = 0;
  int64_t check_rows = 4;
  int device = 0;
  uint64_t seed = 0;
  bool self_test = true;
  bool mapping_test = false;
};

struct Bench {
  Options opt;
  kiln::Runtime* rt = nullptr;
  kiln::Device* dev = nullptr;
  cublasHandle_t cublas = nullptr;
  std::mt19937_64 rng;
};

using Buffers = std::array<std::array<void*, 3>, 3>;  // per pass: A, B, C

/// Poisons the outputs, runs the three GEMMs once with `launch`, and fetches the sampled rows.
template <class Launch>
Result<std::array<std::vector<float>, 3>> checked_run(Bench& b, const std::array<Gemm, 3>& gemms, const Buffers& buf,
                                                      std::array<DeviceBuffer*, 3> outputs,
                                                      const std::array<std::vector<int64_t>, 3>& rows, Launch&& launch) {
  for (DeviceBuffer* o : outputs) KILN_TRY(o->poison());
  for (int p = 0; p < 3; ++p) KILN_TRY(launch(p));
  KILN_TRY(b.dev->synchronize(nullptr));
  std::array<std::vector<float>, 3> got;
  for (int p = 0; p < 3; ++p) {
    KILN_ASSIGN_OR_RETURN(got[p], fetch_rows(*b.dev, buf[p][2], gemms[p].N, rows[p]));
  }
  return got;
}

/// 1 warm-up, then `reps` repetitions of forward (one event pair) and backward (dgrad + wgrad,
/// one event pair).
template <class Launch>
Result<void> timed_runs(Bench& b, Side& side, Launch&& launch) {
  const int batch = b.opt.batch;
  auto fwd = [&]() -> Result<void> {
    for (int i = 0; i < batch; ++i) KILN_TRY(launch(kFwd));
    return kiln::ok();
  };
  auto bwd = [&]() -> Result<void> {
    for (int i = 0; i < batch; ++i) {
      KILN_TRY(launch(kDgrad));
      KILN_TRY(launch(kWgrad));
    }
    return kiln::ok();
  };
  KILN_TRY(fwd());
  KILN_TRY(bwd());
  KILN_TRY(b.dev->synchronize(nullptr));
  for (int r = 0; r < b.opt.reps; ++r) {
    KILN_ASSIGN_OR_RETURN(float f, b.dev->time_ms(nullptr, fwd));
    KILN_ASSIGN_OR_RETURN(float g, b.dev->time_ms(nullptr, bwd));
    side.fwd_ms.push_back(f / batch);
    side.bwd_ms.push_back(g / batch);
  }
  return kiln::ok();
}

/// Kiln kernels of the three passes, or the first error (a compile failure is a FAIL row, not
/// the end of the run).
Result<std::array<std::shared_ptr<const kiln::Kernel>, 3>> kiln_kernels(Bench& b, const std::array<Gemm, 3>& gemms) {
  std::array<std::shared_ptr<const kiln::Kernel>, 3> k;
  for (int p = 0; p < 3; ++p) {
    auto r = b.rt->kernel(gemm_spec(gemms[p]));
    if (!r) return kiln::make_error(r.error().code, fmt::format("{}: {}", kPassName[p], r.error().message));
    k[p] = *r;
  }
  return k;
}

Result<void> run_shape(Bench& b, const Shape& s, ShapeResult& out) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::array<Gemm, 3> gemms = layer_gemms(s.M, s.N, s.K);

  // Host tensors (bf16-exact floats, kept for the reference) and their device copies.
  const uint64_t seed = b.rng();
  std::vector<float> x = random_bf16(s.M * s.K, 1.0, seed);
  std::vector<float> w = random_bf16(s.N * s.K, 1.0 / std::sqrt(double(s.K)), seed + 1);
  std::vector<float> dy = random_bf16(s.M * s.N, 1.0, seed + 2);
  DeviceBuffer dx_in, dw_in, ddy, dy_out, ddx_out, ddw_out;
  KILN_TRY(dx_in.allocate(*b.dev, bf16_bytes(s.M * s.K)));
  KILN_TRY(dw_in.allocate(*b.dev, bf16_bytes(s.N * s.K)));
  KILN_TRY(ddy.allocate(*b.dev, bf16_bytes(s.M * s.N)));
  KILN_TRY(dy_out.allocate(*b.dev, bf16_bytes(s.M * s.N)));
  KILN_TRY(ddx_out.allocate(*b.dev, bf16_bytes(s.M * s.K)));
  KILN_TRY(ddw_out.allocate(*b.dev, bf16_bytes(s.N * s.K)));
  KILN_TRY(upload_bf16(*b.dev, dx_in, x));
  KILN_TRY(upload_bf16(*b.dev, dw_in, w));
  KILN_TRY(upload_bf16(*b.dev, ddy, dy));
  const Buffers buf = {{{dx_in.ptr, dw_in.ptr, dy_out.ptr},     // y  = x @ W^T
                        {ddy.ptr, dw_in.ptr, ddx_out.ptr},      // dx = dy @ W
                        {ddy.ptr, dx_in.ptr, ddw_out.ptr}}};    // dW = dy^T @ x
  const std::array<DeviceBuffer*, 3> outputs = {&dy_out, &ddx_out, &ddw_out};

  std::array<std::vector<int64_t>, 3> rows;
  for (int p = 0; p < 3; ++p) rows[p] = sample_rows(gemms[p].M, b.opt.check_rows, b.rng);

  // The CPU reference runs while the GPU works. The tensors move into each pass's input pair
  // and back (no copies; the main thread does not touch them until the future is joined).
  auto refs = std::async(std::launch::async, [&]() -> Result<std::array<std::vector<double>, 3>> {
    std::array<std::vector<double>, 3> r;
    std::vector<float>* pairs[3][2] = {{&x, &w}, {&dy, &w}, {&dy, &x}};
    for (int p = 0; p < 3; ++p) {
      std::vector<std::vector<float>> in(2);
      in[0] = std::move(*pairs[p][0]);
      in[1] = std::move(*pairs[p][1]);
      auto ref = reference_rows(gemms[p], in, rows[p]);
      *pairs[p][0] = std::move(in[0]);
      *pairs[p][1] = std::move(in[1]);
      if (!ref) return ref.take_error();
      r[p] = std::move(ref).value();
    }
    return r;
  });

  // Kiln.
  std::array<std::vector<float>, 3> kiln_got, cublas_got;
  auto kernels = kiln_kernels(b, gemms);
  if (kernels) {
    const auto& k = *kernels;
    auto launch = [&](int p) -> Result<void> { return k[p]->launch(gemm_spec(gemms[p]), buf[p]); };
    KILN_ASSIGN_OR_RETURN(kiln_got, checked_run(b, gemms, buf, outputs, rows, launch));
    out.kiln.ran = true;
    KILN_TRY(timed_runs(b, out.kiln, launch));
  } else {
    out.kiln.error = kernels.error().message;
  }

  // cuBLAS, on the same buffers.
  {
    auto launch = [&](int p) { return cublas_gemm(b.cublas, gemms[p], buf[p][0], buf[p][1], buf[p][2]); };
    KILN_ASSIGN_OR_RETURN(cublas_got, checked_run(b, gemms, buf, outputs, rows, launch));
    out.cublas.ran = true;
    KILN_TRY(timed_runs(b, out.cublas, launch));
  }

  KILN_ASSIGN_OR_RETURN(auto ref, refs.get());
  for (int p = 0; p < 3; ++p) {
    if (out.kiln.ran) out.kiln.acc[p] = compare(ref[p], kiln_got[p]);
    out.cublas.acc[p] = compare(ref[p], cublas_got[p]);
  }
  out.done = true;
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return kiln::ok();
}

/// Small shapes of the three layouts, every output row against the CPU reference, through Kiln
/// and through cuBLAS (the row-major mapping). Returns false when cuBLAS fails one.
Result<bool> self_test(Bench& b) {
  bool cublas_ok = true;
  const int64_t dims[][3] = {{67, 45, 33}, {128, 96, 80}};
  for (const auto& d : dims) {
    const std::array<Gemm, 3> gemms = layer_gemms(d[0], d[1], d[2]);
    for (int p = 0; p < 3; ++p) {
      const Gemm& g = gemms[p];
      const int64_t a_n = g.M * g.K, b_n = g.K * g.N, c_n = g.M * g.N;
      std::vector<std::vector<float>> in = {random_bf16(a_n, 1.0, b.rng()),
                                            random_bf16(b_n, 1.0 / std::sqrt(double(g.K)), b.rng())};
      DeviceBuffer A, B, C;
      KILN_TRY(A.allocate(*b.dev, bf16_bytes(a_n)));
      KILN_TRY(B.allocate(*b.dev, bf16_bytes(b_n)));
      KILN_TRY(C.allocate(*b.dev, bf16_bytes(c_n)));
      KILN_TRY(upload_bf16(*b.dev, A, in[0]));
      KILN_TRY(upload_bf16(*b.dev, B, in[1]));
      std::vector<int64_t> rows;
      for (int64_t r = 0; r < g.M; ++r) rows.push_back(r);
      KILN_ASSIGN_OR_RETURN(auto ref, reference_rows(g, in, rows));
      void* ptrs[] = {A.ptr, B.ptr, C.ptr};

      KILN_TRY(C.poison());
      std::string kiln_msg;
      if (auto r = b.rt->launch(gemm_spec(g), ptrs); r) {
        KILN_TRY(b.dev->synchronize(nullptr));
        KILN_ASSIGN_OR_RETURN(auto got, fetch_rows(*b.dev, C.ptr, g.N, rows));
        kiln_msg = describe(compare(ref, got));
      } else {
        kiln_msg = "error: " + r.error().message;
      }
      KILN_TRY(C.poison());
      KILN_TRY(cublas_gemm(b.cublas, g, A.ptr, B.ptr, C.ptr));
      KILN_TRY(b.dev->synchronize(nullptr));
      KILN_ASSIGN_OR_RETURN(auto got, fetch_rows(*b.dev, C.ptr, g.N, rows));
      const Accuracy ca = compare(ref, got);
      cublas_ok = cublas_ok && ca.pass;
      std::fprintf(stderr, "self-test %-7s M=%ld N=%ld K=%ld trans_a=%d trans_b=%d\n  kiln   %s\n  cublas %s\n",
                   kPassName[p], long(g.M), long(g.N), long(g.K), int(g.ta), int(g.tb), kiln_msg.c_str(),
                   describe(ca).c_str());
    }
  }
  return cublas_ok;
}

/// The cuBLAS argument mapping of every (trans_a, trans_b), emulated on the CPU against
/// kiln::reference. Needs no GPU.
bool mapping_test() {
  bool all = true;
  std::mt19937_64 rng(1);
  const int64_t dims[][3] = {{5, 7, 3}, {37, 19, 23}, {16, 48, 9}};
  for (const auto& d : dims)
    for (int ta = 0; ta < 2; ++ta)
      for (int tb = 0; tb < 2; ++tb) {
        const Gemm g{d[0], d[1], d[2], ta != 0, tb != 0};
        std::vector<std::vector<float>> in = {random_bf16(g.M * g.K, 1.0, rng()), random_bf16(g.K * g.N, 1.0, rng())};
        std::vector<double> ref, emu;
        if (auto r = kiln::reference(gemm_spec(g), {}, in); !r) {
          std::printf("mapping-test: reference failed: %s\n", r.error().message.c_str());
          return false;
        } else {
          ref = std::move(r->front().values);
        }
        const CublasCall c = cublas_call(g);
        emulate_cublas(c, in[1].data(), in[0].data(), emu);  // first operand: row-major B
        double max_err = 0;
        for (size_t i = 0; i < ref.size(); ++i) max_err = std::max(max_err, std::fabs(ref[i] - emu[i]));
        const bool pass = emu.size() == ref.size() && max_err < 1e-9;
        all = all && pass;
        std::printf("mapping-test M=%-3ld N=%-3ld K=%-3ld trans_a=%d trans_b=%d -> cublasGemmEx(%s, %s, m=%d, n=%d, "
                    "k=%d, B, lda=%d, A, ldb=%d, C, ldc=%d): %s (max err %.1e)\n",
                    long(g.M), long(g.N), long(g.K), ta, tb, c.transa == CUBLAS_OP_N ? "N" : "T",
                    c.transb == CUBLAS_OP_N ? "N" : "T", c.m, c.n, c.k, c.lda, c.ldb, c.ldc, pass ? "PASS" : "FAIL",
                    max_err);
      }
  return all;
}

double geomean(const std::vector<double>& v) {
  if (v.empty()) return 0;
  double s = 0;
  for (double x : v) {
    if (!(x > 0)) return 0;
    s += std::log(x);
  }
  return std::exp(s / double(v.size()));
}

/// Prints a geometric mean of ratios, saying when FAIL rows (zeros) make it zero.
void print_geomean(const char* what, const std::vector<double>& all, const char* unit) {
  std::vector<double> nonzero;
  for (double r : all)
    if (r > 0) nonzero.push_back(r);
  const size_t zeros = all.size() - nonzero.size();
  std::printf("geomean %s Kiln/cuBLAS over %zu %s: %.4f", what, all.size(), unit, geomean(all));
  if (zeros)
    std::printf("  (%zu FAIL counted as zero; over the %zu passing: %.4f)", zeros, nonzero.size(), geomean(nonzero));
  std::printf("\n");
}

int run(const Options& opt, std::unique_ptr<kiln::Runtime> runtime) {
  Bench b;
  b.opt = opt;
  b.rt = runtime.get();
  b.dev = runtime->device();
  const uint64_t seed = opt.seed ? opt.seed : std::random_device{}();
  b.rng.seed(seed);

  // Cases, in model / micro-batch / GEMM order, cut to --max-rows; distinct shapes in first-use order.
  std::vector<Case> cases;
  for (const std::string& name : opt.models) {
    const Model* m = nullptr;
    for (const Model& candidate : kModels)
      if (name == candidate.name) m = &candidate;
    for (int64_t mb : opt.micro_batch)
      for (Case& c : model_cases(*m, mb)) cases.push_back(std::move(c));
  }
  if (opt.max_rows > 0 && static_cast<int64_t>(cases.size()) > opt.max_rows) cases.resize(static_cast<size_t>(opt.max_rows));
  std::vector<Shape> shapes;
  std::vector<size_t> shape_of(cases.size());
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    auto it = std::find_if(shapes.begin(), shapes.end(),
                           [&](const Shape& s) { return s.M == c.M && s.N == c.N && s.K == c.K; });
    if (it == shapes.end()) it = shapes.insert(shapes.end(), Shape{c.M, c.N, c.K, {}});
    it->cases.push_back(i);
    shape_of[i] = static_cast<size_t>(it - shapes.begin());
  }

  cudaError_t ce = cudaSetDevice(opt.device);
  if (ce != cudaSuccess) {
    std::fprintf(stderr, "bench_gemm: cudaSetDevice(%d): %s\n", opt.device, cudaGetErrorString(ce));
    return 1;
  }
  if (auto r = cublas_check(cublasCreate(&b.cublas), "cublasCreate"); !r) {
    std::fprintf(stderr, "bench_gemm: %s\n", r.error().message.c_str());
    return 1;
  }
  struct HandleGuard {
    cublasHandle_t h;
    ~HandleGuard() { cublasDestroy(h); }
  } handle_guard{b.cublas};
  // Kiln launches on the default stream of the primary context; so does cuBLAS here.
  if (auto r = cublas_check(cublasSetStream(b.cublas, nullptr), "cublasSetStream"); !r) {
    std::fprintf(stderr, "bench_gemm: %s\n", r.error().message.c_str());
    return 1;
  }
  int cublas_version = 0;
  (void)cublasGetVersion(b.cublas, &cublas_version);

  std::printf("bench_gemm: %s (%s, %d SMs), cuBLAS %d, Kiln cache %s\n", b.dev->name().c_str(),
              std::string(b.dev->target().name).c_str(), b.dev->compute_units(), cublas_version,
              b.rt->cache_dir().empty() ? "(memory only)" : b.rt->cache_dir().c_str());
  std::printf("bench_gemm: %zu rows, %zu distinct shapes, reps %d of %d back-to-back launches (median after 1 "
              "warm-up), %ld checked rows per output, seed %llu\n\n",
              cases.size(), shapes.size(), opt.reps, opt.batch, long(opt.check_rows),
              static_cast<unsigned long long>(seed));
  std::fflush(stdout);

  if (opt.self_test) {
    auto st = self_test(b);
    if (!st) {
      std::fprintf(stderr, "bench_gemm: self-test: %s\n", st.error().message.c_str());
      return 1;
    }
    if (!*st) {
      std::fprintf(stderr, "bench_gemm: cuBLAS fails the self-test: the row-major mapping is wrong; stopping\n");
      return 1;
    }
  }

  // Compiles every Kiln kernel ahead of the shape that needs it, into the runtime's caches.
  std::vector<kiln::KernelSpec> specs;
  for (const Shape& s : shapes)
    for (const Gemm& g : layer_gemms(s.M, s.N, s.K)) specs.push_back(gemm_spec(g));
  const kiln::bench::BackgroundCompile prefetch(*b.rt, std::string(b.dev->target().name), std::move(specs));

  const std::filesystem::path dir(opt.out);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    std::fprintf(stderr, "bench_gemm: cannot create %s: %s\n", dir.c_str(), ec.message().c_str());
    return 1;
  }

  std::vector<ShapeResult> results(shapes.size());
  auto report_rows = [&](bool cublas) {
    std::vector<std::vector<std::string>> rows;
    for (size_t i = 0; i < cases.size(); ++i) {
      const ShapeResult& r = results[shape_of[i]];
      if (!r.done) continue;
      rows.push_back(cublas ? report_row("cublas:" + cases[i].label, cases[i], r.cublas)
                            : report_row(cases[i].label, cases[i], r.kiln));
    }
    return rows;
  };
  auto ratio = [](const Side& k, const Side& c, bool fwd, double flops) {
    if (!k.pass()) return 0.0;
    const Timing tk = summarize(fwd ? k.fwd_ms : k.bwd_ms, flops), tc = summarize(fwd ? c.fwd_ms : c.bwd_ms, flops);
    return tc.tflops > 0 ? tk.tflops / tc.tflops : 0.0;
  };
  const std::vector<std::string> ratio_header = {"label", "Check", "cuBLAS Check", "Forward TFLOPS",
                                                 "cuBLAS Forward TFLOPS", "Forward ratio", "Backward TFLOPS",
                                                 "cuBLAS Backward TFLOPS", "Backward ratio"};
  auto ratio_rows = [&] {
    std::vector<std::vector<std::string>> rows;
    for (size_t i = 0; i < cases.size(); ++i) {
      const ShapeResult& r = results[shape_of[i]];
      if (!r.done) continue;
      const Case& c = cases[i];
      const double flops = 2.0 * double(c.M) * double(c.N) * double(c.K);
      rows.push_back({c.label, r.kiln.pass() ? "PASS" : "FAIL", r.cublas.pass() ? "PASS" : "FAIL",
                      fmt::format("{:.2f}", summarize(r.kiln.fwd_ms, flops).tflops),
                      fmt::format("{:.2f}", summarize(r.cublas.fwd_ms, flops).tflops),
                      fmt::format("{:.4f}", ratio(r.kiln, r.cublas, true, flops)),
                      fmt::format("{:.2f}", summarize(r.kiln.bwd_ms, 2 * flops).tflops),
                      fmt::format("{:.2f}", summarize(r.cublas.bwd_ms, 2 * flops).tflops),
                      fmt::format("{:.4f}", ratio(r.kiln, r.cublas, false, 2 * flops))});
    }
    return rows;
  };
  auto write_all = [&]() -> Result<void> {
    KILN_TRY(write_csv(dir / "gemm_report.csv", kColumns, report_rows(false)));
    KILN_TRY(write_csv(dir / "gemm_report_cublas.csv", kColumns, report_rows(true)));
    return write_csv(dir / "gemm_ratio.csv", ratio_header, ratio_rows());
  };

  int exit_code = 0;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const Shape& s = shapes[i];
    std::string labels;
    for (size_t c : s.cases) labels += (labels.empty() ? "" : " = ") + cases[c].label;
    const double gib = 4.0 * double(s.M * s.K + s.N * s.K + s.M * s.N) / double(1 << 30);
    std::fprintf(stderr, "[%zu/%zu] %s: M=%ld N=%ld K=%ld, %.2f GiB on the device ...\n", i + 1, shapes.size(),
                 labels.c_str(), long(s.M), long(s.N), long(s.K), gib);
    if (auto r = run_shape(b, s, results[i]); !r) {
      std::fprintf(stderr, "bench_gemm: %s: %s\n", labels.c_str(), r.error().message.c_str());
      exit_code = 1;
      break;
    }
    const ShapeResult& r = results[i];
    const double flops = 2.0 * double(s.M) * double(s.N) * double(s.K);
    const Timing kf = summarize(r.kiln.fwd_ms, flops), kb = summarize(r.kiln.bwd_ms, 2 * flops);
    const Timing cf = summarize(r.cublas.fwd_ms, flops), cb = summarize(r.cublas.bwd_ms, 2 * flops);
    std::fprintf(stderr, "  kiln   %s: forward %.1f TFLOP/s (%.3f ms), backward %.1f TFLOP/s (%.3f ms)\n",
                 r.kiln.pass() ? "PASS" : "FAIL", kf.tflops, kf.median_ms, kb.tflops, kb.median_ms);
    std::fprintf(stderr, "  cublas %s: forward %.1f TFLOP/s (%.3f ms), backward %.1f TFLOP/s (%.3f ms); %.1f s\n",
                 r.cublas.pass() ? "PASS" : "FAIL", cf.tflops, cf.median_ms, cb.tflops, cb.median_ms, r.seconds);
    if (!r.kiln.ran) std::fprintf(stderr, "  kiln not run: %s\n", r.kiln.error.c_str());
    for (int p = 0; p < 3; ++p) {
      if (r.kiln.ran && !r.kiln.acc[p].pass)
        std::fprintf(stderr, "  kiln %s: %s\n", kPassName[p], describe(r.kiln.acc[p]).c_str());
      if (!r.cublas.acc[p].pass)
        std::fprintf(stderr, "  cublas %s: %s\n", kPassName[p], describe(r.cublas.acc[p]).c_str());
    }
    if (auto w = write_all(); !w) {
      std::fprintf(stderr, "bench_gemm: %s\n", w.error().message.c_str());
      return 1;
    }
  }

  std::printf("Kiln (%s)\n", (dir / "gemm_report.csv").c_str());
  print_table(stdout, kColumns, report_rows(false));
  std::printf("\ncuBLAS, same run, same tensors (%s)\n", (dir / "gemm_report_cublas.csv").c_str());
  print_table(stdout, kColumns, report_rows(true));
  std::printf("\nKiln / cuBLAS, TFLOP/s ratio per row; a Kiln FAIL row counts as zero (%s)\n",
              (dir / "gemm_ratio.csv").c_str());
  print_table(stdout, ratio_header, ratio_rows());

  std::vector<double> fwd_rows, bwd_rows, fwd_shapes, bwd_shapes;
  size_t cublas_fails = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const ShapeResult& r = results[shape_of[i]];
    if (!r.done) continue;
    const double flops = 2.0 * double(cases[i].M) * double(cases[i].N) * double(cases[i].K);
    fwd_rows.push_back(ratio(r.kiln, r.cublas, true, flops));
    bwd_rows.push_back(ratio(r.kiln, r.cublas, false, 2 * flops));
  }
  for (size_t i = 0; i < shapes.size(); ++i) {
    const ShapeResult& r = results[i];
    if (!r.done) continue;
    const double flops = 2.0 * double(shapes[i].M) * double(shapes[i].N) * double(shapes[i].K);
    fwd_shapes.push_back(ratio(r.kiln, r.cublas, true, flops));
    bwd_shapes.push_back(ratio(r.kiln, r.cublas, false, 2 * flops));
    if (!r.cublas.pass()) ++cublas_fails;
  }
  std::printf("\n");
  print_geomean("forward ", fwd_rows, "rows");
  print_geomean("backward", bwd_rows, "rows");
  print_geomean("forward ", fwd_shapes, "distinct shapes");
  print_geomean("backward", bwd_shapes, "distinct shapes");
  if (fwd_rows.size() < cases.size())
    std::printf("incomplete: %zu of %zu rows ran\n", fwd_rows.size(), cases.size());
  if (cublas_fails)
    std::printf("WARNING: cuBLAS fails the accuracy check on %zu shape(s): its ratios are not comparable\n",
                cublas_fails);
  return exit_code;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  CLI::App app{"Kiln GEMM vs cuBLAS on the dense GEMMs of real models (forward, dgrad + wgrad)"};
  std::string known;
  for (const Model& m : kModels) known += (known.empty() ? "" : ",") + std::string(m.name);
  app.add_option("--out", opt.out, "Output directory (gemm_report.csv, gemm_report_cublas.csv, gemm_ratio.csv)")
      ->capture_default_str();
  app.add_option("--models", opt.models, "Comma-separated subset of " + known + " (default: all)")->delimiter(',');
  app.add_option("--micro-batch", opt.micro_batch, "Micro-batches, comma-separated; M = seq * micro-batch")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--reps", opt.reps, "Timed repetitions after 1 warm-up (median reported)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--batch", opt.batch,
                 "Back-to-back launches per timed repetition (time divided by the count): 1 times single "
                 "launches, 20 sustained throughput")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-rows", opt.max_rows, "Stop after the first N rows (labels) of the list (0: all)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--check-rows", opt.check_rows, "Output rows per GEMM compared with the CPU reference")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--device", opt.device, "GPU ordinal")->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--seed", opt.seed, "Random seed (0: a fresh one)");
  app.add_flag("!--no-self-test", opt.self_test, "Skip the small-shape check of Kiln and of the cuBLAS mapping");
  app.add_flag("--mapping-test", opt.mapping_test,
               "Check the row-major -> cublasGemmEx mapping on the CPU (emulated cuBLAS) and exit");
  CLI11_PARSE(app, argc, argv);

  if (opt.mapping_test) return mapping_test() ? 0 : 1;

  if (opt.models.empty())
    for (const Model& m : kModels) opt.models.push_back(m.name);
  for (const std::string& name : opt.models)
    if (std::none_of(std::begin(kModels), std::end(kModels), [&](const Model& m) { return name == m.name; })) {
      std::fprintf(stderr, "bench_gemm: unknown model '%s'; known: %s\n", name.c_str(), known.c_str());
      return 2;
    }
  for (int64_t mb : opt.micro_batch)
    if (mb < 1) {
      std::fprintf(stderr, "bench_gemm: --micro-batch values must be >= 1\n");
      return 2;
    }

  kiln::RuntimeOptions o;
  o.backend = "cuda";
  o.device = opt.device;
  auto rt = kiln::Runtime::create(o);
  if (!rt || !(*rt)->device()) {
    std::printf("bench_gemm: skipped, no NVIDIA GPU: %s\n",
                rt ? "the runtime has no device" : rt.error().message.c_str());
    return 0;
  }
  return run(opt, std::move(rt).value());
}
