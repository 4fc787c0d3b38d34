// The fp8 blockwise backward GEMMs of an MoE layer run as a caller runs them (DeepSeek-V3's recipe,
// docs/grouped-gemm.md "fp8 dgrad"): quantize_fp8 makes the operands from bf16 tensors, then
// grouped_gemm multiplies them. Shared by the emulator tests (gfx942, gfx950) and the GPU tests
// (sm_90a); the CPU test (test_gemm_fp8) runs the same recipes on the ops' references.
//
// dgrad (m-grouped), dx_g [tokens_g, K] = dy_g [tokens_g, N] W_g [N, K]:
//   quantize_fp8 block1x128 (dy, rows tokens, cols N)                  -> a = dy fp8, sa [tokens, N/128]
//   quantize_fp8 block128x128 only_qt batch G (W, rows N, cols K)      -> b = W^T [G, K, N], sb [G, K/128, N/128]
//   grouped_gemm nt, groups G, N = K, K = N (offsets from the router)  -> c = dx [tokens, K]
// The check: c against the fp64 product of the dequantized operands (the op's gate, 40 dB) and
// against the fp64 product of the bf16 dy and W (BENCHMARKS.md's e4m3 gate, 25 dB).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kiln/kiln.h"
#include "runtime/device_tensors.h"
#include "templates/lib/fp8_scaling.h"
#include "templates/registry.h"

namespace kiln::testing {

/// 10 log10(|ref|^2 / |ref - got|^2) over every element.
inline double snr_db(const std::vector<double>& ref, const std::vector<double>& got) {
  double signal = 0, noise = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    signal += ref[i] * ref[i];
    const double d = ref[i] - (i < got.size() ? got[i] : NAN);
    noise += std::isnan(d) ? INFINITY : d * d;
  }
  return noise == 0 ? INFINITY : 10 * std::log10(signal / noise);
}

/// The three specs of the fp8 dgrad of an MoE layer with G experts, W_g [N, K], on `fp8` (e4m3
/// in the target's encoding), dx in `out`.
struct Fp8DgradSpecs {
  KernelSpec quantize_dy, quantize_w, gemm;
};
inline Fp8DgradSpecs fp8_dgrad_specs(int64_t G, int64_t tokens, int64_t N, int64_t K, DType fp8, DType out) {
  return {{"quantize_fp8", DType::bf16, fp8, {{"rows", tokens}, {"cols", N}, {"granularity", kBlock1x128}}},
          {"quantize_fp8", DType::bf16, fp8,
           {{"rows", N}, {"cols", K}, {"granularity", kBlock128x128}, {"transpose", 1}, {"only_qt", 1}, {"batch", G}}},
          {"grouped_gemm", fp8, out, {{"mode", 0}, {"groups", G}, {"tokens", tokens}, {"N", K}, {"K", N}}}};
}

struct Fp8RecipeResult {
  double snr_dequantized = 0;  ///< against the fp64 product of the fp8 operands times their scales
  double snr_bf16 = 0;         ///< against the fp64 product of the bf16 tensors
  std::string error;           ///< not empty: a step failed
};

/// fp64 dx = dy W_g per group, from the bf16 values (dy [tokens, N], w [G, N, K]).
inline std::vector<double> bf16_dgrad(const std::vector<float>& dy, const std::vector<float>& w,
                                      const std::vector<float>& offsets, int64_t G, int64_t N, int64_t K) {
  std::vector<double> dx;
  for (int64_t g = 0; g < G; ++g)
    for (int64_t t = static_cast<int64_t>(offsets[g]); t < static_cast<int64_t>(offsets[g + 1]); ++t)
      for (int64_t k = 0; k < K; ++k) {
        double acc = 0;
        for (int64_t n = 0; n < N; ++n)
          acc += double(dy[static_cast<size_t>(t * N + n)]) * double(w[static_cast<size_t>((g * N + n) * K + k)]);
        dx.push_back(acc);
      }
  return dx;
}

/// A recipe's launch, one op after another on the runtime's stream: the first failure is kept in
/// r.error (later steps still run; their outputs are then not compared).
inline void launch_step(Runtime& rt, Fp8RecipeResult& r, const KernelSpec& spec, std::span<void* const> ptrs) {
  auto l = rt.launch(spec, ptrs);
  if (!l.ok() && r.error.empty()) r.error = to_string(spec) + ": " + l.error().message;
}

