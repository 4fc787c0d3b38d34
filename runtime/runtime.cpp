// Runtime: the pipeline KernelSpec -> KernelSource -> CodeObject -> KernelFunction -> Kernel, with an
// in-memory cache (the memo) in front of the disk cache. The tuner is in tuner.cpp, the recorder
// in recorder.cpp; runtime_impl.h declares the class they share.
#include "kiln/runtime.h"

#include <fmt/format.h>

#include <unistd.h>

#include <algorithm>
#include <functional>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>
#include <utility>

#include "cache/cache_key.h"
#include "cache/tiers.h"
#include "codegen/codegen.h"
#include "compile/compiler.h"
#include "runtime/device_impl.h"
#include "runtime/runtime_impl.h"
#include "support/env.h"
#include "support/fs.h"
#include "support/log.h"
#include "templates/registry.h"

namespace kiln {
namespace detail {

class CompiledKernelImpl final : public CompiledKernel {
 public:
  CompiledKernelImpl(CacheEntry entry, const Compiler& compiler, std::string origin, const KernelSource& src)
      : entry_(std::move(entry)), origin_(std::move(origin)), op_(src.op), config_(src.config), spec_(src.spec) {
    const CodeObjectInfo& i = entry_.compiled.info;
    info_.kernel = entry_.kernel_name;
    info_.target = entry_.target;
    info_.compiler = fmt::format("{} {}", compiler.name(), compiler.version());
    info_.code_format = entry_.compiled.code.format;
    info_.code_bytes = entry_.compiled.code.bytes.size();
    info_.registers = i.registers;
    info_.sgprs = i.sgprs;
    info_.shared_bytes = i.shared_bytes;
    info_.scratch_bytes = i.scratch_bytes;
    info_.spill_stores = i.spill_stores;
    info_.spill_loads = i.spill_loads;
    info_.wave_size = i.wave_size;
    info_.cache_key = entry_.key;
    info_.config = config_string(config_);
    info_.compile_ms = entry_.compiled.compile_ms;
    info_.assembler_report = i.extra;
  }
  const KernelInfo& info() const override { return info_; }
  const std::string& source() const override { return entry_.source; }
  std::span<const uint8_t> code_object() const override { return entry_.compiled.code.bytes; }
  std::string_view origin() const override { return origin_; }

  const CodeObject& code() const { return entry_.compiled.code; }
  const OpTemplate* op() const { return op_; }
  const KernelConfig& config() const { return config_; }
  const KernelSpec& spec() const { return spec_; }
  void set_origin(std::string o) { origin_ = std::move(o); }

 private:
  CacheEntry entry_;
  std::string origin_;
  const OpTemplate* op_;
  KernelConfig config_;
  KernelSpec spec_;
  KernelInfo info_;
};

// One variant of a Kernel, loaded: its code object and a kernel function (KernelFunction: its module and function) per entry point its plans use
// (the preferred entry point at once, any other the first time a plan launches it).
class LoadedVariant {
 public:
  LoadedVariant(std::shared_ptr<const CompiledKernelImpl> compiled, DeviceImpl* device)
      : compiled_(std::move(compiled)), device_(device) {}
  const CompiledKernelImpl& compiled() const { return *compiled_; }
  // Called once per plan and entry point: KernelImpl keeps what it returns (CachedPlans::functions).
  Result<const KernelFunction*> function(std::string_view kernel) const {
    std::lock_guard lock(mu_);
    for (const auto& [name, m] : functions_)
      if (name == kernel) return m.get();
    auto loaded = device_->load(compiled_->code(), std::string(kernel));
    if (!loaded) return loaded.take_error();
    functions_.emplace_back(std::string(kernel), std::move(loaded).value());
    return functions_.back().second.get();
  }

