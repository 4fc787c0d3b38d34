// The cache under cluster conditions: many processes at once, processes killed mid-compile,
// byte budgets, read-only layers, full or unwritable file systems, foreign owners.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "cache/disk_cache.h"
#include "kiln/kiln.h"
#include "test_util.h"

extern char** environ;
namespace fs = std::filesystem;

namespace kiln {
namespace {
using testing::swiglu_spec;
using testing::TempDir;

const char* kWorker = KILN_CACHE_WORKER_PATH;

pid_t spawn_worker(const std::string& cache, int n, const std::string& report, const std::string& start,
                   const char* kill_at = nullptr) {
  std::vector<std::string> env_strings;
  for (char** e = environ; *e; ++e)
    if (std::string(*e).rfind("KILN_TEST_KILL_AT=", 0) != 0) env_strings.emplace_back(*e);
  if (kill_at) env_strings.push_back(std::string("KILN_TEST_KILL_AT=") + kill_at);
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string n_text = std::to_string(n);
  std::vector<std::string> args = {kWorker, cache, testing::compilable_target(), n_text, report};
  if (!start.empty()) args.push_back(start);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  EXPECT_EQ(posix_spawn(&pid, kWorker, nullptr, nullptr, argv.data(), envp.data()), 0);
  return pid;
}

int wait_status(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return status;
}

struct Report {
  int ok = 0, compiles = 0, disk_hits = 0, lock_waits = 0, compiled = 0;
};
Report read_report(const std::string& path) {
  Report r;
  std::ifstream(path) >> r.ok >> r.compiles >> r.disk_hits >> r.lock_waits >> r.compiled;
  return r;
}

std::unique_ptr<Runtime> runtime(const std::string& dir, uint64_t max_bytes = 0, std::vector<std::string> layers = {}) {
  RuntimeOptions o;
  o.backend = "none";
  o.cache_dir = dir;
  o.cache_max_bytes = max_bytes;
  o.read_only_caches = std::move(layers);
  return std::move(Runtime::create(o)).value();
}

TEST(CacheCluster, SixteenProcessesFiftyKernelsCompileEachKernelOnce) {
  TempDir dir;
  const std::string cache = dir / "cache", start = dir / "go";
  const int kProcesses = 16, kKernels = 50;
  std::vector<pid_t> pids;
  for (int p = 0; p < kProcesses; ++p) pids.push_back(spawn_worker(cache, kKernels, dir / ("r" + std::to_string(p)), start));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // let every process reach the start line
  std::ofstream(start) << "go";
  int compiles = 0, lock_waits = 0;
  for (int p = 0; p < kProcesses; ++p) {
    const int status = wait_status(pids[p]);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "process " << p;
    const Report r = read_report(dir / ("r" + std::to_string(p)));
    EXPECT_EQ(r.ok, kKernels) << "every process gets every kernel";
    compiles += r.compiles;
    lock_waits += r.lock_waits;
  }
  EXPECT_EQ(compiles, kKernels) << "the compile count equals the number of distinct keys";
  EXPECT_TRUE(fs::is_empty(cache + "/v1/tmp")) << "no temporary entry is left behind";
  auto disk = DiskCache::open(cache);
  ASSERT_TRUE(disk.ok());
  auto entries = (*disk)->list(true);
  EXPECT_EQ(entries.size(), size_t(kKernels));
  for (const auto& e : entries) EXPECT_TRUE(e.ok) << e.problem;
  std::printf("16 processes x 50 kernels: %d compiles, %d lock waits\n", compiles, lock_waits);
}

class KilledProcess : public ::testing::TestWithParam<const char*> {};

TEST_P(KilledProcess, LeavesNothingThatLoadsWrong) {
  TempDir dir;
  const std::string cache = dir / "cache";
  const pid_t victim = spawn_worker(cache, 1, dir / "victim", "", GetParam());
  const int status = wait_status(victim);
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << "the hook killed it at " << GetParam();
  // Nothing half-written is visible as an entry.
  auto disk = DiskCache::open(cache);
  ASSERT_TRUE(disk.ok());
  for (const auto& e : (*disk)->list(true)) EXPECT_TRUE(e.ok) << e.problem;

  // The next process is neither blocked by the dead one's lock nor fooled by its leftovers.
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t next = spawn_worker(cache, 1, dir / "next", "");
  const int next_status = wait_status(next);
  EXPECT_TRUE(WIFEXITED(next_status) && WEXITSTATUS(next_status) == 0);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20));
  const Report r = read_report(dir / "next");
  EXPECT_EQ(r.ok, 1);
  EXPECT_EQ(r.compiles, 1) << "rebuilt: the killed process published nothing";
  EXPECT_TRUE(fs::is_empty(cache + "/v1/tmp")) << "the dead process's temporary entry was cleaned up";
  auto entries = (*DiskCache::open(cache))->list(true);
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_TRUE(entries[0].ok);
}

