// One training step of a decoder-only (Llama) model through Kiln's C++ API alone:
//
//   r0 = embedding(ids)                                                     [T, hidden]
//   per layer l:  xn, r = rmsnorm(h_{l-1} + d_{l-1})      (the residual add fused into the norm)
//                 qkv = xn @ Wqkv^T                         [T, (Hq + 2 Hkv) D]   (gemm NT)
//                 q, k = rope(q, k) in place on views of qkv (row stride (Hq + 2 Hkv) D)
//                 o, lse = attention(q, k, v)               causal, GQA, packed sequences (THD)
//                 a = o @ Wo^T                              [T, hidden]
//                 hn, h = rmsnorm(r + a)                    (fused residual add)
//                 gu = hn @ Wgu^T ; s = swiglu(gu) ; d = s @ Wd^T
//   fn, rL = rmsnorm(h_{L-1} + d_{L-1}) ; logits = fn @ Wlm^T ; loss = mean(cross_entropy(logits, targets))
//
// then the backward of all of it to every weight's gradient: dlogits (written over the logits by
// the forward's cross_entropy in the same launch as the loss: grad_inplace), the dgrad (NN) and
// wgrad (TN, fp32 out) GEMMs, rmsnorm_bwd with the residual gradient added in the same pass
// (dres), swiglu_bwd, attention_bwd writing dq/dk/dv into views of one dqkv buffer, rope_bwd in
// place, embedding_bwd (deterministic). Every add of the residual
// stream, forward and backward, is fused into a norm; no separate add kernel runs.
//
// Modes:
//   --backend cuda|hip|auto   run on the GPU; times the step (--time N) and prints a per-op breakdown
//   --backend emulator --arch gfx942|gfx950   run the AMD kernels in the CDNA emulator (small models)
//   --check                   also run the same graph on the CPU through each op's float64 reference
//                             (kiln::reference) and compare the loss (relative error < 1e-3) and every
//                             gradient (SNR > 30 dB)
//   --dump DIR                write weights, ids, targets, loss and gradients for scripts/llama_step_torch.py
//   --require-prewarmed       fail if the step compiles any kernel (after kiln manifest + kiln prewarm)
//   --fp8 RECIPE              also run the step with every layer GEMM (forward, dgrad, wgrad) in fp8
//                             through gemm_fp8 (tensorwise, block or block1x128, as `kiln manifest
//                             --fp8` names them), in the same process on the same weights and batch,
//                             and report its time and its loss difference from the bf16 step (below)
// Exit status: 0 done (and checks passed), 1 an error or a failed check, 77 --backend emulator
// without the emulator (its Python or its folder missing: docs/emulator.md).
//
// Model dimensions come from models/models.json (`--model llama3.1-8b`), the layer count is an
// option (default 2), sequence length and micro-batch too. Errors name the input and the fix.
//
// The fp8 step (docs/gemm-fp8.md, "The GEMMs of a training step"): x and W in e4m3, the gradients
// in e5m2; the lm_head stays bf16. A GEMM's input that a kernel of the step writes comes from that
// kernel's fused fp8 output (block and block1x128): rmsnorm's y (qkv, gate_up), swiglu's y (down),
// rmsnorm_bwd's dx (the dy of attn_out and down), swiglu_bwd's dx (the dy of gate_up). quantize_fp8
// writes the rest: the weights (at the start of the step, as an optimizer step would), the
// attention output, dqkv, and the transposed copies the wgrad (x^T, dy^T) and dgrad (W^T) GEMMs read,
// in 1x128 blocks along the tensor's rows (only_qt). Tensorwise uses quantize_fp8 with current
// scaling and transpose=1 for every operand (one pass writes q and qt).
#include <kiln/kiln.h>

#include <CLI/CLI.hpp>

#include "example_graph.h"
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

#ifndef KILN_MODELS_JSON
#define KILN_MODELS_JSON "models/models.json"
#endif

namespace {

using kiln::DType;
using kiln::KernelSpec;
using kiln::Result;
using kiln_example::Buf;
using kiln_example::columns;
using kiln_example::Graph;
using kiln_example::View;
using kiln_example::whole;

struct Dims {
  std::string name;
  int64_t hidden = 0, intermediate = 0, heads = 0, kv_heads = 0, head_dim = 0, vocab = 0, seq = 0;
  int64_t rope_theta = 10000;
  bool llama3_scaling = false;  ///< Llama-3.1's RoPE frequency scaling
  int64_t layers = 2, micro_batch = 1;
  int64_t tokens() const { return seq * micro_batch; }
  int64_t qkv_cols() const { return (heads + 2 * kv_heads) * head_dim; }
};

Result<Dims> load_dims(const std::string& path, const std::string& model) {
  std::ifstream in(path);
  if (!in)
    return kiln::make_error(kiln::Errc::io_error,
                            fmt::format("cannot read the model table {} (pass --models PATH)", path));
  auto doc = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.contains("dense") || !doc["dense"].is_object())
    return kiln::make_error(kiln::Errc::corrupt, fmt::format("{} is not a model table (no \"dense\" object)", path));
  const auto& dense = doc["dense"];
  if (!dense.contains(model)) {
    std::string names;
    for (const auto& [n, _] : dense.items()) names += (names.empty() ? "" : ", ") + n;
    return kiln::make_error(kiln::Errc::not_found, fmt::format("unknown model '{}'; known models: {}", model, names));
  }
  const auto& m = dense[model];
  Dims d;
  d.name = model;
  for (auto [key, field] : {std::pair{"hidden", &d.hidden}, {"intermediate", &d.intermediate}, {"heads", &d.heads},
                            {"kv_heads", &d.kv_heads}, {"head_dim", &d.head_dim}, {"vocab", &d.vocab}, {"seq", &d.seq}}) {
    if (!m.contains(key) || !m[key].is_number_integer())
      return kiln::make_error(kiln::Errc::corrupt, fmt::format("{}: model '{}' has no integer '{}'", path, model, key));
    *field = m[key].get<int64_t>();
  }
  if (m.contains("rope_theta") && m["rope_theta"].is_number_integer()) d.rope_theta = m["rope_theta"].get<int64_t>();
  if (m.contains("rope_scaling") && m["rope_scaling"].is_string()) d.llama3_scaling = m["rope_scaling"] == "llama3";
  return d;
}

