// Host side of the rotary position embedding ops (rope, rope_bwd): parameters, shapes,
// validation, the fp32 inverse frequencies, configurations, baked constants, the launch, test
// inputs, the fp64 reference and the test specs, as free functions (rope_params::) and as
// RopeOpBase, the OpTemplate both ops derive from. The two ops differ only in the direction of the
// rotation (`sign`: +1 for rope, -1 for rope_bwd, whose rotation by -angle is the inverse of the
// forward's, as the rotation is orthogonal), in their tensors' names and in their kernel's name;
// their device code is the library part lib/rope.kernel. Part of the library (templates/lib/):
// no op folder includes another's. docs/rope.md gives the conventions and the numerics.
#pragma once

#include <array>
#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "templates/op_template.h"

namespace kiln::rope_params {

/// The parameters both ops take, in `kiln ops` order: tokens (runtime), heads, kv_heads,
/// head_dim, rotary_dim, interleaved, positions, batch (runtime), cos_sin, rope_theta, scaling,
/// max_pos (runtime), inplace, q_row_stride and k_row_stride (runtime).
std::span<const ParamInfo> params();
/// bf16, fp16, fp32 (computed in fp32).
std::span<const DType> dtypes();

/// R: rotary_dim, or head_dim when it is 0.
int64_t rotary(const KernelSpec& s);
/// Row strides in elements of the first (q-like) and second (k-like) tensor pair: the parameter,
/// or the contiguous row (heads * head_dim, kv_heads * head_dim) when it is 0.
int64_t q_stride(const KernelSpec& s);
int64_t k_stride(const KernelSpec& s);

// Shapes, presence and documentation of the op's tensors: the two rotated pairs (q and q_out, k
// and k_out; rope_bwd: dq_out and dq, dk_out and dk), cu_seqlens | positions, [cos, sin]. With a
// row stride, a rotated tensor is the memory the kernel spans, [tokens, stride]: the check path
// allocates it, and the reference keeps the columns past heads * head_dim (which the kernel does
// not touch) at their input values.
std::vector<int64_t> q_shape(const KernelSpec& s);
std::vector<int64_t> k_shape(const KernelSpec& s);
std::vector<int64_t> cu_shape(const KernelSpec& s);
std::vector<int64_t> pos_shape(const KernelSpec& s);
std::vector<int64_t> cache_shape(const KernelSpec& s);
bool from_cu_seqlens(const KernelSpec& s);
bool from_tensor(const KernelSpec& s);
bool from_cache(const KernelSpec& s);
bool in_place(const KernelSpec& s);
inline constexpr std::string_view kQDoc = "[tokens, heads, head_dim]; [tokens, q_row_stride] with a stride";
inline constexpr std::string_view kKDoc = "[tokens, kv_heads, head_dim]; [tokens, k_row_stride] with a stride";

/// The signature of both ops, tensors named by the op: the rotated inputs `q` and `k` (rope: q,
/// k; rope_bwd: dq_out, dk_out), cu_seqlens | positions, [cos, sin], then the outputs `q_out` and
/// `k_out` (rope: q_out, k_out; rope_bwd: dq, dk), written over the inputs with inplace.
constexpr std::array<TensorDecl, 8> signature(std::string_view q, std::string_view k, std::string_view q_out,
                                              std::string_view k_out) {
  return {{
      {q, Role::input, DTypeRule::in, DType::f32, kQDoc, q_shape},
      {k, Role::input, DTypeRule::in, DType::f32, kKDoc, k_shape},
      {"cu_seqlens", Role::input, DTypeRule::fixed, DType::i32, "[batch + 1]", cu_shape, from_cu_seqlens,
       "start of each packed sequence, then the total: 0 = c0 <= c1 <= ... <= c_batch = tokens"},
      {"positions", Role::input, DTypeRule::fixed, DType::i32, "[tokens]", pos_shape, from_tensor,
       "position of each token"},
      {"cos", Role::input, DTypeRule::fixed, DType::f32, "[max_pos, rotary_dim/2]", cache_shape, from_cache,
       "cos(pos * inv_freq[i])"},
      {"sin", Role::input, DTypeRule::fixed, DType::f32, "[max_pos, rotary_dim/2]", cache_shape, from_cache,
       "sin(pos * inv_freq[i])"},
      {q_out, Role::output, DTypeRule::out, DType::f32, kQDoc, q_shape, nullptr, "", q, in_place},
      {k_out, Role::output, DTypeRule::out, DType::f32, kKDoc, k_shape, nullptr, "", k, in_place},
  }};
}

/// The fp32 inverse frequencies theta^(-i/R), i = 0, 2, ..., R - 2, with Llama-3.1's scaling
/// when `scaling` is 1: every step in fp32, as transformers' RotaryEmbedding (rope_init_fn,
/// modeling_rope_utils.py). The kernel (baked) and the reference use these values.
std::vector<float> inv_freq(int64_t rotary_dim, int64_t theta, int64_t scaling);

/// The rules of both ops for `spec` as given and `s`, the same with its defaults; `op` names the
/// op in messages. Errors: rotary_dim above head_dim or
/// odd, rope_theta or scaling with cos_sin = cache, a row stride below the contiguous row, out of
/// place, or not a multiple of the 16-byte vector.
Result<void> validate_rules(std::string_view op, const KernelSpec& spec, const KernelSpec& s);
/// The 16-byte vector configuration where every access of a head stays whole, then the scalar
/// one (VEC, PV pairs per chunk, CTH chunk threads, THREADS).
std::vector<KernelConfig> variants(const KernelSpec& spec);
/// The rotated tensors VEC elements at a time; the index tensors and caches one by one.
std::vector<uint32_t> base_alignment(std::vector<uint32_t> vector_alignment);
/// The baked constants of lib/rope.kernel's callers: shape, direction `sign`, configuration,
/// dtypes, and with cos_sin = computed rope_fill_inv_freq (the inverse frequencies as stores of
/// immediates).
std::string specialize(const KernelSpec& spec, const KernelConfig& config, int sign);
/// One block per token, THREADS threads.
LaunchGeometry geometry(const KernelSpec& call, const KernelConfig& config);
/// The op's one launch (`single_launch`'s: the tensors, then tokens, batch, max_pos and the row
/// strides) with the strides resolved (0: the contiguous row).
Plan plan(const KernelSpec& call, Launch launch);

/// After the default inputs: random cu_seqlens cut points (empty sequences allowed), or positions
/// up to Llama-3.1's 131072-token context (with a cache, a few past it, which clamp).
void init_positions(const KernelSpec& spec, std::vector<std::vector<float>>& values, std::mt19937_64& rng);
/// The fp64 rotation by `sign` * angle of the sampled tokens (every token when `sample` is empty).
void reference(const KernelSpec& spec, int sign, std::span<const std::vector<float>> in,
               std::span<const int64_t> sample, std::vector<RefOutput>& outputs);
/// The test specs of op `op`: both layouts, partial rotary, caches, positions to 131071, in place,
/// row strides of a fused qkv, no tokens.
std::vector<TestSpec> test_specs(std::string_view op);
/// The spec without its row strides: the bytes the kernel moves are the rows, not the columns
/// between them.
KernelSpec without_strides(const KernelSpec& spec);
/// "tokens x [Hq+Hkv] x D rR rotate-half|interleaved".
std::string short_form(const KernelSpec& spec);

}  // namespace kiln::rope_params

