// The remote cache tier (cache/remote_cache.h) against a real redis-server on a loopback port of
// its own: hits from other nodes, authentication, fencing, faults (down, slow, full), and a
// cluster of processes on separate cache directories that compiles each kernel once.
#include <hiredis/hiredis.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <stdlib.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "cache/disk_cache.h"
#include "cache/remote_cache.h"
#include "kiln/kiln.h"
#include "redis_server.h"
#include "support/log.h"
#include "test_util.h"

extern char** environ;
namespace fs = std::filesystem;

namespace kiln {
namespace {
using testing::RedisServer;
using testing::swiglu_spec;
using testing::TempDir;

constexpr const char* kSecret = "kiln-test-secret-0123456789";

// Sets an environment variable for one test.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_) ::setenv(name_, old_->c_str(), 1);
    else ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// Captures the library's log lines for one test.
class LogCapture {
 public:
  LogCapture() : sink_(std::make_shared<spdlog::sinks::ostream_sink_mt>(out_)) { set_log_sink(sink_); }
  ~LogCapture() { set_log_sink(std::make_shared<spdlog::sinks::stderr_color_sink_mt>()); }
  size_t count(const std::string& needle) const {
    const std::string text = out_.str();
    size_t n = 0;
    for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
    return n;
  }
  std::string text() const { return out_.str(); }

 private:
  std::ostringstream out_;
  std::shared_ptr<spdlog::sinks::ostream_sink_mt> sink_;
};

std::unique_ptr<Runtime> node(const std::string& dir, const std::string& url) {
  RuntimeOptions o;
  o.backend = "none";
  o.cache_dir = dir;
  o.remote_cache = url;
  auto rt = Runtime::create(o);
  EXPECT_TRUE(rt.ok()) << rt.error().message;
  return std::move(rt).value();
}

// A plain client for the tests' own reads and writes (forging entries, filling the server).
class Client {
 public:
  explicit Client(int port) : c_(redisConnect("127.0.0.1", port)) {}
  ~Client() { redisFree(c_); }
  std::optional<std::string> get(const std::string& key) {
    auto* r = static_cast<redisReply*>(redisCommand(c_, "GET %b", key.data(), key.size()));
    std::optional<std::string> v;
    if (r && r->type == REDIS_REPLY_STRING) v = std::string(r->str, r->len);
    if (r) freeReplyObject(r);
    return v;
  }
  void set(const std::string& key, const std::string& value) {
    auto* r = static_cast<redisReply*>(
        redisCommand(c_, "SET %b %b", key.data(), key.size(), value.data(), value.size()));
    if (r) freeReplyObject(r);
  }
  void command(const char* text) {
    auto* r = static_cast<redisReply*>(redisCommand(c_, text));
    if (r) freeReplyObject(r);
  }

