// One Mixture-of-Experts block, forward and backward, through Kiln's C++ API alone (issue 18):
//
//   logits = x @ W_router^T                         [T, E] bf16          (gemm NT)
//   topk_ids, topk_weights = moe_router(logits, bias?)                   (softmax or sigmoid + bias,
//                                                                         group limit, renormalized, scaled)
//   x_sorted, row_map, offsets = moe_permute(x, topk_ids)  [T k, H]      (this rank's G experts)
//   gu = x_sorted @ W_gate_up[g]^T                  [T k, 2I]            (grouped_gemm nt)
//   s  = swiglu(gu)                                 [T k, I]
//   y_sorted = s @ W_down[g]^T                      [T k, H]             (grouped_gemm nt)
//   y = moe_unpermute(y_sorted, row_map, topk_weights)  [T, H]           (weighted sum in slot order)
//
// then, from a random upstream gradient dy [T, H], the backward to dx, dW_router, dW_gate_up
// [G, 2I, H] and dW_down [G, H, I] (fp32): moe_unpermute_bwd (dy_sorted and dtopk_weights), the
// grouped dgrad (nn) and wgrad (tn) GEMMs, swiglu_bwd, moe_router_bwd (dlogits), the router's
// dgrad and wgrad GEMMs, and moe_permute_bwd. x reaches y along two paths, the experts and the
// router; their gradients meet in dx without an add kernel: the router's dgrad GEMM writes
// dlogits @ W_router into dx, and moe_permute_bwd (accumulate) adds the expert rows to it in the
// pass that sums them. No add kernel runs.
//
// Expert parallelism: this rank holds experts [0, G) of the E the router chooses from; slots routed
// to other ranks' experts are dropped by moe_permute (row_map -1), so y is this rank's share of the
// block's output (the all-to-all dispatch that would bring the other shares is not a Kiln op). With
// G = E (Mixtral's default) y is the whole block.
//
// Modes:
//   --backend cuda|hip|auto   run on the GPU; --time N times the block (median of N) and prints a
//                             per-op breakdown
//   --backend emulator --arch gfx942|gfx950   run the AMD kernels in the CDNA emulator (small sizes)
//   --check                   also run the same graph on the CPU through each op's float64 reference
//                             (kiln::reference) and compare y and every gradient (SNR > 30 dB)
//   --dump DIR                write inputs, weights, routing, y and gradients for scripts/moe_block_torch.py
// Exit status: 0 done (and checks passed), 1 an error or a failed check, 77 --backend emulator
// without the emulator (docs/emulator.md); a malformed option gets CLI11's usage error.
//
// Dimensions and routing come from models/models.json's moe section (`--model deepseek-v3`);
// --hidden, --intermediate and --experts shrink a model for tests. Errors name the input and the fix.
#include <kiln/kiln.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "example_graph.h"

#ifndef KILN_MODELS_JSON
#define KILN_MODELS_JSON "models/models.json"
#endif

