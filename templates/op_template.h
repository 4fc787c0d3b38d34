// OpTemplate: how an op describes itself to Kiln (op contract v2). One subclass per op, in its own
// folder templates/<op>/, next to its device templates (*.kernel) and its CPU reference, plus one
// line in templates/ops.def. Everything the rest of the pipeline knows about an op comes through
// this interface: codegen, the cache, launch, check, `kiln ops`, `kiln run`, the tests and the
// benchmarks. Nothing outside an op's folder compares op names. docs/adding-an-op.md walks
// through a new op.
//
// An op declares:
//   - parameters (integers; baked into the code, or runtime kernel arguments) and fp32 scalars;
//   - a typed signature: inputs and outputs, each with its dtype and a shape in the parameters,
//     optionally present only for some parameter values (rmsnorm's residual);
//   - kernel variants: configurations in preference order (TMA GEMM, then cp.async GEMM), each a
//     device template with one or more `extern "C"` kernels; a variant may refuse a call whose
//     buffers are not aligned as it needs (base_alignment()) and the next one takes it;
//   - a plan per call: the launches in order, each with its kernel, geometry and explicit
//     kernel-argument list, and the workspace bytes they share;
//   - accuracy gates per output, FLOPs and bytes moved, the specs its tests run, and how its
//     inputs are initialised.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <random>
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
                     ///< false: a runtime size, passed as a kernel argument.
  bool is_bool;      ///< 0/1 parameter (trans_a), written true/false in manifests.
  int64_t min_value;
  int64_t max_value;
  /// Names of the values 0, 1, 2, ... of an enumerated parameter (quantize_fp8's granularity:
  /// "tensorwise", "rowwise", ...); the CLI and manifests accept the names. Empty: a number.
  std::span<const std::string_view> choices = {};
  /// The value of an optional parameter left out of a spec (rmsnorm's residual = 0); nullopt:
  /// the parameter is required.
  std::optional<int64_t> default_value = std::nullopt;
};

/// A runtime fp32 scalar argument (eps).
struct ScalarInfo {
  std::string_view name;
  float default_value;
  std::string_view doc;
};

enum class Role : uint8_t { input, output };

/// Where a tensor's dtype comes from.
enum class DTypeRule : uint8_t {
  in,     ///< KernelSpec::dtype
  out,    ///< KernelSpec::out_dtype
  fixed,  ///< TensorDecl::fixed (fp32 scales and rstd, int32 indices)
};

/// One tensor of an op's signature.
struct TensorDecl {
  std::string_view name;       ///< "x", "gamma", "rstd", ...
  Role role;
  DTypeRule dtype_rule;
  DType fixed = DType::f32;    ///< With DTypeRule::fixed.
  std::string_view shape_doc;  ///< The shape in the parameters: "[rows, hidden]".
  /// The shape for a spec (row-major; the product is the element count).
  std::vector<int64_t> (*shape)(const KernelSpec&) = nullptr;
  /// Whether the spec has this tensor (nullptr: always). Absent tensors take no buffer.
  bool (*present)(const KernelSpec&) = nullptr;
  std::string_view doc = {};
  /// In-place operation: an output that the kernel writes over the input named here (same shape
  /// and dtype), when `in_place(spec)` holds (nullptr: always). The caller passes that input's
  /// buffer for both tensors; DeviceTensors does so (no poison: the buffer holds the input), and
  /// check_on_device compares the buffer after the launch with the reference computed from the
  /// input's host copy. Empty: the output has a buffer of its own.
  std::string_view overwrites = {};
  bool (*in_place)(const KernelSpec&) = nullptr;
};

/// One tensor argument of a concrete spec, in signature order (inputs before outputs).
struct TensorInfo {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  bool output;
  /// An output written in place: the index in tensors(spec) of the input whose buffer it shares
  /// (TensorDecl::overwrites); -1: a buffer of its own.
  int overwrites = -1;
  int64_t elements() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  uint64_t bytes() const { return static_cast<uint64_t>(elements()) * dtype_size(dtype); }
};

struct Dim3 {
  uint32_t x = 1, y = 1, z = 1;
};

/// Grid and block of one launch. Most templates use static LDS arrays and leave dynamic shared
/// memory 0; gemm's sm_90a kernels stage their tiles in dynamic shared memory beyond 48 KiB (the
/// CUDA launch raises the function's opt-in limit). Codegen emits the op's
/// dynamic_shared_bytes() as `KILN_DYNAMIC_SHARED_BYTES`, and a template that carves dynamic
/// shared memory static_asserts that it fits: geometry and kernel cannot disagree.
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
using TileConfig = std::map<std::string, int64_t>;

