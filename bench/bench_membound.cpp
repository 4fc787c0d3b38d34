// Memory-bound ops on the GPU: Kiln's kernels on the shapes of issue 8 (tokens 8192 and 32768;
// hidden 4096, 8192, 16384; intermediate 14336, 29568, 53248; fp8 quantization of [tokens, 4096]
// and [tokens, 14336] in each granularity; RoPE and embedding of Llama-3.1-8B, issue 16; cross-entropy
// forward and backward of [8192, 128256], [8192, 152064] and [16384, 32000] logits; the MoE router, permutation
// and unpermutation of DeepSeek-V3 at 16384 tokens, issue 18), checked against the CPU reference
// (sampled rows) and timed with device events on the checked tensors (inputs made once per case,
// on every core): median and standard deviation of the per-launch time over 30 launches after 5
// warm-ups. Every case's kernels are compiled first, on every core (support/parallel.h); stdout
// adds that time, each case's wall time (inputs, check, timing) and the total. As
// triton.testing.do_bench times the peers: before each
// timed launch a 256 MiB memset evicts L2 and keeps the GPU busy while the host enqueues the
// start event and the launch, so the time is the kernel's, not the host's launch latency.
// GB/s counts the bytes that must move: every input read once and every output written once
// (OpTemplate::bytes). Writes one CSV row per case (BENCHMARKS.md columns for memory-bound ops):
//   label,rows,cols,bytes,Check,GB/s,GB/s_stddev,Time (ms)
// bench/membound_peers.py times PyTorch eager, torch.compile and the device-to-device copy on the
// same shapes in the same job, and prints the report with the ratios.
//
//   build/bench/bench_membound OUT.csv [--quick] [--only rope,embedding]
//   build/bench/bench_membound --list [--quick] [--only ...]     the cases, without a GPU
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "support/parallel.h"
#include "templates/registry.h"

