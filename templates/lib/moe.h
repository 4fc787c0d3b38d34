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

/// The fp64 reference of one token's routing: ids (k, in order of decreasing selection score,
/// ties to the lower expert) and their weights (score, renormalized, times `scale`).
void route_token(const Routing& r, std::span<const float> logits, std::span<const float> bias, double scale,
                 int* ids, double* weights);

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
/// Their test specs: Mixtral's and DeepSeek's k and hidden sizes, odd hidden sizes (scalar
/// accesses), every dtype, and 0 tokens.
std::vector<TestSpec> row_map_test_specs(std::string_view op);

}  // namespace kiln::moe
