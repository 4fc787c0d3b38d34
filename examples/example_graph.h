// The tensor graph of the examples that run a model's ops through Kiln alone (llama_step,
// moe_block): buffers on the device, or host vectors for the same graph on the ops' CPU references
// (kiln::reference), one op call at a time, with an optional per-op time breakdown; the
// --dump format that the scripts/*_torch.py checks read; and what both programs' main() share
// (the runtime's options and its start, the gradient checks, the breakdown's table).
#pragma once

#include <kiln/kiln.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace kiln_example {

using kiln::DType;
using kiln::KernelSpec;
using kiln::Result;

// ---- tensors: host vectors (the reference graph) or device buffers ---------------------------
struct Buf {
  std::string name;
  DType dt = DType::bf16;
  int64_t rows = 0, cols = 0;
  std::vector<int64_t> shape;  // the dumped shape when not [rows, cols] (experts' weights [G, N, K])
  void* dev = nullptr;        // device mode
  std::vector<float> host;    // host mode (values rounded to dt, as the device stores them)
  int64_t elems() const { return rows * cols; }
  size_t bytes() const { return static_cast<size_t>(elems()) * kiln::dtype_size(dt); }
};

// A 2-D view of a buffer: `cols` elements of each of `rows` rows, rows `stride` elements apart,
// starting `offset` elements in. A whole buffer is the view {b, 0, rows, cols, cols}.
struct View {
  Buf* b = nullptr;
  int64_t offset = 0, rows = 0, cols = 0, stride = 0;
};
inline View whole(Buf& b) { return {&b, 0, b.rows, b.cols, b.cols}; }
inline View columns(Buf& b, int64_t first, int64_t count) { return {&b, first, b.rows, count, b.cols}; }

class Graph {
 public:
  Graph(kiln::Runtime* rt, bool on_device, bool breakdown) : rt_(rt), dev_(on_device), breakdown_(breakdown) {}
  bool on_device() const { return dev_; }

  Result<Buf*> make(std::string name, DType dt, int64_t rows, int64_t cols) {
    auto b = std::make_unique<Buf>();
    b->name = std::move(name);
    b->dt = dt;
    b->rows = rows;
    b->cols = cols;
    if (dev_) {
      KILN_ASSIGN_OR_RETURN(b->dev, rt_->device()->malloc(std::max<size_t>(b->bytes(), 256)));
      KILN_TRY(rt_->device()->memset(b->dev, 0xff, b->bytes()));  // NaN poison: an unwritten element shows
    } else {
      b->host.assign(static_cast<size_t>(b->elems()), std::nanf(""));
    }
    bufs_.push_back(std::move(b));
    return bufs_.back().get();
  }
  ~Graph() {
    for (auto& b : bufs_)
      if (b->dev) (void)rt_->device()->free(b->dev);
  }

  // Sets a buffer from float values (rounded to its dtype).
  Result<void> upload(Buf& b, const std::vector<float>& v) {
    if (!dev_) {
      b.host.resize(v.size());
      for (size_t i = 0; i < v.size(); ++i) b.host[i] = kiln::round_to_dtype(v[i], b.dt);
      return kiln::ok();
    }
    std::vector<uint8_t> raw(b.bytes());
    for (size_t i = 0; i < v.size(); ++i) store(raw.data(), b.dt, i, v[i]);
    return rt_->device()->copy_to_device(b.dev, raw.data(), raw.size());
  }
  Result<std::vector<float>> download(const Buf& b) {
    if (!dev_) return b.host;
    std::vector<uint8_t> raw(b.bytes());
    KILN_TRY(rt_->device()->copy_to_host(raw.data(), b.dev, raw.size()));
    std::vector<float> out(static_cast<size_t>(b.elems()));
    for (size_t i = 0; i < out.size(); ++i) out[i] = load(raw.data(), b.dt, i);
    return out;
  }

