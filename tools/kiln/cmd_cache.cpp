// kiln cache stat|ls|verify|clear: the on-disk kernel cache (cache/disk_cache.h).
#include <fmt/format.h>

#include <map>
#include <nlohmann/json.hpp>

#include "cache/disk_cache.h"
#include "support/fs.h"
#include "tools/kiln/cli.h"

namespace kiln::cli {
namespace {

Result<std::unique_ptr<DiskCache>> open_cache(const std::string& option) {
  const std::string root = cache_root(option);
  auto cache = DiskCache::open(root);
  if (!cache) return make_error(cache.error().code, fmt::format("cannot open the cache: {}", cache.error().message));
  return cache;
}

/// "nvrtc 13.0" from an entry's meta.json, or "?".
std::string entry_compiler(const EntryStatus& e) {
  auto text = read_file(e.path + "/meta.json");
  if (!text) return "?";
  auto meta = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!meta.is_object() || !meta.contains("key_fields") || !meta["key_fields"].is_object()) return "?";
  const auto& kf = meta["key_fields"];
  auto str = [&](const char* k) { return kf.contains(k) && kf[k].is_string() ? kf[k].get<std::string>() : std::string(); };
  std::string c = str("compiler");
  if (c.empty()) return "?";
  if (auto v = str("compiler_version"); !v.empty()) c += " " + v;
  return c;
}

int cache_stat(const std::string& dir) {
  auto cache = open_cache(dir);
  if (!cache) return fail(cache.error());
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
  fmt::print("cache        {}\n", (*cache)->root());
  fmt::print("entries      {}\n", entries.size());
  fmt::print("total size   {} ({} bytes)\n", human_bytes(total), total);
  std::string t, c;
  for (const auto& [name, n] : targets) t += fmt::format("{}{} {}", t.empty() ? "" : ", ", name, n);
  for (const auto& [name, n] : compilers) c += fmt::format("{}{}: {}", c.empty() ? "" : ", ", name, n);
  fmt::print("by target    {}\n", t.empty() ? "-" : t);
  fmt::print("by compiler  {}\n", c.empty() ? "-" : c);
  if (unreadable) fmt::print("unreadable   {} (meta.json missing or malformed; 'kiln cache verify' for details)\n", unreadable);
  return 0;
}

int cache_ls(const std::string& dir) {
  auto cache = open_cache(dir);
  if (!cache) return fail(cache.error());
  const auto entries = (*cache)->list(false);
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

int cache_verify(const std::string& dir) {
  auto cache = open_cache(dir);
  if (!cache) return fail(cache.error());
  const auto entries = (*cache)->list(true);
  size_t bad = 0;
  for (const EntryStatus& e : entries) {
    if (e.ok) continue;
    ++bad;
    fmt::print("CORRUPT  {}  {}  {}: {}\n", e.key.substr(0, 12), e.target.empty() ? "?" : e.target, e.path, e.problem);
  }
  fmt::print("verified {} entr{} in {}: {} ok, {} corrupt\n", entries.size(), entries.size() == 1 ? "y" : "ies",
             (*cache)->root(), entries.size() - bad, bad);
  std::fflush(stdout);
  if (bad)
    return fail(fmt::format("{} of {} cache entries failed verification (the runtime moves such an entry aside and "
                            "rebuilds it; 'kiln cache clear' removes all)",
                            bad, entries.size()));
  return 0;
}

int cache_clear(const std::string& dir) {
  auto cache = open_cache(dir);
  if (!cache) return fail(cache.error());
  auto removed = (*cache)->clear();
  if (!removed) return fail(removed.error());
  fmt::print("removed {} entr{} from {}\n", *removed, *removed == 1 ? "y" : "ies", (*cache)->root());
  return 0;
}

}  // namespace

Command add_cache_command(CLI::App& app) {
  auto dir = std::make_shared<std::string>();
  auto* cmd = app.add_subcommand("cache", "Inspect or clear the on-disk kernel cache");
  cmd->require_subcommand(1);
  add_cache_dir_option(*cmd, *dir);
  struct Sub {
    const char* name;
    const char* help;
    int (*run)(const std::string&);
  };
  static const Sub subs[] = {
      {"stat", "Entries, total size, counts per target and per compiler", cache_stat},
      {"ls", "One line per entry: key prefix, target, kernel, bytes", cache_ls},
      {"verify", "Check every entry's checksums; exit 1 if any fails", cache_verify},
      {"clear", "Remove every entry", cache_clear},
  };
  auto chosen = std::make_shared<const Sub*>(nullptr);
  for (const Sub& s : subs) {
    auto* sub = cmd->add_subcommand(s.name, s.help);
    add_cache_dir_option(*sub, *dir);
    sub->callback([chosen, &s] { *chosen = &s; });
  }
  return [dir, chosen] { return *chosen ? (*chosen)->run(*dir) : fail("give one of: stat, ls, verify, clear", 2); };
}

}  // namespace kiln::cli
