#include "templates/moe_unpermute/moe_unpermute.h"

#include <fmt/format.h>

#include "support/embedded.h"
#include "templates/lib/elementwise_row.h"
#include "templates/lib/moe.h"

namespace kiln {
namespace {
const TensorDecl kSignature[] = {
    {"y_sorted", Role::input, DTypeRule::in, DType::f32, "[tokens * k, hidden]", moe::slots_hidden, nullptr,
     "the experts' outputs, in moe_permute's row order"},
    {"row_map", Role::input, DTypeRule::fixed, DType::i32, "[tokens, k]", moe::tokens_k, nullptr,
     "row of each slot (moe_permute's); -1: dropped"},
    {"topk_weights", Role::input, DTypeRule::fixed, DType::f32, "[tokens, k]", moe::tokens_k},
    {"y", Role::output, DTypeRule::in, DType::f32, "[tokens, hidden]", moe::tokens_hidden},
};
}  // namespace

std::span<const ParamInfo> MoeUnpermuteOp::params() const { return moe::row_map_params(); }
Result<void> MoeUnpermuteOp::validate_rules(const KernelSpec& spec, const TargetInfo&) const {
  return moe::check_slots(name(), spec);
}
std::span<const DType> MoeUnpermuteOp::dtypes() const { return moe::kFloatDTypes; }
std::span<const TensorDecl> MoeUnpermuteOp::signature() const { return kSignature; }
std::string_view MoeUnpermuteOp::device_template(const KernelConfig&) const {
  return embedded_file("templates/moe_unpermute/moe_unpermute.kernel");
}
std::vector<KernelConfig> MoeUnpermuteOp::variants(const KernelSpec& spec, const TargetInfo& target) const {
  return elementwise_row_variants(spec.param("hidden"), spec.dtype, target);
}
std::vector<uint32_t> MoeUnpermuteOp::base_alignment(const KernelSpec& spec, const KernelConfig& config) const {
  return vector_variant_alignment(config, tensors(spec).size(), {1, 2});  // row_map, topk_weights: scalars
}
std::string MoeUnpermuteOp::specialize(const KernelSpec& spec, const KernelConfig& c) const {
  return fmt::format("constexpr int K = {}, HIDDEN = {};\nconstexpr int THREADS = {}, VEC = {}, ITEMS = {};\n"
                     "typedef {} in_t;\n",
                     spec.param("k"), spec.param("hidden"), c.at("THREADS"), c.at("VEC"), c.at("ITEMS"),
                     device_type_name(spec.dtype));
}
Plan MoeUnpermuteOp::plan(const KernelSpec& call, const KernelConfig& c) const {
  Plan p;
  if (call.param("tokens") == 0) return p;
  using A = KernelArg;
  p.launches.push_back({"kiln_moe_unpermute", elementwise_row_geometry(call.param("tokens"), call.param("hidden"), c),
                        {A::tensor(0), A::tensor(1), A::tensor(2), A::tensor(3)}});
  return p;
}
void MoeUnpermuteOp::init_inputs(const KernelSpec& spec, std::span<const TensorInfo> inputs,
                                 std::vector<std::vector<float>>& values, std::mt19937_64& rng) const {
  OpTemplate::init_inputs(spec, inputs, values, rng);
  moe::random_row_map(spec.param("tokens"), spec.param("k"), values[1], rng);
}
void MoeUnpermuteOp::reference(const KernelSpec& spec, const Scalars&, std::span<const std::vector<float>> in,
                               std::span<const int64_t> sample, std::vector<RefOutput>& outputs) const {
  const int64_t T = spec.param("tokens"), K = spec.param("k"), H = spec.param("hidden");
  outputs.assign(1, {});
  std::vector<double>& y = outputs[0].values;
  std::vector<int64_t> tokens(sample.begin(), sample.end());  // every token, or the sampled ones
  if (tokens.empty())
    for (int64_t t = 0; t < T; ++t) tokens.push_back(t);
  else
    outputs[0].rows = tokens;
  y.assign(tokens.size() * static_cast<size_t>(H), 0.0);
  for (size_t i = 0; i < tokens.size(); ++i)
    for (int64_t s = 0, t = tokens[i]; s < K; ++s) {
      const int64_t row = static_cast<int64_t>(in[1][static_cast<size_t>(t * K + s)]);
      if (row < 0) continue;
      const double w = in[2][static_cast<size_t>(t * K + s)];
      for (int64_t c = 0; c < H; ++c) y[i * static_cast<size_t>(H) + static_cast<size_t>(c)] += w * in[0][static_cast<size_t>(row * H + c)];
    }
}
std::vector<TestSpec> MoeUnpermuteOp::test_specs(const TargetInfo&) const { return moe::row_map_test_specs(name()); }

}  // namespace kiln
