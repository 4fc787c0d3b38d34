// The Kiln runtime: compiles kernels for exact specs, caches them in memory and on disk, and
// launches them.
//
//   auto rt = kiln::Runtime::create({}).value();          // first GPU, default cache directory
//   kiln::KernelSpec spec{"gemm", kiln::DType::bf16, kiln::DType::bf16,
//                         {{"M", 8192}, {"N", 6144}, {"K", 4096}, {"trans_a", 0}, {"trans_b", 1}}};
//   auto kernel = rt->kernel(spec).value();               // compiled once, then cached
//   kernel->launch(spec, {A, B, C}, {}, stream);          // device pointers, op's tensor order
//
// Thread-safety: every member function of Runtime and Kernel may be called from any thread.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kiln/device.h"
#include "kiln/result.h"
#include "kiln/spec.h"
#include "kiln/target.h"
#include "kiln/tune.h"

namespace kiln {

struct RuntimeOptions {
  /// Which GPU: "auto" (NVIDIA if libcuda finds one, else AMD), "cuda", "hip", "none"
  /// (compile-only: compile/prewarm/inspect work, launches return Errc::driver_unavailable), or
  /// "emulator": an AMD device of `emulator_target` whose kernels run in tinygrad's CDNA ISA
  /// emulator (docs/emulator.md; no timing: Device::time_ms returns Errc::unsupported).
  std::string backend = "auto";
  /// With backend "emulator": the AMD target to emulate, "gfx942" or "gfx950".
  std::string emulator_target;
  int device = 0;            ///< Device ordinal.
  /// Cache root; empty = KILN_CACHE_DIR, else $XDG_CACHE_HOME/kiln, else ~/.cache/kiln.
  std::string cache_dir;
  bool disk_cache = true;    ///< false: memory only (also KILN_DISABLE_DISK_CACHE=1).
  /// Compiler for NVIDIA targets: "nvrtc" (default) or "clang"; empty = KILN_NVIDIA_COMPILER.
  std::string nvidia_compiler;
  /// Read-only cache layers searched after the writable cache (e.g. one shipped with the
  /// application or prebuilt on a build host); KILN_CACHE_PATH (':'-separated) adds more.
  std::vector<std::string> read_only_caches;
  /// Byte budget of the writable cache; least recently used entries are evicted past it.
  /// 0 = KILN_CACHE_MAX_SIZE, else unbounded.
  uint64_t cache_max_bytes = 0;
  /// Append every kernel spec requested to this manifest (JSON lines), for `kiln prewarm`;
  /// empty = KILN_RECORD.
  std::string record_file;
  /// With a device: kernel() and launch() compile the configuration of a tuning record
  /// (Runtime::tune, here or in another process) for the spec, device and compiler when the
  /// cache holds one, else the heuristic's. KILN_TUNING=0 turns it off too.
  bool use_tuning = true;
  /// The cluster-wide cache tier after the disk cache: "redis://HOST[:PORT][/DB]"; empty =
  /// KILN_REMOTE_CACHE, else none. Entries are authenticated with the secret in
  /// KILN_REMOTE_CACHE_KEY (required with a remote cache). See docs/remote-cache.md.
  std::string remote_cache;
};

/// Cache and compile counters (per Runtime).
struct CacheStats {
  uint64_t memory_hits = 0;  ///< Requests served by the in-memory cache.
  uint64_t disk_hits = 0;    ///< Requests served by a verified disk entry.
  uint64_t compiles = 0;     ///< Codegen + compile runs.
  double compile_ms = 0;     ///< Wall time spent compiling, summed.
  uint64_t lock_waits = 0;   ///< Times another process held the kernel's compile lock.
  uint64_t corrupt_entries = 0;  ///< Disk entries that failed verification (moved aside, rebuilt).
  uint64_t disk_errors = 0;  ///< Failed disk writes (the kernel is still served from memory).
  uint64_t layer_hits = 0;   ///< Disk hits served by a read-only layer (counted in disk_hits too).
  uint64_t evictions = 0;    ///< Entries evicted to keep the cache within its byte budget.
  uint64_t tunings = 0;      ///< Specs timed by Runtime::tune in this runtime.
  uint64_t tuning_hits = 0;  ///< Tuning records found (by kernel() on a memory miss, or by tune()).
  uint64_t remote_hits = 0;  ///< Kernels fetched from the remote tier (verified, then kept on disk).
  uint64_t remote_stores = 0;   ///< Kernels compiled here and stored in the remote tier.
  uint64_t remote_refused = 0;  ///< Remote entries refused (not authenticated, malformed, too large).
  uint64_t remote_errors = 0;   ///< Failed remote calls (the first turns the tier off for this runtime).
};

/// Resource usage of a compiled kernel (-1 = unknown). See `kiln inspect --emit meta`.
struct KernelInfo {
  std::string kernel;        ///< Entry point name.
  std::string target;
  std::string compiler;      ///< "clang 22.1.8" / "nvrtc 13.0".
  std::string code_format;   ///< "hsaco", "cubin", "ptx".
  size_t code_bytes = 0;
  int registers = -1;        ///< Per thread (NVIDIA registers / AMD VGPRs).
  int sgprs = -1;            ///< AMD scalar registers.
  int shared_bytes = -1;     ///< Static LDS / shared memory per block.
  int scratch_bytes = -1;    ///< Private segment / stack frame per thread.
  int spill_stores = -1;
  int spill_loads = -1;
  int wave_size = -1;
  std::string cache_key;     ///< SHA-256 of the cache key.
  std::string config;        ///< Tile configuration ("BM=128 BN=128 ...").
  double compile_ms = 0;     ///< Time of the compile that produced it (possibly another process).
  std::string assembler_report;
};

/// A compiled kernel for one target: its source, code object and metadata. Needs no device.
class CompiledKernel {
 public:
  virtual ~CompiledKernel() = default;
  virtual const KernelInfo& info() const = 0;
  virtual const std::string& source() const = 0;
  virtual std::span<const uint8_t> code_object() const = 0;
  /// Where the result came from: "memory", "disk", "remote" or "compiled".
  virtual std::string_view origin() const = 0;
};

/// An op's kernels loaded on the runtime's device: everything one call of the spec launches.
/// An op may launch several kernels per call (rmsnorm_bwd: per-block partial sums of dgamma,
/// then their reduction) and may have several variants (gemm on sm_90a: the TMA kernel, and the
/// cp.async kernel for tensors whose base is not 16-byte aligned); the variant that serves a call
/// is chosen per launch from the buffers, and a fallback variant is compiled and loaded the first
/// time a call needs it. A Kernel must not be used after its Runtime is destroyed.
class Kernel {
 public:
  virtual ~Kernel() = default;
  /// The code object of the preferred variant.
  virtual const CompiledKernel& compiled() const = 0;
  /// Device workspace one call of `call` needs, in bytes (0 for most ops).
  virtual uint64_t workspace_bytes(const KernelSpec& call) const = 0;
  /// Launches on `stream`. `call` is the spec of this call: its baked parameters must equal the
  /// kernel's, its runtime parameters (rmsnorm/swiglu `rows`) set the grid; a runtime size of 0
  /// launches nothing. `buffers` are device pointers in the op's tensor order (`kiln ops`: the
  /// signature, inputs first, optional tensors that the spec leaves out omitted), optionally
  /// followed by one workspace pointer of at least workspace_bytes(call) bytes, 16-byte aligned
  /// (an allocation's start is; else invalid_argument); without it the
  /// kernel uses a workspace of its own, allocated once and reused (calls that share it on several
  /// streams at once race: pass a workspace per stream then). `scalars` are runtime fp32
  /// arguments by name (rmsnorm "eps"; missing ones take their defaults).
  /// Errors: Errc::invalid_argument (wrong buffer count, spec mismatch, a call no variant serves),
  /// driver_error, and the compile error of a fallback variant.
  virtual Result<void> launch(const KernelSpec& call, std::span<void* const> buffers,
                              const std::map<std::string, float>& scalars = {},
                              Stream stream = nullptr) const = 0;
};

class Runtime {
 public:
  /// Opens the device (unless backend is "none") and the disk cache. A missing driver or GPU with
  /// backend "auto" gives a compile-only runtime, not an error. An unusable cache directory
  /// (read-only, owned by another user, world-writable) degrades to memory-only with one warning.
  static Result<std::unique_ptr<Runtime>> create(const RuntimeOptions& options = {});
  virtual ~Runtime() = default;