INSTANTIATE_TEST_SUITE_P(At, KilledProcess, ::testing::Values("compile", "write", "publish"));

TEST(CacheBudget, KeepsTheCacheWithinBudgetAndTheRecentlyUsedEntries) {
  TempDir dir;
  // Odd widths: every kernel takes the same (scalar-load) variant, so entries have similar sizes.
  auto odd = [](int k) { return int64_t{101} + 2 * k; };
  const char* t = testing::compilable_target();
  uint64_t four = 0;
  {
    auto rt = runtime(dir.path());
    for (int k = 0; k < 4; ++k) ASSERT_TRUE(rt->compile(swiglu_spec(1, odd(k)), t).ok());
    four = (*DiskCache::open(dir.path()))->total_bytes();
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  // Use k0 again (a disk hit in a new runtime touches it).
  ASSERT_EQ((*runtime(dir.path())->compile(swiglu_spec(1, odd(0)), t))->origin(), "disk");
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const uint64_t budget = four + 256;
  auto rt = runtime(dir.path(), budget);
  ASSERT_TRUE(rt->compile(swiglu_spec(1, odd(4)), t).ok());
  ASSERT_TRUE(rt->compile(swiglu_spec(1, odd(5)), t).ok());
  EXPECT_EQ(rt->stats().evictions, 2u);
  auto disk = DiskCache::open(dir.path());
  EXPECT_LE((*disk)->total_bytes(), budget);
  // k1 and k2 were least recently used; k0 (used again), k3, k4, k5 survive.
  auto fresh = runtime(dir.path());
  for (int k : {0, 3, 4, 5}) EXPECT_EQ((*fresh->compile(swiglu_spec(1, odd(k)), t))->origin(), "disk") << k;
  for (int k : {1, 2}) EXPECT_EQ((*fresh->compile(swiglu_spec(1, odd(k)), t))->origin(), "compiled") << k;
}

TEST(CacheBudget, NeverEvictsAnEntryInUse) {
  TempDir dir;
  {
    auto rt = runtime(dir.path());
    ASSERT_TRUE(rt->compile(swiglu_spec(1, 64), testing::compilable_target()).ok());
  }
  auto disk = DiskCache::open(dir.path());
  auto entries = (*disk)->list(false);
  ASSERT_EQ(entries.size(), 1u);
  // A reader holds the entry (the shared lock a load takes while it reads).
  int fd = open((entries[0].path + "/meta.json").c_str(), O_RDONLY);
  struct flock fl{};
  fl.l_type = F_RDLCK;
  ASSERT_EQ(fcntl(fd, F_OFD_SETLK, &fl), 0);
  auto gc = (*disk)->collect(0);
  ASSERT_TRUE(gc.ok());
  EXPECT_EQ(gc->evicted, 0u);
  EXPECT_EQ(gc->skipped_in_use, 1u);
  close(fd);
  gc = (*disk)->collect(0);
  EXPECT_EQ(gc->evicted, 1u);
  EXPECT_EQ((*disk)->total_bytes(), 0u);
}

TEST(CacheLayers, ReadOnlyLayersAreSearchedAfterTheUserCache) {
  TempDir shipped, user;
  const char* t = testing::compilable_target();
  { ASSERT_TRUE(runtime(shipped.path())->compile(swiglu_spec(1, 64), t).ok()); }
  const auto shipped_before = (*DiskCache::open(shipped.path()))->list(false).size();
  auto rt = runtime(user.path(), 0, {shipped.path()});
  auto hit = rt->compile(swiglu_spec(1, 64), t);
  ASSERT_TRUE(hit.ok());
  EXPECT_EQ((*hit)->origin(), "disk");
  EXPECT_EQ(rt->stats().layer_hits, 1u);
  EXPECT_EQ(rt->stats().compiles, 0u);
  ASSERT_TRUE(rt->compile(swiglu_spec(1, 65), t).ok());
  EXPECT_EQ(rt->stats().compiles, 1u);
  EXPECT_EQ((*DiskCache::open(shipped.path()))->list(false).size(), shipped_before) << "layers are never written";
  EXPECT_EQ((*DiskCache::open(user.path()))->list(false).size(), 1u);
}

TEST(CacheLayers, ACorruptLayerEntryIsSkippedNotTouched) {
  TempDir shipped, user;
  const char* t = testing::compilable_target();
  { ASSERT_TRUE(runtime(shipped.path())->compile(swiglu_spec(1, 64), t).ok()); }
  auto entry = (*DiskCache::open(shipped.path()))->list(false)[0].path;
  for (const auto& f : fs::directory_iterator(entry))
    if (f.path().filename().string().rfind("code.", 0) == 0) fs::resize_file(f.path(), 100);
  auto rt = runtime(user.path(), 0, {shipped.path()});
  auto c = rt->compile(swiglu_spec(1, 64), t);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)->origin(), "compiled");
  EXPECT_EQ(rt->stats().corrupt_entries, 1u);
  EXPECT_TRUE(fs::exists(entry)) << "a read-only layer is reported, never repaired";
}

