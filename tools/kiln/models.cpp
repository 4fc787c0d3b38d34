// Model table (embedded models/models.json) and training-step kernels.
#include "tools/kiln/models.h"

#include <fmt/format.h>

#include <tuple>

#include <nlohmann/json.hpp>

#include "support/embedded.h"
#include "support/fs.h"
#include "templates/lib/fp8_scaling.h"

namespace kiln::cli {
namespace {

using json = nlohmann::ordered_json;

struct Gemm {
  const char* name;
  int64_t n, k;
  bool fp8;  ///< Quantized in an fp8 step (lm_head is not: it stays in the step's dtype).
  /// The kernel that writes the GEMM's input x (forward A) and the gradient of its output dy
  /// (dgrad A) can write them in fp8 too (a fused output): rmsnorm's y for qkv and gate_up,
  /// swiglu's y for down; rmsnorm_bwd's dx for attn_out and down, swiglu_bwd's dx for gate_up.
  /// attention's output (attn_out's x) and attention_bwd + rope_bwd's dqkv (qkv's dy) have none.
  bool x_fused = false, dy_fused = false;
};

constexpr std::string_view kFp8Recipes[] = {"tensorwise", "rowwise", "block", "block1x128", "block128x128"};

/// quantize_fp8 writes the transposed output (qt) only where one scale covers a group of rows
/// and columns alike; the other granularities quantize a transposed tensor with a call of its own.
bool transposes_in_place(int64_t granularity) {
  return granularity == kTensorwise || granularity == kBlock128x128;
}

/// A fused fp8 output serves a granularity whose scales one row gives (rowwise, 1x128). Tensorwise
/// is left to quantize_fp8 (current scaling, transpose=1): the wgrad's transposed copy needs that
/// pass anyway and it writes q in it, and the fused outputs' delayed scaling needs an amax history
/// of earlier steps.
bool fusable(int64_t granularity) { return granularity == kRowwise || granularity == kBlock1x128; }

// gemm_fp8's granularity for a recipe's layer GEMMs (0 tensorwise, 1 rowwise, 2 blockwise: A 1x128
// and B 128x128, 3 block1x128: both 1x128), or -1 where gemm_fp8 cannot read the operands (128x128
// activation blocks). The wgrad's B is x^T, an activation: blockwise becomes block1x128 there. The
// dgrad's B is W^T: with 128x128 weight blocks it is quantized in 1x128 blocks along N (only_qt), as
// quantize_fp8's qt of a 128x128 call shares W's scales in W's block order, not in W^T's that
// gemm_fp8 reads: blockwise becomes block1x128 there too.
enum class Pass { forward, dgrad, wgrad };
int64_t fp8_gemm_granularity(const Fp8Recipe& r, Pass pass = Pass::forward) {
  if (r.activations == kBlock128x128 || r.gradients == kBlock128x128) return -1;
  if (r.activations == kTensorwise) return 0;
  if (r.activations == kRowwise) return 1;
  if (r.weights == kBlock128x128 && pass == Pass::forward) return 2;
  return 3;
}

}  // namespace

std::span<const std::string_view> fp8_recipe_names() { return kFp8Recipes; }

Result<Fp8Recipe> parse_fp8_recipe(std::string_view name) {
  // The quantize_fp8 granularity names mean every tensor so; "block" is the DeepGEMM /
  // Primus-Turbo mix: 1x128 for activations and gradients, 128x128 for weights.
  const auto op_names = fp8_granularity_names();
  for (size_t g = 0; g < op_names.size(); ++g)
    if (name == op_names[g]) {
      const auto v = static_cast<int64_t>(g);
      return Fp8Recipe{std::string(name), v, v, v};
    }
  if (name == "block") return Fp8Recipe{"block", kBlock1x128, kBlock128x128, kBlock1x128};
  std::string choices;
  for (std::string_view n : kFp8Recipes)
    choices += fmt::format("{}{}{}", choices.empty() ? "" : ", ", n,
                           n == "block" ? " (1x128 activations and gradients, 128x128 weights)" : "");
  return make_error(Errc::invalid_argument,
                    fmt::format("--fp8 '{}': unknown granularity; use one of: {}", printable(name, 40), choices));
}

Result<ModelTable> load_models() {
  const std::string_view text = embedded_file("models/models.json");
  if (text.empty())
    return make_error(Errc::corrupt, "models/models.json is not embedded in this build (a build error)");
  json doc = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object() || !doc.contains("dense") || !doc["dense"].is_object())
    return make_error(Errc::corrupt, "the embedded models/models.json is malformed (a build error)");
  ModelTable table;
  table.about = doc.value("_about", "");
  try {
    for (const auto& [name, m] : doc["dense"].items()) {
      Model model;
      model.name = name;
      model.hidden = m.at("hidden").get<int64_t>();
      model.intermediate = m.at("intermediate").get<int64_t>();
      model.heads = m.at("heads").get<int64_t>();
      model.kv_heads = m.at("kv_heads").get<int64_t>();
      model.head_dim = m.at("head_dim").get<int64_t>();
      model.vocab = m.at("vocab").get<int64_t>();
      model.seq = m.at("seq").get<int64_t>();
      model.rope_theta = m.value("rope_theta", int64_t{10000});
      model.llama3_rope = m.value("rope_scaling", std::string("none")) == "llama3";
      table.models.push_back(std::move(model));
    }
    if (auto moe = doc.find("moe"); moe != doc.end() && moe->is_object()) {
      for (const auto& [name, m] : moe->items()) {
        if (name.rfind('_', 0) == 0) continue;  // "_about"
        Model model;
        model.name = name;
        model.moe = true;
        model.hidden = m.at("hidden").get<int64_t>();
        model.heads = m.at("heads").get<int64_t>();
        model.kv_heads = m.at("kv_heads").get<int64_t>();
        model.head_dim = m.at("head_dim").get<int64_t>();
        model.head_dim_v = m.value("head_dim_v", int64_t{0});
        model.mla = m.value("mla", false);
        model.vocab = m.at("vocab").get<int64_t>();
        model.seq = m.at("seq").get<int64_t>();
        model.rope_theta = m.value("rope_theta", int64_t{10000});
        model.experts = m.at("experts").get<int64_t>();
        model.topk = m.at("topk").get<int64_t>();
        model.moe_intermediate = m.at("moe_intermediate").get<int64_t>();
        model.experts_per_rank = m.at("experts_per_rank").get<std::vector<int64_t>>();
        model.scoring = m.value("scoring", std::string("softmax")) == "sigmoid" ? 1 : 0;
        model.bias = m.value("bias", false);
        model.n_group = m.value("n_group", int64_t{1});
        model.topk_group = m.value("topk_group", int64_t{0});
        model.group_score = m.value("group_score", std::string("max")) == "top2_sum" ? 1 : 0;
        model.renormalize = m.value("renormalize", false);
        if (model.experts_per_rank.empty())
          return make_error(Errc::corrupt, fmt::format("models/models.json: {} lists no experts_per_rank", name));
        table.models.push_back(std::move(model));
      }
    }
    if (auto g = doc.find("dense_gemms_per_layer"); g != doc.end() && g->is_object()) {
      table.gemms_about = g->value("_about", "");
      for (const char* name : {"qkv", "attn_out", "gate_up", "down", "lm_head"})
        if (g->contains(name)) table.gemms.emplace_back(name, (*g)[name].get<std::string>());
    }
  } catch (const json::exception& e) {
    return make_error(Errc::corrupt, fmt::format("the embedded models/models.json is malformed: {}", e.what()));
  }
  return table;
}

