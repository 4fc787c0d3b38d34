#include "cache/disk_cache.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "cache/cache_key.h"
#include "support/fs.h"
#include "support/log.h"
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
  i.registers = j.at("registers").get<int>();
  i.sgprs = j.at("sgprs").get<int>();
  i.agprs = j.at("agprs").get<int>();
  i.shared_bytes = j.at("shared_bytes").get<int>();
  i.scratch_bytes = j.at("scratch_bytes").get<int>();
  i.spill_stores = j.at("spill_stores").get<int>();
  i.spill_loads = j.at("spill_loads").get<int>();
  i.wave_size = j.at("wave_size").get<int>();
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

Result<std::unique_ptr<DiskCache>> DiskCache::open(const std::string& root) {
  if (root.empty()) return make_error(Errc::invalid_argument, "the cache directory is empty");
  KILN_TRY(make_dirs(root, 0700));
  struct stat st{};
  if (::stat(root.c_str(), &st) != 0) return make_error(Errc::io_error, "cannot stat cache directory " + errno_message(root));
  if (st.st_uid != ::geteuid())
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
  for (const char* sub : {"/v1/entries", "/v1/tmp", "/v1/locks", "/v1/corrupt"})
    KILN_TRY(make_dirs(root + sub, 0700));
  if (::access(root.c_str(), W_OK) != 0)
    return make_error(Errc::io_error, "cache directory is not writable: " + errno_message(root));
  return std::unique_ptr<DiskCache>(new DiskCache(root));
}

std::string DiskCache::entry_dir(const std::string& key) const {
  return fmt::format("{}/v1/entries/{}/{}", root_, key.substr(0, 2), key);
}

Result<CacheEntry> DiskCache::read_entry(const std::string& dir, const std::string& key) const {
  KILN_ASSIGN_OR_RETURN(std::string meta_text, read_file(dir + "/meta.json"));
  nlohmann::json meta = nlohmann::json::parse(meta_text, nullptr, /*allow_exceptions=*/false);
  if (meta.is_discarded() || !meta.is_object()) return make_error(Errc::corrupt, "meta.json is not valid JSON");
  try {
    if (meta.at("format_version").get<int>() != kCacheFormatVersion)
      return make_error(Errc::corrupt, "meta.json has another format version");
    if (meta.at("key").get<std::string>() != key) return make_error(Errc::corrupt, "meta.json names another key");
    CacheEntry e;
    e.key = key;
    e.key_json = meta.at("key_fields");
    e.target = meta.at("target").get<std::string>();
    e.kernel_name = meta.at("kernel_name").get<std::string>();
    e.compiled.code.format = meta.at("code_format").get<std::string>();
    e.compiled.info = info_from_json(meta.at("info"));
    e.compiled.compile_ms = meta.at("compile_ms").get<double>();
    e.compiled.log = meta.value("compiler_log", "");
    if (e.key_json.value("target", "") != e.target)
      return make_error(Errc::corrupt, "meta.json's target disagrees with its key");
    const auto& files = meta.at("files");
    const std::string code_name = "code." + e.compiled.code.format;
    const std::string src_name = source_name(e.target);
    if (!files.contains(code_name) || !files.contains(src_name))
      return make_error(Errc::corrupt, "meta.json does not list the code object and the source");
    for (const auto& [name, want] : files.items()) {
      if (name.find('/') != std::string::npos || name.find("..") != std::string::npos)
        return make_error(Errc::corrupt, "meta.json lists a file outside the entry");
      KILN_ASSIGN_OR_RETURN(std::string data, read_file(dir + "/" + name));
      if (data.size() != want.at("bytes").get<uint64_t>())
        return make_error(Errc::corrupt, fmt::format("{} has {} bytes, meta.json says {}", name, data.size(),
                                                     want.at("bytes").get<uint64_t>()));
      if (sha256_hex(data) != want.at("sha256").get<std::string>())
        return make_error(Errc::corrupt, fmt::format("{} fails its SHA-256 check", name));
      if (name == code_name) e.compiled.code.bytes.assign(data.begin(), data.end());
      if (name == src_name) e.source = std::move(data);
    }
    auto target = find_target(e.target);
    if (!target) return make_error(Errc::corrupt, "meta.json names an unknown target");
    KILN_TRY(check_code_object(e.compiled.code, **target));
    return e;
  } catch (const nlohmann::json::exception& ex) {
    return make_error(Errc::corrupt, fmt::format("meta.json is malformed: {}", ex.what()));
  }
}

void DiskCache::quarantine(const std::string& dir, const std::string& key, const std::string& why) {
  ++corrupt_;
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
    quarantine(dir, key, entry.error().message);
    return std::nullopt;
  }
  return std::move(entry).value();
}

Result<void> DiskCache::store(const CacheEntry& e) {
  const std::string final_dir = entry_dir(e.key);
  const std::string tmp = fmt::format("{}/v1/tmp/{}.{}.{}", root_, e.key, ::getpid(), tmp_counter_++);
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
  if (r) r = write_file_synced(tmp + "/" + src_name, as_bytes(e.source));
  // meta.json goes last: an entry directory is only ever renamed into place complete.
  if (r) r = write_file_synced(tmp + "/meta.json", entry_metadata(e, sha, bytes).dump(1));
  if (r) r = sync_dir(tmp);
  if (r) r = make_dirs(fs::path(final_dir).parent_path().string(), 0700);
  if (!r) {
    cleanup();
    return r;
  }
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
  for (const char* sub : {"/v1/entries", "/v1/tmp", "/v1/corrupt"}) {
    fs::remove_all(root_ + sub, ec);
    if (ec) return make_error(Errc::io_error, fmt::format("cannot remove '{}{}': {}", root_, sub, ec.message()));
    KILN_TRY(make_dirs(root_ + sub, 0700));
  }
  return n;
}

}  // namespace kiln
