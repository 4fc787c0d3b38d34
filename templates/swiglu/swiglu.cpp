#include "templates/swiglu/swiglu.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "support/embedded.h"

namespace kiln {
namespace {
const ParamInfo kParams[] = {
    {"rows", "rows (tokens); a runtime argument, not baked", false, false, 1, (int64_t{1} << 31) - 1},
    {"intermediate", "I: output columns; the input has 2*I", true, false, 1, int64_t{1} << 24},
};
const DType kDTypes[] = {DType::bf16, DType::f16, DType::f32};
}  // namespace

std::span<const ParamInfo> SwiGluOp::params() const { return kParams; }
std::span<const DType> SwiGluOp::dtypes() const { return kDTypes; }
std::string_view SwiGluOp::device_template() const {
  return embedded_file("templates/swiglu/swiglu.kernel");
}

TileConfig SwiGluOp::choose_config(const KernelSpec& spec, const TargetInfo& target) const {
  const int64_t I = spec.param("intermediate");
  const int64_t threads = std::clamp<int64_t>(round_up(I, target.wave_size), target.wave_size, 256);
  const int64_t items = std::clamp<int64_t>(ceil_div(I, threads), 1, 4);
  return {{"THREADS", threads}, {"ITEMS", items}};
}

std::string SwiGluOp::specialize(const KernelSpec& spec, const TileConfig& c) const {
  return fmt::format("constexpr int INTERMEDIATE = {};\nconstexpr int THREADS = {}, ITEMS = {};\n"
                     "typedef {} in_t;\ntypedef {} out_t;\n",
                     spec.param("intermediate"), c.at("THREADS"), c.at("ITEMS"),
                     device_type_name(spec.dtype), device_type_name(spec.out_dtype));
}

LaunchGeometry SwiGluOp::geometry(const KernelSpec& spec, const TileConfig& c) const {
  LaunchGeometry g;
  g.grid.x = static_cast<uint32_t>(spec.param("rows"));
  g.grid.y = static_cast<uint32_t>(ceil_div(spec.param("intermediate"), c.at("THREADS") * c.at("ITEMS")));
  g.block.x = static_cast<uint32_t>(c.at("THREADS"));
  return g;
}

std::vector<TensorInfo> SwiGluOp::tensors(const KernelSpec& spec) const {
  const int64_t rows = spec.param("rows"), I = spec.param("intermediate");
  return {{"x", spec.dtype, {rows, 2 * I}, false}, {"y", spec.out_dtype, {rows, I}, true}};
}

void SwiGluOp::reference(const KernelSpec& spec, const Scalars&,
                         std::span<const std::vector<float>> inputs, std::span<const int64_t> rows,
                         std::vector<double>& out) const {
  const int64_t n_rows = spec.param("rows"), I = spec.param("intermediate");
  const int64_t count = rows.empty() ? n_rows : static_cast<int64_t>(rows.size());
  out.assign(static_cast<size_t>(count * I), 0.0);
  for (int64_t r = 0; r < count; ++r) {
    const int64_t row = rows.empty() ? r : rows[r];
    const float* x = &inputs[0][static_cast<size_t>(row * 2 * I)];
    for (int64_t c = 0; c < I; ++c) {
      const double g = x[c], u = x[I + c];
      out[r * I + c] = g / (1.0 + std::exp(-g)) * u;
    }
  }
}

}  // namespace kiln
