// The remote cache tier on Redis (hiredis); see remote_cache.h.
#include "cache/remote_cache.h"

#include <fmt/format.h>
#include <hiredis/hiredis.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <pthread.h>
#include <signal.h>
#include <sys/time.h>

#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "support/log.h"
#include "support/sha256.h"

namespace kiln {
namespace {

constexpr std::string_view kMagic = "KILNRE1\n";
constexpr std::string_view kHmacContext = "kiln remote entry v1\n";
constexpr size_t kHeader = 8 + 3 * 8;  // magic, then the sizes of meta.json, the source, the code object
constexpr size_t kMac = 32;            // HMAC-SHA256

// Lua, run atomically by Redis. KEYS[1] the entry, KEYS[2] its lock; ARGV[1] the writer's token
// ("" when it holds none), ARGV[2] the entry. Stores unless another writer holds the lock now.
constexpr std::string_view kPublishScript = R"(
local holder = redis.call('GET', KEYS[2])
if holder and holder ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[2])
if holder then redis.call('DEL', KEYS[2]) end
return 1)";
// KEYS[1] a lock, ARGV[1] a token: releases the lock if the token still holds it.
constexpr std::string_view kReleaseScript = R"(
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0)";

// The source file's name in an entry, as the disk cache names it (cache/disk_cache.cpp), which
// parse_entry_metadata checks.
std::string source_name(const std::string& target) {
  return target.rfind("sm_", 0) == 0 ? "source.cu" : "source.hip";
}

std::string entry_key(const std::string& key) { return "kiln:v1:entry:" + key; }
std::string lock_key(const std::string& key) { return "kiln:v1:lock:" + key; }

void put_u64(std::string& out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}
uint64_t get_u64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

std::string hmac(const std::string& secret, const std::string& key, std::string_view body) {
  std::string data;
  data.reserve(kHmacContext.size() + key.size() + 1 + body.size());
  data.append(kHmacContext).append(key).append("\n").append(body);
  unsigned char mac[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()), reinterpret_cast<const unsigned char*>(data.data()),
       data.size(), mac, &len);
  return std::string(reinterpret_cast<const char*>(mac), len);
}

timeval to_timeval(double s) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(s);
  tv.tv_usec = static_cast<suseconds_t>((s - static_cast<double>(tv.tv_sec)) * 1e6);
  return tv;
}

// hiredis writes to its socket with write(2): a server that went away would raise SIGPIPE, whose
// default action ends the process. Block it around each call on this thread and consume one
// raised meanwhile, without touching the application's handlers.
class SigpipeGuard {
 public:
  SigpipeGuard() {
    sigemptyset(&set_);
    sigaddset(&set_, SIGPIPE);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &set_, &old_);
  }
  ~SigpipeGuard() {
    if (!was_pending_) {
      sigset_t pending;
      sigpending(&pending);
      if (sigismember(&pending, SIGPIPE) == 1) {
        const timespec zero{0, 0};
        sigtimedwait(&set_, nullptr, &zero);
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }

 private:
  sigset_t set_, old_;
  bool was_pending_ = false;
};

Result<double> positive_seconds(const char* name, const char* text) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text, &end);
  if (end == text || *end != '\0' || errno == ERANGE || !std::isfinite(v) || v <= 0 || v > 3600)
    return make_error(Errc::invalid_argument,
                      fmt::format("{}='{}' is not a number of seconds in (0, 3600]", name, text));
  return v;
}

}  // namespace

std::string RemoteCacheOptions::url() const {
  const bool v6 = host.find(':') != std::string::npos;
  return fmt::format("redis://{}{}{}:{}/{}", v6 ? "[" : "", host, v6 ? "]" : "", port, db);
}

