// RuntimeImpl, the Runtime, declared here so that its concerns live in files of their own, each
// defining its part of the class:
//   runtime.cpp   the memo (compiled and loaded kernels in memory: compile(), kernel(), launch()),
//                 the compile path through the disk, layer and remote caches, and Runtime::create
//   tuner.cpp     tune() and its helpers: the tuning-record lookup and the timing of candidates
//   recorder.cpp  record(): every spec compiled, appended to KILN_RECORD for `kiln prewarm`
// CompiledKernelImpl and KernelImpl are runtime.cpp's own; the other files see them incomplete.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "cache/disk_cache.h"
#include "cache/remote_cache.h"
#include "kiln/runtime.h"
#include "runtime/device_impl.h"
#include "support/fs.h"
#include "templates/op_template.h"

namespace kiln::detail {

class CompiledKernelImpl;
class KernelImpl;

class RuntimeImpl final : public Runtime {
 public:
  friend class Runtime;  // create() sets remote_
  RuntimeImpl(const RuntimeOptions& options, std::unique_ptr<DeviceImpl> device, std::unique_ptr<DiskCache> disk,
              std::vector<std::unique_ptr<DiskCache>> layers, UniqueFd record_fd);
  ~RuntimeImpl() override;

  Device* device() override { return device_.get(); }
  std::string cache_dir() const override { return disk_ ? disk_->root() : std::string(); }

  Result<std::shared_ptr<const CompiledKernel>> compile(const KernelSpec& spec, std::string_view target_name) override;

  Result<std::shared_ptr<const Kernel>> kernel(const KernelSpec& spec) override;

  Result<void> launch(const KernelSpec& spec, std::span<void* const> buffers,
                      const std::map<std::string, float>& scalars, Stream stream) override;

  // Defined in tuner.cpp.
  Result<TuneReport> tune(const KernelSpec& spec, const TuneOptions& options) override;

  CacheStats stats() const override;

 private:
  // The in-memory key: the baked spec, the target and the compiler. Computing it costs an op
  // lookup and a short string; no codegen, no SHA-256.
  Result<std::string> memo_key(const KernelSpec& spec, const TargetInfo& target) const;

  std::string compiler_name(const TargetInfo& target) const {
    return target.vendor == Vendor::nvidia ? nvidia_compiler_ : "clang";
  }

  // The tuner (tuner.cpp). The writable cache, then the read-only layers: where tuning records are
  // looked up.
  std::vector<DiskCache*> tuning_caches() const;
  // The winner of the spec's tuning record on this device, or nullopt: none, or a spec with one
  // candidate (every kernel but sm_90a's TMA gemm), which is not looked up at all.
  std::optional<TileConfig> tuned_config(const KernelSpec& spec);
  static size_t winner_index(const std::vector<TuneCandidate>& candidates, const TileConfig& winner);
  // Compiles, loads and times one tuning candidate: one launch to warm up (and to surface launch
  // errors), then `reps` launches, each timed with device events; fills in c's times.
  Result<std::shared_ptr<KernelImpl>> time_candidate(const KernelSpec& spec, const TileConfig& config,
                                                     std::span<void* const> buffers, int reps, TuneCandidate& c);

  // Loads `compiled` (one of the spec's variants or tuning candidates) as the preferred variant
  // of a Kernel; the op's other variants are compiled and loaded when a call needs them.
  Result<std::shared_ptr<KernelImpl>> load(const std::shared_ptr<CompiledKernelImpl>& compiled);

  // Makes `k` the kernel that kernel() returns for its spec from now on.
  void install(const std::string& memo, std::shared_ptr<KernelImpl> k);

  // A KernelImpl as the Kernel it is, for the files that see KernelImpl incomplete.
  static const Kernel& as_kernel(const KernelImpl& k);

  // The heuristic's kernel (config == nullptr), or the given tuning candidate's: memoized apart,
  // so that compile() keeps returning the heuristic's while kernel() serves a tuned one.
  // `record_spec`: append the spec to KILN_RECORD when built (tuning candidates are recorded once,
  // by tune()).
  Result<std::shared_ptr<CompiledKernelImpl>> get_compiled(const KernelSpec& spec, const TargetInfo& target,
                                                           const TileConfig* config = nullptr,
                                                           bool record_spec = true);

  Result<std::shared_ptr<CompiledKernelImpl>> build(const KernelSpec& spec, const TargetInfo& target,
                                                    const TileConfig* config);

  std::shared_ptr<CompiledKernelImpl> from_disk(CacheEntry entry, const Compiler& compiler, const KernelSource& src);

  struct Counters {
    std::atomic<uint64_t> memory_hits{0}, disk_hits{0}, compiles{0}, compile_us{0}, lock_waits{0}, disk_errors{0},
        layer_hits{0}, tunings{0}, tuning_hits{0};
  };

  // The recorder (recorder.cpp). Appends the spec as one manifest line (JSON lines, for
  // `kiln prewarm`); O_APPEND keeps lines from several processes whole.
  void record(const KernelSpec& spec);
  std::atomic<bool> record_failed_{false};

  std::unique_ptr<DeviceImpl> device_;
  std::unique_ptr<DiskCache> disk_;
  std::vector<std::unique_ptr<DiskCache>> layers_;
  std::unique_ptr<RemoteCache> remote_;  // KILN_REMOTE_CACHE; set by create()
  std::atomic<bool> writes_enabled_{true};
  uint64_t max_bytes_ = 0;
  bool use_tuning_ = true;
  int record_fd_ = -1;
  std::string nvidia_compiler_;
  mutable std::shared_mutex mu_;
  std::mutex load_mu_;
  std::unordered_map<std::string, std::shared_ptr<CompiledKernelImpl>> compiled_;
  std::unordered_map<std::string, std::shared_ptr<std::mutex>> inflight_;
  std::unordered_map<std::string, std::shared_ptr<KernelImpl>> kernels_;
  mutable Counters stats_;
};

}  // namespace kiln::detail