namespace {

using kiln::DType;
using kiln::KernelSpec;
using kiln::Result;
using kiln_example::Buf;
using kiln_example::Graph;
using kiln_example::View;
using kiln_example::whole;

struct Dims {
  std::string name;
  int64_t hidden = 0, intermediate = 0, experts = 0, topk = 0;
  int64_t experts_per_rank = 0;  ///< G: this rank's experts, [0, G)
  std::vector<int64_t> model_experts_per_rank;  ///< the model's list (models.json)
  int64_t tokens = 0;
  // Routing (moe_router's parameters).
  bool sigmoid = false, bias = false, renormalize = false, group_top2 = false;
  int64_t n_group = 1, topk_group = 0;
  float scaling = 1.0f;  ///< routed_scaling_factor
  int64_t slots() const { return tokens * topk; }
};

Result<Dims> load_dims(const std::string& path, const std::string& model) {
  std::ifstream in(path);
  if (!in)
    return kiln::make_error(kiln::Errc::io_error,
                            fmt::format("cannot read the model table {} (pass --models PATH)", path));
  auto doc = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.contains("moe") || !doc["moe"].is_object())
    return kiln::make_error(kiln::Errc::corrupt, fmt::format("{} is not a model table (no \"moe\" object)", path));
  const auto& moe = doc["moe"];
  if (!moe.contains(model) || model.starts_with("_")) {
    std::string names;
    for (const auto& [n, _] : moe.items())
      if (!n.starts_with("_")) names += (names.empty() ? "" : ", ") + n;
    return kiln::make_error(kiln::Errc::not_found,
                            fmt::format("unknown MoE model '{}'; known models (models.json, section moe): {}", model,
                                        names));
  }
  const auto& m = moe[model];
  Dims d;
  d.name = model;
  for (auto [key, field] : {std::pair{"hidden", &d.hidden}, {"moe_intermediate", &d.intermediate},
                            {"experts", &d.experts}, {"topk", &d.topk}, {"seq", &d.tokens}}) {
    if (!m.contains(key) || !m[key].is_number_integer())
      return kiln::make_error(kiln::Errc::corrupt, fmt::format("{}: model '{}' has no integer '{}'", path, model, key));
    *field = m[key].get<int64_t>();
  }
  if (!m.contains("experts_per_rank") || !m["experts_per_rank"].is_array() || m["experts_per_rank"].empty() ||
      !m["experts_per_rank"][0].is_number_integer())
    return kiln::make_error(kiln::Errc::corrupt,
                            fmt::format("{}: model '{}' has no experts_per_rank list", path, model));
  for (const auto& g : m["experts_per_rank"])
    if (g.is_number_integer()) d.model_experts_per_rank.push_back(g.get<int64_t>());
  d.experts_per_rank = d.model_experts_per_rank.front();
  d.sigmoid = m.value("scoring", std::string("softmax")) == "sigmoid";
  d.bias = m.value("bias", false);
  d.renormalize = m.value("renormalize", false);
  d.n_group = m.value("n_group", int64_t{1});
  d.topk_group = m.value("topk_group", int64_t{0});
  d.group_top2 = m.value("group_score", std::string("max")) == "top2_sum";
  d.scaling = m.value("routed_scaling_factor", 1.0f);
  return d;
}

// The rules the sizes must meet, checked before anything is allocated; each message names the
// option and the fix. The ops check their own limits again when they are compiled.
Result<void> check_dims(const Dims& d) {
  auto bad = [](std::string msg) { return kiln::make_error(kiln::Errc::invalid_argument, std::move(msg)); };
  if (d.tokens < 1) return bad(fmt::format("--tokens {}: give at least 1 token", d.tokens));
  if (d.topk < 1 || d.topk > d.experts)
    return bad(fmt::format("model {}: top-{} of {} experts: k must be in [1, experts]", d.name, d.topk, d.experts));
  if (d.experts_per_rank < 1 || d.experts % d.experts_per_rank != 0)
    return bad(fmt::format("--experts-per-rank {}: must divide the {} experts of {} (every rank holds as many; "
                           "models.json lists {} for it)",
                           d.experts_per_rank, d.experts, d.name, fmt::join(d.model_experts_per_rank, ", ")));
  if (d.n_group > 1 && d.experts % d.n_group != 0)
    return bad(fmt::format("--experts {}: {}'s routing forms {} groups of experts; give a multiple of {}", d.experts,
                           d.name, d.n_group, d.n_group));
  // The row map and the grouped operands' row count are int32 (moe_permute, grouped_gemm).
  constexpr int64_t kInt32Max = (int64_t{1} << 31) - 1;
  if (d.tokens > kInt32Max / d.topk)
    return bad(fmt::format("--tokens {}: tokens x top-{} = {} rows of the expert-sorted tensors exceed the int32 row "
                           "map (at most {} tokens)",
                           d.tokens, d.topk, d.tokens * d.topk, kInt32Max / d.topk));
  return kiln::ok();
}

// ---- the block -----------------------------------------------------------------------------
struct Block {
  Dims d;
  DType dt = DType::bf16;
  // inputs and weights
  Buf *x, *dy, *w_router, *bias = nullptr, *w_gate_up, *w_down;
  // forward
  Buf *logits, *topk_ids, *topk_weights, *tokens_per_expert, *x_sorted, *row_map, *offsets, *gu, *s, *y_sorted, *y;
  // backward
  Buf *dy_sorted, *dtopk_weights, *ds, *dgu, *dx_sorted, *dlogits;
  Buf *dx, *dw_router, *dw_gate_up, *dw_down;
};

