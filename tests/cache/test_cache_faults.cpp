// Faults never destroy good entries and never crash: concurrent eviction and clear, read errors
// (a descriptor limit), special files in place of entry files, and trust checks on the way to an
// entry. Each test here failed on the cache before these were fixed (see the commit messages).
#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#if KILN_TEST_WITH_LIBARCHIVE
#include <archive.h>
#include <archive_entry.h>
#endif

#include "cache/archive.h"
#include "cache/disk_cache.h"
#include "kiln/runtime.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace kiln {
namespace {
using testing::compile_only_runtime;
using testing::gemm_spec;
using testing::TempDir;

/// A well-formed entry with a fake code object (list(false), eviction and clear do not look at it).
CacheEntry fake_entry(int i) {
  CacheEntry e;
  e.key = fmt::format("{:064x}", 0xabc000 + i);
  e.key_json = {{"op", "gemm"}, {"target", "gfx942"}, {"i", i}};
  e.target = "gfx942";
  e.kernel_name = "k";
  e.source = std::string(512, 's');
  e.compiled.code.format = "hsaco";
  e.compiled.code.bytes.assign(2048, 0x7f);
  return e;
}

size_t count(const std::string& dir) {
  size_t n = 0;
  std::error_code ec;
  for (auto it = fs::directory_iterator(dir, ec); !ec && it != fs::directory_iterator(); it.increment(ec)) ++n;
  return n;
}

/// Runs `body` in a child process with a time limit; returns its exit status (128+signal if killed,
/// so that a hang shows up as 128+SIGALRM instead of hanging the suite).
template <class F>
int in_child(F body, unsigned seconds = 30) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::alarm(seconds);
    _exit(body());
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// A listing races with eviction: entries vanish between readdir and stat. Nothing may throw.
TEST(CacheFaults, ListingUnderConcurrentGcNeverThrows) {
  TempDir dir;
  auto cache = std::move(DiskCache::open(dir.path())).value();
  std::atomic<bool> stop{false};
  std::thread churn([&] {
    auto writer = std::move(DiskCache::open(dir.path())).value();
    for (int i = 0; !stop; ++i) {
      (void)writer->store(fake_entry(i % 64));
      if (i % 4 == 0) (void)writer->collect(4096);
    }
  });
  size_t listings = 0;
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(1500);
  EXPECT_NO_THROW({
    while (std::chrono::steady_clock::now() < until) {
      (void)cache->list(false);
      (void)cache->list(true);
      (void)cache->total_bytes();
      (void)cache->collect(8192);
      ++listings;
    }
  });
  stop = true;
  churn.join();
  EXPECT_GT(listings, 0u);
}

// EMFILE at every point of a load: a read error, never a reason to quarantine.
TEST(CacheFaults, ADescriptorLimitNeverQuarantinesAGoodEntry) {
  TempDir dir;
  const KernelSpec spec = gemm_spec(64, 64, 32, false, true);
  const char* target = testing::compilable_target();
  std::string key;
  {
    auto rt = compile_only_runtime(dir.path());
    auto c = rt->compile(spec, target);
    ASSERT_TRUE(c.ok()) << c.error().message;
    key = (*c)->info().cache_key;
  }
  const int status = in_child([&] {
    auto cache = DiskCache::open(dir.path());
    if (!cache) return 2;
    struct rlimit lim{64, 64};
    if (::setrlimit(RLIMIT_NOFILE, &lim) != 0) return 3;
    for (int free_fds = 0; free_fds < 12; ++free_fds) {
      std::vector<int> fillers;
      for (int fd; (fd = ::open("/dev/null", O_RDONLY)) >= 0;) fillers.push_back(fd);
      for (int k = 0; k < free_fds && !fillers.empty(); ++k) {
        ::close(fillers.back());
        fillers.pop_back();
      }
      (void)(*cache)->load(key);
      (void)(*cache)->list(true);
      for (int fd : fillers) ::close(fd);
    }
    return (*cache)->load(key) ? 0 : 4;
  });
  EXPECT_EQ(status, 0) << "the entry must still load once descriptors are free again";
  EXPECT_EQ(count(dir / "v1/corrupt"), 0u) << "a read error moved a good entry to corrupt/";
  auto rt = compile_only_runtime(dir.path());
  auto again = rt->compile(spec, target);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)->origin(), "disk");
}

