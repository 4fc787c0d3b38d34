// Host helpers of the Mixture-of-Experts ops (moe_router, moe_router_bwd, moe_permute,
// moe_unpermute and their backward ops): the routing parameters every router op declares, the
// fp64 reference of the routing, and the test inputs the ops derive (distinct expert ids per
// token, row maps). Part of the library (templates/lib/): no op folder includes another's.
// docs/moe.md describes the ops.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <string_view>
#include <vector>

#include "templates/op_template.h"

namespace kiln::moe {

/// Names of the values of `scoring` and `group_score`.
inline constexpr std::string_view kScoring[] = {"softmax", "sigmoid"};
inline constexpr std::string_view kGroupScore[] = {"max", "top2_sum"};
/// Limits of the router kernels: every lane holds experts / wave size scores in registers, and the
/// group scores are unrolled over n_group.
inline constexpr int64_t kMaxExperts = 512, kMaxK = 32, kMaxGroups = 32;
/// Experts of moe_permute: a count per expert in LDS.
inline constexpr int64_t kMaxPermuteExperts = 4096;

/// The floating dtypes of the router and unpermutation ops (moe_permute adds fp8).
inline constexpr DType kFloatDTypes[] = {DType::bf16, DType::f16, DType::f32};
/// Tensor shapes the ops share: [tokens, hidden], [tokens, k] and [tokens * k, hidden] (a row per slot).
inline std::vector<int64_t> tokens_hidden(const KernelSpec& s) { return {s.param("tokens"), s.param("hidden")}; }
inline std::vector<int64_t> tokens_k(const KernelSpec& s) { return {s.param("tokens"), s.param("k")}; }
inline std::vector<int64_t> slots_hidden(const KernelSpec& s) {
  return {s.param("tokens") * s.param("k"), s.param("hidden")};
}

/// The routing of one spec (moe_router's parameters, with defaults applied).
struct Routing {
  int64_t experts = 0, k = 0;
  bool sigmoid = false;
  int64_t n_group = 1, topk_group = 1;  ///< topk_group as given (0 = every group)
  bool group_top2 = false;              ///< group score: sum of the top 2 (DeepSeek-V3), else the max
  bool renormalize = false, bias = false;

