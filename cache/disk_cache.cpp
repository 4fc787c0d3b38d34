#include "cache/disk_cache.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <stdexcept>
#include <csignal>
#include <filesystem>
#include <thread>

#include "cache/cache_key.h"
#include "support/fs.h"
#include "support/json_read.h"
#include "support/log.h"
#include "support/env.h"
#include "support/sha256.h"

namespace fs = std::filesystem;

namespace kiln {
namespace {

std::string source_name(const std::string& target) {
  return target.rfind("sm_", 0) == 0 ? "source.cu" : "source.hip";
}

nlohmann::json info_to_json(const CodeObjectInfo& i) {
  return {{"kernel", i.kernel},           {"registers", i.registers},         {"sgprs", i.sgprs},
          {"agprs", i.agprs},             {"shared_bytes", i.shared_bytes},   {"scratch_bytes", i.scratch_bytes},
          {"spill_stores", i.spill_stores}, {"spill_loads", i.spill_loads},   {"wave_size", i.wave_size},
          {"assembler_report", i.extra}};
}

CodeObjectInfo info_from_json(const nlohmann::json& j) {
  CodeObjectInfo i;
  i.kernel = j.at("kernel").get<std::string>();
  i.registers = json_int(j, "registers");
  i.sgprs = json_int(j, "sgprs");
  i.agprs = json_int(j, "agprs");
  i.shared_bytes = json_int(j, "shared_bytes");
  i.scratch_bytes = json_int(j, "scratch_bytes");
  i.spill_stores = json_int(j, "spill_stores");
  i.spill_loads = json_int(j, "spill_loads");
  i.wave_size = json_int(j, "wave_size");
  i.extra = j.value("assembler_report", "");
  return i;
}

std::span<const uint8_t> as_bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

}  // namespace

FileLock& FileLock::operator=(FileLock&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

FileLock::~FileLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the description releases its OFD lock
}

nlohmann::json entry_metadata(const CacheEntry& e, const std::map<std::string, std::string>& sha,
                              const std::map<std::string, uint64_t>& bytes) {
  nlohmann::json files = nlohmann::json::object();
  for (const auto& [name, digest] : sha) files[name] = {{"sha256", digest}, {"bytes", bytes.at(name)}};
  return {{"format_version", kCacheFormatVersion},
          {"key", e.key},
          {"key_fields", e.key_json},
          {"target", e.target},
          {"kernel_name", e.kernel_name},
          {"code_format", e.compiled.code.format},
          {"info", info_to_json(e.compiled.info)},
          {"compile_ms", e.compiled.compile_ms},
          {"compiler_log", e.compiled.log},
          {"files", files}};
}

Result<std::unique_ptr<DiskCache>> DiskCache::open(const std::string& root, bool read_only) {
  if (root.empty()) return make_error(Errc::invalid_argument, "the cache directory is empty");
  if (!read_only) KILN_TRY(make_dirs(root, 0700));
  struct stat st{};
  if (::stat(root.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    return make_error(Errc::io_error, "cannot open cache directory " + errno_message(root));
  // A writable cache must be ours; a read-only layer may belong to root (shipped with an
  // application). Neither may be writable by anyone else.
  if (st.st_uid != ::geteuid() && !(read_only && st.st_uid == 0))
    return make_error(Errc::io_error,
                      fmt::format("cache directory '{}' is owned by uid {}, not by this user ({}); "
                                  "refusing to load code objects from it (set KILN_CACHE_DIR to a "
                                  "directory of your own)",
                                  root, st.st_uid, ::geteuid()));
  if (st.st_mode & (S_IWGRP | S_IWOTH))
    return make_error(Errc::io_error,
                      fmt::format("cache directory '{}' is writable by group or others (mode {:o}); "
                                  "refusing it, since anyone could plant a code object: chmod 700 it",
                                  root, st.st_mode & 0777));
  if (read_only) return std::unique_ptr<DiskCache>(new DiskCache(root, true));
  for (const char* sub : {"/v1/entries", "/v1/tmp", "/v1/locks", "/v1/corrupt", "/v1/tuning"})
    KILN_TRY(make_dirs(root + sub, 0700));
  if (::access(root.c_str(), W_OK) != 0)
    return make_error(Errc::io_error, "cache directory is not writable: " + errno_message(root));
  auto cache = std::unique_ptr<DiskCache>(new DiskCache(root, false));
  cache->clean_stale_tmp();
  return cache;
}

std::string DiskCache::entry_dir(const std::string& key) const {
  return fmt::format("{}/v1/entries/{}/{}", root_, key.substr(0, 2), key);
}

Result<CacheEntry> DiskCache::read_entry(const std::string& dir, const std::string& key) const {
  // An entry another user owns, or anyone else can write, may hold a planted code object.
  struct stat st{};
  if (::stat(dir.c_str(), &st) != 0) return make_error(Errc::io_error, "entry vanished");
  if ((st.st_uid != ::geteuid() && !(read_only_ && st.st_uid == 0)) || (st.st_mode & (S_IWGRP | S_IWOTH)))
    return make_error(Errc::corrupt, fmt::format("the entry is owned by uid {} with mode {:o}; refusing it",
                                                 st.st_uid, st.st_mode & 0777));
  // A shared lock on meta.json for the whole read: eviction (exclusive, non-blocking) skips the
  // entry meanwhile. The lock goes with the descriptor.
  const std::string meta_path = dir + "/meta.json";
  int fd = ::open(meta_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return make_error(errno == ENOENT && ::access(dir.c_str(), F_OK) != 0 ? Errc::io_error : Errc::corrupt,
                                "cannot open " + errno_message(meta_path));
  FileLock reading(fd);
  struct flock fl{};
  fl.l_type = F_RDLCK;
  if (!read_only_ && ::fcntl(fd, F_OFD_SETLK, &fl) != 0) return make_error(Errc::io_error, "entry is being evicted");
  // From here on the entry cannot be evicted: every failure means a bad entry.
  auto read_part = [&](const std::string& name) -> Result<std::string> {
    auto data = read_file(dir + "/" + name);
    if (!data) return make_error(Errc::corrupt, fmt::format("{} is missing or unreadable", name));
    return data;
  };
  KILN_ASSIGN_OR_RETURN(std::string meta_text, read_part("meta.json"));
  KILN_ASSIGN_OR_RETURN(EntryMetadata meta, parse_entry_metadata(meta_text, key));
  CacheEntry e = std::move(meta.entry);
  for (const auto& [name, want] : meta.files) {
    KILN_ASSIGN_OR_RETURN(std::string data, read_part(name));
    if (data.size() != want.bytes)
      return make_error(Errc::corrupt, fmt::format("{} has {} bytes, meta.json says {}", name, data.size(), want.bytes));
    if (sha256_hex(data) != want.sha256) return make_error(Errc::corrupt, fmt::format("{} fails its SHA-256 check", name));
    if (name == meta.code_name) e.compiled.code.bytes.assign(data.begin(), data.end());
    if (name == meta.source_name) e.source = std::move(data);
  }
  auto target = find_target(e.target);
  if (!target) return make_error(Errc::corrupt, "meta.json names an unknown target");
  KILN_TRY(check_code_object(e.compiled.code, **target));
  return e;
}

Result<EntryMetadata> parse_entry_metadata(std::string_view text, const std::string& key) {
  nlohmann::json meta = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (meta.is_discarded() || !meta.is_object()) return make_error(Errc::corrupt, "meta.json is not valid JSON");
  // nlohmann's typed accessors throw on a wrong type or a missing field: each is a bad entry.
  try {
    if (json_int(meta, "format_version") != kCacheFormatVersion)
      return make_error(Errc::corrupt, "meta.json has another format version");
    if (meta.at("key").get<std::string>() != key) return make_error(Errc::corrupt, "meta.json names another key");
    EntryMetadata m;
    CacheEntry& e = m.entry;
    e.key = key;
    e.key_json = meta.at("key_fields");
    if (!e.key_json.is_object()) return make_error(Errc::corrupt, "meta.json's key_fields is not an object");
    e.target = meta.at("target").get<std::string>();
    e.kernel_name = meta.at("kernel_name").get<std::string>();
    e.compiled.code.format = meta.at("code_format").get<std::string>();
    e.compiled.info = info_from_json(meta.at("info"));
    e.compiled.compile_ms = json_number(meta, "compile_ms");
    e.compiled.log = meta.value("compiler_log", "");
    if (e.key_json.value("target", "") != e.target)
      return make_error(Errc::corrupt, "meta.json's target disagrees with its key");
    m.code_name = "code." + e.compiled.code.format;
    m.source_name = source_name(e.target);
    const auto& files = meta.at("files");
    if (!files.is_object() || !files.contains(m.code_name) || !files.contains(m.source_name))
      return make_error(Errc::corrupt, "meta.json does not list the code object and the source");
    for (const auto& [name, want] : files.items()) {
      if (name.empty() || name.find('/') != std::string::npos || name.find("..") != std::string::npos ||
          name == "meta.json")
        return make_error(Errc::corrupt, "meta.json lists a file outside the entry");
      m.files[name] = {want.at("sha256").get<std::string>(), json_size(want, "bytes")};
    }
    return m;
  } catch (const std::exception& ex) {  // nlohmann's type errors and the typed reads above
    return make_error(Errc::corrupt, fmt::format("meta.json is malformed: {}", ex.what()));
  }
}

void DiskCache::quarantine_entry(const std::string& key, const std::string& why) {
  quarantine(entry_dir(key), key, why);
}

void DiskCache::quarantine(const std::string& dir, const std::string& key, const std::string& why) {
  ++corrupt_;
  if (read_only_) {
    KILN_LOG_WARN("read-only cache entry {} is bad ({}); skipping it", dir, why);
    return;
  }
  const std::string dest = fmt::format("{}/v1/corrupt/{}.{}.{}", root_, key, ::getpid(), tmp_counter_++);
  std::error_code ec;
  fs::rename(dir, dest, ec);
  KILN_LOG_WARN("cache entry {} is corrupt ({}); moved to {} and rebuilding", dir, why, ec ? "(move failed)" : dest);
}

std::optional<CacheEntry> DiskCache::load(const std::string& key) {
  const std::string dir = entry_dir(key);
  struct stat st{};
  if (::stat(dir.c_str(), &st) != 0) return std::nullopt;
  auto entry = read_entry(dir, key);
  if (!entry) {
    // io_error: the entry vanished or is being evicted under us, a plain miss. Anything else is a
    // bad entry: moved aside (or, in a read-only layer, reported and skipped).
    if (entry.error().code != Errc::io_error) quarantine(dir, key, entry.error().message);
    return std::nullopt;
  }
  // Last use, for the least-recently-used eviction.
  if (!read_only_) ::utimensat(AT_FDCWD, dir.c_str(), nullptr, 0);
  return std::move(entry).value();
}

Result<void> DiskCache::store(const CacheEntry& e) {
  const std::string final_dir = entry_dir(e.key);
  if (read_only_) return make_error(Errc::io_error, fmt::format("cache '{}' is a read-only layer", root_));
  const std::string tmp = fmt::format("{}/v1/tmp/{}.{}.{}.{}", root_, e.key, host_tag(), ::getpid(), tmp_counter_++);
  KILN_TRY(make_dirs(tmp, 0700));
  auto cleanup = [&] {
    std::error_code ec;
    fs::remove_all(tmp, ec);
  };
  const std::string code_name = "code." + e.compiled.code.format;
  const std::string src_name = source_name(e.target);
  std::map<std::string, std::string> sha = {{code_name, sha256_hex(e.compiled.code.bytes)},
                                            {src_name, sha256_hex(e.source)}};
  std::map<std::string, uint64_t> bytes = {{code_name, e.compiled.code.bytes.size()}, {src_name, e.source.size()}};
  Result<void> r = write_file_synced(tmp + "/" + code_name, e.compiled.code.bytes);
  test_kill_point("write");
  if (r) r = write_file_synced(tmp + "/" + src_name, as_bytes(e.source));
  // meta.json goes last: an entry directory is only ever renamed into place complete.
  if (r) r = write_file_synced(tmp + "/meta.json", entry_metadata(e, sha, bytes).dump(1));
  if (r) r = sync_dir(tmp);
  if (r) r = make_dirs(fs::path(final_dir).parent_path().string(), 0700);
  if (!r) {
    cleanup();
    return r;
  }
  test_kill_point("publish");
  // NOTES: rename(2) of a directory is atomic on local and network file systems; a reader sees
  // either no entry or a complete one. ENOTEMPTY/EEXIST means another process published first.
  if (::rename(tmp.c_str(), final_dir.c_str()) != 0) {
    const int err = errno;
    cleanup();
    if (err == ENOTEMPTY || err == EEXIST) return ok();
    errno = err;
    return make_error(Errc::io_error, "cannot publish cache entry " + errno_message(final_dir));
  }
  return sync_dir(fs::path(final_dir).parent_path().string());
}

Result<FileLock> DiskCache::lock(const std::string& key, double timeout_s, bool* waited) {
  const std::string path = fmt::format("{}/v1/locks/{}.lock", root_, key);
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return make_error(Errc::io_error, "cannot open lock file " + errno_message(path));
  FileLock held(fd);
  struct flock fl{};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  auto delay = std::chrono::milliseconds(1);
  if (waited) *waited = false;
  // Polling F_OFD_SETLK rather than blocking in F_OFD_SETLKW keeps the wait bounded.
  while (::fcntl(fd, F_OFD_SETLK, &fl) != 0) {
    if (errno != EAGAIN && errno != EACCES && errno != EINTR)
      return make_error(Errc::io_error, "cannot lock " + errno_message(path));
    if (waited) *waited = true;
    if (std::chrono::steady_clock::now() >= deadline)
      return make_error(Errc::timeout,
                        fmt::format("waited {:.0f} s for another process compiling the kernel of "
                                    "'{}'; raise KILN_LOCK_TIMEOUT or check that process",
                                    timeout_s, path));
    std::this_thread::sleep_for(delay);
    delay = std::min(delay * 2, std::chrono::milliseconds(50));
  }
  return held;
}

std::vector<EntryStatus> DiskCache::list(bool verify) const {
  std::vector<EntryStatus> out;
  std::error_code ec;
  for (fs::recursive_directory_iterator it(root_ + "/v1/entries", ec), end; it != end; it.increment(ec)) {
    if (ec) break;
    if (it.depth() != 1 || !it->is_directory()) continue;
    EntryStatus s;
    s.key = it->path().filename().string();
    s.path = it->path().string();
    for (const auto& f : fs::directory_iterator(it->path(), ec)) s.bytes += f.is_regular_file() ? f.file_size() : 0;
    auto meta_text = read_file(s.path + "/meta.json");
    nlohmann::json meta = meta_text ? nlohmann::json::parse(*meta_text, nullptr, false) : nlohmann::json();
    if (meta.is_object()) {
      s.target = meta.value("target", "");
      const auto kf = meta.value("key_fields", nlohmann::json::object());
      s.summary = fmt::format("{} {}", kf.value("op", "?"), kf.value("dtype", "?"));
      if (kf.value("out_dtype", "") != kf.value("dtype", "")) s.summary += "->" + kf.value("out_dtype", "?");
      const nlohmann::json params = kf.value("params", nlohmann::json::object());
      for (const auto& [k, v] : params.items()) s.summary += fmt::format(" {}={}", k, v.dump());
      s.summary += " [" + kf.value("compiler", "?") + "]";
    }
    if (verify) {
      auto e = read_entry(s.path, s.key);
      if (!e) {
        s.ok = false;
        s.problem = e.error().message;
      }
    } else if (!meta.is_object()) {
      s.ok = false;
      s.problem = "meta.json is missing or malformed";
    }
    out.push_back(std::move(s));
  }
  std::sort(out.begin(), out.end(), [](const EntryStatus& a, const EntryStatus& b) { return a.path < b.path; });
  return out;
}

Result<size_t> DiskCache::clear() {
  size_t n = list(false).size();
  std::error_code ec;
  for (const char* sub : {"/v1/entries", "/v1/tmp", "/v1/corrupt", "/v1/tuning"}) {
    fs::remove_all(root_ + sub, ec);
    if (ec) return make_error(Errc::io_error, fmt::format("cannot remove '{}{}': {}", root_, sub, ec.message()));
    KILN_TRY(make_dirs(root_ + sub, 0700));
  }
  return n;
}

uint64_t DiskCache::total_bytes() const {
  uint64_t total = 0;
  for (const auto& e : list(false)) total += e.bytes;
  return total;
}

size_t DiskCache::clean_stale_tmp() {
  size_t removed = 0;
  std::error_code ec;
  const auto now = fs::file_time_type::clock::now();
  for (const auto& d : fs::directory_iterator(root_ + "/v1/tmp", ec)) {
    // <key>.<host>.<pid>.<n>
    const std::string name = d.path().filename().string();
    std::vector<std::string> parts;
    for (size_t pos = 0, next; pos <= name.size(); pos = next + 1) {
      next = name.find('.', pos);
      if (next == std::string::npos) next = name.size();
      parts.push_back(name.substr(pos, next - pos));
    }
    bool stale = false;
    if (parts.size() == 4 && parts[1] == host_tag()) {
      const pid_t pid = static_cast<pid_t>(std::strtol(parts[2].c_str(), nullptr, 10));
      stale = pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH;
    }
    std::error_code tec;
    const auto mtime = fs::last_write_time(d.path(), tec);
    if (!tec && now - mtime > std::chrono::hours(24)) stale = true;
    if (!stale) continue;
    fs::remove_all(d.path(), tec);
    if (!tec) ++removed;
  }
  if (removed) KILN_LOG_INFO("removed {} temporary cache entries left by dead processes", removed);
  return removed;
}

Result<DiskCache::GcResult> DiskCache::collect(uint64_t max_bytes) {
  if (read_only_) return make_error(Errc::io_error, fmt::format("cache '{}' is a read-only layer", root_));
  clean_stale_tmp();
  struct Item {
    std::string key, path;
    uint64_t bytes;
    fs::file_time_type used;
  };
  std::vector<Item> items;
  GcResult r;
  for (const auto& e : list(false)) {
    std::error_code ec;
    items.push_back({e.key, e.path, e.bytes, fs::last_write_time(e.path, ec)});
    r.bytes_before += e.bytes;
  }
  std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.used < b.used; });
  uint64_t total = r.bytes_before;
  for (const Item& item : items) {
    if (total <= max_bytes) break;
    const std::string meta = item.path + "/meta.json";
    int fd = ::open(meta.c_str(), O_RDWR | O_CLOEXEC);  // a write lock needs a writable descriptor
    FileLock held(fd);
    if (fd >= 0) {
      struct flock fl{};
      fl.l_type = F_WRLCK;
      if (::fcntl(fd, F_OFD_SETLK, &fl) != 0) {  // a reader holds it: in use
        ++r.skipped_in_use;
        continue;
      }
    }
    // Rename out of entries/ first (atomic: readers see the entry or nothing), then delete.
    const std::string doomed = fmt::format("{}/v1/tmp/evicted-{}.{}.{}.{}", root_, item.key, host_tag(), ::getpid(), tmp_counter_++);
    if (::rename(item.path.c_str(), doomed.c_str()) != 0) continue;
    std::error_code ec;
    fs::remove_all(doomed, ec);
    total -= std::min(total, item.bytes);
    ++r.evicted;
    ++evictions_;
  }
  r.bytes_after = total;
  if (r.evicted) KILN_LOG_INFO("cache budget {} bytes: evicted {} entries ({} -> {} bytes)", max_bytes, r.evicted, r.bytes_before, r.bytes_after);
  return r;
}

std::string DiskCache::tuning_path(const std::string& key) const {
  return fmt::format("{}/v1/tuning/{}.json", root_, key);
}

Result<std::optional<std::string>> DiskCache::read_tuning(const std::string& key) const {
  const std::string path = tuning_path(key);
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) return std::optional<std::string>();
    return make_error(Errc::io_error, "cannot read tuning record " + errno_message(path));
  }
  // The same rule as for entries: a record anyone else could have written is not trusted.
  if ((st.st_uid != ::geteuid() && !(read_only_ && st.st_uid == 0)) || (st.st_mode & (S_IWGRP | S_IWOTH)) ||
      !S_ISREG(st.st_mode))
    return make_error(Errc::corrupt, fmt::format("tuning record '{}' is owned by uid {} with mode {:o}; refusing it",
                                                 path, st.st_uid, st.st_mode & 0777));
  KILN_ASSIGN_OR_RETURN(std::string text, read_file(path));
  return std::optional<std::string>(std::move(text));
}