// A FIFO in place of an entry file: every reader and every recovery path returns.
TEST(CacheFaults, AFifoInPlaceOfAnEntryFileNeverHangs) {
  TempDir dir;
  const char* target = testing::compilable_target();
  const KernelSpec a = gemm_spec(64, 64, 32, false, true), b = gemm_spec(64, 64, 48, false, true);
  std::string key_a, key_b;
  {
    auto rt = compile_only_runtime(dir.path());
    key_a = (*rt->compile(a, target))->info().cache_key;
    key_b = (*rt->compile(b, target))->info().cache_key;
  }
  auto entry = [&](const std::string& key) { return dir.path() + "/v1/entries/" + key.substr(0, 2) + "/" + key; };
  const std::string code = std::string(target) == "sm_90a" ? "code.cubin" : "code.hsaco";
  ASSERT_EQ(::unlink((entry(key_a) + "/meta.json").c_str()), 0);
  ASSERT_EQ(::mkfifo((entry(key_a) + "/meta.json").c_str(), 0600), 0);
  ASSERT_EQ(::unlink((entry(key_b) + "/" + code).c_str()), 0);
  ASSERT_EQ(::mkfifo((entry(key_b) + "/" + code).c_str(), 0600), 0);
  EXPECT_EQ(in_child([&] {
              auto cache = DiskCache::open(dir.path());
              if (!cache) return 2;
              (void)(*cache)->list(false);
              (void)(*cache)->list(true);
              (void)(*cache)->telemetry();
              return 0;
            }, 20), 0) << "stat, ls and verify must not hang";
  EXPECT_EQ(in_child([&] {
              auto cache = DiskCache::open(dir.path());
              if (!cache || !(*cache)->collect(0)) return 1;
              return 0;
            }, 20), 0) << "gc must not hang";
  ASSERT_EQ(::mkfifo((dir / "v1/tmp/planted").c_str(), 0600), 0);
  ::unlink((dir / "v1/telemetry.jsonl").c_str());
  ASSERT_EQ(::mkfifo((dir / "v1/telemetry.jsonl").c_str(), 0600), 0);
  EXPECT_EQ(in_child([&] {
              auto cache = DiskCache::open(dir.path());
              if (!cache || !(*cache)->clear()) return 1;
              (void)(*cache)->telemetry();
              return 0;
            }, 20), 0) << "clear must not hang";
  // Loads refuse the special files and rebuild (in this process: LLVM does not survive a fork).
  ASSERT_EQ(::unlink((dir / "v1/telemetry.jsonl").c_str()), 0);
  {
    auto rt = compile_only_runtime(dir.path());
    ASSERT_TRUE(rt->compile(a, target).ok());
  }
  ASSERT_EQ(::unlink((entry(key_a) + "/meta.json").c_str()) , 0);
  ASSERT_EQ(::mkfifo((entry(key_a) + "/meta.json").c_str(), 0600), 0);
  auto rt = compile_only_runtime(dir.path());
  auto ra = rt->compile(a, target);
  ASSERT_TRUE(ra.ok()) << ra.error().message;
  EXPECT_EQ((*ra)->origin(), "compiled") << "the entry with a FIFO was refused and rebuilt";
}

