#include "templates/rmsnorm_bwd/rmsnorm_bwd.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "support/embedded.h"
#include "templates/rmsnorm/rmsnorm.h"
#include "templates/swiglu/swiglu.h"

namespace kiln {
namespace {
const ParamInfo kParams[] = {
    {"rows", "rows (tokens); a runtime argument, not baked; 0 is a no-op", false, false, 0, (int64_t{1} << 31) - 1},
    {"hidden", "normalized (last) dimension", true, false, 1, 65536},
    {"recompute_rstd", "recompute rstd from x and eps instead of reading it (default 0)", true, true, 0, 1, {}, 0},
};
const ScalarInfo kScalars[] = {{"eps", 1e-5f, "with recompute_rstd: added to mean(x^2)"}};
const DType kDTypes[] = {DType::bf16, DType::f16, DType::f32};
constexpr int64_t kReduceThreads = 256;

std::vector<int64_t> rows_hidden(const KernelSpec& s) { return {s.param("rows"), s.param("hidden")}; }
std::vector<int64_t> hidden(const KernelSpec& s) { return {s.param("hidden")}; }
std::vector<int64_t> rows(const KernelSpec& s) { return {s.param("rows")}; }
bool reads_rstd(const KernelSpec& s) { return s.param("recompute_rstd") == 0; }

const TensorDecl kSignature[] = {
    {"dy", Role::input, DTypeRule::in, DType::f32, "[rows, hidden]", rows_hidden},
    {"x", Role::input, DTypeRule::in, DType::f32, "[rows, hidden]", rows_hidden},
    {"gamma", Role::input, DTypeRule::in, DType::f32, "[hidden]", hidden},
    {"rstd", Role::input, DTypeRule::fixed, DType::f32, "[rows]", rows, reads_rstd, "saved by rmsnorm save_rstd"},
    {"dx", Role::output, DTypeRule::out, DType::f32, "[rows, hidden]", rows_hidden},
    {"dgamma", Role::output, DTypeRule::out, DType::f32, "[hidden]", hidden},
};

// The row blocks of the first launch: at most BLOCKS, so the partial sums stay small.
int64_t row_blocks(int64_t rows, const TileConfig& c) { return std::min(rows, c.at("BLOCKS")); }
}  // namespace

std::span<const ParamInfo> RmsNormBwdOp::params() const { return kParams; }
std::span<const ScalarInfo> RmsNormBwdOp::scalars() const { return kScalars; }
std::span<const DType> RmsNormBwdOp::dtypes() const { return kDTypes; }
std::span<const TensorDecl> RmsNormBwdOp::signature() const { return kSignature; }
std::string_view RmsNormBwdOp::device_template(const TileConfig&) const {
  return embedded_file("templates/rmsnorm_bwd/rmsnorm_bwd.kernel");
}

std::vector<TileConfig> RmsNormBwdOp::variants(const KernelSpec& spec, const TargetInfo& target) const {
  const int64_t H = spec.param("hidden");
  const int64_t vec = 16 / static_cast<int64_t>(dtype_size(spec.dtype));
  std::vector<TileConfig> out;
  for (int64_t v : {vec, int64_t{1}}) {
    if (v > 1 && H % v != 0) continue;
    // The forward's row configuration; two blocks per compute unit own the rows.
    TileConfig c = norm_row_config(H, v, target);
    c["BLOCKS"] = 2 * target.compute_units;
    out.push_back(std::move(c));
  }
  return out;
}
TileConfig RmsNormBwdOp::choose_config(const KernelSpec& spec, const TargetInfo& target) const {
  return variants(spec, target).front();
}
std::vector<uint32_t> RmsNormBwdOp::base_alignment(const KernelSpec& spec, const TileConfig& config) const {
  return vector_variant_alignment(config, tensors(spec).size());
}

std::string RmsNormBwdOp::specialize(const KernelSpec& spec, const TileConfig& c) const {
  return fmt::format("constexpr int HIDDEN = {};\nconstexpr int THREADS = {}, VEC = {}, ITEMS = {};\n"
                     "constexpr int REDUCE_THREADS = {};\n#define RECOMPUTE_RSTD {}\n"
                     "typedef {} in_t;\ntypedef {} out_t;\n",
                     spec.param("hidden"), c.at("THREADS"), c.at("VEC"), c.at("ITEMS"), kReduceThreads,
                     spec.param("recompute_rstd"), device_type_name(spec.dtype), device_type_name(spec.out_dtype));
}

Plan RmsNormBwdOp::plan(const KernelSpec& call, const TileConfig& c) const {
  Plan p;
  const int64_t n_rows = call.param("rows"), H = call.param("hidden");
  const int64_t blocks = row_blocks(n_rows, c);
  const bool recompute = call.param("recompute_rstd") != 0;
  // Tensors in signature order: dy, x, gamma, [rstd], dx, dgamma.
  const uint32_t dx = recompute ? 3 : 4, dgamma = dx + 1;
  p.workspace_bytes = static_cast<uint64_t>(std::max<int64_t>(blocks, 1) * round_up(H, 4)) * 4;
  Launch rows_pass;
  rows_pass.kernel = "kiln_rmsnorm_bwd";
  rows_pass.geometry.grid.x = static_cast<uint32_t>(blocks);
  rows_pass.geometry.block.x = static_cast<uint32_t>(c.at("THREADS"));
  rows_pass.args = {KernelArg::tensor(0), KernelArg::tensor(1), KernelArg::tensor(2)};
  if (!recompute) rows_pass.args.push_back(KernelArg::tensor(3));
  rows_pass.args.insert(rows_pass.args.end(), {KernelArg::tensor(dx), KernelArg::workspace(0), KernelArg::i32(n_rows),
                                               KernelArg::i32(blocks), KernelArg::scalar(0)});
  Launch reduce;
  reduce.kernel = "kiln_rmsnorm_bwd_dgamma";
  reduce.geometry.grid.x = static_cast<uint32_t>(ceil_div(H, kReduceThreads));
  reduce.geometry.block.x = static_cast<uint32_t>(kReduceThreads);
  reduce.args = {KernelArg::workspace(0), KernelArg::tensor(dgamma), KernelArg::i32(blocks)};
  // 0 rows: no row blocks, and dgamma is a sum over no rows: the reduction alone writes zeros.
  if (n_rows == 0) p.launches = {std::move(reduce)};
  else p.launches = {std::move(rows_pass), std::move(reduce)};
  return p;
}

void RmsNormBwdOp::init_inputs(const KernelSpec& spec, std::span<const TensorInfo> inputs,
                               std::vector<std::vector<float>>& values, std::mt19937_64& rng) const {
  OpTemplate::init_inputs(spec, inputs, values, rng);
  if (spec.param("recompute_rstd")) return;
  // rstd as the forward saves it: from x, with the default eps, in fp32.
  const int64_t H = spec.param("hidden");
  std::vector<float>& rstd = values[3];
  for (size_t r = 0; r < rstd.size(); ++r) {
    double sum = 0;
    for (int64_t c = 0; c < H; ++c) sum += double(values[1][r * H + c]) * values[1][r * H + c];
    rstd[r] = static_cast<float>(1.0 / std::sqrt(sum / H + kScalars[0].default_value));
  }
}

void RmsNormBwdOp::reference(const KernelSpec& spec, const Scalars& scalars, std::span<const std::vector<float>> in,
                             std::span<const int64_t> sample, std::vector<RefOutput>& outputs) const {
  const int64_t n_rows = spec.param("rows"), H = spec.param("hidden");
  const bool recompute = spec.param("recompute_rstd") != 0;
  const double eps = scalar(scalars, "eps");
  const std::vector<float>&dy = in[0], &x = in[1], &gamma = in[2];
  outputs.assign(2, {});
  std::vector<int64_t> rows(sample.begin(), sample.end());
  if (rows.empty())
    for (int64_t r = 0; r < n_rows; ++r) rows.push_back(r);
  outputs[0].rows = rows;
  std::vector<double> dgamma(static_cast<size_t>(H), 0.0);
  size_t next = 0;
  for (int64_t r = 0; r < n_rows; ++r) {  // dgamma needs every row
    const float* xr = &x[static_cast<size_t>(r * H)];
    const float* dyr = &dy[static_cast<size_t>(r * H)];
    double rstd;
    if (recompute) {
      double sum = 0;
      for (int64_t c = 0; c < H; ++c) sum += double(xr[c]) * xr[c];
      rstd = 1.0 / std::sqrt(sum / H + eps);
    } else {
      rstd = in[3][static_cast<size_t>(r)];
    }
    for (int64_t c = 0; c < H; ++c) dgamma[c] += double(dyr[c]) * xr[c] * rstd;
    if (next < rows.size() && rows[next] == r) {
      ++next;
      double dot = 0;
      for (int64_t c = 0; c < H; ++c) dot += double(dyr[c]) * gamma[c] * xr[c];
      for (int64_t c = 0; c < H; ++c)
        outputs[0].values.push_back(rstd * gamma[c] * dyr[c] - xr[c] * rstd * rstd * rstd / H * dot);
    }
  }
  outputs[1].values = std::move(dgamma);
}

Gate RmsNormBwdOp::gate(const KernelSpec& spec, const TensorInfo& output) const {
  Gate g = Gate::for_dtype(output.dtype);
  // hidden = 1: dx = r gamma dy eps / (x^2 + eps) exactly, a cancellation to about 1e-5 of the
  // terms, where fp16 is subnormal: the per-element gate holds, the relative norm does not apply.
  if (output.name == "dx" && spec.param("hidden") == 1) g.max_rel_fro = -1;
  return g;
}

std::vector<TestSpec> RmsNormBwdOp::test_specs(const TargetInfo&) const {
  std::vector<TestSpec> out;
  auto add = [&](DType t, int64_t rows, int64_t hidden, int recompute, std::string_view why) {
    out.push_back({{"rmsnorm_bwd", t, t, {{"rows", rows}, {"hidden", hidden}, {"recompute_rstd", recompute}}}, why});
  };
  for (DType t : kDTypes) {
    add(t, 3, 1, 0, "hidden 1");
    add(t, 5, 7, 1, "hidden 7, rstd recomputed (scalar variant)");
    add(t, 4, 1000, 0, "hidden 1000");
    add(t, 6, 4096, 0, "hidden 4096, vector loads");
  }
  add(DType::bf16, 0, 64, 0, "0 rows: a no-op");
  add(DType::bf16, 1, 64, 1, "1 row");
  add(DType::bf16, 700, 5120, 0, "more rows than row blocks");
  return out;
}

}  // namespace kiln