 private:
  std::shared_ptr<const CompiledKernelImpl> compiled_;
  DeviceImpl* device_;
  mutable std::mutex mu_;
  mutable std::vector<std::pair<std::string, std::unique_ptr<KernelFunction>>> functions_;
};

// Compiles and loads variant `index` of a kernel (a fallback, the first time a call needs it).
using VariantLoader = std::function<Result<std::shared_ptr<LoadedVariant>>(size_t index)>;

// The thread's recent tensor-map encodings (TMA kernels), direct-mapped by kernel argument.
struct MapSlot {
  uint64_t kernel = 0;  // the kernel's id: plans' addresses may be reused after it is gone
  const KernelArg* arg = nullptr;
  const void* address = nullptr;
  TensorMapBytes map;
};
constexpr size_t kMapSlots = 8;
thread_local MapSlot map_cache[kMapSlots];

class KernelImpl final : public Kernel {
 public:
  // `variants`: the op's configurations in preference order; `first` is variants[0], loaded.
  KernelImpl(const OpTemplate* op, KernelSpec spec, std::vector<KernelConfig> variants,
             std::shared_ptr<LoadedVariant> first, VariantLoader loader, DeviceImpl* device, int compute_units)
      : op_(op), spec_(std::move(spec)), configs_(std::move(variants)), loaded_(configs_.size()),
        loader_(std::move(loader)), device_(device), compute_units_(compute_units) {
    loaded_[0] = std::move(first);
    const std::vector<TensorInfo> tensors = op_->tensors(spec_);
    tensor_count_ = tensors.size();
    for (size_t i = 0; i < tensors.size(); ++i) {
      tensor_dtypes_.push_back(tensors[i].dtype);
      tensor_names_.push_back(tensors[i].name);
      if (tensors[i].overwrites >= 0) in_place_.emplace_back(i, static_cast<size_t>(tensors[i].overwrites));
    }
    for (const ParamInfo& p : op_->params())
      if (!p.baked) {
        runtime_params_.push_back(&p);
        runtime_names_.emplace_back(p.name);
      }
    for (const ScalarInfo& s : op_->scalars()) {
      scalars_.push_back(&s);
      scalar_names_.emplace_back(s.name);
    }
    // Each variant's base-alignment needs, as masks: a call is checked with an AND per tensor.
    align_masks_.assign(configs_.size() * tensor_count_, 0);
    for (size_t v = 0; v < configs_.size(); ++v) {
      const std::vector<uint32_t> align = op_->base_alignment(spec_, configs_[v]);
      for (size_t i = 0; i < tensor_count_ && i < align.size(); ++i)
        align_masks_[v * tensor_count_ + i] = align[i] > 1 ? align[i] - 1 : 0;
    }
  }
  ~KernelImpl() override {
    if (workspace_) (void)device_->free(workspace_);
  }
  const CompiledKernel& compiled() const override { return loaded_[0]->compiled(); }

  uint64_t workspace_bytes(const KernelSpec& call) const override {
    auto plans = plans_for(call);
    if (!plans) return 0;
    uint64_t most = 0;
    for (const Plan& p : **plans) most = std::max(most, p.workspace_bytes);
    return most;
  }

