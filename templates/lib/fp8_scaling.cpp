#include "templates/lib/fp8_scaling.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>

#include "support/embedded.h"
#include "templates/op_template.h"

namespace kiln {
namespace {
constexpr std::string_view kGranularities[] = {"tensorwise", "rowwise", "block1x128", "block128x128", "mx"};
constexpr std::string_view kGemmScalings[] = {"tensorwise", "rowwise", "blockwise", "block1x128", "mx"};
constexpr std::string_view kScalings[] = {"current", "delayed"};
constexpr std::string_view kFp8Outs[] = {"none", "fp8_e4m3", "fp8_e5m2", "fp8_e4m3fnuz", "fp8_e5m2fnuz"};
constexpr DType kFp8OutDTypes[] = {DType::e4m3, DType::e4m3, DType::e5m2, DType::e4m3fnuz, DType::e5m2fnuz};
constexpr std::string_view kFusedGranularities[] = {"tensorwise", "rowwise", "block1x128"};
}  // namespace

std::span<const std::string_view> fp8_out_names() { return kFp8Outs; }
DType fp8_out_dtype(const KernelSpec& spec) { return kFp8OutDTypes[static_cast<size_t>(spec.param("fp8_out"))]; }
int64_t fp8_out_value(DType fp8) {
  for (size_t i = 1; i < std::size(kFp8OutDTypes); ++i)
    if (kFp8OutDTypes[i] == fp8) return static_cast<int64_t>(i);
  return 0;
}
std::span<const std::string_view> fp8_fused_granularity_names() { return kFusedGranularities; }
bool fp8_fused(const KernelSpec& spec) { return spec.param("fp8_out") != 0; }
bool fp8_fused_delayed(const KernelSpec& spec) {
  return spec.param("fp8_out") != 0 && spec.param("fp8_granularity") == kTensorwise;
}

KernelConfig fp8_row_config(int64_t columns, int64_t vec, const TargetInfo& target) {
  const int64_t nvec = ceil_div(columns, vec);
  const int64_t unit = vec == 1 ? std::max<int64_t>(128, target.wave_size) : target.wave_size;
  const int64_t threads = std::clamp<int64_t>(round_up(ceil_div(nvec, 4), unit), unit, 1024);
  return {{"FP8", 1}, {"THREADS", threads}, {"VEC", vec}, {"ITEMS", ceil_div(nvec, threads)}};
}

std::vector<int64_t> fp8_fused_reference_rows(const KernelSpec& spec, std::span<const int64_t> sampled) {
  if (!sampled.empty() && !fp8_fused_delayed(spec)) return {sampled.begin(), sampled.end()};
  std::vector<int64_t> rows;
  for (int64_t r = 0; r < spec.param("rows"); ++r) rows.push_back(r);
  return rows;
}

void fp8_fused_reference(const KernelSpec& spec, int64_t cols, std::span<const std::vector<float>> inputs,
                         std::vector<RefOutput>& outputs) {
  if (!fp8_fused(spec)) return;
  // The tensor as the op stores it (copied: the outputs appended below may move outputs[0]).
  const std::vector<int64_t> rows = outputs[0].rows;
  std::vector<double> y(outputs[0].values.size());
  for (size_t i = 0; i < y.size(); ++i)
    y[i] = round_to_dtype(static_cast<float>(outputs[0].values[i]), spec.out_dtype);
  const std::span<const float> history =
      fp8_fused_delayed(spec) ? std::span<const float>(inputs.back()) : std::span<const float>{};
  const int64_t g = spec.param("fp8_granularity");
  const DType fp8 = fp8_out_dtype(spec);
  const float fp8_max_f = static_cast<float>(fp8_max(fp8));
  const int64_t per_row = g == kBlock1x128 ? ceil_div(cols, 128) : 1;
  const float delayed = g == kTensorwise ? fp8_delayed_scale(history, spec.param("margin"), fp8) : 1.0f;
  RefOutput q, scale;
  q.rows.assign(rows.begin(), rows.end());
  if (g != kTensorwise) scale.rows.assign(rows.begin(), rows.end());
  float amax_all = 0.0f;
  std::vector<float> amax(static_cast<size_t>(per_row)), inv(amax.size());
  for (size_t r = 0; r < rows.size(); ++r) {
    const double* yr = &y[r * static_cast<size_t>(cols)];
    std::fill(amax.begin(), amax.end(), 0.0f);
    for (int64_t c = 0; c < cols; ++c) {
      float& m = amax[static_cast<size_t>(g == kBlock1x128 ? c / 128 : 0)];
      m = std::fmax(m, std::fabs(static_cast<float>(yr[c])));
      amax_all = std::fmax(amax_all, std::fabs(static_cast<float>(yr[c])));
    }
    for (size_t b = 0; b < amax.size(); ++b) {
      const float s = g == kTensorwise ? delayed : amax[b] == 0.0f ? 1.0f : amax[b] / fp8_max_f;
      inv[b] = 1.0f / s;
      if (g != kTensorwise) scale.values.push_back(s);
    }
    for (int64_t c = 0; c < cols; ++c) {
      const float v = static_cast<float>(yr[c]) * inv[static_cast<size_t>(g == kBlock1x128 ? c / 128 : 0)];
      q.values.push_back(fp8_bits_to_float(float_to_fp8_bits(v, fp8), fp8));
    }
  }
  if (g == kTensorwise) scale.values.push_back(delayed);
  outputs.push_back(std::move(q));
  outputs.push_back(std::move(scale));
  if (g == kTensorwise) outputs.push_back({{}, fp8_history_pushed(history, amax_all), {}});
}

namespace {
bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}
// The fused outputs of a row op are named after the tensor they quantize: y_fp8 and y_scale
// (rmsnorm, swiglu), dx_fp8 and dx_scale (rmsnorm_bwd, swiglu_bwd).
bool is_fused_scale(std::string_view name) { return ends_with(name, "_scale"); }
}  // namespace