Result<void> parse_remote_cache_url(const std::string& url, RemoteCacheOptions& o) {
  auto bad = [&](std::string_view why) {
    return make_error(Errc::invalid_argument,
                      fmt::format("remote cache URL '{}': {}; use redis://HOST[:PORT][/DB], e.g. "
                                  "redis://10.0.0.5:6379/0",
                                  url, why));
  };
  constexpr std::string_view scheme = "redis://";
  if (url.rfind(scheme, 0) != 0) return bad("only the redis:// scheme is supported");
  std::string_view rest = std::string_view(url).substr(scheme.size());
  std::string_view authority = rest.substr(0, rest.find('/'));
  std::string_view path = authority.size() < rest.size() ? rest.substr(authority.size() + 1) : std::string_view();
  if (authority.find('@') != std::string_view::npos) return bad("user names and passwords are not supported");
  std::string_view port_text;
  if (!authority.empty() && authority.front() == '[') {
    const size_t close = authority.find(']');
    if (close == std::string_view::npos) return bad("an unclosed '[' in the host");
    o.host = std::string(authority.substr(1, close - 1));
    std::string_view after = authority.substr(close + 1);
    if (!after.empty() && after.front() != ':') return bad("junk after the host");
    if (!after.empty()) port_text = after.substr(1);
    if (after == ":") return bad("an empty port");
  } else {
    const size_t colon = authority.find(':');
    o.host = std::string(authority.substr(0, colon));
    if (colon != std::string_view::npos) {
      port_text = authority.substr(colon + 1);
      if (port_text.empty()) return bad("an empty port");
    }
  }
  if (o.host.empty()) return bad("no host");
  for (char c : o.host)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == ':' || c == '_'))
      return bad("the host has a character that no host name has");
  auto number = [](std::string_view text, int lo, int hi, int& out) {
    int v = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
    if (ec != std::errc() || end != text.data() + text.size() || v < lo || v > hi) return false;
    out = v;
    return true;
  };
  if (!port_text.empty() && !number(port_text, 1, 65535, o.port)) return bad("the port is not a number in 1..65535");
  if (!path.empty() && !number(path, 0, 1 << 20, o.db)) return bad("the database is not a number");
  return ok();
}

Result<std::optional<RemoteCacheOptions>> remote_cache_options_from_env(const std::string& url_option) {
  const char* env_url = std::getenv("KILN_REMOTE_CACHE");
  const std::string url = !url_option.empty() ? url_option : env_url ? env_url : "";
  if (url.empty()) return std::optional<RemoteCacheOptions>();
  RemoteCacheOptions o;
  KILN_TRY(parse_remote_cache_url(url, o));
  const char* secret = std::getenv("KILN_REMOTE_CACHE_KEY");
  if (!secret || std::strlen(secret) < 16)
    return make_error(Errc::invalid_argument,
                      fmt::format("the remote cache {} needs KILN_REMOTE_CACHE_KEY, a secret of at least 16 bytes "
                                  "shared by the nodes that may write it ({}): entries are authenticated with it, "
                                  "so that whoever can write the Redis cannot inject code",
                                  url, secret ? "it is shorter" : "it is not set"));
  o.secret = secret;
  if (const char* t = std::getenv("KILN_REMOTE_CACHE_TIMEOUT"); t && *t) {
    KILN_ASSIGN_OR_RETURN(o.timeout_s, positive_seconds("KILN_REMOTE_CACHE_TIMEOUT", t));
  }
  return std::optional<RemoteCacheOptions>(std::move(o));
}

RemoteCache::RemoteCache(RemoteCacheOptions options) : options_(std::move(options)) {}

RemoteCache::~RemoteCache() {
  if (ctx_) redisFree(ctx_);
}

RemoteCache::Counters RemoteCache::counters() const {
  std::lock_guard lock(counters_mu_);
  return counters_;
}

void RemoteCache::fault(const std::string& what) {
  {
    std::lock_guard lock(counters_mu_);
    ++counters_.errors;
  }
  if (enabled_.exchange(false))
    KILN_LOG_WARN("remote cache {}: {}; going on with the local cache tiers only (KILN_REMOTE_CACHE)", options_.url(),
                  what);
}