// ---- the model -----------------------------------------------------------------------------
// ---- fp8 recipes ----------------------------------------------------------------------------
// Parameter values of the ops (`kiln ops`): quantize_fp8's and the fused outputs' granularity
// (tensorwise 0, block1x128 2, block128x128 3), gemm_fp8's (tensorwise 0, blockwise 2, block1x128 3),
// the fused outputs' fp8_out (fp8_e4m3 1, fp8_e5m2 2, fp8_e4m3fnuz 3, fp8_e5m2fnuz 4).
struct Fp8Recipe {
  std::string name;
  int64_t x_gran, w_gran;          // quantize_fp8 granularity of activations and gradients, of weights
  int64_t fwd, dgrad, wgrad;       // gemm_fp8 granularity of each GEMM
  bool fused;                      // x and dy from the producing kernels' fused fp8 outputs
};
Result<Fp8Recipe> fp8_recipe(const std::string& name) {
  if (name == "tensorwise") return Fp8Recipe{name, 0, 0, 0, 0, 0, false};
  if (name == "block") return Fp8Recipe{name, 2, 3, 2, 3, 3, true};  // DeepSeek-V3: x 1x128, W 128x128
  if (name == "block1x128") return Fp8Recipe{name, 2, 2, 3, 3, 3, true};
  return kiln::make_error(kiln::Errc::invalid_argument,
                          fmt::format("--fp8 '{}': the step runs tensorwise, block (1x128 activations and gradients, "
                                      "128x128 weights) or block1x128; rowwise and block128x128 would need a "
                                      "column-wise quantization of x, dy and W that Kiln does not have yet",
                                      name));
}

// An fp8 copy of a tensor [R, C]: q [R, C] with scales s, and its transpose qt [C, R] with scales st
// (tensorwise: st is s; otherwise 1x128 blocks along R).
struct Q8 {
  Buf *q = nullptr, *s = nullptr, *qt = nullptr, *st = nullptr;
};

struct Layer {
  Buf *g_attn, *wqkv, *wo, *g_mlp, *wgu, *wd;                    // weights
  Buf *xn, *r, *rstd1, *qkv, *o, *lse, *a, *hn, *h, *rstd2, *gu, *s, *d;  // saved activations
  Buf *dg_attn, *dwqkv, *dwo, *dg_mlp, *dwgu, *dwd;              // gradients
  Q8 xn8, o8, hn8, s8, wqkv8, wo8, wgu8, wd8;                    // fp8 copies (the fp8 step)
};

struct Model {
  Dims dims;
  DType dt = DType::bf16;
  Buf *ids, *targets, *cu_seqlens, *wemb, *g_final, *wlm;
  Buf *r0, *fn, *r_final, *rstd_f, *logits, *loss, *lse_ce, *dloss;
  Buf *dwemb, *dg_final, *dwlm;
  Buf *g, *gh, *dfn, *ds, *dgu, *dhn, *do_, *dqkv, *dxn;  // backward scratch
  std::vector<Layer> layers;
  // The fp8 step: the recipe while it runs (nullptr: the bf16 step), the target's e4m3 and e5m2,
  // the fp8 copies of the backward's gradients (scratch).
  std::optional<Fp8Recipe> recipe;
  const Fp8Recipe* f8 = nullptr;
  DType e4 = DType::e4m3, e5 = DType::e5m2;
  Q8 g8, gh8, dgu8, dqkv8;
};

KernelSpec gemm(const Model& m, int64_t M, int64_t N, int64_t K, bool ta, bool tb, DType out) {
  return {"gemm", m.dt, out, {{"M", M}, {"N", N}, {"K", K}, {"trans_a", ta}, {"trans_b", tb}}};
}
KernelSpec rmsnorm(const Model& m, bool residual) {
  KernelSpec s{"rmsnorm", m.dt, m.dt, {{"rows", m.dims.tokens()}, {"hidden", m.dims.hidden}, {"save_rstd", 1}}};
  if (residual) s.params["residual"] = 1;
  return s;
}
KernelSpec rmsnorm_bwd(const Model& m, bool dres) {
  KernelSpec s{"rmsnorm_bwd", m.dt, m.dt, {{"rows", m.dims.tokens()}, {"hidden", m.dims.hidden}}};
  if (dres) s.params["residual_grad"] = 1;
  return s;
}
std::map<std::string, int64_t> heads_of(const Model& m) {
  return {{"heads", m.dims.heads}, {"kv_heads", m.dims.kv_heads}, {"head_dim", m.dims.head_dim}};
}
KernelSpec rope(const Model& m, bool bwd) {
  KernelSpec s{bwd ? "rope_bwd" : "rope", m.dt, m.dt, heads_of(m)};
  s.params["tokens"] = m.dims.tokens();
  s.params["batch"] = m.dims.micro_batch;
  s.params["positions"] = 0;  // cu_seqlens: positions restart at each packed sequence
  s.params["rope_theta"] = m.dims.rope_theta;
  s.params["scaling"] = m.dims.llama3_scaling ? 1 : 0;  // llama3 or none
  s.params["inplace"] = 1;
  s.params["q_row_stride"] = m.dims.qkv_cols();
  s.params["k_row_stride"] = m.dims.qkv_cols();
  return s;
}
KernelSpec attention(const Model& m, bool bwd) {
  KernelSpec s{bwd ? "attention_bwd" : "attention", m.dt, m.dt, heads_of(m)};
  s.params["layout"] = 1;  // thd
  s.params["causal"] = 1;
  s.params["batch"] = m.dims.micro_batch;
  s.params["total_q"] = s.params["total_k"] = m.dims.tokens();
  s.params["max_seqlen_q"] = s.params["max_seqlen_k"] = m.dims.seq;
  for (const char* p : {"q_row_stride", "k_row_stride", "v_row_stride"}) s.params[p] = m.dims.qkv_cols();
  return s;
}
// The loss and dlogits (over the logits) in one launch: cross_entropy's grad_inplace (Liger-Kernel's
// fused form), with dloss = 1 / T known before the forward; int32 targets.
KernelSpec cross_entropy(const Model& m) {
  return {"cross_entropy", m.dt, m.dt,
          {{"tokens", m.dims.tokens()}, {"vocab", m.dims.vocab}, {"target_dtype", 1}, {"grad_inplace", 1}}};
}
// Ids and targets are int32 here (half the bytes of the ops' int64 default, PyTorch's torch.long),
// named explicitly: the step and its manifest (tools/kiln/models.cpp) must agree.
KernelSpec embedding(const Model& m, bool bwd) {
  return {bwd ? "embedding_bwd" : "embedding", m.dt, m.dt,
          {{"tokens", m.dims.tokens()}, {"vocab", m.dims.vocab}, {"hidden", m.dims.hidden}, {"ids_dtype", 0}}};
}

// Views of q, k and v inside the qkv buffer [T, (Hq + 2 Hkv) D].
View q_of(const Model& m, Buf& qkv) { return columns(qkv, 0, m.dims.heads * m.dims.head_dim); }
View k_of(const Model& m, Buf& qkv) { return columns(qkv, m.dims.heads * m.dims.head_dim, m.dims.kv_heads * m.dims.head_dim); }
View v_of(const Model& m, Buf& qkv) {
  return columns(qkv, (m.dims.heads + m.dims.kv_heads) * m.dims.head_dim, m.dims.kv_heads * m.dims.head_dim);
}

