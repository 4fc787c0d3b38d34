#include "templates/lib/moe.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace kiln::moe {

Routing Routing::of(const KernelSpec& spec) {
  Routing r;
  r.experts = spec.param("experts");
  r.k = spec.param("k");
  r.sigmoid = spec.param("scoring") == 1;
  r.n_group = spec.param("n_group", 1);
  r.topk_group = spec.param("topk_group", 0);
  r.group_top2 = spec.param("group_score") == 1;
  r.renormalize = spec.param("renormalize") != 0;
  r.bias = spec.param("bias") != 0;
  return r;
}

Result<void> check_routing(std::string_view op, const Routing& r) {
  if (r.k > r.experts)
    return make_error(Errc::invalid_argument,
                      fmt::format("{}: k = {} is more than experts = {}; give k <= experts", op, r.k, r.experts));
  if (r.experts % r.n_group != 0)
    return make_error(Errc::invalid_argument,
                      fmt::format("{}: experts = {} is not a multiple of n_group = {}; give an n_group that divides it",
                                  op, r.experts, r.n_group));
  if (r.topk_group > r.n_group)
    return make_error(Errc::invalid_argument,
                      fmt::format("{}: topk_group = {} is more than n_group = {}; give topk_group <= n_group (0: all)",
                                  op, r.topk_group, r.n_group));
  const int64_t group_size = r.experts / r.n_group;
  if (r.grouped() && r.k > r.groups_kept() * group_size)
    return make_error(Errc::invalid_argument,
                      fmt::format("{}: k = {} is more than the {} experts of the topk_group = {} groups kept; give a "
                                  "larger topk_group or a smaller k",
                                  op, r.k, r.groups_kept() * group_size, r.groups_kept()));
  if (r.grouped() && r.group_top2 && group_size < 2)
    return make_error(Errc::invalid_argument,
                      fmt::format("{}: group_score = top2_sum needs at least 2 experts per group (experts / n_group "
                                  "= {}); give a smaller n_group or group_score = max",
                                  op, group_size));
  return ok();
}

double score(const Routing& r, double x, double row_max, double row_sum) {
  return r.sigmoid ? 1.0 / (1.0 + std::exp(-x)) : std::exp(x - row_max) / row_sum;
}

TokenValues token_values(const Routing& r, std::span<const float> logits, std::span<const float> bias) {
  const int64_t E = r.experts, gs = E / r.n_group;
  const double ulps = kNearTieUlps * std::numeric_limits<float>::epsilon();
  double row_max = -INFINITY, row_sum = 0;
  for (int64_t e = 0; e < E; ++e) row_max = std::max<double>(row_max, logits[e]);
  for (int64_t e = 0; e < E; ++e) row_sum += std::exp(logits[e] - row_max);
  TokenValues v;
  v.score.resize(E);
  v.choice.resize(E);
  v.slack.resize(E);
  for (int64_t e = 0; e < E; ++e) {
    const double b = r.bias ? bias[e] : 0.0;
    v.score[e] = score(r, logits[e], row_max, row_sum);
    v.choice[e] = r.selects_by_logits() ? logits[e] : v.score[e] + b;
    v.slack[e] = r.selects_by_logits() ? 0.0 : ulps * (std::fabs(v.score[e]) + std::fabs(b));
  }
  if (r.grouped()) {
    v.group.resize(r.n_group);
    v.group_slack.resize(r.n_group);
    std::vector<int64_t> in(gs);
    for (int64_t i = 0; i < r.n_group; ++i) {
      std::iota(in.begin(), in.end(), i * gs);
      std::stable_sort(in.begin(), in.end(), [&](int64_t a, int64_t b) { return v.choice[a] > v.choice[b]; });
      v.group[i] = r.group_top2 ? v.choice[in[0]] + v.choice[in[1]] : v.choice[in[0]];
      v.group_slack[i] = r.group_top2 ? v.slack[in[0]] + v.slack[in[1]] : v.slack[in[0]];
    }
  }
  return v;
}

namespace {
// Groups by decreasing score, ties to the lower group.
std::vector<int64_t> group_order(const Routing& r, const TokenValues& v) {
  std::vector<int64_t> order(r.n_group);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return v.group[a] > v.group[b]; });
  return order;
}
}  // namespace