/// "BM=128 BN=256 BK=64 ...": a configuration in one line (keys in order).
std::string config_string(const TileConfig& config);

/// base_alignment() of a variant that accesses its tensors `n` at a time with vector loads of
/// VEC elements (config "VEC"; 1 = scalar): 16 bytes for every tensor when VEC > 1, except those
/// in `scalar_tensors` (accessed one element at a time, e.g. fp32 scales).
std::vector<uint32_t> vector_variant_alignment(const TileConfig& config, size_t tensors,
                                               std::initializer_list<size_t> scalar_tensors = {});

/// Runtime fp32 arguments by name; missing ones take ScalarInfo::default_value.
using Scalars = std::map<std::string, float>;

/// The accuracy gate of one output (shared/reference/BENCHMARKS.md).
struct Gate {
  enum class Kind : uint8_t {
    tolerance,  ///< |out - ref| <= atol + rtol |ref| per element, and rel. Frobenius < max_rel_fro
    snr,        ///< 10 log10(|ref|^2 / |ref - out|^2) > min_snr_db
    exact,      ///< the same value bits (fp8 codes, integers): `max_code_diff` code steps allowed
  };
  Kind kind = Kind::tolerance;
  double atol = 1e-2, rtol = 1e-2;
  double max_rel_fro = 1e-2;  ///< < 0: no Frobenius condition
  double min_snr_db = 0;
  int max_code_diff = 0;
  std::string describe() const;
  /// The BENCHMARKS.md gate for an output dtype: fp32 1e-4; bf16/fp16 1e-2 and Frobenius 1e-2;
  /// fp8 and integers exact.
  static Gate for_dtype(DType t);
};

/// The reference values of one output: every element, or the listed rows of its first dimension.
struct RefOutput {
  std::vector<int64_t> rows;   ///< Rows computed, in order; empty: the whole tensor.
  std::vector<double> values;  ///< Row after row (or all elements).
};

/// A spec a test runs, with the runtime sizes it wants.
struct TestSpec {
  KernelSpec spec;
  std::string_view why;  ///< "tail in N", "hidden 1", ...
};

class OpTemplate {
 public:
  virtual ~OpTemplate() = default;

  virtual std::string_view name() const = 0;
  virtual std::string_view summary() const = 0;
  virtual std::span<const ParamInfo> params() const = 0;
  virtual std::span<const ScalarInfo> scalars() const { return {}; }
  /// Supported input dtypes (KernelSpec::dtype).
  virtual std::span<const DType> dtypes() const = 0;
  /// Whether the op serves out_dtype with input dtype `in` (default: out == in).
  virtual bool supports_out_dtype(DType in, DType out) const { return in == out; }
  /// The typed signature, inputs first.
  virtual std::span<const TensorDecl> signature() const = 0;

  /// Checks a request. The base checks names, ranges, dtypes and the target's fp8 encodings;
  /// ops add their own rules in check(). Messages name the parameter and what would work.
  Result<void> validate(const KernelSpec& spec, const TargetInfo& target) const;

  // ---- variants and code generation ------------------------------------------------------
  /// The kernel variants for the spec and target, in preference order: the heuristic's
  /// configuration first, then fallbacks for calls it refuses (base_alignment()). Default: the heuristic.
  virtual std::vector<TileConfig> variants(const KernelSpec& spec, const TargetInfo& target) const {
    return {choose_config(spec, target)};
  }
  /// The configuration heuristic for the exact spec and target.
  virtual TileConfig choose_config(const KernelSpec& spec, const TargetInfo& target) const = 0;
  /// The configurations the autotuner times for the spec (Runtime::tune), the heuristic's first;
  /// all distinct. Default: the heuristic's only.
  virtual std::vector<TileConfig> tuning_candidates(const KernelSpec& spec, const TargetInfo& target) const {
    return {choose_config(spec, target)};
  }
  /// The device template of a configuration: target-neutral kernel text that reads the baked
  /// constants and the prelude's primitives, with every kernel its plans launch.
  virtual std::string_view device_template(const TileConfig& config) const = 0;
  /// C++ declarations of the baked constants and type aliases for codegen.
  virtual std::string specialize(const KernelSpec& spec, const TileConfig& config) const = 0;
  /// Dynamic shared memory of the configuration's kernels (the largest), emitted as
  /// KILN_DYNAMIC_SHARED_BYTES for the template's static_assert. Default 0.
  virtual uint32_t dynamic_shared_bytes(const KernelSpec& /*spec*/, const TileConfig& /*config*/) const { return 0; }
  /// The kernel that `kiln inspect` reports and names the code object after.
  virtual std::string_view kernel_name(const TileConfig& config) const = 0;

