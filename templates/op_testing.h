// OpTestHooks: how an op's kernels are checked and measured (op contract v3, part 3 of 3): fresh
// random inputs, the CPU reference, the accuracy gate of each output (shared/reference/
// BENCHMARKS.md), FLOPs and bytes moved, the specs its tests run, and an optional modelled
// throughput for `kiln inspect`.
#pragma once

#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "support/parallel.h"
#include "templates/op_codegen.h"

namespace kiln {

/// The accuracy gate of one output (shared/reference/BENCHMARKS.md).
struct Gate {
  enum class Kind : uint8_t {
    tolerance,  ///< |out - ref| <= atol + rtol |ref| per element, and rel. Frobenius < max_rel_fro
    snr,        ///< 10 log10(|ref|^2 / |ref - out|^2) > min_snr_db
    exact,      ///< the same value bits (fp8 codes, integers): `max_code_diff` code steps allowed
  };
  Kind kind = Kind::tolerance;
  double atol = 1e-2, rtol = 1e-2;
  double max_rel_fro = 1e-2;  ///< < 0: no Frobenius condition
  double min_snr_db = 0;
  int max_code_diff = 0;
  std::string describe() const;
  /// The BENCHMARKS.md gate for an output dtype: fp32 1e-4; bf16/fp16 1e-2 and Frobenius 1e-2;
  /// fp8 and integers exact.
  static Gate for_dtype(DType t);
};

/// The reference values of one output: every element, the listed rows of its first dimension, or
/// the listed elements (a sample whose rows are not the first dimension's: attention's tokens of a
/// [batch, seqlen, heads, dim] tensor, and their lse entries in [heads, tokens]).
struct RefOutput {
  std::vector<int64_t> rows;      ///< Rows computed, in order; empty: the whole tensor, or `elements`.
  std::vector<double> values;     ///< Row after row (or the listed elements, or all elements).
                                  ///< NaN: an element the op must leave unwritten (a strided view's
                                  ///< unused columns); check_on_device expects the NaN poison there.
  std::vector<int64_t> elements;  ///< With `rows` empty: the elements computed (flat row-major
                                  ///< indices, ascending), one value each; empty: every element.
};

/// Fills `values` with `n` draws of `draw(generator)` (a float from a std::mt19937_64&), in chunks
/// of 64 Ki elements drawn on every core (parallel_for): each chunk's generator is seeded from
/// `rng` in chunk order, so one seed gives the same values whatever the thread count. GPU-sized
/// inputs (a billion elements) take seconds this way instead of minutes on one thread.
template <class Draw>
void fill_random(std::vector<float>& values, size_t n, std::mt19937_64& rng, Draw&& draw) {
  constexpr size_t kChunk = size_t{1} << 16;
  values.resize(n);
  std::vector<uint64_t> seeds((n + kChunk - 1) / kChunk);
  for (uint64_t& s : seeds) s = rng();
  parallel_for(n, kChunk, [&](size_t begin, size_t end) {
    std::mt19937_64 g(seeds[begin / kChunk]);
    for (size_t i = begin; i < end; ++i) values[i] = draw(g);
  });
}

/// What an op's own comparison of a call's outputs (OpTestHooks::compare_outputs) accepted beyond
/// the reference's values.
struct AcceptedOutputs {
  int64_t count = 0;  ///< How many it accepted (moe_router: tokens).
  std::string what;   ///< Of what, in words ("near-tie tokens").
};

/// A spec a test runs, with the runtime sizes it wants.
struct TestSpec {
  KernelSpec spec;
  std::string_view why;  ///< "tail in N", "hidden 1", ...
};

/// One line of a modelled (not measured) throughput report: `kiln inspect --emit meta` prints
/// `label` and `text`.
struct ModelLine {
  std::string label;
  std::string text;
};

class OpTestHooks : public OpCodegen {
 public:
  /// Fills the inputs with fresh random values rounded to their dtypes (never zero), in
  /// signature order. Default: uniform in [-1, 1]. Ops override it for scaled or derived inputs
  /// (gemm's B by 1/sqrt(K); rmsnorm_bwd's rstd from x).
  virtual void init_inputs(const KernelSpec& spec, std::span<const TensorInfo> inputs,
                           std::vector<std::vector<float>>& values, std::mt19937_64& rng) const;
  /// init_inputs for a launch with the runtime `scalars` (CheckOptions::scalars; a name left out
  /// takes its default), which the check path calls. Ops whose inputs are derived with a runtime
  /// scalar override it (attention_bwd's out and lse are the forward at softmax_scale). Default:
  /// init_inputs; the inputs do not depend on the scalars.
  virtual void init_inputs_with_scalars(const KernelSpec& spec, const Scalars& /*scalars*/,
                                        std::span<const TensorInfo> inputs, std::vector<std::vector<float>>& values,
                                        std::mt19937_64& rng) const {
    init_inputs(spec, inputs, values, rng);
  }
  /// CPU reference in fp64 (or fp32-accumulated where the op's algorithm says so) on the
  /// dtype-rounded inputs. Fills one RefOutput per output tensor, in order. `rows` (sorted,
  /// non-empty) asks for a sample of the rows of row-shaped outputs; an op may compute more.
  virtual void reference(const KernelSpec& spec, const Scalars& scalars, std::span<const std::vector<float>> inputs,
                         std::span<const int64_t> rows, std::vector<RefOutput>& outputs) const = 0;
  /// Whether the check path (check_on_device, check_outputs) calls compare_outputs: it then reads
  /// every output back whole before comparing. Default: false.
  virtual bool compares_outputs() const { return false; }
  /// The op's own comparison of a call's outputs, before each output's gate: given the inputs,
  /// the outputs (every output whole, decoded to double, in signature order) and the reference
  /// values, it may replace reference values where the op's rule accepts the device's result as
  /// an equally right answer (moe_router: a top-k order at a near-tie of fp32 selection values),
  /// so that the gates then compare with what it accepted. Everything it does not accept stays
  /// the reference's and is gated as before. Returns what it accepted. Default: nothing.
  virtual AcceptedOutputs compare_outputs(const KernelSpec& /*spec*/, const Scalars& /*scalars*/,
                                          std::span<const std::vector<float>> /*inputs*/,
                                          std::span<const std::vector<double>> /*outputs*/,
                                          std::vector<RefOutput>& /*refs*/) const {
    return {};
  }
  /// The accuracy gate of an output. Default: Gate::for_dtype.
  virtual Gate gate(const KernelSpec& /*spec*/, const TensorInfo& output) const { return Gate::for_dtype(output.dtype); }
  /// Floating-point operations of a call (GEMM: 2MNK); 0 for memory-bound ops.
  virtual double flops(const KernelSpec& /*spec*/) const { return 0; }
  /// Bytes a call must move: every input read once and every output written once.
  virtual double bytes(const KernelSpec& spec) const;
  /// Small specs that cover the op's paths and tails, for the CPU, emulator and GPU tests.
  virtual std::vector<TestSpec> test_specs(const TargetInfo& target) const = 0;
  /// A short form of the spec's parameters for tables ("4096x4096x4096 NT"); "" (the default):
  /// the parameters as NAME=VALUE in the op's order.
  virtual std::string short_form(const KernelSpec& /*spec*/) const { return ""; }
  /// A modelled throughput of a configuration on the target, for `kiln inspect` (gemm's MFMA
  /// model on AMD); each line says "modelled". `registers_per_lane`: the compiled kernel's
  /// VGPRs + AGPRs, or -1 when unknown. Default: none.
  virtual std::vector<ModelLine> throughput_model(const KernelSpec& /*spec*/, const KernelConfig& /*config*/,
                                                  const TargetInfo& /*target*/, int /*registers_per_lane*/) const {
    return {};
  }
  /// The rows that a sample (reference()'s `rows`, CheckOptions::sample_rows) draws from. Default:
  /// the first dimension of the first output with a shape. Ops whose outputs' rows are not their
  /// first dimension override it (attention: tokens, batch x seqlen in the bshd layout).
  virtual int64_t sample_dimension(const KernelSpec& spec) const;
};

}  // namespace kiln
