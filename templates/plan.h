// The launch types of an op's plan: what one call of a kernel variant launches (grid, block,
// kernel arguments in order, tensor maps, workspace) and the baked tuning configuration that
// selects the variant. Below the op contract (templates/op_codegen.h), codegen and the runtime.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace kiln {

struct Dim3 {
  uint32_t x = 1, y = 1, z = 1;
};

/// Grid and block of one launch. Most templates use static LDS arrays and leave dynamic shared
/// memory 0; gemm's sm_90a kernels stage their tiles in dynamic shared memory beyond 48 KiB (the
/// CUDA launch raises the function's opt-in limit). Codegen emits the op's
/// dynamic_shared_bytes() as `KILN_DYNAMIC_SHARED_BYTES`, and a template that carves dynamic
/// shared memory static_asserts that it fits: geometry and kernel cannot disagree.
/// The largest grid.y and grid.z, in blocks, on both vendors (CUDA and HIP); grid.x goes to 2^31 - 1.
inline constexpr int64_t kMaxGridYZ = 65535;

struct LaunchGeometry {
  Dim3 grid;
  Dim3 block;
  uint32_t dynamic_shared_bytes = 0;
  /// A persistent kernel: grid.x is the number of work tiles and blocks stride over them by
  /// gridDim.x, so the launch may shrink grid.x to the device's compute units (one block each).
  bool persistent = false;
  /// Thread-block cluster dimensions in blocks (sm_90a; each grid dimension a multiple of the
  /// cluster's, at most 8 blocks per cluster without opt-in). 1x1x1 = no cluster. Needs
  /// cuLaunchKernelEx (CUDA 12.0+); refused elsewhere (older drivers, AMD).
  Dim3 cluster;
  /// Programmatic dependent launch (sm_90a): the kernel may start while the previous kernel of
  /// the stream finishes, and waits for it with griddepcontrol.wait (cudaGridDependencySynchronize)
  /// before reading its outputs. Needs cuLaunchKernelEx; ignored on AMD (launches stay serialized).
  bool programmatic_dependent_launch = false;
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

/// One kernel argument of a launch, in kernel-parameter order.
struct KernelArg {
  enum class Kind : uint8_t {
    tensor,      ///< A tensor's device pointer; `index` into tensors(spec).
    tensor_map,  ///< A tensor as a TMA tensor map (128 bytes by value); `map` describes it.
    workspace,   ///< The call's workspace pointer plus `value` bytes.
    i32,         ///< A 32-bit integer `value` (a runtime size, a block count).
    i64,         ///< A 64-bit integer `value`.
    scalar,      ///< The fp32 scalar scalars()[index] of the call (or its default).
    f32,         ///< A constant fp32 `fvalue`.
  };
  Kind kind;
  uint32_t index = 0;
  int64_t value = 0;
  float fvalue = 0;
  TensorMapInfo map = {};

  static KernelArg tensor(uint32_t i) { return {Kind::tensor, i}; }
  static KernelArg tensor_map_of(const TensorMapInfo& m) {
    KernelArg a{Kind::tensor_map, static_cast<uint32_t>(m.tensor)};
    a.map = m;
    return a;
  }
  static KernelArg workspace(int64_t offset = 0) { return {Kind::workspace, 0, offset}; }
  static KernelArg i32(int64_t v) { return {Kind::i32, 0, v}; }
  static KernelArg i64(int64_t v) { return {Kind::i64, 0, v}; }
  static KernelArg scalar(uint32_t i) { return {Kind::scalar, i}; }
  static KernelArg f32(float v) {
    KernelArg a{Kind::f32};
    a.fvalue = v;
    return a;
  }
};

/// One kernel launch of a plan.
struct Launch {
  std::string kernel;           ///< `extern "C"` entry point in the variant's code object.
  LaunchGeometry geometry;
  std::vector<KernelArg> args;  ///< Kernel parameters, in order.
};

/// The launches of one call, in stream order, and the device workspace they share. A plan with
/// no launches is a legal no-op (0 rows).
struct Plan {
  std::vector<Launch> launches;
  uint64_t workspace_bytes = 0;
};

/// Baked tuning choices (tile sizes, threads per block, which template), picked by the op's
/// heuristic. They are part of the generated code and of the cache key.
using KernelConfig = std::map<std::string, int64_t>;

/// "BM=128 BN=256 BK=64 ...": a configuration in one line (keys in order).
std::string config_string(const KernelConfig& config);

}  // namespace kiln
