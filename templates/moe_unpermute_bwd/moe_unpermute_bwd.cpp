#include "templates/moe_unpermute_bwd/moe_unpermute_bwd.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "support/embedded.h"
#include "templates/lib/elementwise_row.h"
#include "templates/lib/moe.h"

namespace kiln {
namespace {
const TensorDecl kSignature[] = {
    {"dy", Role::input, DTypeRule::in, DType::f32, "[tokens, hidden]", moe::tokens_hidden, nullptr,
     "gradient of moe_unpermute's y"},
    {"y_sorted", Role::input, DTypeRule::in, DType::f32, "[tokens * k, hidden]", moe::slots_hidden, nullptr,
     "the forward's y_sorted"},
    {"row_map", Role::input, DTypeRule::fixed, DType::i32, "[tokens, k]", moe::tokens_k, nullptr,
     "row of each slot (moe_permute's); -1: dropped"},
    {"topk_weights", Role::input, DTypeRule::fixed, DType::f32, "[tokens, k]", moe::tokens_k},
    {"dy_sorted", Role::output, DTypeRule::in, DType::f32, "[tokens * k, hidden]", moe::slots_hidden, nullptr,
     "rows no slot maps to: not written"},
    {"dtopk_weights", Role::output, DTypeRule::fixed, DType::f32, "[tokens, k]", moe::tokens_k},
};
}  // namespace

std::span<const ParamInfo> MoeUnpermuteBwdOp::params() const { return moe::row_map_params(); }
Result<void> MoeUnpermuteBwdOp::validate_rules(const KernelSpec& spec, const TargetInfo&) const {
  return moe::check_slots(name(), spec);
}
std::span<const DType> MoeUnpermuteBwdOp::dtypes() const { return moe::kFloatDTypes; }
std::span<const TensorDecl> MoeUnpermuteBwdOp::signature() const { return kSignature; }
std::string_view MoeUnpermuteBwdOp::device_template(const KernelConfig&) const {
  return embedded_file("templates/moe_unpermute_bwd/moe_unpermute_bwd.kernel");
}
std::vector<KernelConfig> MoeUnpermuteBwdOp::variants(const KernelSpec& spec, const TargetInfo& target) const {
  // THREADS: the largest whole-wavefront count up to 256 that divides the row's vectors, so that the
  // last pass over the row leaves no thread idle (H100, 2026-11-27, 16384 tokens x 7168, k 8, bf16:
  // 224 threads in 4 passes 1.374 ms against 1.480 for 256 in 3.5; `scripts/gpu_tune_membound.sh
  // moe_unpermute_bwd`, bench/results/h100-2026-11-27-session16/); 256 where none does.
  std::vector<KernelConfig> out = elementwise_row_variants(spec.param("hidden"), spec.dtype, target);
  for (KernelConfig& c : out) {
    const std::vector<int64_t> equal = moe::equal_pass_threads(ceil_div(spec.param("hidden"), c.at("VEC")), 64, 256, target);
    if (!equal.empty()) c["THREADS"] = equal.front();
  }
  return out;
}
std::vector<KernelConfig> MoeUnpermuteBwdOp::tuning_candidates(const KernelSpec& spec, const TargetInfo& target) const {
  return moe::row_walk_candidates(spec.param("hidden"), choose_config(spec, target), target);
}
std::vector<uint32_t> MoeUnpermuteBwdOp::base_alignment(const KernelSpec& spec, const KernelConfig& config) const {
  return vector_variant_alignment(config, tensors(spec).size(), {2, 3, 5});  // row_map, weights, dweights
}
std::string MoeUnpermuteBwdOp::specialize(const KernelSpec& spec, const KernelConfig& c) const {
  return fmt::format("constexpr int K = {}, HIDDEN = {};\nconstexpr int THREADS = {}, VEC = {};\ntypedef {} in_t;\n",
                     spec.param("k"), spec.param("hidden"), c.at("THREADS"), c.at("VEC"), device_type_name(spec.dtype));
}
Plan MoeUnpermuteBwdOp::plan(const KernelSpec& call, const KernelConfig& c) const {
  Plan p;
  if (call.param("tokens") == 0) return p;
  using A = KernelArg;
  LaunchGeometry g;  // one block per token, over its whole row
  g.grid.x = static_cast<uint32_t>(call.param("tokens"));
  g.block.x = static_cast<uint32_t>(c.at("THREADS"));
  p.launches.push_back(
      {"kiln_moe_unpermute_bwd", g, {A::tensor(0), A::tensor(1), A::tensor(2), A::tensor(3), A::tensor(4), A::tensor(5)}});
  return p;
}
void MoeUnpermuteBwdOp::init_inputs(const KernelSpec& spec, std::span<const TensorInfo> inputs,
                                    std::vector<std::vector<float>>& values, std::mt19937_64& rng) const {
  OpTemplate::init_inputs(spec, inputs, values, rng);
  moe::random_row_map(spec.param("tokens"), spec.param("k"), values[2], rng);
}
void MoeUnpermuteBwdOp::reference(const KernelSpec& spec, const Scalars&, std::span<const std::vector<float>> in,
                                  std::span<const int64_t> sample, std::vector<RefOutput>& outputs) const {
  const int64_t T = spec.param("tokens"), K = spec.param("k"), H = spec.param("hidden");
  outputs.assign(2, {});
  std::vector<double>& dys = outputs[0].values;
  std::vector<double>& dw = outputs[1].values;
  // dy_sorted: every row, or the sampled ones (`at` maps a row to its place in the values).
  outputs[0].rows.assign(sample.begin(), sample.end());
  std::vector<int64_t> at(static_cast<size_t>(T * K), sample.empty() ? 0 : -1);
  if (sample.empty())
    for (int64_t r = 0; r < T * K; ++r) at[static_cast<size_t>(r)] = r;
  for (size_t i = 0; i < sample.size(); ++i) at[static_cast<size_t>(sample[i])] = static_cast<int64_t>(i);
  const int64_t kept = sample.empty() ? T * K : static_cast<int64_t>(sample.size());
  dys.assign(static_cast<size_t>(kept * H), NAN);  // rows no slot maps to: not written
  dw.assign(static_cast<size_t>(T * K), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t s = 0; s < K; ++s) {
      const int64_t row = static_cast<int64_t>(in[2][static_cast<size_t>(t * K + s)]);
      if (row < 0) continue;
      const double w = in[3][static_cast<size_t>(t * K + s)];
      double dot = 0;
      for (int64_t c = 0; c < H; ++c) {
        const double d = in[0][static_cast<size_t>(t * H + c)];
        if (at[static_cast<size_t>(row)] >= 0) dys[static_cast<size_t>(at[static_cast<size_t>(row)] * H + c)] = w * d;
        dot += d * in[1][static_cast<size_t>(row * H + c)];
      }
      dw[static_cast<size_t>(t * K + s)] = dot;
    }
}
std::vector<TestSpec> MoeUnpermuteBwdOp::test_specs(const TargetInfo&) const {
  return moe::row_map_test_specs(name());
}

}  // namespace kiln