// Clear under concurrent writers: every store succeeds, every clear succeeds.
TEST(CacheFaults, ClearUnderConcurrentWritersLosesNoWrite) {
  TempDir dir;
  auto cache = std::move(DiskCache::open(dir.path())).value();
  std::atomic<bool> stop{false};
  std::atomic<int> clears{0}, clear_errors{0};
  std::thread clearer([&] {
    auto c = std::move(DiskCache::open(dir.path())).value();
    while (!stop) {
      auto r = c->clear();
      ++clears;
      if (!r) {
        ++clear_errors;
        ADD_FAILURE() << r.error().message;
      }
    }
  });
  int failed = 0;
  for (int i = 0; i < 300; ++i) {
    auto r = cache->store(fake_entry(i));
    if (!r) {
      ++failed;
      ADD_FAILURE() << "store " << i << ": " << r.error().message;
    }
  }
  stop = true;
  clearer.join();
  EXPECT_EQ(failed, 0);
  EXPECT_EQ(clear_errors, 0);
  EXPECT_GT(clears, 0);
}

// A directory on the way to the root that another user may write (not sticky): refused.
TEST(CacheTrust, ARootUnderAWorldWritableDirectoryIsRefused) {
  TempDir dir;
  const std::string shared = dir / "shared";
  fs::create_directories(shared);
  ::chmod(shared.c_str(), 0777);
  auto refused = DiskCache::open(shared + "/cache");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("writable by group or others"), std::string::npos) << refused.error().message;
  EXPECT_NE(refused.error().message.find(shared), std::string::npos);
  // Sticky and owned by root (as /tmp): accepted (the test's own TempDir lives under /tmp).
  if (::geteuid() == 0) {
    ::chmod(shared.c_str(), 01777);
    EXPECT_TRUE(DiskCache::open(shared + "/cache").ok());
  }
}

// In a read-only layer owned by root, every file is checked, not only the directories.
TEST(CacheTrust, AWorldWritableFileInARootOwnedLayerIsRefused) {
  TempDir dir;
  const char* target = testing::compilable_target();
  const KernelSpec spec = gemm_spec(64, 64, 32, false, true);
  std::string key;
  { key = (*compile_only_runtime(dir.path())->compile(spec, target))->info().cache_key; }
  const std::string code = std::string(target) == "sm_90a" ? "code.cubin" : "code.hsaco";
  const std::string file = dir.path() + "/v1/entries/" + key.substr(0, 2) + "/" + key + "/" + code;
  ASSERT_EQ(::chmod(file.c_str(), 0666), 0);
  auto layer = DiskCache::open(dir.path(), /*read_only=*/true);
  ASSERT_TRUE(layer.ok()) << layer.error().message;
  EXPECT_FALSE((*layer)->load(key).has_value()) << "a code object anyone may write was loaded";
  EXPECT_EQ((*layer)->corrupt_entries(), 1u);
}

// A symlink in place of an entry file is refused, not followed.
TEST(CacheTrust, ASymlinkedEntryFileIsRefused) {
  TempDir dir;
  const char* target = testing::compilable_target();
  const KernelSpec spec = gemm_spec(64, 64, 32, false, true);
  std::string key;
  { key = (*compile_only_runtime(dir.path())->compile(spec, target))->info().cache_key; }
  const std::string code = std::string(target) == "sm_90a" ? "code.cubin" : "code.hsaco";
  const std::string entry = dir.path() + "/v1/entries/" + key.substr(0, 2) + "/" + key;
  fs::copy_file(entry + "/" + code, dir / "elsewhere");
  ASSERT_EQ(::unlink((entry + "/" + code).c_str()), 0);
  ASSERT_EQ(::symlink((dir / "elsewhere").c_str(), (entry + "/" + code).c_str()), 0);
  auto cache = std::move(DiskCache::open(dir.path())).value();
  EXPECT_FALSE(cache->load(key).has_value()) << "a symlinked code object was followed";
}