KernelSpec gemm(const Block& b, int64_t M, int64_t N, int64_t K, bool ta, bool tb, DType out) {
  return {"gemm", b.dt, out, {{"M", M}, {"N", N}, {"K", K}, {"trans_a", ta}, {"trans_b", tb}}};
}
// Grouped GEMMs over the G experts, the row count an upper bound (T k: the host does not read the
// offsets, so rows past offsets[G], the dropped slots, are in the launch's bounds but in no group;
// swiglu and swiglu_bwd run over all T k rows for the same reason, those rows' values unused).
KernelSpec grouped(const Block& b, int64_t mode, int64_t N, int64_t K, DType out) {
  return {"grouped_gemm", b.dt, out,
          {{"mode", mode}, {"groups", b.d.experts_per_rank}, {"N", N}, {"K", K}, {"tokens", b.d.slots()}}};
}
constexpr int64_t kNt = 0, kNn = 1, kTn = 2;
KernelSpec router(const Block& b, bool bwd) {
  KernelSpec s{bwd ? "moe_router_bwd" : "moe_router", b.dt, b.dt,
               {{"tokens", b.d.tokens},
                {"experts", b.d.experts},
                {"k", b.d.topk},
                {"scoring", b.d.sigmoid ? 1 : 0},
                {"renormalize", b.d.renormalize ? 1 : 0}}};
  if (!bwd) {
    s.params["n_group"] = b.d.n_group;
    s.params["topk_group"] = b.d.topk_group;
    s.params["group_score"] = b.d.group_top2 ? 1 : 0;
    s.params["bias"] = b.d.bias ? 1 : 0;
  }
  return s;
}
KernelSpec rows_op(const Block& b, const char* op) {
  return {op, b.dt, b.dt, {{"tokens", b.d.tokens}, {"hidden", b.d.hidden}, {"k", b.d.topk}}};
}