 private:
  redisContext* c_;
};

class RemoteTier : public ::testing::Test {
 protected:
  void SetUp() override {
    KILN_REQUIRE_REDIS();
    ASSERT_TRUE(redis_.start(dir_.path())) << "redis-server did not start";
  }
  TempDir dir_;
  RedisServer redis_;
  ScopedEnv secret_{"KILN_REMOTE_CACHE_KEY", kSecret};
  const char* target_ = testing::compilable_target();
};

TEST(RemoteCacheConfig, ParsesRedisUrlsAndRejectsEverythingElse) {
  RemoteCacheOptions o;
  ASSERT_TRUE(parse_remote_cache_url("redis://10.0.0.5:6380/3", o).ok());
  EXPECT_EQ(o.host, "10.0.0.5");
  EXPECT_EQ(o.port, 6380);
  EXPECT_EQ(o.db, 3);
  RemoteCacheOptions d;
  ASSERT_TRUE(parse_remote_cache_url("redis://cache-0.svc", d).ok());
  EXPECT_EQ(d.port, 6379);
  EXPECT_EQ(d.db, 0);
  ASSERT_TRUE(parse_remote_cache_url("redis://[::1]:7000", d).ok());
  EXPECT_EQ(d.host, "::1");
  for (const char* bad : {"", "http://h:1", "redis://", "redis://h:", "redis://h:0", "redis://h:70000", "redis://h:12x",
                          "redis://h/x", "redis://u:p@h:1", "redis://h h:1", "redis://[::1"}) {
    RemoteCacheOptions b;
    auto r = parse_remote_cache_url(bad, b);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.error().message.find("redis://HOST[:PORT][/DB]"), std::string::npos) << r.error().message;
  }
}

TEST(RemoteCacheConfig, ARemoteCacheWithoutASecretIsAnErrorAtCreate) {
  TempDir dir;
  ::unsetenv("KILN_REMOTE_CACHE_KEY");
  RuntimeOptions o;
  o.backend = "none";
  o.cache_dir = dir.path();
  o.remote_cache = "redis://127.0.0.1:1";
  auto rt = Runtime::create(o);
  ASSERT_FALSE(rt.ok());
  EXPECT_EQ(rt.error().code, Errc::invalid_argument);
  EXPECT_NE(rt.error().message.find("KILN_REMOTE_CACHE_KEY"), std::string::npos) << rt.error().message;
  ScopedEnv short_key("KILN_REMOTE_CACHE_KEY", "short");
  EXPECT_FALSE(Runtime::create(o).ok());
  ScopedEnv key("KILN_REMOTE_CACHE_KEY", kSecret);
  ScopedEnv timeout("KILN_REMOTE_CACHE_TIMEOUT", "abc");
  auto bad_timeout = Runtime::create(o);
  ASSERT_FALSE(bad_timeout.ok());
  EXPECT_NE(bad_timeout.error().message.find("KILN_REMOTE_CACHE_TIMEOUT='abc'"), std::string::npos);
}

TEST_F(RemoteTier, AKernelCompiledOnOneNodeIsFetchedVerifiedAndKeptByAnother) {
  {
    auto a = node(dir_ / "a", redis_.url());
    auto c = a->compile(swiglu_spec(1, 64), target_);
    ASSERT_TRUE(c.ok()) << c.error().message;
    EXPECT_EQ((*c)->origin(), "compiled");
    EXPECT_EQ(a->stats().remote_stores, 1u);
  }
  auto b = node(dir_ / "b", redis_.url());
  auto c = b->compile(swiglu_spec(1, 64), target_);
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ((*c)->origin(), "remote");
  EXPECT_EQ(b->stats().compiles, 0u);
  EXPECT_EQ(b->stats().remote_hits, 1u);
  EXPECT_GT((*c)->code_object().size(), 0u);
  // Published on b's disk: verified there, and a disk hit from now on.
  auto disk = DiskCache::open(dir_ / "b");
  auto entries = (*disk)->list(true);
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_TRUE(entries[0].ok) << entries[0].problem;
  auto again = node(dir_ / "b", redis_.url());
  EXPECT_EQ((*again->compile(swiglu_spec(1, 64), target_))->origin(), "disk");
}

TEST_F(RemoteTier, EntriesThatAreNotAuthenticatedAreRefusedAndReplaced) {
  std::string key;
  {
    auto a = node(dir_ / "a", redis_.url());
    auto c = a->compile(swiglu_spec(1, 64), target_);
    ASSERT_TRUE(c.ok());
    key = (*c)->info().cache_key;
  }
  Client client(redis_.port());
  const std::string good = *client.get("kiln:v1:entry:" + key);

  // Written by a node with another secret.
  {
    ScopedEnv other("KILN_REMOTE_CACHE_KEY", "another-secret-0123456789");
    LogCapture log;
    auto b = node(dir_ / "b", redis_.url());
    auto c = b->compile(swiglu_spec(1, 64), target_);
    ASSERT_TRUE(c.ok());
    EXPECT_EQ((*c)->origin(), "compiled") << "an entry this node cannot authenticate is not loaded";
    EXPECT_EQ(b->stats().remote_refused, 1u);
    EXPECT_EQ(log.count("not authenticated"), 1u) << log.text();
  }
  // A valid entry of one key replayed under another key (a consistent forgery).
  std::string other_key;
  {
    auto a = node(dir_ / "a2", redis_.url());
    auto c = a->compile(swiglu_spec(1, 65), target_);
    other_key = (*c)->info().cache_key;
  }
  client.set("kiln:v1:entry:" + other_key, good);
  // Garbage, and a flipped byte in a valid entry.
  std::string flipped = good;
  flipped[flipped.size() / 2] ^= 1;
  const std::vector<std::pair<int, std::string>> forged = {{65, ""}, {66, "garbage"}, {67, flipped}};
  for (const auto& [I, blob] : forged) {
    if (I != 65) {
      auto a = node(dir_ / ("x" + std::to_string(I)), redis_.url());
      auto c = a->compile(swiglu_spec(1, I), target_);
      ASSERT_TRUE(c.ok());
      client.set("kiln:v1:entry:" + (*c)->info().cache_key, blob);
    }
    auto b = node(dir_ / ("y" + std::to_string(I)), redis_.url());
    auto c = b->compile(swiglu_spec(1, I), target_);
    ASSERT_TRUE(c.ok());
    EXPECT_EQ((*c)->origin(), "compiled") << I;
    EXPECT_EQ(b->stats().remote_refused, 1u) << I;
    EXPECT_EQ(b->stats().remote_stores, 1u) << "the node that rebuilt it replaced the bad entry " << I;
  }
  // Replaced: the next node gets a good entry.
  auto d = node(dir_ / "d", redis_.url());
  EXPECT_EQ((*d->compile(swiglu_spec(1, 66), target_))->origin(), "remote");
}

TEST_F(RemoteTier, AStoreByAWriterWhoseLockExpiredAndWasTakenIsFencedOff) {
  RemoteCacheOptions o;
  ASSERT_TRUE(parse_remote_cache_url(redis_.url(), o).ok());
  o.secret = kSecret;
  o.lock_ttl_s = 0.2;
  o.wait_s = 5;
  RemoteCache first(o), second(o);
  // A real entry to store.
  auto rt = testing::compile_only_runtime(dir_ / "c");
  auto compiled = rt->compile(swiglu_spec(1, 64), target_);
  ASSERT_TRUE(compiled.ok());
  auto disk = DiskCache::open(dir_ / "c");
  auto entry = (*disk)->load((*compiled)->info().cache_key);
  ASSERT_TRUE(entry.has_value());

  RemoteClaim a, b;
  EXPECT_FALSE(first.fetch_or_claim(entry->key, a).has_value());
  ASSERT_FALSE(a.token.empty()) << "the first node holds the lock";
  std::this_thread::sleep_for(std::chrono::milliseconds(400));  // its lock expires (a stalled node)
  EXPECT_FALSE(second.fetch_or_claim(entry->key, b).has_value());
  ASSERT_FALSE(b.token.empty()) << "the second node took the expired lock";
  EXPECT_GT(std::stoll(b.token), std::stoll(a.token)) << "fencing tokens increase";
  first.publish(*entry, a);
  EXPECT_EQ(first.counters().fenced, 1u);
  EXPECT_EQ(first.counters().stores, 0u);
  second.publish(*entry, b);
  EXPECT_EQ(second.counters().stores, 1u);
  RemoteClaim c;
  auto hit = first.fetch_or_claim(entry->key, c);
  ASSERT_TRUE(hit.has_value());
  EXPECT_EQ(hit->compiled.code.bytes, entry->compiled.code.bytes);
  EXPECT_TRUE(c.token.empty());
}

TEST_F(RemoteTier, ARedisThatIsDownDegradesToTheLocalTiersWithOneWarning) {
  redis_.stop();
  LogCapture log;
  auto rt = node(dir_ / "a", redis_.url());
  for (int k = 0; k < 3; ++k) ASSERT_TRUE(rt->compile(swiglu_spec(1, 64 + k), target_).ok());
  EXPECT_EQ(rt->stats().compiles, 3u);
  EXPECT_EQ(rt->stats().remote_errors, 1u) << "one failed call, then the tier is off";
  EXPECT_EQ(log.count("going on with the local cache tiers only"), 1u) << log.text();
  EXPECT_EQ((*DiskCache::open(dir_ / "a"))->list(true).size(), 3u) << "the local disk cache still works";
}

TEST_F(RemoteTier, ARedisThatHangsDegradesWithinTheTimeout) {
  ScopedEnv timeout("KILN_REMOTE_CACHE_TIMEOUT", "0.3");
  auto rt = node(dir_ / "a", redis_.url());
  ASSERT_TRUE(rt->compile(swiglu_spec(1, 64), target_).ok());  // connected
  redis_.pause();  // SIGSTOP: the server accepts nothing and answers nothing
  LogCapture log;
  const auto t0 = std::chrono::steady_clock::now();
  for (int k = 1; k < 4; ++k) ASSERT_TRUE(rt->compile(swiglu_spec(1, 64 + k), target_).ok());
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  redis_.resume();
  EXPECT_LT(s, 10.0) << "one timed-out call, then local tiers only";
  EXPECT_EQ(rt->stats().remote_errors, 1u);
  EXPECT_EQ(log.count("KILN_REMOTE_CACHE_TIMEOUT"), 1u) << log.text();
}

TEST_F(RemoteTier, ARedisThatIsFullDegradesAndTheJobGoesOn) {
  Client client(redis_.port());
  client.command("CONFIG SET maxmemory-policy noeviction");
  client.command("CONFIG SET maxmemory 1");  // every write is refused (OOM)
  LogCapture log;
  auto rt = node(dir_ / "a", redis_.url());
  for (int k = 0; k < 3; ++k) ASSERT_TRUE(rt->compile(swiglu_spec(1, 64 + k), target_).ok());
  EXPECT_EQ(rt->stats().compiles, 3u);
  EXPECT_EQ(rt->stats().remote_errors, 1u);
  EXPECT_EQ(log.count("the server is full"), 1u) << log.text();
}

TEST_F(RemoteTier, PrewarmJsonCountsRemoteHits) {
  ScopedEnv url("KILN_REMOTE_CACHE", redis_.url());
  {
    auto a = node(dir_ / "a", redis_.url());
    ASSERT_TRUE(a->compile(swiglu_spec(4, 64), target_).ok());
  }
  const std::string manifest = dir_ / "m.json";
  std::ofstream(manifest) << R"({"kernels": [{"op": "swiglu", "dtype": "bf16", "params": {"rows": 4, "intermediate": 64}},
                                            {"op": "swiglu", "dtype": "bf16", "params": {"rows": 4, "intermediate": 65}}]})";
  const std::string cmd = std::string(KILN_CLI_PATH) + " prewarm " + manifest + " --arch " + target_ +
                          " --json --cache-dir " + (dir_ / "b") + " 2>/dev/null";
  FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  ASSERT_EQ(::pclose(p), 0) << out;
  auto doc = nlohmann::json::parse(out, nullptr, false);
  ASSERT_TRUE(doc.is_object()) << out;
  EXPECT_EQ(doc["summary"]["remote_hits"], 1) << out;
  EXPECT_EQ(doc["summary"]["compiled"], 1) << out;
  EXPECT_EQ(doc["kernels"][0]["origin"], "remote");
}