  // ---- a call --------------------------------------------------------------------------------
  /// The launches of one call: `call` holds every parameter, runtime ones included. A call
  /// with a runtime size of 0 plans no launch.
  virtual Plan plan(const KernelSpec& call, const TileConfig& config) const = 0;
  /// Whether a variant can serve a call, as Primus-Turbo's `can_handle`, for the one property of
  /// a call that the spec does not fix: where its buffers start. The base alignment in bytes (a
  /// power of two; 1 = any) that each tensor, in tensors(spec) order, needs for this variant. The
  /// runtime asks once per loaded kernel and checks every call's pointers against it with a mask;
  /// a call the variant cannot take goes to the next variant. Default: 1 for every tensor. gemm's
  /// TMA variant and the 16-byte vector variants of the row ops need 16.
  virtual std::vector<uint32_t> base_alignment(const KernelSpec& spec, const TileConfig& config) const;

  // ---- checking and measuring ----------------------------------------------------------------
  /// Fills the inputs with fresh random values rounded to their dtypes (never zero), in
  /// signature order. Default: uniform in [-1, 1]. Ops override it for scaled or derived inputs
  /// (gemm's B by 1/sqrt(K); rmsnorm_bwd's rstd from x).
  virtual void init_inputs(const KernelSpec& spec, std::span<const TensorInfo> inputs,
                           std::vector<std::vector<float>>& values, std::mt19937_64& rng) const;
  /// CPU reference in fp64 (or fp32-accumulated where the op's algorithm says so) on the
  /// dtype-rounded inputs. Fills one RefOutput per output tensor, in order. `rows` (sorted,
  /// non-empty) asks for a sample of the rows of row-shaped outputs; an op may compute more.
  virtual void reference(const KernelSpec& spec, const Scalars& scalars, std::span<const std::vector<float>> inputs,
                         std::span<const int64_t> rows, std::vector<RefOutput>& outputs) const = 0;
  /// The accuracy gate of an output. Default: Gate::for_dtype.
  virtual Gate gate(const KernelSpec& /*spec*/, const TensorInfo& output) const { return Gate::for_dtype(output.dtype); }
  /// Floating-point operations of a call (GEMM: 2MNK); 0 for memory-bound ops.
  virtual double flops(const KernelSpec& /*spec*/) const { return 0; }
  /// Bytes a call must move: every input read once and every output written once.
  virtual double bytes(const KernelSpec& spec) const;
  /// Small specs that cover the op's paths and tails, for the CPU, emulator and GPU tests.
  virtual std::vector<TestSpec> test_specs(const TargetInfo& target) const = 0;
  /// A short form of the spec's parameters for tables ("4096x4096x4096 NT"); "" (the default):
  /// the parameters as NAME=VALUE in the op's order.
  virtual std::string short_form(const KernelSpec& /*spec*/) const { return ""; }
  /// The row count of the first dimension of the call's row-shaped outputs (for sampling).
  int64_t sample_dimension(const KernelSpec& spec) const;

  // ---- derived from the declarations ---------------------------------------------------------
  /// The tensors of a spec, signature order, absent optional tensors left out.
  std::vector<TensorInfo> tensors(const KernelSpec& spec) const;
  /// The spec with every optional parameter it leaves out set to its default.
  KernelSpec with_defaults(const KernelSpec& spec) const;
  /// with_defaults(spec) with every runtime (non-baked) parameter removed: what the code
  /// depends on.
  KernelSpec baked_spec(const KernelSpec& spec) const;
  /// Value of a scalar, or its default.
  float scalar(const Scalars& scalars, std::string_view name) const;

 protected:
  virtual Result<void> check(const KernelSpec& /*spec*/, const TargetInfo& /*target*/) const { return ok(); }
  /// One launch over all tensors, the runtime parameters as int32 and the scalars: the plan of a
  /// single-kernel op.
  Launch single_launch(const KernelSpec& call, const TileConfig& config, LaunchGeometry geometry) const;
};

/// Rounds `value` up to a multiple of `to`.
constexpr int64_t round_up(int64_t value, int64_t to) { return (value + to - 1) / to * to; }
constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

/// The C++ spelling of a dtype in device code ("float", "kiln::bf16", "kiln::fp8_e4m3", "int").
std::string_view device_type_name(DType t);

}  // namespace kiln
