// The on-disk cache: content-addressed entries, published atomically, verified on load.
//
// Layout under the root (default ~/.cache/kiln, see support/env.h):
//   v1/entries/<key[0:2]>/<key>/  code.<hsaco|cubin|ptx>, source.<hip|cu>, meta.json
//   v1/tmp/<key>.<host>.<pid>.<n>/ an entry being written; renamed into entries/ when complete.
//                                 Left behind only by a process that died; removed by the next
//                                 writer on that host (dead pid) or after a day (other hosts).
//   v1/locks/<key>.lock           per-key lock file for single-flight compiles across processes
//   v1/tuning/<key>.json          tuning records (cache/tuning.h): the autotuner's winner for a
//                                 spec, target, device name and compiler; replaced atomically
//   v1/corrupt/                   entries and records that failed verification, moved aside
//   v1/telemetry.jsonl            one line of counters per finished Runtime (kiln cache stat sums them)
// meta.json records the key fields, the kernel's metadata and the SHA-256 and size of every file
// of the entry; an entry whose files do not match is never loaded. An entry's directory mtime is
// its last use (touched on every load): the byte budget evicts the least recently used first.
// Readers hold a shared OFD lock on meta.json while they read; eviction takes it exclusively
// without waiting and skips entries in use, so an entry is never deleted under a reader.
#pragma once

#include <nlohmann/json.hpp>

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/result.h"
#include "runtime/compile/compiler.h"
#include "templates/op_template.h"

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
  std::string problem;  ///< Why verification failed.
};

class DiskCache {
 public:
  /// Opens (creating, mode 0700) the cache under `root`. Refuses a directory owned by another
  /// user or writable by group/others: a poisoned code object would run on the GPU.
  /// `read_only`: a layer (KILN_CACHE_PATH) that is searched but never written or repaired; it
  /// must exist and may be owned by another user, but must not be writable by anyone but its owner.
  static Result<std::unique_ptr<DiskCache>> open(const std::string& root, bool read_only = false);

  const std::string& root() const { return root_; }
  bool read_only() const { return read_only_; }

  /// A verified entry, or nullopt on a miss. A corrupt entry is reported once, moved to
  /// v1/corrupt/ and counted, and the call returns nullopt so the caller rebuilds it.
  std::optional<CacheEntry> load(const std::string& key);

  /// Publishes an entry atomically (temporary directory, fsync, rename). If another process
  /// published the same key first, its entry is kept and this returns success.
  Result<void> store(const CacheEntry& entry);

  /// Takes the per-key lock, waiting up to `timeout_s` seconds (open file description locks:
  /// released by the kernel when the holder dies, so a crashed process never blocks others).
  Result<FileLock> lock(const std::string& key, double timeout_s, bool* waited = nullptr);

  /// Every entry, verified (checksums) when `verify`.
  std::vector<EntryStatus> list(bool verify) const;
  /// Removes every entry and tuning record; returns how many entries.
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
  DiskCache(std::string root, bool read_only) : root_(std::move(root)), read_only_(read_only) {}
  std::string entry_dir(const std::string& key) const;
  Result<CacheEntry> read_entry(const std::string& dir, const std::string& key) const;
  void quarantine(const std::string& dir, const std::string& key, const std::string& why);

  std::string root_;
  bool read_only_ = false;
  std::atomic<uint64_t> corrupt_{0};
  std::atomic<uint64_t> evictions_{0};
  std::atomic<uint64_t> tmp_counter_{0};
};

/// What meta.json says of an entry: everything but the file contents, and each file's checksum.
struct EntryMetadata {
  struct File {
    std::string sha256;
    uint64_t bytes = 0;
  };
  CacheEntry entry;  ///< Without code bytes and source.
  std::map<std::string, File> files;
  std::string code_name, source_name;
};
/// Parses and checks meta.json of the entry `key` (fuzzed: fuzz/fuzz_metadata.cpp).
/// Errors: Errc::corrupt, naming what is wrong.
Result<EntryMetadata> parse_entry_metadata(std::string_view text, const std::string& key);

/// Serializes the metadata.
nlohmann::json entry_metadata(const CacheEntry& entry, const std::map<std::string, std::string>& file_sha256,
                              const std::map<std::string, uint64_t>& file_bytes);

}  // namespace kiln
