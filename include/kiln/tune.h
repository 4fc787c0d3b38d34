// The autotuner's types: what Runtime::tune takes (TuneOptions) and reports (TuneReport, one
// TuneCandidate per tile configuration). Tuning records (cache/tuning.h) store candidates too, so
// these live apart from kiln/runtime.h, which includes this header.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace kiln {

/// Options of Runtime::tune.
struct TuneOptions {
  int reps = 20;       ///< Timed launches per candidate (after one warm-up launch); the median counts.
  bool force = false;  ///< Time again even when a tuning record exists (and replace it).
  /// Device time, milliseconds, of back-to-back launches of each candidate before its timed ones
  /// (at most 1000 launches; 0: none), so that it is timed at the clock the GPU holds under that
  /// kernel's sustained load, as in a training step, not at its boost clock. H200, 2026-11-28:
  /// the attention forward ran at 1980 MHz for a burst of launches and at 1740-1785 MHz (11% slower)
  /// once they ran for about 100 ms; 20 timed launches without this fit inside the burst.
  double settle_ms = 200;
};

/// One tile configuration the autotuner considered.
struct TuneCandidate {
  std::map<std::string, int64_t> config;  ///< Tile configuration ("BN" -> 256, ...), as KernelInfo::config.
  double median_ms = 0;  ///< Median device time of one launch, milliseconds (0: not timed).
  double min_ms = 0;     ///< Fastest launch.
  double max_ms = 0;     ///< Slowest launch.
  std::string error;     ///< Why it was skipped (its compile, load or launch error); empty when timed.
};

/// What Runtime::tune measured, or found in a tuning record.
struct TuneReport {
  std::string spec;        ///< to_string of the baked spec.
  std::string device;      ///< Device::name() ("NVIDIA H200").
  std::string target;      ///< "sm_90a".
  std::string compiler;    ///< "nvrtc" or "clang".
  std::vector<TuneCandidate> candidates;  ///< In the op's order; the heuristic's first.
  size_t winner = 0;       ///< Index of the fastest timed candidate.
  int reps = 0;            ///< Timed launches per candidate.
  bool from_record = false;  ///< Found in a tuning record: nothing was timed now.
  std::string record;      ///< The record read or written; "" when none (memory-only cache, one candidate).
  std::string created_utc; ///< When the candidates were timed ("2025-06-01T12:00:00Z").
};

}  // namespace kiln