// The buffers of an fp8 copy of a [R, C] tensor quantized with granularity `gran` (quantize_fp8's).
Result<Q8> make_q8(Graph& g, const std::string& name, DType fmt, int64_t R, int64_t C, int64_t gran) {
  auto cdiv = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
  Q8 c;
  KILN_ASSIGN_OR_RETURN(c.q, g.make(name + ".fp8", fmt, R, C));
  const int64_t sr = gran == 0 ? 1 : gran == 3 ? cdiv(R, 128) : R, sc = gran == 0 ? 1 : cdiv(C, 128);
  KILN_ASSIGN_OR_RETURN(c.s, g.make(name + ".scale", DType::f32, sr, sc));
  KILN_ASSIGN_OR_RETURN(c.qt, g.make(name + ".T.fp8", fmt, C, R));
  if (gran == 0) {
    c.st = c.s;
  } else {
    KILN_ASSIGN_OR_RETURN(c.st, g.make(name + ".T.scale", DType::f32, C, cdiv(R, 128)));
  }
  return c;
}

Result<Model> build(Graph& g, const Dims& d, DType dt, uint64_t seed, const std::optional<Fp8Recipe>& recipe = {},
                    const kiln::TargetInfo* target = nullptr) {
  Model m;
  m.dims = d;
  m.dt = dt;
  m.recipe = recipe;
  if (target) {
    m.e4 = kiln::fp8_for_target(DType::e4m3, *target);
    m.e5 = kiln::fp8_for_target(DType::e5m2, *target);
  }
  const int64_t T = d.tokens(), H = d.hidden, I = d.intermediate, V = d.vocab, Q = d.qkv_cols(),
                HD = d.heads * d.head_dim;
  std::mt19937_64 rng(seed);
  auto uniform = [&](int64_t n, float lo, float hi) {
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) do x = u(rng); while (x == 0.0f);
    return v;
  };
  auto weight = [&](const std::string& name, int64_t rows, int64_t cols) -> Result<Buf*> {
    KILN_ASSIGN_OR_RETURN(Buf * b, g.make(name, dt, rows, cols));
    const float a = std::sqrt(3.0f / static_cast<float>(cols));  // unit-variance outputs
    KILN_TRY(g.upload(*b, uniform(rows * cols, -a, a)));
    return b;
  };
  auto gamma = [&](const std::string& name) -> Result<Buf*> {
    KILN_ASSIGN_OR_RETURN(Buf * b, g.make(name, dt, 1, H));
    KILN_TRY(g.upload(*b, uniform(H, 0.8f, 1.2f)));
    return b;
  };
  auto act = [&](const std::string& name, DType t, int64_t rows, int64_t cols) { return g.make(name, t, rows, cols); };

  // Inputs: token ids and next-token targets (int32), packed sequences of length seq.
  KILN_ASSIGN_OR_RETURN(m.ids, act("ids", DType::i32, 1, T));
  KILN_ASSIGN_OR_RETURN(m.targets, act("targets", DType::i32, 1, T));
  KILN_ASSIGN_OR_RETURN(m.cu_seqlens, act("cu_seqlens", DType::i32, 1, d.micro_batch + 1));
  {
    std::uniform_int_distribution<int64_t> tok(0, V - 1);
    std::vector<float> ids(static_cast<size_t>(T)), tg(static_cast<size_t>(T)), cu;
    for (auto& x : ids) x = static_cast<float>(tok(rng));
    for (auto& x : tg) x = static_cast<float>(tok(rng));
    for (int64_t b = 0; b <= d.micro_batch; ++b) cu.push_back(static_cast<float>(b * d.seq));
    KILN_TRY(g.upload(*m.ids, ids));
    KILN_TRY(g.upload(*m.targets, tg));
    KILN_TRY(g.upload(*m.cu_seqlens, cu));
  }
  KILN_ASSIGN_OR_RETURN(m.wemb, g.make("embed.weight", dt, V, H));
  KILN_TRY(g.upload(*m.wemb, uniform(V * H, -1.0f, 1.0f)));
  for (int64_t l = 0; l < d.layers; ++l) {
    Layer L;
    const std::string p = fmt::format("layers.{}.", l);
    KILN_ASSIGN_OR_RETURN(L.g_attn, gamma(p + "attn_norm.weight"));
    KILN_ASSIGN_OR_RETURN(L.wqkv, weight(p + "qkv.weight", Q, H));
    KILN_ASSIGN_OR_RETURN(L.wo, weight(p + "o.weight", H, HD));
    KILN_ASSIGN_OR_RETURN(L.g_mlp, gamma(p + "mlp_norm.weight"));
    KILN_ASSIGN_OR_RETURN(L.wgu, weight(p + "gate_up.weight", 2 * I, H));
    KILN_ASSIGN_OR_RETURN(L.wd, weight(p + "down.weight", H, I));
    KILN_ASSIGN_OR_RETURN(L.xn, act(p + "xn", dt, T, H));
    KILN_ASSIGN_OR_RETURN(L.r, act(p + "r", dt, T, H));
    KILN_ASSIGN_OR_RETURN(L.rstd1, act(p + "rstd1", DType::f32, 1, T));
    KILN_ASSIGN_OR_RETURN(L.qkv, act(p + "qkv", dt, T, Q));
    KILN_ASSIGN_OR_RETURN(L.o, act(p + "o", dt, T, HD));
    KILN_ASSIGN_OR_RETURN(L.lse, act(p + "lse", DType::f32, d.heads, T));
    KILN_ASSIGN_OR_RETURN(L.a, act(p + "a", dt, T, H));
    KILN_ASSIGN_OR_RETURN(L.hn, act(p + "hn", dt, T, H));
    KILN_ASSIGN_OR_RETURN(L.h, act(p + "h", dt, T, H));
    KILN_ASSIGN_OR_RETURN(L.rstd2, act(p + "rstd2", DType::f32, 1, T));
    KILN_ASSIGN_OR_RETURN(L.gu, act(p + "gu", dt, T, 2 * I));
    KILN_ASSIGN_OR_RETURN(L.s, act(p + "s", dt, T, I));
    KILN_ASSIGN_OR_RETURN(L.d, act(p + "d", dt, T, H));
    KILN_ASSIGN_OR_RETURN(L.dg_attn, act(p + "attn_norm.weight.grad", dt, 1, H));
    KILN_ASSIGN_OR_RETURN(L.dwqkv, act(p + "qkv.weight.grad", DType::f32, Q, H));
    KILN_ASSIGN_OR_RETURN(L.dwo, act(p + "o.weight.grad", DType::f32, H, HD));
    KILN_ASSIGN_OR_RETURN(L.dg_mlp, act(p + "mlp_norm.weight.grad", dt, 1, H));
    KILN_ASSIGN_OR_RETURN(L.dwgu, act(p + "gate_up.weight.grad", DType::f32, 2 * I, H));
    KILN_ASSIGN_OR_RETURN(L.dwd, act(p + "down.weight.grad", DType::f32, H, I));
    m.layers.push_back(L);
  }
  KILN_ASSIGN_OR_RETURN(m.g_final, gamma("final_norm.weight"));
  KILN_ASSIGN_OR_RETURN(m.wlm, weight("lm_head.weight", V, H));
  KILN_ASSIGN_OR_RETURN(m.r0, act("r0", dt, T, H));
  KILN_ASSIGN_OR_RETURN(m.fn, act("fn", dt, T, H));
  KILN_ASSIGN_OR_RETURN(m.r_final, act("r_final", dt, T, H));
  KILN_ASSIGN_OR_RETURN(m.rstd_f, act("rstd_final", DType::f32, 1, T));
  KILN_ASSIGN_OR_RETURN(m.logits, act("logits", dt, T, V));
  KILN_ASSIGN_OR_RETURN(m.loss, act("loss", DType::f32, 1, T));
  KILN_ASSIGN_OR_RETURN(m.lse_ce, act("lse_ce", DType::f32, 1, T));
  KILN_ASSIGN_OR_RETURN(m.dloss, act("dloss", DType::f32, 1, T));
  KILN_TRY(g.upload(*m.dloss, std::vector<float>(static_cast<size_t>(T), 1.0f / static_cast<float>(T))));
  KILN_ASSIGN_OR_RETURN(m.dwemb, act("embed.weight.grad", DType::f32, V, H));
  KILN_ASSIGN_OR_RETURN(m.dg_final, act("final_norm.weight.grad", dt, 1, H));
  KILN_ASSIGN_OR_RETURN(m.dwlm, act("lm_head.weight.grad", DType::f32, V, H));
  KILN_ASSIGN_OR_RETURN(m.g, act("g", dt, T, H));
  KILN_ASSIGN_OR_RETURN(m.gh, act("gh", dt, T, H));
  KILN_ASSIGN_OR_RETURN(m.dfn, act("dfn", dt, T, H));
  KILN_ASSIGN_OR_RETURN(m.ds, act("ds", dt, T, I));
  KILN_ASSIGN_OR_RETURN(m.dgu, act("dgu", dt, T, 2 * I));
  KILN_ASSIGN_OR_RETURN(m.dhn, act("dhn", dt, T, H));
  KILN_ASSIGN_OR_RETURN(m.do_, act("do", dt, T, HD));
  KILN_ASSIGN_OR_RETURN(m.dqkv, act("dqkv", dt, T, Q));
  KILN_ASSIGN_OR_RETURN(m.dxn, act("dxn", dt, T, H));
  if (recipe) {
    const int64_t xg = recipe->x_gran, wg = recipe->w_gran;
    for (size_t l = 0; l < m.layers.size(); ++l) {
      Layer& L = m.layers[l];
      const std::string p = fmt::format("layers.{}.", l);
      KILN_ASSIGN_OR_RETURN(L.xn8, make_q8(g, p + "xn", m.e4, T, H, xg));
      KILN_ASSIGN_OR_RETURN(L.o8, make_q8(g, p + "o", m.e4, T, HD, xg));
      KILN_ASSIGN_OR_RETURN(L.hn8, make_q8(g, p + "hn", m.e4, T, H, xg));
      KILN_ASSIGN_OR_RETURN(L.s8, make_q8(g, p + "s", m.e4, T, I, xg));
      KILN_ASSIGN_OR_RETURN(L.wqkv8, make_q8(g, p + "qkv.weight", m.e4, Q, H, wg));
      KILN_ASSIGN_OR_RETURN(L.wo8, make_q8(g, p + "o.weight", m.e4, H, HD, wg));
      KILN_ASSIGN_OR_RETURN(L.wgu8, make_q8(g, p + "gate_up.weight", m.e4, 2 * I, H, wg));
      KILN_ASSIGN_OR_RETURN(L.wd8, make_q8(g, p + "down.weight", m.e4, H, I, wg));
    }
    KILN_ASSIGN_OR_RETURN(m.g8, make_q8(g, "g", m.e5, T, H, xg));
    KILN_ASSIGN_OR_RETURN(m.gh8, make_q8(g, "gh", m.e5, T, H, xg));
    KILN_ASSIGN_OR_RETURN(m.dgu8, make_q8(g, "dgu", m.e5, T, 2 * I, xg));
    KILN_ASSIGN_OR_RETURN(m.dqkv8, make_q8(g, "dqkv", m.e5, T, Q, xg));
  }
  return m;
}

