// RuntimeImpl, the Runtime, declared here so that its concerns live in files of their own, each
// defining its part of the class:
//   runtime.cpp   the memo (compiled and loaded kernels in memory: compile(), kernel(), launch()),
//                 the compile that the cache's tiers (cache/tiers.h) call on a miss, and
//                 Runtime::create
//   tuner.cpp     tune() and its helpers: the tuning-record lookup and the timing of candidates
//   recorder.cpp  record(): every spec compiled, appended to KILN_RECORD for `kiln prewarm`
// CompiledKernelImpl and KernelImpl are runtime.cpp's own; the other files see them incomplete.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "cache/tiers.h"
#include "kiln/runtime.h"
#include "runtime/device_impl.h"
#include "runtime/flushed_timing.h"
#include "support/fs.h"
#include "templates/op_template.h"
#include "templates/registry.h"

namespace kiln::detail {

class CompiledKernelImpl;
class KernelImpl;

// The key of the memo, the runtime's memory tier: what identifies a compiled kernel (compiled_) or a
// loaded one (kernels_) within a runtime, whose compiler per target is fixed: the op, the target, the
// dtypes, the baked parameters (defaults filled) and, for a configuration asked for by name (a
// variant, a tuning candidate), that configuration. It is built on the stack, so that a memory
// hit (kernel(), Runtime::launch, the typed ops) formats no string and allocates nothing.
struct MemoKey {
  static constexpr uint32_t kMaxBaked = 16;
  const OpTemplate* op = nullptr;
  const TargetInfo* target = nullptr;  // a row of the target table: compared by address
  DType dtype{}, out_dtype{};
  bool extra = false;   // parameters the op does not know: the miss path's validation names them
  uint32_t count = 0;   // baked parameters
  uint32_t absent = 0;  // bit i: baked parameter i has no value and no default
  int64_t baked[kMaxBaked];  // the first `count` are set
  std::string config;        // config_string of the configuration asked for; empty: the heuristic's

  // Calls f(i, present, value) for each baked parameter i of `op` in `spec` (value: the spec's, or
  // the default); stops and returns false when f does.
  template <typename F>
  static bool each_baked(const OpTemplate& op, const KernelSpec& spec, F&& f) {
    uint32_t i = 0;
    for (const ParamInfo& p : op.params()) {
      if (!p.baked) continue;
      auto it = spec.params.find(std::string(p.name));  // names fit the small-string buffer
      const bool given = it != spec.params.end();
      if (!f(i++, given || p.default_value.has_value(), given ? it->second : p.default_value.value_or(0))) return false;
    }
    return true;
  }

  // Whether `spec` has this key (same target, heuristic's configuration), without building one: no
  // op lookup, no writes.
  bool matches(const KernelSpec& spec) const {
    if (!op || spec.dtype != dtype || spec.out_dtype != out_dtype || spec.op != op->name()) return false;
    if ((spec.params.size() > op->params().size()) != extra) return false;
    return each_baked(*op, spec, [&](uint32_t i, bool present, int64_t value) {
      return i < count && present != bool(absent >> i & 1) && (!present || baked[i] == value);
    });
  }

  // Fills `k` in place (a Result<MemoKey> would copy it once more on every launch). `config`: a
  // configuration asked for by name, or nullptr for the heuristic's.
  static Result<void> of(const KernelSpec& spec, const TargetInfo& target, MemoKey& k,
                         const KernelConfig* config = nullptr) {
    KILN_ASSIGN_OR_RETURN(k.op, find_op(spec.op));
    k.target = &target;
    if (config) k.config = config_string(*config);
    else k.config.clear();
    k.dtype = spec.dtype;
    k.out_dtype = spec.out_dtype;
    k.count = 0;
    k.absent = 0;
    const bool fits = each_baked(*k.op, spec, [&](uint32_t i, bool present, int64_t value) {
      if (i == kMaxBaked) return false;
      k.baked[i] = value;
      if (!present) k.absent |= uint32_t{1} << i;
      k.count = i + 1;
      return true;
    });
    if (!fits)
      return make_error(Errc::unsupported, fmt::format("{} declares more than {} baked parameters; raise "
                                                       "MemoKey::kMaxBaked in runtime/runtime_impl.h",
                                                       k.op->name(), kMaxBaked));
    k.extra = spec.params.size() > k.op->params().size();
    return ok();
  }
  bool operator==(const MemoKey& o) const {
    return op == o.op && target == o.target && dtype == o.dtype && out_dtype == o.out_dtype && extra == o.extra &&
           count == o.count && absent == o.absent && std::equal(baked, baked + count, o.baked) && config == o.config;
  }
};
struct MemoKeyHash {
  size_t operator()(const MemoKey& k) const {
    // FNV-1a over the fields.
    uint64_t h = 1469598103934665603ull;
    auto mix = [&h](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
    mix(reinterpret_cast<uintptr_t>(k.op));
    mix(reinterpret_cast<uintptr_t>(k.target));
    mix(static_cast<uint64_t>(k.dtype) << 8 | static_cast<uint64_t>(k.out_dtype) << 1 | k.extra);
    mix(k.absent);
    for (uint32_t i = 0; i < k.count; ++i) mix(static_cast<uint64_t>(k.baked[i]));
    if (!k.config.empty()) mix(std::hash<std::string>{}(k.config));
    return static_cast<size_t>(h);
  }
};

class RuntimeImpl final : public Runtime {
 public:
  RuntimeImpl(const RuntimeOptions& options, std::unique_ptr<DeviceImpl> device, std::unique_ptr<CacheTiers> tiers,
              UniqueFd record_fd);
  ~RuntimeImpl() override;