  static Routing of(const KernelSpec& spec);
  int64_t groups_kept() const { return topk_group == 0 ? n_group : topk_group; }
  /// Whether the group limit removes experts (fewer groups kept than there are).
  bool grouped() const { return groups_kept() < n_group; }
  /// Whether the selection may compare logits instead of scores: softmax and sigmoid are
  /// increasing, so without a bias and with max group scores the order is the logits' order
  /// (exact, no rounding of the scores in between).
  bool selects_by_logits() const { return !bias && (!grouped() || !group_top2); }
};

/// The rules a router spec must meet beyond the parameter ranges (group sizes, k against the
/// experts left by the group limit), naming the parameter and the fix.
Result<void> check_routing(std::string_view op, const Routing& r);

/// Score of one logit, in fp64: softmax (given the row's max and sum of exp(x - max)) or sigmoid.
double score(const Routing& r, double x, double row_max, double row_sum);

/// One token's routing values in fp64, with a bound on how far a kernel's fp32 values of them may
/// lie: per expert its score (the weight's source) and selection value (the logit where that
/// orders as the scores, else score + bias), per group its score (max or top-2 sum of the
/// selection values; grouped routings only).
struct TokenValues {
  std::vector<double> score, choice;
  /// kNearTieUlps fp32 ulps of the magnitude the kernel rounds (|score| + |bias|; 0 where the
  /// selection compares the logits themselves, which is exact), per expert and per group.
  std::vector<double> slack;
  std::vector<double> group, group_slack;
};
/// fp32 ulps (FLT_EPSILON units of the magnitude) a kernel's selection value may lie from the fp64
/// one: NVIDIA's __expf is within 2 + 1.16 |x| ulps (logits up to ~10), then a division and the
/// bias add. A real routing error (a wrong expert) is off by far more.
inline constexpr double kNearTieUlps = 16;
TokenValues token_values(const Routing& r, std::span<const float> logits, std::span<const float> bias);

/// The allowed experts' order by decreasing selection value (ties to the lower expert): the
/// reference's top-k is its first k. `kept`: the groups that may be chosen (empty: every group).
std::vector<int64_t> selection_order(const Routing& r, const TokenValues& v, const std::vector<bool>& kept);
/// The groups the reference keeps: the topk_group best group scores (ties to the lower group).
std::vector<bool> kept_groups(const Routing& r, const TokenValues& v);
/// The weights of `ids` (k experts): their scores, renormalized over these k when the routing
/// says so, times `scale`.
void routing_weights(const Routing& r, const TokenValues& v, const int* ids, double scale, double* weights);

/// The fp64 reference of one token's routing: ids (k, in order of decreasing selection score,
/// ties to the lower expert) and their weights (score, renormalized, times `scale`).
void route_token(const Routing& r, std::span<const float> logits, std::span<const float> bias, double scale,
                 int* ids, double* weights);

/// Whether a kernel's top-k `ids` of one token (k of them), unlike the reference's, are a
/// near-tie order: k distinct experts, every one in a group that the reference's group scores
/// allow within their slack (a swapped group's score within the slacks of the boundary group's),
/// and, over the experts so allowed, the reference's selection value of the kernel's j-th expert
/// within the two experts' slacks of the value of the reference's j-th expert, for every slot j.
/// An order the kernel's fp32 values could give where the fp64 values order otherwise passes; an
/// expert chosen away from a tie does not.
bool near_tie_order(const Routing& r, const TokenValues& v, std::span<const int> ids);

/// k distinct experts per token, drawn uniformly (moe_router_bwd's and the permutation ops'
/// topk_ids), as floats for init_inputs.
void random_distinct_ids(int64_t tokens, int64_t k, int64_t experts, std::vector<float>& ids, std::mt19937_64& rng);

/// A row map [tokens, k] of the permutation ops: a random bijection of the slots onto the rows
/// [0, tokens * k), except every 13th slot (from the 6th), which is dropped (-1: routed to no
/// local expert).
void random_row_map(int64_t tokens, int64_t k, std::vector<float>& map, std::mt19937_64& rng);

/// tokens * k, the rows of the expert-sorted tensors, must fit the int32 row map: an error naming
/// the parameters otherwise.
Result<void> check_slots(std::string_view op, const KernelSpec& spec);

/// The parameters of the row ops that read a row map (moe_unpermute, moe_permute_bwd,
/// moe_unpermute_bwd): tokens (runtime), hidden, k (baked).
std::span<const ParamInfo> row_map_params();
/// Tuning candidates of a kernel with one block per token that walks its row of `hidden` elements
/// VEC at a time, THREADS apart (moe_unpermute_bwd): `first` (the heuristic's), then THREADS 64 to
/// 1024 and the whole-wavefront thread counts that split the row's vectors into 1 to 8 equal
/// passes, so that no pass leaves threads idle (`kiln run --bench` times them on the GPU).
std::vector<KernelConfig> row_walk_candidates(int64_t hidden, KernelConfig first, const TargetInfo& target);
/// The whole-wavefront thread counts from `lo` to `hi` that divide a row of `nvec` vectors into
/// equal passes (no thread idle in the last one), largest first.
std::vector<int64_t> equal_pass_threads(int64_t nvec, int64_t lo, int64_t hi, const TargetInfo& target);
/// Their test specs: Mixtral's and DeepSeek's k and hidden sizes, odd hidden sizes (scalar
/// accesses), every dtype, and 0 tokens.
std::vector<TestSpec> row_map_test_specs(std::string_view op);

}  // namespace kiln::moe