namespace kiln {

/// Everything of rope and rope_bwd but their name, summary, signature (tensor names), device
/// template, kernel name and direction, which the op classes give (templates/rope/rope.h,
/// templates/rope_bwd/rope_bwd.h). The plan launches kernel_name().
class RopeOpBase : public OpTemplate {
 public:
  std::span<const ParamInfo> params() const override { return rope_params::params(); }
  std::span<const DType> dtypes() const override { return rope_params::dtypes(); }
  std::vector<KernelConfig> variants(const KernelSpec& spec, const TargetInfo& target) const override;
  std::string specialize(const KernelSpec& spec, const KernelConfig& config) const override;
  Plan plan(const KernelSpec& call, const KernelConfig& config) const override;
  std::vector<uint32_t> base_alignment(const KernelSpec& spec, const KernelConfig& config) const override;
  void init_inputs(const KernelSpec& spec, std::span<const TensorInfo> inputs, std::vector<std::vector<float>>& values,
                   std::mt19937_64& rng) const override;
  void reference(const KernelSpec& spec, const Scalars& scalars, std::span<const std::vector<float>> inputs,
                 std::span<const int64_t> rows, std::vector<RefOutput>& outputs) const override;
  std::vector<TestSpec> test_specs(const TargetInfo& target) const override;
  /// The rows the kernel reads and writes, not the columns between them.
  double bytes(const KernelSpec& spec) const override;
  std::string short_form(const KernelSpec& spec) const override;

 protected:
  /// The direction: +1 rotates by the angle (rope), -1 by its negative (rope_bwd).
  virtual int sign() const = 0;
  Result<void> validate_rules(const KernelSpec& spec, const TargetInfo& target) const override;
};

}  // namespace kiln