// An import is bounded by what all its members unpack to, not only member by member.
TEST(CacheFaults, AnImportIsBoundedInTotalStagedBytes) {
  if (!archive_supported()) GTEST_SKIP() << "built without libarchive";
  TempDir src, dst;
  const char* target = testing::compilable_target();
  {
    auto rt = compile_only_runtime(src.path());
    ASSERT_TRUE(rt->compile(gemm_spec(64, 64, 32, false, true), target).ok());
    ASSERT_TRUE(rt->compile(gemm_spec(64, 64, 48, false, true), target).ok());
  }
  auto from = std::move(DiskCache::open(src.path())).value();
  ASSERT_TRUE(export_cache(*from, src / "a.tar.zst").ok());
  auto to = std::move(DiskCache::open(dst.path())).value();
  ImportLimits limits;
  limits.max_total_bytes = 4096;  // less than the two entries together
  auto r = import_cache(*to, src / "a.tar.zst", limits);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::corrupt);
  EXPECT_NE(r.error().message.find("unpacks to more than 4096 bytes"), std::string::npos) << r.error().message;
  EXPECT_TRUE(to->list(false).empty()) << "nothing is imported";
  EXPECT_EQ(count(dst / "v1/tmp"), 0u) << "the staging directory is removed";
  EXPECT_TRUE(import_cache(*to, src / "a.tar.zst").ok()) << "the default limits accept it";
}

// An import leaves the cache's file system a margin: an archive that unpacks to more than the
// free space less that margin is refused before staging writes past it (the free space is
// injected: a small file system simulated on this one).
TEST(CacheFaults, AnImportIsBoundedByTheFreeSpaceOfTheCache) {
  if (!archive_supported()) GTEST_SKIP() << "built without libarchive";
  TempDir src, dst;
  const char* target = testing::compilable_target();
  {
    auto rt = compile_only_runtime(src.path());
    ASSERT_TRUE(rt->compile(gemm_spec(64, 64, 32, false, true), target).ok());
    ASSERT_TRUE(rt->compile(gemm_spec(64, 64, 48, false, true), target).ok());
  }
  auto from = std::move(DiskCache::open(src.path())).value();
  auto exported = export_cache(*from, src / "a.tar.zst");
  ASSERT_TRUE(exported.ok()) << exported.error().message;
  auto to = std::move(DiskCache::open(dst.path())).value();
  ImportLimits limits;
  std::string measured;
  const uint64_t room = exported->entry_bytes / 2;  // half of what the archive unpacks to
  limits.space = [&](const std::string& dir) -> Result<FileSystemSpace> {
    measured = dir;
    return FileSystemSpace{limits.min_free_bytes + room, uint64_t{1} << 30};  // 2% of 1 GiB < 64 MiB
  };
  auto r = import_cache(*to, src / "a.tar.zst", limits);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::io_error);
  EXPECT_NE(r.error().message.find("unpacks to more than the cache's file system can take"), std::string::npos)
      << r.error().message;
  EXPECT_NE(r.error().message.find("leaves 64.0 MiB free"), std::string::npos) << r.error().message;
  EXPECT_EQ(measured, dst.path() + "/v1/tmp") << "the space measured is the cache's";
  EXPECT_TRUE(to->list(false).empty()) << "nothing is imported";
  EXPECT_EQ(count(dst / "v1/tmp"), 0u) << "the staging directory is removed";

  // The margin scales with the file system: 2% of 16 GiB is more than 64 MiB.
  limits.space = [&](const std::string&) -> Result<FileSystemSpace> {
    return FileSystemSpace{limits.min_free_bytes + (uint64_t{64} << 20), uint64_t{16} << 30};
  };
  r = import_cache(*to, src / "a.tar.zst", limits);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::io_error);

  // With room for it, the same archive imports.
  limits.space = [&](const std::string&) -> Result<FileSystemSpace> {
    return FileSystemSpace{limits.min_free_bytes + 4 * exported->entry_bytes + 65536, uint64_t{1} << 30};
  };
  r = import_cache(*to, src / "a.tar.zst", limits);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->imported.size(), 2u);
}

