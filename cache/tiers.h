// The cache's tiers and the one cascade through them. A runtime looks a kernel up in its memory
// (the memo, runtime/), then here, in order:
//   1. the writable disk cache (KILN_CACHE_DIR),
//   2. the read-only layers (KILN_CACHE_PATH), in the order given,
//   3. the writable disk cache again, under the key's cross-process lock (another process may have
//      published it while this one waited: single flight across processes),
//   4. the remote tier (KILN_REMOTE_CACHE; code objects only), which either returns another
//      node's entry or gives this node the cluster-wide claim to make it,
//   5. making it (compiling a code object, timing tuning candidates), then storing it in the remote
//      tier (under the claim) and in the writable disk cache (then evicting down to the budget).
// Code objects (entry()) and tuning records (tuning()) run the same cascade; only what is found,
// made and stored differs. A failed store turns writing off for the rest of the process, with one
// warning: a full or read-only file system must not fail every later request.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cache/disk_cache.h"
#include "cache/remote_cache.h"
#include "cache/tuning.h"
#include "kiln/result.h"

namespace kiln {

/// Where a cascade's result came from.
enum class Tier { disk, layer, remote, made };

template <typename T>
struct Tiered {
  T value;
  Tier from = Tier::made;
};

class CacheTiers {
 public:
  /// `disk`: the writable cache (may be null: memory only); `layers`: read-only caches searched
  /// after it; `max_bytes`: the writable cache's byte budget (0: unbounded); `lock_timeout_s`: the
  /// longest wait for another process's work on the same key.
  CacheTiers(std::unique_ptr<DiskCache> disk, std::vector<std::unique_ptr<DiskCache>> layers, uint64_t max_bytes,
             double lock_timeout_s);
  ~CacheTiers();

  /// Adds the remote tier (set once, before the first lookup).
  void set_remote(std::unique_ptr<RemoteCache> remote) { remote_ = std::move(remote); }

  DiskCache* disk() const { return disk_.get(); }
  std::span<const std::unique_ptr<DiskCache>> layers() const { return layers_; }
  const RemoteCache* remote() const { return remote_.get(); }
  /// False once a store failed (or without a writable cache).
  bool writable() const { return disk_ && writes_enabled_.load(); }

  /// The code object of cache key `digest`: found in a tier, or made by `compile` and stored.
  /// `known`: the generated source the caller holds (a disk hit neither reads nor hashes it again).
  /// Errors: compile's, and Errc::timeout when another process held the key's lock too long.
  Result<Tiered<CacheEntry>> entry(const std::string& digest, const DiskCache::KnownSource& known,
                                   const std::function<Result<CacheEntry>()>& compile);

  /// The usable tuning record of `key` in the writable cache or a layer, or nullopt (no lock, no
  /// waiting: kernel()'s lookup). See find_tuning() for what is skipped.
  std::optional<FoundTuning> find_tuning(const TuningKey& key, std::span<const KernelConfig> candidates) const;
  /// The tuning record of `key`: found (unless `force`), or made by `time` and stored (its path in
  /// FoundTuning::path; empty when it could not be stored). Errors: time's, Errc::timeout.
  Result<Tiered<FoundTuning>> tuning(const TuningKey& key, std::span<const KernelConfig> candidates, bool force,
                                     const std::function<Result<TuningRecord>()>& time);

  /// Processes that waited for another's lock, and failed stores.
  uint64_t lock_waits() const { return lock_waits_.load(); }
  uint64_t store_errors() const { return store_errors_.load(); }
  /// Corrupt entries moved aside, over the writable cache and the layers; evictions by the budget.
  uint64_t corrupt_entries() const;
  uint64_t evictions() const { return disk_ ? disk_->evictions() : 0; }

 private:
  // What differs between the kinds of item; the cascade itself is cascade()'s.
  template <typename T>
  struct Steps {
    std::function<std::optional<T>(DiskCache&)> find;
    std::function<Result<T>()> make;
    std::function<Result<void>(DiskCache&, T&)> store;
    std::function<std::optional<T>(RemoteClaim&)> fetch_remote;     // null: no remote tier for T
    std::function<void(const T&, const RemoteClaim&)> publish_remote;
  };
  template <typename T>
  Result<Tiered<T>> cascade(const std::string& lock_key, bool look, const Steps<T>& steps);

  std::unique_ptr<DiskCache> disk_;
  std::vector<std::unique_ptr<DiskCache>> layers_;
  std::unique_ptr<RemoteCache> remote_;
  uint64_t max_bytes_ = 0;
  double lock_timeout_s_ = 600;
  std::atomic<bool> writes_enabled_{true};
  std::atomic<uint64_t> lock_waits_{0}, store_errors_{0};
};

}  // namespace kiln