Result<Block> build(Graph& g, const Dims& d, uint64_t seed) {
  Block b;
  b.d = d;
  const DType dt = b.dt, f32 = DType::f32, i32 = DType::i32;
  const int64_t T = d.tokens, H = d.hidden, I = d.intermediate, E = d.experts, G = d.experts_per_rank, S = d.slots();
  std::mt19937_64 rng(seed);
  auto uniform = [&](int64_t n, float lo, float hi) {
    std::uniform_real_distribution<float> u(lo, hi);
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) do x = u(rng); while (x == 0.0f);
    return v;
  };
  auto random = [&](const std::string& name, DType t, int64_t rows, int64_t cols, float a) -> Result<Buf*> {
    KILN_ASSIGN_OR_RETURN(Buf * p, g.make(name, t, rows, cols));
    KILN_TRY(g.upload(*p, uniform(rows * cols, -a, a)));
    return p;
  };
  auto act = [&](const std::string& name, DType t, int64_t rows, int64_t cols) { return g.make(name, t, rows, cols); };
  // Weights scaled for unit-variance outputs (uniform in +-sqrt(3 / fan_in)); inputs uniform in +-1.
  KILN_ASSIGN_OR_RETURN(b.x, random("x", dt, T, H, 1.0f));
  KILN_ASSIGN_OR_RETURN(b.dy, random("dy", dt, T, H, 1.0f));
  KILN_ASSIGN_OR_RETURN(b.w_router, random("router.weight", dt, E, H, std::sqrt(3.0f / float(H))));
  if (d.bias) {  // DeepSeek-V3's score-correction bias (selection only)
    KILN_ASSIGN_OR_RETURN(b.bias, random("router.bias", f32, 1, E, 0.05f));
  }
  KILN_ASSIGN_OR_RETURN(b.w_gate_up, random("experts.gate_up.weight", dt, G * 2 * I, H, std::sqrt(3.0f / float(H))));
  KILN_ASSIGN_OR_RETURN(b.w_down, random("experts.down.weight", dt, G * H, I, std::sqrt(3.0f / float(I))));
  b.w_gate_up->shape = {G, 2 * I, H};
  b.w_down->shape = {G, H, I};

  KILN_ASSIGN_OR_RETURN(b.logits, act("router.logits", dt, T, E));
  KILN_ASSIGN_OR_RETURN(b.topk_ids, act("topk_ids", i32, T, d.topk));
  KILN_ASSIGN_OR_RETURN(b.topk_weights, act("topk_weights", f32, T, d.topk));
  KILN_ASSIGN_OR_RETURN(b.tokens_per_expert, act("tokens_per_expert", i32, 1, E));
  KILN_ASSIGN_OR_RETURN(b.x_sorted, act("x_sorted", dt, S, H));
  KILN_ASSIGN_OR_RETURN(b.row_map, act("row_map", i32, T, d.topk));
  KILN_ASSIGN_OR_RETURN(b.offsets, act("offsets", i32, 1, G + 1));
  KILN_ASSIGN_OR_RETURN(b.gu, act("gu", dt, S, 2 * I));
  KILN_ASSIGN_OR_RETURN(b.s, act("s", dt, S, I));
  KILN_ASSIGN_OR_RETURN(b.y_sorted, act("y_sorted", dt, S, H));
  KILN_ASSIGN_OR_RETURN(b.y, act("y", dt, T, H));

  KILN_ASSIGN_OR_RETURN(b.dy_sorted, act("dy_sorted", dt, S, H));
  KILN_ASSIGN_OR_RETURN(b.dtopk_weights, act("dtopk_weights", f32, T, d.topk));
  KILN_ASSIGN_OR_RETURN(b.ds, act("ds", dt, S, I));
  KILN_ASSIGN_OR_RETURN(b.dgu, act("dgu", dt, S, 2 * I));
  KILN_ASSIGN_OR_RETURN(b.dx_sorted, act("dx_sorted", dt, S, H));
  KILN_ASSIGN_OR_RETURN(b.dlogits, act("dlogits", dt, T, E));
  KILN_ASSIGN_OR_RETURN(b.dx, act("x.grad", dt, T, H));
  KILN_ASSIGN_OR_RETURN(b.dw_router, act("router.weight.grad", f32, E, H));
  KILN_ASSIGN_OR_RETURN(b.dw_gate_up, act("experts.gate_up.weight.grad", f32, G * 2 * I, H));
  KILN_ASSIGN_OR_RETURN(b.dw_down, act("experts.down.weight.grad", f32, G * H, I));
  b.dw_gate_up->shape = b.w_gate_up->shape;
  b.dw_down->shape = b.w_down->shape;
  return b;
}

Result<void> forward(Graph& g, Block& b) {
  const Dims& d = b.d;
  const int64_t T = d.tokens, H = d.hidden, I = d.intermediate, E = d.experts;
  const std::map<std::string, float> scale = {{"routed_scaling_factor", d.scaling}};
  KILN_TRY(g.run("gemm router", gemm(b, T, E, H, false, true, b.dt), {whole(*b.x), whole(*b.w_router)},
                 {whole(*b.logits)}));
  std::vector<View> router_in = {whole(*b.logits)};
  if (b.bias) router_in.push_back(whole(*b.bias));
  KILN_TRY(g.run("moe_router", router(b, false), router_in,
                 {whole(*b.topk_ids), whole(*b.topk_weights), whole(*b.tokens_per_expert)}, scale));
  KernelSpec permute = rows_op(b, "moe_permute");
  permute.params["experts"] = d.experts_per_rank;  // ids outside [0, G) are other ranks' experts: dropped
  KILN_TRY(g.run("moe_permute", permute, {whole(*b.x), whole(*b.topk_ids)},
                 {whole(*b.x_sorted), whole(*b.row_map), whole(*b.offsets)}));
  KILN_TRY(g.run("grouped gate_up", grouped(b, kNt, 2 * I, H, b.dt),
                 {whole(*b.x_sorted), whole(*b.w_gate_up), whole(*b.offsets)}, {whole(*b.gu)}));
  KILN_TRY(g.run("swiglu", {"swiglu", b.dt, b.dt, {{"rows", d.slots()}, {"intermediate", I}}}, {whole(*b.gu)},
                 {whole(*b.s)}));
  KILN_TRY(g.run("grouped down", grouped(b, kNt, H, I, b.dt), {whole(*b.s), whole(*b.w_down), whole(*b.offsets)},
                 {whole(*b.y_sorted)}));
  KILN_TRY(g.run("moe_unpermute", rows_op(b, "moe_unpermute"),
                 {whole(*b.y_sorted), whole(*b.row_map), whole(*b.topk_weights)}, {whole(*b.y)}));
  return kiln::ok();
}

