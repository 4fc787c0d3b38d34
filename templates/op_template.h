// OpTemplate: how an op describes itself to Kiln. One subclass per op, in templates/<op>/, next to
// its device template (<op>.kernel) and its CPU reference. Everything the rest of the pipeline
// knows about an op comes through this interface: codegen, the cache key, launch geometry,
// `kiln ops`, `kiln run` and the GPU tests.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/dtype.h"
#include "kiln/result.h"
#include "kiln/spec.h"
#include "kiln/target.h"

namespace kiln {

/// One integer parameter of an op.
struct ParamInfo {
  std::string_view name;
  std::string_view doc;
  bool baked;        ///< true: a compile-time constant of the code (enters the cache key);
                     ///< false: a runtime kernel argument (an `int` after the tensor pointers).
  bool is_bool;      ///< 0/1 parameter (trans_a), written true/false in manifests.
  int64_t min_value;
  int64_t max_value;
};

/// A runtime fp32 scalar argument (eps), passed after the runtime integer parameters.
struct ScalarInfo {
  std::string_view name;
  float default_value;
  std::string_view doc;
};

/// One tensor argument of a concrete spec, in kernel-argument order (inputs first).
struct TensorInfo {
  std::string name;     ///< "A", "x", "gamma", ...
  DType dtype;
  std::vector<int64_t> shape;  ///< Row-major; the product is the element count.
  bool output;
  int64_t elements() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

struct Dim3 {
  uint32_t x = 1, y = 1, z = 1;
};

/// Grid and block of one launch. Most templates use static LDS arrays (sized by baked constants)
/// and leave dynamic shared memory 0; gemm's sm_90a WGMMA kernels stage their tiles in dynamic
/// shared memory beyond 48 KiB (the CUDA launch raises the function's opt-in limit for it).
struct LaunchGeometry {
  Dim3 grid;
  Dim3 block;
  uint32_t dynamic_shared_bytes = 0;
  /// A persistent kernel: grid.x is the number of work tiles and blocks stride over them by
  /// gridDim.x, so the launch may shrink grid.x to the device's compute units (one block each).
  bool persistent = false;
};

/// A TMA tensor map (CUtensorMap, 128 bytes) that the kernel takes by value, in place of one
/// tensor's pointer. 2-D view of a row-major tensor: `inner` elements contiguous (the last
/// dimension), `outer` rows of `inner` elements; tiles of box_inner x box_outer elements land in
/// shared memory with the 128-byte swizzle; elements outside the tensor read as zero. The host
/// encodes it for every launch from the buffer's address (cuTensorMapEncodeTiled on CUDA).
struct TensorMapInfo {
  size_t tensor;  ///< Index into tensors().
  uint64_t inner, outer;
  uint32_t box_inner, box_outer;
};

/// Baked tuning choices (tile sizes, threads per block), picked by the op's heuristic. They are
/// part of the generated code and of the cache key.
using TileConfig = std::map<std::string, int64_t>;

/// "BM=128 BN=256 BK=64 ...": a configuration in one line (keys in order).
std::string config_string(const TileConfig& config);

/// Runtime fp32 arguments by name; missing ones take ScalarInfo::default_value.
using Scalars = std::map<std::string, float>;

class OpTemplate {
 public:
  virtual ~OpTemplate() = default;

  virtual std::string_view name() const = 0;
  virtual std::string_view summary() const = 0;
  virtual std::span<const ParamInfo> params() const = 0;
  virtual std::span<const ScalarInfo> scalars() const { return {}; }
  /// Supported input dtypes.
  virtual std::span<const DType> dtypes() const = 0;
  /// Supported output dtypes for an input dtype (default: the input dtype only).
  virtual bool supports_out_dtype(DType in, DType out) const { return in == out; }
  /// The device template: target-neutral kernel text that reads the baked constants and the
  /// prelude's primitives. Its kernel is `extern "C"` and named kernel_name().
  virtual std::string_view device_template() const = 0;
  /// The device template codegen uses for a chosen configuration (an op with several kernels,
  /// e.g. gemm's tensor-core path, picks by its config); the cache key hashes this text.
  virtual std::string_view device_template_for(const TileConfig& /*config*/) const { return device_template(); }
  virtual std::string_view kernel_name() const = 0;

  /// Checks a request. The base checks names, ranges and dtypes from params()/dtypes(); ops add
  /// their own rules in check(). Messages name the parameter and what would work instead.
  Result<void> validate(const KernelSpec& spec, const TargetInfo& target) const;

  /// The configuration heuristic for the exact spec and target.
  virtual TileConfig choose_config(const KernelSpec& spec, const TargetInfo& target) const = 0;
  /// The configurations the autotuner times for the spec (Runtime::tune), the heuristic's first;
  /// all distinct. Codegen accepts no other configuration. Default: the heuristic's only, so the
  /// spec needs no tuning.
  virtual std::vector<TileConfig> tuning_candidates(const KernelSpec& spec, const TargetInfo& target) const {
    return {choose_config(spec, target)};
  }
  /// C++ declarations of the baked constants and type aliases for codegen.
  virtual std::string specialize(const KernelSpec& spec, const TileConfig& config) const = 0;
  /// Launch geometry for a call (runtime parameters taken from the spec).
  virtual LaunchGeometry geometry(const KernelSpec& spec, const TileConfig& config) const = 0;
  /// Tensor arguments of a spec, in kernel-argument order.
  virtual std::vector<TensorInfo> tensors(const KernelSpec& spec) const = 0;
  /// Tensors passed as TMA tensor maps instead of pointers (default: none).
  virtual std::vector<TensorMapInfo> tensor_maps(const KernelSpec& /*spec*/, const TileConfig& /*config*/) const {
    return {};
  }

  /// CPU reference in fp64 on the (already dtype-rounded) input values. Computes the output rows
  /// listed in `rows` (rows of the first dimension of the single output tensor) into `out`,
  /// row after row; an empty `rows` means every row.
  virtual void reference(const KernelSpec& spec, const Scalars& scalars,
                         std::span<const std::vector<float>> inputs,
                         std::span<const int64_t> rows, std::vector<double>& out) const = 0;

  /// The spec with every runtime (non-baked) parameter removed: what the code depends on.
  KernelSpec baked_spec(const KernelSpec& spec) const;
  /// Value of a scalar, or its default.
  float scalar(const Scalars& scalars, std::string_view name) const;

 protected:
  virtual Result<void> check(const KernelSpec& spec, const TargetInfo& target) const = 0;
};

/// Every op, in `kiln ops` order.
std::span<const OpTemplate* const> all_ops();
/// Looks an op up by name; the error lists the known ops.
Result<const OpTemplate*> find_op(std::string_view name);

/// Rounds `value` up to a multiple of `to`.
constexpr int64_t round_up(int64_t value, int64_t to) { return (value + to - 1) / to * to; }
constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/// The C++ spelling of a dtype in device code ("float", "kiln::bf16", "kiln::f16").
std::string_view device_type_name(DType t);

}  // namespace kiln