Result<Model> find_model(const ModelTable& table, const std::string& name) {
  std::string names;
  for (const Model& m : table.models) {
    if (m.name == name) return m;
    names += (names.empty() ? "" : ", ") + m.name;
  }
  return make_error(Errc::not_found, fmt::format("unknown model '{}'; known models: {}", name, names));
}

Manifest training_manifest(const Model& m, const std::vector<int64_t>& micro_batches, int64_t seq, DType dtype,
                           const std::optional<Fp8Recipe>& fp8, int64_t experts_per_rank) {
  const int64_t G = experts_per_rank ? experts_per_rank : (m.moe ? m.experts_per_rank.front() : 0);
  // The fp8 grouped GEMMs serve DeepSeek-V3's recipe (--fp8 block: 1x128 activations and gradients,
  // 128x128 weights, all e4m3); the weights' forward copy is one 128x128 call over [G N, K], exact
  // where no 128-row block spans two experts (N % 128 == 0 for gate_up and down).
  const bool moe_fp8 = m.moe && fp8 && fp8->activations == kBlock1x128 && fp8->weights == kBlock128x128 &&
                       fp8->gradients == kBlock1x128 && (2 * m.moe_intermediate) % 128 == 0 && m.hidden % 128 == 0;
  Manifest out;
  out.model = m.name;
  std::vector<std::string> mbs;
  for (int64_t mb : micro_batches) mbs.push_back(std::to_string(mb));
  const auto gran = fp8_granularity_names();
  const std::string fp8_about =
      fp8 ? fmt::format(
                " fp8 ({}: x {}, W {}, dy {}): the quantize_fp8 kernels of the GEMM inputs of every layer, x and W "
                "to e4m3, dy to e5m2 (fp8_e4m3/fp8_e5m2 name the format; each target compiles its own encoding, "
                "FNUZ on gfx942), with the transposed forms the dgrad and wgrad GEMMs read (label suffix T: qt of the same "
                "call for tensorwise; for 1x128 and 128x128 granularities quantize_fp8 only_qt, the tensor's transpose "
                "in 1x128 blocks along its rows, the tokens of x and dy or the N of W; for rowwise a call on the "
                "transposed tensor); {}; lm_head stays in {}.{}",
                fp8->name, gran[fp8->activations], gran[fp8->weights], gran[fp8->gradients],
                fp8_gemm_granularity(*fp8) < 0
                    ? fmt::format("no fp8 GEMM reads 128x128 activation blocks, so the layer GEMMs stay {} GEMMs",
                                  dtype_name(dtype))
                    : "every layer GEMM is a gemm_fp8 (forward e4m3 x e4m3, dgrad and wgrad e5m2 x e4m3; wgrad into "
                      "fp32; with 128x128 weight blocks the forward is blockwise, the dgrad and wgrad block1x128)",
                dtype_name(dtype),
                fp8_gemm_granularity(*fp8) >= 0 && !m.moe && !m.mla &&
                        (fusable(fp8->activations) || fusable(fp8->gradients))
                    ? " No separate pass quantizes what a kernel of the step writes and can write in fp8 too: "
                      "rmsnorm's y (the qkv and gate_up inputs) and swiglu's y (the down input) come as fused fp8 "
                      "outputs, and so do rmsnorm_bwd's dx (the dy of attn_out and down) and swiglu_bwd's dx (the dy "
                      "of gate_up; up to intermediate 32768); quantize_fp8 remains for the weights, the attention "
                      "output (attn_out's x), dqkv (qkv's dy, from attention_bwd and rope_bwd) and every transposed "
                      "copy the dgrad and wgrad GEMMs read; the final norm (its y feeds the lm_head) and the first "
                      "layer's input-norm backward (its dx feeds the embedding) write no fp8."
                    : "")
          : "";
  std::string moe_about, mla_about;
  if (m.moe)
    moe_about = fmt::format(
        " Mixture of experts: each layer's FFN is the router GEMM [M, {}] (bf16 logits), moe_router (top-{}, {}{}{}), "
        "moe_permute of the tokens to this rank's {} experts, the grouped GEMMs of gate_up (N {}) and down (N {}) "
        "(forward nt, dgrad nn, wgrad tn into fp32), swiglu (I {}), moe_unpermute, and their backward (moe_permute_bwd "
        "adding the router path's dx), in place of "
        "gate_up, down and swiglu{}; {} Shared experts are not modelled.",
        m.experts, m.topk, m.scoring ? "sigmoid" : "softmax", m.bias ? " with a score-correction bias" : "",
        m.n_group > 1 ? fmt::format(", {} groups keep {}", m.n_group, m.topk_group) : std::string(), G,
        2 * m.moe_intermediate, m.hidden, m.moe_intermediate,
        G < m.experts ? fmt::format("; with {} of {} experts per rank the dispatch between ranks (all-to-all) is not "
                                    "a Kiln op",
                                    G, m.experts)
                      : std::string(),
        moe_fp8 ? "with --fp8 block the grouped GEMMs are fp8 blockwise (e4m3, DeepSeek-V3's recipe): forward and "
                  "dgrad nt (the dgrad's b is W^T, quantize_fp8 only_qt 128x128 over the experts, batch), wgrad tn over "
                  "group-aligned 128-token panels of dy^T and x^T (quantize_fp8 only_qt groups), each operand "
                  "quantized by quantize_fp8 (no fused fp8 output yet)."
                : fmt::format("the grouped GEMMs stay in {} with --fp8{}.", dtype_name(dtype),
                              fp8 ? " (their fp8 form serves --fp8 block)" : ""));
  if (m.mla)
    mla_about = fmt::format(
        " Attention: {} uses multi-head latent attention; Kiln serves its attention core (heads = kv_heads = {}, "
        "head_dim {}, head_dim_v {}, q, k, v as separate contiguous tensors) but not its low-rank q/kv projections "
        "or its decoupled RoPE, so no qkv or attn_out GEMM and no rope kernel is listed for it.",
        m.name, m.heads, m.head_dim, m.head_dim_v);
  out.about = fmt::format(
      "Kernels of one training step of {} (seq {}, micro batch {}, {}), the set examples/llama_step launches: "
      "per layer the forward (NT), dgrad (NN) and wgrad (TN, fp32 gradients) GEMMs of qkv, attn_out, gate_up, "
      "down and lm_head, rmsnorm (plain and with the residual add, saving rstd) and rmsnorm_bwd (plain and adding "
      "the residual gradient), rope and attention (causal, packed sequences, on views of the fused qkv) and their "
      "backward, swiglu and swiglu_bwd, the token embedding (int32 ids) and its backward, and cross-entropy "
      "(int32 targets) with its gradient in the same launch (grad_inplace); M = seq * micro_batch.{}{}{} "
      "Generated by: kiln manifest {} --seq {} --micro-batch {} --dtype {}{}{}",
      m.name, seq, fmt::join(mbs, ","), dtype_name(dtype), fp8_about, moe_about, mla_about, m.name, seq,
      fmt::join(mbs, ","), dtype_name(dtype), fp8 ? " --fp8 " + fp8->name : "",
      m.moe ? fmt::format(" --experts-per-rank {}", G) : std::string());
  if (m.moe)  // the step examples/llama_step runs is dense: say what differs
    out.about.replace(out.about.find("the set examples/llama_step launches"),
                      std::string_view("the set examples/llama_step launches").size(),
                      "the kernels of examples/llama_step's dense step with the changes below");

  // MLA models have no fused qkv / attn_out GEMM here; MoE models' gate_up and down are grouped
  // GEMMs (below) and their router a plain GEMM.
  std::vector<Gemm> gemms;
  if (!m.mla) {
    gemms.push_back({"qkv", (m.heads + 2 * m.kv_heads) * m.head_dim, m.hidden, true, true, false});
    gemms.push_back({"attn_out", m.hidden, m.heads * m.head_dim, true, false, true});
  }
  if (m.moe) {
    gemms.push_back({"router", m.experts, m.hidden, false});
  } else {
    // swiglu_bwd's fp8 kernel holds a row of dx (2 I) in registers: up to 65536 columns.
    gemms.push_back({"gate_up", 2 * m.intermediate, m.hidden, true, true, 2 * m.intermediate <= 65536});
    gemms.push_back({"down", m.hidden, m.intermediate, true, true, true});
  }
  gemms.push_back({"lm_head", m.vocab, m.hidden, false});
  auto add = [&](KernelSpec spec, std::string label) {
    for (ManifestEntry& e : out.kernels) {
      if (e.spec.op == spec.op && e.spec.dtype == spec.dtype && e.spec.out_dtype == spec.out_dtype &&
          e.spec.params == spec.params) {
        e.label += "+" + label;
        return;
      }
    }
    out.kernels.push_back({std::move(spec), std::move(label)});
  };
  auto gemm = [&](int64_t M, int64_t N, int64_t K, bool ta, bool tb, DType out_dtype) {
    return KernelSpec{"gemm", dtype, out_dtype, {{"M", M}, {"N", N}, {"K", K}, {"trans_a", ta}, {"trans_b", tb}}};
  };
  for (int64_t mb : micro_batches) {
    const int64_t M = seq * mb;
    const std::string suffix = micro_batches.size() > 1 ? fmt::format("[mb={}]", mb) : "";
    for (const Gemm& g : gemms) {
      if (fp8 && g.fp8 && fp8_gemm_granularity(*fp8) >= 0) {
        // gemm_fp8 reads both operands K-major: forward x [M,K] . W [N,K]; dgrad dy [M,N] . W^T [K,N];
        // wgrad dy^T [N,M] . x^T [K,M] (the transposed copies quantize_fp8 writes below).
        auto gemm8 = [&](int64_t M8, int64_t N8, int64_t K8, DType a_format, Pass pass, DType out_dtype) {
          return KernelSpec{"gemm_fp8", a_format, out_dtype,
                            {{"M", M8}, {"N", N8}, {"K", K8}, {"granularity", fp8_gemm_granularity(*fp8, pass)}}};
        };
        add(gemm8(M, g.n, g.k, DType::e4m3, Pass::forward, dtype), fmt::format("{}.fwd{}", g.name, suffix));
        add(gemm8(M, g.k, g.n, DType::e5m2, Pass::dgrad, dtype), fmt::format("{}.dgrad{}", g.name, suffix));
        add(gemm8(g.n, g.k, M, DType::e5m2, Pass::wgrad, DType::f32), fmt::format("{}.wgrad{}", g.name, suffix));
      } else {
        add(gemm(M, g.n, g.k, false, true, dtype), fmt::format("{}.fwd{}", g.name, suffix));     // y = x @ W^T
        add(gemm(M, g.k, g.n, false, false, dtype), fmt::format("{}.dgrad{}", g.name, suffix));  // dx = dy @ W
        add(gemm(g.n, g.k, M, true, false, DType::f32), fmt::format("{}.wgrad{}", g.name, suffix));  // dW = dy^T @ x
      }
      if (fp8 && g.fp8) {
        // The fp8 GEMM operands, K-major as fp8 tensor-core GEMMs read them: forward x[M,K] and
        // W[N,K]; dgrad dy[M,N] and W^T[K,N]; wgrad dy^T[N,M] and x^T[K,M].
        // A fused output writes q where the producing kernel has one (Gemm::x_fused, dy_fused;
        // listed with the norms and swiglu below); quantize_fp8 writes the rest and the transposes.
        struct Operand {
          const char* name;
          int64_t rows, cols, granularity;
          DType format;
          bool fused;
        };
        const bool gemm8 = fp8_gemm_granularity(*fp8) >= 0;
        const Operand operands[] = {
            {"x", M, g.k, fp8->activations, DType::e4m3, gemm8 && g.x_fused && fusable(fp8->activations)},
            {"w", g.n, g.k, fp8->weights, DType::e4m3, false},
            {"dy", M, g.n, fp8->gradients, DType::e5m2, gemm8 && g.dy_fused && fusable(fp8->gradients)}};
        auto quantize = [&](int64_t rows, int64_t cols, int64_t granularity, bool transpose, DType format) {
          return KernelSpec{"quantize_fp8", dtype, format,
                            {{"rows", rows}, {"cols", cols}, {"granularity", granularity}, {"transpose", transpose}}};
        };
        for (const Operand& o : operands) {
          const std::string label = fmt::format("{}.fp8_{}{}", g.name, o.name, suffix);
          const std::string label_t = fmt::format("{}.fp8_{}T{}", g.name, o.name, suffix);
          // q and qt in one call where they share the scales gemm_fp8 reads (tensorwise; 128x128
          // blocks only without gemm_fp8: the dgrad would read W^T's scales in W^T's block order).
          if (o.granularity == kTensorwise || (transposes_in_place(o.granularity) && !gemm8)) {
            add(quantize(o.rows, o.cols, o.granularity, true, o.format), label);
            continue;
          }
          if (!o.fused) add(quantize(o.rows, o.cols, o.granularity, false, o.format), label);
          if (o.granularity == kBlock1x128 || o.granularity == kBlock128x128) {
            // x^T (W^T) in 1x128 blocks of its own rows, from x itself
            KernelSpec t = quantize(o.rows, o.cols, kBlock1x128, true, o.format);
            t.params["only_qt"] = 1;
            add(std::move(t), label_t);
          } else {  // rowwise: the transposed tensor on its own
            add(quantize(o.cols, o.rows, o.granularity, false, o.format), label_t);
          }
        }
      }
    }
    // The norms: the block's first rmsnorm normalizes the layer input; the second adds the
    // attention output to the residual stream first (residual=1 writes h); both save rstd for
    // their backward, which reads it.
    // With a fused fp8 recipe (fused_x, fused_dy) the norms that feed a layer GEMM write its input in
    // fp8 too: the forward norms' y (xn, hn) in e4m3; rmsnorm_bwd's dx in e5m2, the dy of attn_out
    // (gh) and of the previous layer's down (g). Two stay in the step's dtype: the final norm (its
    // y feeds the lm_head) and the first layer's input-norm backward (its dx feeds the embedding).
    const bool dense8 = fp8 && !m.moe && !m.mla && fp8_gemm_granularity(*fp8) >= 0;
    const bool fused_x = dense8 && fusable(fp8->activations), fused_dy = dense8 && fusable(fp8->gradients);
    auto fused = [&](KernelSpec s, bool on, DType format, int64_t granularity) {
      if (on) {
        s.params["fp8_out"] = fp8_out_value(format);
        s.params["fp8_granularity"] = granularity;
      }
      return s;
    };
    const KernelSpec norm{"rmsnorm", dtype, dtype, {{"rows", M}, {"hidden", m.hidden}, {"save_rstd", 1}}};
    KernelSpec norm_res = norm;
    norm_res.params["residual"] = 1;
    const KernelSpec norm_bwd{"rmsnorm_bwd", dtype, dtype, {{"rows", M}, {"hidden", m.hidden}}};
    KernelSpec norm_bwd_res = norm_bwd;
    norm_bwd_res.params["residual_grad"] = 1;
    if (fused_x || fused_dy) {
      const int64_t ga = fp8->activations, gg = fp8->gradients;
      add(fused(norm, fused_x, DType::e4m3, ga), "rmsnorm.fwd" + suffix);
      add(fused(norm_res, fused_x, DType::e4m3, ga), "rmsnorm.fwd_residual" + suffix);
      add(norm_res, "rmsnorm.fwd_final" + suffix);
      add(fused(norm_bwd, fused_dy, DType::e5m2, gg), "rmsnorm.bwd" + suffix);
      add(fused(norm_bwd_res, fused_dy, DType::e5m2, gg), "rmsnorm.bwd_residual" + suffix);
      add(norm_bwd_res, "rmsnorm.bwd_residual_first" + suffix);
    } else {
      add(norm, "rmsnorm.fwd" + suffix);
      add(norm_res, "rmsnorm.fwd_residual" + suffix);
      add(norm_bwd, "rmsnorm.bwd" + suffix);
      add(norm_bwd_res, "rmsnorm.bwd_residual" + suffix);
    }
    // q, k and v are column views of the fused qkv output [M, (heads + 2 kv_heads) * head_dim]:
    // rope rotates q and k in place there, attention reads them with that row stride, and the
    // backward writes dq, dk, dv into the same views of dqkv.
    const int64_t qkv_cols = (m.heads + 2 * m.kv_heads) * m.head_dim;
    for (const bool bwd : {false, true}) {
      if (m.mla) {  // the attention core on separate contiguous q, k, v; no rope (see about)
        add(KernelSpec{bwd ? "attention_bwd" : "attention", dtype, dtype,
                       {{"heads", m.heads}, {"kv_heads", m.kv_heads}, {"head_dim", m.head_dim},
                        {"head_dim_v", m.head_dim_v}, {"layout", 1}, {"causal", 1}, {"batch", mb}, {"total_q", M},
                        {"total_k", M}, {"max_seqlen_q", seq}, {"max_seqlen_k", seq}}},
            (bwd ? "attention.bwd" : "attention.fwd") + suffix);
      }
      if (!m.mla) {
      add(KernelSpec{bwd ? "rope_bwd" : "rope", dtype, dtype,
                     {{"tokens", M}, {"heads", m.heads}, {"kv_heads", m.kv_heads}, {"head_dim", m.head_dim},
                      {"batch", mb}, {"positions", 0}, {"rope_theta", m.rope_theta}, {"scaling", m.llama3_rope ? 1 : 0},
                      {"inplace", 1}, {"q_row_stride", qkv_cols}, {"k_row_stride", qkv_cols}}},
          (bwd ? "rope.bwd" : "rope.fwd") + suffix);
      add(KernelSpec{bwd ? "attention_bwd" : "attention", dtype, dtype,
                     {{"heads", m.heads}, {"kv_heads", m.kv_heads}, {"head_dim", m.head_dim}, {"layout", 1},
                      {"causal", 1}, {"batch", mb}, {"total_q", M}, {"total_k", M}, {"max_seqlen_q", seq},
                      {"max_seqlen_k", seq}, {"q_row_stride", qkv_cols}, {"k_row_stride", qkv_cols},
                      {"v_row_stride", qkv_cols}}},
          (bwd ? "attention.bwd" : "attention.fwd") + suffix);
      }
      // int32 ids and targets, as examples/llama_step launches them, named explicitly (the ops'
      // default is int64, PyTorch's torch.long: docs/embedding.md, docs/cross-entropy.md).
      add(KernelSpec{bwd ? "embedding_bwd" : "embedding", dtype, dtype,
                     {{"tokens", M}, {"vocab", m.vocab}, {"hidden", m.hidden}, {"ids_dtype", 0}}},
          (bwd ? "embedding.bwd" : "embedding.fwd") + suffix);
      // The loss and its gradient (dlogits over the logits) in one launch, as examples/llama_step
      // runs it: cross_entropy's grad_inplace (Liger-Kernel's fused form); no cross_entropy_bwd.
      if (!bwd)
        add(KernelSpec{"cross_entropy", dtype, dtype,
                       {{"tokens", M}, {"vocab", m.vocab}, {"target_dtype", 1}, {"grad_inplace", 1}}},
            "cross_entropy.fwd_bwd" + suffix);
    }
    if (!m.moe) {
      add(fused(KernelSpec{"swiglu", dtype, dtype, {{"rows", M}, {"intermediate", m.intermediate}}}, fused_x,
                DType::e4m3, fused_x ? fp8->activations : 0),
          "swiglu.fwd" + suffix);
      const bool swiglu_bwd8 = fused_dy && 2 * m.intermediate <= 65536;
      add(fused(KernelSpec{"swiglu_bwd", dtype, dtype, {{"rows", M}, {"intermediate", m.intermediate}}}, swiglu_bwd8,
                DType::e5m2, swiglu_bwd8 ? fp8->gradients : 0),
          "swiglu.bwd" + suffix);
      continue;
    }
    // The MoE FFN (docs/moe.md, docs/grouped-gemm.md). Token counts are runtime arguments of these
    // ops, so the rows each rank's experts receive need not be known here.
    const int64_t I = m.moe_intermediate;
    add(KernelSpec{"moe_router", dtype, dtype,
                   {{"tokens", M}, {"experts", m.experts}, {"k", m.topk}, {"scoring", m.scoring},
                    {"n_group", m.n_group}, {"topk_group", m.topk_group}, {"group_score", m.group_score},
                    {"renormalize", m.renormalize ? 1 : 0}, {"bias", m.bias ? 1 : 0}}},
        "moe_router.fwd" + suffix);
    add(KernelSpec{"moe_router_bwd", dtype, dtype,
                   {{"tokens", M}, {"experts", m.experts}, {"k", m.topk}, {"scoring", m.scoring},
                    {"renormalize", m.renormalize ? 1 : 0}}},
        "moe_router.bwd" + suffix);
    add(KernelSpec{"moe_permute", dtype, dtype, {{"tokens", M}, {"hidden", m.hidden}, {"experts", G}, {"k", m.topk}}},
        "moe_permute.fwd" + suffix);
    // moe_permute_bwd adds x's gradient along the router (the router GEMM's dgrad) in the pass that
    // sums the expert rows (accumulate; examples/moe_block).
    for (const auto& [op, accumulate] : {std::pair<const char*, bool>{"moe_permute_bwd", true},
                                         {"moe_unpermute", false},
                                         {"moe_unpermute_bwd", false}}) {
      KernelSpec spec{op, dtype, dtype, {{"tokens", M}, {"hidden", m.hidden}, {"k", m.topk}}};
      if (accumulate) spec.params["accumulate"] = 1;
      add(std::move(spec), fmt::format("{}.{}{}", std::string_view(op).substr(0, std::string_view(op).find("_bwd")),
                                       std::string_view(op).ends_with("_bwd") ? "bwd" : "fwd", suffix));
    }
    // Grouped GEMMs, weights [G, N, K]: forward nt c = a W_g^T; dgrad nn dx = dy W_g (b read as
    // [G, K', N'] = [G, N, K]); wgrad tn dW_g = dy_g^T x_g into fp32.
    auto grouped = [&](DType in, int64_t mode, int64_t N, int64_t K, DType out_dtype) {
      return KernelSpec{"grouped_gemm", in, out_dtype,
                        {{"mode", mode}, {"groups", G}, {"N", N}, {"K", K}, {"tokens", M * m.topk}}};
    };
    auto quantize = [&](int64_t rows, int64_t cols, int64_t granularity) {
      return KernelSpec{"quantize_fp8", dtype, DType::e4m3, {{"rows", rows}, {"cols", cols}, {"granularity", granularity}}};
    };
    for (const auto& [name, N, K] : {std::tuple<const char*, int64_t, int64_t>{"gate_up", 2 * I, m.hidden},
                                     std::tuple<const char*, int64_t, int64_t>{"down", m.hidden, I}}) {
      if (!moe_fp8) {
        add(grouped(dtype, 0, N, K, dtype), fmt::format("experts.{}.fwd{}", name, suffix));
        add(grouped(dtype, 1, K, N, dtype), fmt::format("experts.{}.dgrad{}", name, suffix));
        add(grouped(dtype, 2, N, K, DType::f32), fmt::format("experts.{}.wgrad{}", name, suffix));
        continue;
      }
      // DeepSeek-V3's fp8 recipe (docs/grouped-gemm.md), every operand e4m3 and K-major: forward
      // x . W_g^T (x 1x128, W 128x128); dgrad dy . (W_g^T)^T, nt with b = W^T (dy 1x128, W^T
      // 128x128 in b's block order); wgrad dy^T x over group-aligned 128-token panels (both 1x128
      // along the tokens). W [G N, K] in one 128x128 call (N % 128 == 0: no block spans two
      // experts), W^T per expert (batch), the panels from the device offsets (groups).
      const int64_t rows = M * m.topk;
      add(grouped(DType::e4m3, 0, N, K, dtype), fmt::format("experts.{}.fwd{}", name, suffix));
      add(grouped(DType::e4m3, 0, K, N, dtype), fmt::format("experts.{}.dgrad{}", name, suffix));
      add(grouped(DType::e4m3, 2, N, K, DType::f32), fmt::format("experts.{}.wgrad{}", name, suffix));
      add(quantize(rows, K, kBlock1x128), fmt::format("experts.{}.fp8_x{}", name, suffix));
      add(quantize(G * N, K, kBlock128x128), fmt::format("experts.{}.fp8_w{}", name, suffix));
      KernelSpec wt = quantize(N, K, kBlock128x128);
      wt.params["transpose"] = wt.params["only_qt"] = 1;
      wt.params["batch"] = G;
      add(std::move(wt), fmt::format("experts.{}.fp8_wT{}", name, suffix));
      add(quantize(rows, N, kBlock1x128), fmt::format("experts.{}.fp8_dy{}", name, suffix));
      for (const auto& [operand, cols] : {std::pair<const char*, int64_t>{"dy", N}, {"x", K}}) {
        KernelSpec panels = quantize(rows, cols, kBlock1x128);
        panels.params["transpose"] = panels.params["only_qt"] = 1;
        panels.params["groups"] = G;
        add(std::move(panels), fmt::format("experts.{}.fp8_{}T{}", name, operand, suffix));
      }
    }
    add(KernelSpec{"swiglu", dtype, dtype, {{"rows", M * m.topk}, {"intermediate", I}}}, "experts.swiglu.fwd" + suffix);
    add(KernelSpec{"swiglu_bwd", dtype, dtype, {{"rows", M * m.topk}, {"intermediate", I}}},
        "experts.swiglu.bwd" + suffix);
  }
  return out;
}

}  // namespace kiln::cli
