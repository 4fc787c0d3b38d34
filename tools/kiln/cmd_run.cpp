// kiln run: build one kernel for this machine's GPU, check it against the CPU reference and
// optionally tune and time it.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "kiln/check.h"
#include "templates/registry.h"
#include "tools/kiln/cli.h"

namespace kiln::cli {
namespace {

struct RunOptions {
  SpecOptions spec;
  bool check = false;
  bool bench = false;
  bool no_tune = false;
  int64_t sample_rows = -1;
  int iterations = 0;
  std::vector<float> eps;
  uint64_t seed = 0;
  int device = 0;
  std::string cache_dir;
  std::string nvidia_compiler;
  bool emulator = false;  // run in the AMD ISA emulator, as target `arch`
  std::string arch;
  bool json = false;  // one JSON document (docs/json.md, kiln.run)
};

void print_tuning(const TuneReport& r, double flops) {
  if (r.candidates.size() == 1) {
    fmt::print("tuning       one configuration for this spec on {}: nothing to tune\n", r.target);
    return;
  }
  if (r.from_record)
    fmt::print("tuning       from record {} ({} launches per candidate on {}, {})\n", r.record, r.reps, r.device,
               r.created_utc);
  else
    fmt::print("tuning       {} candidates, {} launches each timed alone after a cache flush (median); {}\n", r.candidates.size(),
               r.reps, r.record.empty() ? "not kept (memory-only cache)" : "record " + r.record);
  fmt::print("{}", format_candidates(r, flops, "             "));
}

constexpr int64_t kDefaultSampleRows = 256;
constexpr int kDefaultIterations = 100;

int run_run(const RunOptions& o) {
  auto spec = make_spec(o.spec);
  if (!spec) return fail(spec.error());
  auto op = find_op(spec->op);
  if (!op) return fail(op.error());
  CheckOptions co;
  co.seed = o.seed;
  co.sample_rows = o.sample_rows >= 0 ? o.sample_rows : (o.check ? 0 : kDefaultSampleRows);
  if (o.iterations < 0) return fail(fmt::format("--iterations {}: give a positive count", o.iterations), 2);
  co.bench_iterations = o.bench || o.iterations > 0 ? (o.iterations > 0 ? o.iterations : kDefaultIterations) : 0;
  if (!o.eps.empty()) {
    bool has_eps = false;
    for (const ScalarInfo& s : (*op)->scalars()) has_eps |= s.name == "eps";
    if (!has_eps) return fail(fmt::format("--eps: {} has no eps scalar (see 'kiln ops {}')", spec->op, spec->op), 2);
    co.scalars["eps"] = o.eps.front();
  }

  RuntimeOptions ro;
  ro.backend = "auto";
  if (o.emulator || !o.arch.empty()) {
    if (!o.emulator || (o.arch != "gfx942" && o.arch != "gfx950"))
      return fail("--emulator runs AMD kernels without a GPU: give it with --arch gfx942 or --arch gfx950 (on a GPU, "
                  "'kiln run' uses the GPU's own target)",
                  2);
    if (co.bench_iterations > 0) return fail("--bench/--iterations: the emulator has no timing model", 2);
    ro.backend = "emulator";
    ro.emulator_target = o.arch;
  }
  ro.device = o.device;
  ro.cache_dir = cache_root(o.cache_dir);
  ro.nvidia_compiler = nvidia_compiler(o.nvidia_compiler);
  auto rt = Runtime::create(ro);
  if (!rt) return fail(rt.error());
  Device* device = (*rt)->device();
  if (!device)
    return fail("no GPU found: 'kiln run' needs an NVIDIA or AMD GPU (compile, prewarm and inspect work without one; "
                "AMD kernels also run in an emulator: --emulator --arch gfx942|gfx950)");
  if (auto valid = (*op)->validate(*spec, device->target()); !valid) return fail(valid.error());

  if (!o.json)
    fmt::print("device       {} ({}, {} compute units)\n", device->name(), device->target().name, device->compute_units());
  if (co.bench_iterations > 0 && !o.no_tune) {
    // The benchmark times the tuned kernel: tune() installs its winner for the check below.
    auto tuned = (*rt)->tune(*spec);
    if (!tuned) return fail(tuned.error());
    if (!o.json) print_tuning(*tuned, spec_flops(*spec));
  }
  auto report = check_on_device(**rt, *spec, co);
  if (!report) return fail(report.error());
  if (o.json) {
    nlohmann::json outputs = nlohmann::json::array();
    for (const OutputCheck& c : report->outputs)
      outputs.push_back({{"name", c.name}, {"pass", c.pass}, {"compared", c.compared}, {"nonfinite", c.nonfinite},
                         {"outside_gate", c.gate_failures}, {"max_abs_err", c.max_abs_err}, {"max_rel_err", c.max_rel_err},
                         {"rel_frobenius", c.rel_frobenius}, {"snr_db", c.snr_db}, {"gate", c.gate}});
    nlohmann::json doc = {{"schema", "kiln.run"},
                          {"schema_version", 1},
                          {"spec", report->spec},
                          {"device", device->name()},
                          {"target", std::string(device->target().name)},
                          {"pass", report->pass},
                          {"outputs", outputs},
                          {"accepted", report->accepted},
                          {"accepted_what", report->accepted_what},
                          {"first_call_ms", report->first_call_ms},
                          {"cached_call_ms", report->cached_call_ms},
                          {"origin", report->origin},
                          {"kernel_ms", report->kernel_ms > 0 ? nlohmann::json(report->kernel_ms) : nlohmann::json(nullptr)},
                          {"kernel_flushed", report->kernel_flushed},
                          {"bytes", report->bytes},
                          {"flops", report->flops}};
    fmt::print("{}\n", doc.dump(2, ' ', false, nlohmann::json::error_handler_t::replace));
    std::fflush(stdout);
    return report->pass ? 0 : fail("check failed: " + format_report(*report));
  }
  fmt::print("{}\n", format_report(*report));
  fmt::print("compared     {} elements{}\n", report->compared,
             co.sample_rows > 0 ? fmt::format(" ({} sampled rows; --check compares every row)", co.sample_rows) : "");
  fmt::print("first call   {:.3f} ms ({})\n", report->first_call_ms, report->origin);
  fmt::print("cached call  {:.4f} ms\n", report->cached_call_ms);
  if (co.bench_iterations > 0 && report->kernel_ms > 0) {
    const double s = report->kernel_ms * 1e-3;
    std::string rate = fmt::format("{:.1f} GB/s", report->bytes / s / 1e9);
    if (report->flops > 0) rate = fmt::format("{:.1f} TFLOP/s, {}", report->flops / s / 1e12, rate);
    fmt::print("kernel       {:.4f} ms a launch (median of {} launches, each alone {}, after up to {:.0f} ms of back-to-back launches), {}\n",
               report->kernel_ms, co.bench_iterations, report->kernel_flushed ? "after a cache flush" : "with the caches warm",
               co.bench_settle_ms, rate);
  }
  std::fflush(stdout);
  if (!report->pass) return fail(fmt::format("check failed: {}", format_report(*report)));
  return 0;
}

}  // namespace

Command add_run_command(CLI::App& app) {
  auto o = std::make_shared<RunOptions>();
  auto* cmd = app.add_subcommand("run", "Check one kernel on this machine's GPU against the CPU reference (and time it)");
  add_spec_options(*cmd, o->spec);
  cmd->add_flag("--check", o->check, "Compare every output row (default: a sample of 256 rows)");
  cmd->add_flag("--bench", o->bench,
                fmt::format("Also time the kernel: the median device time of single launches, each after a cache flush, "
                            "after about {:.0f} ms of back-to-back launches (the clock of sustained load; as the tuner "
                            "and bench/ time them), TFLOP/s (gemm), GB/s; tunes it first (the tuning record is kept in "
                            "the cache, so only the first run times the candidates)",
                            CheckOptions{}.bench_settle_ms));
  cmd->add_flag("--no-tune", o->no_tune, "With --bench: time the heuristic's (or an existing record's) configuration, without tuning");
  cmd->add_option("--sample-rows", o->sample_rows, "Output rows compared with the reference (0: all)");
  cmd->add_option("--iterations", o->iterations, "Launches timed with --bench (default 100)");
  cmd->add_option("--eps", o->eps, "rmsnorm's eps (default 1e-5)")->expected(1);
  cmd->add_option("--seed", o->seed, "Random seed of the inputs (default: a fresh one)");
  cmd->add_option("--device", o->device, "GPU ordinal")->capture_default_str();
  add_cache_dir_option(*cmd, o->cache_dir);
  add_nvidia_compiler_option(*cmd, o->nvidia_compiler);
  cmd->add_flag("--emulator", o->emulator,
                "Run in tinygrad's AMD CDNA ISA emulator instead of a GPU (with --arch gfx942|gfx950; no timing). "
                "The emulator is the folder KILN_AMD_EMULATOR names (default: ../shared/third_party/tinygrad-cdna-emu "
                "beside the source tree): six files of https://github.com/tinygrad/tinygrad at commit a9069c177a "
                "with Kiln's patches, run by KILN_EMULATOR_PYTHON (default .venv/bin/python3 of scripts/setup.sh, "
                "with tinygrad 0.14.0 and numpy); docs/emulator.md, 'Getting the emulator', says how to make it");
  cmd->add_option("--arch", o->arch, "With --emulator: the AMD target to emulate, gfx942 or gfx950");
  cmd->add_flag("--json", o->json, "Print the report as one JSON document (docs/json.md: kiln.run)");
  return [o] { return run_run(*o); };
}

}  // namespace kiln::cli
