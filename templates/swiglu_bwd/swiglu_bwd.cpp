#include "templates/swiglu_bwd/swiglu_bwd.h"

#include <fmt/format.h>

#include <cmath>

#include "support/embedded.h"
#include "templates/lib/elementwise_row.h"

namespace kiln {
namespace {
const ParamInfo kParams[] = {
    {"rows", "rows (tokens); a runtime argument, not baked; 0 is a no-op", false, false, 0, (int64_t{1} << 31) - 1},
    {"intermediate", "I: columns of dy; x and dx have 2*I", true, false, 1, int64_t{1} << 24},
};
const DType kDTypes[] = {DType::bf16, DType::f16, DType::f32};
std::vector<int64_t> rows_2i(const KernelSpec& s) { return {s.param("rows"), 2 * s.param("intermediate")}; }
std::vector<int64_t> rows_i(const KernelSpec& s) { return {s.param("rows"), s.param("intermediate")}; }
const TensorDecl kSignature[] = {
    {"dy", Role::input, DTypeRule::in, DType::f32, "[rows, I]", rows_i},
    {"x", Role::input, DTypeRule::in, DType::f32, "[rows, 2*I]", rows_2i, nullptr, "gate | up"},
    {"dx", Role::output, DTypeRule::out, DType::f32, "[rows, 2*I]", rows_2i, nullptr, "dgate | dup"},
};
}  // namespace

std::span<const ParamInfo> SwiGluBwdOp::params() const { return kParams; }
std::span<const DType> SwiGluBwdOp::dtypes() const { return kDTypes; }
std::span<const TensorDecl> SwiGluBwdOp::signature() const { return kSignature; }
std::string_view SwiGluBwdOp::device_template(const KernelConfig&) const {
  return embedded_file("templates/swiglu_bwd/swiglu_bwd.kernel");
}
std::vector<KernelConfig> SwiGluBwdOp::variants(const KernelSpec& spec, const TargetInfo& target) const {
  return elementwise_row_variants(spec.param("intermediate"), spec.dtype, target);
}
std::vector<uint32_t> SwiGluBwdOp::base_alignment(const KernelSpec& spec, const KernelConfig& config) const {
  return vector_variant_alignment(config, tensors(spec).size());
}
std::string SwiGluBwdOp::specialize(const KernelSpec& spec, const KernelConfig& c) const {
  return fmt::format("constexpr int INTERMEDIATE = {};\nconstexpr int THREADS = {}, VEC = {}, ITEMS = {};\n"
                     "typedef {} in_t;\ntypedef {} out_t;\n",
                     spec.param("intermediate"), c.at("THREADS"), c.at("VEC"), c.at("ITEMS"),
                     device_type_name(spec.dtype), device_type_name(spec.out_dtype));
}
Plan SwiGluBwdOp::plan(const KernelSpec& call, const KernelConfig& c) const {
  Plan p;
  if (call.param("rows") == 0) return p;
  p.launches.push_back(single_launch(call, c, elementwise_row_geometry(call.param("rows"), call.param("intermediate"), c)));
  return p;
}

void SwiGluBwdOp::reference(const KernelSpec& spec, const Scalars&, std::span<const std::vector<float>> in,
                            std::span<const int64_t> sample, std::vector<RefOutput>& outputs) const {
  const int64_t n_rows = spec.param("rows"), I = spec.param("intermediate");
  outputs.assign(1, {});
  RefOutput& dx = outputs[0];
  dx.rows.assign(sample.begin(), sample.end());
  if (dx.rows.empty())
    for (int64_t r = 0; r < n_rows; ++r) dx.rows.push_back(r);
  for (int64_t row : dx.rows) {
    const float* dy = &in[0][static_cast<size_t>(row * I)];
    const float* x = &in[1][static_cast<size_t>(row * 2 * I)];
    const size_t base = dx.values.size();
    dx.values.resize(base + static_cast<size_t>(2 * I));
    for (int64_t c = 0; c < I; ++c) {
      const double g = x[c], u = x[I + c], d = dy[c];
      const double s = 1.0 / (1.0 + std::exp(-g));
      dx.values[base + c] = d * u * s * (1.0 + g * (1.0 - s));
      dx.values[base + I + c] = d * g * s;
    }
  }
}

std::vector<TestSpec> SwiGluBwdOp::test_specs(const TargetInfo&) const {
  return elementwise_row_test_specs("swiglu_bwd");
}

}  // namespace kiln