  Result<void> launch(const KernelSpec& call, std::span<void* const> buffers,
                      const std::map<std::string, float>& scalars, Stream stream) const override {
    if (buffers.size() != tensor_count_ && buffers.size() != tensor_count_ + 1)
      return make_error(Errc::invalid_argument,
                        fmt::format("{} takes {} device buffers ({}), and optionally a workspace, got {}", op_->name(),
                                    tensor_count_, fmt::join(tensor_names_, ", "), buffers.size()));
    KILN_ASSIGN_OR_RETURN(const CachedPlans* plans, plans_for(call));
    // A call of size 0 launches nothing.
    if ((*plans)[0].launches.empty()) return ok();
    const std::span<void* const> tensors = buffers.first(tensor_count_);
    for (const auto& [out, in] : in_place_)  // an output written over an input (TensorDecl::overwrites)
      if (tensors[out] != tensors[in])
        return make_error(Errc::invalid_argument,
                          fmt::format("{}: '{}' is written in place over '{}' ({}): pass the '{}' buffer for both, "
                                      "or use the op's out-of-place form",
                                      op_->name(), tensor_names_[out], tensor_names_[in], to_string(spec_),
                                      tensor_names_[in]));

    // The first variant that serves the call.
    size_t v = 0;
    while (v < configs_.size() && !serves(v, tensors)) ++v;
    if (v == configs_.size()) return no_variant_error(tensors);
    const Plan& plan = (*plans)[v];  // within kMaxLaunches and kMaxArgs: plans_for checked
    const KernelFunction* functions[kMaxLaunches];
    for (size_t i = 0; i < plan.launches.size(); ++i) {
      // Resolved once per plan and variant, then read without a lock.
      std::atomic<const KernelFunction*>& slot = plans->functions[v * kMaxLaunches + i];
      functions[i] = slot.load(std::memory_order_acquire);
      if (!functions[i]) {
        KILN_ASSIGN_OR_RETURN(const LoadedVariant* variant, variant_at(v));
        KILN_ASSIGN_OR_RETURN(functions[i], variant->function(plan.launches[i].kernel));
        slot.store(functions[i], std::memory_order_release);
      }
    }

    void* workspace = nullptr;
    if (plan.workspace_bytes) {
      if (buffers.size() > tensor_count_) {
        workspace = buffers.back();
        // Kernels read and write their workspace in 16-byte vectors (attention_bwd's fp32 dQ
        // accumulator); a misaligned one would fault on the device, not fail here.
        if (reinterpret_cast<uintptr_t>(workspace) % kWorkspaceAlignment != 0)
          return make_error(Errc::invalid_argument,
                            fmt::format("{}: the workspace at {} is not {}-byte aligned (pass the start of an "
                                        "allocation, or a multiple of {} bytes into one)",
                                        op_->name(), workspace, kWorkspaceAlignment, kWorkspaceAlignment));
      } else {
        KILN_ASSIGN_OR_RETURN(workspace, own_workspace(plan.workspace_bytes));
      }
    }

    float scalar_values[kMaxArgs];
    for (size_t i = 0; i < scalars_.size() && i < kMaxArgs; ++i) {
      scalar_values[i] = scalars_[i]->default_value;
      if (!scalars.empty())
        if (auto it = scalars.find(scalar_names_[i]); it != scalars.end()) scalar_values[i] = it->second;
    }
    for (size_t li = 0; li < plan.launches.size(); ++li) {
      const Launch& l = plan.launches[li];
      // Kernel parameters: each value in its own slot, then an array of pointers to the slots.
      void* args[kMaxArgs];
      void* ptrs[kMaxArgs];
      TensorMapBytes maps[kMaxArgs];
      int32_t i32s[kMaxArgs];
      int64_t i64s[kMaxArgs];
      float f32s[kMaxArgs];
      for (size_t a = 0; a < l.args.size(); ++a) {
        const KernelArg& arg = l.args[a];
        switch (arg.kind) {
          case KernelArg::Kind::tensor:
            ptrs[a] = tensors[arg.index];
            args[a] = &ptrs[a];
            break;
          case KernelArg::Kind::tensor_map: {
            // A tensor map depends on the argument (extents, box: fixed by the plan) and the
            // address; the thread's last encoding of this argument is reused for the same address.
            MapSlot& slot = map_cache[(reinterpret_cast<uintptr_t>(&arg) >> 4) % kMapSlots];
            if (slot.kernel != id_ || slot.arg != &arg || slot.address != tensors[arg.index]) {
              if (Result<void> r = functions[li]->encode_tensor_map(arg.map, tensor_dtype(arg.index),
                                                                  tensors[arg.index], slot.map);
                  !r) {
                slot.kernel = 0;
                Error e = r.error();
                e.message = fmt::format("{} (tensor {}): {}", op_->name(), tensor_name(arg.index), e.message);
                return e;
              }
              slot.kernel = id_;
              slot.arg = &arg;
              slot.address = tensors[arg.index];
            }
            maps[a] = slot.map;
            args[a] = &maps[a];
            break;
          }
          case KernelArg::Kind::workspace:
            ptrs[a] = static_cast<char*>(workspace) + arg.value;
            args[a] = &ptrs[a];
            break;
          case KernelArg::Kind::i32:
            i32s[a] = static_cast<int32_t>(arg.value);
            args[a] = &i32s[a];
            break;
          case KernelArg::Kind::i64:
            i64s[a] = arg.value;
            args[a] = &i64s[a];
            break;
          case KernelArg::Kind::scalar:
            f32s[a] = scalar_values[arg.index];
            args[a] = &f32s[a];
            break;
          case KernelArg::Kind::f32:
            f32s[a] = arg.fvalue;
            args[a] = &f32s[a];
            break;
        }
      }
      KILN_TRY(functions[li]->launch(l.geometry, args, stream));
    }
    return ok();
  }

 private:
  static constexpr size_t kMaxArgs = 32, kMaxLaunches = 8, kWorkspaceAlignment = 16;
  // The plans of every variant for one set of runtime sizes: a call with the sizes of the last
  // call reuses them (no planning, no allocation).
  struct CachedPlans : std::vector<Plan> {
    std::vector<int64_t> sizes;
    // The kernel function of launch i of variant v's plan at [v * kMaxLaunches + i], once resolved.
    std::unique_ptr<std::atomic<const KernelFunction*>[]> functions;
  };
  static inline std::atomic<uint64_t> next_id_{1};

