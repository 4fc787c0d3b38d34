// The on-disk cache: content-addressed entries, published atomically, verified on load.
//
// Layout under the root (default ~/.cache/kiln, see support/env.h):
//   v1/entries/<key[0:2]>/<key>/  code.<hsaco|cubin|ptx>, source.<hip|cu>, meta.json
//   v1/tmp/<key>.<pid>.<n>/       an entry being written; renamed into entries/ when complete
//   v1/locks/<key>.lock           per-key lock file for single-flight compiles across processes
//   v1/corrupt/                   entries that failed verification, moved aside
// meta.json records the key fields, the kernel's metadata and the SHA-256 and size of every file
// of the entry; an entry whose files do not match is never loaded.
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
  static Result<std::unique_ptr<DiskCache>> open(const std::string& root);

  const std::string& root() const { return root_; }

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
  /// Removes every entry; returns how many.
  Result<size_t> clear();

  uint64_t corrupt_entries() const { return corrupt_.load(); }

 private:
  explicit DiskCache(std::string root) : root_(std::move(root)) {}
  std::string entry_dir(const std::string& key) const;
  Result<CacheEntry> read_entry(const std::string& dir, const std::string& key) const;
  void quarantine(const std::string& dir, const std::string& key, const std::string& why);

  std::string root_;
  std::atomic<uint64_t> corrupt_{0};
  std::atomic<uint64_t> tmp_counter_{0};
};

/// Serializes / parses the metadata (also used by the fuzz-style tests).
nlohmann::json entry_metadata(const CacheEntry& entry, const std::map<std::string, std::string>& file_sha256,
                              const std::map<std::string, uint64_t>& file_bytes);

}  // namespace kiln