namespace {

struct Case {
  std::string label;
  kiln::KernelSpec spec;
  int64_t rows, cols;
};

std::vector<Case> cases(bool quick) {
  std::vector<Case> out;
  const int64_t tokens[] = {8192, 32768};
  const int64_t hiddens[] = {4096, 8192, 16384};
  const int64_t inters[] = {14336, 29568, 53248};
  const kiln::DType bf16 = kiln::DType::bf16;
  for (int64_t t : tokens) {
    if (quick && t != 8192) continue;
    for (int64_t h : hiddens) {
      out.push_back({"rmsnorm", {"rmsnorm", bf16, bf16, {{"rows", t}, {"hidden", h}}}, t, h});
      out.push_back({"rmsnorm_residual", {"rmsnorm", bf16, bf16, {{"rows", t}, {"hidden", h}, {"residual", 1}, {"save_rstd", 1}}}, t, h});
      out.push_back({"rmsnorm_bwd", {"rmsnorm_bwd", bf16, bf16, {{"rows", t}, {"hidden", h}}}, t, h});
    }
    // rmsnorm_bwd with the residual stream's gradient added to dx (a Llama step's backward at each
    // norm): [8192, 4096] only, the Llama-3.1-8B step's shape.
    if (t == 8192)
      out.push_back({"rmsnorm_bwd_dres",
                     {"rmsnorm_bwd", bf16, bf16, {{"rows", t}, {"hidden", 4096}, {"residual_grad", 1}}},
                     t,
                     4096});
    for (int64_t i : inters) {
      out.push_back({"swiglu", {"swiglu", bf16, bf16, {{"rows", t}, {"intermediate", i}}}, t, i});
      out.push_back({"swiglu_bwd", {"swiglu_bwd", bf16, bf16, {{"rows", t}, {"intermediate", i}}}, t, i});
    }
    // fp8 quantization (bf16 -> e4m3) of an activation [t, 4096] and of an MLP activation [t, 14336].
    const char* const granularities[] = {"tensorwise", "rowwise", "block1x128", "block128x128"};
    for (int64_t cols : {int64_t{4096}, int64_t{14336}})
      for (int64_t g = 0; g < 4; ++g)
        out.push_back({std::string("quantize_fp8_") + granularities[g],
                       {"quantize_fp8", bf16, kiln::DType::e4m3, {{"rows", t}, {"cols", cols}, {"granularity", g}}},
                       t, cols});
    // RoPE of Llama-3.1-8B's q [t, 32, 128] and k [t, 8, 128] in one launch (cols: (32 + 8) x 128):
    // cos/sin computed in the kernel (theta 500000, llama3 scaling, one sequence of t tokens), or
    // read from an fp32 cache [8192, 64] at int32 positions; the backward with computed cos/sin.
    const std::map<std::string, int64_t> rope = {{"tokens", t},         {"heads", 32},  {"kv_heads", 8},
                                           {"head_dim", 128},     {"batch", 1},   {"rope_theta", 500000},
                                           {"scaling", 1}};
    const std::map<std::string, int64_t> rope_cache = {{"tokens", t},   {"heads", 32},  {"kv_heads", 8}, {"head_dim", 128},
                                                 {"positions", 1}, {"cos_sin", 1}, {"max_pos", 8192}};
    out.push_back({"rope", {"rope", bf16, bf16, rope}, t, 40 * 128});
    out.push_back({"rope_cache", {"rope", bf16, bf16, rope_cache}, t, 40 * 128});
    out.push_back({"rope_bwd", {"rope_bwd", bf16, bf16, rope}, t, 40 * 128});
    // Embedding of Llama-3.1-8B: W [128256, 4096], t int64 ids; dW in fp32, then in bf16.
    const std::map<std::string, int64_t> emb = {{"tokens", t}, {"vocab", 128256}, {"hidden", 4096}, {"ids_dtype", 1}};
    out.push_back({"embedding", {"embedding", bf16, bf16, emb}, t, 4096});
    out.push_back({"embedding_bwd", {"embedding_bwd", bf16, bf16, emb}, t, 4096});
    // dW in bf16 (dw_dtype = dy), the dtype of PyTorch's gradient (its peer's).
    std::map<std::string, int64_t> emb_dy = emb;
    emb_dy["dw_dtype"] = 1;
    out.push_back({"embedding_bwd_dy", {"embedding_bwd", bf16, bf16, emb_dy}, t, 4096});
  }
  // Cross-entropy over Llama-3 (128256), Qwen2.5 (152064) and Llama-2 (32000) vocabularies:
  // the forward (loss and lse), the backward into its own buffer and in place over the logits, and
  // both in one launch.
  const std::pair<int64_t, int64_t> ce_shapes[] = {{8192, 128256}, {8192, 152064}, {16384, 32000}};
  for (const auto& [t, v] : ce_shapes) {
    if (quick && v != 128256) continue;
    out.push_back({"cross_entropy", {"cross_entropy", bf16, bf16, {{"tokens", t}, {"vocab", v}}}, t, v});
    out.push_back({"cross_entropy_bwd", {"cross_entropy_bwd", bf16, bf16, {{"tokens", t}, {"vocab", v}}}, t, v});
    out.push_back({"cross_entropy_bwd_inplace",
                   {"cross_entropy_bwd", bf16, bf16, {{"tokens", t}, {"vocab", v}, {"inplace", 1}}}, t, v});
    // The loss and dlogits over the logits in one launch (grad_inplace); bytes: one read and one
    // write of the logits.
    out.push_back({"cross_entropy_grad",
                   {"cross_entropy", bf16, bf16, {{"tokens", t}, {"vocab", v}, {"grad_inplace", 1}}}, t, v});
  }
  // MoE of DeepSeek-V3 (issue 18) at 16384 tokens: its routing of fp32 logits [16384, 256] (sigmoid +
  // bias, 8 groups by top-2 sums, 4 kept, top-8, renormalized), and the permutation of bf16 rows
  // of 7168 to 16384 x 8 expert rows and back (weighted), with their backward ops.
  const int64_t moe_t = 16384, moe_h = 7168;
  out.push_back({"moe_router",
                 {"moe_router", kiln::DType::f32, kiln::DType::f32,
                  {{"tokens", moe_t}, {"experts", 256}, {"k", 8}, {"scoring", 1}, {"n_group", 8}, {"topk_group", 4},
                   {"group_score", 1}, {"renormalize", 1}, {"bias", 1}}},
                 moe_t, 256});
  const std::map<std::string, int64_t> moe_rows = {{"tokens", moe_t}, {"hidden", moe_h}, {"k", 8}};
  std::map<std::string, int64_t> moe_permute = moe_rows;
  moe_permute["experts"] = 256;
  out.push_back({"moe_permute", {"moe_permute", bf16, bf16, moe_permute}, moe_t, moe_h});
  out.push_back({"moe_permute_bwd", {"moe_permute_bwd", bf16, bf16, moe_rows}, moe_t, moe_h});
  out.push_back({"moe_unpermute", {"moe_unpermute", bf16, bf16, moe_rows}, moe_t, moe_h});
  out.push_back({"moe_unpermute_bwd", {"moe_unpermute_bwd", bf16, bf16, moe_rows}, moe_t, moe_h});
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Kiln's memory-bound ops on the GPU, checked and timed (peers: bench/membound_peers.py)"};
  std::string out_csv;
  bool quick = false, list = false;
  std::vector<std::string> only;
  app.add_option("out", out_csv, "CSV file to write (label,rows,cols,bytes,Check,GB/s,GB/s_stddev,Time (ms))");
  app.add_flag("--quick", quick, "tokens 8192 only");
  app.add_flag("--list", list, "print the cases and exit (needs no GPU)");
  app.add_option("--only", only, "run only the cases whose label starts with one of these (comma-separated)")
      ->delimiter(',');
  CLI11_PARSE(app, argc, argv);
  std::vector<Case> todo;
  for (Case& c : cases(quick))
    if (only.empty() || std::any_of(only.begin(), only.end(), [&](const std::string& o) { return c.label.rfind(o, 0) == 0; }))
      todo.push_back(std::move(c));
  if (list) {
    for (const Case& c : todo) std::printf("%-28s %s\n", c.label.c_str(), kiln::to_string(c.spec).c_str());
    return 0;
  }
  if (out_csv.empty()) {
    std::fprintf(stderr, "bench_membound: give the CSV file to write (--help)\n");
    return 2;
  }
  auto created = kiln::Runtime::create();
  if (!created) {
    std::fprintf(stderr, "bench_membound: %s\n", created.error().message.c_str());
    return 1;
  }
  kiln::Runtime& rt = **created;
  kiln::Device* dev = rt.device();
  if (!dev) {
    std::printf("bench_membound: no GPU, nothing to time\n");
    return 0;
  }
  std::FILE* csv = std::fopen(out_csv.c_str(), "w");
  if (!csv) {
    std::perror(out_csv.c_str());
    return 1;
  }
  std::fprintf(csv, "label,rows,cols,bytes,Check,GB/s,GB/s_stddev,Time (ms)\n");
  std::printf("%-26s %6s %6s %6s %9s %8s %9s %7s\n", "label", "rows", "cols", "Check", "GB/s", "stddev", "ms", "case s");
  constexpr size_t kFlushBytes = size_t{256} << 20;
  auto flush = dev->malloc(kFlushBytes);
  if (!flush) {
    std::fprintf(stderr, "bench_membound: %s\n", flush.error().message.c_str());
    return 1;
  }
  const auto start = std::chrono::steady_clock::now();
  // Compile (or load) every case's kernels in parallel; the cases below then find them in memory.
  // A failed compile is reported by its case's check.
  kiln::parallel_for(todo.size(), 1, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) (void)rt.kernel(todo[i].spec);
  });
  std::printf("%zu cases' kernels compiled in %.1f s\n", todo.size(),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  for (const Case& c : todo) {
    const kiln::OpTemplate* op = *kiln::find_op(c.spec.op);
    const auto case_start = std::chrono::steady_clock::now();
    // One set of tensors per case: the check makes the inputs (fresh random values drawn on every
    // core, kiln::fill_random) and compares sampled rows; the timer then launches the same kernel
    // on the same tensors, so GPU-sized inputs are made once.
    std::vector<double> ms;
    kiln::CheckOptions co;
    co.sample_rows = 8;
    co.timer = [&](const std::function<kiln::Result<void>()>& launch) -> kiln::Result<double> {
      for (int i = 0; i < 5; ++i) KILN_TRY(launch());
      for (int i = 0; i < 30; ++i) {
        KILN_TRY(dev->memset(*flush, static_cast<uint8_t>(i), kFlushBytes));  // asynchronous: device memory
        KILN_ASSIGN_OR_RETURN(float t, dev->time_ms(nullptr, launch));
        ms.push_back(t);
      }
      std::sort(ms.begin(), ms.end());
      return ms[ms.size() / 2];
    };
    auto check = kiln::check_on_device(rt, c.spec, co);
    const bool pass = check && check->pass;
    if (!check) {
      std::fprintf(stderr, "%s: %s\n", c.label.c_str(), check.error().message.c_str());
      continue;
    }
    if (!pass) std::fprintf(stderr, "%s\n", kiln::format_report(*check).c_str());
    const double bytes = op->bytes(op->with_defaults(c.spec));
    const double median = check->kernel_ms;
    double mean = 0, var = 0;
    for (double m : ms) mean += bytes / (m * 1e6) / ms.size();
    for (double m : ms) var += std::pow(bytes / (m * 1e6) - mean, 2) / ms.size();
    const double gbs = pass && median > 0 ? bytes / (median * 1e6) : 0;  // a FAIL row counts as zero
    const double case_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - case_start).count();
    std::fprintf(csv, "%s,%lld,%lld,%.0f,%s,%.1f,%.1f,%.4f\n", c.label.c_str(), (long long)c.rows, (long long)c.cols,
                 bytes, pass ? "PASS" : "FAIL", gbs, std::sqrt(var), median);
    std::fflush(csv);  // a row survives a time limit
    std::printf("%-26s %6lld %6lld %6s %9.1f %8.1f %9.4f %7.1f\n", c.label.c_str(), (long long)c.rows, (long long)c.cols,
                pass ? "PASS" : "FAIL", gbs, std::sqrt(var), median, case_s);
    std::fflush(stdout);
  }
  std::printf("%zu cases in %.1f s\n", todo.size(),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  (void)dev->free(*flush);
  std::fclose(csv);
  return 0;
}
