#include "templates/swiglu/swiglu.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "support/embedded.h"

namespace kiln {
namespace {
const ParamInfo kParams[] = {
    {"rows", "rows (tokens); a runtime argument, not baked; 0 is a no-op", false, false, 0, (int64_t{1} << 31) - 1},
    {"intermediate", "I: output columns; the input has 2*I", true, false, 1, int64_t{1} << 24},
};
const DType kDTypes[] = {DType::bf16, DType::f16, DType::f32};
std::vector<int64_t> rows_2i(const KernelSpec& s) { return {s.param("rows"), 2 * s.param("intermediate")}; }
std::vector<int64_t> rows_i(const KernelSpec& s) { return {s.param("rows"), s.param("intermediate")}; }
const TensorDecl kSignature[] = {
    {"x", Role::input, DTypeRule::in, DType::f32, "[rows, 2*I]", rows_2i, nullptr, "gate | up"},
    {"y", Role::output, DTypeRule::out, DType::f32, "[rows, I]", rows_i},
};
}  // namespace

TileConfig elementwise_row_config(int64_t columns, int64_t vec, const TargetInfo& target) {
  // Up to 256 threads of 2 accesses each per block: enough blocks for every SM/CU even at few
  // rows, and two independent 16-byte loads in flight per thread and tensor.
  const int64_t nvec = ceil_div(columns, vec);
  const int64_t threads = std::clamp<int64_t>(round_up(ceil_div(nvec, 2), target.wave_size), target.wave_size, 256);
  const int64_t items = std::clamp<int64_t>(ceil_div(nvec, threads), 1, 2);
  return {{"THREADS", threads}, {"VEC", vec}, {"ITEMS", items}};
}

std::vector<TileConfig> elementwise_row_variants(int64_t columns, DType t, const TargetInfo& target) {
  const int64_t vec = 16 / static_cast<int64_t>(dtype_size(t));
  std::vector<TileConfig> out;
  if (columns % vec == 0) out.push_back(elementwise_row_config(columns, vec, target));
  out.push_back(elementwise_row_config(columns, 1, target));
  return out;
}

LaunchGeometry elementwise_row_geometry(int64_t rows, int64_t columns, const TileConfig& c) {
  LaunchGeometry g;
  g.grid.x = static_cast<uint32_t>(rows);
  g.grid.y = static_cast<uint32_t>(ceil_div(ceil_div(columns, c.at("VEC")), c.at("THREADS") * c.at("ITEMS")));
  g.block.x = static_cast<uint32_t>(c.at("THREADS"));
  return g;
}

std::span<const ParamInfo> SwiGluOp::params() const { return kParams; }
std::span<const DType> SwiGluOp::dtypes() const { return kDTypes; }
std::span<const TensorDecl> SwiGluOp::signature() const { return kSignature; }
std::string_view SwiGluOp::device_template(const TileConfig&) const {
  return embedded_file("templates/swiglu/swiglu.kernel");
}

std::vector<TileConfig> SwiGluOp::variants(const KernelSpec& spec, const TargetInfo& target) const {
  return elementwise_row_variants(spec.param("intermediate"), spec.dtype, target);
}
TileConfig SwiGluOp::choose_config(const KernelSpec& spec, const TargetInfo& target) const {
  return variants(spec, target).front();
}
std::vector<uint32_t> SwiGluOp::base_alignment(const KernelSpec& spec, const TileConfig& config) const {
  return vector_variant_alignment(config, tensors(spec).size());
}

std::string SwiGluOp::specialize(const KernelSpec& spec, const TileConfig& c) const {
  return fmt::format("constexpr int INTERMEDIATE = {};\nconstexpr int THREADS = {}, VEC = {}, ITEMS = {};\n"
                     "typedef {} in_t;\ntypedef {} out_t;\n",
                     spec.param("intermediate"), c.at("THREADS"), c.at("VEC"), c.at("ITEMS"),
                     device_type_name(spec.dtype), device_type_name(spec.out_dtype));
}

Plan SwiGluOp::plan(const KernelSpec& call, const TileConfig& c) const {
  Plan p;
  if (call.param("rows") == 0) return p;
  p.launches.push_back(single_launch(call, c, elementwise_row_geometry(call.param("rows"), call.param("intermediate"), c)));
  return p;
}

void SwiGluOp::reference(const KernelSpec& spec, const Scalars&, std::span<const std::vector<float>> inputs,
                         std::span<const int64_t> sample, std::vector<RefOutput>& outputs) const {
  const int64_t n_rows = spec.param("rows"), I = spec.param("intermediate");
  outputs.assign(1, {});
  RefOutput& y = outputs[0];
  y.rows.assign(sample.begin(), sample.end());
  if (y.rows.empty())
    for (int64_t r = 0; r < n_rows; ++r) y.rows.push_back(r);
  for (int64_t row : y.rows) {
    const float* x = &inputs[0][static_cast<size_t>(row * 2 * I)];
    for (int64_t c = 0; c < I; ++c) {
      const double g = x[c], u = x[I + c];
      y.values.push_back(g / (1.0 + std::exp(-g)) * u);
    }
  }
}

std::vector<TestSpec> elementwise_row_test_specs(std::string_view op) {
  std::vector<TestSpec> out;
  auto add = [&](DType t, int64_t rows, int64_t I, std::string_view why) {
    out.push_back({{std::string(op), t, t, {{"rows", rows}, {"intermediate", I}}}, why});
  };
  for (DType t : kDTypes) {
    add(t, 3, 1, "I 1");
    add(t, 4, 7, "I 7 (scalar variant)");
    add(t, 2, 100, "I 100");
    add(t, 3, 1024, "I 1024, vector accesses");
  }
  add(DType::bf16, 0, 64, "0 rows: a no-op");
  add(DType::bf16, 2, 18944, "I 18944 (Qwen2.5-7B)");
  return out;
}

std::vector<TestSpec> SwiGluOp::test_specs(const TargetInfo&) const { return elementwise_row_test_specs("swiglu"); }

}  // namespace kiln
