// The remote cache tier: one Redis shared by the nodes of a cluster (KILN_REMOTE_CACHE), searched
// after the local disk cache and its read-only layers.
//
//   KILN_REMOTE_CACHE=redis://HOST[:PORT][/DB]   the server (port 6379 and database 0 by default)
//   KILN_REMOTE_CACHE_KEY=SECRET                 shared secret (>= 16 bytes) that authenticates entries
//   KILN_REMOTE_CACHE_TIMEOUT=SECONDS            connect and per-call timeout (default 2)
//
// Keys in Redis (database DB):
//   kiln:v1:entry:<cache key>   one entry: a header, meta.json, the source and the code object,
//                               then HMAC-SHA256(secret, "kiln remote entry v1" | cache key | body).
//                               An entry that fails the HMAC (written without the secret, or the
//                               entry of another key) is refused and rebuilt.
//   kiln:v1:lock:<cache key>    the compile lock of one key: SET NX PX (expires after lock_ttl_s),
//                               holding a fencing token
//   kiln:v1:fence               the fencing-token counter (INCR)
//
// Single flight across nodes: on a local miss a node reads the entry; on a remote miss it takes the
// key's lock and compiles, while the other nodes poll the entry (bounded by KILN_LOCK_TIMEOUT) and
// take the lock themselves if it expires (its holder died). A store is accepted only while the
// writer's token still holds the lock, or no one holds it (Lua, atomic): a writer whose lock
// expired and was taken by another node is fenced off.
//
// Faults: a Redis that is down, slow (a call past the timeout) or full (a write refused) turns the
// tier off for the rest of the process with one warning; the caller goes on with the local tiers.
// Every reply is bounded (entries above max_entry_bytes are neither stored nor read).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "cache/disk_cache.h"
#include "kiln/result.h"

struct redisContext;
struct redisReply;

namespace kiln {

struct RemoteCacheOptions {
  std::string host;
  int port = 6379;
  int db = 0;
  std::string secret;               ///< KILN_REMOTE_CACHE_KEY.
  double timeout_s = 2;             ///< Connect and per-call timeout.
  double lock_ttl_s = 60;           ///< Expiry of a compile lock (a dead holder blocks others this long).
  double wait_s = 600;              ///< Longest wait for another node's compile (KILN_LOCK_TIMEOUT).
  uint64_t max_entry_bytes = 64ull << 20;  ///< Larger entries are neither stored nor read.

  /// "redis://127.0.0.1:6379/0".
  std::string url() const;
};

/// Parses "redis://HOST[:PORT][/DB]" (HOST may be "[::1]") into `o`.
/// Errors: Errc::invalid_argument naming the URL and the accepted form.
Result<void> parse_remote_cache_url(const std::string& url, RemoteCacheOptions& o);

/// The tier's options from the environment (see above); nullopt when KILN_REMOTE_CACHE is unset
/// and `url` is empty. Errors: Errc::invalid_argument (a malformed URL, a missing or short secret,
/// a malformed timeout), naming the variable.
Result<std::optional<RemoteCacheOptions>> remote_cache_options_from_env(const std::string& url = {});

/// The right to compile one key for the cluster: the fencing token of its lock, or empty (not held:
/// the store is then accepted only if nobody holds the lock).
struct RemoteClaim {
  std::string token;
};

class RemoteCache {
 public:
  struct Counters {
    uint64_t hits = 0;        ///< Entries fetched, verified and returned.
    uint64_t misses = 0;      ///< Lookups that found no entry (this node then compiled).
    uint64_t stores = 0;      ///< Entries stored.
    uint64_t lock_waits = 0;  ///< Lookups that waited for another node's compile.
    uint64_t refused = 0;     ///< Entries refused: bad HMAC, malformed, another key's, over the size limit.
    uint64_t fenced = 0;      ///< Stores refused because another node holds the key's lock now.
    uint64_t errors = 0;      ///< Failed calls (the first one turns the tier off).
  };

  explicit RemoteCache(RemoteCacheOptions options);
  ~RemoteCache();
  RemoteCache(const RemoteCache&) = delete;
  RemoteCache& operator=(const RemoteCache&) = delete;

  /// On a local miss of `key` (the cache key's SHA-256): its verified entry, or nullopt, in which
  /// case `claim` holds the key's cluster lock when this node should compile it (it is empty when
  /// the tier is off or the wait ran out). Waits while another node compiles the key.
  std::optional<CacheEntry> fetch_or_claim(const std::string& key, RemoteClaim& claim);

  /// Stores a compiled entry under `claim`, and releases the claim's lock.
  void publish(const CacheEntry& entry, const RemoteClaim& claim);

  /// False once a fault turned the tier off.
  bool enabled() const { return enabled_.load(); }
  Counters counters() const;
  const RemoteCacheOptions& options() const { return options_; }

  /// One line about the server ("reachable, Redis 7.0.15, 52 keys in db 0"), or the error.
  Result<std::string> probe();

  /// The serialized, authenticated form of an entry (tests forge and tamper with it).
  std::string encode(const CacheEntry& entry) const;
  /// The entry of `key` from its serialized form. Errors: Errc::corrupt (authentication, format,
  /// checksums, code object), naming what is wrong.
  Result<CacheEntry> decode(const std::string& key, const std::string& blob) const;

 private:
  // One command; nullptr after a fault (which turns the tier off, with one warning).
  std::unique_ptr<redisReply, void (*)(redisReply*)> command(std::initializer_list<std::string_view> args);
  bool connect_locked();
  void fault(const std::string& what);
  // The entry of `key`: the value, nullopt on a miss, or an error (refused/fault).
  std::optional<CacheEntry> read(const std::string& key, bool& present);

  RemoteCacheOptions options_;
  std::mutex mu_;  // one connection, one call at a time
  redisContext* ctx_ = nullptr;
  bool connect_failed_ = false;
  std::atomic<bool> enabled_{true};
  mutable std::mutex counters_mu_;
  Counters counters_;
};

}  // namespace kiln
