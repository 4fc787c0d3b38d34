// kiln manifest: write the kernel manifest of a model's training step; --list shows the models.
#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "templates/registry.h"
#include "tools/kiln/cli.h"
#include "tools/kiln/models.h"

namespace kiln::cli {
namespace {

struct ManifestOptions {
  std::string model;
  std::vector<int64_t> micro_batches;
  int64_t seq = 0;
  std::string dtype = "bf16";
  std::string fp8;  ///< --fp8 GRAN: also the quantization kernels of an fp8 step
  int64_t experts_per_rank = 0;  ///< MoE models: local experts (0: the model's first listed)
  std::string output;
  bool list = false;
  bool json = false;  ///< --list as one JSON document (docs/json.md)
};

int list_models(const ModelTable& table) {
  fmt::print("Models (models/models.json, built in)\n");
  Table t({"model", "hidden", "intermediate", "heads", "kv_heads", "head_dim", "vocab", "seq"});
  for (const Model& m : table.models)
    if (!m.moe)
      t.add({m.name, std::to_string(m.hidden), std::to_string(m.intermediate), std::to_string(m.heads),
             std::to_string(m.kv_heads), std::to_string(m.head_dim), std::to_string(m.vocab), std::to_string(m.seq)});
  fmt::print("{}\n", t.render({1, 2, 3, 4, 5, 6, 7}, "  "));
  fmt::print("Mixture-of-experts models (the FFN of every layer routed; --experts-per-rank G, default the first):\n");
  Table e({"model", "hidden", "experts", "topk", "moe_intermediate", "experts_per_rank", "attention", "vocab", "seq"});
  for (const Model& m : table.models)
    if (m.moe)
      e.add({m.name, std::to_string(m.hidden), std::to_string(m.experts), std::to_string(m.topk),
             std::to_string(m.moe_intermediate), fmt::format("{}", fmt::join(m.experts_per_rank, ",")),
             m.mla ? fmt::format("MLA {}/{} x {}", m.head_dim, m.head_dim_v, m.heads)
                   : fmt::format("GQA {}/{} x {}", m.heads, m.kv_heads, m.head_dim),
             std::to_string(m.vocab), std::to_string(m.seq)});
  fmt::print("{}\n", e.render({1, 2, 3, 4, 7, 8}, "  "));
  fmt::print("Per-layer GEMMs, forward y[M,N] = x[M,K] @ W[N,K]^T (gemm trans_b), M = seq * micro_batch:\n");
  for (const auto& [name, formula] : table.gemms) fmt::print("  {:<9} {}\n", name, formula);
  fmt::print(
      "Each also as dgrad dx[M,K] = dy[M,N] @ W[N,K] (gemm M=M N=K K=N, NN) and wgrad dW[N,K] = dy[M,N]^T @ x[M,K] "
      "(gemm M=N N=K K=M, trans_a);\nplus rmsnorm {{rows=M, hidden}} and swiglu {{rows=M, intermediate}}, forward and "
      "backward.\nWith --fp8 GRAN ({}): quantize_fp8 of each GEMM's x [M,K] and W [N,K] to e4m3 and dy [M,N] to e5m2,\n"
      "with x^T, W^T and dy^T for the dgrad and wgrad GEMMs (not lm_head; docs/manifest.md).\n",
      fmt::join(fp8_recipe_names(), ", "));
  return 0;
}

// --list --json (docs/json.md, kiln.manifest.list).
int list_models_json(const ModelTable& table) {
  nlohmann::json doc = {{"schema", "kiln.manifest.list"}, {"schema_version", 1}};
  doc["models"] = nlohmann::json::array();
  doc["moe_models"] = nlohmann::json::array();
  for (const Model& m : table.models) {
    nlohmann::json j = {{"name", m.name}, {"hidden", m.hidden}, {"intermediate", m.intermediate},
                        {"heads", m.heads}, {"kv_heads", m.kv_heads}, {"head_dim", m.head_dim},
                        {"vocab", m.vocab}, {"seq", m.seq}};
    if (!m.moe) {
      doc["models"].push_back(std::move(j));
      continue;
    }
    j.erase("intermediate");
    j.update({{"experts", m.experts}, {"topk", m.topk}, {"moe_intermediate", m.moe_intermediate},
              {"experts_per_rank", m.experts_per_rank}, {"mla", m.mla}, {"head_dim_v", m.head_dim_v}});
    doc["moe_models"].push_back(std::move(j));
  }
  doc["gemms"] = nlohmann::json::array();
  for (const auto& [name, formula] : table.gemms) doc["gemms"].push_back({{"name", name}, {"formula", formula}});
  doc["fp8"] = nlohmann::json::array();  // the --fp8 values
  for (std::string_view name : fp8_recipe_names()) doc["fp8"].push_back(std::string(name));
  fmt::print("{}\n", doc.dump(2, ' ', false, nlohmann::json::error_handler_t::replace));
  return 0;
}

int run_manifest(const ManifestOptions& o) {
  auto table = load_models();
  if (!table) return fail(table.error());
  if (o.json && !o.list) return fail("--json goes with --list (a manifest is JSON already)", 2);
  if (o.list) return o.json ? list_models_json(*table) : list_models(*table);
  if (o.model.empty()) return fail("give a model (see 'kiln manifest --list'), or --list", 2);
  auto model = find_model(*table, o.model);
  if (!model) return fail(model.error());
  auto dtype = parse_dtype(o.dtype);
  if (!dtype) return fail("--dtype: " + dtype.error().message);
  std::optional<Fp8Recipe> fp8;
  if (!o.fp8.empty()) {
    auto recipe = parse_fp8_recipe(o.fp8);
    if (!recipe) return fail(recipe.error(), 2);
    fp8 = std::move(recipe).value();
  }
  std::vector<int64_t> mbs = o.micro_batches.empty() ? std::vector<int64_t>{1} : o.micro_batches;
  std::vector<int64_t> unique;
  for (int64_t mb : mbs) {
    if (mb < 1) return fail(fmt::format("--micro-batch {}: a micro batch is at least 1", mb));
    if (std::find(unique.begin(), unique.end(), mb) == unique.end()) unique.push_back(mb);
  }
  if (o.seq < 0) return fail(fmt::format("--seq {}: the sequence length is at least 1", o.seq));
  const int64_t seq = o.seq ? o.seq : model->seq;
  if (o.experts_per_rank != 0) {
    if (!model->moe)
      return fail(fmt::format("--experts-per-rank goes with a mixture-of-experts model; {} is dense", o.model), 2);
    if (o.experts_per_rank < 1 || model->experts % o.experts_per_rank != 0)
      return fail(fmt::format("--experts-per-rank {}: {} has {} experts; give a divisor of {} (models.json lists {})",
                              o.experts_per_rank, o.model, model->experts, model->experts,
                              fmt::join(model->experts_per_rank, ", ")),
                  2);
  }
  Manifest manifest = training_manifest(*model, unique, seq, *dtype, fp8, o.experts_per_rank);
  // Every kernel must be buildable for every target (fp8 in the target's encoding), or prewarm
  // would fail later.
  for (const ManifestEntry& e : manifest.kernels) {
    auto op = find_op(e.spec.op);
    if (!op) return fail(op.error());
    for (const TargetInfo& t : all_targets())
      if (auto valid = (*op)->validate(manifest_spec_for_target(e.spec, t), t); !valid)
        return fail(fmt::format("{} (seq {}, micro batch {}): {}: {}", o.model, seq, fmt::join(unique, ","), e.label,
                                valid.error().message));
  }

  const std::string text = write_manifest(manifest);
  if (o.output.empty() || o.output == "-") {
    fmt::print("{}", text);
    return 0;
  }
  {
    std::ofstream f(o.output, std::ios::binary | std::ios::trunc);
    if (!f) return fail(fmt::format("cannot write '{}': {}", o.output, std::strerror(errno)));
    f << text;
    f.close();
    if (!f) return fail(fmt::format("cannot write '{}': {}", o.output, std::strerror(errno)));
  }
  std::map<std::string, size_t> per_op;
  for (const ManifestEntry& e : manifest.kernels) ++per_op[e.spec.op];
  std::vector<std::string> counts;
  for (const OpTemplate* op : all_ops())
    if (auto it = per_op.find(std::string(op->name())); it != per_op.end()) counts.push_back(fmt::format("{} {}", it->second, it->first));
  fmt::print("wrote {}: {} kernels ({}) for {} (seq {}, micro batch {}, {}{})\n", o.output, manifest.kernels.size(),
             fmt::join(counts, ", "), o.model, seq, fmt::join(unique, ","), dtype_name(*dtype),
             fp8 ? ", fp8 " + fp8->name : "");
  return 0;
}

}  // namespace

Command add_manifest_command(CLI::App& app) {
  auto o = std::make_shared<ManifestOptions>();
  auto* cmd = app.add_subcommand("manifest", "Write the kernel manifest of a model's training step (for prewarm)");
  cmd->add_option("model", o->model, "Model name (see --list)");
  cmd->add_option("-b,--micro-batch", o->micro_batches,
                  "Micro batch size(s); M = seq * micro_batch; several give kernels for each (default 1)")
      ->delimiter(',');
  cmd->add_option("--seq", o->seq, "Sequence length (default: the model's)");
  cmd->add_option("--dtype", o->dtype, "Dtype of every kernel: bf16, fp16 or fp32")->capture_default_str();
  cmd->add_option("--fp8", o->fp8,
                  "Also the fp8 quantization kernels of the step (quantize_fp8 of every GEMM's x, W: e4m3, dy: e5m2, "
                  "with the transposes): tensorwise, rowwise, block (1x128 activations, 128x128 weights), "
                  "block1x128 or block128x128")
      ->option_text("GRAN");
  cmd->add_option("--experts-per-rank", o->experts_per_rank,
                  "Mixture-of-experts models: the experts on this rank, a divisor of the model's experts (default: "
                  "the first of models.json's experts_per_rank)")
      ->option_text("G");
  cmd->add_option("-o,--output", o->output, "Output file (default: stdout)");
  cmd->add_flag("--list", o->list, "List the known models and the GEMM formulas");
  cmd->add_flag("--json", o->json, "With --list: one JSON document on stdout (schema: docs/json.md)");
  return [o] { return run_manifest(*o); };
}

}  // namespace kiln::cli