  // One op call: inputs and outputs in the op's tensor order (`kiln ops`). An output may be the
  // same view as an input (in-place ops). `label` names the call in the breakdown.
  Result<void> run(const std::string& label, const KernelSpec& spec, const std::vector<View>& ins,
                   const std::vector<View>& outs, const std::map<std::string, float>& scalars = {}) {
    if (dev_) {
      std::vector<void*> ptrs;
      for (const View* v : all(ins, outs))
        ptrs.push_back(static_cast<char*>(v->b->dev) + v->offset * static_cast<int64_t>(kiln::dtype_size(v->b->dt)));
      auto launch = [&]() -> Result<void> { return rt_->launch(spec, ptrs, scalars, stream_); };
      if (!breakdown_) return launch();
      KILN_ASSIGN_OR_RETURN(float ms, rt_->device()->time_ms(stream_, launch));
      auto& t = times_[label];
      t.first += ms;
      t.second += 1;
      return kiln::ok();
    }
    // Host: the op's float64 reference on contiguous copies of the views.
    std::vector<std::vector<float>> inputs;
    for (const View& v : ins) inputs.push_back(gather(v));
    KILN_ASSIGN_OR_RETURN(auto refs, kiln::reference(host_spec(spec), scalars, inputs));
    if (refs.size() != outs.size())
      return kiln::make_error(kiln::Errc::invalid_argument, fmt::format("{}: the reference gave {} outputs, the graph expects {}",
                                                                label, refs.size(), outs.size()));
    for (size_t i = 0; i < outs.size(); ++i) scatter(outs[i], refs[i].values);
    return kiln::ok();
  }

  const std::map<std::string, std::pair<double, int>>& times() const { return times_; }
  void clear_times() { times_.clear(); }
  void set_breakdown(bool on) { breakdown_ = on; }

 private:
  static std::vector<const View*> all(const std::vector<View>& a, const std::vector<View>& b) {
    std::vector<const View*> out;
    for (const View& v : a) out.push_back(&v);
    for (const View& v : b) out.push_back(&v);
    return out;
  }
  // The host reference reads contiguous tensors: row strides of views are dropped from the spec.
  static KernelSpec host_spec(KernelSpec s) {
    for (const char* p : {"q_row_stride", "k_row_stride", "v_row_stride"}) s.params.erase(p);
    return s;
  }
  static std::vector<float> gather(const View& v) {
    std::vector<float> out;
    out.reserve(static_cast<size_t>(v.rows * v.cols));
    for (int64_t r = 0; r < v.rows; ++r)
      for (int64_t c = 0; c < v.cols; ++c) out.push_back(v.b->host[static_cast<size_t>(v.offset + r * v.stride + c)]);
    return out;
  }
  static void scatter(const View& v, const std::vector<double>& values) {
    for (int64_t r = 0; r < v.rows; ++r)
      for (int64_t c = 0; c < v.cols; ++c) {
        const size_t i = static_cast<size_t>(r * v.cols + c);
        const double x = i < values.size() ? values[i] : std::nan("");
        v.b->host[static_cast<size_t>(v.offset + r * v.stride + c)] = kiln::round_to_dtype(static_cast<float>(x), v.b->dt);
      }
  }
  static void store(uint8_t* raw, DType dt, size_t i, float f) {
    switch (dt) {
      case DType::bf16: reinterpret_cast<uint16_t*>(raw)[i] = kiln::float_to_bf16_bits(f); break;
      case DType::f16: reinterpret_cast<uint16_t*>(raw)[i] = kiln::float_to_f16_bits(f); break;
      case DType::i32: reinterpret_cast<int32_t*>(raw)[i] = static_cast<int32_t>(f); break;
      case DType::i64: reinterpret_cast<int64_t*>(raw)[i] = static_cast<int64_t>(f); break;
      default: reinterpret_cast<float*>(raw)[i] = f; break;
    }
  }
  static float load(const uint8_t* raw, DType dt, size_t i) {
    switch (dt) {
      case DType::bf16: return kiln::bf16_bits_to_float(reinterpret_cast<const uint16_t*>(raw)[i]);
      case DType::f16: return kiln::f16_bits_to_float(reinterpret_cast<const uint16_t*>(raw)[i]);
      case DType::i32: return static_cast<float>(reinterpret_cast<const int32_t*>(raw)[i]);
      case DType::i64: return static_cast<float>(reinterpret_cast<const int64_t*>(raw)[i]);
      default: return reinterpret_cast<const float*>(raw)[i];
    }
  }