Gate fp8_fused_gate(const KernelSpec& spec, const TensorInfo& output) {
  if (!fp8_fused(spec)) return Gate::for_dtype(output.dtype);
  if (ends_with(output.name, "_fp8")) {
    Gate gate = Gate::for_dtype(fp8_out_dtype(spec));
    gate.max_code_diff = 1;
    return gate;
  }
  if (is_fused_scale(output.name) && fp8_fused_delayed(spec)) {  // bitwise
    Gate gate;
    gate.atol = gate.rtol = 0;
    gate.max_rel_fro = -1;
    return gate;
  }
  if (is_fused_scale(output.name) || output.name == "amax_history_out") return Gate::for_dtype(spec.out_dtype);
  return Gate::for_dtype(output.dtype);
}

std::span<const std::string_view> fp8_scaling_names() { return kScalings; }

std::vector<int64_t> fp8_history_shape(const KernelSpec& spec) { return {spec.param("history_len")}; }

float fp8_delayed_scale(std::span<const float> history, int64_t margin, DType fp8) {
  float amax = 0.0f;
  for (float h : history) amax = std::fmax(amax, h);
  if (!(amax > 0.0f) || std::isinf(amax)) return 1.0f;
  return amax / static_cast<float>(fp8_max(fp8)) * std::ldexp(1.0f, static_cast<int>(margin));
}

std::vector<double> fp8_history_pushed(std::span<const float> history, float amax) {
  std::vector<double> out(history.size());
  if (out.empty()) return out;
  out[0] = amax;
  for (size_t i = 1; i < out.size(); ++i) out[i] = history[i - 1];
  return out;
}

void fp8_init_history(float amax, std::vector<float>& history, std::mt19937_64& rng) {
  if (!(amax > 0.0f)) amax = 1.0f;  // no values (0 rows): a history all the same
  std::uniform_real_distribution<float> share(0.25f, 0.9f);
  for (float& h : history) h = amax * share(rng);
  if (history.size() > 2) history[2] = amax * 0x1p-20f;  // a call with almost nothing in it
}

Launch fp8_history_launch(int64_t n_partials, uint32_t history_tensor, uint32_t scale_tensor, int64_t history_len,
                          int64_t margin) {
  Launch l;
  l.kernel = "kiln_fp8_amax_history";
  l.geometry.block.x = static_cast<uint32_t>(kFp8MaxHistory);
  l.args = {KernelArg::workspace(0), KernelArg::i32(n_partials), KernelArg::tensor(history_tensor),
            KernelArg::i32(history_len),  KernelArg::i32(margin),     KernelArg::tensor(scale_tensor)};
  return l;
}

std::span<const std::string_view> fp8_granularity_names() { return std::span(kGranularities).first(4); }
std::span<const std::string_view> fp8_granularity_names_with_mx() { return kGranularities; }

int fp8_emax(DType fp8) {
  int e = 0;
  std::frexp(fp8_max(fp8), &e);  // fp8_max = m 2^e, m in [0.5, 1)
  return e - 1;
}

uint8_t fp8_mx_scale_bits(float amax, DType fp8) {
  if (amax == 0.0f) return 127;
  uint32_t bits = 0;
  std::memcpy(&bits, &amax, 4);
  const int field = static_cast<int>((bits >> 23) & 0xFF);  // floor(log2(amax)) + 127 for a normal amax
  if (field == 0xFF) return 0xFF;
  return static_cast<uint8_t>(std::clamp(field - fp8_emax(fp8), 0, 254));
}

