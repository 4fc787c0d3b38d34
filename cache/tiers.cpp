#include "cache/tiers.h"

#include "support/log.h"

namespace kiln {

CacheTiers::CacheTiers(std::unique_ptr<DiskCache> disk, std::vector<std::unique_ptr<DiskCache>> layers,
                       uint64_t max_bytes, double lock_timeout_s)
    : disk_(std::move(disk)), layers_(std::move(layers)), max_bytes_(max_bytes), lock_timeout_s_(lock_timeout_s) {}

CacheTiers::~CacheTiers() = default;

uint64_t CacheTiers::corrupt_entries() const {
  uint64_t n = disk_ ? disk_->corrupt_entries() : 0;
  for (const auto& layer : layers_) n += layer->corrupt_entries();
  return n;
}

template <typename T>
Result<Tiered<T>> CacheTiers::cascade(const std::string& lock_key, bool look, const Steps<T>& s) {
  if (look) {
    if (disk_)
      if (auto hit = s.find(*disk_)) return Tiered<T>{std::move(*hit), Tier::disk};
    for (const auto& layer : layers_)
      if (auto hit = s.find(*layer)) return Tiered<T>{std::move(*hit), Tier::layer};
  }
  FileLock lock;  // held until the item is stored
  if (writable()) {
    // Single flight across processes: take the key's lock, then look again.
    bool waited = false;
    auto locked = disk_->lock(lock_key, lock_timeout_s_, &waited);
    if (waited) ++lock_waits_;
    if (!locked && locked.error().code == Errc::timeout) return locked.take_error();
    if (locked) {
      lock = std::move(locked).value();
      if (look)
        if (auto hit = s.find(*disk_)) return Tiered<T>{std::move(*hit), Tier::disk};
    } else {
      KILN_LOG_WARN("working without the cross-process lock: {}", locked.error().message);
    }
  }
  // The cluster tier: a verified item another node made, or the cluster-wide claim to make it.
  RemoteClaim claim;
  std::optional<T> remote_hit = s.fetch_remote ? s.fetch_remote(claim) : std::nullopt;
  Tiered<T> out;
  if (remote_hit) {
    out = {std::move(*remote_hit), Tier::remote};
  } else {
    KILN_ASSIGN_OR_RETURN(out.value, s.make());
    if (s.publish_remote) s.publish_remote(out.value, claim);
  }
  if (writable()) {
    if (auto stored = s.store(*disk_, out.value); !stored) {
      ++store_errors_;
      // A full, read-only or quota-limited file system: stop writing (one warning), keep going.
      if (writes_enabled_.exchange(false))
        KILN_LOG_WARN("cannot write to the kernel cache ({}); kernels and tuning results are kept in memory only "
                      "from now on",
                      stored.error().message);
    } else if (max_bytes_) {
      if (auto gc = disk_->collect(max_bytes_); !gc) KILN_LOG_WARN("cache budget: {}", gc.error().message);
    }
  }
  return out;
}

Result<Tiered<CacheEntry>> CacheTiers::entry(const std::string& digest, const DiskCache::KnownSource& known,
                                             const std::function<Result<CacheEntry>()>& compile) {
  Steps<CacheEntry> s;
  s.find = [&](DiskCache& cache) { return cache.load(digest, &known); };
  s.make = compile;
  s.store = [](DiskCache& cache, CacheEntry& e) { return cache.store(e); };
  if (remote_) {
    s.fetch_remote = [&](RemoteClaim& claim) { return remote_->fetch_or_claim(digest, claim); };
    s.publish_remote = [&](const CacheEntry& e, const RemoteClaim& claim) { remote_->publish(e, claim); };
  }
  return cascade(digest, /*look=*/true, s);
}

std::optional<FoundTuning> CacheTiers::find_tuning(const TuningKey& key, std::span<const KernelConfig> candidates) const {
  std::vector<DiskCache*> caches;
  if (disk_) caches.push_back(disk_.get());
  for (const auto& layer : layers_) caches.push_back(layer.get());
  return kiln::find_tuning(caches, key, candidates);
}

Result<Tiered<FoundTuning>> CacheTiers::tuning(const TuningKey& key, std::span<const KernelConfig> candidates, bool force,
                                               const std::function<Result<TuningRecord>()>& time) {
  Steps<FoundTuning> s;
  s.find = [&](DiskCache& cache) {
    DiskCache* one[] = {&cache};
    return kiln::find_tuning(one, key, candidates);
  };
  s.make = [&]() -> Result<FoundTuning> {
    KILN_ASSIGN_OR_RETURN(TuningRecord record, time());
    return FoundTuning{std::move(record), std::string()};
  };
  s.store = [](DiskCache& cache, FoundTuning& found) -> Result<void> {
    KILN_ASSIGN_OR_RETURN(found.path, store_tuning(cache, found.record));
    return ok();
  };
  return cascade(key.digest(), /*look=*/!force, s);
}

}  // namespace kiln
