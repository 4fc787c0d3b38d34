// A Llama MLP block forward through Kiln's C++ API at real dimensions (Llama-3.1-8B by default):
//
//   h   = rmsnorm(x) * gamma            x [M, hidden]            -> h [M, hidden]
//   gu  = h @ W_gate_up^T               W_gate_up [2I, hidden]   -> gu [M, 2I]   (gemm NT)
//   a   = silu(gu[:, :I]) * gu[:, I:]                            -> a [M, I]     (swiglu)
//   out = a @ W_down^T                  W_down [hidden, I]       -> out [M, hidden] (gemm NT)
//
// It reports each kernel's first-call latency (compile, or load from the disk cache) against a
// cached call, times the block with device events, and checks sampled rows of every stage against
// the float64 CPU reference applied to that stage's GPU input, plus the whole block end to end.
#include <kiln/kiln.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>

namespace {

struct Buffer {
  kiln::Device* device;
  void* ptr = nullptr;
  ~Buffer() {
    if (ptr) (void)device->free(ptr);
  }
};

std::vector<float> download(kiln::Device& dev, const void* ptr, size_t count, kiln::DType dt) {
  std::vector<uint16_t> raw(count);
  std::vector<float> out(count);
  if (!dev.copy_to_host(raw.data(), ptr, count * 2).ok()) return {};
  for (size_t i = 0; i < count; ++i)
    out[i] = dt == kiln::DType::bf16 ? kiln::bf16_bits_to_float(raw[i]) : kiln::f16_bits_to_float(raw[i]);
  return out;
}

struct Gate {
  double max_abs = 0, err_sq = 0, ref_sq = 0;
  int64_t outside = 0, nonfinite = 0;
  void add(double got, double want) {
    if (!std::isfinite(got)) {
      ++nonfinite;
      return;
    }
    const double e = std::fabs(got - want);
    max_abs = std::max(max_abs, e);
    outside += e > 1e-2 + 1e-2 * std::fabs(want);
    err_sq += e * e;
    ref_sq += want * want;
  }
  double rel_fro() const { return std::sqrt(err_sq / std::max(ref_sq, 1e-300)); }
  double snr_db() const { return 10 * std::log10(ref_sq / std::max(err_sq, 1e-300)); }
  bool pass() const { return outside == 0 && nonfinite == 0 && rel_fro() < 1e-2; }
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Llama MLP block forward through Kiln (rmsnorm -> gate_up GEMM -> swiglu -> down GEMM)"};
  int64_t M = 8192, hidden = 4096, I = 14336, sample_rows = 8;
  std::string dtype_name = "bf16", cache_dir;
  app.add_option("--tokens,-M", M, "tokens (seq x micro-batch)");
  app.add_option("--hidden", hidden, "hidden size");
  app.add_option("--intermediate", I, "MLP intermediate size");
  app.add_option("--dtype", dtype_name, "bf16 or fp16");
  app.add_option("--sample-rows", sample_rows, "rows checked against the CPU reference");
  app.add_option("--cache-dir", cache_dir, "kernel cache directory");
  CLI11_PARSE(app, argc, argv);

  auto dtype = kiln::parse_dtype(dtype_name);
  if (!dtype || *dtype == kiln::DType::f32) {
    std::fprintf(stderr, "llama_mlp: error: --dtype must be bf16 or fp16\n");
    return 2;
  }
  const kiln::DType dt = *dtype;
  kiln::RuntimeOptions options;
  options.cache_dir = cache_dir;
  auto runtime = kiln::Runtime::create(options);
  if (!runtime) {
    std::fprintf(stderr, "llama_mlp: error: %s\n", runtime.error().message.c_str());
    return 1;
  }
  kiln::Runtime& rt = **runtime;
  if (!rt.device()) {
    std::printf("llama_mlp: no GPU found; nothing to run (this example needs an NVIDIA or AMD GPU)\n");
    return 0;
  }
  kiln::Device& dev = *rt.device();
  std::printf("device: %s (%s), M=%ld hidden=%ld intermediate=%ld %s, cache %s\n", dev.name().c_str(),
              std::string(dev.target().name).c_str(), long(M), long(hidden), long(I), dtype_name.c_str(),
              rt.cache_dir().c_str());

