// OpCodegen: how an op's kernels are generated and launched (op contract v3, part 2 of 3).
//   - variants: configurations in preference order (TMA GEMM, then cp.async GEMM), each a device
//     template with one or more `extern "C"` kernels; a variant may refuse a call whose buffers are
//     not aligned as it needs (base_alignment()) and the next one takes it;
//   - the device template of a configuration, which names the parts of the device-code library
//     it uses (`#include "lib/<part>.kernel"`, templates/lib/library.h), and its baked constants;
//   - a plan per call: the launches in order, each with its kernel, geometry and explicit
//     kernel-argument list, and the workspace bytes they share.
// An op overrides variants(); choose_config() (the heuristic) is variants().front() unless the op
// says otherwise, and tuning_candidates() is the heuristic's configuration alone.
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "templates/op_interface.h"
#include "templates/plan.h"

namespace kiln {

/// base_alignment() of a variant that accesses its tensors `n` at a time with vector loads of
/// VEC elements (config "VEC"; 1 = scalar): 16 bytes for every tensor when VEC > 1, except those
/// in `scalar_tensors` (accessed one element at a time, e.g. fp32 scales).
std::vector<uint32_t> vector_variant_alignment(const KernelConfig& config, size_t tensors,
                                               std::initializer_list<size_t> scalar_tensors = {});

class OpCodegen : public OpInterface {
 public:
  /// The kernel variants for the spec and target, in preference order: the heuristic's
  /// configuration first, then fallbacks for calls it refuses (base_alignment()). Never empty.
  /// Every op overrides it (a single-variant op returns one configuration).
  virtual std::vector<KernelConfig> variants(const KernelSpec& spec, const TargetInfo& target) const = 0;
  /// The configuration heuristic for the exact spec and target. Default: variants().front(). An
  /// op that overrides it (gemm's modelled choice) and builds variants() from it must not call
  /// the default.
  virtual KernelConfig choose_config(const KernelSpec& spec, const TargetInfo& target) const {
    return variants(spec, target).front();
  }
  /// The configurations the autotuner times for the spec (Runtime::tune), the heuristic's first;
  /// all distinct. Default: the heuristic's only.
  virtual std::vector<KernelConfig> tuning_candidates(const KernelSpec& spec, const TargetInfo& target) const {
    return {choose_config(spec, target)};
  }
  /// The device template of a configuration: target-neutral kernel text that reads the baked
  /// constants, the prelude's primitives and the library parts it includes
  /// (`#include "lib/<part>.kernel"` lines, which codegen replaces by the parts' text, each once,
  /// dependencies first, ahead of the baked constants), with every kernel its plans launch.
  virtual std::string_view device_template(const KernelConfig& config) const = 0;
  /// C++ declarations of the baked constants and type aliases for codegen.
  virtual std::string specialize(const KernelSpec& spec, const KernelConfig& config) const = 0;
  /// Dynamic shared memory of the configuration's kernels (the largest), emitted as
  /// KILN_DYNAMIC_SHARED_BYTES for the template's static_assert. Default 0.
  virtual uint32_t dynamic_shared_bytes(const KernelSpec& /*spec*/, const KernelConfig& /*config*/) const { return 0; }
  /// The kernel that `kiln inspect` reports and names the code object after.
  virtual std::string_view kernel_name(const KernelConfig& config) const = 0;

  // ---- a call --------------------------------------------------------------------------------
  /// The launches of one call: `call` holds every parameter, runtime ones included. A call
  /// with a runtime size of 0 plans no launch.
  virtual Plan plan(const KernelSpec& call, const KernelConfig& config) const = 0;
  /// Whether a variant can serve a call, as Primus-Turbo's `can_handle`, for the one property of
  /// a call that the spec does not fix: where its buffers start. The base alignment in bytes (a
  /// power of two; 1 = any) that each tensor, in tensors(spec) order, needs for this variant. The
  /// runtime asks once per loaded kernel and checks every call's pointers against it with a mask;
  /// a call the variant cannot take goes to the next variant. Default: 1 for every tensor. gemm's
  /// TMA variant and the 16-byte vector variants of the row ops need 16.
  virtual std::vector<uint32_t> base_alignment(const KernelSpec& spec, const KernelConfig& config) const;

 protected:
  /// One launch over all tensors, the runtime parameters as int32 and the scalars: the plan of a
  /// single-kernel op.
  Launch single_launch(const KernelSpec& call, const KernelConfig& config, LaunchGeometry geometry) const;
};

}  // namespace kiln