  bool serves(size_t v, std::span<void* const> tensors) const {
    const uintptr_t* mask = align_masks_.data() + v * tensor_count_;
    uintptr_t misaligned = 0;
    for (size_t i = 0; i < tensor_count_; ++i) misaligned |= reinterpret_cast<uintptr_t>(tensors[i]) & mask[i];
    return misaligned == 0;
  }
  Error no_variant_error(std::span<void* const> tensors) const {
    // The last variant is the most permissive: name what it needs.
    const size_t v = configs_.size() - 1;
    for (size_t i = 0; i < tensor_count_; ++i)
      if (const uintptr_t mask = align_masks_[v * tensor_count_ + i]; reinterpret_cast<uintptr_t>(tensors[i]) & mask)
        return make_error(Errc::invalid_argument,
                          fmt::format("{}: no kernel variant serves this call: tensor {} at {} is not {}-byte aligned "
                                      "(pass a view that starts a multiple of {} bytes into its allocation)",
                                      op_->name(), tensor_name(i), tensors[i], mask + 1, mask + 1));
    return make_error(Errc::invalid_argument, fmt::format("{}: no kernel variant serves this call", op_->name()));
  }

  Result<const CachedPlans*> plans_for(const KernelSpec& call) const {
    int64_t sizes[kMaxArgs];
    size_t n = 0;
    for (const ParamInfo* p : runtime_params_) {
      // An optional runtime parameter left out of the call takes its default (rope's batch).
      auto it = call.params.find(runtime_names_[n]);
      const bool given = it != call.params.end();
      const int64_t size = given ? it->second : p->default_value.value_or(p->min_value - 1);
      if ((!given && !p->default_value) || size < p->min_value || size > p->max_value)
        return make_error(Errc::invalid_argument, fmt::format("{}: the call needs runtime parameter '{}' in [{}, {}]",
                                                              op_->name(), p->name, p->min_value, p->max_value));
      sizes[n++] = size;
    }
    // The fast path: the plans of the last sizes, read through an atomic pointer (no lock, no
    // reference count). Plans are immutable and live as long as the kernel.
    if (const CachedPlans* last = last_plans_.load(std::memory_order_acquire);
        last && std::equal(last->sizes.begin(), last->sizes.end(), sizes, sizes + n))
      return last;
    std::lock_guard lock(mu_);
    for (const auto& known : all_plans_)
      if (std::equal(known->sizes.begin(), known->sizes.end(), sizes, sizes + n)) {
        last_plans_.store(known.get(), std::memory_order_release);
        return known.get();
      }
    auto fresh = std::make_unique<CachedPlans>();
    fresh->sizes.assign(sizes, sizes + n);
    fresh->functions = std::make_unique<std::atomic<const KernelFunction*>[]>(configs_.size() * kMaxLaunches);
    KernelSpec full = spec_;
    for (size_t i = 0; i < n; ++i) full.params[runtime_names_[i]] = sizes[i];
    for (const KernelConfig& c : configs_) {
      Plan p = op_->plan(full, c);
      if (p.launches.size() > kMaxLaunches)
        return make_error(Errc::invalid_argument, fmt::format("{}: a plan of more than {} launches", op_->name(), kMaxLaunches));
      for (Launch& l : p.launches) {
        if (l.args.size() > kMaxArgs)
          return make_error(Errc::invalid_argument, fmt::format("{}: kernel {} takes more than {} arguments",
                                                                op_->name(), l.kernel, kMaxArgs));
        l.geometry = fit(l.geometry);
      }
      fresh->push_back(std::move(p));
    }
    const CachedPlans* out = fresh.get();
    all_plans_.push_back(std::move(fresh));
    last_plans_.store(out, std::memory_order_release);
    return out;
  }

  Result<const LoadedVariant*> variant_at(size_t v) const {
    if (v == 0) return loaded_[0].get();
    std::lock_guard lock(mu_);
    if (!loaded_[v]) {
      KILN_ASSIGN_OR_RETURN(loaded_[v], loader_(v));
    }
    return loaded_[v].get();
  }

  Result<void*> own_workspace(uint64_t bytes) const {
    std::lock_guard lock(mu_);
    if (workspace_bytes_ < bytes) {
      if (workspace_) (void)device_->free(workspace_);
      workspace_ = nullptr;
      workspace_bytes_ = 0;
      KILN_ASSIGN_OR_RETURN(workspace_, device_->malloc(bytes));
      workspace_bytes_ = bytes;
    }
    return workspace_;
  }

