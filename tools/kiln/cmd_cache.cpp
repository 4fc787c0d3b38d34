// kiln cache stat|ls|verify|clear|gc|export|import: the on-disk kernel cache (cache/disk_cache.h)
// and cache archives (cache/archive.h).
#include <fmt/format.h>
#include <dirent.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "cache/archive.h"
#include "cache/disk_cache.h"
#include "cache/remote_cache.h"
#include "support/env.h"
#include "support/fs.h"
#include "support/json_read.h"
#include "support/log.h"
#include "support/spec_json.h"
#include "templates/registry.h"
#include "tools/kiln/cli.h"

namespace kiln::cli {
namespace {

struct CacheOptions {
  std::string dir;
  std::string file;                 ///< export, import: the archive
  std::string compression = "zstd";  ///< export
  std::string max_size;             ///< gc
  std::string sign_key;             ///< export --sign
  bool fix = false;                 ///< verify
  bool json = false;                ///< stat, ls, verify: one JSON document (docs/json.md)
};

/// The head of every --json document (docs/json.md): which report, in which schema version.
nlohmann::json json_document(const char* schema) {
  return {{"schema", schema}, {"schema_version", 1}};
}
void print_json(const nlohmann::json& doc) {
  fmt::print("{}\n", doc.dump(2, ' ', false, nlohmann::json::error_handler_t::replace));
  std::fflush(stdout);
}

/// The cache a command works on. `audit`: stat, ls and verify without --fix only read, so a cache
/// this user cannot write (a read-only mount, a shipped layer) is opened read-only for them.
Result<std::unique_ptr<DiskCache>> open_cache(const std::string& option, bool audit = false) {
  const std::string root = cache_root(option);
  auto cache = DiskCache::open(root);
  if (!cache && audit) {
    struct stat st{};
    if (::stat(root.c_str(), &st) == 0 && S_ISDIR(st.st_mode))
      if (auto readable = DiskCache::open(root, /*read_only=*/true)) return readable;
  }
  if (!cache) return make_error(cache.error().code, fmt::format("cannot open the cache: {}", cache.error().message));
  return cache;
}

std::string plural(size_t n, std::string_view one, std::string_view many) {
  return fmt::format("{} {}", n, n == 1 ? one : many);
}
std::string entries_word(size_t n) { return plural(n, "entry", "entries"); }

/// "12.3 KiB (12595 bytes)".
std::string size_text(uint64_t bytes) { return fmt::format("{} ({} bytes)", human_bytes(bytes), bytes); }

/// Directories directly under `path` (0 when it does not exist).
size_t count_dirs(const std::string& path) {
  size_t n = 0;
  if (auto names = list_dir(path))
    for (const DirEntryName& d : *names) n += d.type == DT_DIR;
  return n;
}

/// "nvrtc 13.0" from an entry's meta.json, or "?".
std::string entry_compiler(const EntryStatus& e) {
  auto text = read_file(e.path + "/meta.json", uint64_t{16} << 20);
  if (!text) return "?";
  auto parsed = parse_json(*text, "meta.json");
  const nlohmann::json meta = parsed ? std::move(parsed).value() : nlohmann::json();
  if (!meta.is_object() || !meta.contains("key_fields") || !meta["key_fields"].is_object()) return "?";
  const auto& kf = meta["key_fields"];
  auto str = [&](const char* k) {
    return kf.contains(k) && kf[k].is_string() ? kf[k].get<std::string>() : std::string();
  };
  std::string c = str("compiler");
  if (c.empty()) return "?";
  if (auto v = str("compiler_version"); !v.empty()) c += " " + v;
  return printable(c, 60);
}

/// The byte budget from KILN_CACHE_MAX_SIZE: the value, or nullopt with the reason in `why`.
std::optional<uint64_t> env_budget(std::string& why) {
  const char* text = std::getenv("KILN_CACHE_MAX_SIZE");
  if (!text || !*text) {
    why = "KILN_CACHE_MAX_SIZE is not set";
    return std::nullopt;
  }
  auto size = parse_size(text);
  if (!size || *size == 0) {  // main() refuses such a value before any command runs
    why = fmt::format("KILN_CACHE_MAX_SIZE='{}' is not a positive size like 2G, 500M, 64K or bytes", printable(text, 40));
    return std::nullopt;
  }
  return size;
}

int cache_stat(const CacheOptions& o) {
  auto cache = open_cache(o.dir, /*audit=*/true);
  if (!cache) return fail(cache.error());
  const std::string root = (*cache)->root();
  const auto entries = (*cache)->list(false);
  uint64_t total = 0;
  size_t unreadable = 0;
  std::map<std::string, size_t> targets, compilers;
  for (const EntryStatus& e : entries) {
    total += e.bytes;
    unreadable += !e.ok;
    ++targets[e.target.empty() ? "?" : e.target];
    ++compilers[entry_compiler(e)];
  }
  if (o.json) {
    nlohmann::json doc = json_document("kiln.cache.stat");
    doc["cache"] = root;
    doc["entries"] = entries.size();
    doc["total_bytes"] = total;
    std::string why;
    const auto budget = env_budget(why);
    doc["budget_bytes"] = budget ? nlohmann::json(*budget) : nlohmann::json(nullptr);
    doc["by_target"] = targets;
    doc["by_compiler"] = compilers;
    doc["unreadable"] = unreadable;
    doc["quarantined"] = count_dirs(root + "/v1/corrupt");
    doc["temporary"] = count_dirs(root + "/v1/tmp");
    nlohmann::json tel = (*cache)->telemetry();
    nlohmann::json counters = nlohmann::json::object();
    for (const auto& [k, v] : tel.items())
      if (k != "runtimes" && v.is_number()) counters[k] = k == "compile_ms" ? v : nlohmann::json(v.get<uint64_t>());
    doc["telemetry"] = {{"runtimes", static_cast<uint64_t>(tel.value("runtimes", 0.0))}, {"counters", counters}};
    doc["remote"] = nullptr;
    if (auto remote = remote_cache_options_from_env(); !remote) {
      doc["remote"] = {{"url", nullptr}, {"reachable", false}, {"status", remote.error().message}};
    } else if (*remote) {
      (*remote)->timeout_s = std::min((*remote)->timeout_s, 2.0);
      RemoteCache tier(std::move(**remote));
      auto& log = logger();
      const auto level = log.level();
      log.set_level(spdlog::level::err);
      auto probe = tier.probe();
      log.set_level(level);
      doc["remote"] = {{"url", tier.options().url()}, {"reachable", probe.ok()},
                       {"status", probe ? *probe : probe.error().message}};
    }
    print_json(doc);
    return 0;
  }
  fmt::print("cache        {}\n", root);
  fmt::print("entries      {}\n", entries.size());
  fmt::print("total size   {}\n", size_text(total));
  std::string why;
  if (auto budget = env_budget(why)) {
    fmt::print("budget       {} from KILN_CACHE_MAX_SIZE{}\n", size_text(*budget),
               total > *budget ? "; over it: the next compile or 'kiln cache gc' evicts" : "");
  } else {
    fmt::print("budget       unbounded ({})\n", why);
  }
  std::string t, c;
  for (const auto& [name, n] : targets) t += fmt::format("{}{} {}", t.empty() ? "" : ", ", name, n);
  for (const auto& [name, n] : compilers) c += fmt::format("{}{}: {}", c.empty() ? "" : ", ", name, n);
  fmt::print("by target    {}\n", t.empty() ? "-" : t);
  fmt::print("by compiler  {}\n", c.empty() ? "-" : c);
  if (unreadable)
    fmt::print("unreadable   {} (meta.json missing or malformed; 'kiln cache verify' for details)\n", unreadable);
  if ((*cache)->read_only()) fmt::print("access       read-only (this user cannot write it; audited, not changed)\n");
  fmt::print("quarantined  {} (v1/corrupt: entries that failed verification, moved aside)\n",
             count_dirs(root + "/v1/corrupt"));
  fmt::print("temporary    {} (v1/tmp: being written now, or left by a killed process and removed by the next "
             "writer or 'kiln cache gc')\n",
             count_dirs(root + "/v1/tmp"));
  if (auto remote = remote_cache_options_from_env(); !remote) {
    fmt::print("remote       misconfigured: {}\n", remote.error().message);
  } else if (*remote) {
    (*remote)->timeout_s = std::min((*remote)->timeout_s, 2.0);
    RemoteCache tier(std::move(**remote));
    auto& log = logger();  // the probe's own failure is the line below, not a warning
    const auto level = log.level();
    log.set_level(spdlog::level::err);
    auto probe = tier.probe();
    log.set_level(level);
    fmt::print("remote       {} (KILN_REMOTE_CACHE): {}\n", tier.options().url(),
               probe ? *probe : probe.error().message);
  }
  const nlohmann::json tel = (*cache)->telemetry();
  const auto runtimes = static_cast<uint64_t>(tel.value("runtimes", 0.0));
  if (!runtimes) {
    fmt::print("telemetry    none yet (each Runtime that used the cache adds its counters when it ends)\n");
    return 0;
  }
  auto n = [&](const char* k) { return static_cast<uint64_t>(tel.value(k, 0.0)); };
  fmt::print("telemetry    summed over {} that used this cache (v1/telemetry.jsonl)\n",
             plural(runtimes, "runtime", "runtimes"));
  fmt::print("  memory hits  {}\n", n("memory_hits"));
  fmt::print("  disk hits    {} ({} from read-only layers)\n", n("disk_hits"), n("layer_hits"));
  fmt::print("  compiles     {} ({:.1f} s)\n", n("compiles"), tel.value("compile_ms", 0.0) / 1000.0);
  fmt::print("  lock waits   {}\n", n("lock_waits"));
  fmt::print("  evictions    {}\n", n("evictions"));
  fmt::print("  corrupt      {} (entries that failed verification on load, rebuilt)\n", n("corrupt_entries"));
  fmt::print("  disk errors  {}\n", n("disk_errors"));
  if (n("remote_hits") || n("remote_stores") || n("remote_refused") || n("remote_errors"))
    fmt::print("  remote       {} hits, {} stores, {} refused (not authenticated or malformed), {} errors\n",
               n("remote_hits"), n("remote_stores"), n("remote_refused"), n("remote_errors"));
  return 0;
}

int cache_ls(const CacheOptions& o) {
  auto cache = open_cache(o.dir, /*audit=*/true);
  if (!cache) return fail(cache.error());
  const auto entries = (*cache)->list(false);
  if (o.json) {
    nlohmann::json doc = json_document("kiln.cache.ls");
    doc["cache"] = (*cache)->root();
    doc["entries"] = nlohmann::json::array();
    for (const EntryStatus& e : entries)
      doc["entries"].push_back({{"key", e.key}, {"target", e.target}, {"kernel", e.ok ? e.summary : std::string()},
                                {"bytes", e.bytes}, {"path", e.path}, {"readable", e.ok}, {"problem", e.problem}});
    print_json(doc);
    return 0;
  }
  if (entries.empty()) {
    fmt::print("(no entries in {})\n", (*cache)->root());
    return 0;
  }
  Table table({"key", "target", "kernel", "bytes"});
  for (const EntryStatus& e : entries)
    table.add({e.key.substr(0, 12), e.target.empty() ? "?" : e.target,
               e.ok ? e.summary : fmt::format("({})", e.problem), std::to_string(e.bytes)});
  fmt::print("{}", table.render({3}));
  return 0;
}

/// What `verify --fix` did with one bad entry.
enum class Fix { fixed, removed, failed };

/// Moves the entry aside without the library's own warning (the command reports it).
void quarantine_quietly(DiskCache& cache, const EntryStatus& e) {
  auto& log = logger();
  const auto level = log.level();
  log.set_level(spdlog::level::err);
  cache.quarantine_entry(e.key, e.problem);
  log.set_level(level);
}

/// The spec of an entry from its meta.json's key fields; runtime parameters (not in the key) get
/// their smallest value, which does not change the code.
Result<std::pair<KernelSpec, std::string>> spec_from_meta(const EntryStatus& e, std::string& compiler) {
  auto text = read_file(e.path + "/meta.json", uint64_t{16} << 20);
  if (!text) return make_error(Errc::corrupt, "meta.json is unreadable");
  auto parsed = parse_json(*text, "meta.json");
  const auto meta = parsed ? std::move(parsed).value() : nlohmann::json();
  if (!meta.is_object()) return make_error(Errc::corrupt, "meta.json is not valid JSON");
  const auto kf = meta.value("key_fields", nlohmann::json());
  auto str = [&](const char* k) -> std::string {
    return kf.is_object() && kf.contains(k) && kf[k].is_string() ? kf[k].get<std::string>() : std::string();
  };
  const std::string target = str("target");
  compiler = str("compiler");
  if (target.empty() || compiler.empty())
    return make_error(Errc::corrupt, "meta.json's key fields are incomplete (no target or compiler)");
  KILN_ASSIGN_OR_RETURN(KernelSpec spec, spec_from_json(kf, "meta.json's key fields"));
  KILN_ASSIGN_OR_RETURN(const OpTemplate* op, find_op(spec.op));
  for (const ParamInfo& p : op->params())
    if (!p.baked && !spec.params.count(std::string(p.name)))
      spec.params[std::string(p.name)] = std::max<int64_t>(1, p.min_value);
  KILN_TRY(find_target(target));
  return std::make_pair(std::move(spec), target);
}

int cache_verify(const CacheOptions& o) {
  auto cache = open_cache(o.dir, /*audit=*/!o.fix);
  if (!cache) return fail(cache.error());
  const std::string root = (*cache)->root();
  const auto entries = (*cache)->list(true);
  size_t bad = 0, fixed = 0, removed = 0, failed = 0;
  std::map<std::string, std::unique_ptr<Runtime>> runtimes;  // by NVIDIA compiler
  size_t unreadable = 0;
  // Text lines go to stdout, or with --json into the document's "corrupt" list.
  nlohmann::json corrupt = nlohmann::json::array();
  auto say = [&](const std::string& line) {
    if (!o.json) fmt::print("{}\n", line);
  };
  auto outcome = [&](const char* result, const std::string& detail) {
    if (o.json) corrupt.back()["fix"] = {{"result", result}, {"detail", detail}};
  };
  for (const EntryStatus& e : entries) {
    if (e.ok) continue;
    if (e.unreadable) {  // a read error, not bad content: reported, never moved or rebuilt
      ++unreadable;
      fmt::print("UNREADABLE  {}  {}: {}\n", e.key.substr(0, 12), e.path, e.problem);
      continue;
    }
    ++bad;
    say(fmt::format("CORRUPT  {}  {}  {}: {}", e.key.substr(0, 12), e.target.empty() ? "?" : e.target, e.path, e.problem));
    if (o.json)
      corrupt.push_back({{"key", e.key}, {"target", e.target}, {"path", e.path}, {"problem", e.problem}, {"fix", nullptr}});
    if (!o.fix) continue;
    // Rebuild from the key fields (read before the entry is moved aside).
    std::string compiler;
    auto spec = spec_from_meta(e, compiler);
    quarantine_quietly(**cache, e);
    if (!spec) {
      ++removed;
      say(fmt::format("  removed  (moved to v1/corrupt/); cannot rebuild it: {}", first_line(spec.error().message)));
      outcome("removed", first_line(spec.error().message));
      continue;
    }
    const auto& [kernel, target] = *spec;
    const bool nvidia = find_target(target).value()->vendor == Vendor::nvidia;
    auto& rt = runtimes[nvidia ? compiler : std::string()];
    std::string error;
    if (!rt) {
      RuntimeOptions ro;
      ro.backend = "none";
      ro.cache_dir = root;
      if (nvidia) ro.nvidia_compiler = compiler;
      auto created = Runtime::create(ro);
      if (created) rt = std::move(created).value();
      else error = created.error().message;
    }
    if (rt && rt->cache_dir() != root) error = "the disk cache is disabled or unusable; nothing would be stored";
    std::shared_ptr<const CompiledKernel> built;
    if (error.empty()) {
      auto compiled = rt->compile(kernel, target);
      if (compiled) built = std::move(compiled).value();
      else error = compiled.error().message;
    }
    if (!built) {
      ++failed;
      say(fmt::format("  failed   {} for {}: {}", spec_summary(kernel), target, first_line(error)));
      outcome("failed", first_line(error));
      continue;
    }
    ++fixed;
    const std::string& key = built->info().cache_key;
    const std::string moved =
        key == e.key ? std::string()
                     : fmt::format(" under the new key {} (the compiler or the templates changed)", key.substr(0, 12));
    say(fmt::format("  fixed    {} for {} rebuilt ({:.0f} ms){}", spec_summary(kernel), target,
                    built->info().compile_ms, moved));
    outcome("fixed", key);
  }
  runtimes.clear();  // their telemetry goes to the cache now
  if (o.json) {
    nlohmann::json doc = json_document("kiln.cache.verify");
    doc["cache"] = root;
    doc["entries"] = entries.size();
    doc["ok"] = entries.size() - bad - unreadable;
    doc["unreadable"] = unreadable;
    doc["corrupt"] = std::move(corrupt);
    doc["fix"] = o.fix ? nlohmann::json{{"fixed", fixed}, {"removed", removed}, {"failed", failed}} : nlohmann::json(nullptr);
    print_json(doc);
  } else {
    fmt::print("verified {} in {}: {} ok, {} corrupt", entries_word(entries.size()), root,
               entries.size() - bad - unreadable, bad);
    if (unreadable) fmt::print(", {} unreadable", unreadable);
    if (o.fix && bad) fmt::print("; fixed {}, removed {}, failed {}", fixed, removed, failed);
    fmt::print("\n");
    std::fflush(stdout);
  }
  if (unreadable)
    return fail(fmt::format("{} of {} cache entries could not be read (an I/O error, not bad content: they were left "
                            "as they are); run 'kiln cache verify' again",
                            unreadable, entries.size()));
  if (o.fix) {
    if (failed)
      return fail(fmt::format("{} of {} bad cache entries could not be rebuilt (they were moved to v1/corrupt/)",
                              failed, bad));
    return 0;
  }
  if (bad)
    return fail(fmt::format("{} of {} cache entries failed verification (the runtime moves such an entry aside and "
                            "rebuilds it; 'kiln cache verify --fix' rebuilds them now, 'kiln cache clear' removes all)",
                            bad, entries.size()));
  return 0;
}

int cache_clear(const CacheOptions& o) {
  auto cache = open_cache(o.dir);
  if (!cache) return fail(cache.error());
  auto removed = (*cache)->clear();
  if (!removed) return fail(removed.error());
  fmt::print("removed {} from {}\n", entries_word(*removed), (*cache)->root());
  return 0;
}

int cache_gc(const CacheOptions& o) {
  uint64_t budget = 0;
  std::string source;
  if (!o.max_size.empty()) {
    auto size = parse_size(o.max_size);
    if (!size)
      return fail(fmt::format("--max-size '{}': give a size like 2G, 500M, 64K or a number of bytes", printable(o.max_size, 40)), 2);
    // As for KILN_CACHE_MAX_SIZE: a budget is positive. Emptying the cache is 'kiln cache clear'.
    if (*size == 0)
      return fail("--max-size 0: a budget of 0 bytes would keep nothing; 'kiln cache clear' removes every entry", 2);
    budget = *size;
    source = "--max-size";
  } else {
    const char* set = std::getenv("KILN_CACHE_MAX_SIZE");
    if (!set || !*set)
      return fail("no byte budget: give --max-size SIZE (2G, 500M, 64K or bytes) or set KILN_CACHE_MAX_SIZE", 2);
    std::string why;
    auto size = env_budget(why);
    if (!size) return fail(fmt::format("{}; give --max-size SIZE", why), 2);
    budget = *size;
    source = "KILN_CACHE_MAX_SIZE";
  }
  auto cache = open_cache(o.dir);
  if (!cache) return fail(cache.error());
  const std::string root = (*cache)->root();
  const size_t entries_before = (*cache)->list(false).size(), tmp_before = count_dirs(root + "/v1/tmp");
  auto r = (*cache)->collect(budget);
  if (!r) return fail(r.error());
  const size_t entries_after = (*cache)->list(false).size(), tmp_after = count_dirs(root + "/v1/tmp");
  fmt::print("cache        {}\n", root);
  fmt::print("budget       {} from {}\n", size_text(budget), source);
  fmt::print("before       {} in {}\n", size_text(r->bytes_before), entries_word(entries_before));
  fmt::print("after        {} in {}\n", size_text(r->bytes_after), entries_word(entries_after));
  fmt::print("evicted      {} (least recently used first)\n", r->evicted);
  fmt::print("in use       {} (skipped: a process was reading them)\n", r->skipped_in_use);
  fmt::print("temporaries  {} removed (left by killed processes)\n",
             tmp_before > tmp_after ? tmp_before - tmp_after : 0);
  std::fflush(stdout);
  if (r->bytes_after > budget)
    warn(fmt::format("the cache is still over its budget by {} ({} in use were skipped); run 'kiln cache gc' "
                     "again later",
                     human_bytes(r->bytes_after - budget), entries_word(r->skipped_in_use)));
  return 0;
}

int cache_export(const CacheOptions& o) {
  const std::string root = cache_root(o.dir);
  struct stat st{};
  if (::stat(root.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    return fail(fmt::format("cannot export the cache: '{}' does not exist (give --cache-dir)", root));
  auto cache = open_cache(o.dir);
  if (!cache) return fail(cache.error());
  const auto compression = o.compression == "none" ? ArchiveCompression::none : ArchiveCompression::zstd;
  auto r = export_cache(**cache, o.file, compression, o.sign_key);
  if (!r) return fail(r.error());
  fmt::print("exported {} ({}) from {} to {} ({}, {})\n", entries_word(r->entries), human_bytes(r->entry_bytes), root,
             o.file, human_bytes(r->archive_bytes), compression == ArchiveCompression::zstd ? "tar.zst" : "tar");
  if (!r->signer.empty()) fmt::print("  signed   ed25519 key {}\n", r->signer);
  for (const ArchiveEntryInfo& e : r->skipped)
    fmt::print("  skipped  {}  {}  {}: {}\n", e.key.substr(0, 12), e.target.empty() ? "?" : e.target,
               e.summary.empty() ? "?" : e.summary, e.problem);
  std::fflush(stdout);
  if (!r->skipped.empty())
    warn(fmt::format("{} failed verification and {} not exported ('kiln cache verify --fix' rebuilds them)",
                     entries_word(r->skipped.size()), r->skipped.size() == 1 ? "was" : "were"));
  return 0;
}

int cache_import(const CacheOptions& o) {
  auto cache = open_cache(o.dir);
  if (!cache) return fail(cache.error());
  ImportLimits limits;
  if (!env().trusted_keys.empty()) {
    auto keys = load_trusted_keys(env().trusted_keys);
    if (!keys) return fail(keys.error());
    limits.trusted_keys = std::move(keys).value();
  }
  auto r = import_cache(**cache, o.file, limits);
  if (!r) return fail(r.error());
  fmt::print("kiln cache import {}: {} in the archive\n", o.file, entries_word(r->members));
  fmt::print("  imported         {}\n", r->imported.size());
  fmt::print("  already present  {}\n", r->present.size());
  fmt::print("  rejected         {}\n", r->rejected.size());
  if (!r->signer.empty()) fmt::print("  signed by        ed25519 key {} (trusted: KILN_TRUSTED_KEYS)\n", r->signer);
  for (const ArchiveEntryInfo& e : r->rejected)
    fmt::print("    {}  {}  {}: {}\n", e.key.substr(0, 12), e.target.empty() ? "?" : e.target,
               e.summary.empty() ? "?" : e.summary, e.problem);
  fmt::print("  cache            {}\n", (*cache)->root());
  std::fflush(stdout);
  std::string why;
  if (auto budget = env_budget(why); budget && (*cache)->total_bytes() > *budget)
    warn(fmt::format("the cache is now over its budget of {} (KILN_CACHE_MAX_SIZE); 'kiln cache gc' evicts the least "
                     "recently used entries",
                     human_bytes(*budget)));
  if (!r->rejected.empty())
    return fail(fmt::format("{} of {} in '{}' failed verification and {} not imported", r->rejected.size(),
                            entries_word(r->members), o.file, r->rejected.size() == 1 ? "was" : "were"));
  return 0;
}

}  // namespace

Command add_cache_command(CLI::App& app) {
  auto o = std::make_shared<CacheOptions>();
  auto* cmd = app.add_subcommand("cache", "Inspect, collect, repair, export or import the on-disk kernel cache");
  cmd->require_subcommand(1);
  add_cache_dir_option(*cmd, o->dir);
  using Run = int (*)(const CacheOptions&);
  auto chosen = std::make_shared<Run>(nullptr);
  auto add = [&](const char* name, const char* help, Run run) {
    auto* sub = cmd->add_subcommand(name, help);
    add_cache_dir_option(*sub, o->dir);
    sub->callback([chosen, run] { *chosen = run; });
    return sub;
  };
  auto* stat = add("stat",
                   "Entries, size, budget, counts per target and compiler, quarantined and temporary entries, "
                   "telemetry, the remote tier",
                   cache_stat);
  auto* ls = add("ls", "One line per entry: key prefix, target, kernel, bytes", cache_ls);
  auto* verify =
      add("verify", "Check every entry's checksums; exit 1 if any fails (--fix: rebuild them)", cache_verify);
  for (CLI::App* sub : {stat, ls, verify})
    sub->add_flag("--json", o->json, "One JSON document on stdout (schema: docs/json.md)");
  verify->add_flag("--fix", o->fix,
                   "Move each bad entry aside and rebuild it from its key (compile-only); exit 0 when all are "
                   "rebuilt or removed");
  add("clear", "Remove every entry and tuning record", cache_clear);
  auto* gc = add("gc", "Evict least recently used entries down to a byte budget; remove stale temporaries", cache_gc);
  gc->add_option("--max-size", o->max_size, "Budget: 2G, 500M, 64K or bytes (default: $KILN_CACHE_MAX_SIZE)");
  auto* exp = add("export", "Write every entry that verifies to an archive (tar.zst), to carry the cache to other "
                            "machines", cache_export);
  exp->add_option("file", o->file, "Archive to write (e.g. kiln-cache.tar.zst)")->required();
  exp->add_option("--compression", o->compression, "zstd or none (a plain tar)")
      ->check(CLI::IsMember({"zstd", "none"}))
      ->capture_default_str();
  exp->add_option("--sign", o->sign_key,
                  "Sign the archive with this Ed25519 private key (PEM, from 'openssl genpkey -algorithm ed25519'); "
                  "importers with KILN_TRUSTED_KEYS accept only archives signed by their keys");
  auto* imp = add("import", "Add the entries of an archive (from 'kiln cache export') that verify", cache_import);
  imp->add_option("file", o->file, "Archive to read")->required();
  return [o, chosen] {
    return *chosen ? (*chosen)(*o) : fail("give one of: stat, ls, verify, clear, gc, export, import", 2);
  };
}

}  // namespace kiln::cli