std::vector<bool> kept_groups(const Routing& r, const TokenValues& v) {
  if (!r.grouped()) return {};
  const std::vector<int64_t> order = group_order(r, v);
  std::vector<bool> kept(r.n_group, false);
  for (int64_t i = 0; i < r.groups_kept(); ++i) kept[order[i]] = true;
  return kept;
}

std::vector<int64_t> selection_order(const Routing& r, const TokenValues& v, const std::vector<bool>& kept) {
  const int64_t gs = r.experts / r.n_group;
  std::vector<int64_t> order;
  for (int64_t e = 0; e < r.experts; ++e)
    if (kept.empty() || kept[e / gs]) order.push_back(e);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return v.choice[a] > v.choice[b]; });
  return order;
}

void routing_weights(const Routing& r, const TokenValues& v, const int* ids, double scale, double* weights) {
  double sum = 0;
  for (int64_t j = 0; j < r.k; ++j) sum += v.score[ids[j]];
  for (int64_t j = 0; j < r.k; ++j)
    weights[j] = (r.renormalize ? v.score[ids[j]] / (sum + 1e-20) : v.score[ids[j]]) * scale;
}

void route_token(const Routing& r, std::span<const float> logits, std::span<const float> bias, double scale, int* ids,
                 double* weights) {
  const TokenValues v = token_values(r, logits, bias);
  const std::vector<int64_t> order = selection_order(r, v, kept_groups(r, v));
  for (int64_t j = 0; j < r.k; ++j) ids[j] = static_cast<int>(order[j]);
  routing_weights(r, v, ids, scale, weights);
}

bool near_tie_order(const Routing& r, const TokenValues& v, std::span<const int> ids) {
  const int64_t E = r.experts, gs = E / r.n_group;
  std::vector<bool> seen(E, false);
  for (int id : ids) {
    if (id < 0 || id >= E || seen[id]) return false;
    seen[id] = true;
  }
  // Whether the kernel's order is the reference's top-k over the groups `kept`, slot by slot
  // within the two experts' slacks.
  auto matches = [&](const std::vector<bool>& kept) {
    for (int id : ids)
      if (!kept.empty() && !kept[id / gs]) return false;
    const std::vector<int64_t> order = selection_order(r, v, kept);
    for (int64_t j = 0; j < r.k; ++j) {
      const int64_t a = ids[j], b = order[j];
      if (std::fabs(v.choice[a] - v.choice[b]) > v.slack[a] + v.slack[b]) return false;
    }
    return true;
  };
  if (!r.grouped()) return matches({});
  // The kept groups the kernel may have chosen: every group clearly above the boundary (the
  // reference's last kept group), and any choice among the groups within the slacks of it.
  const std::vector<int64_t> order = group_order(r, v);
  const int64_t edge = order[r.groups_kept() - 1];
  std::vector<int64_t> band;
  std::vector<bool> certain(r.n_group, false);
  int64_t n_certain = 0;
  for (int64_t g = 0; g < r.n_group; ++g) {
    const double d = v.group[g] - v.group[edge], slack = v.group_slack[g] + v.group_slack[edge];
    if (std::fabs(d) <= slack) {
      band.push_back(g);
    } else if (d > 0) {
      certain[g] = true;
      ++n_certain;
    }
  }
  // Each choice of the band's groups to fill the kept count (a band is a handful of groups at a
  // near-tie; a larger one, of groups all within ulps, is tried in its first 4096 choices).
  const int64_t need = r.groups_kept() - n_certain;
  if (need < 0 || need > static_cast<int64_t>(band.size())) return false;
  std::vector<char> pick(band.size(), 0);
  std::fill(pick.begin(), pick.begin() + need, 1);
  int tries = 0;
  do {
    std::vector<bool> kept = certain;
    for (size_t i = 0; i < band.size(); ++i)
      if (pick[i]) kept[band[i]] = true;
    if (matches(kept)) return true;
  } while (++tries < 4096 && std::prev_permutation(pick.begin(), pick.end()));
  return false;
}

