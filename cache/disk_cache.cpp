#include "cache/disk_cache.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <set>
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
#include "support/xxh3.h"

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

FileDigests FileDigests::of(std::span<const uint8_t> bytes) {
  return {sha256_hex(bytes), xxh3_128_hex(bytes), bytes.size()};
}

nlohmann::json entry_metadata(const CacheEntry& e, const std::map<std::string, FileDigests>& digests) {
  nlohmann::json files = nlohmann::json::object();
  for (const auto& [name, d] : digests) {
    files[name] = {{"sha256", d.sha256}, {"bytes", d.bytes}};
    if (!d.xxh3_128.empty()) files[name]["xxh3_128"] = d.xxh3_128;
  }
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

namespace {

bool writable_by_others(const struct stat& st) { return (st.st_mode & (S_IWGRP | S_IWOTH)) != 0; }

/// Why directory `dir` (an ancestor of the cache root) lets another user swap what lies under it,
/// or "" when it does not: it must belong to root or to this user, and be writable by no one
/// else unless it is sticky and root-owned (as /tmp is: others may add names there, but not
/// rename or remove this user's).
std::string unsafe_ancestor(const std::string& dir, const struct stat& st) {
  const uid_t me = ::geteuid();
  if (st.st_uid != 0 && st.st_uid != me) return fmt::format("'{}' belongs to uid {}", dir, st.st_uid);
  if (writable_by_others(st) && !((st.st_mode & S_ISVTX) && st.st_uid == 0))
    return fmt::format("'{}' is writable by group or others (mode {:o}) and is not a sticky root-owned directory",
                       dir, st.st_mode & 07777);
  return {};
}

/// Checks every directory on the way to `root`, as written and with symlinks resolved.
Result<void> check_root_path(const std::string& root) {
  std::string absolute = root;
  if (absolute.front() != '/') {
    char cwd[4096];
    if (!::getcwd(cwd, sizeof cwd)) return make_error(Errc::io_error, "cannot resolve the cache directory " + errno_message(root));
    absolute = std::string(cwd) + "/" + root;
  }
  std::vector<std::string> paths = {absolute};
  if (char* real = ::realpath(root.c_str(), nullptr)) {
    paths.emplace_back(real);
    std::free(real);
  }
  for (const std::string& path : paths) {
    // Every proper prefix: "/", "/home", "/home/user", ... (not the root itself: open() checks it).
    for (size_t pos = 0; (pos = path.find('/', pos)) != std::string::npos; ++pos) {
      const std::string dir = pos == 0 ? "/" : path.substr(0, pos);
      if (pos + 1 >= path.size()) break;
      struct stat st{};
      if (::lstat(dir.c_str(), &st) != 0) continue;  // '..' and friends: the resolved path is checked too
      if (S_ISLNK(st.st_mode)) continue;             // its directory was checked; its target is in the resolved path
      if (auto why = unsafe_ancestor(dir, st); !why.empty())
        return make_error(Errc::io_error,
                          fmt::format("refusing the cache directory '{}': {}, so another user could swap entries "
                                      "under it; put the cache (KILN_CACHE_DIR) in a directory only you can write",
                                      root, why));
    }
  }
  return ok();
}

}  // namespace

DiskCache::~DiskCache() {
  if (root_fd_ >= 0) ::close(root_fd_);
}

Result<std::unique_ptr<DiskCache>> DiskCache::open(const std::string& root, bool read_only) {
  if (root.empty()) return make_error(Errc::invalid_argument, "the cache directory is empty");
  if (!read_only) KILN_TRY(make_dirs(root, 0700));
  KILN_TRY(check_root_path(root));
  // Checked once here, then used through this descriptor: entries are opened relative to it.
  UniqueFd root_fd(::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  struct stat st{};
  if (!root_fd || ::fstat(root_fd.get(), &st) != 0 || !S_ISDIR(st.st_mode))
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
  if (read_only) return std::unique_ptr<DiskCache>(new DiskCache(root, true, root_fd.release()));
  for (const char* sub : {"/v1/entries", "/v1/tmp", "/v1/locks", "/v1/corrupt", "/v1/tuning"})
    KILN_TRY(make_dirs(root + sub, 0700));
  if (::access(root.c_str(), W_OK) != 0)
    return make_error(Errc::io_error, "cache directory is not writable: " + errno_message(root));
  auto cache = std::unique_ptr<DiskCache>(new DiskCache(root, false, root_fd.release()));
  cache->clean_stale_tmp();
  return cache;
}

std::string DiskCache::entry_dir(const std::string& key) const {
  return fmt::format("{}/v1/entries/{}/{}", root_, key.substr(0, 2), key);
}

bool DiskCache::trusted(const struct stat& st) const {
  return (st.st_uid == me_ || (read_only_ && st.st_uid == 0)) && !writable_by_others(st);
}

/// An entry's directory, opened through descriptors from the root, and the stat of it.
struct DiskCache::EntryDir {
  UniqueFd fd;
  struct stat st {};
};

namespace {
bool valid_key(const std::string& key) {
  return key.size() >= 3 && key.size() <= 128 &&
         std::all_of(key.begin(), key.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_'; });
}
}  // namespace

Result<DiskCache::EntryDir> DiskCache::open_entry(const std::string& key) const {
  if (!valid_key(key)) return make_error(Errc::invalid_argument, fmt::format("'{}' is not a cache key", key));
  const std::string shard = key.substr(0, 2);
  const char* steps[] = {"v1", "entries", shard.c_str(), key.c_str()};
  UniqueFd dir;  // the first step is opened from root_fd_ itself
  struct stat st{};
  for (size_t i = 0; i < 4; ++i) {
    UniqueFd next(open_dir_at(i == 0 ? root_fd_ : dir.get(), steps[i]));
    if (!next) {
      const int err = errno;
      // ENOENT: a miss. ELOOP/ENOTDIR: a symlink or a file where a directory belongs.
      if (i == 3 && (err == ELOOP || err == ENOTDIR))
        return make_error(Errc::corrupt, "the entry is a symlink or not a directory; refusing it");
      return make_error(Errc::io_error,
                        fmt::format("{}: {}", err == ENOENT ? "no entry" : "cannot open the entry", std::strerror(err)));
    }
    if (::fstat(next.get(), &st) != 0)
      return make_error(Errc::io_error, fmt::format("cannot stat the entry: {}", std::strerror(errno)));
    if (!trusted(st)) {
      const std::string why = fmt::format("'{}' is owned by uid {} with mode {:o}; refusing it",
                                          i == 3 ? std::string("the entry") : std::string(steps[i]), st.st_uid,
                                          st.st_mode & 0777);
      // The entry itself is bad (moved aside); a foreign directory above it is a misconfiguration.
      return make_error(i == 3 ? Errc::corrupt : Errc::io_error, why);
    }
    dir = std::move(next);
  }
  return EntryDir{std::move(dir), st};
}

bool DiskCache::still_linked(const std::string& key, const struct stat& dir_st) const {
  auto again = open_entry(key);
  return again && again->st.st_dev == dir_st.st_dev && again->st.st_ino == dir_st.st_ino;
}

bool DiskCache::contains(const std::string& key) const { return open_entry(key).ok(); }

namespace {
constexpr uint64_t kMaxMetaBytes = uint64_t{16} << 20;
constexpr uint64_t kMaxEntryFileBytes = uint64_t{1} << 30;
}  // namespace

Result<CacheEntry> DiskCache::read_entry(const EntryDir& dir, const std::string& key, const KnownSource* known,
                                         Check check) const {
  // Every failure is classified: Errc::corrupt only when the content is proven wrong (a foreign,
  // linked or special file, a missing file of an entry still in place, bad metadata, a size or
  // checksum mismatch); Errc::io_error for a read error or an entry that went away meanwhile.
  auto vanished_or = [&](const std::string& what) -> Error {
    if (!still_linked(key, dir.st)) return make_error(Errc::io_error, "the entry was evicted or cleared while read");
    return make_error(Errc::corrupt, what);
  };
  auto open_part = [&](const std::string& name, OpenedFile& f) -> Result<void> {
    // O_NONBLOCK stays set: it has no effect on a regular file (open(2)), the only kind read here,
    // and clearing it costs two fcntl calls per file.
    f = open_regular_at(dir.fd.get(), name.c_str(), O_RDONLY, /*follow=*/false, /*clear_nonblock=*/false);
    if (f.ok()) {
      if (!trusted(f.st))
        return make_error(Errc::corrupt, fmt::format("{} is owned by uid {} with mode {:o}; refusing it", name,
                                                     f.st.st_uid, f.st.st_mode & 0777));
      return ok();
    }
    if (f.not_regular) return make_error(Errc::corrupt, fmt::format("{} is not a regular file", name));
    if (f.err == ELOOP) return make_error(Errc::corrupt, fmt::format("{} is a symbolic link", name));
    if (f.err == ENOENT) return vanished_or(fmt::format("{} is missing", name));
    return make_error(Errc::io_error, fmt::format("cannot open {}: {}", name, std::strerror(f.err)));
  };
  // A file of `want` bytes (fstat said `f.st`), read into `out` (resized to it) straight from the
  // descriptor (no copy, no second fstat). fstat's size proves the length: an entry's files are
  // never written in place (an entry is published whole by a rename), so reading exactly `want`
  // bytes needs no read that finds the end, and the digest covers what was read.
  auto read_part = [&](const std::string& name, const OpenedFile& f, uint64_t want, auto& out) -> Result<void> {
    if (static_cast<uint64_t>(f.st.st_size) != want)
      return make_error(Errc::corrupt, fmt::format("{} has {} bytes, meta.json says {}", name, f.st.st_size, want));
    if (want > kMaxEntryFileBytes)
      return make_error(Errc::corrupt, fmt::format("{} has {} bytes, more than an entry's file may have", name, want));
    out.resize(static_cast<size_t>(want));
    KILN_ASSIGN_OR_RETURN(size_t got, read_fd_upto(f.fd.get(), std::span<uint8_t>(reinterpret_cast<uint8_t*>(out.data()), out.size()), name));
    if (got != want)
      return make_error(Errc::corrupt, fmt::format("{} has {} bytes, meta.json says {}", name, got, want));
    return ok();
  };

  // A load proves a file by its XXH3-128 (the SHA-256 of the GEMM's 20 KB cubin took about 10 of
  // its hit's 58 us here, the XXH3-128 takes 1: bench/results/cpu-2026-11-27-disk-hit-xxh3.txt):
  // the files are this user's (trusted() above), so what is to be found is damage, not a chosen
  // collision. Entries written before meta.json recorded it, and full checks, take the SHA-256.
  auto check_digests = [&](const std::string& name, std::span<const uint8_t> data,
                           const FileDigests& want) -> Result<void> {
    const bool fast = check == Check::load && !want.xxh3_128.empty();
    if ((check == Check::full || !fast) && sha256_hex(data) != want.sha256)
      return make_error(Errc::corrupt, fmt::format("{} fails its SHA-256 check", name));
    if (!want.xxh3_128.empty() && xxh3_128_hex(data) != want.xxh3_128)
      return make_error(Errc::corrupt, fmt::format("{} fails its XXH3-128 check", name));
    return ok();
  };

  // A shared lock on meta.json for the whole read: eviction (exclusive, non-blocking) skips the
  // entry meanwhile. The lock goes with the descriptor. An entry evicted (or cleared) between the
  // open of its directory and this lock has had its files removed before the evictor let go of the
  // lock (collect: lock, rename aside, remove, unlock): a file then missing is classified by
  // vanished_or (io_error: a miss), and files still read are verified like any others, so no
  // second walk from the root is needed here to prove the entry still in place.
  OpenedFile meta_file;
  KILN_TRY(open_part("meta.json", meta_file));
  struct flock fl{};
  fl.l_type = F_RDLCK;
  if (!read_only_ && ::fcntl(meta_file.fd.get(), F_OFD_SETLK, &fl) != 0)
    return make_error(Errc::io_error, "entry is being evicted");
  // meta.json: exactly the bytes fstat gave (as read_part above); a shorter read fails the parse.
  if (static_cast<uint64_t>(meta_file.st.st_size) > kMaxMetaBytes)
    return make_error(Errc::corrupt, fmt::format("meta.json has {} bytes, more than the limit of {}",
                                                 meta_file.st.st_size, kMaxMetaBytes));
  std::string meta_text(static_cast<size_t>(meta_file.st.st_size), '\0');
  KILN_ASSIGN_OR_RETURN(size_t meta_got,
                        read_fd_upto(meta_file.fd.get(),
                                     std::span<uint8_t>(reinterpret_cast<uint8_t*>(meta_text.data()), meta_text.size()),
                                     "meta.json"));
  meta_text.resize(meta_got);
  KILN_ASSIGN_OR_RETURN(EntryMetadata meta, parse_entry_metadata(meta_text, key));
  CacheEntry e = std::move(meta.entry);
  for (const auto& [name, want] : meta.files) {
    if (known && name == meta.source_name) {
      // The caller generated this source and hashed it (the key covers that hash): reading the
      // file and hashing it again would cost a third of a hit and prove nothing more.
      if (want.sha256 != known->sha256 || want.bytes != known->text.size())
        return make_error(Errc::corrupt, fmt::format("meta.json records another {} than the key's", name));
      e.source = std::string(known->text);
      continue;
    }
    OpenedFile f;
    KILN_TRY(open_part(name, f));
    if (name == meta.code_name) {
      std::vector<uint8_t>& code = e.compiled.code.bytes;
      KILN_TRY(read_part(name, f, want.bytes, code));
      KILN_TRY(check_digests(name, code, want));
    } else {
      std::string data;
      KILN_TRY(read_part(name, f, want.bytes, data));
      KILN_TRY(check_digests(name, std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(data.data()), data.size()),
                             want));
      if (name == meta.source_name) e.source = std::move(data);
    }
  }
  auto target = find_target(e.target);
  if (!target) return make_error(Errc::corrupt, "meta.json names an unknown target");
  KILN_TRY(validate_code_object(e.compiled.code, **target));
  return e;
}

Result<std::map<std::string, std::string>> DiskCache::read_entry_files(const std::string& key, time_t* mtime) const {
  KILN_ASSIGN_OR_RETURN(EntryDir dir, open_entry(key));
  OpenedFile meta = open_regular_at(dir.fd.get(), "meta.json");
  if (!meta.ok()) {
    if (meta.err == ENOENT) return make_error(Errc::io_error, "vanished (evicted while exporting?)");
    return make_error(transient_errno(meta.err) ? Errc::io_error : Errc::corrupt,
                      fmt::format("meta.json: {}", meta.not_regular ? "not a regular file" : std::strerror(meta.err)));
  }
  struct flock fl{};
  fl.l_type = F_RDLCK;
  if (!read_only_ && ::fcntl(meta.fd.get(), F_OFD_SETLK, &fl) != 0) return make_error(Errc::io_error, "being evicted");
  if (mtime) *mtime = meta.st.st_mtime;
  int err = 0;
  auto names = list_dir_fd(dir.fd.get(), &err);
  if (!names) return make_error(Errc::io_error, names.error().message);
  std::map<std::string, std::string> files;
  for (const DirEntryName& n : *names) {
    OpenedFile f = open_regular_at(dir.fd.get(), n.name.c_str());
    if (!f.ok()) {
      if (f.err == ENOENT) return make_error(Errc::io_error, "vanished (evicted while exporting?)");
      if (f.not_regular || f.err == ELOOP)
        return make_error(Errc::corrupt, fmt::format("'{}' is not a regular file", printable(n.name)));
      return make_error(Errc::io_error, fmt::format("cannot open {}: {}", printable(n.name), std::strerror(f.err)));
    }
    if (!trusted(f.st))
      return make_error(Errc::corrupt, fmt::format("{} is owned by uid {} with mode {:o}", printable(n.name),
                                                   f.st.st_uid, f.st.st_mode & 0777));
    auto data = read_fd(f.fd.get(), n.name, kMaxEntryFileBytes);
    if (!data) return make_error(Errc::io_error, data.error().message);
    files[n.name] = std::move(*data);
  }
  return files;
}

Result<EntryMetadata> parse_entry_metadata(std::string_view text, const std::string& key) {
  auto parsed = parse_json(text, "meta.json");
  if (!parsed) return parsed.take_error();
  nlohmann::json meta = std::move(parsed).value();  // not const: key_fields is moved out
  if (!meta.is_object()) return make_error(Errc::corrupt, "meta.json is not a JSON object");
  // nlohmann's typed accessors throw on a wrong type or a missing field: each is a bad entry.
  try {
    if (json_int(meta, "format_version") != kCacheFormatVersion)
      return make_error(Errc::corrupt, "meta.json has another format version");
    if (meta.at("key").get<std::string>() != key) return make_error(Errc::corrupt, "meta.json names another key");
    EntryMetadata m;
    CacheEntry& e = m.entry;
    e.key = key;
    e.key_json = std::move(meta.at("key_fields"));
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
      FileDigests& f = m.files[name];
      f.sha256 = want.at("sha256").get<std::string>();
      f.bytes = json_size(want, "bytes");
      if (want.contains("xxh3_128")) {
        f.xxh3_128 = want.at("xxh3_128").get<std::string>();
        if (f.xxh3_128.size() != 32) return make_error(Errc::corrupt, "meta.json records a malformed XXH3-128");
      }
    }
    return m;
  } catch (const std::exception& ex) {  // nlohmann's type errors and the typed reads above
    return make_error(Errc::corrupt, fmt::format("meta.json is malformed: {}", ex.what()));
  }
}

void DiskCache::quarantine_entry(const std::string& key, const std::string& why) { quarantine(key, nullptr, why); }

void DiskCache::quarantine(const std::string& key, const struct stat* dir_st, const std::string& why) {
  ++corrupt_;
  const std::string dir = entry_dir(key);
  if (read_only_) {
    KILN_LOG_WARN("read-only cache entry {} is bad ({}); skipping it", dir, why);
    return;
  }
  // Only the entry that was found bad: if another process replaced it meanwhile, leave the new one.
  if (dir_st && !still_linked(key, *dir_st)) return;
  const std::string dest = fmt::format("{}/v1/corrupt/{}.{}", root_, key, random_tag(8));
  const bool moved = ::rename(dir.c_str(), dest.c_str()) == 0;
  KILN_LOG_WARN("cache entry {} is corrupt ({}); moved to {} and rebuilding", dir, why, moved ? dest : "(move failed)");
}

std::optional<CacheEntry> DiskCache::load(const std::string& key, const KnownSource* known) {
  auto dir = open_entry(key);
  if (!dir) {
    if (dir.error().code == Errc::corrupt) quarantine(key, nullptr, dir.error().message);
    return std::nullopt;
  }
  auto entry = read_entry(*dir, key, known, Check::load);
  if (!entry) {
    // corrupt: the content is proven wrong; moved aside (in a read-only layer, reported and
    // skipped). io_error: a read error, or the entry went away meanwhile: a miss, and the entry
    // stays where it is.
    if (entry.error().code == Errc::corrupt) {
      quarantine(key, &dir->st, entry.error().message);
    } else if (!warned_unreadable_.exchange(true)) {
      KILN_LOG_WARN("cannot read cache entry {} ({}); treating it as a miss and leaving it in place", entry_dir(key),
                    entry.error().message);
    }
    return std::nullopt;
  }
  // Last use, for the least-recently-used eviction.
  if (!read_only_) ::futimens(dir->fd.get(), nullptr);
  return std::move(entry).value();
}

DiskCache::Temporary::Temporary(Temporary&& o) noexcept
    : path_(std::move(o.path_)), live_(std::move(o.live_)), fd_(o.fd_) {
  o.fd_ = -1;
  o.live_.clear();
}

DiskCache::Temporary& DiskCache::Temporary::operator=(Temporary&& o) noexcept {
  if (this != &o) {
    this->~Temporary();
    path_ = std::move(o.path_);
    live_ = std::move(o.live_);
    fd_ = o.fd_;
    o.fd_ = -1;
    o.live_.clear();
  }
  return *this;
}

DiskCache::Temporary::~Temporary() {
  if (!live_.empty()) ::unlink(live_.c_str());
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  live_.clear();
}

Result<DiskCache::Temporary> DiskCache::temporary(const std::string& prefix) const {
  if (read_only_) return make_error(Errc::io_error, fmt::format("cache '{}' is a read-only layer", root_));
  Temporary t;
  for (int attempt = 0; attempt < 8; ++attempt) {
    t.path_ = fmt::format("{}/v1/tmp/{}{}", root_, prefix, random_tag(12));
    t.live_ = t.path_ + ".live";
    // The .live file first, locked: from the moment <name> exists, a cleaner sees a held lock.
    t.fd_ = ::open(t.live_.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (t.fd_ >= 0) break;
    if (errno != EEXIST) {
      const std::string live = t.live_;
      t.live_.clear();
      return make_error(Errc::io_error, "cannot create " + errno_message(live));
    }
    t.live_.clear();
  }
  if (t.fd_ < 0) return make_error(Errc::io_error, "cannot create a temporary name in " + root_ + "/v1/tmp");
  // A file system without flock (some NFS setups) still works: the temporary is then removed only
  // after a day, like those of older Kiln versions.
  if (::flock(t.fd_, LOCK_EX | LOCK_NB) != 0) KILN_LOG_DEBUG("cannot flock {}: {}", t.live_, std::strerror(errno));
  return t;
}

Result<void> DiskCache::store(const CacheEntry& e) {
  const std::string final_dir = entry_dir(e.key);
  if (read_only_) return make_error(Errc::io_error, fmt::format("cache '{}' is a read-only layer", root_));
  KILN_ASSIGN_OR_RETURN(Temporary lease, temporary(e.key + "."));
  const std::string& tmp = lease.path();
  KILN_TRY(make_dirs(tmp, 0700));
  auto cleanup = [&] { remove_tree(tmp); };
  const std::string code_name = "code." + e.compiled.code.format;
  const std::string src_name = source_name(e.target);
  const std::map<std::string, FileDigests> digests = {{code_name, FileDigests::of(e.compiled.code.bytes)},
                                                      {src_name, FileDigests::of(e.source)}};
  Result<void> r = write_file_synced(tmp + "/" + code_name, e.compiled.code.bytes);
  test_kill_point("write");
  if (r) r = write_file_synced(tmp + "/" + src_name, as_bytes(e.source));
  // meta.json goes last: an entry directory is only ever renamed into place complete.
  if (r) r = write_file_synced(tmp + "/meta.json", entry_metadata(e, digests).dump(1));
  if (r) r = sync_dir(tmp);
  if (!r) {
    cleanup();
    return r;
  }
  test_kill_point("publish");
  const std::string parent = fs::path(final_dir).parent_path().string();
  // NOTES: rename(2) of a directory is atomic on local and network file systems; a reader sees
  // either no entry or a complete one. ENOTEMPTY/EEXIST means another process published first.
  // ENOENT means a concurrent 'kiln cache clear' swapped entries/ out under us: make the shard
  // again and retry.
  int err = 0;
  for (int attempt = 0; attempt < 5; ++attempt) {
    if (auto made = make_dirs(parent, 0700); !made) {
      if (attempt < 4) continue;
      cleanup();
      return made;
    }
    if (::rename(tmp.c_str(), final_dir.c_str()) == 0) {
      // Durability of the rename, best effort: a concurrent clear may have swapped the shard out
      // already (then the entry is cleared, as asked, and there is nothing to sync).
      (void)sync_dir(parent);
      return ok();
    }
    err = errno;
    if (err != ENOENT) break;
  }
  cleanup();
  if (err == ENOTEMPTY || err == EEXIST) return ok();
  errno = err;
  return make_error(Errc::io_error, "cannot publish cache entry " + errno_message(final_dir));
}

Result<FileLock> DiskCache::lock(const std::string& key, double timeout_s, bool* waited) {
  const std::string path = fmt::format("{}/v1/locks/{}.lock", root_, key);
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0600);
  if (fd < 0) return make_error(Errc::io_error, "cannot open lock file " + errno_message(path));
  FileLock held(fd);
  struct stat st{};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
    return make_error(Errc::io_error, fmt::format("lock file '{}' is not a regular file", path));
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

namespace {
/// A summary of an entry's key fields for `kiln cache ls`, with what came from the file escaped.
std::string entry_summary(const nlohmann::json& meta) {
  const nlohmann::json kf = meta.contains("key_fields") && meta["key_fields"].is_object() ? meta["key_fields"]
                                                                                            : nlohmann::json::object();
  auto str = [&](const char* k, const char* fallback) {
    return kf.contains(k) && kf[k].is_string() ? printable(kf[k].get<std::string>(), 60) : std::string(fallback);
  };
  std::string s = fmt::format("{} {}", str("op", "?"), str("dtype", "?"));
  if (str("out_dtype", "") != str("dtype", "")) s += "->" + str("out_dtype", "?");
  if (kf.contains("params") && kf["params"].is_object())
    for (const auto& [k, v] : kf["params"].items()) s += fmt::format(" {}={}", printable(k, 40), printable(v.dump(), 40));
  s += " [" + str("compiler", "?") + "]";
  return s;
}
}  // namespace

std::vector<EntryStatus> DiskCache::list(bool verify) const {
  std::vector<EntryStatus> out;
  const std::string entries = root_ + "/v1/entries";
  auto shards = list_dir(entries);
  if (!shards) return out;
  for (const DirEntryName& shard : *shards) {
    if (shard.type != DT_DIR && shard.type != DT_UNKNOWN) continue;
    auto keys = list_dir(entries + "/" + shard.name);
    if (!keys) continue;  // evicted or cleared meanwhile
    for (const DirEntryName& k : *keys) {
      if (k.type != DT_DIR && k.type != DT_UNKNOWN) continue;
      EntryStatus s;
      s.key = k.name;
      s.path = entries + "/" + shard.name + "/" + k.name;
      auto dir = open_entry(s.key);
      if (!dir) {
        if (dir.error().message.rfind("no entry", 0) == 0) continue;  // vanished: evicted meanwhile
        s.ok = false;
        s.unreadable = dir.error().code != Errc::corrupt;
        s.problem = dir.error().message;
        out.push_back(std::move(s));
        continue;
      }
      if (auto files = list_dir_fd(dir->fd.get())) {
        for (const DirEntryName& f : *files) {
          struct stat st{};
          if (::fstatat(dir->fd.get(), f.name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode))
            s.bytes += static_cast<uint64_t>(st.st_size);
        }
      }
      // meta.json for the summary: opened without following links or blocking, bounded.
      nlohmann::json meta;
      OpenedFile mf = open_regular_at(dir->fd.get(), "meta.json");
      if (mf.ok()) {
        if (auto text = read_fd(mf.fd.get(), "meta.json", kMaxMetaBytes)) {
          if (auto parsed = parse_json(*text, "meta.json")) meta = std::move(parsed).value();
        }
      }
      if (meta.is_object()) {
        s.target = meta.contains("target") && meta["target"].is_string() ? printable(meta["target"].get<std::string>(), 40)
                                                                          : std::string();
        s.summary = entry_summary(meta);
      }
      if (verify) {
        auto e = read_entry(*dir, s.key, nullptr, Check::full);
        if (!e) {
          // An entry evicted while it was verified is simply gone.
          if (e.error().code != Errc::corrupt && !still_linked(s.key, dir->st)) continue;
          s.ok = false;
          s.unreadable = e.error().code != Errc::corrupt;
          s.problem = e.error().message;
        }
      } else if (!meta.is_object()) {
        s.ok = false;
        s.unreadable = !mf.ok() && transient_errno(mf.err);
        s.problem = s.unreadable ? fmt::format("meta.json is unreadable: {}", std::strerror(mf.err))
                                 : "meta.json is missing or malformed";
      }
      out.push_back(std::move(s));
    }
  }
  std::sort(out.begin(), out.end(), [](const EntryStatus& a, const EntryStatus& b) { return a.path < b.path; });
  return out;
}

Result<size_t> DiskCache::clear() {
  if (read_only_) return make_error(Errc::io_error, fmt::format("cache '{}' is a read-only layer", root_));
  size_t n = 0;
  for (const char* sub : {"entries", "tuning", "corrupt"}) {
    const std::string path = fmt::format("{}/v1/{}", root_, sub);
    // Renamed aside at once, so that readers and writers see the old directory or a new empty
    // one, never a half-deleted tree; then deleted at leisure (a .live lock keeps cleaners off).
    KILN_ASSIGN_OR_RETURN(Temporary doomed, temporary(fmt::format("cleared-{}.", sub)));
    if (::rename(path.c_str(), doomed.path().c_str()) != 0) {
      if (errno != ENOENT)
        return make_error(Errc::io_error, fmt::format("cannot clear '{}': {}", path, std::strerror(errno)));
    }
    if (::mkdir(path.c_str(), 0700) != 0 && errno != EEXIST)
      return make_error(Errc::io_error, "cannot create directory " + errno_message(path));
    if (std::string_view(sub) == "entries") {
      if (auto shards = list_dir(doomed.path()))
        for (const DirEntryName& shard : *shards)
          if (auto keys = list_dir(doomed.path() + "/" + shard.name)) n += keys->size();
    }
    if (!remove_tree(doomed.path()))
      KILN_LOG_WARN("could not remove all of {} (the next 'kiln cache gc' retries)", doomed.path());
  }
  clean_stale_tmp();
  return n;
}

uint64_t DiskCache::total_bytes() const {
  uint64_t total = 0;
  for (const auto& e : list(false)) total += e.bytes;
  return total;
}

size_t DiskCache::clean_stale_tmp() {
  if (read_only_) return 0;
  size_t removed = 0;
  const std::string tmp = root_ + "/v1/tmp";
  auto names = list_dir(tmp);
  if (!names) return 0;
  std::set<std::string> all;
  for (const DirEntryName& n : *names) all.insert(n.name);
  const time_t now = ::time(nullptr);
  constexpr time_t kDay = 24 * 3600;
  for (const std::string& name : all) {
    const bool is_live = name.size() > 5 && name.compare(name.size() - 5, 5, ".live") == 0;
    const std::string path = tmp + "/" + name;
    const std::string base = is_live ? name.substr(0, name.size() - 5) : name;
    if (is_live && all.count(base)) continue;  // handled with its temporary
    const std::string live_path = tmp + "/" + base + ".live";
    bool stale = false;
    bool have_lock = false;
    UniqueFd live(::open(live_path.c_str(), O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
    if (live) {
      // The writer holds this lock for as long as it works on the temporary; the kernel drops it
      // when the writer dies, whatever PID namespace or host it ran in.
      if (::flock(live.get(), LOCK_EX | LOCK_NB) == 0) stale = have_lock = true;
      else if (errno == EWOULDBLOCK) continue;  // alive
    }
    if (!have_lock) {  // no .live file (a temporary of an older Kiln) or no flock here: a day
      struct stat st{};
      if (::lstat(path.c_str(), &st) != 0) continue;
      stale = now - st.st_mtime > kDay;
    }
    if (!stale) continue;
    if (!is_live && !remove_tree(path)) continue;
    if (live) ::unlink(live_path.c_str());
    if (!is_live) ++removed;
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
    struct timespec used;
  };
  std::vector<Item> items;
  GcResult r;
  for (const auto& e : list(false)) {
    struct stat st{};
    if (::lstat(e.path.c_str(), &st) != 0) continue;  // gone meanwhile
    items.push_back({e.key, e.path, e.bytes, st.st_mtim});
    r.bytes_before += e.bytes;
  }
  std::sort(items.begin(), items.end(), [](const Item& a, const Item& b) {
    return a.used.tv_sec != b.used.tv_sec ? a.used.tv_sec < b.used.tv_sec : a.used.tv_nsec < b.used.tv_nsec;
  });
  uint64_t total = r.bytes_before;
  for (const Item& item : items) {
    if (total <= max_bytes) break;
    auto dir = open_entry(item.key);
    if (!dir) {
      if (dir.error().message.rfind("no entry", 0) == 0) total -= std::min(total, item.bytes);  // gone meanwhile
      continue;
    }
    // A write lock needs a writable descriptor; O_NONBLOCK: a FIFO planted there does not hang.
    OpenedFile meta = open_regular_at(dir->fd.get(), "meta.json", O_RDWR);
    if (meta.ok()) {
      struct flock fl{};
      fl.l_type = F_WRLCK;
      if (::fcntl(meta.fd.get(), F_OFD_SETLK, &fl) != 0) {  // a reader holds it: in use
        ++r.skipped_in_use;
        continue;
      }
    }
    // Rename out of entries/ first (atomic: readers see the entry or nothing), then delete.
    auto doomed = temporary("evicted-" + item.key + ".");
    if (!doomed) continue;
    if (::rename(item.path.c_str(), doomed->path().c_str()) != 0) continue;
    remove_tree(doomed->path());
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
  OpenedFile f = open_regular_at(AT_FDCWD, path.c_str());
  if (!f.ok()) {
    if (f.err == ENOENT || f.err == ENOTDIR) return std::optional<std::string>();
    if (f.not_regular || f.err == ELOOP)
      return make_error(Errc::corrupt, fmt::format("tuning record '{}' is not a regular file; refusing it", path));
    errno = f.err;
    return make_error(Errc::io_error, "cannot read tuning record " + errno_message(path));
  }
  // The same rule as for entries: a record anyone else could have written is not trusted.
  if (!trusted(f.st))
    return make_error(Errc::corrupt, fmt::format("tuning record '{}' is owned by uid {} with mode {:o}; refusing it",
                                                 path, f.st.st_uid, f.st.st_mode & 0777));
  auto text = read_fd(f.fd.get(), path, kMaxMetaBytes);
  if (!text) return make_error(text.error().code == Errc::invalid_argument ? Errc::corrupt : Errc::io_error,
                               text.error().message);
  return std::optional<std::string>(std::move(text).value());
}

Result<std::string> DiskCache::write_tuning(const std::string& key, const std::string& text) {
  if (read_only_) return make_error(Errc::io_error, fmt::format("cache '{}' is a read-only layer", root_));
  KILN_ASSIGN_OR_RETURN(Temporary lease, temporary("tuning-" + key + "."));
  const std::string& tmp = lease.path();
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
  const std::string dest = fmt::format("{}/v1/corrupt/tuning-{}.{}.json", root_, key, random_tag(8));
  const bool moved = ::rename(path.c_str(), dest.c_str()) == 0;
  KILN_LOG_WARN("tuning record {} is bad ({}); ignoring it{}", path, why, moved ? ", moved to " + dest : "");
}

void DiskCache::append_telemetry(const nlohmann::json& counters) {
  if (read_only_) return;
  const std::string path = root_ + "/v1/telemetry.jsonl";
  const std::string line = counters.dump() + "\n";
  // O_APPEND writes of one short line are atomic with respect to other appenders.
  OpenedFile f = open_regular_at(AT_FDCWD, path.c_str(), O_WRONLY | O_CREAT | O_APPEND);
  if (!f.ok()) return;
  (void)!::write(f.fd.get(), line.data(), line.size());
}

nlohmann::json DiskCache::telemetry() const {
  nlohmann::json sum = nlohmann::json::object();
  auto text = read_file(root_ + "/v1/telemetry.jsonl", uint64_t{256} << 20);
  if (!text) return sum;
  uint64_t runtimes = 0;
  for (size_t pos = 0; pos < text->size();) {
    size_t end = text->find('\n', pos);
    if (end == std::string::npos) end = text->size();
    auto parsed = parse_json(std::string_view(*text).substr(pos, end - pos), "telemetry.jsonl");
    pos = end + 1;
    if (!parsed || !parsed->is_object()) continue;  // a torn line from a killed process
    const nlohmann::json& j = *parsed;
    ++runtimes;
    for (const auto& [k, v] : j.items())
      if (v.is_number()) sum[k] = sum.value(k, 0.0) + v.get<double>();
  }
  sum["runtimes"] = runtimes;
  return sum;
}

}  // namespace kiln