  /// The device, or nullptr for a compile-only runtime.
  virtual Device* device() = 0;
  /// The cache root in use, or "" when memory-only.
  virtual std::string cache_dir() const = 0;

  /// Compiles (or finds in the memory or disk cache) the kernel of `spec` for `target`
  /// ("gfx942", "gfx950", "sm_90a"). Needs no GPU. Errors: Errc::not_found (op, target),
  /// invalid_argument (the spec), unsupported (AMD without LLVM), compile_failed (with the log).
  virtual Result<std::shared_ptr<const CompiledKernel>> compile(const KernelSpec& spec,
                                                                std::string_view target) = 0;
  /// The same with a tile configuration of the caller's choice ("THREADS" -> 512, ...): one of the
  /// op's variants or tuning candidates for the spec and target (KernelInfo::config and
  /// TuneCandidate::config name them; `kiln inspect --config` takes one). Errors as above, and
  /// Errc::invalid_argument listing the configurations that exist when `config` is not one of them.
  virtual Result<std::shared_ptr<const CompiledKernel>> compile(const KernelSpec& spec, std::string_view target,
                                                                const std::map<std::string, int64_t>& config) = 0;
  /// Compiles for the device's target and loads it. A repeated request is one hash lookup.
  virtual Result<std::shared_ptr<const Kernel>> kernel(const KernelSpec& spec) = 0;
  /// kernel(spec) then launch: the one-call form.
  virtual Result<void> launch(const KernelSpec& spec, std::span<void* const> buffers,
                              const std::map<std::string, float>& scalars = {},
                              Stream stream = nullptr) = 0;