Result<std::string> DiskCache::write_tuning(const std::string& key, const std::string& text) {
  if (read_only_) return make_error(Errc::io_error, fmt::format("cache '{}' is a read-only layer", root_));
  // <name>.<host>.<pid>.<n>, as entries: clean_stale_tmp removes it if this process dies now.
  const std::string tmp = fmt::format("{}/v1/tmp/tuning-{}.{}.{}.{}", root_, key, host_tag(), ::getpid(), tmp_counter_++);
  const std::string path = tuning_path(key);
  Result<void> r = make_dirs(root_ + "/v1/tuning", 0700);
  if (r) r = write_file_synced(tmp, text);
  // rename(2) over an older record is atomic: readers see the old record or the new one.
  if (r && ::rename(tmp.c_str(), path.c_str()) != 0) r = make_error(Errc::io_error, "cannot publish tuning record " + errno_message(path));
  if (!r) {
    ::unlink(tmp.c_str());
    return r.take_error();
  }
  KILN_TRY(sync_dir(root_ + "/v1/tuning"));
  return path;
}

void DiskCache::quarantine_tuning(const std::string& key, const std::string& why) {
  ++corrupt_;
  const std::string path = tuning_path(key);
  if (read_only_) {
    KILN_LOG_WARN("read-only tuning record {} is bad ({}); ignoring it", path, why);
    return;
  }
  const std::string dest = fmt::format("{}/v1/corrupt/tuning-{}.{}.{}.json", root_, key, ::getpid(), tmp_counter_++);
  const bool moved = ::rename(path.c_str(), dest.c_str()) == 0;
  KILN_LOG_WARN("tuning record {} is bad ({}); ignoring it{}", path, why, moved ? ", moved to " + dest : "");
}

void DiskCache::append_telemetry(const nlohmann::json& counters) {
  if (read_only_) return;
  const std::string path = root_ + "/v1/telemetry.jsonl";
  const std::string line = counters.dump() + "\n";
  // O_APPEND writes of one short line are atomic with respect to other appenders.
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) return;
  (void)!::write(fd, line.data(), line.size());
  ::close(fd);
}

nlohmann::json DiskCache::telemetry() const {
  nlohmann::json sum = nlohmann::json::object();
  auto text = read_file(root_ + "/v1/telemetry.jsonl");
  if (!text) return sum;
  uint64_t runtimes = 0;
  for (size_t pos = 0; pos < text->size();) {
    size_t end = text->find('\n', pos);
    if (end == std::string::npos) end = text->size();
    auto j = nlohmann::json::parse(text->substr(pos, end - pos), nullptr, false);
    pos = end + 1;
    if (!j.is_object()) continue;  // a torn line from a killed process
    ++runtimes;
    for (const auto& [k, v] : j.items())
      if (v.is_number()) sum[k] = sum.value(k, 0.0) + v.get<double>();
  }
  sum["runtimes"] = runtimes;
  return sum;
}

}  // namespace kiln
