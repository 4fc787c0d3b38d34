// kiln prewarm: compile every kernel of a manifest for every --arch into the disk cache, with N
// worker threads sharing one Runtime (compile-only, unless --tune: then the kernels for this
// machine's GPU are also tuned on it, one after the other, and the winners kept in the cache).
#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

#include "cache/disk_cache.h"
#include "compile/compiler.h"
#include "support/env.h"
#include "support/fs.h"
#include "tools/kiln/cli.h"

namespace kiln::cli {
namespace {

struct PrewarmOptions {
  std::string manifest;
  std::vector<std::string> arch;
  int jobs = 0;
  std::string cache_dir;
  std::string nvidia_compiler;
  bool tune = false;
  bool json = false;  ///< The summary and the table as one JSON document (docs/json.md).
};

struct Job {
  const ManifestEntry* kernel = nullptr;
  size_t kernel_index = 0;
  const TargetInfo* target = nullptr;
  /// What is built: the manifest's kernel for this target (fp8 in the target's encoding,
  /// manifest_spec_for_target).
  KernelSpec spec;
  // Result
  std::shared_ptr<const CompiledKernel> compiled;
  std::string error;
};

class Progress {
 public:
  Progress(size_t total, bool enabled) : total_(total), enabled_(enabled) {}
  void update(size_t done, size_t compiled, size_t cached, size_t failed) {
    if (!enabled_) return;
    std::lock_guard lock(mu_);
    constexpr size_t kWidth = 30;
    const size_t fill = total_ ? done * kWidth / total_ : kWidth;
    fmt::print(stderr, "\r[{}{}] {}/{}  compiled {}  cached {}  failed {}\033[K", std::string(fill, '#'),
               std::string(kWidth - fill, '.'), done, total_, compiled, cached, failed);
    std::fflush(stderr);
  }
  void finish() {
    if (!enabled_) return;
    std::lock_guard lock(mu_);
    fmt::print(stderr, "\r\033[K");
    std::fflush(stderr);
  }

