// OpInterface: what an op is (op contract v3, part 1 of 3). Its name, its integer parameters
// (baked into the code, or runtime kernel arguments) and fp32 scalars, its dtypes and its typed
// signature (inputs and outputs, each with its dtype and a shape in the parameters, optionally
// present only for some parameter values), and the validation of a request. Part 2,
// templates/op_codegen.h, generates and plans its kernels; part 3, templates/op_testing.h, checks
// and measures them; templates/op_template.h joins the three into OpTemplate, the class an op
// derives from. docs/adding-an-op.md walks through a new op.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
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
  /// At its default value, left out of baked_spec(): of the generated source's first line, and so
  /// of the cache key. For an optional parameter added to an op whose kernels are already cached
  /// and listed in manifests (rmsnorm's fp8_out): specs without it keep their code and keys.
  bool unkeyed_default = false;
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
  derived,  ///< TensorDecl::derive(spec), described by TensorDecl::dtype_doc (gemm_fp8's B, whose
            ///< fp8 format is a parameter: e5m2 beside an e4m3 A in a hybrid GEMM)
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
  /// In-place operation: an output written over the input named here (same shape and dtype;
  /// Liger-Kernel's cross-entropy writes dlogits over the logits, rope its outputs over q and k),
  /// when `in_place(spec)` holds (nullptr: always). The caller passes that input's buffer for both
  /// tensors (Kernel::launch refuses two different ones); the check path allocates one buffer,
  /// holding the input, and compares it with the output's reference after the launch. Empty: the
  /// output has a buffer of its own.
  std::string_view overwrites = {};
  bool (*in_place)(const KernelSpec&) = nullptr;
  /// With DTypeRule::derived: the tensor's dtype for a spec, and its description for `kiln ops`
  /// ("fp8 format b_format in dtype's encoding").
  DType (*derive)(const KernelSpec&) = nullptr;
  std::string_view dtype_doc = {};
};

/// One tensor argument of a concrete spec, in signature order (inputs before outputs).
struct TensorInfo {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  bool output;
  /// An output written over an input (TensorDecl::overwrites): the input's index in tensors();
  /// -1: the output has its own buffer.
  int overwrites = -1;
  int64_t elements() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  uint64_t bytes() const { return static_cast<uint64_t>(elements()) * dtype_size(dtype); }
};

/// Runtime fp32 arguments by name; missing ones take ScalarInfo::default_value.
using Scalars = std::map<std::string, float>;


class OpInterface {
 public:
  virtual ~OpInterface() = default;

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
  /// ops add their own rules in validate_rules(). Messages name the parameter and what would work.
  Result<void> validate(const KernelSpec& spec, const TargetInfo& target) const;

  // ---- derived from the declarations ---------------------------------------------------------
  /// The tensors of a spec, signature order, absent optional tensors left out.
  std::vector<TensorInfo> tensors(const KernelSpec& spec) const;
  /// The spec with every optional parameter it leaves out set to its default.
  KernelSpec with_defaults(const KernelSpec& spec) const;
  /// with_defaults(spec) with every runtime (non-baked) parameter removed, and every parameter
  /// marked unkeyed_default that has its default: what the code depends on.
  KernelSpec baked_spec(const KernelSpec& spec) const;
  /// Value of a scalar, or its default.
  float scalar(const Scalars& scalars, std::string_view name) const;

 protected:
  /// The op's own rules beyond the declarations (validate() calls it last). Default: none.
  virtual Result<void> validate_rules(const KernelSpec& /*spec*/, const TargetInfo& /*target*/) const { return ok(); }
};

}  // namespace kiln
