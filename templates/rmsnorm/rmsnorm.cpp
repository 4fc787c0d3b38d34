#include "templates/rmsnorm/rmsnorm.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "support/embedded.h"

namespace kiln {
namespace {
const ParamInfo kParams[] = {
    {"rows", "rows (tokens); a runtime argument, not baked", false, false, 1, (int64_t{1} << 31) - 1},
    {"hidden", "normalized (last) dimension", true, false, 1, 65536},
};
const ScalarInfo kScalars[] = {{"eps", 1e-5f, "added to mean(x^2) before the square root"}};
const DType kDTypes[] = {DType::bf16, DType::f16, DType::f32};
}  // namespace

std::span<const ParamInfo> RmsNormOp::params() const { return kParams; }
std::span<const ScalarInfo> RmsNormOp::scalars() const { return kScalars; }
std::span<const DType> RmsNormOp::dtypes() const { return kDTypes; }
std::string_view RmsNormOp::device_template() const {
  return embedded_file("templates/rmsnorm/rmsnorm.kernel");
}

TileConfig RmsNormOp::choose_config(const KernelSpec& spec, const TargetInfo& target) const {
  // About 8 elements per thread, whole wavefronts, at most 1024 threads; each thread keeps its
  // elements in registers between the sum-of-squares pass and the scaling pass.
  const int64_t threads = std::clamp<int64_t>(round_up(ceil_div(spec.param("hidden"), 8), target.wave_size),
                                              target.wave_size, 1024);
  return {{"THREADS", threads}};
}

std::string RmsNormOp::specialize(const KernelSpec& spec, const TileConfig& c) const {
  return fmt::format("constexpr int HIDDEN = {};\nconstexpr int THREADS = {};\n"
                     "typedef {} in_t;\ntypedef {} out_t;\n",
                     spec.param("hidden"), c.at("THREADS"), device_type_name(spec.dtype),
                     device_type_name(spec.out_dtype));
}

LaunchGeometry RmsNormOp::geometry(const KernelSpec& spec, const TileConfig& c) const {
  LaunchGeometry g;
  g.grid.x = static_cast<uint32_t>(spec.param("rows"));
  g.block.x = static_cast<uint32_t>(c.at("THREADS"));
  return g;
}

std::vector<TensorInfo> RmsNormOp::tensors(const KernelSpec& spec) const {
  const int64_t rows = spec.param("rows"), hidden = spec.param("hidden");
  return {{"x", spec.dtype, {rows, hidden}, false},
          {"gamma", spec.dtype, {hidden}, false},
          {"y", spec.out_dtype, {rows, hidden}, true}};
}

void RmsNormOp::reference(const KernelSpec& spec, const Scalars& scalars,
                          std::span<const std::vector<float>> inputs, std::span<const int64_t> rows,
                          std::vector<double>& out) const {
  const int64_t n_rows = spec.param("rows"), hidden = spec.param("hidden");
  const double eps = scalar(scalars, "eps");
  const int64_t count = rows.empty() ? n_rows : static_cast<int64_t>(rows.size());
  out.assign(static_cast<size_t>(count * hidden), 0.0);
  for (int64_t r = 0; r < count; ++r) {
    const int64_t row = rows.empty() ? r : rows[r];
    const float* x = &inputs[0][static_cast<size_t>(row * hidden)];
    double sum_sq = 0.0;
    for (int64_t c = 0; c < hidden; ++c) sum_sq += double(x[c]) * x[c];
    const double inv_rms = 1.0 / std::sqrt(sum_sq / hidden + eps);
    for (int64_t c = 0; c < hidden; ++c) out[r * hidden + c] = x[c] * inv_rms * inputs[1][c];
  }
}

}  // namespace kiln
