// Tuning records (cache/tuning.h): stored atomically and privately, found again, keyed by
// everything a measured winner depends on, and never trusted when bad: a corrupt, foreign or
// stale record is skipped with one warning, and nothing crashes.
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "templates/registry.h"
#include "cache/tuning.h"
#include "support/log.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace kiln {
namespace {
using testing::gemm_spec;
using testing::target;
using testing::TempDir;

const OpTemplate& gemm() { return **find_op("gemm"); }

TuningKey key_for(const std::string& device = "NVIDIA H200", const std::string& compiler = "nvrtc",
                  const KernelSpec& spec = gemm_spec(1024, 1024, 1024, false, true)) {
  return TuningKey::make(tuning_subject(gemm(), spec, target("sm_90a")), target("sm_90a"), device, compiler);
}

std::vector<KernelConfig> candidates(const KernelSpec& spec = gemm_spec(1024, 1024, 1024, false, true)) {
  return gemm().tuning_candidates(spec, target("sm_90a"));
}

// A record as Runtime::tune writes it: the last candidate wins, the third failed to compile.
TuningRecord record_for(const TuningKey& key) {
  TuningRecord r;
  r.key = key;
  const std::vector<KernelConfig> c = candidates();
  for (size_t i = 0; i < c.size(); ++i) {
    TuneCandidate t;
    t.config = c[i];
    if (i == 2) {
      t.error = "compile_failed: ptxas ran out of registers";
    } else {
      t.median_ms = 0.05 - 0.01 * double(i);
      t.min_ms = t.median_ms - 0.001;
      t.max_ms = t.median_ms + 0.002;
    }
    r.candidates.push_back(t);
  }
  r.winner = c.back();
  r.reps = 20;
  r.created_utc = "2025-06-01T12:00:00Z";
  return r;
}

std::unique_ptr<DiskCache> open_cache(const std::string& root, bool read_only = false) {
  auto c = DiskCache::open(root, read_only);
  EXPECT_TRUE(c.ok()) << c.error().message;
  return std::move(c).value();
}

std::optional<FoundTuning> find(DiskCache& cache, const TuningKey& key) {
  DiskCache* caches[] = {&cache};
  return find_tuning(caches, key, candidates());
}

size_t files_under(const std::string& dir) {
  size_t n = 0;
  std::error_code ec;
  for (const auto& f : fs::directory_iterator(dir, ec)) n += f.is_regular_file() || f.is_directory();
  return n;
}

/// Counts the warnings Kiln logs while it lives.
class Warnings {
 public:
  Warnings() { set_log_sink(std::make_shared<spdlog::sinks::ostream_sink_mt>(text_)); }
  ~Warnings() { set_log_sink(std::make_shared<spdlog::sinks::stderr_color_sink_mt>()); }
  size_t count() const {
    const std::string s = text_.str();
    size_t n = 0;
    for (size_t pos = 0; (pos = s.find("[warning]", pos)) != std::string::npos; ++pos) ++n;
    return n;
  }
  std::string text() const { return text_.str(); }

