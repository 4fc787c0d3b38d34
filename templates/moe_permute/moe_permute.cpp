#include "templates/moe_permute/moe_permute.h"

#include <fmt/format.h>

#include <cmath>

#include "support/embedded.h"
#include "templates/lib/elementwise_row.h"
#include "templates/lib/moe.h"

namespace kiln {
namespace {
const ParamInfo kParams[] = {
    {"tokens", "rows of x; a runtime argument, not baked; 0 writes offsets = 0", false, false, 0, (int64_t{1} << 31) - 1},
    {"hidden", "columns of x and x_sorted", true, false, 1, int64_t{1} << 20},
    {"experts", "experts of this rank (ids outside [0, experts) are dropped)", true, false, 1, moe::kMaxPermuteExperts},
    {"k", "slots (experts) per token", true, false, 1, moe::kMaxK},
    {"scales", "x is fp8 with fp32 scales of 1x128 blocks [tokens, hidden / 128], permuted along", true, true, 0, 1,
     {}, 0},
};
const DType kDTypes[] = {DType::bf16,     DType::f16,      DType::f32,          DType::e4m3,
                         DType::e5m2,     DType::e4m3fnuz, DType::e5m2fnuz};
constexpr int64_t kAux = 256;          // threads of the rank and scan launches
constexpr int64_t kChunk = 4 * kAux;   // slots per rank block

std::vector<int64_t> offsets(const KernelSpec& s) { return {s.param("experts") + 1}; }
std::vector<int64_t> tokens_blocks(const KernelSpec& s) { return {s.param("tokens"), s.param("hidden") / 128}; }
std::vector<int64_t> slots_blocks(const KernelSpec& s) { return {s.param("tokens") * s.param("k"), s.param("hidden") / 128}; }
bool scales(const KernelSpec& s) { return s.param("scales") != 0; }
const TensorDecl kSignature[] = {
    {"x", Role::input, DTypeRule::in, DType::f32, "[tokens, hidden]", moe::tokens_hidden},
    {"x_scales", Role::input, DTypeRule::fixed, DType::f32, "[tokens, hidden / 128]", tokens_blocks, scales,
     "fp32 scales of x's 1x128 blocks (with scales)"},
    {"topk_ids", Role::input, DTypeRule::fixed, DType::i32, "[tokens, k]", moe::tokens_k, nullptr, "expert of each slot"},
    {"x_sorted", Role::output, DTypeRule::in, DType::f32, "[tokens * k, hidden]", moe::slots_hidden, nullptr,
     "rows grouped by expert; rows past offsets[experts] unwritten"},
    {"x_sorted_scales", Role::output, DTypeRule::fixed, DType::f32, "[tokens * k, hidden / 128]", slots_blocks, scales,
     "x_scales' rows in x_sorted's order (with scales)"},
    {"row_map", Role::output, DTypeRule::fixed, DType::i32, "[tokens, k]", moe::tokens_k, nullptr,
     "row of x_sorted of each slot; -1: dropped"},
    {"offsets", Role::output, DTypeRule::fixed, DType::i32, "[experts + 1]", offsets, nullptr,
     "first row of each expert; offsets[experts] = rows written"},
};

struct Workspace {
  int64_t blocks, counts, rank, bytes;
};
Workspace workspace(int64_t slots, int64_t experts) {
  Workspace w;
  w.blocks = ceil_div(slots, kChunk);
  w.counts = 0;
  w.rank = round_up(w.blocks * experts * 4, 256);
  w.bytes = std::max<int64_t>(w.rank + slots * 4, 4);
  return w;
}
}  // namespace

std::span<const ParamInfo> MoePermuteOp::params() const { return kParams; }
std::span<const DType> MoePermuteOp::dtypes() const { return kDTypes; }
std::span<const TensorDecl> MoePermuteOp::signature() const { return kSignature; }
std::string_view MoePermuteOp::device_template(const KernelConfig&) const {
  return embedded_file("templates/moe_permute/moe_permute.kernel");
}

std::vector<KernelConfig> MoePermuteOp::variants(const KernelSpec& spec, const TargetInfo& target) const {
  return elementwise_row_variants(spec.param("hidden"), spec.dtype, target);
}
Result<void> MoePermuteOp::validate_rules(const KernelSpec& given, const TargetInfo&) const {
  const KernelSpec spec = with_defaults(given);
  KILN_TRY(moe::check_slots(name(), spec));
  if (spec.param("scales") && !is_fp8(spec.dtype))
    return make_error(Errc::invalid_argument,
                      fmt::format("moe_permute: scales = true carries the block scales of an fp8 x; dtype is {}: "
                                  "give an fp8 dtype or scales = false",
                                  dtype_name(spec.dtype)));
  if (spec.param("scales") && spec.param("hidden") % 128 != 0)
    return make_error(Errc::invalid_argument,
                      fmt::format("moe_permute: scales = true needs whole 1x128 blocks, but hidden = {} is not a multiple "
                                  "of 128",
                                  spec.param("hidden")));
  return ok();
}

std::vector<uint32_t> MoePermuteOp::base_alignment(const KernelSpec& spec, const KernelConfig& config) const {
  // Only x and x_sorted take vector accesses; ids, scales, row_map and offsets one element at a time.
  std::vector<uint32_t> a(tensors(spec).size(), 1);
  const uint32_t v = config.at("VEC") > 1 ? 16 : 1;
  const bool s = with_defaults(spec).param("scales") != 0;
  a[0] = v;
  a[s ? 3 : 2] = v;
  return a;
}

std::string MoePermuteOp::specialize(const KernelSpec& spec, const KernelConfig& c) const {
  const KernelSpec full = with_defaults(spec);
  return fmt::format("constexpr int EXPERTS = {}, K = {}, HIDDEN = {};\n"
                     "constexpr int THREADS = {}, VEC = {}, ITEMS = {}, AUX = {}, CHUNK = {};\n#define SCALES {}\n"
                     "constexpr int SCALE_COLS = {};\ntypedef {} in_t;\n",
                     spec.param("experts"), spec.param("k"), spec.param("hidden"), c.at("THREADS"), c.at("VEC"),
                     c.at("ITEMS"), kAux, kChunk, full.param("scales"), spec.param("hidden") / 128,
                     device_type_name(spec.dtype));
}

Plan MoePermuteOp::plan(const KernelSpec& call, const KernelConfig& c) const {
  Plan p;
  const int64_t T = call.param("tokens"), K = call.param("k"), E = call.param("experts"), H = call.param("hidden");
  const bool scaled = with_defaults(call).param("scales") != 0;
  const Workspace w = workspace(T * K, E);
  p.workspace_bytes = static_cast<uint64_t>(w.bytes);
  using A = KernelArg;
  auto launch = [&](const char* kernel, LaunchGeometry g, std::vector<KernelArg> args) {
    p.launches.push_back({kernel, g, std::move(args)});
  };
  LaunchGeometry aux;
  aux.block.x = static_cast<uint32_t>(kAux);
  // Tensors: x 0, [x_scales], topk_ids, x_sorted, [x_sorted_scales], row_map, offsets.
  const uint32_t ids = scaled ? 2 : 1, sorted = ids + 1, map = scaled ? 5 : 3, offs = map + 1;
  if (T > 0) {
    LaunchGeometry g = aux;
    g.grid.x = static_cast<uint32_t>(w.blocks);
    launch("kiln_moe_permute_rank", g, {A::tensor(ids), A::workspace(w.counts), A::workspace(w.rank), A::i32(T * K)});
  }
  launch("kiln_moe_permute_scan", aux, {A::workspace(w.counts), A::tensor(offs), A::i32(w.blocks)});
  if (T > 0) {
    std::vector<KernelArg> args = {A::tensor(0)};
    if (scaled) args.push_back(A::tensor(1));
    for (A a : {A::tensor(ids), A::workspace(w.counts), A::workspace(w.rank), A::tensor(sorted)}) args.push_back(a);
    if (scaled) args.push_back(A::tensor(4));
    args.push_back(A::tensor(map));
    launch("kiln_moe_permute_rows", elementwise_row_geometry(T, H, c), std::move(args));
  }
  return p;
}

// Expert ids as a router gives them, and more: a quarter of the slots on expert 0 (long runs of
// one expert, which the stable order must keep in slot order; a token may name an expert twice),
// the rest uniform, and every 13th slot (from the 6th) dropped, alternately -1 and `experts`.
void MoePermuteOp::init_inputs(const KernelSpec& spec, std::span<const TensorInfo> inputs,
                               std::vector<std::vector<float>>& values, std::mt19937_64& rng) const {
  OpTemplate::init_inputs(spec, inputs, values, rng);
  const int64_t E = spec.param("experts");
  const size_t ids = inputs.size() - 1;  // topk_ids: the last input
  std::uniform_int_distribution<int64_t> any(0, E - 1);
  std::uniform_int_distribution<int> quarter(0, 3);
  for (size_t f = 0; f < values[ids].size(); ++f) {
    int64_t id = quarter(rng) == 0 ? 0 : any(rng);
    if (f % 13 == 5) id = (f / 13) % 2 ? E : -1;
    values[ids][f] = static_cast<float>(id);
  }
}

void MoePermuteOp::reference(const KernelSpec& given, const Scalars&, std::span<const std::vector<float>> in,
                             std::span<const int64_t> sample, std::vector<RefOutput>& outputs) const {
  const KernelSpec spec = with_defaults(given);
  const int64_t T = spec.param("tokens"), K = spec.param("k"), E = spec.param("experts"), H = spec.param("hidden");
  const bool scaled = spec.param("scales") != 0;
  const int64_t S = H / 128;
  const std::vector<float>& ids = in[scaled ? 2 : 1];
  outputs.assign(scaled ? 4 : 3, {});
  std::vector<double>& xs = outputs[0].values;
  std::vector<double>& map = outputs[scaled ? 2 : 1].values;
  std::vector<double>& off = outputs[scaled ? 3 : 2].values;
  // x_sorted: every row, or the sampled ones (`at` maps a row to its place in the values).
  outputs[0].rows.assign(sample.begin(), sample.end());
  std::vector<int64_t> at(static_cast<size_t>(T * K), sample.empty() ? 0 : -1);
  if (sample.empty())
    for (int64_t r = 0; r < T * K; ++r) at[static_cast<size_t>(r)] = r;
  for (size_t i = 0; i < sample.size(); ++i) at[static_cast<size_t>(sample[i])] = static_cast<int64_t>(i);
  const int64_t kept = sample.empty() ? T * K : static_cast<int64_t>(sample.size());
  xs.assign(static_cast<size_t>(kept * H), NAN);  // rows past offsets[experts]: not written
  if (scaled) outputs[1].values.assign(static_cast<size_t>(T * K * S), NAN);
  map.assign(static_cast<size_t>(T * K), -1.0);
  off.assign(static_cast<size_t>(E + 1), 0.0);
  std::vector<int64_t> next(static_cast<size_t>(E + 1), 0);
  for (float id : ids)
    if (id >= 0 && id < E) ++next[static_cast<size_t>(id) + 1];
  for (int64_t e = 0; e < E; ++e) next[e + 1] += next[e];
  for (int64_t e = 0; e <= E; ++e) off[e] = static_cast<double>(next[e]);
  for (int64_t f = 0; f < T * K; ++f) {  // slots in (token, slot) order: stable within an expert
    const float id = ids[static_cast<size_t>(f)];
    if (!(id >= 0 && id < E)) continue;
    const int64_t row = next[static_cast<size_t>(id)]++;
    map[static_cast<size_t>(f)] = static_cast<double>(row);
    for (int64_t c = 0; at[static_cast<size_t>(row)] >= 0 && c < H; ++c)
      xs[static_cast<size_t>(at[static_cast<size_t>(row)] * H + c)] = in[0][static_cast<size_t>(f / K * H + c)];
    for (int64_t c = 0; scaled && c < S; ++c)
      outputs[1].values[static_cast<size_t>(row * S + c)] = in[1][static_cast<size_t>(f / K * S + c)];
  }
}

std::vector<TestSpec> MoePermuteOp::test_specs(const TargetInfo& target) const {
  std::vector<TestSpec> out;
  auto add = [&](DType t, int64_t tokens, int64_t hidden, int64_t experts, int64_t k, std::string_view why,
                 int64_t scales = 0) {
    out.push_back({{"moe_permute", t, t,
                    {{"tokens", tokens}, {"hidden", hidden}, {"experts", experts}, {"k", k}, {"scales", scales}}},
                   why});
  };
  add(DType::bf16, 37, 64, 8, 2, "Mixtral's routing (8 experts, top-2), hidden 64");
  add(DType::f16, 300, 8, 5, 4, "1200 slots: two rank blocks of 4 rounds and a partial one");
  add(DType::f32, 5, 7, 3, 3, "hidden 7 (scalar accesses), fp32");
  add(DType::bf16, 20, 16, 300, 4, "300 experts: two scan tiles");
  add(DType::f32, 2200, 1, 5, 4, "8800 slots: 9 rank blocks, the scan's batch of 8 blocks and a remainder");
  add(DType::bf16, 6, 2048, 64, 6, "DeepSeek-V2-Lite: hidden 2048, 64 experts, top-6");
  add(DType::bf16, 9, 7168, 256, 8, "DeepSeek-V3: hidden 7168, 256 experts, top-8");
  add(DType::bf16, 0, 64, 8, 2, "0 tokens: offsets = 0");
  // fp8 rows with their 1x128 block scales (DeepSeek-V3's recipe), in the target's encoding.
  add(fp8_for_target(DType::e4m3, target), 13, 256, 16, 4, "fp8 e4m3 with 1x128 block scales", 1);
  add(fp8_for_target(DType::e5m2, target), 5, 48, 4, 2, "fp8 e5m2, hidden 48 (16-byte vectors of 16)");
  return out;
}

}  // namespace kiln