#if KILN_TEST_WITH_LIBARCHIVE
// Writes a tar.zst holding one member `name` of `bytes` zero bytes: a decompression bomb.
void write_zero_archive(const std::string& path, const std::string& name, uint64_t bytes) {
  archive* a = archive_write_new();
  ASSERT_EQ(archive_write_set_format_pax_restricted(a), ARCHIVE_OK);
  ASSERT_EQ(archive_write_add_filter_zstd(a), ARCHIVE_OK);
  ASSERT_EQ(archive_write_set_filter_option(a, "zstd", "compression-level", "19"), ARCHIVE_OK);
  ASSERT_EQ(archive_write_open_filename(a, path.c_str()), ARCHIVE_OK);
  archive_entry* e = archive_entry_new();
  archive_entry_set_pathname(e, name.c_str());
  archive_entry_set_filetype(e, AE_IFREG);
  archive_entry_set_perm(e, 0600);
  archive_entry_set_size(e, static_cast<la_int64_t>(bytes));
  ASSERT_EQ(archive_write_header(a, e), ARCHIVE_OK);
  const std::vector<char> zeros(1 << 20, 0);
  for (uint64_t done = 0; done < bytes; done += zeros.size())
    ASSERT_GT(archive_write_data(a, zeros.data(), std::min<uint64_t>(zeros.size(), bytes - done)), 0);
  archive_entry_free(e);
  ASSERT_EQ(archive_write_close(a), ARCHIVE_OK);
  archive_write_free(a);
}

// A zstd bomb (a few KB that unpack to 200 MiB of zeros, one member inside the layout, under the
// member and total limits) is refused by the decompression ratio with the default limits, before
// it is staged; on a file system with room for it.
TEST(CacheFaults, AZstdBombIsRefusedByTheDecompressionRatio) {
  if (!archive_supported()) GTEST_SKIP() << "built without libarchive";
  TempDir src, dst;
  const std::string key(64, 'a');
  const std::string bomb = src / "bomb.tar.zst";
  write_zero_archive(bomb, "kiln-cache/v1/entries/aa/" + key + "/code.hsaco", uint64_t{200} << 20);
  const auto archive_bytes = fs::file_size(bomb);
  ASSERT_LT(archive_bytes, 100'000u) << "the bomb is small";
  auto to = std::move(DiskCache::open(dst.path())).value();
  ImportLimits limits;
  limits.space = [](const std::string&) -> Result<FileSystemSpace> {
    return FileSystemSpace{uint64_t{1} << 40, uint64_t{2} << 40};  // room for it: the ratio must refuse it
  };
  auto r = import_cache(*to, bomb, limits);
  ASSERT_FALSE(r.ok()) << "a 200 MiB bomb was staged and " << r->rejected.size() << " entries rejected afterwards";
  EXPECT_EQ(r.error().code, Errc::corrupt);
  EXPECT_NE(r.error().message.find("over the decompression-ratio limit of 64x"), std::string::npos)
      << r.error().message;
  EXPECT_NE(r.error().message.find("nothing was imported"), std::string::npos);
  EXPECT_TRUE(to->list(false).empty()) << "nothing is imported";
  EXPECT_EQ(count(dst / "v1/tmp"), 0u) << "the staging directory is removed";

  // The same bomb against a small file system (the free space injected): refused by the space.
  limits.max_ratio = 1e6;
  limits.space = [&](const std::string&) -> Result<FileSystemSpace> {
    return FileSystemSpace{limits.min_free_bytes + (uint64_t{8} << 20), uint64_t{1} << 30};
  };
  r = import_cache(*to, bomb, limits);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().code, Errc::io_error);
  EXPECT_NE(r.error().message.find("staging may write 8.0 MiB"), std::string::npos) << r.error().message;
  EXPECT_EQ(count(dst / "v1/tmp"), 0u) << "the staging directory is removed";
}
#endif

}  // namespace
}  // namespace kiln
