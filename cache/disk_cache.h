// The on-disk cache: content-addressed entries, published atomically, verified on load.
//
// Layout under the root (default ~/.cache/kiln, see support/env.h):
//   v1/entries/<key[0:2]>/<key>/  code.<hsaco|cubin|ptx>, source.<hip|cu>, meta.json
//   v1/tmp/<name>/                 an entry (or tuning record, import, eviction) being written or
//                                 removed, with v1/tmp/<name>.live beside it: a file its writer
//                                 holds an flock on for as long as it works on <name>. A
//                                 temporary whose .live lock can be taken belongs to a dead
//                                 process and is removed by the next writer or 'kiln cache gc';
//                                 one without a .live file after a day. Liveness never rests on
//                                 host names or pids (containers share hosts, not PID namespaces).
//   v1/locks/<key>.lock           per-key lock file for single-flight compiles across processes
//   v1/tuning/<key>.json          tuning records (cache/tuning.h): the autotuner's winner for a
//                                 spec, target, device name and compiler; replaced atomically
//   v1/corrupt/                   entries and records that failed verification, moved aside
//   v1/telemetry.jsonl            one line of counters per finished Runtime (kiln cache stat sums them)
// meta.json records the key fields, the kernel's metadata and the SHA-256, XXH3-128 and size of
// every file of the entry; an entry whose files do not match is never loaded. An entry's
// directory mtime is its last use (touched on every load): the byte budget evicts the least
// recently used first.
// Readers hold a shared OFD lock on meta.json while they read; eviction takes it exclusively
// without waiting and skips entries in use, so an entry is never deleted under a reader.
//
// Trust and faults: the root is opened once (after checking that no directory on its path can be
// written by another user, unless sticky and root-owned like /tmp) and every entry is read through
// directory descriptors from it (openat, O_NOFOLLOW), each directory and file checked with fstat
// (regular file, owner, no group or world write). Special files are opened O_NONBLOCK and refused,
// so a FIFO never hangs a reader. An entry is quarantined only when its content is proven wrong
// (a checksum, a size, a missing or foreign file, bad metadata); a read error (EMFILE, EIO,
// ESTALE, ...) is reported as an error and the entry stays. Nothing here throws.
#pragma once

#include <nlohmann/json.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <ctime>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "compile/code_object.h"
#include "kiln/result.h"

namespace kiln {

/// Everything stored for one kernel.
struct CacheEntry {
  std::string key;               ///< SHA-256 hex of the CacheKey.
  nlohmann::json key_json;       ///< The key's fields, for `kiln cache ls` and debugging.
  std::string target;
  std::string kernel_name;
  std::string source;            ///< The generated source the code object was built from.
  CompiledCode compiled;
};

/// A held per-key lock; released on destruction (and by the kernel if the process dies).
class FileLock {
 public:
  FileLock() = default;
  explicit FileLock(int fd) : fd_(fd) {}
  FileLock(FileLock&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  FileLock& operator=(FileLock&& o) noexcept;
  ~FileLock();

 private:
  int fd_ = -1;
};

struct EntryStatus {
  std::string key;
  std::string path;
  std::string target;
  std::string summary;  ///< "gemm bf16 M=... " from meta.json.
  uint64_t bytes = 0;
  bool ok = true;
  bool unreadable = false;  ///< !ok because of a read error (EMFILE, EIO, ...), not bad content.
  std::string problem;  ///< Why verification failed.
};

class DiskCache {
 public:
  ~DiskCache();
  DiskCache(const DiskCache&) = delete;
  DiskCache& operator=(const DiskCache&) = delete;

  /// Opens (creating, mode 0700) the cache under `root`. Refuses a directory owned by another
  /// user or writable by group/others: a poisoned code object would run on the GPU.
  /// `read_only`: a layer (KILN_CACHE_PATH) that is searched but never written or repaired; it
  /// must exist and may be owned by another user, but must not be writable by anyone but its owner.
  /// Errors: Errc::io_error (cannot create or open it; another user owns it or may write it or a
  /// directory on its path).
  static Result<std::unique_ptr<DiskCache>> open(const std::string& root, bool read_only = false);

  const std::string& root() const { return root_; }
  bool read_only() const { return read_only_; }

  /// The generated source a caller already holds with its SHA-256 (KernelSource::text and
  /// source_sha256), which the key covers.
  struct KnownSource {
    std::string_view text;
    std::string_view sha256;
  };
  /// A verified entry, or nullopt on a miss. A corrupt entry is reported once, moved to
  /// v1/corrupt/ and counted, and the call returns nullopt so the caller rebuilds it.
  /// With `known` (a disk hit of the runtime, which has just generated the source), the entry's
  /// source file is neither read nor hashed again: meta.json must record the same SHA-256 and
  /// size for it (else the entry is corrupt), and the entry's source is the caller's text. The
  /// code object is always read and verified. `kiln cache verify` still checks every file.
  std::optional<CacheEntry> load(const std::string& key, const KnownSource* known = nullptr);

  /// Publishes an entry atomically (temporary directory, fsync, rename). If another process
  /// published the same key first, its entry is kept and this returns success.
  Result<void> store(const CacheEntry& entry);

  /// Takes the per-key lock, waiting up to `timeout_s` seconds (open file description locks:
  /// released by the kernel when the holder dies, so a crashed process never blocks others).
  Result<FileLock> lock(const std::string& key, double timeout_s, bool* waited = nullptr);

  /// Whether an entry directory for `key` exists (not verified).
  bool contains(const std::string& key) const;

