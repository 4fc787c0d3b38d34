// The disk cache: round trips with hit and miss counts, integrity checks, atomic publication,
// permissions, and one compile per key across threads and processes.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <climits>
#include <filesystem>
#include <fstream>
#include <thread>

#include "cache/cache_key.h"
#include "cache/disk_cache.h"
#include "codegen/codegen.h"
#include "compile/compiler.h"
#include "support/json_read.h"
#include "templates/op_template.h"
#include "templates/registry.h"
#include "kiln/runtime.h"
#include "support/sha256.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace kiln {
namespace {
using testing::gemm_spec;
using testing::rmsnorm_spec;
using testing::swiglu_spec;
using testing::compile_only_runtime;
using testing::TempDir;

std::vector<fs::path> entry_dirs(const std::string& root) {
  std::vector<fs::path> out;
  for (auto it = fs::recursive_directory_iterator(root + "/v1/entries"); it != fs::recursive_directory_iterator(); ++it)
    if (it.depth() == 1) out.push_back(it->path());
  return out;
}

fs::path code_file(const fs::path& entry) {
  for (const auto& f : fs::directory_iterator(entry))
    if (f.path().filename().string().rfind("code.", 0) == 0) return f.path();
  return {};
}

// The entry that a first runtime's sm_90a compile of `spec` leaves in the cache at `root`, with
// its meta.json parsed (entry empty where the compile failed or left no single entry).
struct OneEntry {
  fs::path entry;
  nlohmann::json meta;
  void write_meta() const { std::ofstream(entry / "meta.json", std::ios::trunc) << meta.dump(); }
};
OneEntry compile_one_entry(const std::string& root, const KernelSpec& spec) {
  if (!compile_only_runtime(root)->compile(spec, "sm_90a").ok()) return {};
  auto entries = entry_dirs(root);
  if (entries.size() != 1) return {};
  return {entries[0], nlohmann::json::parse(std::ifstream(entries[0] / "meta.json"))};
}
// A second runtime's compile of `spec` on that cache: where the kernel came from ("disk" or
// "compiled") and the corrupt entries it found.
std::pair<std::string, uint64_t> compile_again(const std::string& root, const KernelSpec& spec) {
  auto rt = compile_only_runtime(root);
  auto again = rt->compile(spec, "sm_90a");
  if (!again.ok()) return {"error: " + again.error().message, rt->stats().corrupt_entries};
  return {std::string((*again)->origin()), rt->stats().corrupt_entries};
}

TEST(DiskCache, RoundTripCountsHitsAndMisses) {
  TempDir dir;
  const KernelSpec spec = gemm_spec(96, 80, 40, false, true);
  const char* target = testing::compilable_target();
  const bool amd = std::string(target) != "sm_90a";
  {
    auto rt = compile_only_runtime(dir.path());
    auto first = rt->compile(spec, target);
    ASSERT_TRUE(first.ok()) << first.error().message;
    EXPECT_EQ((*first)->origin(), "compiled");
    auto again = rt->compile(spec, target);
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->get(), first->get()) << "a repeated request is served from memory";
    const CacheStats s = rt->stats();
    EXPECT_EQ(s.compiles, 1u);
    EXPECT_EQ(s.memory_hits, 1u);
    EXPECT_EQ(s.disk_hits, 0u);
  }
  // A new runtime (a new process, in effect) finds the entry on disk.
  auto rt = compile_only_runtime(dir.path());
  auto loaded = rt->compile(spec, target);
  ASSERT_TRUE(loaded.ok()) << loaded.error().message;
  EXPECT_EQ((*loaded)->origin(), "disk");
  EXPECT_EQ(rt->stats().compiles, 0u);
  EXPECT_EQ(rt->stats().disk_hits, 1u);
  EXPECT_GT((*loaded)->info().registers, 0) << "metadata survives the round trip";
  EXPECT_NE((*loaded)->source().find("kiln_gemm"), std::string::npos);