  /// Autotunes the kernel of `spec` on the device: compiles each of the op's tuning candidates
  /// (through the cache), runs it once on fresh random inputs in the op's tensors, times
  /// `options.reps` launches with device events, each after writing twice the device's caches
  /// (its L2; on AMD also the Infinity Cache) so that no launch finds its inputs there, and keeps
  /// the configuration of the lowest median time (without the device memory for that flush, a
  /// warning, and the launches are timed with the caches warm). The winner is stored as a tuning record in the writable cache (v1/tuning/, keyed by the
  /// spec, target, device name and compiler; see docs/cache.md), so that kernel() in this and in
  /// every later process compiles it, and it replaces the spec's kernel in memory now. A record
  /// that exists already is returned without timing (from_record), unless `options.force`.
  /// Ops list their candidates (OpTemplate::tuning_candidates: gemm's tiles and tile-order
  /// groups, the row kernels' block shapes, ...); for a spec with one configuration the report
  /// lists it, untimed, and nothing is stored.
  /// A candidate that fails to compile, load or launch is reported (TuneCandidate::error) and
  /// skipped. Errors: Errc::driver_unavailable (no GPU), invalid_argument (the spec, reps < 1),
  /// timeout (another process tuning the spec for too long), and the error of the heuristic's
  /// candidate when every candidate fails.
  virtual Result<TuneReport> tune(const KernelSpec& spec, const TuneOptions& options = {}) = 0;

  virtual CacheStats stats() const = 0;
};

}  // namespace kiln
