#include "templates/cross_entropy/cross_entropy.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <tuple>

#include "support/embedded.h"
#include "templates/lib/cross_entropy_params.h"

namespace kiln {
namespace {
namespace cp = cross_entropy_params;
constexpr std::string_view kSplitChoices[] = {"auto", "never", "always"};
const ParamInfo kParams[] = {
    cp::tokens_param(),
    cp::vocab_param(),
    cp::target_dtype_param(),
    cp::ignore_index_param("target value of tokens left out of the loss (loss 0)"),
    cp::smoothing_param(),
    cp::z_loss_param("add z_loss_weight * lse^2 (PaLM's z-loss)"),
    {"split_rows", "several blocks per row and a second launch: auto (below 2 blocks per SM/CU), never, always",
     true, false, 0, 2, kSplitChoices, 0},
    {"grad_inplace",
     "also write dlogits = dloss * d loss / d logits over the logits in the same launch (Liger-Kernel's fused form); "
     "takes dloss",
     true, true, 0, 1, {}, 0},
};
bool with_grad(const KernelSpec& s) { return s.param("grad_inplace") != 0; }
constexpr uint32_t kFinishThreads = 64;  // FINISH_THREADS of the template

const TensorDecl kSignature[] = {
    {"logits", Role::input, DTypeRule::in, DType::f32, "[tokens, vocab]", cp::tokens_vocab},
    cp::targets_decl(cp::kTargets64),
    cp::targets_decl(cp::kTargets32),
    {"dloss", Role::input, DTypeRule::fixed, DType::f32, "[tokens]", cp::tokens, with_grad,
     "upstream gradient per token (grad_inplace; 1 / count(targets != ignore_index) for a mean loss)"},
    {"loss", Role::output, DTypeRule::fixed, DType::f32, "[tokens]", cp::tokens, nullptr,
     "per-token loss; 0 where ignored"},
    {"lse", Role::output, DTypeRule::fixed, DType::f32, "[tokens]", cp::tokens, nullptr, "log-sum-exp of each row"},
    {"dlogits", Role::output, DTypeRule::in, DType::f32, "[tokens, vocab]", cp::tokens_vocab, with_grad,
     "grad_inplace: the gradient, written over the logits", "logits"},
};

// A configuration of `threads` threads with `unroll` loads in flight each, and its split form:
// SPLIT blocks per row (each at least one access per thread, at most 16), used for calls of
// fewer than SPLIT_BELOW tokens (2 blocks per SM/CU) under split_rows=auto.
KernelConfig config_of(int64_t nvec, int64_t vec, int64_t threads, int64_t unroll, const TargetInfo& target) {
  const int64_t split = std::clamp<int64_t>(nvec / threads, 1, 16);
  return {{"THREADS", threads}, {"VEC", vec}, {"UNROLL", unroll}, {"SPLIT", split},
          {"SPLIT_BELOW", split > 1 ? 2 * target.compute_units : 0}};
}

// Threads per block and loads in flight per thread for rows of `nvec` accesses: up to 512
// threads with 4 independent 16-byte loads each (32 KiB of a row in flight per block, several
// blocks per SM/CU), fewer for short rows.
KernelConfig row_config(int64_t vocab, int64_t vec, const TargetInfo& target) {
  const int64_t nvec = ceil_div(vocab, vec);
  const int64_t threads = std::clamp<int64_t>(round_up(ceil_div(nvec, 4), target.wave_size), target.wave_size, 512);
  const int64_t unroll = std::clamp<int64_t>(ceil_div(nvec, threads), 1, 4);
  return config_of(nvec, vec, threads, unroll, target);
}

// The fused form (grad_inplace): `blocks_per_cu` blocks per SM/CU, each looping over rows, of
// `threads` threads with `unroll` loads in flight each (kiln_cross_entropy_grad). BLOCKS is the
// grid (the plan has no target); SPLIT 1, no split form.
KernelConfig grad_config(int64_t vec, int64_t threads, int64_t unroll, int64_t blocks_per_cu, const TargetInfo& target) {
  return {{"GRAD", 1}, {"THREADS", threads}, {"VEC", vec}, {"UNROLL", unroll}, {"SPLIT", 1}, {"SPLIT_BELOW", 0},
          {"BLOCKS", blocks_per_cu * target.compute_units}};
}
// One block per SM/CU, so that the rows in flight (one per SM/CU) stay in the L2 cache between
// the two passes: on NVIDIA up to 1024 threads with 2 loads in flight each (NVRTC: 57 registers,
// no spills; measured on the H100), on AMD up to 512 with 4 (a 1024-thread workgroup leaves 128
// VGPRs a lane, and the kernel spilled 492 bytes of scratch there).
KernelConfig grad_row_config(int64_t vocab, int64_t vec, const TargetInfo& target) {
  const int64_t nvec = ceil_div(vocab, vec);
  const bool nvidia = target.vendor == Vendor::nvidia;
  const int64_t max_threads = std::min<int64_t>(nvidia ? 1024 : 512, target.max_threads_per_block);
  const int64_t per_thread = nvidia ? 2 : 4;
  const int64_t threads =
      std::clamp<int64_t>(round_up(ceil_div(nvec, per_thread), target.wave_size), target.wave_size, max_threads);
  const int64_t unroll = std::clamp<int64_t>(ceil_div(nvec, threads), 1, per_thread);
  return grad_config(vec, threads, unroll, 1, target);
}

// grad_inplace with the row on chip (kiln_cross_entropy_grad_cluster, sm_90a): ROW_CLUSTER blocks
// of a thread-block cluster share a row, each holding its part in shared memory, when a row is
// longer than 96 KiB and fits 8 blocks of at most 192 KiB; VEC-wide rows only (bulk copies of
// 16-byte multiples). One block per SM, BLOCKS a multiple of the cluster.
constexpr int64_t kRowPieces = 8;  // PIECES of the template
int64_t row_cluster(const KernelSpec& spec, const TargetInfo& target) {
  const int64_t elt = static_cast<int64_t>(dtype_size(spec.dtype)), bytes = spec.param("vocab") * elt;
  if (target.vendor != Vendor::nvidia || target.cpu != "sm_90a" || bytes % 16 != 0 || bytes <= 96 * 1024) return 0;
  const int64_t c = ceil_div(bytes, 192 * 1024);
  return c <= 8 ? c : 0;
}
// `per_sm` blocks of `threads` per SM (the parts of several rows in flight on one SM).
KernelConfig cluster_config(int64_t clusters, int64_t vec, int64_t threads, int64_t per_sm, const TargetInfo& target) {
  return {{"GRAD", 1},  {"ROW_CLUSTER", clusters}, {"THREADS", threads},
          {"VEC", vec}, {"UNROLL", 1},             {"SPLIT", 1},
          {"SPLIT_BELOW", 0}, {"BLOCKS", per_sm * target.compute_units / clusters * clusters}};
}
// Shared memory of the cluster form: the part (16-byte accesses), its mbarriers, the normalizers
// [2][ROW_CLUSTER][3] fp32.
int64_t cluster_shared_bytes(const KernelSpec& spec, const KernelConfig& c) {
  const int64_t nvec = ceil_div(spec.param("vocab") * static_cast<int64_t>(dtype_size(spec.dtype)), 16);
  const int64_t rc = c.at("ROW_CLUSTER");
  return 16 * ceil_div(nvec, rc) + 8 * kRowPieces + 4 * 6 * rc + 16;
}

// Workspace of the split form: one normalizer (m, s, sum_x) per token and block.
uint64_t split_workspace(int64_t tokens, const KernelConfig& c) {
  return static_cast<uint64_t>(tokens) * static_cast<uint64_t>(c.at("SPLIT")) * 3 * sizeof(float);
}
}  // namespace

std::span<const ParamInfo> CrossEntropyOp::params() const { return kParams; }
std::span<const ScalarInfo> CrossEntropyOp::scalars() const { return cp::kScalars; }
std::span<const DType> CrossEntropyOp::dtypes() const { return cp::kDTypes; }
std::span<const TensorDecl> CrossEntropyOp::signature() const { return kSignature; }
std::string_view CrossEntropyOp::device_template(const KernelConfig& c) const {
  // The row-on-chip form (sm_90a) adds its kernel after the portable ones, whose pieces it uses.
  static const std::string sm90 = std::string(embedded_file("templates/cross_entropy/cross_entropy.kernel")) + "\n" +
                                  std::string(embedded_file("templates/cross_entropy/cross_entropy_sm90.kernel"));
  if (c.count("ROW_CLUSTER")) return sm90;
  return embedded_file("templates/cross_entropy/cross_entropy.kernel");
}

std::vector<KernelConfig> CrossEntropyOp::variants(const KernelSpec& spec, const TargetInfo& target) const {
  if (with_grad(with_defaults(spec))) {
    std::vector<KernelConfig> out =
        cp::vector_then_scalar(spec, [&](int64_t vocab, int64_t vec) { return grad_row_config(vocab, vec, target); });
    // The row on chip first; it needs 16-byte aligned logits, as the vector variant.
    if (const int64_t rc = row_cluster(spec, target))
      out.insert(out.begin(), cluster_config(rc, out.front().at("VEC"), 512, 1, target));
    return out;
  }
  return cp::vector_then_scalar(spec, [&](int64_t vocab, int64_t vec) { return row_config(vocab, vec, target); });
}
Result<void> CrossEntropyOp::validate_rules(const KernelSpec& spec, const TargetInfo&) const {
  const KernelSpec s = with_defaults(spec);
  if (with_grad(s) && s.param("split_rows") == 2)
    return make_error(Errc::invalid_argument,
                      "cross_entropy: grad_inplace runs one block per row (the gradient needs the row's lse first): "
                      "split_rows must be auto or never, not always");
  return ok();
}
std::string_view CrossEntropyOp::kernel_name(const KernelConfig& c) const {
  if (c.count("ROW_CLUSTER")) return "kiln_cross_entropy_grad_cluster";
  return c.count("GRAD") ? "kiln_cross_entropy_grad" : "kiln_cross_entropy";
}
uint32_t CrossEntropyOp::dynamic_shared_bytes(const KernelSpec& spec, const KernelConfig& c) const {
  return c.count("ROW_CLUSTER") ? static_cast<uint32_t>(cluster_shared_bytes(with_defaults(spec), c)) : 0;
}
std::vector<KernelConfig> CrossEntropyOp::tuning_candidates(const KernelSpec& spec, const TargetInfo& target) const {
  // The heuristic's, then 256 / 512 threads with 2 / 4 / 8 loads in flight each and 1024 threads
  // with 2, where a row holds at least one whole chunk of them (`kiln run --bench` times them on
  // the GPU). 1024 threads with 4 or 8 loads exceed the register file (64 registers a thread on
  // sm_90a, 128 VGPRs on gfx950): with 8, 488 bytes of spills on sm_90a and 56 of scratch on
  // gfx950 with smoothing.
  std::vector<KernelConfig> out = {choose_config(spec, target)};
  const int64_t vec = out.front().at("VEC"), nvec = ceil_div(spec.param("vocab"), vec);
  if (with_grad(with_defaults(spec))) {
    // The fused form: the row on chip (when the heuristic takes it) or not, 512 threads with 2 or 4
    // loads, 1 or 2 blocks per SM/CU.
    if (out.front().count("ROW_CLUSTER")) {
      // 1024 or 256 threads; smaller parts with several blocks per SM: clusters twice as wide (3
      // blocks of 512 per SM), four times (6 blocks of 256); each fits the SM's 228 KiB of shared
      // memory and its registers (34 a thread with NVRTC). H100, 2026-11-27, [8192, 128256] bf16:
      // 512 threads 1.560 ms, 1024 1.676, 3 x 512 of clusters of 4 2.041, 6 x 256 of 8 1.921.
      const int64_t rc = out.front().at("ROW_CLUSTER");
      const std::tuple<int64_t, int64_t, int64_t> shapes[] = {{rc, 1024, 1}, {rc, 256, 1}, {2 * rc, 512, 3}, {4 * rc, 256, 6}};
      for (const auto& [c, threads, per_sm] : shapes) {
        const KernelConfig k = cluster_config(c, vec, threads, per_sm, target);
        if (c <= 8 && per_sm * (cluster_shared_bytes(with_defaults(spec), k) + 1024) <= 228 * 1024) out.push_back(k);
      }
      out.push_back(grad_row_config(spec.param("vocab"), vec, target));
    }
    for (int64_t unroll : {2, 4})
      for (int64_t per_cu : {1, 2}) {
        KernelConfig c = grad_config(vec, 512, unroll, per_cu, target);
        if (512 * unroll <= nvec && std::find(out.begin(), out.end(), c) == out.end()) out.push_back(std::move(c));
      }
    return out;
  }
  for (int64_t threads : {256, 512, 1024})
    for (int64_t unroll : {2, 4, 8}) {
      KernelConfig c = config_of(nvec, vec, threads, unroll, target);
      if (threads * unroll <= nvec && threads <= target.max_threads_per_block && threads * unroll <= 4096 &&
          std::find(out.begin(), out.end(), c) == out.end())
        out.push_back(std::move(c));
    }
  return out;
}
std::vector<uint32_t> CrossEntropyOp::base_alignment(const KernelSpec& spec, const KernelConfig& config) const {
  // Only the logits are read with vector loads; targets, loss and lse one element at a time.
  std::vector<uint32_t> out(tensors(spec).size(), 1);
  out[0] = config.at("VEC") > 1 ? 16 : 1;
  return out;
}

std::string CrossEntropyOp::specialize(const KernelSpec& spec, const KernelConfig& c) const {
  return fmt::format(
      "constexpr int VOCAB = {};\nconstexpr int THREADS = {}, VEC = {}, UNROLL = {}, SPLIT = {};\n"
      "constexpr long long IGNORE_INDEX = {};\n#define SMOOTHING {}\n#define Z_LOSS {}\n"
      "typedef {} in_t;\ntypedef {} target_t;\n{}",
      spec.param("vocab"), c.at("THREADS"), c.at("VEC"), c.at("UNROLL"), c.at("SPLIT"), cp::ignore_index(spec),
      spec.param("smoothing"), spec.param("z_loss"), device_type_name(spec.dtype),
      device_type_name(spec.param("target_dtype") == 0 ? DType::i64 : DType::i32),
      c.count("ROW_CLUSTER") ? fmt::format("constexpr int ROW_CLUSTER = {};\n", c.at("ROW_CLUSTER")) : "");
}

Plan CrossEntropyOp::plan(const KernelSpec& call, const KernelConfig& c) const {
  Plan p;
  const int64_t n = call.param("tokens"), mode = call.param("split_rows");
  if (n == 0) return p;
  if (c.count("GRAD")) {  // logits 0, targets 1, dloss 2, loss 3, lse 4, dlogits 5 (the logits' buffer)
    Launch l;
    l.kernel = std::string(kernel_name(c));
    const int64_t rc = c.count("ROW_CLUSTER") ? c.at("ROW_CLUSTER") : 1;
    // The last argument: the row stride of the loop (blocks, or clusters of the cluster form).
    const auto blocks = static_cast<uint32_t>(std::min<int64_t>(n, c.at("BLOCKS") / rc));
    l.geometry.grid.x = blocks * static_cast<uint32_t>(rc);
    l.geometry.cluster.x = static_cast<uint32_t>(rc);
    l.geometry.dynamic_shared_bytes = dynamic_shared_bytes(call, c);
    l.geometry.block.x = static_cast<uint32_t>(c.at("THREADS"));
    l.args = {KernelArg::tensor(0), KernelArg::tensor(1), KernelArg::tensor(2), KernelArg::tensor(3),
              KernelArg::tensor(4), KernelArg::tensor(5), KernelArg::i32(n),    KernelArg::scalar(0),
              KernelArg::scalar(1), KernelArg::i32(blocks)};
    p.launches.push_back(std::move(l));
    return p;
  }
  const bool split = mode == 2 || (mode == 0 && n < c.at("SPLIT_BELOW"));
  const uint32_t tokens = static_cast<uint32_t>(n), threads = static_cast<uint32_t>(c.at("THREADS"));
  if (!split) {  // one block per token
    LaunchGeometry g;
    g.grid.x = tokens;
    g.block.x = threads;
    p.launches.push_back(single_launch(call, c, g));  // logits, targets, loss, lse, tokens, s, z
    return p;
  }
  // Tensors: logits 0, targets 1, loss 2, lse 3.
  p.workspace_bytes = split_workspace(n, c);
  Launch rows;
  rows.kernel = "kiln_cross_entropy_split";
  rows.geometry.grid = {tokens, static_cast<uint32_t>(c.at("SPLIT")), 1};
  rows.geometry.block.x = threads;
  rows.args = {KernelArg::tensor(0), KernelArg::workspace(0), KernelArg::i32(n)};
  Launch finish;
  finish.kernel = "kiln_cross_entropy_finish";
  finish.geometry.grid.x = static_cast<uint32_t>(ceil_div(n, kFinishThreads));
  finish.geometry.block.x = kFinishThreads;
  finish.args = {KernelArg::tensor(0), KernelArg::tensor(1), KernelArg::workspace(0), KernelArg::tensor(2),
                 KernelArg::tensor(3),  KernelArg::i32(n),    KernelArg::scalar(0),    KernelArg::scalar(1)};
  p.launches = {std::move(rows), std::move(finish)};
  return p;
}

void CrossEntropyOp::init_inputs(const KernelSpec& spec, std::span<const TensorInfo> inputs,
                                 std::vector<std::vector<float>>& values, std::mt19937_64& rng) const {
  values.assign(inputs.size(), {});
  cp::init_logits(values[0], inputs[0].elements(), inputs[0].dtype, rng);
  cp::init_targets(spec, values[1], rng);
  if (with_grad(with_defaults(spec))) cp::init_dloss(spec.param("tokens"), values[2], rng);
}

void CrossEntropyOp::reference(const KernelSpec& spec, const Scalars& scalars, std::span<const std::vector<float>> in,
                               std::span<const int64_t> sample, std::vector<RefOutput>& outputs) const {
  const int64_t n = spec.param("tokens"), V = spec.param("vocab"), ignore = cp::ignore_index(spec);
  const double s = spec.param("smoothing") ? scalar(scalars, "label_smoothing") : 0.0;
  const double z = spec.param("z_loss") ? scalar(scalars, "z_loss_weight") : 0.0;
  const bool grad = with_grad(with_defaults(spec));
  outputs.assign(grad ? 3 : 2, {});
  std::vector<int64_t> rows(sample.begin(), sample.end());
  if (rows.empty())
    for (int64_t r = 0; r < n; ++r) rows.push_back(r);
  outputs[0].rows = outputs[1].rows = rows;
  if (grad) outputs[2].rows = rows;
  for (int64_t r : rows) {
    const float* x = &in[0][static_cast<size_t>(r * V)];
    double m = -std::numeric_limits<double>::infinity(), sum = 0, sum_x = 0;
    for (int64_t j = 0; j < V; ++j) m = std::max(m, double(x[j]));
    for (int64_t j = 0; j < V; ++j) {
      sum += std::exp(double(x[j]) - m);
      sum_x += x[j];
    }
    const double lse = m + std::log(sum);
    const int64_t t = static_cast<int64_t>(in[1][static_cast<size_t>(r)]);
    double loss = 0;
    if (t == ignore) loss = 0;
    else if (t < 0 || t >= V) loss = std::numeric_limits<double>::quiet_NaN();
    else loss = lse - (1 - s) * x[t] - s / double(V) * sum_x + z * lse * lse;
    outputs[0].values.push_back(loss);
    outputs[1].values.push_back(lse);
    if (grad)
      for (int64_t j = 0; j < V; ++j)
        outputs[2].values.push_back(
            cp::grad_reference(in[2][static_cast<size_t>(r)], x[j], lse, j, t, V, ignore, s, z));
  }
}

std::vector<TestSpec> CrossEntropyOp::test_specs(const TargetInfo& target) const {
  std::vector<TestSpec> out;
  auto add = [&](DType t, int64_t tokens, int64_t vocab, int64_t target_dtype, int64_t smoothing, int64_t z,
                 int64_t split, std::string_view why) {
    out.push_back(cp::test_spec(name(), t, tokens, vocab, target_dtype, smoothing, z, {"split_rows", split}, why));
  };
  for (DType t : cp::kDTypes) {
    add(t, 3, 1, 0, 0, 0, 0, "vocab 1 (every token ignored: no class but 0)");
    add(t, 5, 7, 1, 1, 0, 0, "vocab 7, int32 targets, label smoothing (scalar variant)");
    add(t, 4, 1000, 0, 0, 1, 0, "vocab 1000, z-loss");
    add(t, 3, 4099, 1, 1, 1, 0, "vocab 4099, few tokens: the split form, smoothing and z-loss (scalar variant)");
  }
  add(DType::f32, 3, 4099, 0, 1, 1, 1, "vocab 4099, one block per row: whole chunks and a tail");
  add(DType::bf16, 6, 4096, 0, 1, 0, 1, "vocab 4096 bf16, one block per row, vector loads, smoothing");
  add(DType::bf16, 5, 4096, 1, 0, 1, 0, "vocab 4096 bf16, the split form with vector loads");
  add(DType::f16, 4, 1000, 0, 0, 0, 2, "vocab 1000, split_rows=always with one block per row (SPLIT 1)");
  add(DType::bf16, 0, 64, 0, 0, 0, 0, "0 tokens: a no-op");
  add(DType::bf16, 5, 32000, 0, 0, 0, 0, "vocab 32000 (Llama-2)");
  add(DType::bf16, 3, 128256, 1, 1, 1, 0, "vocab 128256 (Llama-3), smoothing and z-loss");
  add(DType::bf16, 300, 128256, 0, 0, 0, 0, "vocab 128256, 300 tokens (one block per row on the H100)");
  add(DType::f32, 2, 152064, 0, 0, 0, 1, "vocab 152064 (Qwen2.5) in fp32, one block per row");
  // grad_inplace: the loss and dlogits over the logits in one launch.
  auto fused = [&](DType t, int64_t tokens, int64_t vocab, int64_t target_dtype, int64_t smoothing, int64_t z,
                   std::string_view why) {
    out.push_back(cp::test_spec(name(), t, tokens, vocab, target_dtype, smoothing, z, {"grad_inplace", 1}, why));
  };
  fused(DType::f32, 5, 1000, 1, 1, 1, "grad_inplace: vocab 1000 fp32, smoothing and z-loss");
  fused(DType::f16, 4, 4099, 0, 0, 0, "grad_inplace: vocab 4099 (scalar variant, a tail chunk)");
  fused(DType::bf16, 6, 4096, 1, 0, 1, "grad_inplace: vocab 4096 bf16, vector accesses, z-loss");
  fused(DType::bf16, 3, 128256, 1, 1, 0, "grad_inplace: vocab 128256 (Llama-3), smoothing");
  fused(DType::f32, 310, 8, 1, 1, 1, "grad_inplace: more tokens than blocks (304 CUs on gfx942): blocks loop over rows");
  if (target.vendor == Vendor::nvidia) {  // the row on chip (sm_90a): clusters of 2 and 4, rows looping
    fused(DType::bf16, 200, 128256, 0, 0, 1, "grad_inplace: 200 rows of 128256 bf16, clusters of 2 (66 per launch)");
    fused(DType::f32, 70, 152064, 1, 1, 0, "grad_inplace: 70 rows of 152064 fp32, clusters of 4, smoothing");
  }
  return out;
}

}  // namespace kiln
