// Model architectures (models/models.json, compiled into the binary) and the kernels of one
// training step derived from them.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/dtype.h"
#include "kiln/manifest.h"
#include "kiln/result.h"

namespace kiln::cli {

struct Model {
  std::string name;
  int64_t hidden = 0, intermediate = 0, heads = 0, kv_heads = 0, head_dim = 0, vocab = 0, seq = 0;
};

struct ModelTable {
  std::string about;                                        ///< models.json's "_about".
  std::vector<Model> models;                                ///< In file order.
  std::vector<std::pair<std::string, std::string>> gemms;   ///< Per-layer GEMM formulas, by name.
  std::string gemms_about;
};

/// The embedded table. Errors: Errc::corrupt (a build problem: models.json is missing or malformed).
Result<ModelTable> load_models();
/// Finds a model by name; the error lists the known models.
Result<Model> find_model(const ModelTable& table, const std::string& name);

/// The kernels of a training step: per layer, for qkv, attn_out, gate_up, down and lm_head the
/// forward (NT), dgrad (NN) and wgrad (TN) GEMMs, plus rmsnorm and swiglu; for each micro batch
/// (M = seq * micro_batch); identical kernels once, labels joined with '+'.
Manifest training_manifest(const Model& model, const std::vector<int64_t>& micro_batches, int64_t seq, DType dtype);

}  // namespace kiln::cli