bool RemoteCache::connect_locked() {
  if (ctx_) return true;
  if (connect_failed_) return false;
  ctx_ = redisConnectWithTimeout(options_.host.c_str(), options_.port, to_timeval(options_.timeout_s));
  if (!ctx_ || ctx_->err) {
    fault(fmt::format("cannot connect ({})", ctx_ ? ctx_->errstr : "out of memory"));
    if (ctx_) redisFree(ctx_);
    ctx_ = nullptr;
    connect_failed_ = true;
    return false;
  }
  if (redisSetTimeout(ctx_, to_timeval(options_.timeout_s)) != REDIS_OK) {
    fault("cannot set the socket timeout");
    redisFree(ctx_);
    ctx_ = nullptr;
    connect_failed_ = true;
    return false;
  }
  if (options_.db != 0) {
    const std::string db = std::to_string(options_.db);
    const char* argv[] = {"SELECT", db.c_str()};
    const size_t len[] = {6, db.size()};
    SigpipeGuard guard;
    auto* r = static_cast<redisReply*>(redisCommandArgv(ctx_, 2, argv, len));
    const bool good = r && r->type == REDIS_REPLY_STATUS;
    if (!good) fault(fmt::format("cannot select database {} ({})", options_.db, r ? r->str : ctx_->errstr));
    if (r) freeReplyObject(r);
    if (!good) {
      redisFree(ctx_);
      ctx_ = nullptr;
      connect_failed_ = true;
      return false;
    }
  }
  return true;
}

std::unique_ptr<redisReply, void (*)(redisReply*)> RemoteCache::command(std::initializer_list<std::string_view> args) {
  auto free_reply = [](redisReply* r) { freeReplyObject(r); };
  std::unique_ptr<redisReply, void (*)(redisReply*)> none(nullptr, free_reply);
  if (!enabled_) return none;
  std::lock_guard lock(mu_);
  if (!enabled_ || !connect_locked()) return none;
  std::vector<const char*> argv;
  std::vector<size_t> len;
  for (std::string_view a : args) {
    argv.push_back(a.data());
    len.push_back(a.size());
  }
  redisReply* r = nullptr;
  {
    SigpipeGuard guard;
    r = static_cast<redisReply*>(redisCommandArgv(ctx_, static_cast<int>(argv.size()), argv.data(), len.data()));
  }
  if (!r) {
    // The connection is unusable after an I/O error or a timeout ("slow" is "down" here).
    const std::string why = ctx_->errstr;
    const bool timed_out = ctx_->err == REDIS_ERR_IO && why.find("temporarily unavailable") != std::string::npos;
    fault(fmt::format("{} failed ({})", std::string(*args.begin()),
                      timed_out ? fmt::format("no reply within {} s, KILN_REMOTE_CACHE_TIMEOUT", options_.timeout_s)
                                : why));
    redisFree(ctx_);
    ctx_ = nullptr;
    connect_failed_ = true;
    return none;
  }
  if (r->type == REDIS_REPLY_ERROR) {
    const std::string message(r->str, r->len);
    freeReplyObject(r);
    fault(message.rfind("OOM", 0) == 0 ? fmt::format("the server is full ({})", message)
                                       : fmt::format("{} was refused ({})", std::string(*args.begin()), message));
    return none;
  }
  return {r, free_reply};
}

