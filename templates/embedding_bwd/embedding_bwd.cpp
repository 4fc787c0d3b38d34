#include "templates/embedding_bwd/embedding_bwd.h"

#include <fmt/format.h>

#include "support/embedded.h"
#include "templates/lib/embedding_params.h"

namespace kiln {
namespace {
namespace ep = embedding_params;
// dW's dtype: fp32 (the default: an fp32 master weight's gradient), or dy's (PyTorch's: the
// gradient has W's dtype, which dy shares; half the bytes of the fill, the op's main cost).
const std::string_view kDwTypes[] = {"fp32", "dy"};
enum DwDType : int64_t { kDwF32 = 0, kDwDy = 1 };
DType dw_dtype(const KernelSpec& s) { return s.param("dw_dtype") == kDwDy ? s.dtype : DType::f32; }
const ParamInfo kParams[] = {
    {"tokens", "tokens (ids); a runtime argument, not baked; 0 writes dW = 0", false, false, 0, ep::kInt32Max},
    {"vocab", "rows of dW", true, false, 1, ep::kInt32Max - 1},
    {"hidden", "columns of dy and dW", true, false, 1, int64_t{1} << 20},
    ep::ids_dtype_param(),
    {"dw_dtype", "dtype of dW: fp32 (default) or dy (dy's dtype, as PyTorch's gradient); sums are fp32 either way",
     true, false, 0, 1, kDwTypes, kDwF32, /*unkeyed_default=*/true},
};
const TensorDecl kSignature[] = {
    ep::ids_decl(ep::kIds32),
    ep::ids_decl(ep::kIds64),
    {"dy", Role::input, DTypeRule::in, DType::f32, "[tokens, hidden]", ep::tokens_hidden, nullptr, "gradient of y"},
    {"dW", Role::output, DTypeRule::derived, DType::f32, "[vocab, hidden]", ep::vocab_hidden, nullptr, {}, {}, nullptr,
     dw_dtype, "fp32, or dy's dtype with dw_dtype = dy"},
};
// Threads of the counting-sort launches (rank, fill, scan, offset, scatter); a power of two.
// (H100, 2026-11-26, 8192 tokens: a rank walk of one block took 133 us with 256 threads and 392 us
// with 1024: each chunk's compare loop grows with the block.)
constexpr int64_t kAux = 256;
// Ids per rank block at most: their counts, 32 KiB of LDS beside the chunk's ids.
constexpr int64_t kRankRange = 8192;
// Chunks of ids each rank thread loads ahead of its walk.
constexpr int64_t kRankAhead = 8;
int64_t rank_blocks(int64_t vocab) { return ceil_div(vocab, kRankRange); }
int64_t rank_range(int64_t vocab) { return ceil_div(vocab, rank_blocks(vocab)); }

// The workspace: int32 count [vocab], start [vocab + 1], rank [tokens], sorted [tokens],
// tiles [ceil(vocab / kAux)], head [tokens] of int32 pairs, each at a 256-byte boundary.
struct Workspace {
  int64_t count, start, rank, sorted, tiles, head, bytes;
};
Workspace workspace(int64_t vocab, int64_t tokens) {
  Workspace w;
  w.count = 0;
  w.start = round_up(vocab * 4, 256);
  w.rank = w.start + round_up((vocab + 1) * 4, 256);
  w.sorted = w.rank + round_up(tokens * 4, 256);
  w.tiles = w.sorted + round_up(tokens * 4, 256);
  w.head = w.tiles + round_up(ceil_div(vocab, kAux) * 4, 256);
  w.bytes = w.head + tokens * 8;
  return w;
}
// The fill stores 16 bytes at a time where dW's base is 16-byte aligned (the vector variants ask
// for VEC elements of dW, at least 16 bytes) and its rows whole 16-byte vectors.
int64_t fill_vec(const KernelSpec& s) { return 16 / static_cast<int64_t>(dtype_size(dw_dtype(s))); }
bool fill16(const KernelSpec& s, const KernelConfig& c) {
  return c.at("VEC") >= fill_vec(s) && s.param("hidden") % fill_vec(s) == 0;
}
}  // namespace

std::span<const ParamInfo> EmbeddingBwdOp::params() const { return kParams; }
std::span<const DType> EmbeddingBwdOp::dtypes() const { return ep::kDTypes; }
std::span<const TensorDecl> EmbeddingBwdOp::signature() const { return kSignature; }
std::string_view EmbeddingBwdOp::device_template(const KernelConfig&) const {
  return embedded_file("templates/embedding_bwd/embedding_bwd.kernel");
}

// The sum launch's configuration: a block per (seen id, column chunk), as embedding's row gather.
// (H100, 2026-11-26, when the sum ran over every id: blocks of 8 or 32 ids took 1.88 / 1.91 ms
// against 1.56 for one.)
std::vector<KernelConfig> EmbeddingBwdOp::variants(const KernelSpec& spec, const TargetInfo& target) const {
  return ep::variants(spec, target);
}
std::vector<uint32_t> EmbeddingBwdOp::base_alignment(const KernelSpec& spec, const KernelConfig& config) const {
  std::vector<uint32_t> a = vector_variant_alignment(config, tensors(spec).size(), {0});  // ids: one at a time
  if (config.at("VEC") > 1)  // dW: VEC elements per access
    a[2] = static_cast<uint32_t>(static_cast<int64_t>(dtype_size(dw_dtype(with_defaults(spec)))) * config.at("VEC"));
  return a;
}

std::string EmbeddingBwdOp::specialize(const KernelSpec& given, const KernelConfig& c) const {
  const KernelSpec spec = with_defaults(given);
  return fmt::format("constexpr long long VOCAB = {};\nconstexpr int HIDDEN = {};\n"
                     "constexpr int THREADS = {}, VEC = {}, ITEMS = {}, AUX = {};\nconstexpr bool FILL = {};\n"
                     "constexpr int RANGE = {}, RANK_AHEAD = {};\n"
                     "typedef {} id_t;\ntypedef {} in_t;\ntypedef {} dw_t;\n",
                     spec.param("vocab"), spec.param("hidden"), c.at("THREADS"), c.at("VEC"), c.at("ITEMS"), kAux,
                     fill16(spec, c) ? "true" : "false", rank_range(spec.param("vocab")), kRankAhead,
                     spec.param("ids_dtype") ? "long long" : "int",
                     device_type_name(spec.dtype), device_type_name(dw_dtype(spec)));
}

Plan EmbeddingBwdOp::plan(const KernelSpec& call, const KernelConfig& c) const {
  Plan p;
  const int64_t V = call.param("vocab"), H = call.param("hidden"), T = call.param("tokens");
  const Workspace w = workspace(V, T);
  p.workspace_bytes = static_cast<uint64_t>(w.bytes);
  auto launch = [&](const char* kernel, int64_t grid_x, int64_t grid_y, int64_t block, std::vector<KernelArg> args) {
    Launch l;
    l.kernel = kernel;
    l.geometry.grid.x = static_cast<uint32_t>(grid_x);
    l.geometry.grid.y = static_cast<uint32_t>(grid_y);
    l.geometry.block.x = static_cast<uint32_t>(block);
    l.args = std::move(args);
    // Each launch after the first waits for its predecessor with kiln::wait_prior_grid, so it may
    // launch while that one ends (programmatic dependent launch, sm_90a; ignored on AMD).
    l.geometry.programmatic_dependent_launch = !p.launches.empty();
    p.launches.push_back(std::move(l));
  };
  using A = KernelArg;
  const int64_t tiles = ceil_div(V, kAux);
  // Tensors: ids 0, dy 1, dW 2.
  // A rank block per range of ids, then the fill beside it, 4 vectors of dW per thread.
  const int64_t fill_vectors = ceil_div(V * H, fill16(call, c) ? fill_vec(call) : 1);
  launch("kiln_embedding_bwd_rank", rank_blocks(V), 1, kAux,
         {A::tensor(0), A::workspace(w.count), A::workspace(w.rank), A::i32(T)});
  launch("kiln_embedding_bwd_fill", ceil_div(fill_vectors, 4 * kAux), 1, kAux, {A::tensor(2)});
  launch("kiln_embedding_bwd_scan", tiles, 1, kAux, {A::workspace(w.count), A::workspace(w.start), A::workspace(w.tiles)});
  launch("kiln_embedding_bwd_offset", tiles, 1, kAux, {A::workspace(w.start), A::workspace(w.tiles)});
  if (T > 0)
    launch("kiln_embedding_bwd_scatter", ceil_div(T, kAux), 1, kAux,
           {A::tensor(0), A::workspace(w.start), A::workspace(w.rank), A::workspace(w.count), A::workspace(w.sorted),
            A::workspace(w.head), A::i32(T)});
  if (T > 0)  // a block per position of the sorted tokens (and column chunk); the first of each id sums it
    launch("kiln_embedding_bwd_sum", T, ceil_div(ceil_div(H, c.at("VEC")), c.at("THREADS") * c.at("ITEMS")),
           c.at("THREADS"), {A::tensor(1), A::workspace(w.start), A::workspace(w.head), A::workspace(w.sorted), A::tensor(2)});
  return p;
}

void EmbeddingBwdOp::init_inputs(const KernelSpec& spec, std::span<const TensorInfo> inputs,
                                 std::vector<std::vector<float>>& values, std::mt19937_64& rng) const {
  OpTemplate::init_inputs(spec, inputs, values, rng);
  ep::init_ids(spec.param("vocab"), values[0], rng);
}

void EmbeddingBwdOp::reference(const KernelSpec& spec, const Scalars&, std::span<const std::vector<float>> in,
                               std::span<const int64_t> sample, std::vector<RefOutput>& outputs) const {
  const int64_t n = spec.param("tokens"), V = spec.param("vocab"), H = spec.param("hidden");
  outputs.assign(1, {});
  RefOutput& dw = outputs[0];
  dw.rows.assign(sample.begin(), sample.end());
  if (dw.rows.empty())
    for (int64_t v = 0; v < V; ++v) dw.rows.push_back(v);
  std::vector<int64_t> slot(static_cast<size_t>(V), -1);  // id -> place in dw.rows
  for (size_t i = 0; i < dw.rows.size(); ++i) slot[static_cast<size_t>(dw.rows[i])] = static_cast<int64_t>(i);
  dw.values.assign(dw.rows.size() * static_cast<size_t>(H), 0.0);
  for (int64_t t = 0; t < n; ++t) {
    const int64_t id = static_cast<int64_t>(in[0][static_cast<size_t>(t)]);
    if (id < 0 || id >= V || slot[static_cast<size_t>(id)] < 0) continue;
    double* row = &dw.values[static_cast<size_t>(slot[static_cast<size_t>(id)] * H)];
    for (int64_t c = 0; c < H; ++c) row[c] += in[1][static_cast<size_t>(t * H + c)];
  }
}

std::vector<TestSpec> EmbeddingBwdOp::test_specs(const TargetInfo&) const {
  std::vector<TestSpec> out;
  auto add = [&](DType t, int64_t tokens, int64_t vocab, int64_t hidden, int64_t ids, std::string_view why) {
    out.push_back(ep::test_spec(name(), t, tokens, vocab, hidden, ids, why));
  };
  add(DType::bf16, 300, 40, 64, 1, "int64 ids, many repeats (four at a time and a tail), out of range; two rank chunks");
  add(DType::bf16, 600, 50, 16, 0, "three rank chunks of 256 tokens");
  add(DType::f16, 70, 300, 7, 0, "int32 ids, hidden 7 (scalar), ids never seen; two scan tiles");
  add(DType::f32, 33, 100, 100, 1, "fp32, hidden 100 (vector of 4)");
  add(DType::bf16, 5, 9, 1, 0, "hidden 1");
  add(DType::bf16, 0, 10, 64, 1, "0 tokens: dW = 0");
  add(DType::bf16, 6, 12, 4096, 1, "Llama hidden 4096");
  // dW in dy's dtype: 16-byte fills of 8 (bf16) elements, the scalar fill where hidden is not a multiple.
  out.push_back(ep::test_spec(name(), DType::bf16, 300, 520, 64, 1, "dW in bf16 (dw_dtype = dy), 16-byte fills of 8, three scan tiles"));
  out.back().spec.params["dw_dtype"] = kDwDy;
  out.push_back(ep::test_spec(name(), DType::f16, 70, 300, 12, 0, "dW in fp16, hidden 12 (element accesses and fill)"));
  out.back().spec.params["dw_dtype"] = kDwDy;
  out.push_back(ep::test_spec(name(), DType::bf16, 600, 20000, 8, 1,
                              "three rank blocks of 6667 ids (vocab 20000), their wavefronts' ranges, 600 tokens"));
  return out;
}

}  // namespace kiln
