#include "templates/embedding/embedding.h"

#include <fmt/format.h>

#include <algorithm>

#include "support/embedded.h"
#include "templates/lib/embedding_params.h"

namespace kiln {
namespace {
namespace ep = embedding_params;
const ParamInfo kParams[] = {
    {"tokens", "tokens (ids); a runtime argument, not baked; 0 is a no-op", false, false, 0, ep::kInt32Max},
    {"vocab", "rows of W", true, false, 1, ep::kInt32Max},
    {"hidden", "columns of W and y", true, false, 1, int64_t{1} << 20},
    ep::ids_dtype_param(),
};
const TensorDecl kSignature[] = {
    ep::ids_decl(ep::kIds32),
    ep::ids_decl(ep::kIds64),
    {"W", Role::input, DTypeRule::in, DType::f32, "[vocab, hidden]", ep::vocab_hidden},
    {"y", Role::output, DTypeRule::out, DType::f32, "[tokens, hidden]", ep::tokens_hidden},
};
}  // namespace

std::span<const ParamInfo> EmbeddingOp::params() const { return kParams; }
std::span<const DType> EmbeddingOp::dtypes() const { return ep::kDTypes; }
std::span<const TensorDecl> EmbeddingOp::signature() const { return kSignature; }
std::string_view EmbeddingOp::device_template(const KernelConfig&) const {
  return embedded_file("templates/embedding/embedding.kernel");
}

std::vector<KernelConfig> EmbeddingOp::variants(const KernelSpec& spec, const TargetInfo& target) const {
  return ep::variants(spec, target);
}
std::vector<uint32_t> EmbeddingOp::base_alignment(const KernelSpec& spec, const KernelConfig& config) const {
  return vector_variant_alignment(config, tensors(spec).size(), {0});  // ids: one at a time
}

std::string EmbeddingOp::specialize(const KernelSpec& given, const KernelConfig& c) const {
  const KernelSpec spec = with_defaults(given);
  return fmt::format("constexpr long long VOCAB = {};\nconstexpr int HIDDEN = {};\n"
                     "constexpr int THREADS = {}, VEC = {}, ITEMS = {};\ntypedef {} id_t;\ntypedef {} in_t;\n"
                     "typedef {} out_t;\n",
                     spec.param("vocab"), spec.param("hidden"), c.at("THREADS"), c.at("VEC"), c.at("ITEMS"),
                     spec.param("ids_dtype") ? "long long" : "int", device_type_name(spec.dtype),
                     device_type_name(spec.out_dtype));
}

Plan EmbeddingOp::plan(const KernelSpec& call, const KernelConfig& c) const {
  Plan p;
  if (call.param("tokens") == 0) return p;
  LaunchGeometry g;
  g.grid.x = static_cast<uint32_t>(call.param("tokens"));
  g.grid.y = static_cast<uint32_t>(ceil_div(ceil_div(call.param("hidden"), c.at("VEC")), c.at("THREADS") * c.at("ITEMS")));
  g.block.x = static_cast<uint32_t>(c.at("THREADS"));
  p.launches.push_back(single_launch(call, c, g));
  return p;
}

void EmbeddingOp::init_inputs(const KernelSpec& spec, std::span<const TensorInfo> inputs,
                              std::vector<std::vector<float>>& values, std::mt19937_64& rng) const {
  OpTemplate::init_inputs(spec, inputs, values, rng);
  ep::init_ids(spec.param("vocab"), values[0], rng);
}

void EmbeddingOp::reference(const KernelSpec& spec, const Scalars&, std::span<const std::vector<float>> in,
                            std::span<const int64_t> sample, std::vector<RefOutput>& outputs) const {
  const int64_t n = spec.param("tokens"), V = spec.param("vocab"), H = spec.param("hidden");
  outputs.assign(1, {});
  RefOutput& y = outputs[0];
  y.rows.assign(sample.begin(), sample.end());
  if (y.rows.empty())
    for (int64_t t = 0; t < n; ++t) y.rows.push_back(t);
  for (int64_t t : y.rows) {
    const int64_t id = static_cast<int64_t>(in[0][static_cast<size_t>(t)]);
    for (int64_t c = 0; c < H; ++c)
      y.values.push_back(id >= 0 && id < V ? in[1][static_cast<size_t>(id * H + c)] : 0.0);
  }
}

double EmbeddingOp::bytes(const KernelSpec& given) const {
  // The ids, the rows of W read (one per token) and y: not the whole table.
  const KernelSpec s = with_defaults(given);
  const double row = static_cast<double>(s.param("hidden")) * static_cast<double>(dtype_size(s.dtype));
  return static_cast<double>(s.param("tokens")) * ((s.param("ids_dtype") ? 8.0 : 4.0) + 2 * row);
}

std::vector<TestSpec> EmbeddingOp::test_specs(const TargetInfo&) const {
  std::vector<TestSpec> out;
  auto add = [&](DType t, int64_t tokens, int64_t vocab, int64_t hidden, int64_t ids, std::string_view why) {
    out.push_back(ep::test_spec(name(), t, tokens, vocab, hidden, ids, why));
  };
  add(DType::bf16, 70, 50, 64, 1, "int64 ids, repeated and out of range, vector");
  add(DType::f16, 40, 300, 7, 0, "int32 ids, hidden 7 (scalar)");
  add(DType::f32, 33, 1000, 100, 1, "fp32, hidden 100 (vector of 4)");
  add(DType::bf16, 5, 17, 1, 0, "hidden 1");
  add(DType::bf16, 0, 10, 64, 1, "0 tokens: a no-op");
  add(DType::bf16, 3, 16, 4096, 1, "Llama hidden 4096");
  return out;
}

}  // namespace kiln
