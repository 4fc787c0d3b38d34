// Tuning records: the autotuner's winner (Runtime::tune) for one spec on one device, so that no
// later process times the same candidates again.
//
// A record is v1/tuning/<digest>.json in the writable cache (read-only layers are searched after
// it); <digest> is the SHA-256 of the TuningKey's canonical JSON. The record holds the key's
// fields, the winning tile configuration, every candidate's timings (median, min and max ms of
// one launch), the number of timed launches and when they were taken.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cache/disk_cache.h"
#include "codegen/codegen.h"
#include "kiln/tune.h"

namespace kiln {

/// Bump when the key, the record's fields or what they measure change: old records then miss
/// instead of being misread. 2: candidates timed after a cache flush (1: with the caches warm,
/// which ranked some memory-bound candidates wrongly). 3: each candidate timed after settling
/// launches (TuneOptions::settle_ms: at the clock of sustained load, not the boost clock).
inline constexpr int kTuningFormatVersion = 3;

/// What a measured winner depends on. The template hash is that of the heuristic's source (the
/// kernel family of the spec); a change of the device template makes old records miss. Never
/// holds a path, a host name or a time.
struct TuningKey {
  KernelSpec spec;                        ///< Baked parameters only (support/spec_json.h's form).
  std::string target;                     ///< "sm_90a".
  std::string device;                     ///< Device::name(): "NVIDIA H200".
  std::string compiler;                   ///< "nvrtc" / "clang".
  std::string template_sha256;            ///< Of the heuristic's configuration (codegen's template_sha256).
  int format_version = kTuningFormatVersion;

  /// The key of a tuning subject (codegen's tuning_subject: the baked spec and its template hash)
  /// for `target`, `device` and `compiler`.
  static TuningKey make(const TuningSubject& subject, const TargetInfo& target, std::string device,
                        std::string compiler);
  /// Canonical JSON (sorted keys).
  nlohmann::json to_json() const;
  /// SHA-256 of the canonical JSON, hex: the record's file name.
  std::string digest() const;
};

struct TuningRecord {
  TuningKey key;
  KernelConfig winner;
  std::vector<TuneCandidate> candidates;  ///< Every candidate, timed or with its error.
  int reps = 0;                           ///< Timed launches per candidate.
  std::string created_utc;                ///< "2025-06-01T12:00:00Z".
};

/// Serializes a record (the file's contents).
nlohmann::json tuning_record_json(const TuningRecord& record);
/// Parses a record and checks that it is the record of `key`. Errors: Errc::corrupt, naming what
/// is wrong.
Result<TuningRecord> parse_tuning_record(std::string_view text, const TuningKey& key);

struct FoundTuning {
  TuningRecord record;
  std::string path;
};
/// The record of `key` from the first of `caches` that has a usable one. A record that cannot be
/// read, is malformed or is not this key's is skipped with one warning (and moved to v1/corrupt/
/// in a writable cache); one whose winner is not among `candidates` (stale: the op's candidates
/// changed) is skipped with one warning and left for Runtime::tune to replace.
std::optional<FoundTuning> find_tuning(std::span<DiskCache* const> caches, const TuningKey& key,
                                       std::span<const KernelConfig> candidates);
/// Every usable record of `subject` for `target` and `compiler` in `cache`, whatever the device it
/// was timed on (for `kiln inspect`, which has no device); bad records are skipped silently.
std::vector<FoundTuning> tunings_of(const DiskCache& cache, const TuningSubject& subject, const TargetInfo& target,
                                    const std::string& compiler);
/// Writes the record into `cache` atomically; returns its path.
Result<std::string> store_tuning(DiskCache& cache, const TuningRecord& record);

/// The current time, UTC, as "YYYY-MM-DDTHH:MM:SSZ".
std::string utc_now();

}  // namespace kiln