  // A persistent kernel gets one block per compute unit at most: more would only queue.
  LaunchGeometry fit(LaunchGeometry g) const {
    if (g.persistent && compute_units_ > 0) g.grid.x = std::min<uint32_t>(g.grid.x, static_cast<uint32_t>(compute_units_));
    return g;
  }
  std::string_view tensor_name(size_t i) const { return i < tensor_names_.size() ? tensor_names_[i] : "?"; }
  DType tensor_dtype(size_t i) const { return i < tensor_dtypes_.size() ? tensor_dtypes_[i] : DType::f32; }

  const OpTemplate* op_;
  KernelSpec spec_;  // baked, defaults filled
  std::vector<KernelConfig> configs_;
  mutable std::vector<std::shared_ptr<LoadedVariant>> loaded_;
  VariantLoader loader_;
  DeviceImpl* device_;
  int compute_units_ = 0;
  size_t tensor_count_ = 0;
  const uint64_t id_ = next_id_.fetch_add(1);  // never reused, unlike the address
  std::vector<uintptr_t> align_masks_;         // [variant][tensor]: base address bits that must be 0
  std::vector<DType> tensor_dtypes_;  // of the op's tensors for the baked spec, in buffer order
  std::vector<std::string> tensor_names_;
  std::vector<std::pair<size_t, size_t>> in_place_;  // (output, input) pairs that share one buffer
  std::vector<const ParamInfo*> runtime_params_;
  std::vector<const ScalarInfo*> scalars_;
  mutable std::atomic<const CachedPlans*> last_plans_{nullptr};
  mutable std::vector<std::unique_ptr<CachedPlans>> all_plans_;  // every size seen (under mu_)
  std::vector<std::string> runtime_names_, scalar_names_;
  mutable std::mutex mu_;
  mutable void* workspace_ = nullptr;
  mutable uint64_t workspace_bytes_ = 0;
};

// RuntimeImpl (runtime/runtime_impl.h): its memo and compile path. tune() and its helpers are in
// tuner.cpp, record() in recorder.cpp.

RuntimeImpl::RuntimeImpl(const RuntimeOptions& options, std::unique_ptr<DeviceImpl> device,
                         std::unique_ptr<CacheTiers> tiers, UniqueFd record_fd)
    : device_(std::move(device)), tiers_(std::move(tiers)), record_fd_(record_fd.release()) {
  nvidia_compiler_ = options.nvidia_compiler.empty() ? env().nvidia_compiler : options.nvidia_compiler;
  use_tuning_ = options.use_tuning && env().tuning;
}

RuntimeImpl::~RuntimeImpl() {
  // Modules go before the device (and its context).
  {
    std::unique_lock lock(mu_);
    kernels_.clear();
    retired_.clear();
  }
  if (record_fd_ >= 0) ::close(record_fd_);
  const CacheStats s = stats();
  if (tiers_->writable() && (s.compiles || s.disk_hits || s.memory_hits || s.remote_hits))
    tiers_->disk()->append_telemetry({{"memory_hits", s.memory_hits}, {"disk_hits", s.disk_hits}, {"layer_hits", s.layer_hits},
                             {"compiles", s.compiles}, {"compile_ms", s.compile_ms}, {"lock_waits", s.lock_waits},
                             {"evictions", s.evictions}, {"corrupt_entries", s.corrupt_entries},
                             {"disk_errors", s.disk_errors}, {"tunings", s.tunings}, {"tuning_hits", s.tuning_hits},
                             {"remote_hits", s.remote_hits}, {"remote_stores", s.remote_stores},
                             {"remote_refused", s.remote_refused}, {"remote_errors", s.remote_errors}});
}

Result<std::shared_ptr<const CompiledKernel>> RuntimeImpl::compile(const KernelSpec& spec,
                                                                   std::string_view target_name) {
  KILN_ASSIGN_OR_RETURN(const TargetInfo* target, find_target(target_name));
  KILN_ASSIGN_OR_RETURN(auto compiled, get_compiled(spec, *target));
  return std::shared_ptr<const CompiledKernel>(std::move(compiled));
}

Result<std::shared_ptr<const CompiledKernel>> RuntimeImpl::compile(const KernelSpec& spec, std::string_view target_name,
                                                                   const KernelConfig& config) {
  KILN_ASSIGN_OR_RETURN(const TargetInfo* target, find_target(target_name));
  // generate() refuses a configuration that is not one of the op's variants or tuning candidates.
  KILN_ASSIGN_OR_RETURN(auto compiled, get_compiled(spec, *target, &config, /*record_spec=*/false));
  return std::shared_ptr<const CompiledKernel>(std::move(compiled));
}

// kernel() and launch() keep the indentation they had inside the class, so that
// concurrent edits of their bodies merge; reindent them once those have landed.
Result<std::shared_ptr<const Kernel>> RuntimeImpl::kernel(const KernelSpec& spec) {
    if (!device_)
      return make_error(Errc::driver_unavailable,
                        "no GPU: this runtime is compile-only (no driver or no device was found; "
                        "compile, prewarm and inspect still work)");
    MemoKey memo;
    KILN_TRY(MemoKey::of(spec, device_->target(), memo));
    {
      std::shared_lock lock(mu_);
      auto it = kernels_.find(memo);
      if (it != kernels_.end()) {
        ++stats_.memory_hits;
        return std::shared_ptr<const Kernel>(it->second);
      }
    }
    // A miss: the configuration of the spec's tuning record, if any, else the heuristic's.
    const std::optional<KernelConfig> tuned = use_tuning_ ? tuned_config(spec) : std::nullopt;
    KILN_ASSIGN_OR_RETURN(auto compiled, get_compiled(spec, device_->target(), tuned ? &*tuned : nullptr));
    std::lock_guard load_lock(load_mu_);  // one module load per kernel, even under contention
    {
      std::shared_lock lock(mu_);
      auto it = kernels_.find(memo);
      if (it != kernels_.end()) return std::shared_ptr<const Kernel>(it->second);
    }
    KILN_ASSIGN_OR_RETURN(auto k, load(compiled));
    std::unique_lock lock(mu_);
    kernels_.emplace(memo, k);
    return std::shared_ptr<const Kernel>(k);
  }

Result<void> RuntimeImpl::launch(const KernelSpec& spec, std::span<void* const> buffers,
                                 const std::map<std::string, float>& scalars, Stream stream) {
    struct LastHit {
      uint64_t runtime = 0, generation = 0;
      MemoKey key;
      const KernelImpl* kernel = nullptr;
    };
    thread_local LastHit last;
    const uint64_t generation = generation_.load(std::memory_order_acquire);
    if (last.kernel && last.runtime == id_ && last.generation == generation && last.key.matches(spec)) {
      stats_.memory_hits.fetch_add(1, std::memory_order_relaxed);
      return last.kernel->launch(spec, buffers, scalars, stream);
    }
    KILN_ASSIGN_OR_RETURN(auto k, kernel(spec));  // a runtime without a device fails here
    MemoKey memo;
    KILN_TRY(MemoKey::of(spec, device_->target(), memo));
    const auto* impl = static_cast<const KernelImpl*>(k.get());
    last = {id_, generation, memo, impl};
    return impl->launch(spec, buffers, scalars, stream);
  }

CacheStats RuntimeImpl::stats() const {
  CacheStats s;
  s.memory_hits = stats_.memory_hits;
  s.disk_hits = stats_.disk_hits;
  s.compiles = stats_.compiles;
  s.compile_ms = stats_.compile_us / 1000.0;
  s.lock_waits = tiers_->lock_waits();
  s.disk_errors = tiers_->store_errors();
  s.layer_hits = stats_.layer_hits;
  s.corrupt_entries = tiers_->corrupt_entries();
  s.evictions = tiers_->evictions();
  s.tunings = stats_.tunings;
  s.tuning_hits = stats_.tuning_hits;
  if (const RemoteCache* remote = tiers_->remote()) {
    const RemoteCache::Counters r = remote->counters();
    s.remote_hits = r.hits;
    s.remote_stores = r.stores;
    s.remote_refused = r.refused;
    s.remote_errors = r.errors;
  }
  return s;
}

Result<std::shared_ptr<KernelImpl>> RuntimeImpl::load(const std::shared_ptr<CompiledKernelImpl>& compiled) {
  const OpTemplate* op = compiled->op();
  const TargetInfo& target = device_->target();
  auto first = std::make_shared<LoadedVariant>(compiled, device_.get());
  KILN_TRY(first->function(compiled->info().kernel));  // surface load errors now
  std::vector<KernelConfig> variants = op->variants(compiled->spec(), target);
  std::vector<KernelConfig> configs{compiled->config()};
  for (KernelConfig& c : variants)
    if (c != compiled->config()) configs.push_back(std::move(c));
  const KernelSpec spec = compiled->spec();
  VariantLoader loader = [this, spec, configs](size_t i) -> Result<std::shared_ptr<LoadedVariant>> {
    KILN_ASSIGN_OR_RETURN(auto c, get_compiled(spec, device_->target(), &configs[i], /*record_spec=*/false));
    auto v = std::make_shared<LoadedVariant>(c, device_.get());
    KILN_TRY(v->function(c->info().kernel));
    return v;
  };
  return std::make_shared<KernelImpl>(op, spec, std::move(configs), std::move(first), std::move(loader), device_.get(),
                                      device_->compute_units());
}

void RuntimeImpl::install(const MemoKey& memo, std::shared_ptr<KernelImpl> k) {
  std::unique_lock lock(mu_);
  std::shared_ptr<KernelImpl>& slot = kernels_[memo];
  if (slot) retired_.push_back(std::move(slot));  // a thread's last hit may still point at it
  slot = std::move(k);
  generation_.fetch_add(1, std::memory_order_release);
}

const Kernel& RuntimeImpl::as_kernel(const KernelImpl& k) { return k; }

Result<std::shared_ptr<CompiledKernelImpl>> RuntimeImpl::get_compiled(const KernelSpec& spec, const TargetInfo& target,
                                                                      const KernelConfig* config,
                                                                      bool record_spec) {
  MemoKey memo;
  KILN_TRY(MemoKey::of(spec, target, memo, config));
  {
    std::shared_lock lock(mu_);
    auto it = compiled_.find(memo);
    if (it != compiled_.end()) {
      ++stats_.memory_hits;
      return it->second;
    }
  }
  // Single flight within the process: one thread builds a key, the others wait for it.
  std::shared_ptr<std::mutex> key_mu;
  {
    std::unique_lock lock(mu_);
    auto& slot = inflight_[memo];
    if (!slot) slot = std::make_shared<std::mutex>();
    key_mu = slot;
  }
  std::lock_guard key_lock(*key_mu);
  {
    std::shared_lock lock(mu_);
    auto it = compiled_.find(memo);
    if (it != compiled_.end()) {
      ++stats_.memory_hits;
      return it->second;
    }
  }
  auto built = build(spec, target, config);
  std::unique_lock lock(mu_);
  inflight_.erase(memo);  // on failure too: a later request tries again
  if (!built) return built.take_error();
  compiled_.emplace(memo, *built);
  lock.unlock();
  if (record_spec) record(spec);
  return std::move(built).value();
}

Result<std::shared_ptr<CompiledKernelImpl>> RuntimeImpl::build(const KernelSpec& spec, const TargetInfo& target,
                                                               const KernelConfig* config) {
  KILN_ASSIGN_OR_RETURN(KernelSource src, generate(spec, target, config));
  KILN_ASSIGN_OR_RETURN(Compiler * compiler, compiler_for(target, nvidia_compiler_));
  const CacheKey key = CacheKey::make(src, *compiler);
  const std::string digest = key.digest();
  if (env().dump_source) KILN_LOG_INFO("source of {} for {}:\n{}", to_string(src.spec), target.name, src.text);

  // A hit takes the source generated here instead of reading and hashing the entry's copy again.
  const DiskCache::KnownSource known{src.text, src.source_sha256};
  auto compile = [&]() -> Result<CacheEntry> {
    KILN_LOG_DEBUG("compiling {} for {} with {} {}", to_string(src.spec), target.name, compiler->name(), compiler->version());
    test_kill_point("compile");
    KILN_ASSIGN_OR_RETURN(CompiledCode code, compiler->compile(src));
    ++stats_.compiles;
    stats_.compile_us += static_cast<uint64_t>(code.compile_ms * 1000);
    CacheEntry entry;
    entry.key = digest;
    entry.key_json = key.to_json();
    entry.target = std::string(target.name);
    entry.kernel_name = src.kernel_name;
    entry.source = src.text;
    entry.compiled = std::move(code);
    return entry;
  };
  KILN_ASSIGN_OR_RETURN(Tiered<CacheEntry> found, tiers_->entry(digest, known, compile));
  std::string origin = "compiled";
  switch (found.from) {
    case Tier::layer:
      ++stats_.layer_hits;
      [[fallthrough]];
    case Tier::disk:
      ++stats_.disk_hits;
      origin = "disk";
      break;
    case Tier::remote:
      origin = "remote";
      break;
    case Tier::made:
      break;
  }
  return std::make_shared<CompiledKernelImpl>(std::move(found.value), *compiler, std::move(origin), src);
}

}  // namespace detail

Result<std::unique_ptr<Runtime>> Runtime::create(const RuntimeOptions& options) {
  if (auto bad = env_error()) return make_error(Errc::invalid_argument, *bad);
  UniqueFd record_fd;
  if (const std::string record = options.record_file.empty() ? env().record_file : options.record_file; !record.empty()) {
    auto opened = open_for_append(record, options.record_file.empty() ? "KILN_RECORD" : "RuntimeOptions::record_file");
    if (!opened) return opened.take_error();
    record_fd = std::move(opened).value();
  }
  std::unique_ptr<DeviceImpl> device;
  const std::string& backend = options.backend;
  if (backend == "cuda" || backend == "hip") {
    auto d = backend == "cuda" ? open_cuda_device(options.device) : open_hip_device(options.device);
    if (!d) return d.take_error();
    device = std::move(d).value();
  } else if (backend == "auto") {
    auto d = open_cuda_device(options.device);
    if (!d) {
      KILN_LOG_DEBUG("no NVIDIA device: {}", d.error().message);
      d = open_hip_device(options.device);
      if (!d) KILN_LOG_DEBUG("no AMD device: {}", d.error().message);
    }
    if (d) device = std::move(d).value();
    else KILN_LOG_INFO("no GPU found; the runtime is compile-only");
  } else if (backend == "emulator") {
    auto d = open_emulator_device(options.emulator_target);
    if (!d) return d.take_error();
    device = std::move(d).value();
  } else if (backend != "none") {
    return make_error(Errc::not_found,
                      fmt::format("unknown backend '{}'; use auto, cuda, hip, emulator or none", backend));
  }

  KILN_ASSIGN_OR_RETURN(std::optional<RemoteCacheOptions> remote, remote_cache_options_from_env(options.remote_cache));
  std::unique_ptr<DiskCache> disk;
  std::vector<std::unique_ptr<DiskCache>> layers;
  if (options.disk_cache && env().disk_cache) {
    const std::string root = options.cache_dir.empty() ? env().cache_dir : options.cache_dir;
    auto opened = DiskCache::open(root);
    if (opened) {
      disk = std::move(opened).value();
    } else if (auto readable = DiskCache::open(root, /*read_only=*/true); readable && ::access(root.c_str(), W_OK) != 0) {
      // A cache we may read but not write (a read-only mount, say) still serves its entries.
      KILN_LOG_WARN("cache directory '{}' is not writable; reading it, and caching new kernels in memory only", root);
      layers.push_back(std::move(readable).value());
    } else {
      KILN_LOG_WARN("disk cache disabled, kernels are cached in memory only: {}", opened.error().message);
    }
    std::vector<std::string> paths = options.read_only_caches;
    for (size_t pos = 0, next; pos < env().cache_path.size(); pos = next + 1) {
      next = env().cache_path.find(':', pos);
      if (next == std::string::npos) next = env().cache_path.size();
      if (next > pos) paths.push_back(env().cache_path.substr(pos, next - pos));
    }
    for (const std::string& path : paths) {
      if (!env().trusted_keys.empty()) {  // layers cannot carry signatures yet: unsigned content
        KILN_LOG_WARN("skipping read-only cache layer '{}': KILN_TRUSTED_KEYS accepts only signed content, and "
                      "layers are not signed (import a signed archive instead)",
                      path);
        continue;
      }
      auto layer = DiskCache::open(path, /*read_only=*/true);
      if (layer) layers.push_back(std::move(layer).value());
      else KILN_LOG_WARN("skipping read-only cache layer: {}", layer.error().message);
    }
  }
  auto tiers = std::make_unique<CacheTiers>(std::move(disk), std::move(layers),
                                            options.cache_max_bytes ? options.cache_max_bytes : env().cache_max_bytes,
                                            env().lock_timeout_s);
  if (remote) {
    remote->wait_s = env().lock_timeout_s;
    tiers->set_remote(std::make_unique<RemoteCache>(std::move(*remote)));
  }
  return std::unique_ptr<Runtime>(
      std::make_unique<detail::RuntimeImpl>(options, std::move(device), std::move(tiers), std::move(record_fd)));
}

}  // namespace kiln
