#include "templates/dequantize_fp8/dequantize_fp8.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "support/embedded.h"
#include "templates/lib/fp8_scaling.h"
#include "templates/lib/elementwise_row.h"

namespace kiln {
namespace {
const ParamInfo kParams[] = {
    {"rows", "rows (tokens); a runtime argument, not baked; 0 is a no-op", false, false, 0, (int64_t{1} << 31) - 1},
    {"cols", "columns (the last dimension)", true, false, 1, int64_t{1} << 22},
    {"granularity", "what one fp32 scale covers: the tensor, a row, 1x128 or 128x128 elements", true, false, 0, 3,
     fp8_granularity_names()},
};
const DType kDTypes[] = {DType::e4m3, DType::e5m2, DType::e4m3fnuz, DType::e5m2fnuz};
std::vector<int64_t> rows_cols(const KernelSpec& s) { return {s.param("rows"), s.param("cols")}; }
const TensorDecl kSignature[] = {
    {"q", Role::input, DTypeRule::in, DType::f32, "[rows, cols]", rows_cols},
    {"scale", Role::input, DTypeRule::fixed, DType::f32,
     "[1] | [rows] | [rows, ceil(cols/128)] | [ceil(rows/128), ceil(cols/128)] (tensorwise | rowwise | block1x128 | block128x128)",
     fp8_scale_shape},
    {"x", Role::output, DTypeRule::out, DType::f32, "[rows, cols]", rows_cols, nullptr, "float(q) * scale"},
};
}  // namespace

std::span<const ParamInfo> DequantizeFp8Op::params() const { return kParams; }
std::span<const DType> DequantizeFp8Op::dtypes() const { return kDTypes; }
bool DequantizeFp8Op::supports_out_dtype(DType in, DType out) const { return is_fp8(in) && is_float16_or_32(out); }
std::span<const TensorDecl> DequantizeFp8Op::signature() const { return kSignature; }
std::string_view DequantizeFp8Op::device_template(const KernelConfig&) const {
  return embedded_file("templates/dequantize_fp8/dequantize_fp8.kernel");
}

std::vector<KernelConfig> DequantizeFp8Op::variants(const KernelSpec& spec, const TargetInfo& target) const {
  // 16 bytes of the output per access (8 fp8 codes in for bf16/fp16, 4 for fp32).
  return elementwise_row_variants(spec.param("cols"), spec.out_dtype, target);
}
std::vector<uint32_t> DequantizeFp8Op::base_alignment(const KernelSpec& spec, const KernelConfig& config) const {
  return vector_variant_alignment(config, tensors(spec).size(), {1});  // scale: scalar loads
}

std::string DequantizeFp8Op::specialize(const KernelSpec& spec, const KernelConfig& c) const {
  return fmt::format("constexpr int COLS = {};\n#define GRAN {}\nconstexpr int THREADS = {}, VEC = {}, ITEMS = {};\n"
                     "typedef {} in_t;\ntypedef {} out_t;\n",
                     spec.param("cols"), spec.param("granularity"), c.at("THREADS"), c.at("VEC"), c.at("ITEMS"),
                     device_type_name(spec.dtype), device_type_name(spec.out_dtype));
}

Plan DequantizeFp8Op::plan(const KernelSpec& call, const KernelConfig& c) const {
  Plan p;
  if (call.param("rows") == 0) return p;
  p.launches.push_back(single_launch(call, c, elementwise_row_geometry(call.param("rows"), call.param("cols"), c)));
  return p;
}

void DequantizeFp8Op::init_inputs(const KernelSpec& /*spec*/, std::span<const TensorInfo> inputs,
                                  std::vector<std::vector<float>>& values, std::mt19937_64& rng) const {
  // q: random finite non-zero codes of the format (subnormals included); scale: positive,
  // 2^[-8, 0] * [1, 2).
  values.resize(inputs.size());
  std::uniform_int_distribution<int> byte(0, 255);
  values[0].resize(static_cast<size_t>(inputs[0].elements()));
  for (float& v : values[0]) {
    do v = fp8_bits_to_float(static_cast<uint8_t>(byte(rng)), inputs[0].dtype);
    while (!std::isfinite(v) || v == 0.0f);
  }
  std::uniform_int_distribution<int> exponent(-8, 0);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  values[1].resize(static_cast<size_t>(inputs[1].elements()));
  for (float& v : values[1]) v = std::ldexp(mantissa(rng), exponent(rng));
}

void DequantizeFp8Op::reference(const KernelSpec& spec, const Scalars&, std::span<const std::vector<float>> inputs,
                                std::span<const int64_t> sample, std::vector<RefOutput>& outputs) const {
  const int64_t rows = spec.param("rows"), cols = spec.param("cols"), g = spec.param("granularity");
  outputs.assign(1, {});
  RefOutput& x = outputs[0];
  x.rows.assign(sample.begin(), sample.end());
  std::vector<int64_t> rs = x.rows;
  if (rs.empty())
    for (int64_t r = 0; r < rows; ++r) rs.push_back(r);
  for (int64_t r : rs)
    for (int64_t c = 0; c < cols; ++c) {
      const float v = inputs[0][static_cast<size_t>(r * cols + c)] *
                      inputs[1][static_cast<size_t>(fp8_scale_index(g, cols, r, c))];  // fp32 product
      x.values.push_back(v);
    }
}

std::vector<TestSpec> DequantizeFp8Op::test_specs(const TargetInfo& target) const {
  const auto [e4, e5] = fp8_test_formats(target);
  std::vector<TestSpec> out;
  auto add = [&](DType fp8, DType to, int64_t rows, int64_t cols, int64_t g, std::string_view why) {
    out.push_back({{"dequantize_fp8", fp8, to, {{"rows", rows}, {"cols", cols}, {"granularity", g}}}, why});
  };
  const DType bf16 = DType::bf16, f16 = DType::f16, f32 = DType::f32;
  add(e4, bf16, 3, 300, kTensorwise, "tensorwise, cols 300 (scalar variant)");
  add(e5, bf16, 3, 4096, kRowwise, "rowwise, cols 4096, vector stores");
  add(e4, bf16, 130, 256, kBlock1x128, "block1x128, rows 130");
  add(e5, bf16, 130, 300, kBlock128x128, "block128x128, tails in rows and cols");
  add(e5, f16, 1, 1, kTensorwise, "tensorwise, 1x1");
  add(e4, f16, 3, 7, kRowwise, "rowwise, cols 7");
  add(e5, f16, 1, 129, kBlock1x128, "block1x128, cols 129");
  add(e4, f16, 130, 128, kBlock128x128, "block128x128, rows 130");
  add(e4, f32, 130, 128, kTensorwise, "tensorwise fp32");
  add(e5, f32, 1, 300, kRowwise, "rowwise fp32, cols 300");
  add(e4, f32, 3, 300, kBlock1x128, "block1x128 fp32, cols 300");
  add(e5, f32, 130, 256, kBlock128x128, "block128x128 fp32");
  add(e4, bf16, 0, 128, kBlock1x128, "0 rows: a no-op");
  return out;
}

}  // namespace kiln