Result<void> backward(Graph& g, Block& b) {
  const Dims& d = b.d;
  const int64_t T = d.tokens, H = d.hidden, I = d.intermediate, E = d.experts;
  const DType f32 = DType::f32;
  // y = sum_s w_s y_sorted[row(s)]: the rows' gradient and each weight's.
  KILN_TRY(g.run("moe_unpermute_bwd", rows_op(b, "moe_unpermute_bwd"),
                 {whole(*b.dy), whole(*b.y_sorted), whole(*b.row_map), whole(*b.topk_weights)},
                 {whole(*b.dy_sorted), whole(*b.dtopk_weights)}));
  // y_sorted = s W_down[g]^T: wgrad dW_down[g] = dy_sorted_g^T s_g, dgrad ds = dy_sorted W_down[g].
  KILN_TRY(g.run("grouped down wgrad", grouped(b, kTn, H, I, f32),
                 {whole(*b.dy_sorted), whole(*b.s), whole(*b.offsets)}, {whole(*b.dw_down)}));
  KILN_TRY(g.run("grouped down dgrad", grouped(b, kNn, I, H, b.dt),
                 {whole(*b.dy_sorted), whole(*b.w_down), whole(*b.offsets)}, {whole(*b.ds)}));
  KILN_TRY(g.run("swiglu_bwd", {"swiglu_bwd", b.dt, b.dt, {{"rows", d.slots()}, {"intermediate", I}}},
                 {whole(*b.ds), whole(*b.gu)}, {whole(*b.dgu)}));
  // gu = x_sorted W_gate_up[g]^T.
  KILN_TRY(g.run("grouped gate_up wgrad", grouped(b, kTn, 2 * I, H, f32),
                 {whole(*b.dgu), whole(*b.x_sorted), whole(*b.offsets)}, {whole(*b.dw_gate_up)}));
  KILN_TRY(g.run("grouped gate_up dgrad", grouped(b, kNn, H, 2 * I, b.dt),
                 {whole(*b.dgu), whole(*b.w_gate_up), whole(*b.offsets)}, {whole(*b.dx_sorted)}));
  // The router path: dlogits from dtopk_weights, then logits = x W_router^T.
  KILN_TRY(g.run("moe_router_bwd", router(b, true), {whole(*b.logits), whole(*b.topk_ids), whole(*b.dtopk_weights)},
                 {whole(*b.dlogits)}, {{"routed_scaling_factor", d.scaling}}));
  KILN_TRY(g.run("gemm router wgrad", gemm(b, E, H, T, true, false, f32), {whole(*b.dlogits), whole(*b.x)},
                 {whole(*b.dw_router)}));
  KILN_TRY(g.run("gemm router dgrad", gemm(b, T, H, E, false, false, b.dt), {whole(*b.dlogits), whole(*b.w_router)},
                 {whole(*b.dx)}));
  // dx += the expert rows of each token, in the pass that sums them (accumulate: in place).
  KernelSpec unsort = rows_op(b, "moe_permute_bwd");
  unsort.params["accumulate"] = 1;
  KILN_TRY(g.run("moe_permute_bwd+dx", unsort, {whole(*b.dx_sorted), whole(*b.row_map), whole(*b.dx)}, {whole(*b.dx)}));
  return kiln::ok();
}

// The outputs a check compares: y and every gradient.
std::vector<Buf*> results(Block& b) { return {b.y, b.dx, b.dw_router, b.dw_gate_up, b.dw_down}; }