// ---- the fp8 step's calls ------------------------------------------------------------------------
// swiglu_bwd's fused fp8 output holds a row of dx (2 I) in registers: up to 65536 columns.
bool swiglu_bwd_fused(const Model& m) { return m.f8->fused && 2 * m.dims.intermediate <= 65536; }

// A fused fp8 output on a producing op's spec (rmsnorm, swiglu and their backward).
KernelSpec with_fp8_out(KernelSpec s, DType fmt, int64_t gran) {
  const bool fnuz = fmt == DType::e4m3fnuz || fmt == DType::e5m2fnuz;
  const bool e5 = fmt == DType::e5m2 || fmt == DType::e5m2fnuz;
  s.params["fp8_out"] = (fnuz ? 3 : 1) + (e5 ? 1 : 0);
  s.params["fp8_granularity"] = gran;
  return s;
}

// The quantize_fp8 calls of a [R, C] tensor x into its copy c: tensorwise, q and qt in one call;
// otherwise q (unless a fused output wrote it: need_q false) and qt in 1x128 blocks along R.
Result<void> quantize(Graph& g, const Model& m, View x, Q8& c, DType fmt, int64_t gran, bool need_q) {
  KernelSpec s{"quantize_fp8", m.dt, fmt, {{"rows", x.rows}, {"cols", x.cols}, {"granularity", gran}}};
  if (gran == 0) {
    s.params["transpose"] = 1;
    return g.run("quantize_fp8", s, {x}, {whole(*c.q), whole(*c.s), whole(*c.qt)});
  }
  if (need_q) {
    s.params["transpose"] = 0;
    KILN_TRY(g.run("quantize_fp8", s, {x}, {whole(*c.q), whole(*c.s)}));
  }
  s.params["granularity"] = 2;  // block1x128
  s.params["transpose"] = 1;
  s.params["only_qt"] = 1;
  return g.run("quantize_fp8 (transpose)", s, {x}, {whole(*c.qt), whole(*c.st)});
}

// C [M, N] = (A * sa) @ (B * sb)^T, A [M, K] and B [N, K] fp8 (B e4m3).
Result<void> gemm8(Graph& g, const std::string& label, int64_t gran, Buf& A, Buf& sa, Buf& B, Buf& sb, Buf& C) {
  const KernelSpec s{"gemm_fp8", A.dt, C.dt, {{"M", A.rows}, {"N", B.rows}, {"K", A.cols}, {"granularity", gran}}};
  return g.run(label, s, {whole(A), whole(B), whole(sa), whole(sb)}, {whole(C)});
}

