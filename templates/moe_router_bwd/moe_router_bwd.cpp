#include "templates/moe_router_bwd/moe_router_bwd.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "support/embedded.h"
#include "templates/lib/moe.h"

namespace kiln {
namespace {
const ParamInfo kParams[] = {
    {"tokens", "rows of the logits; a runtime argument, not baked; 0 is a no-op", false, false, 0,
     (int64_t{1} << 31) - 1},
    {"experts", "routed experts: the logits' last dimension", true, false, 1, moe::kMaxExperts},
    {"k", "experts per token (top-k)", true, false, 1, moe::kMaxK},
    {"scoring", "softmax over the experts or sigmoid per expert, as in the forward", true, false, 0, 1, moe::kScoring,
     0},
    {"renormalize", "the forward divided the k weights by their sum", true, true, 0, 1, {}, 0},
};
const ScalarInfo kScalars[] = {
    {"routed_scaling_factor", 1.0f, "the forward's factor on every weight"},
};
constexpr int64_t kThreads = 256;

std::vector<int64_t> tokens_experts(const KernelSpec& s) { return {s.param("tokens"), s.param("experts")}; }
const TensorDecl kSignature[] = {
    {"logits", Role::input, DTypeRule::in, DType::f32, "[tokens, experts]", tokens_experts},
    {"topk_ids", Role::input, DTypeRule::fixed, DType::i32, "[tokens, k]", moe::tokens_k, nullptr, "the forward's choice"},
    {"dtopk_weights", Role::input, DTypeRule::fixed, DType::f32, "[tokens, k]", moe::tokens_k},
    {"dlogits", Role::output, DTypeRule::in, DType::f32, "[tokens, experts]", tokens_experts},
};
}  // namespace

std::span<const ParamInfo> MoeRouterBwdOp::params() const { return kParams; }
std::span<const ScalarInfo> MoeRouterBwdOp::scalars() const { return kScalars; }
std::span<const DType> MoeRouterBwdOp::dtypes() const { return moe::kFloatDTypes; }
std::span<const TensorDecl> MoeRouterBwdOp::signature() const { return kSignature; }
std::string_view MoeRouterBwdOp::device_template(const KernelConfig&) const {
  return embedded_file("templates/moe_router_bwd/moe_router_bwd.kernel");
}

Result<void> MoeRouterBwdOp::validate_rules(const KernelSpec& spec, const TargetInfo&) const {
  return moe::check_routing(name(), moe::Routing::of(with_defaults(spec)));
}

std::vector<KernelConfig> MoeRouterBwdOp::variants(const KernelSpec&, const TargetInfo& target) const {
  return {{{"THREADS", kThreads}, {"WAVES", kThreads / target.wave_size}}};
}

std::string MoeRouterBwdOp::specialize(const KernelSpec& given, const KernelConfig& c) const {
  const moe::Routing r = moe::Routing::of(with_defaults(given));
  return fmt::format("constexpr int EXPERTS = {}, K = {};\n#define SIGMOID {}\n#define RENORM {}\n"
                     "constexpr int THREADS = {};\ntypedef {} in_t;\n",
                     r.experts, r.k, int(r.sigmoid), int(r.renormalize), c.at("THREADS"),
                     device_type_name(given.dtype));
}

Plan MoeRouterBwdOp::plan(const KernelSpec& call, const KernelConfig& c) const {
  Plan p;
  const int64_t T = call.param("tokens");
  if (T == 0) return p;
  using A = KernelArg;
  Launch l;
  l.kernel = "kiln_moe_router_bwd";
  l.geometry.grid.x = static_cast<uint32_t>(ceil_div(T, c.at("WAVES")));
  l.geometry.block.x = static_cast<uint32_t>(c.at("THREADS"));
  l.args = {A::tensor(0), A::tensor(1), A::tensor(2), A::tensor(3), A::i32(T), A::scalar(0)};
  p.launches.push_back(std::move(l));
  return p;
}

void MoeRouterBwdOp::init_inputs(const KernelSpec& spec, std::span<const TensorInfo> inputs,
                                 std::vector<std::vector<float>>& values, std::mt19937_64& rng) const {
  OpTemplate::init_inputs(spec, inputs, values, rng);
  for (float& v : values[0]) v = round_to_dtype(3.0f * v, inputs[0].dtype);
  moe::random_distinct_ids(spec.param("tokens"), spec.param("k"), spec.param("experts"), values[1], rng);
}

void MoeRouterBwdOp::reference(const KernelSpec& given, const Scalars& scalars, std::span<const std::vector<float>> in,
                               std::span<const int64_t>, std::vector<RefOutput>& outputs) const {
  const KernelSpec spec = with_defaults(given);
  const moe::Routing r = moe::Routing::of(spec);
  const int64_t T = spec.param("tokens"), E = r.experts, K = r.k;
  const double c = scalar(scalars, "routed_scaling_factor");
  outputs.assign(1, {});
  std::vector<double>& d = outputs[0].values;
  d.assign(static_cast<size_t>(T * E), 0.0);
  std::vector<double> s(static_cast<size_t>(E)), w(static_cast<size_t>(K)), g(static_cast<size_t>(K));
  std::vector<int64_t> ids(static_cast<size_t>(K));
  for (int64_t t = 0; t < T; ++t) {
    const float* x = &in[0][static_cast<size_t>(t * E)];
    double m = -INFINITY, z = 0;
    for (int64_t e = 0; e < E; ++e) m = std::max<double>(m, x[e]);
    for (int64_t e = 0; e < E; ++e) z += std::exp(x[e] - m);
    for (int64_t e = 0; e < E; ++e) s[e] = moe::score(r, x[e], m, z);
    double sum = 0, gw = 0;
    for (int64_t j = 0; j < K; ++j) {
      ids[j] = static_cast<int64_t>(in[1][static_cast<size_t>(t * K + j)]);
      const bool valid = ids[j] >= 0 && ids[j] < E;
      w[j] = valid ? s[ids[j]] : 0.0;
      g[j] = valid ? in[2][static_cast<size_t>(t * K + j)] : 0.0;
      sum += w[j];
      gw += g[j] * w[j];
    }
    const double S = sum + 1e-20;
    std::vector<double> ds(static_cast<size_t>(E), 0.0);
    double dot = 0;
    for (int64_t j = 0; j < K; ++j) {
      const double dw = r.renormalize ? c * (g[j] / S - gw / (S * S)) : c * g[j];
      if (ids[j] >= 0 && ids[j] < E) ds[ids[j]] = dw;
      dot += dw * w[j];
    }
    for (int64_t e = 0; e < E; ++e)
      d[static_cast<size_t>(t * E + e)] = r.sigmoid ? ds[e] * s[e] * (1 - s[e]) : s[e] * (ds[e] - dot);
  }
}

std::vector<TestSpec> MoeRouterBwdOp::test_specs(const TargetInfo&) const {
  std::vector<TestSpec> out;
  auto add = [&](DType t, int64_t tokens, int64_t experts, int64_t k, int64_t scoring, int64_t renorm,
                 std::string_view why) {
    out.push_back({{"moe_router_bwd", t, t,
                    {{"tokens", tokens}, {"experts", experts}, {"k", k}, {"scoring", scoring}, {"renormalize", renorm}}},
                   why});
  };
  add(DType::bf16, 37, 8, 2, 0, 1, "Mixtral-8x7B: softmax, top-2 of 8, renormalized");
  add(DType::bf16, 19, 128, 8, 0, 1, "Qwen3-235B-A22B: softmax, top-8 of 128, renormalized");
  add(DType::f32, 21, 256, 8, 1, 1, "DeepSeek-V3: sigmoid, top-8 of 256, renormalized");
  add(DType::f16, 11, 64, 6, 0, 0, "DeepSeek-V2-Lite: softmax, top-6 of 64, not renormalized");
  add(DType::f32, 5, 3, 3, 1, 0, "3 experts, all chosen, sigmoid");
  add(DType::bf16, 0, 16, 2, 0, 1, "0 tokens: a no-op");
  return out;
}

}  // namespace kiln
