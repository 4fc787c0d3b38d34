// Model architectures (models/models.json, compiled into the binary) and the kernels of one
// training step derived from them.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/dtype.h"
#include "kiln/manifest.h"
#include "kiln/result.h"

namespace kiln::cli {

struct Model {
  std::string name;
  int64_t hidden = 0, intermediate = 0, heads = 0, kv_heads = 0, head_dim = 0, vocab = 0, seq = 0;
  int64_t rope_theta = 10000;  ///< RoPE base (models.json "rope_theta"; 10000 when absent)
  bool llama3_rope = false;    ///< Llama-3.1's RoPE frequency scaling (models.json "rope_scaling": "llama3")
  int64_t head_dim_v = 0;      ///< V's head dim where it differs from head_dim (MLA: 128), else 0
  bool mla = false;            ///< DeepSeek's multi-head latent attention (models.json "mla")
  /// Mixture of experts (models.json "moe"): every layer's FFN is routed to `experts` experts, topk
  /// per token, each a SwiGLU of width moe_intermediate; experts_per_rank lists the local expert
  /// counts (the first is the default; `intermediate` is 0 for these models).
  bool moe = false;
  int64_t experts = 0, topk = 0, moe_intermediate = 0;
  std::vector<int64_t> experts_per_rank;
  int64_t scoring = 0;      ///< moe_router: 0 softmax, 1 sigmoid
  bool bias = false;        ///< DeepSeek-V3's score-correction bias
  int64_t n_group = 1, topk_group = 0, group_score = 0;  ///< moe_router's group limit (group_score 1: top2_sum)
  bool renormalize = false;
};

struct ModelTable {
  std::string about;                                        ///< models.json's "_about".
  std::vector<Model> models;                                ///< In file order: dense, then moe.
  std::vector<std::pair<std::string, std::string>> gemms;   ///< Per-layer GEMM formulas, by name.
  std::string gemms_about;
};

/// The embedded table. Errors: Errc::corrupt (a build problem: models.json is missing or malformed).
Result<ModelTable> load_models();
/// Finds a model by name; the error lists the known models.
Result<Model> find_model(const ModelTable& table, const std::string& name);

/// The fp8 recipe of `kiln manifest --fp8 GRAN` (docs/manifest.md): which quantize_fp8
/// granularity (Fp8Granularity, templates/quantize_fp8) the activations x, the weights W and the
/// output gradients dy of each GEMM are quantized with. The formats are the "hybrid" recipe's:
/// e4m3 for x and W (forward operands), e5m2 for dy.
struct Fp8Recipe {
  std::string name;  ///< The --fp8 value, canonical: "tensorwise", "rowwise", "block", ...
  int64_t activations = 0, weights = 0, gradients = 0;
};

/// The --fp8 values, in order: tensorwise, rowwise, block (1x128 activations and gradients,
/// 128x128 weights, as DeepGEMM and Primus-Turbo), block1x128, block128x128 (every tensor).
std::span<const std::string_view> fp8_recipe_names();
/// Parses an --fp8 value (one of fp8_recipe_names()). Errors: Errc::invalid_argument, naming
/// the value and the choices.
Result<Fp8Recipe> parse_fp8_recipe(std::string_view name);

/// The kernels of a training step (exactly those examples/llama_step launches): per layer, for
/// qkv, attn_out, gate_up, down and lm_head the forward (NT), dgrad (NN) and wgrad (TN, fp32
/// gradients) GEMMs; rmsnorm (plain, and with the fused residual add) and rmsnorm_bwd (plain, and
/// adding the residual stream's gradient); rope and attention on views of the fused qkv (packed
/// sequences, causal) and their backward; swiglu and swiglu_bwd; the token embedding and
/// cross-entropy (int32 ids and targets) and their backward; for each micro batch
/// (M = seq * micro_batch); identical kernels once, labels joined with '+'. With an fp8 recipe,
/// also the quantize_fp8 kernels of every GEMM's x, W and dy (not lm_head's, which stays in
/// `dtype`), with the transposed forms the dgrad and wgrad GEMMs read, and the layer GEMMs as
/// gemm_fp8 (docs/manifest.md).
/// A Mixture-of-Experts model (Model::moe) replaces gate_up, down and swiglu by its MoE FFN: the
/// router GEMM, moe_router, moe_permute, the grouped GEMMs of gate_up and down (forward nt,
/// dgrad nn, wgrad tn), swiglu, moe_unpermute and their backward, for `experts_per_rank` local
/// experts (0: the model's first). An MLA model (Model::mla) lists the attention core only (no
/// qkv/attn_out GEMMs, no rope: not Kiln ops) and says so in `about`.
Manifest training_manifest(const Model& model, const std::vector<int64_t>& micro_batches, int64_t seq, DType dtype,
                           const std::optional<Fp8Recipe>& fp8 = std::nullopt, int64_t experts_per_rank = 0);

}  // namespace kiln::cli