  /// Every entry, verified (checksums) when `verify`.
  std::vector<EntryStatus> list(bool verify) const;
  /// Removes every entry and tuning record; returns how many entries. Safe under concurrent
  /// writers and readers: each of entries/, tuning/ and corrupt/ is renamed aside at once (a new
  /// empty one takes its place) and then deleted; writers that publish meanwhile retry, and the
  /// temporaries of live writers are left alone.
  Result<size_t> clear();
  /// Moves a bad entry aside (v1/corrupt/), as load() does; for `kiln cache verify --fix`.
  void quarantine_entry(const std::string& key, const std::string& why);

  struct GcResult {
    uint64_t bytes_before = 0, bytes_after = 0, evicted = 0, skipped_in_use = 0;
  };
  /// Evicts least recently used entries until the entries take at most `max_bytes` (entries in use
  /// are skipped), and removes stale temporary entries.
  Result<GcResult> collect(uint64_t max_bytes);
  /// Bytes of all entries.
  uint64_t total_bytes() const;
  /// Removes temporary entries left by dead processes; returns how many.
  size_t clean_stale_tmp();

  /// A temporary name under v1/tmp/ held alive for as long as this object lives (see the layout
  /// above): `path` is free for the holder to create; other processes leave it alone.
  class Temporary {
   public:
    Temporary() = default;
    Temporary(Temporary&& o) noexcept;
    Temporary& operator=(Temporary&&) noexcept;
    ~Temporary();
    const std::string& path() const { return path_; }

   private:
    friend class DiskCache;
    std::string path_, live_;
    int fd_ = -1;
  };
  /// Reserves v1/tmp/<prefix><random>. Errors: Errc::io_error.
  Result<Temporary> temporary(const std::string& prefix) const;

  /// The files of entry `key` (name -> bytes, meta.json included; every regular file in the
  /// entry), read through directory descriptors under a shared lock, each file checked as load()
  /// checks it, and the entry's mtime. For export. Errors: Errc::corrupt (a foreign, linked or
  /// special file), io_error (vanished, being evicted, unreadable).
  Result<std::map<std::string, std::string>> read_entry_files(const std::string& key, time_t* mtime = nullptr) const;

  /// The text of tuning record `key` (v1/tuning/<key>.json, see cache/tuning.h), or nullopt when
  /// there is none. Errors: Errc::corrupt (owned by another user or writable by group/others:
  /// refused like an entry), io_error (unreadable).
  Result<std::optional<std::string>> read_tuning(const std::string& key) const;
  /// Publishes tuning record `key` atomically: written and fsynced in v1/tmp/, renamed over any
  /// older record. Returns its path. Errors: Errc::io_error (a read-only layer, a failed write).
  Result<std::string> write_tuning(const std::string& key, const std::string& text);
  /// Moves a bad tuning record aside to v1/corrupt/ (in a read-only layer it is only counted).
  void quarantine_tuning(const std::string& key, const std::string& why);
  std::string tuning_path(const std::string& key) const;

  /// Appends a Runtime's counters to v1/telemetry.jsonl; telemetry() sums every line.
  void append_telemetry(const nlohmann::json& counters);
  nlohmann::json telemetry() const;

  uint64_t corrupt_entries() const { return corrupt_.load(); }
  uint64_t evictions() const { return evictions_.load(); }

 private:
  DiskCache(std::string root, bool read_only, int root_fd)
      : root_(std::move(root)), read_only_(read_only), root_fd_(root_fd), me_(::geteuid()) {}
  std::string entry_dir(const std::string& key) const;
  struct EntryDir;
  Result<EntryDir> open_entry(const std::string& key) const;
  /// Owned by this user (the effective uid when the cache was opened, which open() checked the
  /// root against) or, in a read-only layer, by root; writable by no one else.
  bool trusted(const struct stat& st) const;
  bool still_linked(const std::string& key, const struct stat& dir_st) const;
  /// How read_entry proves a file's bytes: by its XXH3-128 where meta.json records one (a load),
  /// or by its SHA-256 and XXH3-128 both (`kiln cache verify`, an import's staged entries).
  enum class Check { load, full };
  Result<CacheEntry> read_entry(const EntryDir& dir, const std::string& key, const KnownSource* known,
                                Check check) const;
  void quarantine(const std::string& key, const struct stat* dir_st, const std::string& why);

  std::string root_;
  bool read_only_ = false;
  int root_fd_ = -1;  ///< The root, opened once by open(); entries are read relative to it.
  uid_t me_;          ///< geteuid() at open()
  mutable std::atomic<bool> warned_unreadable_{false};
  std::atomic<uint64_t> corrupt_{0};
  std::atomic<uint64_t> evictions_{0};
  std::atomic<uint64_t> tmp_counter_{0};
};

/// What meta.json records of one of an entry's files.
struct FileDigests {
  /// Binds the file to its entry wherever someone else could have chosen the bytes: an imported
  /// archive (its signed manifest lists these), a remote entry, `kiln cache verify`.
  std::string sha256;
  /// The checksum that a load checks (support/xxh3.h); empty in entries written before it, which
  /// a load checks with sha256.
  std::string xxh3_128;
  uint64_t bytes = 0;
  static FileDigests of(std::span<const uint8_t> bytes);
  static FileDigests of(std::string_view text) {
    return of(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
  }
};

/// What meta.json says of an entry: everything but the file contents, and each file's digests.
struct EntryMetadata {
  using File = FileDigests;
  CacheEntry entry;  ///< Without code bytes and source.
  std::map<std::string, File> files;
  std::string code_name, source_name;
};
/// Parses and checks meta.json of the entry `key` (fuzzed: fuzz/fuzz_metadata.cpp).
/// Errors: Errc::corrupt, naming what is wrong.
Result<EntryMetadata> parse_entry_metadata(std::string_view text, const std::string& key);

/// Serializes the metadata.
nlohmann::json entry_metadata(const CacheEntry& entry, const std::map<std::string, FileDigests>& files);

}  // namespace kiln