TEST(CacheFailures, AWriteFailureDegradesToMemoryAndTheProcessGoesOn) {
  // The file-size limit makes every cache write fail (EFBIG) as a full disk would (ENOSPC), in a
  // child so the limit does not outlive the test.
  TempDir dir;
  pid_t pid = fork();
  if (pid == 0) {
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim = {512, 512};
    setrlimit(RLIMIT_FSIZE, &lim);
    auto rt = runtime(dir.path());
    bool ok = true;
    // sm_90a: NVRTC compiles in memory (lld's output for AMD passes through a temporary file).
    for (int k = 0; k < 3; ++k) ok &= rt->compile(swiglu_spec(1, 64 + k), "sm_90a").ok();
    const CacheStats s = rt->stats();
    // One failed write, then memory only: no more attempts.
    _exit(ok && s.compiles == 3 && s.disk_errors == 1 ? 0 : 1);
  }
  const int status = wait_status(pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  EXPECT_TRUE(fs::is_empty(dir.path() + "/v1/entries")) << "no half-written entry";
  EXPECT_TRUE(fs::is_empty(dir.path() + "/v1/tmp"));
}

TEST(CacheFailures, AFullTmpfsDegradesToMemory) {
  if (geteuid() != 0) GTEST_SKIP() << "mounting a tmpfs needs root";
  TempDir dir;
  const std::string mnt = dir / "small";
  fs::create_directories(mnt);
  if (system(("mount -t tmpfs -o size=64k,mode=0700 tmpfs " + mnt + " 2>/dev/null").c_str()) != 0)
    GTEST_SKIP() << "this machine does not allow mounting a tmpfs";
  auto rt = runtime(mnt);
  bool ok = true;
  for (int k = 0; k < 12; ++k) ok &= rt->compile(swiglu_spec(1, 64 + k), testing::compilable_target()).ok();
  EXPECT_TRUE(ok);
  EXPECT_EQ(rt->stats().disk_errors, 1u);
  auto disk = DiskCache::open(mnt);
  for (const auto& e : (*disk)->list(true)) EXPECT_TRUE(e.ok) << e.problem;
  rt.reset();
  disk->reset();
  EXPECT_EQ(system(("umount " + mnt).c_str()), 0);
}

TEST(CacheFailures, AReadOnlyFileSystemIsReadButNotWritten) {
  if (geteuid() != 0) GTEST_SKIP() << "mounting a tmpfs needs root";
  TempDir dir;
  const std::string mnt = dir / "ro";
  fs::create_directories(mnt);
  if (system(("mount -t tmpfs -o size=4m,mode=0700 tmpfs " + mnt + " 2>/dev/null").c_str()) != 0)
    GTEST_SKIP() << "this machine does not allow mounting a tmpfs";
  const char* t = testing::compilable_target();
  { ASSERT_TRUE(runtime(mnt)->compile(swiglu_spec(1, 64), t).ok()); }
  ASSERT_EQ(system(("mount -o remount,ro " + mnt).c_str()), 0);
  {
    auto rt = runtime(mnt);
    auto old = rt->compile(swiglu_spec(1, 64), t);
    ASSERT_TRUE(old.ok());
    EXPECT_EQ((*old)->origin(), "disk") << "the read-only cache still serves its entries";
    auto fresh = rt->compile(swiglu_spec(1, 65), t);
    ASSERT_TRUE(fresh.ok()) << fresh.error().message;
    EXPECT_EQ(rt->stats().compiles, 1u);
  }
  EXPECT_EQ(system(("umount " + mnt).c_str()), 0);
}

// A writer stopped in the middle of writing its temporary, and a cleaner in another PID namespace
// (a container with host networking: same host name, other pids): the cleaner cannot see the
// writer's pid, and must still leave its temporary alone, because the writer holds its lock.
TEST(CacheTemporaries, ALiveWriterInAnotherPidNamespaceKeepsItsTemporary) {
  if (geteuid() != 0) GTEST_SKIP() << "a new PID namespace needs root (CAP_SYS_ADMIN)";
  TempDir dir;
  const std::string cache = dir / "cache";
  { ASSERT_TRUE(DiskCache::open(cache).ok()); }
  const pid_t writer = spawn_worker(cache, 1, dir / "report", "", "stop:write");
  int status = 0;
  ASSERT_EQ(waitpid(writer, &status, WUNTRACED), writer);
  ASSERT_TRUE(WIFSTOPPED(status)) << "the writer did not stop in the middle of its write";
  size_t before = 0;
  for (const auto& e : fs::directory_iterator(cache + "/v1/tmp")) before += e.is_directory();
  ASSERT_EQ(before, 1u);

  const pid_t outer = fork();
  if (outer == 0) {
    if (unshare(CLONE_NEWPID) != 0) _exit(77);
    const pid_t inner = fork();  // pid 1 of the new namespace
    if (inner == 0) _exit(DiskCache::open(cache).ok() ? 0 : 1);
    int st = 0;
    waitpid(inner, &st, 0);
    _exit(WIFEXITED(st) ? WEXITSTATUS(st) : 2);
  }
  const int cleaner = wait_status(outer);
  if (WIFEXITED(cleaner) && WEXITSTATUS(cleaner) == 77) {
    kill(writer, SIGKILL);
    wait_status(writer);
    GTEST_SKIP() << "this machine does not allow a new PID namespace";
  }
  EXPECT_TRUE(WIFEXITED(cleaner) && WEXITSTATUS(cleaner) == 0);
  size_t after = 0;
  for (const auto& e : fs::directory_iterator(cache + "/v1/tmp")) after += e.is_directory();
  EXPECT_EQ(after, 1u) << "the cleaner removed the temporary of a live writer";

  kill(writer, SIGCONT);
  const int done = wait_status(writer);
  EXPECT_TRUE(WIFEXITED(done) && WEXITSTATUS(done) == 0);
  EXPECT_EQ((*DiskCache::open(cache))->list(true).size(), 1u) << "the writer's entry was published";
  EXPECT_EQ(read_report(dir / "report").compiles, 1);
}

TEST(CacheSecurity, EntriesOwnedByAnotherUserAreRefused) {
  if (geteuid() != 0) GTEST_SKIP() << "changing owners needs root";
  TempDir dir;
  const char* t = testing::compilable_target();
  { ASSERT_TRUE(runtime(dir.path())->compile(swiglu_spec(1, 64), t).ok()); }
  auto entry = (*DiskCache::open(dir.path()))->list(false)[0].path;
  ASSERT_EQ(chown(entry.c_str(), 65534, 65534), 0);
  auto rt = runtime(dir.path());
  auto c = rt->compile(swiglu_spec(1, 64), t);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)->origin(), "compiled") << "the foreign entry was not loaded";
  EXPECT_EQ(rt->stats().corrupt_entries, 1u);

  // A cache directory owned by another user: refused, memory only.
  const std::string foreign = dir / "foreign";
  fs::create_directories(foreign);
  chmod(foreign.c_str(), 0700);
  ASSERT_EQ(chown(foreign.c_str(), 65534, 65534), 0);
  auto refused = DiskCache::open(foreign);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("owned by uid 65534"), std::string::npos);
  EXPECT_EQ(runtime(foreign)->cache_dir(), "");
}

}  // namespace
}  // namespace kiln