 private:
  std::mutex mu_;
  size_t total_;
  bool enabled_;
};

std::string spills(const KernelInfo& i) {
  if (i.spill_stores < 0 && i.spill_loads < 0) return "-";
  if (i.spill_loads < 0) return std::to_string(i.spill_stores);
  return fmt::format("{}/{}", std::max(i.spill_stores, 0), i.spill_loads);
}

int run_prewarm(const PrewarmOptions& o) {
  // 1. Everything that can be wrong is checked before the first compile and before the cache is
  //    touched: the targets, the manifest, every kernel against every target.
  auto targets = parse_targets(o.arch);
  if (!targets) return fail(targets.error(), 2);
  if (o.jobs < 0) return fail(fmt::format("-j {}: give a positive number of workers", o.jobs), 2);
  auto manifest = read_manifest(o.manifest);
  if (!manifest) return fail(manifest.error());
  for (const std::string& w : manifest->warnings) warn(w);
  if (auto valid = validate_manifest(*manifest, *targets, o.manifest); !valid) return fail(valid.error());
  if (manifest->kernels.empty()) return fail(fmt::format("'{}': the manifest has no kernels", o.manifest));
  const std::string nvcc = nvidia_compiler(o.nvidia_compiler);
  for (const TargetInfo* t : *targets) {
    if (auto c = compiler_for(*t, nvcc); !c)
      return fail(fmt::format("cannot compile for {}: {}", t->name, c.error().message));
  }
  if (!env().disk_cache)
    return fail("the disk cache is disabled (KILN_DISABLE_DISK_CACHE); prewarm would keep nothing");
  if (o.tune) {
    // Before the cache is touched: without a GPU, --tune fails and leaves nothing behind.
    RuntimeOptions probe;
    probe.disk_cache = false;
    auto gpu = Runtime::create(probe);
    if (!gpu || !(*gpu)->device())
      return fail("--tune times kernels on this machine's GPU, and no NVIDIA or AMD GPU was found; "
                  "prewarm without --tune compiles for every --arch without one");
  }
  const std::string root = cache_root(o.cache_dir);
  if (auto disk = DiskCache::open(root); !disk) return fail(disk.error());

  RuntimeOptions ro;
  ro.backend = o.tune ? "auto" : "none";
  ro.cache_dir = root;
  ro.nvidia_compiler = nvcc;
  auto runtime = Runtime::create(ro);
  if (!runtime) return fail(runtime.error());
  Runtime& rt = **runtime;
  if (o.tune && !rt.device()) return fail("--tune: the GPU found a moment ago cannot be opened now");

  // 2. Compile every (kernel, target) pair; workers pull the next pair from an atomic index.
  std::vector<Job> jobs;
  for (size_t k = 0; k < manifest->kernels.size(); ++k)
    for (const TargetInfo* t : *targets) {
      Job job;
      job.kernel = &manifest->kernels[k];
      job.kernel_index = k;
      job.target = t;
      job.spec = manifest_spec_for_target(job.kernel->spec, *t);
      jobs.push_back(std::move(job));
    }
  const unsigned hw = std::max(1u, std::thread::hardware_concurrency());
  const size_t workers = std::min<size_t>(o.jobs > 0 ? static_cast<size_t>(o.jobs) : hw, jobs.size());

  Progress progress(jobs.size(), !o.json && ::isatty(STDERR_FILENO) == 1);
  std::atomic<size_t> next{0}, done{0}, compiled{0}, cached{0}, failed{0}, remote{0};
  // Two manifest kernels may share a cache entry (rmsnorm with another runtime `rows`): the
  // second finds the first's result in memory and counts as cached, not as a second compile.
  std::mutex keys_mu;
  std::set<std::string> keys;
  progress.update(0, 0, 0, 0);
  const auto t0 = std::chrono::steady_clock::now();
  auto work = [&] {
    for (size_t i = next.fetch_add(1); i < jobs.size(); i = next.fetch_add(1)) {
      Job& job = jobs[i];
      auto r = rt.compile(job.spec, job.target->name);
      if (r) {
        job.compiled = std::move(r).value();
        bool first = true;
        {
          std::lock_guard lock(keys_mu);
          first = keys.insert(job.compiled->info().cache_key).second;
        }
        const std::string_view origin = job.compiled->origin();
        (first && origin == "compiled" ? compiled : first && origin == "remote" ? remote : cached)++;
      } else {
        job.error = r.error().message;
        failed++;
      }
      const size_t d = ++done;
      progress.update(d, compiled.load(), cached.load() + remote.load(), failed.load());
    }
  };
  std::vector<std::thread> pool;
  for (size_t w = 0; w + 1 < workers; ++w) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  progress.finish();

  // 3. --tune: the kernels built for this GPU's target, one at a time (timings need the GPU to
  //    themselves), each once (kernels that share a cache entry share a tuning record).
  size_t tuned = 0, from_records = 0, untunable = 0, tune_failed = 0;
  if (o.tune) {
    const TargetInfo& local = rt.device()->target();
    std::vector<const Job*> to_tune;
    std::set<std::string> seen;
    for (const Job& job : jobs)
      if (job.target == &local && job.compiled && seen.insert(job.compiled->info().cache_key).second)
        to_tune.push_back(&job);
    if (to_tune.empty())
      warn(fmt::format("--tune: nothing to tune: no kernel was built for this GPU's target {} (add it to --arch)",
                       local.name));
    for (size_t i = 0; i < to_tune.size(); ++i) {
      const KernelSpec& spec = to_tune[i]->spec;
      const std::string head = fmt::format("tune [{}/{}] {}:", i + 1, to_tune.size(), spec_summary(spec));
      auto r = rt.tune(spec);
      if (!r) {
        ++tune_failed;
        if (!o.json) fmt::print("{} failed: {}\n", head, first_line(r.error().message));
      } else if (r->candidates.size() == 1) {
        ++untunable;
        if (!o.json) fmt::print("{} one configuration, nothing to tune\n", head);
      } else {
        ++(r->from_record ? from_records : tuned);
        const TuneCandidate& w = r->candidates[r->winner];
        if (!o.json)
          fmt::print("{} {} {} ({:.4f} ms{})\n", head, r->from_record ? "from record:" : "winner", config_string(w.config),
                   w.median_ms, r->from_record ? "" : fmt::format(", {} candidates", r->candidates.size()));
        if (globals().verbose && !o.json) fmt::print("{}", format_candidates(*r, spec_flops(spec), "    "));
      }
      std::fflush(stdout);
    }
  }
  const double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  // What is on disk now: a compiled kernel the cache did not keep (a full disk, a budget smaller
  // than the kernels, an eviction by another process) is built, but not prewarmed.
  std::set<std::string> asked, not_kept;
  {
    std::unique_ptr<DiskCache> disk;
    if (!rt.cache_dir().empty())
      if (auto opened = DiskCache::open(rt.cache_dir(), /*read_only=*/true)) disk = std::move(opened).value();
    for (const Job& job : jobs) {
      if (!job.compiled) continue;
      const std::string& key = job.compiled->info().cache_key;
      asked.insert(key);
      if (!disk || !disk->contains(key)) not_kept.insert(key);
    }
  }

  // 4. Summary, then the table of what was built (or both as one JSON document).
  if (o.json) {
    const CacheStats stats = rt.stats();
    nlohmann::json doc = {{"schema", "kiln.prewarm"}, {"schema_version", 1}};
    doc["manifest"] = o.manifest;
    doc["targets"] = nlohmann::json::array();
    for (const TargetInfo* t : *targets) doc["targets"].push_back(std::string(t->name));
    nlohmann::json summary = {{"kernels", manifest->kernels.size()},
                              {"builds", jobs.size()},
                              {"repeated", manifest->duplicates},
                              {"compiled", compiled.load()},
                              {"already_cached", cached.load()},
                              {"remote_hits", remote.load()},
                              {"failed", failed.load()},
                              {"not_kept", not_kept.size()},
                              {"wall_s", wall_s},
                              {"workers", workers},
                              {"cache", rt.cache_dir().empty() ? nlohmann::json(nullptr) : nlohmann::json(rt.cache_dir())},
                              {"disk_errors", stats.disk_errors},
                              {"corrupt_entries", stats.corrupt_entries}};
    if (o.tune)
      summary["tuning"] = {{"device", rt.device()->name()}, {"tuned", tuned},           {"from_records", from_records},
                           {"one_configuration", untunable}, {"failed", tune_failed}};
    doc["summary"] = std::move(summary);
    doc["kernels"] = nlohmann::json::array();
    doc["failures"] = nlohmann::json::array();
    for (const Job& job : jobs) {
      nlohmann::json row = {{"index", job.kernel_index},
                            {"label", job.kernel->label},
                            {"line", job.kernel->line},
                            {"target", std::string(job.target->name)},
                            {"kernel", spec_summary(job.spec)},
                            {"op", job.spec.op},
                            {"dtype", std::string(dtype_name(job.spec.dtype))},
                            {"out_dtype", std::string(dtype_name(job.spec.out_dtype))}};
      if (!job.compiled) {
        row["error"] = job.error;
        doc["failures"].push_back(std::move(row));
        continue;
      }
      const KernelInfo& i = job.compiled->info();
      auto known_or_null = [](int v) { return v < 0 ? nlohmann::json(nullptr) : nlohmann::json(v); };
      row["format"] = i.code_format;
      row["bytes"] = i.code_bytes;
      row["registers"] = known_or_null(i.registers);
      row["shared_bytes"] = known_or_null(i.shared_bytes);
      row["spill_stores"] = known_or_null(i.spill_stores);
      row["spill_loads"] = known_or_null(i.spill_loads);
      row["compile_ms"] = i.compile_ms;
      row["origin"] = std::string(job.compiled->origin());
      row["cache_key"] = i.cache_key;
      doc["kernels"].push_back(std::move(row));
    }
    fmt::print("{}\n", doc.dump(2, ' ', false, nlohmann::json::error_handler_t::replace));
    std::fflush(stdout);
    if (!failed.load() && !tune_failed) return 0;
    return fail(failed.load() ? fmt::format("{} of {} builds failed", failed.load(), jobs.size())
                              : fmt::format("{} kernels could not be tuned", tune_failed));
  }
  std::string names;
  for (const TargetInfo* t : *targets) names += fmt::format("{}{}", names.empty() ? "" : ",", t->name);
  const size_t nk = manifest->kernels.size(), nt = targets->size();
  fmt::print("kiln prewarm {}: {} kernel{} x {} target{} ({}) = {} build{}\n", o.manifest, nk, nk == 1 ? "" : "s", nt,
             nt == 1 ? "" : "s", names, jobs.size(), jobs.size() == 1 ? "" : "s");
  if (manifest->duplicates)
    fmt::print("  repeated        {} (kernels listed again in the recording; built once)\n", manifest->duplicates);
  fmt::print("  compiled        {}\n", compiled.load());
  fmt::print("  already cached  {}\n", cached.load());
  fmt::print("  failed          {}\n", failed.load());
  if (!not_kept.empty())
    fmt::print("  not kept        {} of {} built (not in the cache now: disk full, read-only, or a budget "
               "(KILN_CACHE_MAX_SIZE) too small for them)\n",
               not_kept.size(), asked.size());
  if (remote.load() || std::getenv("KILN_REMOTE_CACHE"))
    fmt::print("  remote hits     {} (compiled by another node, fetched from the remote cache)\n", remote.load());
  if (o.tune)
    fmt::print("  tuned           {} on {} ({} from records, {} with one configuration, {} failed)\n", tuned,
               rt.device()->name(), from_records, untunable, tune_failed);
  for (const Job& job : jobs) {
    if (job.error.empty()) continue;
    const std::string label = job.kernel->label.empty() ? spec_summary(job.spec) : printable(job.kernel->label, 80);
    const std::string where =
        job.kernel->line ? fmt::format("line {}", job.kernel->line) : fmt::format("kernel {}", job.kernel_index);
    fmt::print("    {} ({}) for {}: {}\n", where, label, job.target->name, first_line(job.error));
  }
  fmt::print("  wall time       {:.1f} s with {} worker{}\n", wall_s, workers, workers == 1 ? "" : "s");
  fmt::print("  cache           {}\n", rt.cache_dir().empty() ? "(memory only: nothing was kept)" : rt.cache_dir());
  const CacheStats stats = rt.stats();
  if (stats.disk_errors) fmt::print("  cache writes that failed: {}\n", stats.disk_errors);
  if (stats.corrupt_entries) fmt::print("  corrupt entries rebuilt:  {}\n", stats.corrupt_entries);

  Table table({"label", "target", "kernel", "format", "bytes", "regs", "LDS/shared", "spills", "compile ms", "origin"});
  for (const Job& job : jobs) {
    if (!job.compiled) continue;
    const KernelInfo& i = job.compiled->info();
    table.add({job.kernel->label.empty() ? fmt::format("#{}", job.kernel_index) : printable(job.kernel->label, 80),
               std::string(job.target->name), spec_summary(job.spec), i.code_format,
               std::to_string(i.code_bytes), known(i.registers), known(i.shared_bytes), spills(i),
               fmt::format("{:.0f}", i.compile_ms), std::string(job.compiled->origin())});
  }
  fmt::print("\n{}", table.render({4, 5, 6, 7, 8}));
  std::fflush(stdout);
  if (!asked.empty() && not_kept.size() == asked.size())
    return fail(fmt::format("none of the {} kernels built is in the cache '{}' (see 'not kept'); prewarm kept nothing",
                            asked.size(), rt.cache_dir().empty() ? "(memory only)" : rt.cache_dir()));
  if (!not_kept.empty())
    warn(fmt::format("{} of {} kernels built were not kept in the cache", not_kept.size(), asked.size()));
  if (!failed.load() && !tune_failed) return 0;
  if (!failed.load()) return fail(fmt::format("{} kernels could not be tuned", tune_failed));
  fail(fmt::format("{} of {} builds failed{}", failed.load(), jobs.size(),
                   globals().verbose ? "" : " (--verbose prints the compiler logs)"));
  if (globals().verbose) {
    for (const Job& job : jobs)
      if (!job.error.empty()) fmt::print(stderr, "--- kernel {} for {}:\n{}\n", job.kernel_index, job.target->name, job.error);
  }
  return 1;
}

}  // namespace

Command add_prewarm_command(CLI::App& app) {
  auto o = std::make_shared<PrewarmOptions>();
  auto* cmd = app.add_subcommand("prewarm", "Compile every kernel of a manifest for the given targets into the cache");
  cmd->add_option("manifest", o->manifest, "Manifest file (see 'kiln manifest')")->required();
  cmd->add_option("--arch", o->arch, "Targets, comma-separated: gfx942, gfx950, sm_90a, or all")
      ->required()
      ->delimiter(',');
  cmd->add_option("-j,--jobs", o->jobs, "Parallel compiles (default: the number of hardware threads)");
  add_cache_dir_option(*cmd, o->cache_dir);
  add_nvidia_compiler_option(*cmd, o->nvidia_compiler);
  cmd->add_flag("--json", o->json,
                "Print the summary and the table as one JSON document on stdout (schema: docs/json.md); no progress bar");
  cmd->add_flag("--tune", o->tune,
                "Also tune the kernels built for this machine's GPU (needs one): time each tuning candidate and keep "
                "the winner in the cache, for every later process");
  return [o] { return run_prewarm(*o); };
}

}  // namespace kiln::cli