std::string RemoteCache::encode(const CacheEntry& e) const {
  const std::string code_name = "code." + e.compiled.code.format;
  const std::string src_name = source_name(e.target);
  const std::string meta =
      // SHA-256 only: a fetch checks it (and the HMAC); the XXH3-128 is the local store's, which
      // computes its own when it publishes a fetched entry.
      entry_metadata(e, {{code_name, {sha256_hex(e.compiled.code.bytes), {}, e.compiled.code.bytes.size()}},
                         {src_name, {sha256_hex(e.source), {}, e.source.size()}}})
          .dump();
  std::string blob(kMagic);
  put_u64(blob, meta.size());
  put_u64(blob, e.source.size());
  put_u64(blob, e.compiled.code.bytes.size());
  blob += meta;
  blob += e.source;
  blob.append(reinterpret_cast<const char*>(e.compiled.code.bytes.data()), e.compiled.code.bytes.size());
  blob += hmac(options_.secret, e.key, blob);
  return blob;
}

Result<CacheEntry> RemoteCache::decode(const std::string& key, const std::string& blob) const {
  if (blob.size() < kHeader + kMac) return make_error(Errc::corrupt, "the entry is too short");
  const std::string_view body = std::string_view(blob).substr(0, blob.size() - kMac);
  const std::string want = hmac(options_.secret, key, body);
  if (CRYPTO_memcmp(want.data(), blob.data() + body.size(), kMac) != 0)
    return make_error(Errc::corrupt,
                      "the entry is not authenticated: its HMAC does not match (written without "
                      "KILN_REMOTE_CACHE_KEY, with another key, or for another cache key)");
  if (body.substr(0, kMagic.size()) != kMagic) return make_error(Errc::corrupt, "the entry has another format");
  const uint64_t meta_len = get_u64(body.data() + 8), src_len = get_u64(body.data() + 16),
                 code_len = get_u64(body.data() + 24);
  if (meta_len > body.size() || src_len > body.size() || code_len > body.size() ||
      kHeader + meta_len + src_len + code_len != body.size())
    return make_error(Errc::corrupt, "the entry's sizes do not add up");
  const std::string_view meta = body.substr(kHeader, meta_len), source = body.substr(kHeader + meta_len, src_len),
                         code = body.substr(kHeader + meta_len + src_len, code_len);
  KILN_ASSIGN_OR_RETURN(EntryMetadata m, parse_entry_metadata(meta, key));
  if (m.files.size() != 2) return make_error(Errc::corrupt, "meta.json lists other files than the code and source");
  for (const auto& [name, data] : {std::pair{m.code_name, code}, std::pair{m.source_name, source}}) {
    const auto& f = m.files.at(name);
    if (f.bytes != data.size() || f.sha256 != sha256_hex(data))
      return make_error(Errc::corrupt, fmt::format("{} fails its size or SHA-256 check", name));
  }
  CacheEntry e = std::move(m.entry);
  e.source = std::string(source);
  e.compiled.code.bytes.assign(code.begin(), code.end());
  auto target = find_target(e.target);
  if (!target) return make_error(Errc::corrupt, "meta.json names an unknown target");
  KILN_TRY(validate_code_object(e.compiled.code, **target));
  return e;
}

std::optional<CacheEntry> RemoteCache::read(const std::string& key, bool& present) {
  present = false;
  // GETRANGE bounds the reply: at most max_entry_bytes + 1 bytes come back.
  const std::string last = std::to_string(options_.max_entry_bytes);
  auto r = command({"GETRANGE", entry_key(key), "0", last});
  if (!r || r->type != REDIS_REPLY_STRING || r->len == 0) return std::nullopt;
  present = true;
  auto refuse = [&](const std::string& why) {
    {
      std::lock_guard lock(counters_mu_);
      ++counters_.refused;
    }
    KILN_LOG_WARN("remote cache {}: refusing the entry of {}: {}; compiling it here", options_.url(), key, why);
  };
  if (static_cast<uint64_t>(r->len) > options_.max_entry_bytes) {
    refuse(fmt::format("it is larger than {} bytes", options_.max_entry_bytes));
    return std::nullopt;
  }
  auto e = decode(key, std::string(r->str, r->len));
  if (!e) {
    refuse(e.error().message);
    return std::nullopt;
  }
  return std::move(e).value();
}