// The three GEMMs of a linear layer y = x W^T, in bf16 (m.f8 null) or through gemm_fp8.
Result<void> linear_fwd(Graph& g, Model& m, const std::string& name, Buf& x, Q8& x8, Buf& w, Q8& w8, Buf& y) {
  if (!m.f8)
    return g.run("gemm " + name, gemm(m, x.rows, w.rows, x.cols, false, true, m.dt), {whole(x), whole(w)}, {whole(y)});
  return gemm8(g, "gemm_fp8 " + name, m.f8->fwd, *x8.q, *x8.s, *w8.q, *w8.s, y);
}
Result<void> linear_dgrad(Graph& g, Model& m, const std::string& name, Buf& dy, Q8& dy8, Buf& w, Q8& w8, Buf& dx) {
  if (!m.f8)
    return g.run("gemm " + name + " dgrad", gemm(m, dy.rows, w.cols, dy.cols, false, false, m.dt), {whole(dy), whole(w)},
                 {whole(dx)});
  // W^T [K, N]: tensorwise, W's scale; 1x128 blocks along N otherwise.
  return gemm8(g, "gemm_fp8 " + name + " dgrad", m.f8->dgrad, *dy8.q, *dy8.s, *w8.qt, *w8.st, dx);
}
Result<void> linear_wgrad(Graph& g, Model& m, const std::string& name, Buf& dy, Q8& dy8, Buf& x, Q8& x8, Buf& dw) {
  if (!m.f8)
    return g.run("gemm " + name + " wgrad", gemm(m, dy.cols, x.cols, dy.rows, true, false, DType::f32),
                 {whole(dy), whole(x)}, {whole(dw)});
  return gemm8(g, "gemm_fp8 " + name + " wgrad", m.f8->wgrad, *dy8.qt, *dy8.st, *x8.qt, *x8.st, dw);
}

const std::map<std::string, float> kEps = {{"eps", 1e-5f}};

// The step, in bf16 (m.f8 null) or with every layer GEMM in fp8 (m.f8: the recipe).
Result<void> forward(Graph& g, Model& m) {
  const Dims& d = m.dims;
  const int64_t T = d.tokens(), I = d.intermediate;
  const Fp8Recipe* f8 = m.f8;
  const bool fused = f8 && f8->fused;
  const int64_t xg = f8 ? f8->x_gran : 0;
  if (f8)  // the weights' fp8 copies, once per step (an optimizer step changes them)
    for (Layer& L : m.layers)
      for (auto [w, w8] : {std::pair{L.wqkv, &L.wqkv8}, {L.wo, &L.wo8}, {L.wgu, &L.wgu8}, {L.wd, &L.wd8}})
        KILN_TRY(quantize(g, m, whole(*w), *w8, m.e4, f8->w_gran, true));
  // A norm (or swiglu) whose y feeds a layer GEMM: with a fused recipe y_fp8 and y_scale too.
  auto fp8_outs = [&](std::vector<View> outs, Q8& c) {
    if (fused) {
      outs.push_back(whole(*c.q));
      outs.push_back(whole(*c.s));
    }
    return outs;
  };
  auto with_fp8 = [&](KernelSpec s, DType fmt) { return fused ? with_fp8_out(std::move(s), fmt, xg) : s; };
  auto quant = [&](Buf& x, Q8& c, bool produced_fused) -> Result<void> {
    if (!f8) return kiln::ok();
    return quantize(g, m, whole(x), c, m.e4, xg, !(produced_fused && fused));
  };
  KILN_TRY(g.run("embedding", embedding(m, false), {whole(*m.ids), whole(*m.wemb)}, {whole(*m.r0)}));
  for (size_t l = 0; l < m.layers.size(); ++l) {
    Layer& L = m.layers[l];
    if (l == 0) {
      KILN_TRY(g.run("rmsnorm", with_fp8(rmsnorm(m, false), m.e4), {whole(*m.r0), whole(*L.g_attn)},
                     fp8_outs({whole(*L.xn), whole(*L.rstd1)}, L.xn8), kEps));
    } else {  // r_l = h_{l-1} + d_{l-1}, fused
      const Layer& P = m.layers[l - 1];
      KILN_TRY(g.run("rmsnorm+residual", with_fp8(rmsnorm(m, true), m.e4), {whole(*P.h), whole(*P.d), whole(*L.g_attn)},
                     fp8_outs({whole(*L.xn), whole(*L.r), whole(*L.rstd1)}, L.xn8), kEps));
    }
    KILN_TRY(quant(*L.xn, L.xn8, true));
    KILN_TRY(linear_fwd(g, m, "qkv", *L.xn, L.xn8, *L.wqkv, L.wqkv8, *L.qkv));
    const View q = q_of(m, *L.qkv), k = k_of(m, *L.qkv), v = v_of(m, *L.qkv);
    KILN_TRY(g.run("rope", rope(m, false), {q, k, whole(*m.cu_seqlens)}, {q, k}));
    KILN_TRY(g.run("attention", attention(m, false), {q, k, v, whole(*m.cu_seqlens), whole(*m.cu_seqlens)},
                   {whole(*L.o), whole(*L.lse)}));
    KILN_TRY(quant(*L.o, L.o8, false));
    KILN_TRY(linear_fwd(g, m, "attn_out", *L.o, L.o8, *L.wo, L.wo8, *L.a));
    const Buf& resid = l == 0 ? *m.r0 : *L.r;
    KILN_TRY(g.run("rmsnorm+residual", with_fp8(rmsnorm(m, true), m.e4),
                   {whole(const_cast<Buf&>(resid)), whole(*L.a), whole(*L.g_mlp)},
                   fp8_outs({whole(*L.hn), whole(*L.h), whole(*L.rstd2)}, L.hn8), kEps));
    KILN_TRY(quant(*L.hn, L.hn8, true));
    KILN_TRY(linear_fwd(g, m, "gate_up", *L.hn, L.hn8, *L.wgu, L.wgu8, *L.gu));
    KILN_TRY(g.run("swiglu", with_fp8({"swiglu", m.dt, m.dt, {{"rows", T}, {"intermediate", I}}}, m.e4), {whole(*L.gu)},
                   fp8_outs({whole(*L.s)}, L.s8)));
    KILN_TRY(quant(*L.s, L.s8, true));
    KILN_TRY(linear_fwd(g, m, "down", *L.s, L.s8, *L.wd, L.wd8, *L.d));
  }
  const Layer& last = m.layers.back();
  KILN_TRY(g.run("rmsnorm+residual", rmsnorm(m, true), {whole(*last.h), whole(*last.d), whole(*m.g_final)},
                 {whole(*m.fn), whole(*m.r_final), whole(*m.rstd_f)}, kEps));
  KILN_TRY(g.run("gemm lm_head", gemm(m, T, d.vocab, d.hidden, false, true, m.dt), {whole(*m.fn), whole(*m.wlm)},
                 {whole(*m.logits)}));
  // The loss, and dlogits written over the logits for the backward's lm_head GEMMs.
  KILN_TRY(g.run("cross_entropy+bwd", cross_entropy(m), {whole(*m.logits), whole(*m.targets), whole(*m.dloss)},
                 {whole(*m.loss), whole(*m.lse_ce), whole(*m.logits)}));
  return kiln::ok();
}