  kiln::Runtime* rt_;
  bool dev_, breakdown_;
  kiln::Stream stream_ = nullptr;
  std::vector<std::unique_ptr<Buf>> bufs_;
  std::map<std::string, std::pair<double, int>> times_;
};


/// Writes each buffer as raw little-endian fp32 (`NAME.f32`, integers converted exactly below
/// 2^24) into `dir`, and `index["tensors"][NAME]` = {file, shape, dtype} (the buffer's `shape` when
/// set, else [rows, cols]); then `dir/index.json`. The format scripts/llama_step_torch.py and
/// scripts/moe_block_torch.py read.
inline Result<void> dump_tensors(Graph& g, const std::vector<Buf*>& bufs, nlohmann::ordered_json index,
                                 const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return kiln::make_error(kiln::Errc::io_error, fmt::format("--dump {}: {}", dir, ec.message()));
  for (Buf* b : bufs) {
    KILN_ASSIGN_OR_RETURN(auto v, g.download(*b));
    const std::string file = b->name + ".f32";
    std::ofstream out(dir + "/" + file, std::ios::binary);
    out.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
    if (!out) return kiln::make_error(kiln::Errc::io_error, fmt::format("--dump: cannot write {}/{}", dir, file));
    const std::vector<int64_t> shape = b->shape.empty() ? std::vector<int64_t>{b->rows, b->cols} : b->shape;
    index["tensors"][b->name] = {{"file", file}, {"shape", shape}, {"dtype", kiln::dtype_name(b->dt)}};
  }
  std::ofstream out(dir + "/index.json");
  out << index.dump(1) << "\n";
  if (!out) return kiln::make_error(kiln::Errc::io_error, fmt::format("--dump: cannot write {}/index.json", dir));
  return kiln::ok();
}

/// Signal-to-noise ratio of `out` against `ref` in dB, 10 log10(sum ref^2 / sum (out - ref)^2),
/// and the count of non-finite elements of `out`.
struct Snr {
  double db = 0;
  int64_t nonfinite = 0;
};
inline Snr snr_db(const std::vector<float>& out, const std::vector<float>& ref) {
  double err = 0, sig = 0;
  Snr s;
  for (size_t j = 0; j < out.size() && j < ref.size(); ++j) {
    if (!std::isfinite(out[j])) ++s.nonfinite;
    const double e = double(out[j]) - double(ref[j]);
    err += e * e;
    sig += double(ref[j]) * double(ref[j]);
  }
  s.db = 10 * std::log10(std::max(sig, 1e-300) / std::max(err, 1e-300));
  return s;
}

/// One check line, "check: NAME SNR x dB (gate G) PASS|FAIL" (NAME padded to `width`), of an
/// output against its reference; true when it passes (no non-finite value, SNR above `gate` dB).
inline bool report_snr(const std::string& name, const std::vector<float>& out, const std::vector<float>& ref,
                       int width, double gate = 30) {
  const Snr s = snr_db(out, ref);
  const bool ok = s.nonfinite == 0 && s.db > gate;
  std::printf("check: %-*s SNR %6.1f dB (gate %g)%s %s\n", width, name.c_str(), s.db, gate,
              s.nonfinite ? fmt::format(", {} non-finite", s.nonfinite).c_str() : "", ok ? "PASS" : "FAIL");
  return ok;
}