// Cluster runs: processes (tests/cache/cache_worker.cpp) on separate cache directories, one Redis.
const char* kWorker = KILN_CACHE_WORKER_PATH;

pid_t spawn_node(const std::string& cache, int n, const std::string& report, const std::string& start) {
  std::vector<std::string> args = {kWorker, cache, testing::compilable_target(), std::to_string(n), report, start};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  EXPECT_EQ(posix_spawn(&pid, kWorker, nullptr, nullptr, argv.data(), environ), 0);
  return pid;
}

struct NodeReport {
  int ok = 0, compiles = 0, disk_hits = 0, lock_waits = 0, compiled = 0, remote_hits = 0;
};
NodeReport read_node(const std::string& path) {
  NodeReport r;
  std::ifstream(path) >> r.ok >> r.compiles >> r.disk_hits >> r.lock_waits >> r.compiled >> r.remote_hits;
  return r;
}

TEST_F(RemoteTier, SixteenNodesTenKernelsCompileEachKernelOnceClusterWide) {
  ScopedEnv url("KILN_REMOTE_CACHE", redis_.url());
  const int kNodes = 16, kKernels = 10;
  const std::string start = dir_ / "go";
  std::vector<pid_t> pids;
  for (int p = 0; p < kNodes; ++p)
    pids.push_back(spawn_node(dir_ / ("node" + std::to_string(p)), kKernels, dir_ / ("r" + std::to_string(p)), start));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  std::ofstream(start) << "go";
  int compiles = 0, remote_hits = 0;
  for (int p = 0; p < kNodes; ++p) {
    int status = 0;
    waitpid(pids[p], &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "node " << p;
    const NodeReport r = read_node(dir_ / ("r" + std::to_string(p)));
    EXPECT_EQ(r.ok, kKernels) << "node " << p << " got every kernel";
    compiles += r.compiles;
    remote_hits += r.remote_hits;
  }
  EXPECT_EQ(compiles, kKernels) << "one compile per kernel across all nodes";
  EXPECT_EQ(remote_hits, (kNodes - 1) * kKernels);
}

TEST_F(RemoteTier, KillingRedisMidRunLetsEveryNodeFinish) {
  ScopedEnv url("KILN_REMOTE_CACHE", redis_.url());
  const int kNodes = 8, kKernels = 10;
  const std::string start = dir_ / "go";
  std::vector<pid_t> pids;
  for (int p = 0; p < kNodes; ++p)
    pids.push_back(spawn_node(dir_ / ("node" + std::to_string(p)), kKernels, dir_ / ("r" + std::to_string(p)), start));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  std::ofstream(start) << "go";
  std::this_thread::sleep_for(std::chrono::milliseconds(400));
  redis_.kill_now();
  const auto t0 = std::chrono::steady_clock::now();
  for (int p = 0; p < kNodes; ++p) {
    int status = 0;
    waitpid(pids[p], &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "node " << p << " status " << status;
    EXPECT_EQ(read_node(dir_ / ("r" + std::to_string(p))).ok, kKernels) << "node " << p;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(60));
}

}  // namespace
}  // namespace kiln