 private:
  std::ostringstream text_;
};

TEST(Tuning, RecordRoundTrip) {
  TempDir dir;
  auto cache = open_cache(dir / "cache");
  const TuningKey key = key_for();
  EXPECT_FALSE(find(*cache, key)) << "no record yet";
  const TuningRecord record = record_for(key);
  auto stored = store_tuning(*cache, record);
  ASSERT_TRUE(stored.ok()) << stored.error().message;
  EXPECT_EQ(*stored, dir / "cache" + "/v1/tuning/" + key.digest() + ".json");
  struct stat st{};
  ASSERT_EQ(::stat(stored->c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u) << "private, like every cache file";
  EXPECT_EQ(files_under(dir / "cache" + "/v1/tmp"), 0u) << "the temporary file was renamed into place";

  Warnings warnings;
  auto found = find(*cache, key);
  ASSERT_TRUE(found);
  EXPECT_EQ(found->path, *stored);
  EXPECT_EQ(found->record.winner, record.winner);
  EXPECT_EQ(found->record.reps, 20);
  EXPECT_EQ(found->record.created_utc, record.created_utc);
  ASSERT_EQ(found->record.candidates.size(), record.candidates.size());
  for (size_t i = 0; i < record.candidates.size(); ++i) {
    EXPECT_EQ(found->record.candidates[i].config, record.candidates[i].config);
    EXPECT_DOUBLE_EQ(found->record.candidates[i].median_ms, record.candidates[i].median_ms);
    EXPECT_DOUBLE_EQ(found->record.candidates[i].min_ms, record.candidates[i].min_ms);
    EXPECT_DOUBLE_EQ(found->record.candidates[i].max_ms, record.candidates[i].max_ms);
    EXPECT_EQ(found->record.candidates[i].error, record.candidates[i].error);
  }
  EXPECT_EQ(warnings.count(), 0u) << warnings.text();

  // Storing again replaces the record atomically.
  TuningRecord again = record;
  again.winner = again.candidates[0].config;
  ASSERT_TRUE(store_tuning(*cache, again).ok());
  EXPECT_EQ(find(*cache, key)->record.winner, again.winner);
  EXPECT_EQ(files_under(dir / "cache" + "/v1/tuning"), 1u);
}

TEST(Tuning, KeyDependsOnDeviceCompilerAndSpec) {
  const std::string base = key_for().digest();
  EXPECT_EQ(base, key_for().digest()) << "the key is stable";
  EXPECT_NE(base, key_for("NVIDIA H100 80GB HBM3").digest());
  EXPECT_NE(base, key_for("NVIDIA H200", "clang").digest());
  EXPECT_NE(base, key_for("NVIDIA H200", "nvrtc", gemm_spec(1024, 1024, 2048, false, true)).digest());
  EXPECT_NE(base, key_for("NVIDIA H200", "nvrtc", gemm_spec(1024, 1024, 1024, false, false)).digest());
  EXPECT_NE(base,
            key_for("NVIDIA H200", "nvrtc", gemm_spec(1024, 1024, 1024, false, true, DType::bf16, DType::f32)).digest());
  TuningKey k = key_for();
  k.template_sha256 = std::string(64, '0');
  EXPECT_NE(base, k.digest()) << "an edited kernel template makes old records miss";
  k = key_for();
  k.format_version += 1;
  EXPECT_NE(base, k.digest());
  // Nothing host-specific in it.
  const std::string text = key_for().to_json().dump();
  EXPECT_EQ(text.find("/tmp"), std::string::npos);
  EXPECT_EQ(text.find(KILN_SOURCE_DIR), std::string::npos);

  // A record made on one device or with one compiler is not found for another.
  TempDir dir;
  auto cache = open_cache(dir / "cache");
  ASSERT_TRUE(store_tuning(*cache, record_for(key_for())).ok());
  EXPECT_TRUE(find(*cache, key_for()));
  EXPECT_FALSE(find(*cache, key_for("NVIDIA H100 80GB HBM3")));
  EXPECT_FALSE(find(*cache, key_for("NVIDIA H200", "clang")));
}

// Each bad record: skipped with exactly one warning, moved to v1/corrupt/, nothing thrown.
class BadRecord : public ::testing::TestWithParam<const char*> {};

TEST_P(BadRecord, IsIgnoredWithOneWarning) {
  const std::string kind = GetParam();
  TempDir dir;
  auto cache = open_cache(dir / "cache");
  const TuningKey key = key_for();
  auto stored = store_tuning(*cache, record_for(key));
  ASSERT_TRUE(stored.ok());
  std::ifstream in(*stored);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  auto rewrite = [&](const std::string& t) { std::ofstream(*stored, std::ios::trunc) << t; };
  auto replace = [&](const std::string& from, const std::string& to) {
    const size_t pos = text.find(from);
    ASSERT_NE(pos, std::string::npos) << from;
    rewrite(text.replace(pos, from.size(), to));
  };
  if (kind == "garbage") rewrite("\x7f" "ELF not json");
  else if (kind == "truncated") rewrite(text.substr(0, text.size() / 2));
  else if (kind == "empty") rewrite("");
  else if (kind == "huge_number") replace("\"BM\": 128", "\"BM\": 1e300");
  else if (kind == "wrong_type") replace("\"reps\": 20", "\"reps\": \"twenty\"");
  else if (kind == "other_key") replace("\"NVIDIA H200\"", "\"NVIDIA H100\"");
  else if (kind == "untimed_winner") {
    TuningRecord r = record_for(key);
    r.winner = r.candidates[2].config;  // the one that failed
    rewrite(tuning_record_json(r).dump());
  } else if (kind == "world_writable") ::chmod(stored->c_str(), 0666);

  Warnings warnings;
  EXPECT_FALSE(find(*cache, key));
  EXPECT_EQ(warnings.count(), 1u) << warnings.text();
  EXPECT_FALSE(fs::exists(*stored)) << "moved aside";
  EXPECT_EQ(files_under(dir / "cache" + "/v1/corrupt"), 1u);
  EXPECT_EQ(cache->corrupt_entries(), 1u);
  EXPECT_FALSE(find(*cache, key)) << "a miss from now on";
  EXPECT_EQ(warnings.count(), 1u) << "warned once";
}

INSTANTIATE_TEST_SUITE_P(Kinds, BadRecord,
                         ::testing::Values("garbage", "truncated", "empty", "huge_number", "wrong_type", "other_key",
                                           "untimed_winner", "world_writable"),
                         [](const auto& info) { return std::string(info.param); });

TEST(Tuning, StaleWinnerIsIgnoredWithOneWarning) {
  TempDir dir;
  auto cache = open_cache(dir / "cache");
  const TuningKey key = key_for();
  TuningRecord r = record_for(key);
  // A winner the op no longer offers (its candidate list changed since the record was made).
  r.winner = r.candidates[0].config;
  r.winner["BN"] = 192;
  r.candidates[0].config = r.winner;
  ASSERT_TRUE(store_tuning(*cache, r).ok());
  Warnings warnings;
  EXPECT_FALSE(find(*cache, key));
  EXPECT_EQ(warnings.count(), 1u) << warnings.text();
  EXPECT_NE(warnings.text().find("no longer a candidate"), std::string::npos) << warnings.text();
  EXPECT_TRUE(fs::exists(cache->tuning_path(key.digest()))) << "kept for Runtime::tune to replace";
}

TEST(Tuning, ReadOnlyLayersAreSearchedAfterTheWritableCache) {
  TempDir dir;
  const TuningKey key = key_for();
  {
    auto shipped = open_cache(dir / "shipped");
    ASSERT_TRUE(store_tuning(*shipped, record_for(key)).ok());
  }
  auto layer = open_cache(dir / "shipped", /*read_only=*/true);
  auto mine = open_cache(dir / "mine");
  DiskCache* caches[] = {mine.get(), layer.get()};
  auto found = find_tuning(caches, key, candidates());
  ASSERT_TRUE(found);
  EXPECT_EQ(found->path, layer->tuning_path(key.digest()));
  EXPECT_FALSE(layer->write_tuning(key.digest(), "{}").ok()) << "a layer is never written";

  // The writable cache's own record comes first.
  TuningRecord own = record_for(key);
  own.winner = own.candidates[0].config;
  ASSERT_TRUE(store_tuning(*mine, own).ok());
  found = find_tuning(caches, key, candidates());
  ASSERT_TRUE(found);
  EXPECT_EQ(found->record.winner, own.winner);
  EXPECT_EQ(found->path, mine->tuning_path(key.digest()));
}

TEST(Tuning, InspectFindsRecordsOfEveryDevice) {
  TempDir dir;
  auto cache = open_cache(dir / "cache");
  for (const char* device : {"NVIDIA H100 80GB HBM3", "NVIDIA H200"})
    ASSERT_TRUE(store_tuning(*cache, record_for(key_for(device))).ok());
  ASSERT_TRUE(store_tuning(*cache, record_for(key_for("NVIDIA H200", "clang"))).ok());
  const auto found = tunings_of(*cache, tuning_subject(gemm(), gemm_spec(1024, 1024, 1024, false, true), target("sm_90a")),
                                target("sm_90a"), "nvrtc");
  ASSERT_EQ(found.size(), 2u);
  std::set<std::string> devices;
  for (const FoundTuning& f : found) devices.insert(f.record.key.device);
  EXPECT_EQ(devices, (std::set<std::string>{"NVIDIA H100 80GB HBM3", "NVIDIA H200"}));
  EXPECT_TRUE(tunings_of(*cache, tuning_subject(gemm(), gemm_spec(64, 64, 64, false, true), target("sm_90a")),
                         target("sm_90a"), "nvrtc").empty());
}

TEST(Tuning, TimestampsAreUtc) {
  EXPECT_TRUE(std::regex_match(utc_now(), std::regex(R"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ)"))) << utc_now();
}

}  // namespace
}  // namespace kiln