  // The entry keeps the source and the metadata next to the code object; nothing is left in tmp/.
  auto entries = entry_dirs(dir.path());
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_TRUE(fs::exists(entries[0] / (amd ? "code.hsaco" : "code.cubin")));
  EXPECT_TRUE(fs::exists(entries[0] / (amd ? "source.hip" : "source.cu")));
  EXPECT_TRUE(fs::exists(entries[0] / "meta.json"));
  EXPECT_TRUE(fs::is_empty(dir.path() + "/v1/tmp"));
  EXPECT_EQ(entries[0].filename().string(), (*loaded)->info().cache_key);
}

TEST(DiskCache, DirectoryIsPrivate) {
  TempDir dir;
  auto rt = compile_only_runtime(dir / "cache");
  struct stat st{};
  ASSERT_EQ(stat((dir / "cache").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
}

TEST(DiskCache, WorldWritableDirectoryIsRefusedAndTheRuntimeGoesOn) {
  TempDir dir;
  const std::string root = dir / "shared";
  fs::create_directories(root);
  chmod(root.c_str(), 0777);
  auto refused = DiskCache::open(root);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("writable by group or others"), std::string::npos);
  auto rt = compile_only_runtime(root);
  EXPECT_EQ(rt->cache_dir(), "") << "memory-only";
  auto c = rt->compile(swiglu_spec(1, 64), "sm_90a");
  ASSERT_TRUE(c.ok()) << c.error().message;
  EXPECT_EQ(rt->stats().compiles, 1u);
}

TEST(DiskCache, UnwritableDirectoryDegradesToMemory) {
  if (geteuid() == 0) GTEST_SKIP() << "root ignores directory permissions";
  TempDir dir;
  const std::string root = dir / "ro";
  fs::create_directories(root);
  chmod(root.c_str(), 0500);
  auto rt = compile_only_runtime(root);
  EXPECT_EQ(rt->cache_dir(), "");
  EXPECT_TRUE(rt->compile(swiglu_spec(1, 64), "sm_90a").ok());
}

// Each corruption is detected on load, moved aside, counted, and the kernel rebuilt.
class Corruption : public ::testing::TestWithParam<const char*> {};

TEST_P(Corruption, IsDetectedAndRebuilt) {
  const std::string kind = GetParam();
  if (kind == "wrong_target_code") KILN_REQUIRE_LLVM();
  TempDir dir;
  const KernelSpec spec = rmsnorm_spec(4, 1024);
  { ASSERT_TRUE(compile_only_runtime(dir.path())->compile(spec, "sm_90a").ok()); }
  auto entries = entry_dirs(dir.path());
  ASSERT_EQ(entries.size(), 1u);
  const fs::path entry = entries[0];
  const fs::path code = code_file(entry);
  if (kind == "flipped_byte") {
    std::fstream f(code, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    char c;
    f.read(&c, 1);
    f.seekp(100);
    c = static_cast<char>(c ^ 0x5a);
    f.write(&c, 1);
  } else if (kind == "truncated") {
    fs::resize_file(code, fs::file_size(code) / 2);
  } else if (kind == "missing_file") {
    fs::remove(code);
  } else if (kind == "appended") {
    // Longer than meta.json says, with the recorded bytes intact: the read of size + 1 bytes sees it.
    std::ofstream(code, std::ios::binary | std::ios::app) << "tail";
  } else if (kind == "duplicate_key_metadata") {
    // Valid JSON but for a second "target": nlohmann would keep the last; meta.json is refused.
    std::ifstream in(entry / "meta.json");
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ASSERT_EQ(text.front(), '{');
    std::ofstream(entry / "meta.json", std::ios::trunc) << "{\"target\": \"gfx942\"," << text.substr(1);
  } else if (kind == "garbage_metadata") {
    std::ofstream(entry / "meta.json") << "{\"format_version\": 1, \"key\": [";
  } else if (kind == "wrong_target_code") {
    // An hsaco in place of the cubin, with meta.json's checksum updated to match: only the
    // code-object check can tell.
    TempDir other;
    auto amd = compile_only_runtime(other.path())->compile(spec, "gfx942");
    ASSERT_TRUE(amd.ok());
    auto bytes = (*amd)->code_object();
    std::ofstream(code, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    std::ifstream in(entry / "meta.json");
    nlohmann::json meta = nlohmann::json::parse(in);
    std::string data(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    meta["files"]["code.cubin"] = {{"sha256", sha256_hex(data)}, {"bytes", bytes.size()}};
    std::ofstream(entry / "meta.json") << meta.dump();
  }
  auto rt = compile_only_runtime(dir.path());
  auto again = rt->compile(spec, "sm_90a");
  ASSERT_TRUE(again.ok()) << again.error().message;
  EXPECT_EQ((*again)->origin(), "compiled") << "rebuilt, not loaded";
  EXPECT_EQ(rt->stats().corrupt_entries, 1u);
  EXPECT_EQ(rt->stats().compiles, 1u);
  EXPECT_FALSE(fs::is_empty(dir.path() + "/v1/corrupt")) << "the bad entry was moved aside";
  // The rebuilt entry verifies.
  auto cache = DiskCache::open(dir.path());
  ASSERT_TRUE(cache.ok());
  for (const auto& e : (*cache)->list(true)) EXPECT_TRUE(e.ok) << e.path << ": " << e.problem;
}

INSTANTIATE_TEST_SUITE_P(Kinds, Corruption,
                         ::testing::Values("flipped_byte", "truncated", "appended", "missing_file", "garbage_metadata",
                                           "duplicate_key_metadata", "wrong_target_code"));

// A disk hit takes the source it has just generated (and hashed: the key covers it) instead of
// reading and hashing the entry's copy: the copy is what `kiln cache verify` checks. Before, a
// hit read and hashed it again, about a third of a hit's time (bench/bench_disk_hit).
TEST(DiskCache, AHitUsesTheGeneratedSourceAndVerifyChecksTheCopy) {
  TempDir dir;
  const KernelSpec spec = rmsnorm_spec(4, 1024);
  std::string generated;
  {
    auto first = compile_only_runtime(dir.path())->compile(spec, "sm_90a");
    ASSERT_TRUE(first.ok()) << first.error().message;
    generated = (*first)->source();
  }
  auto entries = entry_dirs(dir.path());
  ASSERT_EQ(entries.size(), 1u);
  const fs::path source = entries[0] / "source.cu";
  ASSERT_TRUE(fs::exists(source));
  std::ofstream(source, std::ios::binary | std::ios::trunc) << std::string(generated.size(), 'x');

  auto rt = compile_only_runtime(dir.path());
  auto hit = rt->compile(spec, "sm_90a");
  ASSERT_TRUE(hit.ok()) << hit.error().message;
  EXPECT_EQ((*hit)->origin(), "disk");
  EXPECT_EQ((*hit)->source(), generated);
  EXPECT_EQ(rt->stats().corrupt_entries, 0u);
  auto cache = DiskCache::open(dir.path());
  ASSERT_TRUE(cache.ok());
  auto listed = (*cache)->list(true);
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_FALSE(listed[0].ok) << "verify reads the source file and finds it changed";
}

// meta.json must record the source the key covers: an entry recording another is corrupt.
TEST(DiskCache, AHitRefusesMetadataThatRecordsAnotherSource) {
  TempDir dir;
  const KernelSpec spec = rmsnorm_spec(4, 1024);
  OneEntry e = compile_one_entry(dir.path(), spec);
  ASSERT_FALSE(e.entry.empty());
  const std::string other(100, 'y');
  e.meta["files"]["source.cu"] = {{"sha256", sha256_hex(other)}, {"bytes", other.size()}};
  std::ofstream(e.entry / "source.cu", std::ios::binary | std::ios::trunc) << other;
  e.write_meta();
  EXPECT_EQ(compile_again(dir.path(), spec), std::make_pair(std::string("compiled"), uint64_t{1}))
      << "rebuilt, not loaded";
}

// A load proves the code object by its XXH3-128 (a SHA-256 of a GEMM's cubin was most of a hit),
// `kiln cache verify` by both digests: an entry whose recorded SHA-256 no longer matches but whose
// XXH3-128 does loads, and verify reports it. A changed byte fails the XXH3-128 (Corruption above).
TEST(DiskCache, ALoadChecksTheXxh3AndVerifyChecksBoth) {
  TempDir dir;
  const KernelSpec spec = rmsnorm_spec(4, 1024);
  OneEntry e = compile_one_entry(dir.path(), spec);
  ASSERT_FALSE(e.entry.empty());
  ASSERT_TRUE(e.meta["files"]["code.cubin"].contains("xxh3_128")) << e.meta["files"].dump();
  EXPECT_EQ(e.meta["files"]["code.cubin"]["xxh3_128"].get<std::string>().size(), 32u);
  e.meta["files"]["code.cubin"]["sha256"] = std::string(64, '0');
  e.write_meta();
  EXPECT_EQ(compile_again(dir.path(), spec), std::make_pair(std::string("disk"), uint64_t{0}));
  auto cache = DiskCache::open(dir.path());
  ASSERT_TRUE(cache.ok());
  auto listed = (*cache)->list(true);
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_FALSE(listed[0].ok);
  EXPECT_NE(listed[0].problem.find("SHA-256"), std::string::npos) << listed[0].problem;
}

// Entries written before meta.json recorded an XXH3-128 still load, proved by their SHA-256: a
// load of one is a hit, and a changed byte in one is still found.
TEST(DiskCache, EntriesWithoutAnXxh3LoadByTheirSha256) {
  for (bool damaged : {false, true}) {
    SCOPED_TRACE(damaged ? "a byte changed" : "intact");
    TempDir dir;
    const KernelSpec spec = rmsnorm_spec(4, 1024);
    OneEntry e = compile_one_entry(dir.path(), spec);
    ASSERT_FALSE(e.entry.empty());
    for (auto& [name, file] : e.meta["files"].items()) file.erase("xxh3_128");
    e.write_meta();
    if (damaged) {
      std::fstream code(e.entry / "code.cubin", std::ios::binary | std::ios::in | std::ios::out);
      code.seekg(100);
      const char c = static_cast<char>(code.get());
      code.seekp(100);
      code.put(static_cast<char>(c ^ 1));
    }
    EXPECT_EQ(compile_again(dir.path(), spec),
              damaged ? std::make_pair(std::string("compiled"), uint64_t{1}) : std::make_pair(std::string("disk"), uint64_t{0}));
  }
}

// A recorded XXH3-128 that is not 32 hex characters makes meta.json malformed.
TEST(DiskCache, AMalformedXxh3IsCorrupt) {
  TempDir dir;
  const KernelSpec spec = rmsnorm_spec(4, 1024);
  OneEntry e = compile_one_entry(dir.path(), spec);
  ASSERT_FALSE(e.entry.empty());
  e.meta["files"]["code.cubin"]["xxh3_128"] = "0123";
  e.write_meta();
  EXPECT_EQ(compile_again(dir.path(), spec), std::make_pair(std::string("compiled"), uint64_t{1}));
}

// CacheKey::canonical writes the key's JSON field by field instead of building and dumping it: it
// must stay byte for byte to_json().dump(), or every entry is renamed. Every op's test specs on
// every target, and fields that need escaping.
TEST(CacheKey, CanonicalTextIsTheDump) {
  size_t checked = 0;
  for (const TargetInfo& target : all_targets()) {
    auto compiler = compiler_for(target, "clang");  // version and flags answer without LLVM too
    ASSERT_TRUE(compiler.ok()) << compiler.error().message;
    for (const OpTemplate* op : all_ops()) {
      for (const TestSpec& t : op->test_specs(target)) {
        auto src = generate(t.spec, target);
        if (!src) continue;  // a spec the op does not serve on this target
        // generate() continues the hash of the template's shared prefix: still the text's SHA-256.
        ASSERT_EQ(src->source_sha256, sha256_hex(src->text)) << to_string(t.spec) << " on " << target.name;
        const CacheKey key = CacheKey::make(*src, **compiler);
        ASSERT_EQ(key.canonical(), key.to_json().dump()) << to_string(t.spec) << " on " << target.name;
        EXPECT_EQ(key.digest(), sha256_hex(key.to_json().dump()));
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 100u);
  CacheKey odd;
  odd.spec = {"op \"quoted\" \\ back", DType::bf16, DType::f32, {{"a\nb", -3}, {"\u00e9", INT64_MIN}, {"", INT64_MAX}}};
  odd.config = {{"tab\there", 0}, {"\x01", 1}};
  odd.target = "sm_90a";
  odd.compiler = "c\"c";
  odd.compiler_version = "\x7f";
  odd.flags = "-D X=\"y\" \\ \r\n | z";
  odd.template_sha256 = "";
  odd.source_sha256 = "\xc3\xa9";
  EXPECT_EQ(odd.canonical(), odd.to_json().dump());
}

// A SHA-256 state copied after a prefix gives the digest of prefix + rest, and is left as it was.
TEST(Sha256, AStateAfterAPrefixHashesEveryContinuation) {
  const std::string text = std::string(200, 'a') + "\n" + std::string(70, '\0') + "tail";
  for (size_t cut : {size_t{0}, size_t{1}, size_t{63}, size_t{64}, size_t{65}, size_t{200}, text.size()}) {
    Sha256 prefix;
    prefix.update(std::string_view(text).substr(0, cut));
    EXPECT_EQ(prefix.hex_of(std::string_view(text).substr(cut)), sha256_hex(text)) << cut;
    EXPECT_EQ(prefix.hex_of(std::string_view(text).substr(cut)), sha256_hex(text)) << "unchanged by hex_of";
    EXPECT_EQ(prefix.hex_of(), sha256_hex(text.substr(0, cut)));
    Sha256 copy(prefix);
    copy.update("x");
    EXPECT_EQ(copy.hex_of(), sha256_hex(text.substr(0, cut) + "x"));
    EXPECT_EQ(prefix.hex_of(), sha256_hex(text.substr(0, cut))) << "a copy is independent";
  }
  EXPECT_EQ(Sha256().hex_of(), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

// parse_json_limited (the SAX builder under meta.json, tuning records and manifests) gives
// json::parse's value and enforces its limits at their exact bounds.
TEST(JsonLimits, TheBuilderMatchesJsonParseAndEnforcesTheLimits) {
  const std::string text =
      R"({"a": [1, -2, 3.5, "x\u00e9", true, false, null, [], {}], "b": {"c": {"d": [[{"e": 18446744073709551615}]]}},)"
      R"( "f": "", "g": [{"h": 1}, {"h": 2}], "i": -9223372036854775808})";
  EXPECT_EQ(parse_json_limited(text), nlohmann::json::parse(text));
  EXPECT_EQ(parse_json_limited("7"), nlohmann::json(7));
  EXPECT_EQ(parse_json_limited("\"s\""), nlohmann::json("s"));
  auto nested = [](int n) { return std::string(n, '[') + std::string(n, ']'); };
  EXPECT_NO_THROW(parse_json_limited(nested(64)));
  EXPECT_THROW(parse_json_limited(nested(65)), JsonLimitError);
  EXPECT_NO_THROW(parse_json_limited(nested(3), {.max_depth = 3}));
  EXPECT_THROW(parse_json_limited(nested(4), {.max_depth = 3}), JsonLimitError);
  EXPECT_THROW(parse_json_limited(R"({"a": 1, "b": {"x": 1, "x": 2}})"), JsonLimitError);
  EXPECT_THROW(parse_json_limited(R"({"a": 1, "a": {}})"), JsonLimitError);
  EXPECT_NO_THROW(parse_json_limited(R"({"a": {"x": 1}, "b": {"x": 1}})")) << "one name in two objects";
  EXPECT_EQ(parse_json_limited(R"({"a": 1, "a": [2]})", {.reject_duplicate_keys = false}), nlohmann::json::parse(R"({"a": [2]})"));
  EXPECT_THROW(parse_json_limited(R"({"a": 1,})"), nlohmann::json::parse_error);
  EXPECT_THROW(parse_json_limited(""), nlohmann::json::parse_error);
  EXPECT_THROW(parse_json_limited("[1] 2"), nlohmann::json::parse_error);
  try {
    parse_json_limited(std::string(R"({"k\u0001ey": 1, "k\u0001ey": 2})"));
    ADD_FAILURE() << "a duplicate key was accepted";
  } catch (const JsonLimitError& e) {
    EXPECT_EQ(std::string(e.what()), "duplicate key \"k?ey\"") << "control characters are not echoed";
  }
}

TEST(DiskCache, VerifyFindsEveryBadEntry) {
  TempDir dir;
  {
    auto rt = compile_only_runtime(dir.path());
    ASSERT_TRUE(rt->compile(swiglu_spec(1, 64), "sm_90a").ok());
    ASSERT_TRUE(rt->compile(swiglu_spec(1, 128), "sm_90a").ok());
  }
  auto cache = DiskCache::open(dir.path());
  ASSERT_TRUE(cache.ok());
  auto all = (*cache)->list(true);
  ASSERT_EQ(all.size(), 2u);
  fs::resize_file(code_file(all[0].path), 10);
  all = (*cache)->list(true);
  EXPECT_FALSE(all[0].ok);
  EXPECT_TRUE(all[1].ok);
  auto cleared = (*cache)->clear();
  ASSERT_TRUE(cleared.ok());
  EXPECT_EQ(*cleared, 2u);
  EXPECT_TRUE((*cache)->list(false).empty());
}

TEST(DiskCache, ThreadsAskingForOneKernelCompileItOnce) {
  TempDir dir;
  auto rt = compile_only_runtime(dir.path());
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int i = 0; i < 8; ++i)
    threads.emplace_back([&] {
      if (!rt->compile(gemm_spec(64, 64, 64, false, true), "sm_90a").ok()) ++failures;
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(rt->stats().compiles, 1u);
}

TEST(DiskCache, ProcessesAskingForOneKernelCompileItOnce) {
  // Forked processes share the cache directory; the per-key file lock lets exactly one compile.
  TempDir dir;
  const int kProcesses = 6;
  const std::string counts = dir / "counts";
  fs::create_directories(counts);
  std::vector<pid_t> children;
  for (int p = 0; p < kProcesses; ++p) {
    pid_t pid = fork();
    if (pid == 0) {
      RuntimeOptions o;
      o.backend = "none";
      o.cache_dir = dir / "cache";
      auto rt = Runtime::create(o);
      int code = 1;
      if (rt.ok()) {
        bool all = true;
        for (int k = 0; k < 5; ++k) all &= (*rt)->compile(swiglu_spec(1, 64 + k), "sm_90a").ok();
        std::ofstream(counts + "/" + std::to_string(getpid())) << (*rt)->stats().compiles;
        code = all ? 0 : 2;
      }
      _exit(code);
    }
    children.push_back(pid);
  }
  for (pid_t pid : children) {
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  int total = 0;
  for (const auto& f : fs::directory_iterator(counts)) {
    int n = 0;
    std::ifstream(f.path()) >> n;
    total += n;
  }
  EXPECT_EQ(total, 5) << "one compile per distinct kernel across all processes";
  EXPECT_TRUE(fs::is_empty(dir / "cache/v1/tmp"));
}

}  // namespace
}  // namespace kiln
