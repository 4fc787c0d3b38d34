#include "templates/cross_entropy_bwd/cross_entropy_bwd.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "support/embedded.h"
#include "templates/lib/cross_entropy_params.h"

namespace kiln {
namespace {
namespace cp = cross_entropy_params;
// The parameters and scalars of cross_entropy (templates/cross_entropy), and inplace.
const ParamInfo kParams[] = {
    cp::tokens_param(),
    cp::vocab_param(),
    cp::target_dtype_param(),
    cp::ignore_index_param("target value of tokens left out of the loss (gradient 0)"),
    cp::smoothing_param(),
    cp::z_loss_param("the gradient of z_loss_weight * lse^2 (PaLM's z-loss)"),
    {"inplace", "write dlogits over the logits (pass the logits buffer for both)", true, true, 0, 1, {}, 0},
};
bool out_of_place(const KernelSpec& s) { return s.param("inplace") == 0; }
bool in_place(const KernelSpec& s) { return s.param("inplace") != 0; }

// Tensors: dloss, logits, targets, lse -> dlogits (one `targets` and one `dlogits` present).
const TensorDecl kSignature[] = {
    {"dloss", Role::input, DTypeRule::fixed, DType::f32, "[tokens]", cp::tokens, nullptr,
     "upstream gradient per token"},
    {"logits", Role::input, DTypeRule::in, DType::f32, "[tokens, vocab]", cp::tokens_vocab},
    cp::targets_decl(cp::kTargets64),
    cp::targets_decl(cp::kTargets32),
    {"lse", Role::input, DTypeRule::fixed, DType::f32, "[tokens]", cp::tokens, nullptr, "saved by cross_entropy"},
    {"dlogits", Role::output, DTypeRule::in, DType::f32, "[tokens, vocab]", cp::tokens_vocab, out_of_place},
    {"dlogits", Role::output, DTypeRule::in, DType::f32, "[tokens, vocab]", cp::tokens_vocab, in_place,
     "written over the logits", "logits"},
};
constexpr size_t kLogits = 1, kDLogits = 4;  // tensor indices

// Up to 256 threads of up to 4 accesses each per block: many blocks per row even at few tokens,
// four independent 16-byte loads in flight per thread.
KernelConfig row_config(int64_t vocab, int64_t vec, const TargetInfo& target) {
  const int64_t nvec = ceil_div(vocab, vec);
  const int64_t threads = std::clamp<int64_t>(round_up(ceil_div(nvec, 4), target.wave_size), target.wave_size, 256);
  const int64_t items = std::clamp<int64_t>(ceil_div(nvec, threads), 1, 4);
  return {{"THREADS", threads}, {"VEC", vec}, {"ITEMS", items}};
}
}  // namespace

std::span<const ParamInfo> CrossEntropyBwdOp::params() const { return kParams; }
std::span<const ScalarInfo> CrossEntropyBwdOp::scalars() const { return cp::kScalars; }
std::span<const DType> CrossEntropyBwdOp::dtypes() const { return cp::kDTypes; }
std::span<const TensorDecl> CrossEntropyBwdOp::signature() const { return kSignature; }
std::string_view CrossEntropyBwdOp::device_template(const KernelConfig&) const {
  return embedded_file("templates/cross_entropy_bwd/cross_entropy_bwd.kernel");
}

std::vector<KernelConfig> CrossEntropyBwdOp::variants(const KernelSpec& spec, const TargetInfo& target) const {
  return cp::vector_then_scalar(spec, [&](int64_t vocab, int64_t vec) { return row_config(vocab, vec, target); });
}
std::vector<KernelConfig> CrossEntropyBwdOp::tuning_candidates(const KernelSpec& spec, const TargetInfo& target) const {
  // The heuristic's, then 128 / 256 / 512 threads with 2 / 4 / 8 accesses each, where a row
  // holds at least one whole block of them (`kiln run --bench` times them on the GPU).
  std::vector<KernelConfig> out = {choose_config(spec, target)};
  const int64_t vec = out.front().at("VEC"), nvec = ceil_div(spec.param("vocab"), vec);
  for (int64_t threads : {128, 256, 512})
    for (int64_t items : {2, 4, 8}) {
      KernelConfig c = {{"THREADS", threads}, {"VEC", vec}, {"ITEMS", items}};
      if (threads * items <= nvec && threads <= target.max_threads_per_block &&
          std::find(out.begin(), out.end(), c) == out.end())
        out.push_back(std::move(c));
    }
  return out;
}
std::vector<uint32_t> CrossEntropyBwdOp::base_alignment(const KernelSpec& spec, const KernelConfig& config) const {
  std::vector<uint32_t> out(tensors(spec).size(), 1);  // dloss, targets, lse: one element at a time
  out[kLogits] = out[kDLogits] = config.at("VEC") > 1 ? 16 : 1;
  return out;
}

std::string CrossEntropyBwdOp::specialize(const KernelSpec& spec, const KernelConfig& c) const {
  return fmt::format(
      "constexpr int VOCAB = {};\nconstexpr int THREADS = {}, VEC = {}, ITEMS = {};\n"
      "constexpr long long IGNORE_INDEX = {};\n#define SMOOTHING {}\n#define Z_LOSS {}\n#define INPLACE {}\n"
      "typedef {} in_t;\ntypedef {} target_t;\n",
      spec.param("vocab"), c.at("THREADS"), c.at("VEC"), c.at("ITEMS"), cp::ignore_index(spec),
      spec.param("smoothing"), spec.param("z_loss"), spec.param("inplace"), device_type_name(spec.dtype),
      device_type_name(spec.param("target_dtype") == 0 ? DType::i64 : DType::i32));
}

Plan CrossEntropyBwdOp::plan(const KernelSpec& call, const KernelConfig& c) const {
  Plan p;
  const int64_t n = call.param("tokens"), vocab = call.param("vocab");
  if (n == 0) return p;
  LaunchGeometry g;
  g.grid.x = static_cast<uint32_t>(n);
  g.grid.y = static_cast<uint32_t>(ceil_div(ceil_div(vocab, c.at("VEC")), c.at("THREADS") * c.at("ITEMS")));
  g.block.x = static_cast<uint32_t>(c.at("THREADS"));
  // dloss, logits, targets, lse, dlogits, tokens, label_smoothing, z_loss_weight
  p.launches.push_back(single_launch(call, c, g));
  return p;
}

void CrossEntropyBwdOp::init_inputs(const KernelSpec& spec, std::span<const TensorInfo> inputs,
                                    std::vector<std::vector<float>>& values, std::mt19937_64& rng) const {
  values.assign(inputs.size(), {});
  const int64_t n = spec.param("tokens"), V = spec.param("vocab");
  cp::init_dloss(n, values[0], rng);
  cp::init_logits(values[1], n * V, inputs[1].dtype, rng);  // as cross_entropy's
  cp::init_targets(spec, values[2], rng);
  // lse as the forward saves it, from the rounded logits. fp32 exponentials (a benchmark's
  // [8192, 152064] takes 1.2e9): the reference reads lse as given, so its last bits do not
  // matter, only that it is the row's log-sum-exp to fp32 accuracy (sums in fp64).
  for (int64_t i = 0; i < n; ++i) {
    const float* x = &values[1][static_cast<size_t>(i * V)];
    float m = x[0];
    for (int64_t j = 1; j < V; ++j) m = std::max(m, x[j]);
    double sum = 0;
    for (int64_t j = 0; j < V; ++j) sum += std::exp(x[j] - m);
    values[3].push_back(static_cast<float>(m + std::log(sum)));
  }
}

void CrossEntropyBwdOp::reference(const KernelSpec& spec, const Scalars& scalars,
                                  std::span<const std::vector<float>> in, std::span<const int64_t> sample,
                                  std::vector<RefOutput>& outputs) const {
  const int64_t n = spec.param("tokens"), V = spec.param("vocab"), ignore = cp::ignore_index(spec);
  const double s = spec.param("smoothing") ? scalar(scalars, "label_smoothing") : 0.0;
  const double z = spec.param("z_loss") ? scalar(scalars, "z_loss_weight") : 0.0;
  outputs.assign(1, {});
  RefOutput& out = outputs[0];
  out.rows.assign(sample.begin(), sample.end());
  if (out.rows.empty())
    for (int64_t r = 0; r < n; ++r) out.rows.push_back(r);
  for (int64_t r : out.rows) {
    const float* x = &in[1][static_cast<size_t>(r * V)];
    const double dloss = in[0][static_cast<size_t>(r)], lse = in[3][static_cast<size_t>(r)];
    const int64_t t = static_cast<int64_t>(in[2][static_cast<size_t>(r)]);
    for (int64_t j = 0; j < V; ++j) out.values.push_back(cp::grad_reference(dloss, x[j], lse, j, t, V, ignore, s, z));
  }
}

std::vector<TestSpec> CrossEntropyBwdOp::test_specs(const TargetInfo&) const {
  std::vector<TestSpec> out;
  auto add = [&](DType t, int64_t tokens, int64_t vocab, int64_t target_dtype, int64_t smoothing, int64_t z,
                 int64_t inplace, std::string_view why) {
    out.push_back(cp::test_spec(name(), t, tokens, vocab, target_dtype, smoothing, z, {"inplace", inplace}, why));
  };
  for (DType t : cp::kDTypes) {
    add(t, 3, 1, 0, 0, 0, 0, "vocab 1 (every token ignored: no class but 0)");
    add(t, 5, 7, 1, 1, 0, 1, "vocab 7, int32 targets, smoothing, in place (scalar variant)");
    add(t, 4, 1000, 0, 0, 1, 0, "vocab 1000, z-loss");
    add(t, 3, 4099, 1, 1, 1, 1, "vocab 4099, smoothing and z-loss, in place (scalar variant)");
  }
  add(DType::bf16, 6, 4096, 0, 1, 0, 1, "vocab 4096 bf16, vector accesses, in place");
  add(DType::bf16, 0, 64, 0, 0, 0, 0, "0 tokens: a no-op");
  add(DType::bf16, 5, 32000, 0, 0, 0, 0, "vocab 32000 (Llama-2)");
  add(DType::bf16, 3, 128256, 1, 1, 1, 1, "vocab 128256 (Llama-3), smoothing and z-loss, in place");
  add(DType::f32, 2, 152064, 0, 0, 0, 0, "vocab 152064 (Qwen2.5) in fp32");
  return out;
}

}  // namespace kiln