std::optional<CacheEntry> RemoteCache::fetch_or_claim(const std::string& key, RemoteClaim& claim) {
  claim.token.clear();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(options_.wait_s);
  auto delay = std::chrono::milliseconds(2);
  bool waited = false;
  std::string token;
  auto count = [&](uint64_t Counters::*field) {
    std::lock_guard lock(counters_mu_);
    ++(counters_.*field);
    if (waited) ++counters_.lock_waits;
  };
  while (enabled_) {
    bool present = false;
    if (auto e = read(key, present)) {
      count(&Counters::hits);
      return e;
    }
    if (!enabled_) break;
    if (token.empty()) {  // one fencing token per lookup: a number no earlier lock holder had
      auto t = command({"INCR", "kiln:v1:fence"});
      if (!t || t->type != REDIS_REPLY_INTEGER) break;
      token = std::to_string(t->integer);
    }
    const std::string ttl_ms = std::to_string(static_cast<int64_t>(options_.lock_ttl_s * 1000));
    auto locked = command({"SET", lock_key(key), token, "NX", "PX", ttl_ms});
    if (!enabled_) break;
    if (locked && locked->type == REDIS_REPLY_STATUS) {
      // Ours. Another node may have stored the entry between the read and the lock: look again
      // (unless the read found one and refused it: this node rebuilds and replaces it).
      bool again = false;
      if (auto e = present ? std::nullopt : read(key, again)) {
        command({"EVAL", kReleaseScript, "1", lock_key(key), token});
        count(&Counters::hits);
        return e;
      }
      if (!enabled_) break;
      claim.token = token;
      count(&Counters::misses);
      return std::nullopt;
    }
    waited = true;  // another node compiles the key: poll for its entry
    if (std::chrono::steady_clock::now() >= deadline) {
      KILN_LOG_WARN("remote cache {}: waited {:.0f} s for another node compiling {}; compiling it here "
                    "(KILN_LOCK_TIMEOUT)",
                    options_.url(), options_.wait_s, key);
      break;
    }
    std::this_thread::sleep_for(delay);
    delay = std::min(delay * 2, std::chrono::milliseconds(50));
  }
  count(&Counters::misses);
  return std::nullopt;
}

void RemoteCache::publish(const CacheEntry& entry, const RemoteClaim& claim) {
  if (!enabled_) return;
  const std::string blob = encode(entry);
  if (blob.size() > options_.max_entry_bytes) {
    KILN_LOG_DEBUG("remote cache: not storing {} ({} bytes, over the limit)", entry.key, blob.size());
    if (!claim.token.empty()) command({"EVAL", kReleaseScript, "1", lock_key(entry.key), claim.token});
    return;
  }
  auto r = command({"EVAL", kPublishScript, "2", entry_key(entry.key), lock_key(entry.key), claim.token, blob});
  if (!r || r->type != REDIS_REPLY_INTEGER) return;
  std::lock_guard lock(counters_mu_);
  ++(r->integer == 1 ? counters_.stores : counters_.fenced);
}

Result<std::string> RemoteCache::probe() {
  auto info = command({"INFO", "server"});
  if (!info || info->type != REDIS_REPLY_STRING)
    return make_error(Errc::io_error, fmt::format("{} is not reachable", options_.url()));
  std::string version = "?";
  const std::string_view text(info->str, info->len);
  if (size_t at = text.find("redis_version:"); at != std::string_view::npos) {
    const size_t start = at + std::strlen("redis_version:");
    version = std::string(text.substr(start, text.find_first_of("\r\n", start) - start));
  }
  auto size = command({"DBSIZE"});
  if (!size || size->type != REDIS_REPLY_INTEGER)
    return make_error(Errc::io_error, fmt::format("{} did not answer DBSIZE", options_.url()));
  return fmt::format("reachable, Redis {}, {} keys in database {}", version, size->integer, options_.db);
}

}  // namespace kiln