  Device* device() override { return device_.get(); }
  std::string cache_dir() const override { return tiers_->disk() ? tiers_->disk()->root() : std::string(); }

  Result<std::shared_ptr<const CompiledKernel>> compile(const KernelSpec& spec, std::string_view target_name) override;
  Result<std::shared_ptr<const CompiledKernel>> compile(const KernelSpec& spec, std::string_view target_name,
                                                        const KernelConfig& config) override;

  Result<std::shared_ptr<const Kernel>> kernel(const KernelSpec& spec) override;

  // The one-call form. A thread that launches the kernel it launched last (the common loop) skips
  // the lock, the hash lookup and the reference count: its last hit is kept per thread, valid
  // while this runtime and its generation (bumped when tune() replaces a kernel) are unchanged.
  // Kernels are never freed before the runtime, so a raw pointer is safe.
  Result<void> launch(const KernelSpec& spec, std::span<void* const> buffers,
                      const std::map<std::string, float>& scalars, Stream stream) override;

  // Defined in tuner.cpp.
  Result<TuneReport> tune(const KernelSpec& spec, const TuneOptions& options) override;

  CacheStats stats() const override;

 private:
  std::string compiler_name(const TargetInfo& target) const {
    return target.vendor == Vendor::nvidia ? nvidia_compiler_ : "clang";
  }

  // The tuner (tuner.cpp). The winner of the spec's tuning record on this device, or nullopt: none, or a spec with one
  // candidate (every kernel but sm_90a's TMA gemm), which is not looked up at all.
  std::optional<KernelConfig> tuned_config(const KernelSpec& spec);
  static size_t winner_index(const std::vector<TuneCandidate>& candidates, const KernelConfig& winner);
  // Compiles, loads and times one tuning candidate (time_flushed_launches, with the tuning's one
  // flush buffer: a warm-up, which also surfaces launch errors, back-to-back launches for about
  // settle_ms, then `reps` launches each alone from cold caches); fills in c's times.
  Result<std::shared_ptr<KernelImpl>> time_candidate(const KernelSpec& spec, const KernelConfig& config,
                                                     std::span<void* const> buffers, int reps, double settle_ms,
                                                     CacheFlush& flush, TuneCandidate& c);

  // Loads `compiled` (one of the spec's variants or tuning candidates) as the preferred variant
  // of a Kernel; the op's other variants are compiled and loaded when a call needs them.
  Result<std::shared_ptr<KernelImpl>> load(const std::shared_ptr<CompiledKernelImpl>& compiled);

  // Makes `k` the kernel that kernel() returns for its spec from now on.
  void install(const MemoKey& memo, std::shared_ptr<KernelImpl> k);

  // A KernelImpl as the Kernel it is, for the files that see KernelImpl incomplete.
  static const Kernel& as_kernel(const KernelImpl& k);

  // The heuristic's kernel (config == nullptr), or the given tuning candidate's: memoized apart,
  // so that compile() keeps returning the heuristic's while kernel() serves a tuned one.
  // `record_spec`: append the spec to KILN_RECORD when built (tuning candidates are recorded once,
  // by tune()).
  Result<std::shared_ptr<CompiledKernelImpl>> get_compiled(const KernelSpec& spec, const TargetInfo& target,
                                                           const KernelConfig* config = nullptr,
                                                           bool record_spec = true);

  // Generates the source and finds its code object in the cache's tiers, which call the compiler
  // on a miss.
  Result<std::shared_ptr<CompiledKernelImpl>> build(const KernelSpec& spec, const TargetInfo& target,
                                                    const KernelConfig* config);

  struct Counters {
    std::atomic<uint64_t> memory_hits{0}, disk_hits{0}, compiles{0}, compile_us{0}, layer_hits{0}, tunings{0},
        tuning_hits{0};
  };

  // The recorder (recorder.cpp). Appends the spec as one manifest line (JSON lines, for
  // `kiln prewarm`); O_APPEND keeps lines from several processes whole.
  void record(const KernelSpec& spec);
  std::atomic<bool> record_failed_{false};

  std::unique_ptr<DeviceImpl> device_;
  std::unique_ptr<CacheTiers> tiers_;  // never null (without a disk cache it has no tier)
  bool use_tuning_ = true;
  int record_fd_ = -1;
  std::string nvidia_compiler_;
  mutable std::shared_mutex mu_;
  std::mutex load_mu_;
  std::unordered_map<MemoKey, std::shared_ptr<CompiledKernelImpl>, MemoKeyHash> compiled_;
  std::unordered_map<MemoKey, std::shared_ptr<std::mutex>, MemoKeyHash> inflight_;
  std::unordered_map<MemoKey, std::shared_ptr<KernelImpl>, MemoKeyHash> kernels_;
  std::vector<std::shared_ptr<KernelImpl>> retired_;  // replaced by install(); freed with the runtime
  static inline std::atomic<uint64_t> next_id_{1};
  const uint64_t id_ = next_id_.fetch_add(1);         // never reused, unlike the address
  std::atomic<uint64_t> generation_{0};
  mutable Counters stats_;
};

}  // namespace kiln::detail