/// Tensor i of `d`, copied back from the device and decoded to float (empty if the copy fails).
inline std::vector<float> read_back(Device& device, const DeviceTensors& d, size_t i) {
  const TensorInfo& t = d.tensors()[i];
  std::vector<uint8_t> bytes(static_cast<size_t>(t.bytes()));
  std::vector<float> v;
  if (!device.copy_to_host(bytes.data(), d.pointers()[i], bytes.size()).ok()) return v;
  for (int64_t e = 0; e < t.elements(); ++e)
    v.push_back(static_cast<float>(decode_value(bytes.data(), static_cast<size_t>(e), t.dtype)));
  return v;
}

/// The recipe on a device: each spec's inputs drawn by DeviceTensors (dy and W as quantize_fp8's
/// test inputs: rows and 128-column blocks at different magnitudes; the offsets as grouped_gemm's:
/// uneven, some groups empty), the quantized tensors passed from op to op on the device.
inline Fp8RecipeResult run_fp8_dgrad(Runtime& rt, int64_t G, int64_t tokens, int64_t N, int64_t K, DType fp8, DType out,
                                     uint64_t seed) {
  Fp8RecipeResult r;
  Device& device = *rt.device();
  const Fp8DgradSpecs s = fp8_dgrad_specs(G, tokens, N, K, fp8, out);
  const OpTemplate &quant = **find_op("quantize_fp8"), &grouped = **find_op("grouped_gemm");
  std::mt19937_64 rng(seed);
  auto dy = DeviceTensors::make(device, quant, quant.with_defaults(s.quantize_dy), rng);
  auto w = DeviceTensors::make(device, quant, quant.with_defaults(s.quantize_w), rng);
  auto gg = DeviceTensors::make(device, grouped, grouped.with_defaults(s.gemm), rng);
  if (!dy || !w || !gg) return {0, 0, "allocation failed"};
  auto step = [&](const KernelSpec& spec, std::span<void* const> ptrs) { launch_step(rt, r, spec, ptrs); };
  step(s.quantize_dy, dy->pointers());  // x, q, scale
  step(s.quantize_w, w->pointers());    // x, qt, qt_scale
  // a = dy's q, b = W^T, offsets, sa = dy's scale, sb = W^T's scales, c.
  const std::vector<void*> ptrs = {dy->pointers()[1], w->pointers()[1], gg->pointers()[2],
                                   dy->pointers()[2], w->pointers()[2], gg->pointers()[5]};
  step(s.gemm, ptrs);
  if (auto sync = device.synchronize(nullptr); !sync.ok() && r.error.empty()) r.error = sync.error().message;
  if (!r.error.empty()) return r;
  auto read = [&](const DeviceTensors& d, size_t i) { return read_back(device, d, i); };
  const std::vector<float>& offsets = gg->inputs()[2];
  const std::vector<std::vector<float>> operands = {read(*dy, 1), read(*w, 1), offsets, read(*dy, 2), read(*w, 2)};
  std::vector<RefOutput> ref;
  grouped.reference(grouped.with_defaults(s.gemm), {}, operands, {}, ref);
  const std::vector<float> c = read(*gg, 5);
  const std::vector<double> got(c.begin(), c.end());
  r.snr_dequantized = snr_db(ref[0].values, got);
  r.snr_bf16 = snr_db(bf16_dgrad(dy->inputs()[0], w->inputs()[0], offsets, G, N, K), got);
  return r;
}

// wgrad (k-grouped), dW_g [N, K] = dy_g^T x_g (DeepSeek-V3: both operands 1x128 along the tokens):
//   quantize_fp8 block1x128 only_qt groups G (dy, rows tokens, cols N) -> a = dy^T panels [P, N, 128], sa [P, N]
//   quantize_fp8 block1x128 only_qt groups G (x, rows tokens, cols K)  -> b = x^T panels [P, K, 128], sb [P, K]
//   grouped_gemm tn, groups G, N, K (accumulate into an fp32 c_in)    -> c = dW [G, N, K]
struct Fp8WgradSpecs {
  KernelSpec quantize_dy, quantize_x, gemm;
};
inline Fp8WgradSpecs fp8_wgrad_specs(int64_t G, int64_t tokens, int64_t N, int64_t K, DType fp8, DType out,
                                     int64_t accumulate = 0) {
  auto quantize = [&](int64_t cols) {
    return KernelSpec{"quantize_fp8", DType::bf16, fp8,
                      {{"rows", tokens}, {"cols", cols}, {"granularity", kBlock1x128}, {"transpose", 1}, {"only_qt", 1},
                       {"groups", G}}};
  };
  return {quantize(N), quantize(K),
          {"grouped_gemm", fp8, out,
           {{"mode", 2}, {"groups", G}, {"tokens", tokens}, {"N", N}, {"K", K}, {"accumulate", accumulate}}}};
}

