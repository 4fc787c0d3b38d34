#include "templates/embedding/embedding.h"

#include <fmt/format.h>

#include <algorithm>

#include "support/embedded.h"

namespace kiln {
namespace {
constexpr std::string_view kIdTypes[] = {"int32", "int64"};
const ParamInfo kParams[] = {
    {"tokens", "tokens (ids); a runtime argument, not baked; 0 is a no-op", false, false, 0, (int64_t{1} << 31) - 1},
    {"vocab", "rows of W", true, false, 1, (int64_t{1} << 31) - 1},
    {"hidden", "columns of W and y", true, false, 1, int64_t{1} << 20},
    {"ids_dtype", "dtype of ids: int32 or int64 (default, as PyTorch's token ids)", true, false, 0, 1, kIdTypes, 1},
};
const DType kDTypes[] = {DType::bf16, DType::f16, DType::f32};
std::vector<int64_t> tokens(const KernelSpec& s) { return {s.param("tokens")}; }
std::vector<int64_t> vocab_hidden(const KernelSpec& s) { return {s.param("vocab"), s.param("hidden")}; }
std::vector<int64_t> tokens_hidden(const KernelSpec& s) { return {s.param("tokens"), s.param("hidden")}; }
bool ids32(const KernelSpec& s) { return s.param("ids_dtype") == 0; }
bool ids64(const KernelSpec& s) { return s.param("ids_dtype") == 1; }
// ids is one of two declarations (int32 or int64): a tensor's dtype is fixed per declaration.
const TensorDecl kSignature[] = {
    {"ids", Role::input, DTypeRule::fixed, DType::i32, "[tokens]", tokens, ids32, "token ids (ids_dtype = int32)"},
    {"ids", Role::input, DTypeRule::fixed, DType::i64, "[tokens]", tokens, ids64, "token ids (ids_dtype = int64)"},
    {"W", Role::input, DTypeRule::in, DType::f32, "[vocab, hidden]", vocab_hidden},
    {"y", Role::output, DTypeRule::out, DType::f32, "[tokens, hidden]", tokens_hidden},
};

// Up to 256 threads of at most 2 accesses each per block (as the elementwise row ops).
TileConfig row_config(int64_t columns, int64_t vec, const TargetInfo& target) {
  const int64_t nvec = ceil_div(columns, vec);
  const int64_t threads = std::clamp<int64_t>(round_up(ceil_div(nvec, 2), target.wave_size), target.wave_size, 256);
  const int64_t items = std::clamp<int64_t>(ceil_div(nvec, threads), 1, 2);
  return {{"THREADS", threads}, {"VEC", vec}, {"ITEMS", items}};
}
}  // namespace

std::span<const ParamInfo> EmbeddingOp::params() const { return kParams; }
std::span<const DType> EmbeddingOp::dtypes() const { return kDTypes; }
std::span<const TensorDecl> EmbeddingOp::signature() const { return kSignature; }
std::string_view EmbeddingOp::device_template(const TileConfig&) const {
  return embedded_file("templates/embedding/embedding.kernel");
}

std::vector<TileConfig> EmbeddingOp::variants(const KernelSpec& spec, const TargetInfo& target) const {
  const int64_t hidden = spec.param("hidden"), vec = 16 / static_cast<int64_t>(dtype_size(spec.dtype));
  std::vector<TileConfig> out;
  if (hidden % vec == 0) out.push_back(row_config(hidden, vec, target));
  out.push_back(row_config(hidden, 1, target));
  return out;
}
std::vector<uint32_t> EmbeddingOp::base_alignment(const KernelSpec& spec, const TileConfig& config) const {
  return vector_variant_alignment(config, tensors(spec).size(), {0});  // ids: one at a time
}

std::string EmbeddingOp::specialize(const KernelSpec& given, const TileConfig& c) const {
  const KernelSpec spec = with_defaults(given);
  return fmt::format("constexpr long long VOCAB = {};\nconstexpr int HIDDEN = {};\n"
                     "constexpr int THREADS = {}, VEC = {}, ITEMS = {};\ntypedef {} id_t;\ntypedef {} in_t;\n"
                     "typedef {} out_t;\n",
                     spec.param("vocab"), spec.param("hidden"), c.at("THREADS"), c.at("VEC"), c.at("ITEMS"),
                     spec.param("ids_dtype") ? "long long" : "int", device_type_name(spec.dtype),
                     device_type_name(spec.out_dtype));
}

Plan EmbeddingOp::plan(const KernelSpec& call, const TileConfig& c) const {
  Plan p;
  if (call.param("tokens") == 0) return p;
  LaunchGeometry g;
  g.grid.x = static_cast<uint32_t>(call.param("tokens"));
  g.grid.y = static_cast<uint32_t>(ceil_div(ceil_div(call.param("hidden"), c.at("VEC")), c.at("THREADS") * c.at("ITEMS")));
  g.block.x = static_cast<uint32_t>(c.at("THREADS"));
  p.launches.push_back(single_launch(call, c, g));
  return p;
}

// Token ids as a training batch has them: a quarter from a few frequent ids (repeated ids),
// the rest uniform over the vocabulary (most ids never seen when vocab > tokens), and every 61st
// token (from the 31st) out of range, alternately -1 and vocab (a row of zeros).
static void embedding_ids(int64_t vocab, std::vector<float>& ids, std::mt19937_64& rng) {
  std::uniform_int_distribution<int64_t> any(0, vocab - 1), hot(0, std::min<int64_t>(vocab, 8) - 1);
  std::uniform_int_distribution<int> quarter(0, 3);
  for (size_t t = 0; t < ids.size(); ++t) {
    int64_t id = quarter(rng) == 0 ? hot(rng) : any(rng);
    if (t % 61 == 30) id = (t / 61) % 2 ? vocab : -1;
    ids[t] = static_cast<float>(id);
  }
}

void EmbeddingOp::init_inputs(const KernelSpec& spec, std::span<const TensorInfo> inputs,
                              std::vector<std::vector<float>>& values, std::mt19937_64& rng) const {
  OpTemplate::init_inputs(spec, inputs, values, rng);
  embedding_ids(spec.param("vocab"), values[0], rng);
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
    out.push_back({{"embedding", t, t, {{"tokens", tokens}, {"vocab", vocab}, {"hidden", hidden}, {"ids_dtype", ids}}},
                   why});
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