Result<void> dump(Graph& g, Block& b, const std::string& dir) {
  const Dims& d = b.d;
  nlohmann::ordered_json index;
  index["model"] = d.name;
  index["dims"] = {{"tokens", d.tokens},   {"hidden", d.hidden}, {"intermediate", d.intermediate},
                   {"experts", d.experts}, {"topk", d.topk},     {"experts_per_rank", d.experts_per_rank}};
  index["routing"] = {{"scoring", d.sigmoid ? "sigmoid" : "softmax"},
                      {"bias", d.bias},
                      {"n_group", d.n_group},
                      {"topk_group", d.topk_group},
                      {"group_score", d.group_top2 ? "top2_sum" : "max"},
                      {"renormalize", d.renormalize},
                      {"routed_scaling_factor", d.scaling}};
  std::vector<Buf*> bufs = {b.x, b.dy, b.w_router};
  if (b.bias) bufs.push_back(b.bias);
  for (Buf* p : {b.w_gate_up, b.w_down, b.logits, b.topk_ids, b.topk_weights, b.offsets}) bufs.push_back(p);
  for (Buf* p : results(b)) bufs.push_back(p);
  return kiln_example::dump_tensors(g, bufs, std::move(index), dir);
}

int fail(const kiln::Error& e) {
  std::fprintf(stderr, "moe_block: error: %s\n", e.message.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"One MoE block (router, permutation, grouped expert GEMMs, SwiGLU, unpermutation), forward and "
               "backward, through Kiln's C++ API alone"};
  std::string model = "deepseek-v3", models_path = KILN_MODELS_JSON, dump_dir;
  kiln_example::RuntimeArgs run_args;
  int64_t tokens = 0, experts_per_rank = 0, hidden = 0, intermediate = 0, experts = 0, time_steps = 5;
  uint64_t seed = 1234;
  bool check = false, breakdown = true;
  app.add_option("--model", model, "MoE model in the model table (models/models.json, section moe)");
  app.add_option("--models", models_path, "the model table");
  app.add_option("--tokens", tokens, "tokens T of the block (default: the model's seq)");
  app.add_option("--experts-per-rank", experts_per_rank,
                 "G, the experts of this rank, [0, G) (default: the model's first experts_per_rank)");
  app.add_option("--hidden", hidden, "override the model's hidden size (small tests)")->check(CLI::Range(1, 1 << 20));
  app.add_option("--intermediate", intermediate, "override the experts' intermediate size (small tests)")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--experts", experts, "override the model's routed experts (small tests)")->check(CLI::Range(1, 512));
  run_args.add_to(app, "the block");
  app.add_option("--time", time_steps, "timed blocks (forward + backward) after one warm-up (0: none)")
      ->check(CLI::Range(0, 1000));
  app.add_flag("!--no-breakdown", breakdown, "skip the per-op time breakdown");
  app.add_flag("--check", check, "compare y and every gradient with the same graph on the CPU references");
  app.add_option("--dump", dump_dir,
                 "write inputs, weights, routing, y and gradients here (scripts/moe_block_torch.py)");
  app.add_option("--seed", seed, "seed of the weights and inputs");
  CLI11_PARSE(app, argc, argv);

  auto dims = load_dims(models_path, model);
  if (!dims) return fail(dims.error());
  if (app.count("--tokens")) dims->tokens = tokens;
  if (hidden) dims->hidden = hidden;
  if (intermediate) dims->intermediate = intermediate;
  if (experts) {
    dims->experts = experts;
    dims->experts_per_rank = std::min(dims->experts_per_rank, experts);
  }
  if (app.count("--experts-per-rank")) dims->experts_per_rank = experts_per_rank;
  const Dims& d = *dims;
  if (auto r = check_dims(d); !r) return fail(r.error());

  auto opened = kiln_example::open_runtime("moe_block", run_args);
  if (!opened.runtime) return opened.exit_code;
  kiln::Runtime& runtime = *opened.runtime;
  kiln::Device& dev = *runtime.device();
  const bool emulated = run_args.emulated();
  std::printf("moe_block: %s, %ld tokens, hidden %ld, %ld experts (top-%ld, %s%s), %ld on this rank, intermediate "
              "%ld, bf16; device %s (%s)\n",
              d.name.c_str(), long(d.tokens), long(d.hidden), long(d.experts), long(d.topk),
              d.sigmoid ? "sigmoid" : "softmax", d.bias ? " + bias" : "", long(d.experts_per_rank),
              long(d.intermediate), dev.name().c_str(), std::string(dev.target().name).c_str());
  {  // memory estimate, before allocation
    const double T = double(d.tokens), H = double(d.hidden), I = double(d.intermediate), E = double(d.experts),
                 G = double(d.experts_per_rank), S = double(d.slots());
    const double weights = (E * H + G * 3 * I * H) * (2 + 4);            // bf16 weights, fp32 gradients
    const double acts = 2 * (3 * T * H + 2 * T * E + S * (4 * H + 6 * I));  // bf16 tensors
    std::printf("moe_block: about %.2f GiB of device memory\n", (weights + acts) / (1 << 30));
  }
  const auto stats0 = runtime.stats();
  Graph g(&runtime, true, false);
  auto b = build(g, d, seed);
  if (!b) return fail(b.error());
  auto block = [&]() -> Result<void> {
    KILN_TRY(forward(g, *b));
    return backward(g, *b);
  };
  if (auto r = block(); !r) return fail(r.error());
  if (auto r = dev.synchronize(); !r) return fail(r.error());
  const auto stats1 = runtime.stats();
  std::printf("moe_block: first block: %lu kernels compiled, %lu disk hits, %lu memory hits\n",
              (unsigned long)(stats1.compiles - stats0.compiles), (unsigned long)(stats1.disk_hits - stats0.disk_hits),
              (unsigned long)(stats1.memory_hits - stats0.memory_hits));
  {  // how many slots this rank's experts received (the rest are other ranks')
    auto off = g.download(*b->offsets);
    if (!off) return fail(off.error());
    std::printf("moe_block: %ld of %ld slots routed to this rank's %ld experts\n", long(off->back()), long(d.slots()),
                long(d.experts_per_rank));
  }
  if (!dump_dir.empty())
    if (auto r = dump(g, *b, dump_dir); !r) return fail(r.error());

  int rc = 0;
  if (check) {
    Graph host(&runtime, false, false);
    auto hb = build(host, d, seed);
    if (!hb) return fail(hb.error());
    if (auto r = forward(host, *hb); !r) return fail(r.error());
    if (auto r = backward(host, *hb); !r) return fail(r.error());
    auto ids = g.download(*b->topk_ids);
    auto hids = host.download(*hb->topk_ids);
    if (!ids || !hids) return fail(ids ? hids.error() : ids.error());
    int64_t differ = 0;
    for (int64_t t = 0; t < d.tokens; ++t)
      if (!std::equal(ids->begin() + t * d.topk, ids->begin() + (t + 1) * d.topk, hids->begin() + t * d.topk)) ++differ;
    bool pass = differ == 0;
    std::printf("check: topk_ids: %ld of %ld tokens route differently from the CPU reference %s\n", long(differ),
                long(d.tokens), differ ? "FAIL" : "PASS");
    auto outs = kiln_example::check_buffers(g, results(*b), host, results(*hb), "", 30);
    if (!outs) return fail(outs.error());
    pass = *outs && pass;
    std::printf("check: %s\n", pass ? "PASS" : "FAIL");
    if (!pass) rc = 1;
  }

  if (!emulated && time_steps > 0) {
    auto times = kiln_example::sorted_times(dev, block, time_steps);
    if (!times) return fail(times.error());
    const std::vector<float>& ms = *times;
    std::printf("moe_block: block time %.3f ms (forward + backward, median of %ld; min %.3f, max %.3f)\n",
                ms[ms.size() / 2], long(ms.size()), ms.front(), ms.back());
    if (breakdown) {
      g.set_breakdown(true);
      if (auto r = block(); !r) return fail(r.error());
      kiln_example::print_breakdown(g, "one block");
    }
  }
  return rc;
}