Result<void> backward(Graph& g, Model& m) {
  const Dims& d = m.dims;
  const int64_t T = d.tokens(), H = d.hidden, I = d.intermediate;
  const DType f32 = DType::f32;
  const Fp8Recipe* f8 = m.f8;
  const bool fused = f8 && f8->fused;
  const int64_t xg = f8 ? f8->x_gran : 0;
  auto fp8_outs = [&](std::vector<View> outs, Q8& c, bool on) {
    if (on) {
      outs.push_back(whole(*c.q));
      outs.push_back(whole(*c.s));
    }
    return outs;
  };
  auto with_fp8 = [&](KernelSpec s, bool on) { return on ? with_fp8_out(std::move(s), m.e5, xg) : s; };
  auto quant = [&](Buf& dy, Q8& c, bool produced_fused) -> Result<void> {
    if (!f8) return kiln::ok();
    return quantize(g, m, whole(dy), c, m.e5, xg, !produced_fused);
  };
  // The lm_head's gradients from dlogits, which the forward's cross_entropy wrote over the logits
  // (bf16 in both steps).
  KILN_TRY(g.run("gemm lm_head wgrad", gemm(m, d.vocab, H, T, true, false, f32), {whole(*m.logits), whole(*m.fn)},
                 {whole(*m.dwlm)}));
  KILN_TRY(g.run("gemm lm_head dgrad", gemm(m, T, H, d.vocab, false, false, m.dt), {whole(*m.logits), whole(*m.wlm)},
                 {whole(*m.dfn)}));
  // g = dL/d(h_{L-1} + d_{L-1}): the last layer's down dy.
  KILN_TRY(g.run("rmsnorm_bwd", with_fp8(rmsnorm_bwd(m, false), fused),
                 {whole(*m.dfn), whole(*m.r_final), whole(*m.g_final), whole(*m.rstd_f)},
                 fp8_outs({whole(*m.g), whole(*m.dg_final)}, m.g8, fused)));
  for (size_t li = m.layers.size(); li-- > 0;) {
    Layer& L = m.layers[li];
    // MLP: d = s Wd^T, s = swiglu(gu), gu = hn Wgu^T.
    KILN_TRY(quant(*m.g, m.g8, fused));
    KILN_TRY(linear_wgrad(g, m, "down", *m.g, m.g8, *L.s, L.s8, *L.dwd));
    KILN_TRY(linear_dgrad(g, m, "down", *m.g, m.g8, *L.wd, L.wd8, *m.ds));
    const bool dgu_fused = f8 && swiglu_bwd_fused(m);
    KILN_TRY(g.run("swiglu_bwd", with_fp8({"swiglu_bwd", m.dt, m.dt, {{"rows", T}, {"intermediate", I}}}, dgu_fused),
                   {whole(*m.ds), whole(*L.gu)}, fp8_outs({whole(*m.dgu)}, m.dgu8, dgu_fused)));
    KILN_TRY(quant(*m.dgu, m.dgu8, dgu_fused));
    KILN_TRY(linear_wgrad(g, m, "gate_up", *m.dgu, m.dgu8, *L.hn, L.hn8, *L.dwgu));
    KILN_TRY(linear_dgrad(g, m, "gate_up", *m.dgu, m.dgu8, *L.wgu, L.wgu8, *m.dhn));
    // gh = dL/dh = g + rmsnorm_bwd(dhn): the residual gradient added in the norm's pass.
    KILN_TRY(g.run("rmsnorm_bwd+dres", with_fp8(rmsnorm_bwd(m, true), fused),
                   {whole(*m.dhn), whole(*L.h), whole(*L.g_mlp), whole(*L.rstd2), whole(*m.g)},
                   fp8_outs({whole(*m.gh), whole(*L.dg_mlp)}, m.gh8, fused)));
    // Attention output projection: a = o Wo^T, dL/da = gh.
    KILN_TRY(quant(*m.gh, m.gh8, fused));
    KILN_TRY(linear_wgrad(g, m, "attn_out", *m.gh, m.gh8, *L.o, L.o8, *L.dwo));
    KILN_TRY(linear_dgrad(g, m, "attn_out", *m.gh, m.gh8, *L.wo, L.wo8, *m.do_));
    const View q = q_of(m, *L.qkv), k = k_of(m, *L.qkv), v = v_of(m, *L.qkv);
    const View dq = q_of(m, *m.dqkv), dk = k_of(m, *m.dqkv), dv = v_of(m, *m.dqkv);
    KILN_TRY(g.run("attention_bwd", attention(m, true),
                   {whole(*m.do_), q, k, v, whole(*L.o), whole(*L.lse), whole(*m.cu_seqlens), whole(*m.cu_seqlens)},
                   {dq, dk, dv}));
    KILN_TRY(g.run("rope_bwd", rope(m, true), {dq, dk, whole(*m.cu_seqlens)}, {dq, dk}));
    KILN_TRY(quant(*m.dqkv, m.dqkv8, false));
    KILN_TRY(linear_wgrad(g, m, "qkv", *m.dqkv, m.dqkv8, *L.xn, L.xn8, *L.dwqkv));
    KILN_TRY(linear_dgrad(g, m, "qkv", *m.dqkv, m.dqkv8, *L.wqkv, L.wqkv8, *m.dxn));
    // g = dL/dr_l = gh + rmsnorm_bwd(dxn) (r_0 is the embedding output): the previous layer's down
    // dy, in fp8 too where there is one (the first layer's goes to the embedding alone).
    Buf& x = li == 0 ? *m.r0 : *L.r;
    const bool g_fused = fused && li > 0;
    KILN_TRY(g.run("rmsnorm_bwd+dres", with_fp8(rmsnorm_bwd(m, true), g_fused),
                   {whole(*m.dxn), whole(x), whole(*L.g_attn), whole(*L.rstd1), whole(*m.gh)},
                   fp8_outs({whole(*m.g), whole(*L.dg_attn)}, m.g8, g_fused)));
  }
  KILN_TRY(g.run("embedding_bwd", embedding(m, true), {whole(*m.ids), whole(*m.g)}, {whole(*m.dwemb)}));
  return kiln::ok();
}

