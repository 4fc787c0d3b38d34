// Host helpers of the token-embedding ops (embedding, embedding_bwd): the ids parameter and
// tensor, shapes, the row configuration and variants, test token ids and test specs. Part of the
// library (templates/lib/): no op folder includes another's. Header-only (inline).
#pragma once

#include <algorithm>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "templates/op_template.h"

namespace kiln::embedding_params {

inline constexpr int64_t kInt32Max = (int64_t{1} << 31) - 1;
inline constexpr std::string_view kIdTypes[] = {"int32", "int64"};
enum IdsDType : int64_t { kIds32 = 0, kIds64 = 1 };

/// ids_dtype: int32 or int64, the default: PyTorch's token ids are torch.long, so a PyTorch
/// caller's tensors need no cast. int32 reads half the id bytes; examples/llama_step and the
/// manifests use it and name it (docs/embedding.md).
constexpr ParamInfo ids_dtype_param() {
  return {"ids_dtype", "dtype of ids: int32 or int64 (default, as PyTorch's token ids)", true, false, 0, 1, kIdTypes,
          kIds64};
}
inline const DType kDTypes[] = {DType::bf16, DType::f16, DType::f32};

inline std::vector<int64_t> tokens(const KernelSpec& s) { return {s.param("tokens")}; }
inline std::vector<int64_t> vocab_hidden(const KernelSpec& s) { return {s.param("vocab"), s.param("hidden")}; }
inline std::vector<int64_t> tokens_hidden(const KernelSpec& s) { return {s.param("tokens"), s.param("hidden")}; }
inline bool ids32(const KernelSpec& s) { return s.param("ids_dtype") == kIds32; }
inline bool ids64(const KernelSpec& s) { return s.param("ids_dtype") == kIds64; }
/// ids [tokens] is one of two declarations (int32 or int64): a tensor's dtype is fixed per
/// declaration. Both come first in each op's signature, the int32 one first.
constexpr TensorDecl ids_decl(IdsDType t) {
  if (t == kIds32)
    return {"ids", Role::input, DTypeRule::fixed, DType::i32, "[tokens]", tokens, ids32, "token ids (ids_dtype = int32)"};
  return {"ids", Role::input, DTypeRule::fixed, DType::i64, "[tokens]", tokens, ids64, "token ids (ids_dtype = int64)"};
}

/// Up to 256 threads of at most 2 accesses each per block (as the elementwise row ops) over rows
/// of `columns` elements, VEC at a time.
inline KernelConfig row_config(int64_t columns, int64_t vec, const TargetInfo& target) {
  const int64_t nvec = ceil_div(columns, vec);
  const int64_t threads = std::clamp<int64_t>(round_up(ceil_div(nvec, 2), target.wave_size), target.wave_size, 256);
  const int64_t items = std::clamp<int64_t>(ceil_div(nvec, threads), 1, 2);
  return {{"THREADS", threads}, {"VEC", vec}, {"ITEMS", items}};
}
/// 16-byte vector accesses when hidden is a multiple of the vector, then one element at a time.
inline std::vector<KernelConfig> variants(const KernelSpec& spec, const TargetInfo& target) {
  const int64_t hidden = spec.param("hidden"), vec = 16 / static_cast<int64_t>(dtype_size(spec.dtype));
  std::vector<KernelConfig> out;
  if (hidden % vec == 0) out.push_back(row_config(hidden, vec, target));
  out.push_back(row_config(hidden, 1, target));
  return out;
}

/// Token ids as a training batch has them: a quarter from a few frequent ids (repeated ids),
/// the rest uniform over the vocabulary (most ids never seen when vocab > tokens), and every 61st
/// token (from the 31st) out of range, alternately -1 and vocab (forward: a row of zeros;
/// backward: no contribution).
inline void init_ids(int64_t vocab, std::vector<float>& ids, std::mt19937_64& rng) {
  std::uniform_int_distribution<int64_t> any(0, vocab - 1), hot(0, std::min<int64_t>(vocab, 8) - 1);
  std::uniform_int_distribution<int> quarter(0, 3);
  for (size_t t = 0; t < ids.size(); ++t) {
    int64_t id = quarter(rng) == 0 ? hot(rng) : any(rng);
    if (t % 61 == 30) id = (t / 61) % 2 ? vocab : -1;
    ids[t] = static_cast<float>(id);
  }
}

/// One test spec of op `op`.
inline TestSpec test_spec(std::string_view op, DType t, int64_t tokens, int64_t vocab, int64_t hidden, int64_t ids,
                          std::string_view why) {
  return {{std::string(op), t, t, {{"tokens", tokens}, {"vocab", vocab}, {"hidden", hidden}, {"ids_dtype", ids}}}, why};
}

}  // namespace kiln::embedding_params
