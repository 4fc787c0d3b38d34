#include "templates/moe_router/moe_router.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "support/embedded.h"
#include "templates/lib/moe.h"

namespace kiln {
namespace {
const ParamInfo kParams[] = {
    {"tokens", "rows of the logits; a runtime argument, not baked; 0 writes tokens_per_expert = 0", false, false, 0,
     (int64_t{1} << 31) - 1},
    {"experts", "routed experts: the logits' last dimension", true, false, 1, moe::kMaxExperts},
    {"k", "experts per token (top-k)", true, false, 1, moe::kMaxK},
    {"scoring", "softmax over the experts (Mixtral, Qwen3-MoE) or sigmoid per expert (DeepSeek-V3)", true, false, 0, 1,
     moe::kScoring, 0},
    {"n_group", "groups of consecutive experts for the group limit (DeepSeek: 8); 1: none", true, false, 1,
     moe::kMaxGroups, {}, 1},
    {"topk_group", "groups whose experts may be chosen (DeepSeek-V3: 4); 0: every group", true, false, 0,
     moe::kMaxGroups, {}, 0},
    {"group_score", "a group's score: its max (DeepSeek-V2) or the sum of its top two (DeepSeek-V3)", true, false, 0, 1,
     moe::kGroupScore, 0},
    {"renormalize", "divide the k weights by their sum (Mixtral, Qwen3-MoE, DeepSeek-V3)", true, true, 0, 1, {}, 0},
    {"bias", "a score-correction bias [experts] fp32 added for the selection only (DeepSeek-V3)", true, true, 0, 1,
     {}, 0},
};
const ScalarInfo kScalars[] = {
    {"routed_scaling_factor", 1.0f, "multiplies every weight (DeepSeek-V3: 2.5)"},
};
constexpr int64_t kThreads = 256;
// The count launch: kCountCols experts per block, each column's route-block partials split over
// kCountLanes lanes (lib/reduce's column_sum). One thread per expert summing every partial took
// 512 dependent-free but serial loads per thread at DeepSeek-V3's 16384 tokens.
constexpr int64_t kCountCols = 32, kCountLanes = 8;
constexpr int64_t kMaxBlocks = 512;  // route blocks; waves stride over the tokens beyond

std::vector<int64_t> tokens_experts(const KernelSpec& s) { return {s.param("tokens"), s.param("experts")}; }
std::vector<int64_t> experts(const KernelSpec& s) { return {s.param("experts")}; }
bool has_bias(const KernelSpec& s) { return s.param("bias") != 0; }
const TensorDecl kSignature[] = {
    {"logits", Role::input, DTypeRule::in, DType::f32, "[tokens, experts]", tokens_experts},
    {"bias", Role::input, DTypeRule::fixed, DType::f32, "[experts]", experts, has_bias,
     "score-correction bias (with bias), for the selection only"},
    {"topk_ids", Role::output, DTypeRule::fixed, DType::i32, "[tokens, k]", moe::tokens_k, nullptr,
     "the chosen experts, best first"},
    {"topk_weights", Role::output, DTypeRule::fixed, DType::f32, "[tokens, k]", moe::tokens_k, nullptr,
     "their weights (scores, renormalized, scaled)"},
    {"tokens_per_expert", Role::output, DTypeRule::fixed, DType::i32, "[experts]", experts, nullptr,
     "(token, slot) pairs routed to each expert"},
};

int64_t route_blocks(int64_t tokens, int64_t waves) { return std::min(ceil_div(tokens, waves), kMaxBlocks); }
}  // namespace

std::span<const ParamInfo> MoeRouterOp::params() const { return kParams; }
std::span<const ScalarInfo> MoeRouterOp::scalars() const { return kScalars; }
std::span<const DType> MoeRouterOp::dtypes() const { return moe::kFloatDTypes; }
std::span<const TensorDecl> MoeRouterOp::signature() const { return kSignature; }
std::string_view MoeRouterOp::device_template(const KernelConfig&) const {
  return embedded_file("templates/moe_router/moe_router.kernel");
}

Result<void> MoeRouterOp::validate_rules(const KernelSpec& spec, const TargetInfo&) const {
  return moe::check_routing(name(), moe::Routing::of(with_defaults(spec)));
}

std::vector<KernelConfig> MoeRouterOp::variants(const KernelSpec&, const TargetInfo& target) const {
  return {{{"THREADS", kThreads}, {"WAVES", kThreads / target.wave_size}}};
}

std::string MoeRouterOp::specialize(const KernelSpec& given, const KernelConfig& c) const {
  const moe::Routing r = moe::Routing::of(with_defaults(given));
  return fmt::format(
      "constexpr int EXPERTS = {}, K = {}, N_GROUP = {}, TOPK_GROUP = {};\nconstexpr bool GROUP_TOP2 = {};\n"
      "#define SIGMOID {}\n#define RENORM {}\n#define HAS_BIAS {}\n#define SELECT_LOGITS {}\n"
      "constexpr int THREADS = {}, COUNT_COLS = {}, COUNT_LANES = {};\ntypedef {} in_t;\n",
      r.experts, r.k, r.n_group, r.groups_kept(), r.group_top2, int(r.sigmoid), int(r.renormalize), int(r.bias),
      int(r.selects_by_logits()), c.at("THREADS"), kCountCols, kCountLanes, device_type_name(given.dtype));
}

Plan MoeRouterOp::plan(const KernelSpec& call, const KernelConfig& c) const {
  Plan p;
  const KernelSpec spec = with_defaults(call);
  const int64_t T = spec.param("tokens"), E = spec.param("experts");
  const bool bias = spec.param("bias") != 0;
  const int64_t blocks = route_blocks(T, c.at("WAVES"));
  p.workspace_bytes = static_cast<uint64_t>(std::max<int64_t>(blocks * E, 1) * 4);
  using A = KernelArg;
  // Tensors: logits 0, [bias 1], topk_ids, topk_weights, tokens_per_expert.
  const uint32_t out = bias ? 2 : 1;
  if (T > 0) {
    Launch route;
    route.kernel = "kiln_moe_router";
    route.geometry.grid.x = static_cast<uint32_t>(blocks);
    route.geometry.block.x = static_cast<uint32_t>(c.at("THREADS"));
    route.args = {A::tensor(0)};
    if (bias) route.args.push_back(A::tensor(1));
    for (A a : {A::tensor(out), A::tensor(out + 1), A::workspace(0), A::i32(T), A::i32(blocks * c.at("WAVES")),
                A::scalar(0)})
      route.args.push_back(a);
    p.launches.push_back(std::move(route));
  }
  Launch count;
  count.kernel = "kiln_moe_router_count";
  count.geometry.grid.x = static_cast<uint32_t>(ceil_div(E, kCountCols));
  count.geometry.block.x = static_cast<uint32_t>(kCountCols * kCountLanes);
  count.args = {A::workspace(0), A::tensor(out + 2), A::i32(T > 0 ? blocks : 0)};
  p.launches.push_back(std::move(count));
  return p;
}

// Logits in [-3, 3] (many exact ties in bf16, which the selection breaks by index); the bias
// in [-0.1, 0.1] as DeepSeek-V3's load-balancing bias is small next to the scores.
void MoeRouterOp::init_inputs(const KernelSpec& spec, std::span<const TensorInfo> inputs,
                              std::vector<std::vector<float>>& values, std::mt19937_64& rng) const {
  OpTemplate::init_inputs(spec, inputs, values, rng);
  for (float& v : values[0]) v = round_to_dtype(3.0f * v, inputs[0].dtype);
  if (values.size() > 1)
    for (float& v : values[1]) v *= 0.1f;
}

void MoeRouterOp::reference(const KernelSpec& given, const Scalars& scalars, std::span<const std::vector<float>> in,
                            std::span<const int64_t>, std::vector<RefOutput>& outputs) const {
  const KernelSpec spec = with_defaults(given);
  const moe::Routing r = moe::Routing::of(spec);
  const int64_t T = spec.param("tokens"), E = r.experts, K = r.k;
  const double scale = scalar(scalars, "routed_scaling_factor");
  outputs.assign(3, {});
  outputs[0].values.resize(static_cast<size_t>(T * K));
  outputs[1].values.resize(static_cast<size_t>(T * K));
  outputs[2].values.assign(static_cast<size_t>(E), 0.0);
  std::vector<int> ids(static_cast<size_t>(K));
  std::vector<double> w(static_cast<size_t>(K));
  const std::span<const float> bias = r.bias ? std::span<const float>(in[1]) : std::span<const float>();
  for (int64_t t = 0; t < T; ++t) {
    moe::route_token(r, std::span<const float>(in[0]).subspan(static_cast<size_t>(t * E), static_cast<size_t>(E)),
                     bias, scale, ids.data(), w.data());
    for (int64_t j = 0; j < K; ++j) {
      outputs[0].values[static_cast<size_t>(t * K + j)] = ids[static_cast<size_t>(j)];
      outputs[1].values[static_cast<size_t>(t * K + j)] = w[static_cast<size_t>(j)];
      outputs[2].values[static_cast<size_t>(ids[static_cast<size_t>(j)])] += 1;
    }
  }
}

AcceptedOutputs MoeRouterOp::compare_outputs(const KernelSpec& given, const Scalars& scalars,
                                             std::span<const std::vector<float>> in,
                                             std::span<const std::vector<double>> outputs,
                                             std::vector<RefOutput>& refs) const {
  AcceptedOutputs accepted{0, "near-tie tokens"};
  if (outputs.size() < 3 || refs.size() < 3) return accepted;
  const KernelSpec spec = with_defaults(given);
  const moe::Routing r = moe::Routing::of(spec);
  const int64_t T = spec.param("tokens"), E = r.experts, K = r.k;
  const double scale = scalar(scalars, "routed_scaling_factor");
  std::vector<double>& ref_ids = refs[0].values;
  std::vector<double>& ref_weights = refs[1].values;
  std::vector<double>& ref_counts = refs[2].values;
  const std::vector<double>& out_ids = outputs[0];
  if (static_cast<int64_t>(out_ids.size()) < T * K || static_cast<int64_t>(ref_ids.size()) < T * K ||
      static_cast<int64_t>(ref_counts.size()) < E)
    return accepted;
  const std::span<const float> bias = r.bias ? std::span<const float>(in[1]) : std::span<const float>();
  std::vector<int> ids(static_cast<size_t>(K));
  std::vector<double> w(static_cast<size_t>(K));
  for (int64_t t = 0; t < T; ++t) {
    const size_t row = static_cast<size_t>(t * K);
    bool differs = false, valid = true;
    for (int64_t j = 0; j < K; ++j) {
      const double id = out_ids[row + j];
      differs = differs || id != ref_ids[row + j];
      valid = valid && id >= 0 && id < static_cast<double>(E) && id == std::floor(id);
      ids[static_cast<size_t>(j)] = valid ? static_cast<int>(id) : -1;
    }
    if (!differs || !valid) continue;
    const moe::TokenValues v = moe::token_values(
        r, std::span<const float>(in[0]).subspan(static_cast<size_t>(t * E), static_cast<size_t>(E)), bias);
    if (!moe::near_tie_order(r, v, ids)) continue;
    moe::routing_weights(r, v, ids.data(), scale, w.data());
    for (int64_t j = 0; j < K; ++j) {
      ref_counts[static_cast<size_t>(ref_ids[row + j])] -= 1;
      ref_counts[static_cast<size_t>(ids[static_cast<size_t>(j)])] += 1;
      ref_ids[row + j] = ids[static_cast<size_t>(j)];
      ref_weights[row + j] = w[static_cast<size_t>(j)];
    }
    ++accepted.count;
  }
  return accepted;
}

std::vector<TestSpec> MoeRouterOp::test_specs(const TargetInfo&) const {
  std::vector<TestSpec> out;
  auto add = [&](DType t, int64_t tokens, int64_t experts, int64_t k, int64_t scoring, int64_t n_group,
                 int64_t topk_group, int64_t top2, int64_t renorm, int64_t bias, std::string_view why) {
    out.push_back({{"moe_router", t, t,
                    {{"tokens", tokens}, {"experts", experts}, {"k", k}, {"scoring", scoring}, {"n_group", n_group},
                     {"topk_group", topk_group}, {"group_score", top2}, {"renormalize", renorm}, {"bias", bias}}},
                   why});
  };
  // The routings of shared/reference/models.json's MoE models (their Hugging Face configs).
  add(DType::bf16, 37, 8, 2, 0, 1, 0, 0, 1, 0, "Mixtral-8x7B: softmax, top-2 of 8, renormalized");
  add(DType::bf16, 19, 128, 8, 0, 1, 0, 0, 1, 0, "Qwen3-235B-A22B: softmax, top-8 of 128, renormalized");
  add(DType::f32, 21, 256, 8, 1, 8, 4, 1, 1, 1,
      "DeepSeek-V3: sigmoid + bias, 8 groups (top-2 sums), 4 kept, top-8 of 256, renormalized");
  add(DType::bf16, 13, 256, 8, 1, 8, 4, 1, 1, 1, "DeepSeek-V3 routing, bf16 logits");
  add(DType::f16, 11, 64, 6, 0, 1, 0, 0, 0, 0, "DeepSeek-V2-Lite: softmax, top-6 of 64, not renormalized");
  add(DType::bf16, 9, 160, 6, 0, 8, 3, 0, 0, 0, "DeepSeek-V2: group-limited by group max, 3 of 8 groups of 20");
  add(DType::f32, 7, 40, 5, 1, 4, 2, 0, 1, 0, "sigmoid without bias, group max (selection by logits)");
  add(DType::f32, 5, 3, 3, 1, 1, 0, 0, 0, 0, "3 experts, all chosen, sigmoid");
  add(DType::bf16, 3, 1, 1, 0, 1, 0, 0, 1, 0, "one expert");
  add(DType::f32, 4200, 4, 1, 0, 1, 0, 0, 0, 0, "4200 tokens: waves loop over tokens (512 blocks at most)");
  add(DType::bf16, 0, 16, 2, 0, 1, 0, 0, 1, 0, "0 tokens: tokens_per_expert = 0");
  return out;
}

}  // namespace kiln