  const kiln::KernelSpec norm{"rmsnorm", dt, dt, {{"rows", M}, {"hidden", hidden}}};
  const kiln::KernelSpec gate_up{"gemm", dt, dt, {{"M", M}, {"N", 2 * I}, {"K", hidden}, {"trans_a", 0}, {"trans_b", 1}}};
  const kiln::KernelSpec swiglu{"swiglu", dt, dt, {{"rows", M}, {"intermediate", I}}};
  const kiln::KernelSpec down{"gemm", dt, dt, {{"M", M}, {"N", hidden}, {"K", I}, {"trans_a", 0}, {"trans_b", 1}}};
  const kiln::KernelSpec* specs[] = {&norm, &gate_up, &swiglu, &down};
  const char* names[] = {"rmsnorm", "gate_up gemm", "swiglu", "down gemm"};

  // First call (compile or disk-cache load, plus module load) against a cached call.
  std::shared_ptr<const kiln::Kernel> kernels[4];
  double first_ms[4], cached_us[4];
  for (int i = 0; i < 4; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    auto k = rt.kernel(*specs[i]);
    auto t1 = std::chrono::steady_clock::now();
    if (!k) {
      std::fprintf(stderr, "llama_mlp: error: %s\n", k.error().message.c_str());
      return 1;
    }
    kernels[i] = *k;
    auto again = rt.kernel(*specs[i]);
    auto t2 = std::chrono::steady_clock::now();
    (void)again;
    first_ms[i] = std::chrono::duration<double, std::milli>(t1 - t0).count();
    cached_us[i] = std::chrono::duration<double, std::micro>(t2 - t1).count();
  }

  // Inputs: x ~ U(-1, 1), gamma ~ U(0.5, 1.5), weights ~ U(-1, 1) / sqrt(fan_in).
  std::mt19937_64 rng(std::random_device{}());
  auto fill = [&](size_t n, float lo, float hi) {
    std::uniform_real_distribution<float> d(lo, hi);
    std::vector<uint16_t> v(n);
    for (auto& e : v) {
      float f;
      do f = d(rng);
      while (f == 0.0f);
      e = dt == kiln::DType::bf16 ? kiln::float_to_bf16_bits(f) : kiln::float_to_f16_bits(f);
    }
    return v;
  };
  const float wg = 1.0f / std::sqrt(float(hidden)), wd = 1.0f / std::sqrt(float(I));
  auto hx = fill(M * hidden, -1, 1), hgamma = fill(hidden, 0.5f, 1.5f);
  auto hwgu = fill(2 * I * hidden, -wg, wg), hwd = fill(hidden * I, -wd, wd);
  Buffer x{&dev}, gamma{&dev}, wgu{&dev}, wdown{&dev}, h{&dev}, gu{&dev}, a{&dev}, out{&dev};
  const size_t sizes[] = {size_t(M * hidden), size_t(hidden), size_t(2 * I * hidden), size_t(hidden * I),
                          size_t(M * hidden), size_t(M * 2 * I), size_t(M * I), size_t(M * hidden)};
  Buffer* bufs[] = {&x, &gamma, &wgu, &wdown, &h, &gu, &a, &out};
  for (int i = 0; i < 8; ++i) {
    auto p = dev.malloc(sizes[i] * 2);
    if (!p) {
      std::fprintf(stderr, "llama_mlp: error: %s\n", p.error().message.c_str());
      return 1;
    }
    bufs[i]->ptr = *p;
    if (i >= 4 && !dev.memset(*p, 0xff, sizes[i] * 2).ok()) return 1;  // NaN poison
  }
  const std::vector<uint16_t>* host[] = {&hx, &hgamma, &hwgu, &hwd};
  for (int i = 0; i < 4; ++i)
    if (!dev.copy_to_device(bufs[i]->ptr, host[i]->data(), host[i]->size() * 2).ok()) return 1;

