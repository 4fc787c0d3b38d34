// The tuner: Runtime::tune, the tuning-record lookup of kernel() (tuned_config) and the timing of
// candidates. Part of RuntimeImpl (runtime/runtime_impl.h).
#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <random>
#include <vector>

#include "cache/tuning.h"
#include "runtime/device_tensors.h"
#include "runtime/flushed_timing.h"
#include "runtime/runtime_impl.h"
#include "support/env.h"
#include "support/log.h"
#include "templates/registry.h"

namespace kiln::detail {

Result<TuneReport> RuntimeImpl::tune(const KernelSpec& spec, const TuneOptions& options) {
  if (!device_)
    return make_error(Errc::driver_unavailable,
                      "no GPU: tuning times kernels on a device, and this runtime is compile-only (no driver or "
                      "no device was found)");
  if (options.reps < 1)
    return make_error(Errc::invalid_argument, fmt::format("tune: reps = {}; time at least 1 launch", options.reps));
  if (!(options.settle_ms >= 0))
    return make_error(Errc::invalid_argument,
                      fmt::format("tune: settle_ms = {}; give 0 (no settling launches) or more", options.settle_ms));
  KILN_ASSIGN_OR_RETURN(const OpTemplate* op, find_op(spec.op));
  const TargetInfo& target = device_->target();
  KILN_TRY(op->validate(spec, target));
  MemoKey memo;
  KILN_TRY(MemoKey::of(spec, target, memo));
  const TuningSubject subject = tuning_subject(*op, spec, target);
  const std::vector<KernelConfig>& candidates = subject.candidates;
  TuneReport report;
  report.spec = to_string(subject.spec);
  report.device = device_->name();
  report.target = std::string(target.name);
  report.compiler = compiler_name(target);
  if (candidates.size() == 1) {  // nothing to choose
    report.candidates.emplace_back().config = candidates.front();
    return report;
  }
  const TuningKey key = TuningKey::make(subject, target, report.device, report.compiler);

  // Every candidate on the same inputs: compile (through the caches), load, warm up, time. Run by
  // the cache's tiers when no record is found (or `force`), under the key's cross-process lock.
  std::vector<std::shared_ptr<KernelImpl>> loaded(candidates.size());
  size_t best = 0;
  auto time_all = [&]() -> Result<TuningRecord> {
    std::mt19937_64 rng(std::random_device{}());
    KILN_ASSIGN_OR_RETURN(DeviceTensors tensors, DeviceTensors::make(*device_, *op, spec, rng));
    report.reps = options.reps;
    report.created_utc = utc_now();
    std::optional<Error> first_error;
    CacheFlush flush(*device_, "tuning " + report.spec);  // one buffer for every candidate
    for (size_t i = 0; i < candidates.size(); ++i) {
      TuneCandidate& c = report.candidates.emplace_back();
      c.config = candidates[i];
      auto timed = time_candidate(spec, candidates[i], tensors.pointers(), options.reps, options.settle_ms, flush, c);
      if (!timed) {
        c.error = timed.error().message;
        KILN_LOG_WARN("tuning {}: candidate {} failed: {}", report.spec, config_string(c.config), c.error);
        if (!first_error) first_error = timed.take_error();
        continue;
      }
      loaded[i] = std::move(timed).value();
    }
    std::optional<size_t> winner;
    for (size_t i = 0; i < candidates.size(); ++i)
      if (loaded[i] && (!winner || report.candidates[i].median_ms < report.candidates[*winner].median_ms)) winner = i;
    if (!winner) {
      first_error->message = fmt::format("tuning {}: every candidate failed; the first: {}", report.spec, first_error->message);
      return *first_error;
    }
    best = *winner;
    return TuningRecord{key, candidates[best], report.candidates, options.reps, report.created_utc};
  };
  KILN_ASSIGN_OR_RETURN(Tiered<FoundTuning> tuned, tiers_->tuning(key, candidates, options.force, time_all));
  FoundTuning& found = tuned.value;
  if (tuned.from != Tier::made) {  // another run's record
    ++stats_.tuning_hits;
    KILN_ASSIGN_OR_RETURN(auto compiled, get_compiled(spec, target, &found.record.winner));
    KILN_ASSIGN_OR_RETURN(auto k, load(compiled));
    install(memo, std::move(k));
    report.candidates = std::move(found.record.candidates);
    report.winner = winner_index(report.candidates, found.record.winner);
    report.reps = found.record.reps;
    report.created_utc = std::move(found.record.created_utc);
    report.from_record = true;
    report.record = std::move(found.path);
    return report;
  }
  report.winner = best;
  ++stats_.tunings;
  install(memo, loaded[best]);
  record(spec);  // once, not once per candidate
  report.record = std::move(found.path);  // empty when the record could not be stored
  return report;
}

std::optional<KernelConfig> RuntimeImpl::tuned_config(const KernelSpec& spec) {
  auto op = find_op(spec.op);
  const TargetInfo& target = device_->target();
  if (!op || !(*op)->validate(spec, target)) return std::nullopt;  // get_compiled reports it
  // Most specs have one candidate: no template hash, no lookup. The candidates are computed once.
  KernelSpec baked = (*op)->baked_spec(spec);
  std::vector<KernelConfig> candidates = (*op)->tuning_candidates(baked, target);
  if (candidates.size() < 2) return std::nullopt;
  const TuningSubject subject = tuning_subject(**op, std::move(baked), target, std::move(candidates));
  const TuningKey key = TuningKey::make(subject, target, device_->name(), compiler_name(target));
  auto found = tiers_->find_tuning(key, subject.candidates);
  if (!found) return std::nullopt;
  ++stats_.tuning_hits;
  KILN_LOG_DEBUG("{}: tuned configuration {} from {}", to_string(spec), config_string(found->record.winner), found->path);
  return std::move(found->record.winner);
}

size_t RuntimeImpl::winner_index(const std::vector<TuneCandidate>& candidates, const KernelConfig& winner) {
  auto it = std::find_if(candidates.begin(), candidates.end(), [&](const TuneCandidate& c) { return c.config == winner; });
  return static_cast<size_t>(it - candidates.begin());
}

Result<std::shared_ptr<KernelImpl>> RuntimeImpl::time_candidate(const KernelSpec& spec, const KernelConfig& config,
                                                                std::span<void* const> buffers, int reps,
                                                                double settle_ms, CacheFlush& flush,
                                                                TuneCandidate& c) {
  KILN_ASSIGN_OR_RETURN(auto compiled, get_compiled(spec, device_->target(), &config, /*record_spec=*/false));
  KILN_ASSIGN_OR_RETURN(auto k, load(compiled));
  const Kernel& kernel = as_kernel(*k);
  // A warm-up launch, then the clock of sustained load, then each timed launch from cold caches
  // (runtime/flushed_timing.h says why).
  KILN_ASSIGN_OR_RETURN(FlushedTimes t, time_flushed_launches(*device_, flush, reps, settle_ms, [&] {
    return kernel.launch(spec, buffers, {}, nullptr);
  }, "tuning " + to_string(spec)));
  c.median_ms = t.median_ms;
  c.min_ms = t.min_ms;
  c.max_ms = t.max_ms;
  return k;
}

}  // namespace kiln::detail
