#include "templates/rmsnorm/rmsnorm.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "support/embedded.h"

namespace kiln {
namespace {
const ParamInfo kParams[] = {
    {"rows", "rows (tokens); a runtime argument, not baked; 0 is a no-op", false, false, 0, (int64_t{1} << 31) - 1},
    {"hidden", "normalized (last) dimension", true, false, 1, 65536},
    {"residual", "fused residual add: normalize h = x + residual and write h (default 0)", true, true, 0, 1, {}, 0},
    {"save_rstd", "write rstd [rows] (fp32) for the backward (default 0)", true, true, 0, 1, {}, 0},
};
const ScalarInfo kScalars[] = {{"eps", 1e-5f, "added to mean(h^2) before the square root"}};
const DType kDTypes[] = {DType::bf16, DType::f16, DType::f32};

std::vector<int64_t> rows_hidden(const KernelSpec& s) { return {s.param("rows"), s.param("hidden")}; }
std::vector<int64_t> hidden(const KernelSpec& s) { return {s.param("hidden")}; }
std::vector<int64_t> rows(const KernelSpec& s) { return {s.param("rows")}; }
bool with_residual(const KernelSpec& s) { return s.param("residual") != 0; }
bool with_rstd(const KernelSpec& s) { return s.param("save_rstd") != 0; }

const TensorDecl kSignature[] = {
    {"x", Role::input, DTypeRule::in, DType::f32, "[rows, hidden]", rows_hidden},
    {"residual", Role::input, DTypeRule::in, DType::f32, "[rows, hidden]", rows_hidden, with_residual},
    {"gamma", Role::input, DTypeRule::in, DType::f32, "[hidden]", hidden},
    {"y", Role::output, DTypeRule::out, DType::f32, "[rows, hidden]", rows_hidden},
    {"h", Role::output, DTypeRule::in, DType::f32, "[rows, hidden]", rows_hidden, with_residual,
     "x + residual, rounded to the dtype"},
    {"rstd", Role::output, DTypeRule::fixed, DType::f32, "[rows]", rows, with_rstd, "1 / sqrt(mean(h^2) + eps)"},
};
}  // namespace

std::span<const ParamInfo> RmsNormOp::params() const { return kParams; }
std::span<const ScalarInfo> RmsNormOp::scalars() const { return kScalars; }
std::span<const DType> RmsNormOp::dtypes() const { return kDTypes; }
std::span<const TensorDecl> RmsNormOp::signature() const { return kSignature; }
std::string_view RmsNormOp::device_template(const TileConfig&) const {
  return embedded_file("templates/rmsnorm/rmsnorm.kernel");
}

// Each thread loads ITEMS vectors of VEC elements (16 bytes when VEC > 1) and keeps them in
// registers between the sum-of-squares pass and the scaling pass. About 4 vectors per thread give
// the memory system enough loads in flight; whole wavefronts, at most 1024 threads.
TileConfig norm_row_config(int64_t hidden, int64_t vec, const TargetInfo& target) {
  const int64_t nvec = ceil_div(hidden, vec);
  const int64_t threads = std::clamp<int64_t>(round_up(ceil_div(nvec, 4), target.wave_size), target.wave_size, 1024);
  return {{"THREADS", threads}, {"VEC", vec}, {"ITEMS", ceil_div(nvec, threads)}};
}

std::vector<TileConfig> RmsNormOp::variants(const KernelSpec& spec, const TargetInfo& target) const {
  const int64_t hidden = spec.param("hidden");
  const int64_t vec = 16 / static_cast<int64_t>(dtype_size(spec.dtype));
  std::vector<TileConfig> out;
  if (hidden % vec == 0 && hidden >= vec) out.push_back(norm_row_config(hidden, vec, target));
  out.push_back(norm_row_config(hidden, 1, target));
  return out;
}

std::vector<uint32_t> RmsNormOp::base_alignment(const KernelSpec& spec, const TileConfig& config) const {
  return vector_variant_alignment(config, tensors(spec).size());
}

std::string RmsNormOp::specialize(const KernelSpec& spec, const TileConfig& c) const {
  return fmt::format("constexpr int HIDDEN = {};\nconstexpr int THREADS = {}, VEC = {}, ITEMS = {};\n"
                     "#define RESIDUAL {}\n#define SAVE_RSTD {}\n"
                     "typedef {} in_t;\ntypedef {} out_t;\n",
                     spec.param("hidden"), c.at("THREADS"), c.at("VEC"), c.at("ITEMS"), spec.param("residual"),
                     spec.param("save_rstd"), device_type_name(spec.dtype), device_type_name(spec.out_dtype));
}

Plan RmsNormOp::plan(const KernelSpec& call, const TileConfig& c) const {
  Plan p;
  if (call.param("rows") == 0) return p;
  LaunchGeometry g;
  g.grid.x = static_cast<uint32_t>(call.param("rows"));
  g.block.x = static_cast<uint32_t>(c.at("THREADS"));
  p.launches.push_back(single_launch(call, c, g));
  return p;
}

void RmsNormOp::reference(const KernelSpec& spec, const Scalars& scalars, std::span<const std::vector<float>> inputs,
                          std::span<const int64_t> sample, std::vector<RefOutput>& outputs) const {
  const int64_t n_rows = spec.param("rows"), H = spec.param("hidden");
  const bool residual = with_residual(spec), save = with_rstd(spec);
  const double eps = scalar(scalars, "eps");
  const std::vector<float>& x = inputs[0];
  const std::vector<float>* res = residual ? &inputs[1] : nullptr;
  const std::vector<float>& gamma = inputs[residual ? 2 : 1];
  outputs.assign(1 + residual + save, {});
  std::vector<int64_t> rows(sample.begin(), sample.end());
  if (rows.empty())
    for (int64_t r = 0; r < n_rows; ++r) rows.push_back(r);
  for (RefOutput& o : outputs) o.rows = rows;
  std::vector<double> h(static_cast<size_t>(H));
  for (int64_t row : rows) {
    double sum_sq = 0.0;
    for (int64_t c = 0; c < H; ++c) {
      const size_t i = static_cast<size_t>(row * H + c);
      // h is stored in the dtype and the kernel normalizes the stored value.
      h[c] = residual ? round_to_dtype(x[i] + (*res)[i], spec.dtype) : x[i];
      sum_sq += h[c] * h[c];
    }
    const double inv_rms = 1.0 / std::sqrt(sum_sq / H + eps);
    for (int64_t c = 0; c < H; ++c) outputs[0].values.push_back(h[c] * inv_rms * gamma[c]);
    if (residual) outputs[1].values.insert(outputs[1].values.end(), h.begin(), h.end());
    if (save) outputs.back().values.push_back(inv_rms);
  }
}

std::vector<TestSpec> RmsNormOp::test_specs(const TargetInfo&) const {
  std::vector<TestSpec> out;
  auto add = [&](DType t, int64_t rows, int64_t hidden, int residual, int save, std::string_view why) {
    out.push_back({{"rmsnorm", t, t, {{"rows", rows}, {"hidden", hidden}, {"residual", residual}, {"save_rstd", save}}},
                   why});
  };
  for (DType t : kDTypes) {
    add(t, 3, 1, 0, 0, "hidden 1");
    add(t, 5, 7, 1, 1, "hidden 7, residual, rstd (scalar variant)");
    add(t, 4, 1000, 0, 1, "hidden 1000");
    add(t, 2, 4096, 1, 0, "hidden 4096, vector loads");
  }
  add(DType::bf16, 0, 64, 0, 0, "0 rows: a no-op");
  add(DType::bf16, 9, 5120, 1, 1, "hidden 5120");
  return out;
}

}  // namespace kiln