/// fp64 dW_g = dy_g^T x_g (+ c_in), from the bf16 values (dy [tokens, N], x [tokens, K]).
inline std::vector<double> bf16_wgrad(const std::vector<float>& dy, const std::vector<float>& x,
                                      const std::vector<float>& offsets, int64_t G, int64_t N, int64_t K,
                                      const std::vector<float>* c_in = nullptr) {
  std::vector<double> dw(static_cast<size_t>(G * N * K), 0.0);
  if (c_in) std::copy(c_in->begin(), c_in->end(), dw.begin());
  for (int64_t g = 0; g < G; ++g)
    for (int64_t t = static_cast<int64_t>(offsets[g]); t < static_cast<int64_t>(offsets[g + 1]); ++t)
      for (int64_t n = 0; n < N; ++n) {
        const double d = dy[static_cast<size_t>(t * N + n)];
        for (int64_t k = 0; k < K; ++k) dw[static_cast<size_t>((g * N + n) * K + k)] += d * x[static_cast<size_t>(t * K + k)];
      }
  return dw;
}

/// The wgrad recipe on a device: dy's and x's inputs drawn by DeviceTensors (quantize_fp8's test
/// inputs), one set of offsets (grouped_gemm's: uneven, some groups empty, sizes not multiples of
/// 128) given to both quantizations and the GEMM; with accumulate, c_in is the GEMM's own random
/// fp32 c_in.
inline Fp8RecipeResult run_fp8_wgrad(Runtime& rt, int64_t G, int64_t tokens, int64_t N, int64_t K, DType fp8, DType out,
                                     int64_t accumulate, uint64_t seed) {
  Fp8RecipeResult r;
  Device& device = *rt.device();
  const Fp8WgradSpecs s = fp8_wgrad_specs(G, tokens, N, K, fp8, out, accumulate);
  const OpTemplate &quant = **find_op("quantize_fp8"), &grouped = **find_op("grouped_gemm");
  std::mt19937_64 rng(seed);
  auto dy = DeviceTensors::make(device, quant, quant.with_defaults(s.quantize_dy), rng);
  auto x = DeviceTensors::make(device, quant, quant.with_defaults(s.quantize_x), rng);
  auto gg = DeviceTensors::make(device, grouped, grouped.with_defaults(s.gemm), rng);
  if (!dy || !x || !gg) return {0, 0, "allocation failed"};
  auto step = [&](const KernelSpec& spec, std::span<void* const> ptrs) { launch_step(rt, r, spec, ptrs); };
  // The GEMM's offsets for all three: x, offsets, qt, qt_scale.
  void* offsets = gg->pointers()[2];
  step(s.quantize_dy, std::vector<void*>{dy->pointers()[0], offsets, dy->pointers()[2], dy->pointers()[3]});
  step(s.quantize_x, std::vector<void*>{x->pointers()[0], offsets, x->pointers()[2], x->pointers()[3]});
  // a = dy^T panels, b = x^T panels, offsets, sa, sb, [c_in,] c (c_in's buffer with accumulate).
  std::vector<void*> ptrs = {dy->pointers()[2], x->pointers()[2], offsets, dy->pointers()[3], x->pointers()[3]};
  for (size_t i = 5; i < gg->pointers().size(); ++i) ptrs.push_back(gg->pointers()[i]);
  const std::vector<float> c_in = accumulate ? gg->inputs()[5] : std::vector<float>{};
  step(s.gemm, ptrs);
  if (auto sync = device.synchronize(nullptr); !sync.ok() && r.error.empty()) r.error = sync.error().message;
  if (!r.error.empty()) return r;
  auto read = [&](const DeviceTensors& d, size_t i) { return read_back(device, d, i); };
  const std::vector<float>& off = gg->inputs()[2];
  std::vector<std::vector<float>> operands = {read(*dy, 2), read(*x, 2), off, read(*dy, 3), read(*x, 3)};
  if (accumulate) operands.push_back(c_in);
  std::vector<RefOutput> ref;
  grouped.reference(grouped.with_defaults(s.gemm), {}, operands, {}, ref);
  const std::vector<float> c = read(*gg, gg->pointers().size() - 1);
  const std::vector<double> got(c.begin(), c.end());
  r.snr_dequantized = snr_db(ref[0].values, got);
  r.snr_bf16 = snr_db(bf16_wgrad(dy->inputs()[0], x->inputs()[0], off, G, N, K, accumulate ? &c_in : nullptr), got);
  return r;
}

}  // namespace kiln::testing