  void* norm_args[] = {x.ptr, gamma.ptr, h.ptr};
  void* gu_args[] = {h.ptr, wgu.ptr, gu.ptr};
  void* sw_args[] = {gu.ptr, a.ptr};
  void* down_args[] = {a.ptr, wdown.ptr, out.ptr};
  void** args[] = {norm_args, gu_args, sw_args, down_args};
  const size_t nargs[] = {3, 3, 2, 3};
  const std::map<std::string, float> eps = {{"eps", 1e-5f}};
  auto run_stage = [&](int i) -> kiln::Result<void> {
    return kernels[i]->launch(*specs[i], std::span<void* const>(args[i], nargs[i]), eps, nullptr);
  };
  for (int i = 0; i < 4; ++i)
    if (auto r = run_stage(i); !r) {
      std::fprintf(stderr, "llama_mlp: error: %s\n", r.error().message.c_str());
      return 1;
    }
  if (!dev.synchronize().ok()) return 1;

  // Check sampled rows of each stage against the reference applied to that stage's GPU input.
  std::vector<int64_t> rows = {0, M - 1};
  std::uniform_int_distribution<int64_t> pick(0, M - 1);
  while (int64_t(rows.size()) < sample_rows) rows.push_back(pick(rng));
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  auto as_float = [&](const std::vector<uint16_t>& v) {
    std::vector<float> f(v.size());
    for (size_t i = 0; i < v.size(); ++i)
      f[i] = dt == kiln::DType::bf16 ? kiln::bf16_bits_to_float(v[i]) : kiln::f16_bits_to_float(v[i]);
    return f;
  };
  const std::vector<float> fx = as_float(hx), fgamma = as_float(hgamma), fwgu = as_float(hwgu), fwd = as_float(hwd);
  const std::vector<float> gh = download(dev, h.ptr, sizes[4], dt), ggu = download(dev, gu.ptr, sizes[5], dt),
                           ga = download(dev, a.ptr, sizes[6], dt), gout = download(dev, out.ptr, sizes[7], dt);
  const std::vector<float>* stage_in[4][2] = {{&fx, &fgamma}, {&gh, &fwgu}, {&ggu, nullptr}, {&ga, &fwd}};
  const std::vector<float>* stage_out[4] = {&gh, &ggu, &ga, &gout};
  // The first output of the op's CPU reference (each stage has one).
  auto reference = [&](const kiln::KernelSpec& spec, std::span<const std::vector<float>> in,
                       std::span<const int64_t> sample, std::vector<double>& out) -> kiln::Result<void> {
    KILN_ASSIGN_OR_RETURN(auto refs, kiln::reference(spec, eps, in, sample));
    out = std::move(refs.front().values);
    return kiln::ok();
  };
  Gate gates[4];
  for (int i = 0; i < 4; ++i) {
    std::vector<std::vector<float>> in = {*stage_in[i][0]};
    if (stage_in[i][1]) in.push_back(*stage_in[i][1]);
    std::vector<double> ref;
    if (auto r = reference(*specs[i], in, rows, ref); !r) {
      std::fprintf(stderr, "llama_mlp: error: %s\n", r.error().message.c_str());
      return 1;
    }
    const size_t cols = ref.size() / rows.size();
    for (size_t r = 0; r < rows.size(); ++r)
      for (size_t c = 0; c < cols; ++c) gates[i].add((*stage_out[i])[rows[r] * cols + c], ref[r * cols + c]);
  }
  // End to end: the float64 chain from x on the sampled rows (no intermediate rounding).
  Gate e2e;
  {
    std::vector<double> hr, gur, ar, outr;
    std::vector<std::vector<float>> in0 = {fx, fgamma};
    (void)reference(norm, in0, rows, hr);
    const kiln::KernelSpec gu_rows{"gemm", dt, dt, {{"M", int64_t(rows.size())}, {"N", 2 * I}, {"K", hidden}, {"trans_a", 0}, {"trans_b", 1}}};
    std::vector<std::vector<float>> in1 = {std::vector<float>(hr.begin(), hr.end()), fwgu};
    (void)reference(gu_rows, in1, {}, gur);
    const kiln::KernelSpec sw_rows{"swiglu", dt, dt, {{"rows", int64_t(rows.size())}, {"intermediate", I}}};
    std::vector<std::vector<float>> in2 = {std::vector<float>(gur.begin(), gur.end())};
    (void)reference(sw_rows, in2, {}, ar);
    const kiln::KernelSpec dn_rows{"gemm", dt, dt, {{"M", int64_t(rows.size())}, {"N", hidden}, {"K", I}, {"trans_a", 0}, {"trans_b", 1}}};
    std::vector<std::vector<float>> in3 = {std::vector<float>(ar.begin(), ar.end()), fwd};
    (void)reference(dn_rows, in3, {}, outr);
    for (size_t r = 0; r < rows.size(); ++r)
      for (int64_t c = 0; c < hidden; ++c) e2e.add(gout[rows[r] * hidden + c], outr[r * hidden + c]);
  }