/// Device times of `n` runs of `body` (device events), sorted: [size / 2] is the median.
inline kiln::Result<std::vector<float>> sorted_times(kiln::Device& dev, const std::function<kiln::Result<void>()>& body,
                                                    int64_t n) {
  std::vector<float> ms;
  for (int64_t i = 0; i < n; ++i) {
    KILN_ASSIGN_OR_RETURN(float t, dev.time_ms(nullptr, body));
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  return ms;
}

/// The runtime's options of an example's command line: --backend, --arch, --cache-dir, --record
/// (`record_what` names what the manifest records: "the step", "the block").
struct RuntimeArgs {
  std::string backend = "auto", arch, cache_dir, record;
  void add_to(CLI::App& app, const std::string& record_what) {
    app.add_option("--backend", backend, "auto, cuda, hip or emulator");
    app.add_option("--arch", arch, "with --backend emulator: gfx942 or gfx950");
    app.add_option("--cache-dir", cache_dir, "kernel cache directory (default: KILN_CACHE_DIR, ~/.cache/kiln)");
    app.add_option("--record", record,
                   "append every kernel spec " + record_what + " requests to this manifest (JSON lines)");
  }
  bool emulated() const { return backend == "emulator"; }
};

/// The runtime of `args`, or the exit code `tool` ends with instead: 77 (the tests' "skipped")
/// when --backend emulator finds no emulator, 0 when there is no GPU and no emulator (nothing to
/// run), 1 on any other error; each with its line on stdout or stderr.
struct OpenedRuntime {
  std::unique_ptr<kiln::Runtime> runtime;  // null: end with `exit_code`
  int exit_code = 0;
};
inline OpenedRuntime open_runtime(const char* tool, const RuntimeArgs& args) {
  kiln::RuntimeOptions o;
  o.backend = args.backend;
  o.emulator_target = args.arch;
  o.cache_dir = args.cache_dir;
  o.record_file = args.record;
  auto rt = kiln::Runtime::create(o);
  if (!rt && args.emulated() &&
      (rt.error().code == kiln::Errc::driver_unavailable || rt.error().code == kiln::Errc::unsupported)) {
    std::printf("%s: skipped, the AMD emulator is not available: %s\n", tool, rt.error().message.c_str());
    return {nullptr, 77};
  }
  if (!rt) {
    std::fprintf(stderr, "%s: error: %s\n", tool, rt.error().message.c_str());
    return {nullptr, 1};
  }
  if (!(*rt)->device()) {
    std::printf("%s: no GPU and no --backend emulator: nothing to run\n", tool);
    return {nullptr, 0};
  }
  return {std::move(*rt), 0};
}

/// One check line per buffer pair (report_snr), `ours[i]` of graph `g` against `refs[i]` of the
/// reference graph `host`, names prefixed by `prefix`; true when every line passes.
inline Result<bool> check_buffers(Graph& g, const std::vector<Buf*>& ours, Graph& host, const std::vector<Buf*>& refs,
                                  const std::string& prefix, int width, double gate = 30) {
  bool pass = true;
  for (size_t i = 0; i < ours.size() && i < refs.size(); ++i) {
    KILN_ASSIGN_OR_RETURN(auto a, g.download(*ours[i]));
    KILN_ASSIGN_OR_RETURN(auto b, host.download(*refs[i]));
    pass = report_snr(prefix + ours[i]->name, a, b, width, gate) && pass;
  }
  return pass;
}

/// The per-op time breakdown of one run that `g` timed (Graph::set_breakdown), slowest first:
/// "breakdown (WHAT, each launch timed alone with device events; sum S ms):" and one row per label.
inline void print_breakdown(const Graph& g, const std::string& what) {
  std::vector<std::pair<std::string, std::pair<double, int>>> rows(g.times().begin(), g.times().end());
  std::sort(rows.begin(), rows.end(), [](auto& a, auto& b) { return a.second.first > b.second.first; });
  double total = 0;
  for (auto& r : rows) total += r.second.first;
  std::printf("breakdown (%s, each launch timed alone with device events; sum %.3f ms):\n", what.c_str(), total);
  std::printf("  %-24s %10s %7s %6s\n", "op", "ms", "share", "calls");
  for (auto& [name, t] : rows)
    std::printf("  %-24s %10.3f %6.1f%% %6d\n", name.c_str(), t.first, 100 * t.first / total, t.second);
}

}  // namespace kiln_example