// Every gradient, with its name, in a fixed order.
std::vector<Buf*> gradients(Model& m) {
  std::vector<Buf*> out = {m.dwemb};
  for (Layer& L : m.layers)
    for (Buf* b : {L.dg_attn, L.dwqkv, L.dwo, L.dg_mlp, L.dwgu, L.dwd}) out.push_back(b);
  out.push_back(m.dg_final);
  out.push_back(m.dwlm);
  return out;
}
std::vector<Buf*> parameters(Model& m) {
  std::vector<Buf*> out = {m.wemb};
  for (Layer& L : m.layers)
    for (Buf* b : {L.g_attn, L.wqkv, L.wo, L.g_mlp, L.wgu, L.wd}) out.push_back(b);
  out.push_back(m.g_final);
  out.push_back(m.wlm);
  return out;
}

Result<double> mean_loss(Graph& g, Model& m) {
  KILN_ASSIGN_OR_RETURN(auto loss, g.download(*m.loss));
  double sum = 0;
  for (float x : loss) sum += x;
  return sum / static_cast<double>(loss.size());
}

Result<void> dump(Graph& g, Model& m, double loss, const std::string& dir) {
  nlohmann::ordered_json index;
  index["model"] = m.dims.name;
  index["layers"] = m.dims.layers;
  index["seq"] = m.dims.seq;
  index["micro_batch"] = m.dims.micro_batch;
  index["dims"] = {{"hidden", m.dims.hidden},     {"intermediate", m.dims.intermediate}, {"heads", m.dims.heads},
                   {"kv_heads", m.dims.kv_heads}, {"head_dim", m.dims.head_dim},         {"vocab", m.dims.vocab}};
  index["rope_theta"] = m.dims.rope_theta;
  index["rope_scaling"] = m.dims.llama3_scaling ? "llama3" : "none";
  index["eps"] = 1e-5;
  index["loss"] = loss;
  std::vector<Buf*> bufs = {m.ids, m.targets};
  for (Buf* b : parameters(m)) bufs.push_back(b);
  for (Buf* b : gradients(m)) bufs.push_back(b);
  return kiln_example::dump_tensors(g, bufs, std::move(index), dir);
}

