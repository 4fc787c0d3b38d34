// Host helpers of the cross-entropy ops (cross_entropy, cross_entropy_bwd): the parameters both
// take, the scalars, shapes, the targets tensor, the vector width, test logits and targets and
// the test specs. Part of the library (templates/lib/): no op folder includes another's.
// Header-only (inline).
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "templates/op_template.h"

namespace kiln::cross_entropy_params {

inline constexpr std::string_view kTargetDTypes[] = {"int64", "int32"};
enum TargetDType : int64_t { kTargets64 = 0, kTargets32 = 1 };

// The parameters both ops take, in this order, then the op's own (cross_entropy: split_rows;
// cross_entropy_bwd: inplace). `ignored` and `z_loss` say what the op does with an ignored
// token and with the z-loss.
constexpr ParamInfo tokens_param() {
  return {"tokens", "rows of the logits; a runtime argument, not baked; 0 is a no-op", false, false, 0,
          (int64_t{1} << 31) - 1};
}
constexpr ParamInfo vocab_param() {
  return {"vocab", "classes: the logits' last dimension", true, false, 1, int64_t{1} << 24};
}
// target_dtype: int64 by default, what F.cross_entropy takes (torch.long), so a PyTorch caller's
// targets need no cast; int32 reads half the bytes (examples/llama_step and the manifests name
// it; docs/cross-entropy.md).
constexpr ParamInfo target_dtype_param() {
  return {"target_dtype", "dtype of the targets: int64 (PyTorch's) or int32", true, false, 0, 1, kTargetDTypes,
          kTargets64};
}
inline constexpr int64_t kIgnoreIndex = -100;  // PyTorch's default
constexpr ParamInfo ignore_index_param(std::string_view doc) {
  return {"ignore_index", doc, true, false, std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max(),
          {}, kIgnoreIndex};
}
// The target value left out of the loss, kIgnoreIndex where the spec leaves it out (KernelSpec::param
// reads an absent parameter as 0, a class).
inline int64_t ignore_index(const KernelSpec& spec) { return spec.param("ignore_index", kIgnoreIndex); }
constexpr ParamInfo smoothing_param() {
  return {"smoothing", "label smoothing with weight label_smoothing (PyTorch's definition)", true, true, 0, 1, {}, 0};
}
constexpr ParamInfo z_loss_param(std::string_view doc) { return {"z_loss", doc, true, true, 0, 1, {}, 0}; }

inline const ScalarInfo kScalars[] = {
    {"label_smoothing", 0.1f, "with smoothing: the weight s of the uniform distribution, in [0, 1]"},
    {"z_loss_weight", 1e-4f, "with z_loss: the weight z of lse^2 (PaLM: 1e-4)"},
};
inline const DType kDTypes[] = {DType::bf16, DType::f16, DType::f32};

inline std::vector<int64_t> tokens_vocab(const KernelSpec& s) { return {s.param("tokens"), s.param("vocab")}; }
inline std::vector<int64_t> tokens(const KernelSpec& s) { return {s.param("tokens")}; }
inline bool int64_targets(const KernelSpec& s) { return s.param("target_dtype") == kTargets64; }
inline bool int32_targets(const KernelSpec& s) { return s.param("target_dtype") == kTargets32; }
/// targets [tokens]: one tensor, int64 or int32 as target_dtype says (two declarations, one
/// present; a tensor's dtype is fixed per declaration). The int64 one first.
constexpr TensorDecl targets_decl(TargetDType t) {
  if (t == kTargets64)
    return {"targets", Role::input, DTypeRule::fixed, DType::i64, "[tokens]", tokens, int64_targets, "class ids (int64)"};
  return {"targets", Role::input, DTypeRule::fixed, DType::i32, "[tokens]", tokens, int32_targets, "class ids (int32)"};
}

/// The op's configurations for rows of vocab elements: `row_config(vocab, vec)` with 16-byte
/// accesses when vocab is a multiple of the vector, then with one element per access.
template <class RowConfig>
std::vector<KernelConfig> vector_then_scalar(const KernelSpec& spec, RowConfig row_config) {
  const int64_t vocab = spec.param("vocab");
  const int64_t vec = 16 / static_cast<int64_t>(dtype_size(spec.dtype));
  std::vector<KernelConfig> out;
  if (vocab % vec == 0) out.push_back(row_config(vocab, vec));
  out.push_back(row_config(vocab, 1));
  return out;
}

/// Logits [tokens, vocab] (`elements` of them) uniform in [-4, 4], rounded to `t`, never 0:
/// probabilities spread over about e^8, as trained models'.
inline void init_logits(std::vector<float>& logits, int64_t elements, DType t, std::mt19937_64& rng) {
  fill_random(logits, static_cast<size_t>(elements), rng, [t](std::mt19937_64& g) {
    std::uniform_real_distribution<float> u(-4.0f, 4.0f);
    const float v = round_to_dtype(u(g), t);
    return v == 0.0f ? 0.25f : v;
  });
}

/// Targets in [1, vocab) (never 0, as every input), and always the second token ignored:
/// ignored tokens are covered whenever there are two. Of the others, one in six is ignored in
/// test-sized calls and one in 128 in benchmark-sized ones (above 64 tokens), so that a
/// benchmark moves nearly every byte that its GB/s counts (an ignored row's logits are not read).
inline void init_targets(const KernelSpec& spec, std::vector<float>& targets, std::mt19937_64& rng) {
  const int64_t n = spec.param("tokens"), vocab = spec.param("vocab"), ignore = ignore_index(spec);
  std::uniform_int_distribution<int64_t> cls(1, std::max<int64_t>(vocab - 1, 1));
  std::uniform_int_distribution<int> one_in(0, n > 64 ? 127 : 5);
  targets.resize(static_cast<size_t>(n));
  for (size_t i = 0; i < targets.size(); ++i) {
    const bool ignored = vocab == 1 || i == 1 || one_in(rng) == 0;
    targets[i] = static_cast<float>(ignored ? ignore : cls(rng));
  }
}

/// dloss [tokens]: positive and negative upstream gradients, never 0.
inline void init_dloss(int64_t tokens, std::vector<float>& dloss, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> du(0.5f, 2.0f);
  std::bernoulli_distribution sign(0.5);
  dloss.clear();
  for (int64_t i = 0; i < tokens; ++i) dloss.push_back(sign(rng) ? du(rng) : -du(rng));
}

/// The fp64 reference of dlogits_j for one logit x (class j) of a row with target t and log-sum-exp
/// lse: dloss (exp(x - lse) (1 + 2 z lse) - s / vocab - (1 - s) [j == t]); 0 for an ignored row,
/// NaN for a target outside [0, vocab).
inline double grad_reference(double dloss, double x, double lse, int64_t j, int64_t t, int64_t vocab,
                             int64_t ignore, double s, double z) {
  if (t == ignore) return 0;
  if (t < 0 || t >= vocab) return std::numeric_limits<double>::quiet_NaN();
  return dloss * (std::exp(x - lse) * (1 + 2 * z * lse) - s / double(vocab) - (j == t ? 1 - s : 0.0));
}

/// One test spec of op `op`, with the op's own parameter `own` (split_rows or inplace).
inline TestSpec test_spec(std::string_view op, DType t, int64_t tokens, int64_t vocab, int64_t target_dtype,
                          int64_t smoothing, int64_t z, std::pair<const char*, int64_t> own, std::string_view why) {
  return {{std::string(op), t, t,
           {{"tokens", tokens}, {"vocab", vocab}, {"target_dtype", target_dtype}, {"smoothing", smoothing},
            {"z_loss", z}, {own.first, own.second}}},
          why};
}

}  // namespace kiln::cross_entropy_params
