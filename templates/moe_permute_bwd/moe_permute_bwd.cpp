#include "templates/moe_permute_bwd/moe_permute_bwd.h"

#include <fmt/format.h>

#include "support/embedded.h"
#include "templates/lib/elementwise_row.h"
#include "templates/lib/moe.h"

namespace kiln {
namespace {
// moe::row_map_params() and accumulate: the router path's dx (an MoE block's other gradient of x)
// summed with the expert rows in the same pass, as rmsnorm_bwd adds dres.
const ParamInfo kParams[] = {
    {"tokens", "rows of dx; a runtime argument, not baked; 0 is a no-op", false, false, 0, (int64_t{1} << 31) - 1},
    {"hidden", "columns of every row", true, false, 1, int64_t{1} << 20},
    {"k", "slots (experts) per token", true, false, 1, moe::kMaxK},
    {"accumulate", "dx += the slots' sum: dx_in is read and dx written over it, in place (default 0)", true, true, 0, 1,
     {}, 0},
};
bool accumulate(const KernelSpec& s) { return s.param("accumulate") != 0; }

const TensorDecl kSignature[] = {
    {"dx_sorted", Role::input, DTypeRule::in, DType::f32, "[tokens * k, hidden]", moe::slots_hidden, nullptr,
     "gradient of moe_permute's x_sorted"},
    {"row_map", Role::input, DTypeRule::fixed, DType::i32, "[tokens, k]", moe::tokens_k, nullptr,
     "row of each slot (moe_permute's); -1: dropped"},
    {"dx_in", Role::input, DTypeRule::in, DType::f32, "[tokens, hidden]", moe::tokens_hidden, accumulate,
     "accumulate=1: the gradient added to (an MoE block's router path); dx is written over it"},
    {"dx", Role::output, DTypeRule::in, DType::f32, "[tokens, hidden]", moe::tokens_hidden, nullptr,
     "(dx_in +) the sum of the token's rows", "dx_in"},
};
}  // namespace

std::span<const ParamInfo> MoePermuteBwdOp::params() const { return kParams; }
Result<void> MoePermuteBwdOp::validate_rules(const KernelSpec& spec, const TargetInfo&) const {
  return moe::check_slots(name(), spec);
}
std::span<const DType> MoePermuteBwdOp::dtypes() const { return moe::kFloatDTypes; }
std::span<const TensorDecl> MoePermuteBwdOp::signature() const { return kSignature; }
std::string_view MoePermuteBwdOp::device_template(const KernelConfig&) const {
  return embedded_file("templates/moe_permute_bwd/moe_permute_bwd.kernel");
}
std::vector<KernelConfig> MoePermuteBwdOp::variants(const KernelSpec& spec, const TargetInfo& target) const {
  return elementwise_row_variants(spec.param("hidden"), spec.dtype, target);
}
std::vector<uint32_t> MoePermuteBwdOp::base_alignment(const KernelSpec& spec, const KernelConfig& config) const {
  return vector_variant_alignment(config, tensors(spec).size(), {1});  // row_map: scalars
}
std::string MoePermuteBwdOp::specialize(const KernelSpec& spec, const KernelConfig& c) const {
  return fmt::format("constexpr int K = {}, HIDDEN = {};\nconstexpr bool ACCUMULATE = {};\n"
                     "constexpr int THREADS = {}, VEC = {}, ITEMS = {};\ntypedef {} in_t;\n",
                     spec.param("k"), spec.param("hidden"), accumulate(spec) ? "true" : "false", c.at("THREADS"),
                     c.at("VEC"), c.at("ITEMS"), device_type_name(spec.dtype));
}
Plan MoePermuteBwdOp::plan(const KernelSpec& call, const KernelConfig& c) const {
  Plan p;
  if (call.param("tokens") == 0) return p;
  using A = KernelArg;
  p.launches.push_back({"kiln_moe_permute_bwd", elementwise_row_geometry(call.param("tokens"), call.param("hidden"), c),
                        {A::tensor(0), A::tensor(1), A::tensor(accumulate(with_defaults(call)) ? 3 : 2)}});
  return p;
}
void MoePermuteBwdOp::init_inputs(const KernelSpec& spec, std::span<const TensorInfo> inputs,
                                  std::vector<std::vector<float>>& values, std::mt19937_64& rng) const {
  OpTemplate::init_inputs(spec, inputs, values, rng);
  moe::random_row_map(spec.param("tokens"), spec.param("k"), values[1], rng);
}
void MoePermuteBwdOp::reference(const KernelSpec& spec, const Scalars&, std::span<const std::vector<float>> in,
                                std::span<const int64_t> sample, std::vector<RefOutput>& outputs) const {
  const int64_t T = spec.param("tokens"), K = spec.param("k"), H = spec.param("hidden");
  outputs.assign(1, {});
  std::vector<double>& dx = outputs[0].values;
  std::vector<int64_t> tokens(sample.begin(), sample.end());  // every token, or the sampled ones
  if (tokens.empty())
    for (int64_t t = 0; t < T; ++t) tokens.push_back(t);
  else
    outputs[0].rows = tokens;
  dx.assign(tokens.size() * static_cast<size_t>(H), 0.0);
  const bool acc = accumulate(with_defaults(spec));
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (acc)  // dx_in first, then the slots in order, as the kernel sums
      for (int64_t c = 0; c < H; ++c)
        dx[i * static_cast<size_t>(H) + static_cast<size_t>(c)] = in[2][static_cast<size_t>(tokens[i] * H + c)];
    for (int64_t s = 0, t = tokens[i]; s < K; ++s) {
      const int64_t row = static_cast<int64_t>(in[1][static_cast<size_t>(t * K + s)]);
      if (row < 0) continue;
      for (int64_t c = 0; c < H; ++c) dx[i * static_cast<size_t>(H) + static_cast<size_t>(c)] += in[0][static_cast<size_t>(row * H + c)];
    }
  }
}
std::vector<TestSpec> MoePermuteBwdOp::test_specs(const TargetInfo&) const {
  std::vector<TestSpec> out = moe::row_map_test_specs(name());
  auto add = [&](DType t, int64_t tokens, int64_t hidden, int64_t k, std::string_view why) {
    out.push_back({{std::string(name()), t, t, {{"tokens", tokens}, {"hidden", hidden}, {"k", k}, {"accumulate", 1}}},
                   why});
  };
  add(DType::bf16, 37, 64, 2, "accumulate (an MoE block's router path into dx), top-2, hidden 64");
  add(DType::f32, 13, 7, 3, "accumulate, hidden 7 (scalar accesses), fp32");
  add(DType::bf16, 0, 64, 2, "accumulate, 0 tokens: a no-op");
  return out;
}

}  // namespace kiln