int fail(const kiln::Error& e) {
  std::fprintf(stderr, "llama_step: error: %s\n", e.message.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"One training step (forward and backward) of a Llama model through Kiln's C++ API alone"};
  std::string model = "llama3.1-8b", models_path = KILN_MODELS_JSON, dump_dir, fp8_name;
  kiln_example::RuntimeArgs run_args;
  int64_t layers = 2, micro_batch = 1, seq = 0, time_steps = 15;
  uint64_t seed = 1234;
  bool check = false, require_prewarmed = false, breakdown = true;
  app.add_option("--model", model, "model name in the model table (models/models.json, section dense)");
  app.add_option("--models", models_path, "the model table");
  app.add_option("--layers", layers, "decoder layers")->check(CLI::Range(1, 1024));
  app.add_option("--micro-batch", micro_batch, "sequences per step")->check(CLI::Range(1, 1024));
  app.add_option("--seq", seq, "sequence length (default: the model's)")->check(CLI::Range(0, 1 << 20));
  run_args.add_to(app, "the step");
  app.add_option("--time", time_steps,
                 "timed steps after one warm-up, reported as median, min and max (0: none; the step spreads by "
                 "25% on an H100, so fewer than 15 give a noisy median)")
      ->check(CLI::Range(0, 1000));
  app.add_flag("!--no-breakdown", breakdown, "skip the per-op time breakdown");
  app.add_flag("--check", check, "compare the loss and every gradient with the same graph on the CPU references");
  app.add_option("--dump", dump_dir, "write weights, inputs, loss and gradients here (for scripts/llama_step_torch.py)");
  app.add_flag("--require-prewarmed", require_prewarmed, "fail if the step compiles a kernel");
  app.add_option("--seed", seed, "seed of the weights and the batch");
  app.add_option("--fp8", fp8_name,
                 "also run the step with the layer GEMMs in fp8: tensorwise, block (1x128 activations and gradients, "
                 "128x128 weights) or block1x128; reports its time and loss difference from the bf16 step");
  CLI11_PARSE(app, argc, argv);

  auto dims = load_dims(models_path, model);
  if (!dims) return fail(dims.error());
  dims->layers = layers;
  dims->micro_batch = micro_batch;
  if (seq > 0) dims->seq = seq;
  const Dims& d = *dims;
  std::optional<Fp8Recipe> recipe;
  if (!fp8_name.empty()) {
    auto r = fp8_recipe(fp8_name);
    if (!r) return fail(r.error());
    recipe = *r;
  }
  // Limits checked before anything is allocated: int32 offsets and the device's memory.
  if (d.tokens() * std::max(d.vocab, d.qkv_cols()) >= (int64_t{1} << 31))
    return fail({kiln::Errc::invalid_argument,
                 fmt::format("--seq {} x --micro-batch {} = {} tokens: tokens x vocab ({}) must stay below 2^31 "
                             "(the logits' int32 offsets); use fewer tokens",
                             d.seq, d.micro_batch, d.tokens(), d.vocab)});

  auto opened = kiln_example::open_runtime("llama_step", run_args);
  if (!opened.runtime) return opened.exit_code;
  kiln::Runtime& runtime = *opened.runtime;
  kiln::Device& dev = *runtime.device();
  const bool emulated = run_args.emulated();
  std::printf("llama_step: %s, %ld layers, seq %ld x micro-batch %ld = %ld tokens, bf16%s; device %s (%s)\n",
              d.name.c_str(), long(d.layers), long(d.seq), long(d.micro_batch), long(d.tokens()),
              recipe ? fmt::format(" and fp8 {}", recipe->name).c_str() : "", dev.name().c_str(),
              std::string(dev.target().name).c_str());
  {  // memory estimate, before allocation
    const double T = static_cast<double>(d.tokens()), H = static_cast<double>(d.hidden),
                 I = static_cast<double>(d.intermediate), V = static_cast<double>(d.vocab),
                 Q = static_cast<double>(d.qkv_cols()), L = static_cast<double>(d.layers);
    const double per_layer = 2 * (Q * H + H * d.heads * d.head_dim + 3 * I * H) * 3 +   // weights + fp32 grads
                             2 * T * (6 * H + Q + d.heads * d.head_dim + 3 * I);          // saved activations
    double total = L * per_layer + 2 * V * H * 3 * 2 + 2 * T * V + 2 * T * (8 * H + 3 * I + Q);
    if (recipe)  // fp8 copies: q and qt of x, W per layer, and of the gradients
      total += L * 2 * (T * (2 * H + d.heads * d.head_dim + I) + Q * H + H * d.heads * d.head_dim + 3 * I * H) +
               2 * T * (2 * H + 2 * I + Q);
    std::printf("llama_step: about %.1f GiB of device memory\n", total / (1 << 30));
  }
  const auto stats0 = runtime.stats();
  Graph g(&runtime, true, false);
  auto m = build(g, d, DType::bf16, seed, recipe, &dev.target());
  if (!m) return fail(m.error());
  auto step = [&]() -> Result<void> {
    m->f8 = nullptr;
    KILN_TRY(forward(g, *m));
    return backward(g, *m);
  };
  auto step8 = [&]() -> Result<void> {  // the same weights and batch, the layer GEMMs in fp8
    m->f8 = &*m->recipe;
    KILN_TRY(forward(g, *m));
    return backward(g, *m);
  };
  if (auto r = step(); !r) return fail(r.error());
  if (auto r = dev.synchronize(); !r) return fail(r.error());
  const auto stats1 = runtime.stats();
  const uint64_t compiled = stats1.compiles - stats0.compiles;
  std::printf("llama_step: first step: %lu kernels compiled, %lu disk hits, %lu memory hits\n", (unsigned long)compiled,
              (unsigned long)(stats1.disk_hits - stats0.disk_hits), (unsigned long)(stats1.memory_hits - stats0.memory_hits));
  auto loss = mean_loss(g, *m);
  if (!loss) return fail(loss.error());
  std::printf("llama_step: loss %.6f (ln(vocab) = %.6f)\n", *loss, std::log(static_cast<double>(d.vocab)));
  int rc = 0;
  if (require_prewarmed && compiled > 0) {
    std::printf("llama_step: FAIL: the step compiled %lu kernels (run kiln manifest + kiln prewarm first)\n",
                (unsigned long)compiled);
    rc = 1;
  }
  if (!dump_dir.empty())
    if (auto r = dump(g, *m, *loss, dump_dir); !r) return fail(r.error());

  Graph host(&runtime, false, false);
  Result<Model> hm = kiln::make_error(kiln::Errc::invalid_argument, "no CPU reference graph");
  Result<double> hloss = 0.0;
  if (check) {
    hm = build(host, d, DType::bf16, seed);
    if (!hm) return fail(hm.error());
    if (auto r = forward(host, *hm); !r) return fail(r.error());
    if (auto r = backward(host, *hm); !r) return fail(r.error());
    hloss = mean_loss(host, *hm);
    if (!hloss) return fail(hloss.error());
    const double rel = std::fabs(*loss - *hloss) / std::max(std::fabs(*hloss), 1e-12);
    bool pass = rel < 1e-3;
    std::printf("check: loss %.6f vs CPU references %.6f: relative error %.2e (gate 1e-3) %s\n", *loss, *hloss, rel,
                rel < 1e-3 ? "PASS" : "FAIL");
    auto grads = kiln_example::check_buffers(g, gradients(*m), host, gradients(*hm), "", 28);
    if (!grads) return fail(grads.error());
    pass = *grads && pass;
    std::printf("check: %s\n", pass ? "PASS" : "FAIL");
    if (!pass) rc = 1;
  }

  // The fp8 step, after the bf16 one (its gradients are overwritten): its compiles, loss and checks.
  double loss8 = 0;
  if (recipe) {
    const auto s0 = runtime.stats();
    if (auto r = step8(); !r) return fail(r.error());
    if (auto r = dev.synchronize(); !r) return fail(r.error());
    const auto s1 = runtime.stats();
    std::printf("llama_step: first fp8 step: %lu kernels compiled, %lu disk hits, %lu memory hits\n",
                (unsigned long)(s1.compiles - s0.compiles), (unsigned long)(s1.disk_hits - s0.disk_hits),
                (unsigned long)(s1.memory_hits - s0.memory_hits));
    if (require_prewarmed && s1.compiles > s0.compiles) {
      std::printf("llama_step: FAIL: the fp8 step compiled %lu kernels (run kiln manifest --fp8 %s + kiln prewarm first)\n",
                  (unsigned long)(s1.compiles - s0.compiles), recipe->name.c_str());
      rc = 1;
    }
    auto l8 = mean_loss(g, *m);
    if (!l8) return fail(l8.error());
    loss8 = *l8;
    std::printf("llama_step: fp8 %s loss %.6f, bf16 loss %.6f: difference %+.6f (relative %.2e)\n",
                recipe->name.c_str(), loss8, *loss, loss8 - *loss, std::fabs(loss8 - *loss) / std::fabs(*loss));
    if (check) {
      // Gates (docs/gemm-fp8.md, "The fp8 training step"), against the bf16 graph on the CPU
      // references: the loss within 2e-3 and every gradient above 12 dB. BENCHMARKS.md gates one
      // hybrid e5m2 x e4m3 GEMM at 20 dB; a weight's gradient goes through the e5m2 rounding of its
      // dy and, through the dgrad GEMMs, of every later layer's (kiln-tiny, emulator: 16-27 dB, the
      // loss within 6e-4).
      // A wrong scale or layout anywhere gives about 0 dB. (The same fp8 graph on the CPU
      // references is no closer: a block's scale follows its amax, which differs by a bf16 unit
      // where the inputs do, and then every code of the block may round the other way.)
      const double rel16 = std::fabs(loss8 - *hloss) / std::max(std::fabs(*hloss), 1e-12);
      bool pass = rel16 < 2e-3;
      std::printf("check: fp8 loss %.6f vs CPU references in bf16 %.6f: relative difference %.2e (gate 2e-3) %s\n",
                  loss8, *hloss, rel16, rel16 < 2e-3 ? "PASS" : "FAIL");
      auto grads = kiln_example::check_buffers(g, gradients(*m), host, gradients(*hm), "fp8 ", 32, 12);
      if (!grads) return fail(grads.error());
      pass = *grads && pass;
      std::printf("check: fp8 %s\n", pass ? "PASS" : "FAIL");
      if (!pass) rc = 1;
    }
  }

  if (!emulated && time_steps > 0) {
    auto times = kiln_example::sorted_times(dev, step, time_steps);
    if (!times) return fail(times.error());
    const std::vector<float>& ms = *times;
    std::printf("llama_step: step time %.3f ms (median of %ld; min %.3f, max %.3f)\n", ms[ms.size() / 2],
                long(ms.size()), ms.front(), ms.back());
    if (recipe) {
      auto times8 = kiln_example::sorted_times(dev, step8, time_steps);
      if (!times8) return fail(times8.error());
      const std::vector<float>& ms8 = *times8;
      std::printf("llama_step: fp8 %s step time %.3f ms (median of %ld; min %.3f, max %.3f): %.3fx the bf16 step; "
                  "loss difference %+.6f\n",
                  recipe->name.c_str(), ms8[ms8.size() / 2], long(ms8.size()), ms8.front(), ms8.back(),
                  ms[ms.size() / 2] / ms8[ms8.size() / 2], loss8 - *loss);
    }
    // The breakdown of the step the user asked about: the fp8 one with --fp8.
    if (breakdown) {
      g.set_breakdown(true);
      if (auto r = recipe ? step8() : step(); !r) return fail(r.error());
      kiln_example::print_breakdown(g, recipe ? "one fp8 " + recipe->name + " step" : "one bf16 step");
    }
  }
  return rc;
}
