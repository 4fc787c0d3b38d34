#include "cache/tuning.h"

#include <fmt/chrono.h>
#include <fmt/format.h>

#include <algorithm>
#include <ctime>
#include <filesystem>

#include "codegen/codegen.h"
#include "support/fs.h"
#include "support/json_read.h"
#include "support/log.h"
#include "support/sha256.h"
#include "support/spec_json.h"

namespace kiln {
namespace {

nlohmann::json config_json(const KernelConfig& c) { return nlohmann::json(c); }

KernelConfig config_from_json(const nlohmann::json& j) {
  if (!j.is_object() || j.empty()) throw std::invalid_argument("a tile configuration is not a non-empty object");
  KernelConfig c;
  for (const auto& [k, v] : j.items()) c[k] = json_int64(v, k);
  return c;
}

}  // namespace

TuningKey TuningKey::make(const TuningSubject& subject, const TargetInfo& target, std::string device,
                          std::string compiler) {
  TuningKey k;
  k.spec = subject.spec;
  k.target = std::string(target.name);
  k.device = std::move(device);
  k.compiler = std::move(compiler);
  k.template_sha256 = subject.template_sha256;
  return k;
}

nlohmann::json TuningKey::to_json() const {
  nlohmann::json j = spec_to_json(spec);
  j.update(nlohmann::json{{"target", target},
                          {"device", device},
                          {"compiler", compiler},
                          {"template_sha256", template_sha256},
                          {"format_version", format_version}});
  return j;
}

std::string TuningKey::digest() const { return sha256_hex(to_json().dump()); }

nlohmann::json tuning_record_json(const TuningRecord& r) {
  nlohmann::json candidates = nlohmann::json::array();
  for (const TuneCandidate& c : r.candidates) {
    nlohmann::json j = {{"config", config_json(c.config)}};
    if (c.error.empty()) {
      j["median_ms"] = c.median_ms;
      j["min_ms"] = c.min_ms;
      j["max_ms"] = c.max_ms;
    } else {
      j["error"] = c.error;
    }
    candidates.push_back(std::move(j));
  }
  return {{"format_version", kTuningFormatVersion},
          {"key", r.key.digest()},
          {"key_fields", r.key.to_json()},
          {"winner", config_json(r.winner)},
          {"candidates", candidates},
          {"reps", r.reps},
          {"created_utc", r.created_utc}};
}

Result<TuningRecord> parse_tuning_record(std::string_view text, const TuningKey& key) {
  auto parsed = parse_json(text, "the tuning record");
  if (!parsed || !parsed->is_object()) return make_error(Errc::corrupt, "the record is not valid JSON");
  const nlohmann::json& j = *parsed;
  // nlohmann's typed accessors throw on a wrong type or a missing field: each is a bad record.
  try {
    if (json_int(j, "format_version") != kTuningFormatVersion)
      return make_error(Errc::corrupt, "the record has another format version");
    if (j.at("key").get<std::string>() != key.digest() || j.at("key_fields") != key.to_json())
      return make_error(Errc::corrupt, "the record is another key's");
    TuningRecord r;
    r.key = key;
    r.winner = config_from_json(j.at("winner"));
    r.reps = json_int(j, "reps");
    if (r.reps < 1) return make_error(Errc::corrupt, "the record's 'reps' is not positive");
    r.created_utc = j.at("created_utc").get<std::string>();
    bool winner_timed = false;
    for (const nlohmann::json& c : j.at("candidates")) {
      TuneCandidate t;
      t.config = config_from_json(c.at("config"));
      if (c.contains("error")) {
        t.error = c.at("error").get<std::string>();
      } else {
        t.median_ms = json_number(c, "median_ms");
        t.min_ms = json_number(c, "min_ms");
        t.max_ms = json_number(c, "max_ms");
        winner_timed |= t.config == r.winner;
      }
      r.candidates.push_back(std::move(t));
    }
    if (!winner_timed) return make_error(Errc::corrupt, "the record's winner is not among its timed candidates");
    return r;
  } catch (const std::exception& ex) {  // nlohmann's type errors and the typed reads
    return make_error(Errc::corrupt, fmt::format("the record is malformed: {}", ex.what()));
  }
}

std::optional<FoundTuning> find_tuning(std::span<DiskCache* const> caches, const TuningKey& key,
                                       std::span<const KernelConfig> candidates) {
  const std::string digest = key.digest();
  for (DiskCache* cache : caches) {
    auto text = cache->read_tuning(digest);
    if (text && !*text) continue;  // no record here
    const std::string path = cache->tuning_path(digest);
    if (!text) {
      if (text.error().code == Errc::corrupt) cache->quarantine_tuning(digest, text.error().message);
      else KILN_LOG_WARN("ignoring tuning record {}: {}", path, text.error().message);
      continue;
    }
    auto record = parse_tuning_record(**text, key);
    if (!record) {
      cache->quarantine_tuning(digest, record.error().message);
      continue;
    }
    if (std::find(candidates.begin(), candidates.end(), record->winner) == candidates.end()) {
      KILN_LOG_WARN("ignoring tuning record {}: its winner '{}' is no longer a candidate of {} (Runtime::tune or "
                    "'kiln prewarm --tune' replaces it)",
                    path, config_string(record->winner), key.spec.op);
      continue;
    }
    return FoundTuning{std::move(record).value(), path};
  }
  return std::nullopt;
}

std::vector<FoundTuning> tunings_of(const DiskCache& cache, const TuningSubject& subject, const TargetInfo& target,
                                    const std::string& compiler) {
  std::vector<FoundTuning> out;
  const std::vector<KernelConfig>& candidates = subject.candidates;
  auto names = list_dir(cache.root() + "/v1/tuning");
  if (!names) return out;
  for (const DirEntryName& f : *names) {
    if (f.name.size() <= 5 || f.name.compare(f.name.size() - 5, 5, ".json") != 0) continue;
    const std::string digest = f.name.substr(0, f.name.size() - 5);
    const std::string file_path = cache.root() + "/v1/tuning/" + f.name;
    auto text = cache.read_tuning(digest);
    if (!text || !*text) continue;
    // The device is the one key field the caller cannot know: take the record's, then check it all.
    auto parsed = parse_json(**text, file_path);
    if (!parsed) continue;
    const nlohmann::json& j = *parsed;
    if (!j.is_object() || !j.contains("key_fields") || !j["key_fields"].is_object()) continue;
    const nlohmann::json& device = j["key_fields"].value("device", nlohmann::json());
    if (!device.is_string()) continue;
    const TuningKey key = TuningKey::make(subject, target, device.get<std::string>(), compiler);
    if (key.digest() != digest) continue;
    auto record = parse_tuning_record(**text, key);
    if (!record || std::find(candidates.begin(), candidates.end(), record->winner) == candidates.end()) continue;
    out.push_back({std::move(record).value(), file_path});
  }
  std::sort(out.begin(), out.end(), [](const FoundTuning& a, const FoundTuning& b) { return a.path < b.path; });
  return out;
}

Result<std::string> store_tuning(DiskCache& cache, const TuningRecord& record) {
  return cache.write_tuning(record.key.digest(), tuning_record_json(record).dump(1) + "\n");
}

std::string utc_now() { return fmt::format("{:%Y-%m-%dT%H:%M:%SZ}", fmt::gmtime(std::time(nullptr))); }

}  // namespace kiln