  // Device time per stage and for the block: median of 10 runs after 3 warm-ups.
  double stage_ms[5];
  for (int i = 0; i <= 4; ++i) {
    std::vector<float> t;
    for (int rep = 0; rep < 13; ++rep) {
      auto ms = dev.time_ms(nullptr, [&]() -> kiln::Result<void> {
        if (i < 4) return run_stage(i);
        for (int s = 0; s < 4; ++s) KILN_TRY(run_stage(s));
        return kiln::ok();
      });
      if (!ms) {
        std::fprintf(stderr, "llama_mlp: error: %s\n", ms.error().message.c_str());
        return 1;
      }
      if (rep >= 3) t.push_back(*ms);
    }
    std::sort(t.begin(), t.end());
    stage_ms[i] = t[t.size() / 2];
  }
  const double flops[] = {0, 2.0 * M * 2 * I * hidden, 0, 2.0 * M * hidden * I};
  const double bytes[] = {2.0 * (2 * M * hidden + hidden), 0, 2.0 * (M * 2 * I + M * I), 0};

  std::printf("\n%-13s %-9s %14s %14s %12s %14s  %s\n", "kernel", "origin", "first call ms", "cached call us",
              "device ms", "rate", "check (sampled rows vs fp64 reference)");
  bool all = true;
  for (int i = 0; i < 4; ++i) {
    const std::string rate = flops[i] > 0 ? fmt::format("{:.1f} TFLOP/s", flops[i] / stage_ms[i] / 1e9)
                                          : fmt::format("{:.0f} GB/s", bytes[i] / stage_ms[i] / 1e6);
    std::printf("%-13s %-9s %14.2f %14.2f %12.3f %14s  %s max_abs %.2e rel_fro %.2e snr %.1f dB (%zu rows)\n",
                names[i], std::string(kernels[i]->compiled().origin()).c_str(), first_ms[i], cached_us[i],
                stage_ms[i], rate.c_str(), gates[i].pass() ? "PASS" : "FAIL", gates[i].max_abs, gates[i].rel_fro(),
                gates[i].snr_db(), rows.size());
    all &= gates[i].pass();
  }
  std::printf("%-13s %-9s %14s %14s %12.3f %14s  %s rel_fro %.2e snr %.1f dB (fp64 chain from x, no intermediate rounding)\n",
              "MLP block", "", "", "", stage_ms[4], "", e2e.rel_fro() < 2e-2 && e2e.nonfinite == 0 ? "PASS" : "FAIL",
              e2e.rel_fro(), e2e.snr_db());
  all &= e2e.rel_fro() < 2e-2 && e2e.nonfinite == 0;
  const kiln::CacheStats s = rt.stats();
  std::printf("cache: %lu compiled (%.0f ms), %lu from disk, %lu memory hits\n", (unsigned long)s.compiles, s.compile_ms,
              (unsigned long)s.disk_hits, (unsigned long)s.memory_hits);
  std::printf("%s\n", all ? "llama_mlp: PASS" : "llama_mlp: FAIL");
  return all ? 0 : 1;
}