void random_distinct_ids(int64_t tokens, int64_t k, int64_t experts, std::vector<float>& ids, std::mt19937_64& rng) {
  std::vector<int> all(static_cast<size_t>(experts));
  std::iota(all.begin(), all.end(), 0);
  ids.assign(static_cast<size_t>(tokens * k), 0.0f);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t j = 0; j < k; ++j) {  // a partial Fisher-Yates shuffle: k distinct experts
      std::uniform_int_distribution<int64_t> pick(j, experts - 1);
      std::swap(all[static_cast<size_t>(j)], all[static_cast<size_t>(pick(rng))]);
      ids[static_cast<size_t>(t * k + j)] = static_cast<float>(all[static_cast<size_t>(j)]);
    }
  }
}

void random_row_map(int64_t tokens, int64_t k, std::vector<float>& map, std::mt19937_64& rng) {
  std::vector<int64_t> rows(static_cast<size_t>(tokens * k));
  std::iota(rows.begin(), rows.end(), 0);
  std::shuffle(rows.begin(), rows.end(), rng);
  map.resize(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) map[i] = i % 13 == 5 ? -1.0f : static_cast<float>(rows[i]);
}

Result<void> check_slots(std::string_view op, const KernelSpec& spec) {
  const int64_t slots = spec.param("tokens") * spec.param("k");
  if (slots > std::numeric_limits<int32_t>::max())
    return make_error(Errc::invalid_argument,
                      fmt::format("{}: tokens * k = {} rows do not fit the int32 row map (at most {}); split the "
                                  "tokens into several calls",
                                  op, slots, std::numeric_limits<int32_t>::max()));
  return ok();
}

namespace {
const ParamInfo kRowMapParams[] = {
    {"tokens", "rows of the token-order tensor; a runtime argument, not baked; 0 is a no-op", false, false, 0,
     (int64_t{1} << 31) - 1},
    {"hidden", "columns of every row", true, false, 1, int64_t{1} << 20},
    {"k", "slots (experts) per token", true, false, 1, kMaxK},
};
}  // namespace

std::span<const ParamInfo> row_map_params() { return kRowMapParams; }

std::vector<int64_t> equal_pass_threads(int64_t nvec, int64_t lo, int64_t hi, const TargetInfo& target) {
  std::vector<int64_t> out;
  for (int64_t t = std::min(hi, nvec) / target.wave_size * target.wave_size; t >= std::max<int64_t>(lo, 1);
       t -= target.wave_size)
    if (nvec % t == 0) out.push_back(t);
  return out;
}

std::vector<KernelConfig> row_walk_candidates(int64_t hidden, KernelConfig first, const TargetInfo& target) {
  const int64_t nvec = ceil_div(hidden, first.at("VEC"));
  std::vector<int64_t> threads = {64, 128, 256, 512, 1024};
  // 1 to 8 equal passes over the row.
  for (int64_t t : equal_pass_threads(nvec, ceil_div(nvec, 8), target.max_threads_per_block, target))
    threads.push_back(t);
  std::vector<KernelConfig> out = {std::move(first)};
  for (int64_t t : threads) {
    KernelConfig c = out.front();
    c["THREADS"] = t;
    if (t % target.wave_size == 0 && t <= target.max_threads_per_block && std::find(out.begin(), out.end(), c) == out.end())
      out.push_back(std::move(c));
  }
  return out;
}

std::vector<TestSpec> row_map_test_specs(std::string_view op) {
  std::vector<TestSpec> out;
  auto add = [&](DType t, int64_t tokens, int64_t hidden, int64_t k, std::string_view why) {
    out.push_back({{std::string(op), t, t, {{"tokens", tokens}, {"hidden", hidden}, {"k", k}}}, why});
  };
  add(DType::bf16, 37, 64, 2, "Mixtral's top-2, hidden 64");
  add(DType::f16, 29, 40, 8, "top-8, hidden 40 (vectors of 8)");
  add(DType::f32, 13, 7, 3, "hidden 7 (scalar accesses), fp32");
  add(DType::bf16, 11, 1000, 1, "top-1, hidden 1000");
  add(DType::bf16, 6, 2048, 6, "DeepSeek-V2-Lite: hidden 2048, top-6");
  add(DType::bf16, 5, 7168, 8, "DeepSeek-V3: hidden 7168, top-8");
  add(DType::bf16, 0, 64, 2, "0 tokens: a no-op");
  return out;
}

}  // namespace kiln::moe