std::vector<int64_t> fp8_scale_shape(const KernelSpec& s) {
  return fp8_scale_shape(s.param("granularity"), s.param("rows"), s.param("cols"));
}

std::vector<int64_t> fp8_scale_shape(int64_t granularity, int64_t rows, int64_t cols) {
  switch (granularity) {
    case kTensorwise: return {1};
    case kRowwise: return {rows};
    case kBlock1x128: return {rows, ceil_div(cols, 128)};
    case kMx: return {rows, ceil_div(cols, kMxBlock)};
    default: return {ceil_div(rows, 128), ceil_div(cols, 128)};
  }
}

int64_t fp8_scale_index(int64_t granularity, int64_t cols, int64_t r, int64_t c) {
  switch (granularity) {
    case kTensorwise: return 0;
    case kRowwise: return r;
    case kBlock1x128: return r * ceil_div(cols, 128) + c / 128;
    case kMx: return r * ceil_div(cols, kMxBlock) + c / kMxBlock;
    default: return r / 128 * ceil_div(cols, 128) + c / 128;
  }
}

std::span<const std::string_view> fp8_gemm_scaling_names() { return kGemmScalings; }

Fp8Granularity fp8_gemm_operand_granularity(int64_t scaling, bool operand_b) {
  switch (scaling) {
    case kGemmTensorwise: return kTensorwise;
    case kGemmRowwise: return kRowwise;
    case kGemmBlockwise: return operand_b ? kBlock128x128 : kBlock1x128;
    case kGemmMx: return kMx;
    default: return kBlock1x128;
  }
}

std::pair<DType, DType> fp8_test_formats(const TargetInfo& target) {
  return {fp8_for_target(DType::e4m3, target), fp8_for_target(DType::e5m2, target)};
}

std::string fp8_fused_defines(const KernelSpec& spec, const KernelConfig& config) {
  if (!config.count("FP8")) return "";
  return fmt::format("#define FP8_GRAN {}\ntypedef {} fp8_t;\n", spec.param("fp8_granularity"),
                     device_type_name(fp8_out_dtype(spec)));
}

std::vector<uint32_t> fp8_fused_alignment(const KernelConfig& config, std::span<const TensorInfo> tensors) {
  std::vector<uint32_t> out = vector_variant_alignment(config, tensors.size());
  if (!config.count("FP8")) return out;
  for (size_t i = 0; i < tensors.size(); ++i)
    if (is_fused_scale(tensors[i].name) || tensors[i].name == "amax_history" || tensors[i].name == "amax_history_out")
      out[i] = 1;
  return out;
}

std::string_view fp8_fused_device_template(const Fp8FusedRowOp& op, const KernelConfig& config) {
  return embedded_file(config.count("FP8") ? op.fp8_device_template : op.device_template);
}

std::string_view fp8_fused_kernel_name(const Fp8FusedRowOp& op, const KernelConfig& config) {
  return config.count("FP8") ? op.fp8_kernel : op.kernel;
}

Result<void> fp8_fused_validate(const Fp8FusedRowOp& op, const KernelSpec& spec) {
  if (!fp8_fused(spec) && spec.param("fp8_granularity") != kRowwise)
    return make_error(Errc::invalid_argument, fmt::format("{}: fp8_granularity applies to the fp8 output: set fp8_out "
                                                          "(an fp8 dtype of the target) or leave fp8_granularity out",
                                                          op.name));
  return ok();
}

void fp8_fused_init_history(const Fp8FusedRowOp& op, const KernelSpec& spec, std::vector<std::vector<float>>& values,
                            std::mt19937_64& rng) {
  if (fp8_fused_delayed(spec)) fp8_init_history(op.test_amax, values.back(), rng);
}

void fp8_fused_delayed_args(const KernelSpec& call, uint32_t history, std::vector<KernelArg>& args) {
  if (!fp8_fused_delayed(call)) return;
  args.insert(args.end(), {KernelArg::tensor(history), KernelArg::workspace(0),
                           KernelArg::i32(call.param("history_len")), KernelArg::i32(call.param("margin"))});
}

void fp8_fused_delayed_push(const KernelSpec& call, int64_t rows, uint32_t history, uint32_t scale, Plan& plan) {
  if (!fp8_fused_delayed(call)) return;
  plan.launches.push_back(fp8_history_launch(rows, history, scale, call.param("history_len"), call.param("margin")));
  plan.workspace_bytes =
      std::max(plan.workspace_bytes, static_cast<uint64_t>(std::max<int64_t>(rows, 1)) * sizeof(float));
}

}  // namespace kiln
