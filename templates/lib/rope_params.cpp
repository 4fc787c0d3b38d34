#include "templates/lib/rope_params.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <utility>

namespace kiln::rope_params {
namespace {
constexpr std::string_view kPositions[] = {"cu_seqlens", "tensor"};
constexpr std::string_view kCosSin[] = {"computed", "cache"};
constexpr std::string_view kScaling[] = {"none", "llama3"};
constexpr int64_t kMaxInt = (int64_t{1} << 31) - 1;

const ParamInfo kParams[] = {
    {"tokens", "tokens (rows of q and k); a runtime argument, not baked; 0 is a no-op", false, false, 0, kMaxInt},
    {"heads", "Hq: query heads", true, false, 1, 1024},
    {"kv_heads", "Hkv: key heads", true, false, 1, 1024},
    {"head_dim", "D: elements per head", true, false, 2, 1024},
    {"rotary_dim", "R: leading elements of a head that rotate (even, <= head_dim; the rest is copied); 0: head_dim",
     true, false, 0, 1024, {}, 0},
    {"interleaved", "0: rotate-half (GPT-NeoX, Llama: pairs i, i + R/2); 1: interleaved (GPT-J: pairs 2i, 2i + 1)", true,
     true, 0, 1, {}, 0},
    {"positions", "where positions come from: cu_seqlens (int32 [batch + 1]; they restart at each packed sequence) "
                  "or tensor (int32 [tokens])",
     true, false, 0, 1, kPositions, 0},
    {"batch", "sequences in cu_seqlens (runtime; with positions = cu_seqlens)", false, false, 1, kMaxInt, {}, 1},
    {"cos_sin", "computed (in the kernel, from rope_theta and scaling) or cache (fp32 cos and sin [max_pos, R/2])", true,
     false, 0, 1, kCosSin, 0},
    {"rope_theta", "base of the frequencies, theta^(-2i/R) (with cos_sin = computed)", true, false, 1, kMaxInt, {}, 10000},
    {"scaling", "frequency scaling (with cos_sin = computed): none, or llama3 (Llama-3.1: factor 8, low_freq_factor 1, "
                "high_freq_factor 4, original context 8192)",
     true, false, 0, 1, kScaling, 0},
    {"max_pos", "rows of the cos/sin caches (runtime; with cos_sin = cache); positions are clamped to [0, max_pos - 1]",
     false, false, 1, kMaxInt, {}, 8192},
    {"inplace", "1: the outputs are written over the inputs (pass the same buffers)", true, true, 0, 1, {}, 0},
    {"q_row_stride", "elements between the starts of consecutive tokens' rows of q and q_out (runtime; a view of a "
                     "fused qkv buffer, rotated in place); 0: contiguous, heads * head_dim",
     false, false, 0, kMaxInt, {}, 0},
    {"k_row_stride", "elements between the starts of consecutive tokens' rows of k and k_out (runtime; in place); "
                     "0: contiguous, kv_heads * head_dim",
     false, false, 0, kMaxInt, {}, 0},
};
const DType kDTypes[] = {DType::bf16, DType::f16, DType::f32};

// 16-byte accesses where every access of a head stays whole: D a multiple of the vector, and the
// second half (rotate-half) or the pass-through (interleaved) starting on a vector.
int64_t vector_width(const KernelSpec& spec) {
  const int64_t vec = 16 / static_cast<int64_t>(dtype_size(spec.dtype));
  const int64_t D = spec.param("head_dim"), R = rotary(spec);
  const bool whole = D % vec == 0 && (spec.param("interleaved") ? R % vec == 0 : (R / 2) % vec == 0);
  return whole ? vec : 1;
}

KernelConfig config_for(const KernelSpec& spec, int64_t vec) {
  const bool interleaved = spec.param("interleaved") != 0;
  const int64_t pv = interleaved && vec > 1 ? vec / 2 : vec;  // pairs per chunk
  const int64_t chunks = rotary(spec) / 2 / pv;
  const int64_t heads = spec.param("heads") + spec.param("kv_heads");
  const int64_t cth = std::min<int64_t>(chunks, 256);
  int64_t hth = std::clamp<int64_t>(256 / cth, 1, heads);
  hth = ceil_div(heads, ceil_div(heads, hth));  // the same number of heads for every thread
  return {{"VEC", vec}, {"PV", pv}, {"CTH", cth}, {"THREADS", cth * hth}};
}
}  // namespace

std::span<const ParamInfo> params() { return kParams; }
std::span<const DType> dtypes() { return kDTypes; }

int64_t rotary(const KernelSpec& s) { return s.param("rotary_dim") ? s.param("rotary_dim") : s.param("head_dim"); }
// Row strides of q (and q_out) and k (and k_out) in elements: the parameter, or the contiguous row.
int64_t q_stride(const KernelSpec& s) {
  return s.param("q_row_stride") ? s.param("q_row_stride") : s.param("heads") * s.param("head_dim");
}
int64_t k_stride(const KernelSpec& s) {
  return s.param("k_row_stride") ? s.param("k_row_stride") : s.param("kv_heads") * s.param("head_dim");
}
// With a row stride, the tensor is the memory the kernel spans, [tokens, stride]: the check path
// allocates it, and the reference keeps the columns past heads * head_dim (which the kernel does
// not touch) at their input values.
std::vector<int64_t> q_shape(const KernelSpec& s) {
  if (s.param("q_row_stride")) return {s.param("tokens"), s.param("q_row_stride")};
  return {s.param("tokens"), s.param("heads"), s.param("head_dim")};
}
std::vector<int64_t> k_shape(const KernelSpec& s) {
  if (s.param("k_row_stride")) return {s.param("tokens"), s.param("k_row_stride")};
  return {s.param("tokens"), s.param("kv_heads"), s.param("head_dim")};
}
std::vector<int64_t> cu_shape(const KernelSpec& s) { return {s.param("batch") + 1}; }
std::vector<int64_t> pos_shape(const KernelSpec& s) { return {s.param("tokens")}; }
std::vector<int64_t> cache_shape(const KernelSpec& s) { return {s.param("max_pos"), rotary(s) / 2}; }
bool from_cu_seqlens(const KernelSpec& s) { return s.param("positions") == 0; }
bool from_tensor(const KernelSpec& s) { return s.param("positions") == 1; }
bool from_cache(const KernelSpec& s) { return s.param("cos_sin") == 1; }
bool in_place(const KernelSpec& s) { return s.param("inplace") != 0; }

// As transformers' RotaryEmbedding (rope_init_fn, modeling_rope_utils.py): every step in fp32.
// std::pow(float, float) is computed in float, like torch.pow on an fp32 tensor (the two can
// differ in the last bit; the kernel and the reference use these values).
std::vector<float> inv_freq(int64_t rotary_dim, int64_t theta, int64_t scaling) {
  std::vector<float> out;
  const float dim = static_cast<float>(rotary_dim);
  for (int64_t i = 0; i < rotary_dim; i += 2) {
    const float exponent = static_cast<float>(i) / dim;
    float f = 1.0f / std::pow(static_cast<float>(theta), exponent);
    if (scaling == 1) {  // _compute_llama3_parameters
      const float factor = 8.0f, low_freq_factor = 1.0f, high_freq_factor = 4.0f, old_context = 8192.0f;
      const float low_freq_wavelen = old_context / low_freq_factor, high_freq_wavelen = old_context / high_freq_factor;
      const float wavelen = static_cast<float>(2 * M_PI) / f;
      const float llama = wavelen > low_freq_wavelen ? f / factor : f;
      const float smooth = (old_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
      const float smoothed = (1.0f - smooth) * llama / factor + smooth * llama;
      const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
      f = medium ? smoothed : llama;
    }
    out.push_back(f);
  }
  return out;
}

Result<void> validate_rules(std::string_view op, const KernelSpec& spec, const KernelSpec& s) {
  const int64_t D = s.param("head_dim"), R = rotary(s);
  if (R > D)
    return make_error(Errc::invalid_argument,
                      fmt::format("{}: rotary_dim = {} exceeds head_dim = {}; use rotary_dim <= head_dim (0: all)",
                                  op, R, D));
  if (R % 2 != 0)
    return make_error(Errc::invalid_argument,
                      fmt::format("{}: rotary_dim = {} must be even (pairs rotate){}", op, R,
                                  s.param("rotary_dim") ? "" : "; head_dim is odd, so give an even rotary_dim"));
  if (s.param("cos_sin") == 1 && (spec.params.count("scaling") || spec.params.count("rope_theta")))
    return make_error(Errc::invalid_argument,
                      fmt::format("{}: rope_theta and scaling apply to cos_sin = computed; with cos_sin = cache the "
                                  "tables hold the angles: leave them out",
                                  op));
  const int64_t vec = vector_width(s);
  for (const auto& [param, heads_param] : {std::pair{"q_row_stride", "heads"}, std::pair{"k_row_stride", "kv_heads"}}) {
    const int64_t stride = s.param(param), row = s.param(heads_param) * D;
    if (stride == 0) continue;
    if (stride < row)
      return make_error(Errc::invalid_argument,
                        fmt::format("{}: {} = {} is less than {} * head_dim = {}: rows would overlap; give at least "
                                    "{} (0: contiguous)",
                                    op, param, stride, heads_param, row, row));
    if (!s.param("inplace"))
      return make_error(Errc::invalid_argument,
                        fmt::format("{}: {} = {} needs inplace = 1: a strided view is rotated in place (the outputs "
                                    "take the inputs' strides); out of place, leave the strides 0",
                                    op, param, stride));
    if (stride % vec != 0)
      return make_error(Errc::invalid_argument,
                        fmt::format("{}: {} = {} is not a multiple of {} elements (16 bytes), which the 16-byte "
                                    "kernel of this head_dim and rotary_dim needs at every row; give a multiple of {}",
                                    op, param, stride, vec, vec));
  }
  return ok();
}

std::vector<KernelConfig> variants(const KernelSpec& s) {
  std::vector<KernelConfig> out = {config_for(s, vector_width(s))};
  if (out.front().at("VEC") > 1) out.push_back(config_for(s, 1));
  return out;
}

std::vector<uint32_t> base_alignment(std::vector<uint32_t> a) {
  const size_t extra = a.size() - 4;  // cu_seqlens | positions, [cos, sin]
  for (size_t i = 2; i < 2 + extra; ++i) a[i] = 1;
  return a;
}

std::string specialize(const KernelSpec& spec, const KernelConfig& c, int sign) {
  std::string s = fmt::format(
      "constexpr int HEADS = {}, KV_HEADS = {}, HEAD_DIM = {}, ROTARY_DIM = {};\n"
      "#define INTERLEAVED {}\n#define POS_TENSOR {}\n#define COS_SIN_CACHE {}\n#define INPLACE {}\n"
      "constexpr int SIGN = {};\nconstexpr int THREADS = {}, CTH = {}, VEC = {}, PV = {};\n"
      "typedef {} in_t;\ntypedef {} out_t;\n",
      spec.param("heads"), spec.param("kv_heads"), spec.param("head_dim"), rotary(spec), spec.param("interleaved"),
      spec.param("positions"), spec.param("cos_sin"), spec.param("inplace"), sign, c.at("THREADS"), c.at("CTH"),
      c.at("VEC"), c.at("PV"), device_type_name(spec.dtype), device_type_name(spec.out_dtype));
  if (spec.param("cos_sin") == 0) {
    // The fp32 inverse frequencies, from the host: the kernel and the reference use the same
    // values. Stores of immediates (into LDS), not a constant table: a table in the code object
    // is addressed with s_getpc_b64 on AMD, which the CDNA emulator does not run.
    s += "KILN_DEVICE void rope_fill_inv_freq(float* f) {\n";
    const std::vector<float> freq = inv_freq(rotary(spec), spec.param("rope_theta"), spec.param("scaling"));
    for (size_t i = 0; i < freq.size(); ++i) s += fmt::format("  f[{}] = {:.9e}f;\n", i, freq[i]);
    s += "}\n";
  }
  return s;
}

LaunchGeometry geometry(const KernelSpec& call, const KernelConfig& c) {
  LaunchGeometry g;
  g.grid.x = static_cast<uint32_t>(call.param("tokens"));
  g.block.x = static_cast<uint32_t>(c.at("THREADS"));
  return g;
}

Plan plan(const KernelSpec& call, Launch l) {
  Plan p;
  l.args[l.args.size() - 2] = KernelArg::i32(q_stride(call));  // 0 resolved to the contiguous row
  l.args[l.args.size() - 1] = KernelArg::i32(k_stride(call));
  p.launches.push_back(std::move(l));
  return p;
}

void init_positions(const KernelSpec& spec, std::vector<std::vector<float>>& values, std::mt19937_64& rng) {
  const int64_t tokens = spec.param("tokens");
  std::vector<float>& pos = values[2];
  if (spec.param("positions") == 0) {
    // Sequence starts at random cut points: 0 = c0 <= c1 <= ... <= c_batch = tokens (empty
    // sequences allowed).
    const int64_t batch = spec.param("batch");
    std::uniform_int_distribution<int64_t> cut(0, tokens);
    std::vector<int64_t> cuts(static_cast<size_t>(batch - 1));
    for (int64_t& x : cuts) x = cut(rng);
    std::sort(cuts.begin(), cuts.end());
    pos[0] = 0;
    for (size_t i = 0; i < cuts.size(); ++i) pos[i + 1] = static_cast<float>(cuts[i]);
    pos[static_cast<size_t>(batch)] = static_cast<float>(tokens);
  } else {
    // Any position up to Llama-3.1's 131072-token context (the cache: a few out of its range,
    // which clamp).
    const int64_t top = spec.param("cos_sin") == 1 ? spec.param("max_pos") + 2 : 131071;
    std::uniform_int_distribution<int64_t> any(0, top);
    for (float& x : pos) x = static_cast<float>(any(rng));
  }
}

void reference(const KernelSpec& spec, int sign, std::span<const std::vector<float>> in,
               std::span<const int64_t> sample, std::vector<RefOutput>& outputs) {
  const int64_t tokens = spec.param("tokens"), Hq = spec.param("heads"), Hkv = spec.param("kv_heads");
  const int64_t D = spec.param("head_dim"), R = rotary(spec), half = R / 2;
  const bool interleaved = spec.param("interleaved") != 0, cache = spec.param("cos_sin") == 1;
  const std::vector<float> freq = cache ? std::vector<float>{} : inv_freq(R, spec.param("rope_theta"), spec.param("scaling"));
  const std::vector<float>& pos_in = in[2];
  outputs.assign(2, {});
  std::vector<int64_t> rows(sample.begin(), sample.end());
  if (rows.empty())
    for (int64_t t = 0; t < tokens; ++t) rows.push_back(t);
  for (int64_t t : rows) {
    int64_t pos;
    if (spec.param("positions") == 1) {
      pos = static_cast<int64_t>(pos_in[static_cast<size_t>(t)]);
    } else {
      int64_t s = 0;  // the last sequence that starts at or before t
      for (int64_t b = 1; b < spec.param("batch"); ++b)
        if (pos_in[static_cast<size_t>(b)] <= t) s = b;
      pos = t - static_cast<int64_t>(pos_in[static_cast<size_t>(s)]);
    }
    if (cache) pos = std::clamp<int64_t>(pos, 0, spec.param("max_pos") - 1);
    std::vector<double> cs(static_cast<size_t>(half)), sn(static_cast<size_t>(half));
    for (int64_t i = 0; i < half; ++i) {
      if (cache) {
        cs[i] = in[3][static_cast<size_t>(pos * half + i)];
        sn[i] = in[4][static_cast<size_t>(pos * half + i)];
      } else {
        const double angle = static_cast<float>(pos) * freq[static_cast<size_t>(i)];  // the fp32 angle
        cs[i] = std::cos(angle);
        sn[i] = std::sin(angle);
      }
      sn[i] *= sign;
    }
    for (int which = 0; which < 2; ++which) {
      const int64_t heads = which == 0 ? Hq : Hkv, stride = which == 0 ? q_stride(spec) : k_stride(spec);
      // The token's row: heads * D elements, then (with a row stride) columns the kernel leaves
      // alone, which keep their input values (the output is the input's buffer: in place).
      const float* row = &in[static_cast<size_t>(which)][static_cast<size_t>(t * stride)];
      std::vector<double> y(row, row + stride);
      for (int64_t h = 0; h < heads; ++h) {
        const float* xr = row + h * D;
        double* yr = &y[static_cast<size_t>(h * D)];
        for (int64_t i = 0; i < half; ++i) {
          const int64_t i1 = interleaved ? 2 * i : i, i2 = interleaved ? 2 * i + 1 : i + half;
          yr[i1] = double(xr[i1]) * cs[i] - double(xr[i2]) * sn[i];
          yr[i2] = double(xr[i2]) * cs[i] + double(xr[i1]) * sn[i];
        }
      }
      outputs[which].values.insert(outputs[which].values.end(), y.begin(), y.end());
    }
  }
  outputs[0].rows = rows;
  outputs[1].rows = rows;
}

std::vector<TestSpec> test_specs(std::string_view op) {
  std::vector<TestSpec> out;
  struct P {
    DType t;
    int64_t tokens, hq, hkv, d, r, interleaved, positions, batch, cos_sin, theta, scaling, max_pos, inplace;
    std::string_view why;
    int64_t q_row_stride = 0, k_row_stride = 0;
  };
  const P cases[] = {
      {DType::bf16, 17, 4, 2, 64, 0, 0, 0, 3, 0, 10000, 0, 0, 0, "rotate-half, cu_seqlens of 3 sequences, vector"},
      {DType::bf16, 9, 3, 1, 64, 32, 1, 1, 1, 0, 500000, 1, 0, 0, "interleaved, partial, positions to 131071, llama3"},
      {DType::f16, 7, 2, 2, 80, 40, 0, 1, 1, 1, 0, 0, 64, 0, "partial rotate-half (scalar), cos/sin cache, clamped"},
      {DType::f32, 6, 2, 1, 128, 0, 0, 0, 2, 0, 500000, 1, 0, 0, "fp32, llama3, cu_seqlens"},
      {DType::f32, 5, 2, 1, 64, 0, 1, 1, 1, 0, 10000, 0, 0, 0, "fp32, positions to 131071: angles to 131071 rad"},
      {DType::f16, 5, 3, 1, 6, 4, 1, 0, 2, 0, 10000, 0, 0, 0, "head_dim 6, rotary 4, interleaved (scalar)"},
      {DType::bf16, 11, 2, 1, 64, 0, 0, 0, 4, 0, 10000, 0, 0, 1, "in place, rotate-half"},
      {DType::f32, 6, 2, 2, 32, 16, 1, 1, 1, 1, 0, 0, 40, 1, "in place, interleaved partial, cache"},
      {DType::bf16, 0, 4, 2, 64, 0, 0, 0, 1, 0, 10000, 0, 0, 0, "0 tokens: a no-op"},
      {DType::bf16, 3, 32, 8, 128, 0, 0, 1, 1, 0, 500000, 1, 0, 0, "Llama-3.1-8B heads, positions tensor"},
      // Views of a fused qkv [tokens, (Hq + 2 Hkv) D], rotated in place: rows (4 + 2*2) * 64 apart.
      {DType::bf16, 5, 4, 2, 64, 0, 0, 0, 2, 0, 10000, 0, 0, 1,
       "in place, q and k rows of a fused qkv (stride 512), vector", 512, 512},
      {DType::f16, 4, 2, 1, 80, 40, 0, 1, 1, 0, 500000, 1, 0, 1,
       "in place, odd row strides 163 and 81, partial rotate-half (scalar)", 163, 81},
      {DType::f32, 3, 2, 1, 32, 0, 1, 1, 1, 1, 0, 0, 16, 1, "in place, interleaved, cache, k strided (q contiguous)", 0,
       4 * 32},
  };
  for (const P& c : cases) {
    KernelSpec s{std::string(op), c.t, c.t,
                 {{"tokens", c.tokens}, {"heads", c.hq}, {"kv_heads", c.hkv}, {"head_dim", c.d}, {"rotary_dim", c.r},
                  {"interleaved", c.interleaved}, {"positions", c.positions}, {"inplace", c.inplace}}};
    if (c.q_row_stride) s.params["q_row_stride"] = c.q_row_stride;
    if (c.k_row_stride) s.params["k_row_stride"] = c.k_row_stride;
    if (c.positions == 0) s.params["batch"] = c.batch;
    if (c.cos_sin == 1) {
      s.params["cos_sin"] = 1;
      s.params["max_pos"] = c.max_pos;
    } else {
      s.params["rope_theta"] = c.theta;
      s.params["scaling"] = c.scaling;
    }
    out.push_back({std::move(s), c.why});
  }
  return out;
}

KernelSpec without_strides(const KernelSpec& spec) {
  KernelSpec contiguous = spec;
  contiguous.params.erase("q_row_stride");
  contiguous.params.erase("k_row_stride");
  return contiguous;
}

std::string short_form(const KernelSpec& s) {
  return fmt::format("{}x[{}+{}]x{} r{} {}", s.param("tokens"), s.param("heads"), s.param("kv_heads"),
                     s.param("head_dim"), rotary(s), s.param("interleaved") ? "interleaved" : "rotate-half");
}

}  // namespace kiln::rope_params

namespace kiln {
namespace rp = rope_params;

Result<void> RopeOpBase::validate_rules(const KernelSpec& spec, const TargetInfo&) const {
  return rp::validate_rules(name(), spec, with_defaults(spec));
}

std::vector<KernelConfig> RopeOpBase::variants(const KernelSpec& spec, const TargetInfo&) const {
  return rp::variants(with_defaults(spec));
}

std::vector<uint32_t> RopeOpBase::base_alignment(const KernelSpec& spec, const KernelConfig& config) const {
  return rp::base_alignment(vector_variant_alignment(config, tensors(spec).size()));
}

std::string RopeOpBase::specialize(const KernelSpec& spec, const KernelConfig& config) const {
  return rp::specialize(with_defaults(spec), config, sign());
}

Plan RopeOpBase::plan(const KernelSpec& call, const KernelConfig& config) const {
  if (call.param("tokens") == 0) return {};
  Launch l = single_launch(call, config, rp::geometry(call, config));
  l.kernel = std::string(kernel_name(config));
  return rp::plan(call, std::move(l));
}

void RopeOpBase::init_inputs(const KernelSpec& spec, std::span<const TensorInfo> inputs,
                             std::vector<std::vector<float>>& values, std::mt19937_64& rng) const {
  OpTemplate::init_inputs(spec, inputs, values, rng);
  rp::init_positions(spec, values, rng);
}

void RopeOpBase::reference(const KernelSpec& spec, const Scalars&, std::span<const std::vector<float>> in,
                           std::span<const int64_t> sample, std::vector<RefOutput>& outputs) const {
  rp::reference(spec, sign(), in, sample, outputs);
}

std::vector<TestSpec> RopeOpBase::test_specs(const TargetInfo&) const { return rp::test_specs(name()); }

double RopeOpBase::bytes(const KernelSpec& spec) const { return OpTemplate::bytes(rp::without_strides(spec)); }

std::string RopeOpBase::short_form(const KernelSpec& spec) const { return rp::short_form(with_defaults(spec)); }

}  // namespace kiln
