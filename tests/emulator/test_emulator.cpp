// The emulator backend: every op's AMD kernels for gfx942 and gfx950 run in tinygrad's CDNA ISA
// emulator through Kiln's own check path (check_on_device: random inputs, NaN-poisoned outputs, the
// op's CPU reference and its accuracy gates), on small and odd shapes; and the backend's failure
// modes (no emulator, no Python, a hung or crashed child) give clear errors, not hangs.
//
// The emulator tests skip, saying why, where the emulator or its Python is missing (see
// docs/emulator.md). One runtime (one emulator process) per target serves every case of this
// process: the emulator compiles each distinct instruction once per process, and caches the
// compiled code in CACHEDB (tests/CMakeLists.txt points it into the build tree).
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <set>

#include "cache/disk_cache.h"
#include "cache/tuning.h"
#include "fp8_moe_recipe.h"
#include "kiln/kiln.h"
#include "runtime/device_impl.h"
#include "runtime/device_tensors.h"
#include "templates/lib/fp8_scaling.h"
#include "templates/registry.h"
#include "test_util.h"

#if KILN_WITH_LLVM
#include "runtime/emulator/hsaco_image.h"
#endif

namespace kiln {
namespace {
using testing::gemm_spec;
using testing::rmsnorm_spec;
using testing::swiglu_spec;

constexpr const char* kTargets[] = {"gfx942", "gfx950"};

// The emulated runtime of `target`, shared by the tests of this process; nullptr with the reason
// in `why` where the emulator cannot run here.
Runtime* emulator(const std::string& target, std::string& why) {
  static std::map<std::string, std::unique_ptr<Runtime>> runtimes;
  static std::map<std::string, std::string> reasons;
  if (auto it = runtimes.find(target); it != runtimes.end()) return it->second.get();
  if (auto it = reasons.find(target); it != reasons.end()) {
    why = it->second;
    return nullptr;
  }
  RuntimeOptions o;
  o.backend = "emulator";
  o.emulator_target = target;
  o.cache_dir = KILN_TEST_EMULATOR_CACHE;  // code objects, kept across runs of this build
  auto rt = Runtime::create(o);
  if (!rt) {
    const bool absent = rt.error().code == Errc::driver_unavailable || rt.error().code == Errc::unsupported;
    reasons[target] = why = (absent ? "" : "FAIL: ") + rt.error().message;
    return nullptr;
  }
  return (runtimes[target] = std::move(rt).value()).get();
}

#define KILN_EMULATOR_OR_SKIP(rt, target)                          \
  std::string why_;                                                \
  Runtime* rt = emulator(target, why_);                            \
  if (!rt && why_.rfind("FAIL: ", 0) == 0) FAIL() << why_;         \
  if (!rt) GTEST_SKIP() << why_

// ---- every op on both targets --------------------------------------------------------------

struct Case {
  std::string target;
  KernelSpec spec;
  KernelConfig forced = {};  ///< Not empty: this configuration, through a tuning record, not the heuristic's.
};

// gemm: every (M, N, K) in {1, 7, 64, 129}^3 in every layout (NT, NN, TN), each with one
// (input, output) dtype pair, rotating so that every layout and every value of M, N and K meets
// every input dtype (bf16, fp16) with every output dtype (bf16, fp16, fp32); plus fp32 inputs.
// rmsnorm (hidden 1, 7, 1000) and swiglu (I 1, 7, 100) in every dtype, on a few rows.
std::vector<KernelSpec> specs() {
  const int64_t sizes[] = {1, 7, 64, 129};
  const std::pair<bool, bool> layouts[] = {{false, true}, {false, false}, {true, false}};  // NT, NN, TN
  const std::pair<DType, DType> pairs[] = {{DType::bf16, DType::bf16}, {DType::f16, DType::f32},
                                           {DType::bf16, DType::f16},  {DType::f16, DType::f16},
                                           {DType::bf16, DType::f32},  {DType::f16, DType::bf16}};
  std::vector<KernelSpec> out;
  size_t shape = 0;
  for (int64_t M : sizes)
    for (int64_t N : sizes)
      for (int64_t K : sizes) {
        for (size_t l = 0; l < 3; ++l) {
          const auto [in, o] = pairs[(shape + l) % 6];
          out.push_back(gemm_spec(M, N, K, layouts[l].first, layouts[l].second, in, o));
        }
        ++shape;
      }
  out.push_back(gemm_spec(7, 64, 129, false, true, DType::f32, DType::f32));
  out.push_back(gemm_spec(129, 7, 64, true, false, DType::f32, DType::bf16));
  const DType dts[] = {DType::bf16, DType::f16, DType::f32};
  const int64_t hiddens[] = {1, 7, 1000}, intermediates[] = {1, 7, 100};
  for (size_t d = 0; d < 3; ++d)
    for (size_t j = 0; j < 3; ++j) {
      const int64_t rows = static_cast<int64_t>(2 * ((d + j) % 3) + 1);  // 1, 3, 5
      out.push_back(rmsnorm_spec(rows, hiddens[j], dts[d]));
      out.push_back(swiglu_spec(rows, intermediates[j], dts[d]));
    }
  return out;
}

std::string case_name(const ::testing::TestParamInfo<Case>& info);

// The cases above, then every op's own test specs for the target (a new op is run here without
// a line in this file), those that move at most 256 KiB (the emulator runs about 1000
// wave-instructions per millisecond).
std::vector<Case> cases() {
  std::vector<Case> out;
  std::set<std::string> names;
  auto add = [&](const char* t, const KernelSpec& s) {
    Case c{t, s};
    if (names.insert(case_name(::testing::TestParamInfo<Case>(c, 0))).second) out.push_back(std::move(c));
  };
  for (const char* t : kTargets) {
    for (const KernelSpec& s : specs()) add(t, s);
    for (const OpTemplate* op : all_ops())
      for (const TestSpec& ts : op->test_specs(**find_target(t)))
        if (op->bytes(op->with_defaults(ts.spec)) <= 256 * 1024) add(t, ts.spec);
    // The 256 x 128 MFMA tile, which the heuristic takes only on shapes too large for the
    // emulator, forced on small ones in every layout where it may be chosen (gfx942 excludes it
    // for TN and NN: docs/amd-gemm-model.md), with 16-bit outputs: 170-250 VGPRs, so 16-bit
    // values above v127 (which the emulator ran wrongly before its fixes of 2026-11-24). Tails in
    // K, and in M, N and K on the NN case.
    const OpTemplate* gemm = *find_op("gemm");
    for (const KernelSpec& s : {gemm_spec(256, 128, 72, false, true, DType::bf16, DType::f16),
                                gemm_spec(256, 128, 72, true, false, DType::bf16, DType::f16),
                                gemm_spec(264, 136, 40, false, false, DType::f16, DType::bf16)})
      for (const KernelConfig& c : gemm->tuning_candidates(s, **find_target(t)))
        if (c.count("MFMA") && c.at("BM") == 256 && c.at("BN") == 128) {
          Case forced{t, s, c};
          if (names.insert(case_name(::testing::TestParamInfo<Case>(forced, 0))).second) out.push_back(forced);
        }
  }
  return out;
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const KernelSpec& s = info.param.spec;
  std::string name = info.param.target + "_" + s.op + "_" + std::string(dtype_name(s.dtype));
  if (s.out_dtype != s.dtype) name += "_" + std::string(dtype_name(s.out_dtype));
  for (const auto& [k, v] : s.params) name += "_" + k + std::to_string(v);
  if (!info.param.forced.empty()) name += "_forced_BM" + std::to_string(info.param.forced.at("BM")) + "_BN" +
                                          std::to_string(info.param.forced.at("BN"));
  for (char& c : name)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return name;
}

class Emulator : public ::testing::TestWithParam<Case> {};

// No case is skipped for a discrepancy: one found in the emulator gets a minimal reproducer in the
// emulator's notes (shared/AMD-EMULATION.md) and a fix there, not a skip here.
TEST_P(Emulator, MatchesTheReference) {
  const Case& c = GetParam();
  KILN_EMULATOR_OR_SKIP(rt, c.target);
  if (!c.forced.empty()) {
    // A tuning record of this spec on the emulated device makes kernel() compile `forced`.
    const OpTemplate* op = *find_op(c.spec.op);
    TuningRecord record;
    record.key = TuningKey::make(tuning_subject(*op, c.spec, rt->device()->target()), rt->device()->target(),
                                 rt->device()->name(), "clang");
    record.winner = c.forced;
    record.candidates.push_back({c.forced, 1.0, 1.0, 1.0, ""});
    record.reps = 1;
    record.created_utc = utc_now();
    auto cache = DiskCache::open(KILN_TEST_EMULATOR_CACHE);
    ASSERT_TRUE(cache.ok()) << cache.error().message;
    ASSERT_TRUE(store_tuning(**cache, record).ok());
    auto kernel = rt->kernel(c.spec);
    ASSERT_TRUE(kernel.ok()) << kernel.error().message;
    const KernelInfo& info = (*kernel)->compiled().info();
    ASSERT_NE(info.config.find("BM=256 BN=128"), std::string::npos) << info.config;
    std::printf("[ emulator ] %s forced %s: %d VGPRs\n", c.target.c_str(), info.config.c_str(), info.registers);
  }
  CheckOptions options;
  options.seed = 42;
  const auto t0 = std::chrono::steady_clock::now();
  auto report = check_on_device(*rt, c.spec, options);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(report.ok()) << report.error().message;
  std::printf("[ emulator ] %s %s: %.2f s\n", c.target.c_str(), format_report(*report).c_str(), s);
  EXPECT_TRUE(report->pass) << format_report(*report);
}

INSTANTIATE_TEST_SUITE_P(Ops, Emulator, ::testing::ValuesIn(cases()), case_name);

// A new op must bring emulator cases: the check above is how its AMD kernels are proven.
TEST(EmulatorCoverage, EveryOpHasCases) {
  std::set<std::string> covered;
  for (const Case& c : cases()) covered.insert(c.spec.op);
  for (const OpTemplate* op : all_ops())
    EXPECT_TRUE(covered.count(std::string(op->name()))) << op->name() << " has no case in tests/emulator";
}

// The same check with every runtime scalar away from its default (default x 2.5 + 0.05: eps 0.05,
// label smoothing 0.3, z-loss weight 0.05), for the ops' test specs of at most 64 KiB: a term
// whose default weight is too small to show under the gate (PaLM's z-loss 1e-4 in a gradient) is
// checked here.
TEST(EmulatorScalars, OpsMatchTheReferenceWithOtherScalarValues) {
  int checked = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (const char* target : kTargets) {
    KILN_EMULATOR_OR_SKIP(rt, target);
    for (const OpTemplate* op : all_ops()) {
      if (op->scalars().empty()) continue;
      CheckOptions options;
      options.seed = 7;
      for (const ScalarInfo& s : op->scalars()) options.scalars[std::string(s.name)] = s.default_value * 2.5f + 0.05f;
      for (const TestSpec& ts : op->test_specs(**find_target(target))) {
        if (op->bytes(op->with_defaults(ts.spec)) > 64 * 1024) continue;
        SCOPED_TRACE(to_string(ts.spec) + " on " + target);
        auto report = check_on_device(*rt, ts.spec, options);
        ASSERT_TRUE(report.ok()) << report.error().message;
        EXPECT_TRUE(report->pass) << format_report(*report);
        ++checked;
      }
    }
  }
  std::printf("[ emulator ] %d specs with other scalar values: %.1f s\n", checked,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

// The MFMA forward's lazy rescaling (attention_mfma.kernel, kLazyRescale): a row's max, O and l
// move only when a key tile's max exceeds the running max by more than 8 ln 2. The spec cases'
// scores rarely jump that far after the first tile; with softmax_scale 2 at head dim 64 (scores of
// standard deviation about 16) over 8 key tiles, many rows rescale late, and the rows that do not
// run on the old max. A negative softmax_scale takes the raw scores' minimum for the row max.
// The backward at the same scales, on out and lse from the forward at that scale
// (init_inputs_with_scalars).
TEST(EmulatorAttention, TheForwardRescalesLateRowsCorrectly) {
  for (const char* target : kTargets) {
    KILN_EMULATOR_OR_SKIP(rt, target);
    const KernelSpec spec{"attention", DType::bf16, DType::bf16,
                          {{"layout", 0}, {"batch", 1}, {"seqlen_q", 64}, {"seqlen_k", 256}, {"heads", 2},
                           {"kv_heads", 1}, {"head_dim", 64}, {"causal", 0}}};
    // 2: late rescales; -6: a negative scale, whose row max is scale times the raw minimum (the
    // raw maximum would put 2^100 and more into P).
    for (const float scale : {2.0f, -6.0f}) {
      CheckOptions options;
      options.seed = 11;
      options.scalars["softmax_scale"] = scale;
      for (const char* op : {"attention", "attention_bwd"}) {
        KernelSpec s = spec;
        s.op = op;
        auto report = check_on_device(*rt, s, options);
        ASSERT_TRUE(report.ok()) << report.error().message;
        EXPECT_TRUE(report->pass) << target << ", " << op << ", softmax_scale " << scale << ": "
                                  << format_report(*report);
      }
    }
  }
}

// fp8 quantization without an extra pass, on the device. rmsnorm and swiglu with an fp8 output:
// y_fp8 and y_scale are, bit for bit, quantize_fp8's definition (its CPU reference) applied to the
// y that the kernel stored, for every granularity (delayed tensorwise with the same history, whose
// update must match too). And delayed quantize_fp8 whose history's max is the tensor's own amax
// writes what current (two-pass) scaling writes.
namespace {
std::vector<float> read_back(Device& device, const DeviceTensors& d, std::string_view name) {
  for (size_t i = 0; i < d.tensors().size(); ++i) {
    const TensorInfo& t = d.tensors()[i];
    if (t.name != name) continue;
    std::vector<uint8_t> bytes(static_cast<size_t>(t.bytes()));
    EXPECT_TRUE(device.copy_to_host(bytes.data(), d.pointers()[i], bytes.size()).ok());
    std::vector<float> out;
    for (int64_t e = 0; e < t.elements(); ++e) out.push_back(static_cast<float>(decode_value(bytes.data(), static_cast<size_t>(e), t.dtype)));
    return out;
  }
  ADD_FAILURE() << "no tensor " << name;
  return {};
}

void expect_same_bits(const std::vector<float>& got, const std::vector<double>& want, std::string_view what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t differ = 0;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::bit_cast<uint32_t>(got[i]) != std::bit_cast<uint32_t>(static_cast<float>(want[i]))) ++differ;
  EXPECT_EQ(differ, 0u) << what << ": " << differ << " of " << got.size() << " differ";
}
}  // namespace

TEST(EmulatorFp8, FusedOutputsAreQuantizeFp8OfTheStoredOutput) {
  int checked = 0;
  for (const char* target : kTargets) {
    KILN_EMULATOR_OR_SKIP(rt, target);
    Device& device = *rt->device();
    const auto [e4, e5] = fp8_test_formats(device.target());
    const OpTemplate* quant = *find_op("quantize_fp8");
    // The forward ops quantize y; their backward ops dx (swiglu_bwd: the 2 I columns dgate | dup).
    for (const char* op_name : {"rmsnorm", "swiglu", "rmsnorm_bwd", "swiglu_bwd"})
      for (int64_t g : {kTensorwise, kRowwise, kBlock1x128}) {
        const OpTemplate* op = *find_op(op_name);
        const std::string name = op_name;
        const bool norm = name.rfind("rmsnorm", 0) == 0, bwd = name.find("_bwd") != std::string::npos;
        const std::string y_name = bwd ? "dx" : "y";
        const int64_t rows = 5, cols = 384;
        KernelSpec spec{op_name, DType::bf16, DType::bf16,
                        {{"rows", rows}, {norm ? "hidden" : "intermediate", name == "swiglu_bwd" ? cols / 2 : cols},
                         {"fp8_out", fp8_out_value(g == kRowwise ? e5 : e4)}, {"fp8_granularity", g}}};
        if (name == "rmsnorm_bwd") spec.params["residual_grad"] = 1;
        if (g == kTensorwise) spec.params["history_len"] = 8;
        SCOPED_TRACE(to_string(spec) + " on " + target);
        std::mt19937_64 rng(11);
        auto d = DeviceTensors::make(device, *op, op->with_defaults(spec), rng);
        ASSERT_TRUE(d.ok()) << d.error().message;
        auto kernel = rt->kernel(spec);
        ASSERT_TRUE(kernel.ok()) << kernel.error().message;
        ASSERT_TRUE((*kernel)->launch(spec, d->pointers(), {}, nullptr).ok());
        ASSERT_TRUE(device.synchronize(nullptr).ok());
        std::vector<std::vector<float>> y = {read_back(device, *d, y_name)};
        KernelSpec q{"quantize_fp8", DType::bf16, g == kRowwise ? e5 : e4,
                     {{"rows", rows}, {"cols", cols}, {"granularity", g}}};
        if (g == kTensorwise) {
          q.params["scaling"] = kDelayedScaling;
          q.params["history_len"] = 8;
          y.push_back(d->inputs().back());
        }
        std::vector<RefOutput> want;
        quant->reference(q, {}, y, {}, want);
        expect_same_bits(read_back(device, *d, y_name + "_fp8"), want[0].values, y_name + "_fp8");
        expect_same_bits(read_back(device, *d, y_name + "_scale"), want[1].values, y_name + "_scale");
        if (g == kTensorwise) expect_same_bits(read_back(device, *d, "amax_history_out"), want[2].values, "history");
        ++checked;
      }
    // Delayed with max(history) = amax(x) is current scaling.
    for (int64_t transpose : {0, 1}) {
      KernelSpec delayed{"quantize_fp8", DType::bf16, e4,
                         {{"rows", 130}, {"cols", 136}, {"granularity", kTensorwise}, {"transpose", transpose},
                          {"scaling", kDelayedScaling}, {"history_len", 4}}};
      KernelSpec current = delayed;
      current.params.erase("scaling");
      current.params.erase("history_len");
      SCOPED_TRACE(to_string(delayed) + " on " + target);
      std::mt19937_64 rng(12);
      auto d = DeviceTensors::make(device, *quant, quant->with_defaults(delayed), rng);
      ASSERT_TRUE(d.ok()) << d.error().message;
      float amax = 0.0f;
      for (float v : d->inputs()[0]) amax = std::fmax(amax, std::fabs(v));
      const float history[4] = {amax / 2, amax, 0.0f, amax / 4};
      ASSERT_TRUE(device.copy_to_device(d->pointers()[1], history, sizeof(history)).ok());
      ASSERT_TRUE(rt->launch(delayed, d->pointers()).ok());
      ASSERT_TRUE(device.synchronize(nullptr).ok());
      std::vector<RefOutput> want;
      quant->reference(current, {}, std::span<const std::vector<float>>(d->inputs()).first(1), {}, want);
      expect_same_bits(read_back(device, *d, "q"), want[0].values, "q");
      expect_same_bits(read_back(device, *d, "scale"), want[1].values, "scale");
      if (transpose) expect_same_bits(read_back(device, *d, "qt"), want[2].values, "qt");
      expect_same_bits(read_back(device, *d, "amax_history_out"), {amax, amax / 2, amax, 0.0f}, "history");
      ++checked;
    }
  }
  std::printf("[ emulator ] %d fused or delayed fp8 outputs equal to quantize_fp8's bit for bit\n", checked);
}

// The fp8 dgrad of an MoE layer as a caller runs it: dy quantized 1x128, W^T of every expert by one
// batched quantize_fp8 only_qt 128x128 launch, then grouped_gemm nt (tests/fp8_moe_recipe.h);
// against the dequantized product (40 dB) and the bf16 product (25 dB). Uneven groups, some
// empty (grouped_gemm's test offsets), tails in both N and K.
TEST(EmulatorFp8, GroupedDgradAsACallerRunsIt) {
  for (const char* target : kTargets) {
    KILN_EMULATOR_OR_SKIP(rt, target);
    const DType e4 = fp8_for_target(DType::e4m3, rt->device()->target());
    const struct {
      int64_t G, tokens, N, K;
      DType out;
    } cases[] = {{4, 150, 256, 136, DType::bf16}, {3, 70, 200, 64, DType::f32}};
    for (const auto& c : cases) {
      SCOPED_TRACE(fmt::format("{}: G {} tokens {} N {} K {}", target, c.G, c.tokens, c.N, c.K));
      const testing::Fp8RecipeResult r = testing::run_fp8_dgrad(*rt, c.G, c.tokens, c.N, c.K, e4, c.out, 21);
      ASSERT_TRUE(r.error.empty()) << r.error;
      std::printf("[ emulator ] %s fp8 grouped dgrad G %lld tokens %lld N %lld K %lld: %.1f dB (dequantized), %.1f dB "
                  "(bf16)\n",
                  target, (long long)c.G, (long long)c.tokens, (long long)c.N, (long long)c.K, r.snr_dequantized,
                  r.snr_bf16);
      EXPECT_GT(r.snr_dequantized, 40);
      EXPECT_GT(r.snr_bf16, 25);
    }
  }
}

// The fp8 k-grouped wgrad of an MoE layer as a caller runs it: dy and x quantized 1x128 along the
// tokens into group-aligned panels by quantize_fp8 groups=G (the offsets on the device), then
// grouped_gemm tn (tests/fp8_moe_recipe.h). Groups of 0 tokens, of sizes not multiples of 128 and
// above 128 (grouped_gemm's test offsets); N and K tails; into bf16, and accumulated into fp32.
TEST(EmulatorFp8, GroupedWgradAsACallerRunsIt) {
  for (const char* target : kTargets) {
    KILN_EMULATOR_OR_SKIP(rt, target);
    const DType e4 = fp8_for_target(DType::e4m3, rt->device()->target());
    const struct {
      int64_t G, tokens, N, K, accumulate;
      DType out;
    } cases[] = {{4, 300, 72, 40, 0, DType::bf16}, {3, 200, 40, 64, 1, DType::f32}};
    for (const auto& c : cases) {
      SCOPED_TRACE(fmt::format("{}: G {} tokens {} N {} K {} accumulate {}", target, c.G, c.tokens, c.N, c.K,
                               c.accumulate));
      const testing::Fp8RecipeResult r =
          testing::run_fp8_wgrad(*rt, c.G, c.tokens, c.N, c.K, e4, c.out, c.accumulate, 23);
      ASSERT_TRUE(r.error.empty()) << r.error;
      std::printf("[ emulator ] %s fp8 grouped wgrad G %lld tokens %lld N %lld K %lld accumulate %lld: %.1f dB "
                  "(dequantized), %.1f dB (bf16)\n",
                  target, (long long)c.G, (long long)c.tokens, (long long)c.N, (long long)c.K, (long long)c.accumulate,
                  r.snr_dequantized, r.snr_bf16);
      EXPECT_GT(r.snr_dequantized, 40);
      EXPECT_GT(r.snr_bf16, 25);
    }
  }
}

// An output written in place over an input (TensorDecl::overwrites, e.g. an in-place backward):
// the caller passes the input's buffer for both, and a launch with two different buffers is
// refused before anything runs. Every op spec with such an output, from the ops' own test specs.
TEST(EmulatorInPlace, AnOutputWrittenOverAnInputNeedsTheInputsBuffer) {
  KILN_EMULATOR_OR_SKIP(rt, "gfx942");
  int checked = 0;
  for (const OpTemplate* op : all_ops())
    for (const TestSpec& ts : op->test_specs(**find_target("gfx942"))) {
      const KernelSpec full = op->with_defaults(ts.spec);
      const std::vector<TensorInfo> tensors = op->tensors(full);
      if (op->bytes(full) > 256 * 1024) continue;
      auto shared = std::find_if(tensors.begin(), tensors.end(), [](const TensorInfo& t) { return t.overwrites >= 0; });
      if (shared == tensors.end() || op->sample_dimension(full) == 0) continue;
      SCOPED_TRACE(to_string(ts.spec));
      std::vector<void*> ptrs;
      for (const TensorInfo& t : tensors) {
        auto p = rt->device()->malloc(std::max<size_t>(t.bytes(), 256));
        ASSERT_TRUE(p.ok()) << p.error().message;
        ASSERT_TRUE(rt->device()->memset(*p, 0, std::max<size_t>(t.bytes(), 256)).ok());
        ptrs.push_back(*p);
      }
      const size_t in = static_cast<size_t>(shared->overwrites);
      auto refused = rt->launch(ts.spec, ptrs);
      ASSERT_FALSE(refused.ok()) << "two buffers for '" << shared->name << "' and '" << tensors[in].name << "'";
      EXPECT_EQ(refused.error().code, Errc::invalid_argument);
      EXPECT_NE(refused.error().message.find("in place"), std::string::npos) << refused.error().message;
      EXPECT_NE(refused.error().message.find(tensors[in].name), std::string::npos) << refused.error().message;
      // Every in-place output (rope has two: q_out over q, k_out over k) on its input's buffer.
      const std::vector<void*> own = ptrs;
      for (size_t t = 0; t < tensors.size(); ++t)
        if (tensors[t].overwrites >= 0) ptrs[t] = ptrs[static_cast<size_t>(tensors[t].overwrites)];
      auto launched = rt->launch(ts.spec, ptrs);
      EXPECT_TRUE(launched.ok()) << launched.error().message;
      for (void* p : own) (void)rt->device()->free(p);
      ++checked;
      break;  // one spec per op
    }
  std::printf("[ emulator ] %d op(s) with an output written in place\n", checked);
}

// ---- the backend's own behaviour -----------------------------------------------------------

// Sets an environment variable for one test, and restores it.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_) ::setenv(name_, old_->c_str(), 1);
    else ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

Result<std::unique_ptr<Runtime>> emulator_runtime(const std::string& target) {
  RuntimeOptions o;
  o.backend = "emulator";
  o.emulator_target = target;
  o.disk_cache = false;
  return Runtime::create(o);
}

// gfx942's fp8 MFMAs take FNUZ data; the emulator decodes OCP unless CDNA_FP8=fnuz, which the
// backend sets for gfx942. With the decoding forced to OCP (KILN_EMULATOR_FP8=ocp) the same
// gfx942 fp8 GEMM fails its gate: the cases above pass because of the switch, not in spite of
// it. (Read as OCP, an FNUZ code is worth twice its value: biases 7 and 15 instead of 8 and 16.)
// With sampled rows, check_on_device reads back only those rows of each output (a benchmark's
// 8 rows of a GPU-sized tensor, not gigabytes), each into its place for the comparison: rows read
// from the wrong place would hold other values (or the NaN poison past the sampled ones) and fail.
// rmsnorm's y [50, 64] and rstd [50] (rstd's rows are its elements).
TEST(EmulatorCheck, SampledRowsAreReadBackAloneAndStillCompared) {
  KILN_EMULATOR_OR_SKIP(rt, "gfx942");
  const KernelSpec spec{"rmsnorm", DType::bf16, DType::bf16, {{"rows", 50}, {"hidden", 64}, {"save_rstd", 1}}};
  CheckOptions options;
  options.sample_rows = 5;
  auto report = check_on_device(*rt, spec, options);
  ASSERT_TRUE(report.ok()) << report.error().message;
  EXPECT_TRUE(report->pass) << format_report(*report);
  EXPECT_LE(report->compared, 5 * 64 + 5);
  EXPECT_GE(report->compared, 2 * 64 + 2) << "the first and last row at least";
}

// Attention's samples are tokens (a bshd tensor's first dimension is the batch: a sample of it was
// the whole reference, minutes at a model size): the check compares the sampled tokens' rows of
// out, dq, dk and dv and their lse entries, read whole and compared element by element. bshd, one
// sequence of 40 queries and 72 keys, GQA, causal.
TEST(EmulatorCheck, AttentionSamplesTokensOfABshdBatch) {
  KILN_EMULATOR_OR_SKIP(rt, "gfx950");
  for (const char* op : {"attention", "attention_bwd"}) {
    const KernelSpec spec{op, DType::bf16, DType::bf16,
                          {{"batch", 1}, {"seqlen_q", 40}, {"seqlen_k", 72}, {"heads", 2}, {"kv_heads", 1},
                           {"head_dim", 64}, {"causal", 1}}};
    CheckOptions options;
    options.sample_rows = 5;
    auto report = check_on_device(*rt, spec, options);
    ASSERT_TRUE(report.ok()) << report.error().message;
    EXPECT_TRUE(report->pass) << format_report(*report);
    // At most 5 tokens: out 2 x 64 values and 2 lse entries each; dq 128, dk and dv 64 each.
    const int64_t per_token = std::string(op) == "attention" ? 2 * 64 + 2 : 2 * 64 + 64 + 64;
    EXPECT_LE(report->compared, 5 * per_token) << format_report(*report);
    EXPECT_GE(report->compared, 2 * per_token) << "the first and last token at least";
  }
}

TEST(EmulatorBackend, Gfx942Fp8NeedsTheFnuzDecoding) {
  KILN_REQUIRE_LLVM();
  const KernelSpec spec{"gemm_fp8", DType::e4m3fnuz, DType::f32,
                        {{"M", 33}, {"N", 40}, {"K", 64}, {"granularity", 1}, {"b_format", 1}}};
  CheckOptions options;
  options.seed = 42;
  for (const char* decoding : {"fnuz", "ocp"}) {
    SCOPED_TRACE(decoding);
    ScopedEnv env("KILN_EMULATOR_FP8", decoding);
    auto rt = emulator_runtime("gfx942");
    if (!rt && (rt.error().code == Errc::driver_unavailable || rt.error().code == Errc::unsupported))
      GTEST_SKIP() << rt.error().message;
    ASSERT_TRUE(rt.ok()) << rt.error().message;
    auto kernel = (*rt)->kernel(spec);
    ASSERT_TRUE(kernel.ok()) << kernel.error().message;
    ASSERT_NE((*kernel)->compiled().info().config.find("MFMA=1"), std::string::npos)
        << (*kernel)->compiled().info().config;
    auto report = check_on_device(**rt, spec, options);
    ASSERT_TRUE(report.ok()) << report.error().message;
    std::printf("[ emulator ] gfx942 with CDNA_FP8=%s: %s\n", decoding, format_report(*report).c_str());
    EXPECT_EQ(report->pass, std::string(decoding) == "fnuz") << format_report(*report);
  }
}

TEST(EmulatorBackend, RefusesAMissingOrNonAmdTarget) {
  for (const char* target : {"", "sm_90a", "gfx90a"}) {
    auto rt = emulator_runtime(target);
    ASSERT_FALSE(rt.ok()) << target;
    EXPECT_EQ(rt.error().code, Errc::invalid_argument) << rt.error().message;
    EXPECT_NE(rt.error().message.find("gfx942 or gfx950"), std::string::npos) << rt.error().message;
  }
}

TEST(EmulatorBackend, MissingEmulatorNamesTheVariable) {
  KILN_REQUIRE_LLVM();
  ScopedEnv env("KILN_AMD_EMULATOR", "/nonexistent/tinygrad-cdna-emu");
  auto rt = emulator_runtime("gfx942");
  ASSERT_FALSE(rt.ok());
  EXPECT_EQ(rt.error().code, Errc::driver_unavailable);
  EXPECT_EQ(rt.error().message.rfind("the AMD emulator is unavailable: ", 0), 0u) << rt.error().message;
  EXPECT_NE(rt.error().message.find("KILN_AMD_EMULATOR"), std::string::npos) << rt.error().message;
  // How to get it, not only which variable to set (issue 19).
  EXPECT_NE(rt.error().message.find("https://github.com/tinygrad/tinygrad at commit a9069c177a"), std::string::npos)
      << rt.error().message;
  EXPECT_NE(rt.error().message.find("docs/emulator.md"), std::string::npos) << rt.error().message;
}

TEST(EmulatorBackend, MissingPythonNamesTheFix) {
  KILN_REQUIRE_LLVM();
  ScopedEnv env("KILN_EMULATOR_PYTHON", "/nonexistent/bin/python3");
  auto rt = emulator_runtime("gfx942");
  ASSERT_FALSE(rt.ok());
  EXPECT_EQ(rt.error().code, Errc::driver_unavailable);
  EXPECT_NE(rt.error().message.find("scripts/setup.sh"), std::string::npos) << rt.error().message;
}

TEST(EmulatorBackend, PythonWithoutTinygradNamesTheFix) {
  KILN_REQUIRE_LLVM();
  testing::TempDir dir;
  // A "Python" whose imports all fail the way a missing tinygrad does.
  const std::string python = dir / "python3";
  std::ofstream(python) << "#!/bin/sh\nexec /usr/bin/python3 -S -I \"$@\"\n";
  ::chmod(python.c_str(), 0755);
  ScopedEnv env("KILN_EMULATOR_PYTHON", python);
  ScopedEnv no_path("PYTHONPATH", "");
  auto rt = emulator_runtime("gfx942");
  ASSERT_FALSE(rt.ok());
  EXPECT_EQ(rt.error().code, Errc::driver_unavailable) << rt.error().message;
  EXPECT_NE(rt.error().message.find("cannot import"), std::string::npos) << rt.error().message;
  EXPECT_NE(rt.error().message.find("scripts/setup.sh"), std::string::npos) << rt.error().message;
}

TEST(EmulatorBackend, HungChildTimesOutAndIsKilled) {
  KILN_REQUIRE_LLVM();
  testing::TempDir dir;
  const std::string python = dir / "python3";
  const std::string pidfile = dir / "pid";
  std::ofstream(python) << "#!/bin/sh\necho $$ > " << pidfile << "\nexec sleep 60\n";
  ::chmod(python.c_str(), 0755);
  ScopedEnv env("KILN_EMULATOR_PYTHON", python);
  ScopedEnv timeout("KILN_EMULATOR_TIMEOUT", "1");
  const auto t0 = std::chrono::steady_clock::now();
  auto rt = emulator_runtime("gfx942");
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(rt.ok());
  EXPECT_EQ(rt.error().code, Errc::timeout) << rt.error().message;
  EXPECT_NE(rt.error().message.find("KILN_EMULATOR_TIMEOUT"), std::string::npos) << rt.error().message;
  EXPECT_LT(s, 10.0);
  std::ifstream in(pidfile);
  pid_t pid = 0;
  ASSERT_TRUE(in >> pid);
  EXPECT_NE(::kill(pid, 0), 0) << "the hung child " << pid << " is still alive";
}

TEST(EmulatorBackend, MemoryIsCheckedAndHasNoTimingModel) {
  KILN_EMULATOR_OR_SKIP(rt, "gfx942");
  Device& d = *rt->device();
  EXPECT_EQ(d.target().name, "gfx942");
  EXPECT_NE(d.name().find("emulator"), std::string::npos) << d.name();
  auto p = d.malloc(100);
  ASSERT_TRUE(p.ok()) << p.error().message;
  const std::vector<uint8_t> in = {1, 2, 3, 4, 5};
  ASSERT_TRUE(d.memset(*p, 0xab, 100).ok());
  ASSERT_TRUE(d.copy_to_device(static_cast<char*>(*p) + 10, in.data(), in.size()).ok());
  std::vector<uint8_t> out(100);
  ASSERT_TRUE(d.copy_to_host(out.data(), *p, out.size()).ok());
  EXPECT_EQ(out[9], 0xab);
  EXPECT_EQ(out[10], 1);
  EXPECT_EQ(out[14], 5);
  EXPECT_EQ(out[15], 0xab);
  // Out of the allocation, and not an allocation: refused here, never sent to the emulator.
  auto past = d.copy_to_host(out.data(), static_cast<char*>(*p) + 1, 100);
  EXPECT_EQ(past.error().code, Errc::invalid_argument);
  EXPECT_EQ(d.memset(reinterpret_cast<void*>(0x1000), 0, 4).error().code, Errc::invalid_argument);
  EXPECT_EQ(d.free(reinterpret_cast<void*>(0x1000)).error().code, Errc::invalid_argument);
  ASSERT_TRUE(d.free(*p).ok());
  EXPECT_EQ(d.copy_to_host(out.data(), *p, 1).error().code, Errc::invalid_argument);  // freed
  auto t = d.time_ms(nullptr, [] { return ok(); });
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.error().code, Errc::unsupported);
  EXPECT_NE(t.error().message.find("no timing model"), std::string::npos);
}

TEST(EmulatorBackend, KernelThatCrashesTheEmulatorGivesAnError) {
  // Its own runtime: the crash takes its emulator process down.
  auto created = emulator_runtime("gfx942");
  if (!created && (created.error().code == Errc::driver_unavailable || created.error().code == Errc::unsupported))
    GTEST_SKIP() << created.error().message;
  ASSERT_TRUE(created.ok()) << created.error().message;
  Runtime& rt = **created;
  Device& d = *rt.device();
  const KernelSpec spec = rmsnorm_spec(1, 7, DType::f32);
  auto x = d.malloc(7 * 4), gamma = d.malloc(7 * 4);
  ASSERT_TRUE(x.ok() && gamma.ok());
  ASSERT_TRUE(d.memset(*x, 0, 7 * 4).ok());
  ASSERT_TRUE(d.memset(*gamma, 0, 7 * 4).ok());
  // y points at an unmapped page: the emulator, which checks nothing, dies of it.
  void* const buffers[] = {*x, *gamma, reinterpret_cast<void*>(0x1000)};
  auto launched = rt.launch(spec, buffers);
  ASSERT_FALSE(launched.ok());
  EXPECT_EQ(launched.error().code, Errc::driver_error) << launched.error().message;
  std::printf("the error: %s\n", launched.error().message.c_str());
  EXPECT_NE(launched.error().message.find("signal"), std::string::npos) << launched.error().message;
  EXPECT_NE(launched.error().message.find("kiln_rmsnorm"), std::string::npos) << launched.error().message;
  // Every later call fails at once with the same story.
  auto after = d.malloc(16);
  ASSERT_FALSE(after.ok());
  EXPECT_EQ(after.error().code, Errc::driver_error);
  EXPECT_NE(after.error().message.find("gone"), std::string::npos) << after.error().message;
}

// ---- the code-object reader and dispatch setup (no emulator needed) ------------------------

#if KILN_WITH_LLVM
TEST(HsacoImage, ReadsTheKernelArgumentsAndPreparesTheDispatch) {
  testing::TempDir dir;
  auto rt = testing::compile_only_runtime(dir.path());
  auto compiled = rt->compile(rmsnorm_spec(3, 8192), "gfx942");
  ASSERT_TRUE(compiled.ok()) << compiled.error().message;
  auto k = read_hsaco_kernel((*compiled)->code_object(), "kiln_rmsnorm");
  ASSERT_TRUE(k.ok()) << k.error().message;
  EXPECT_EQ(k->target, "gfx942");
  ASSERT_EQ(k->explicit_args, 5u);  // x, gamma, y, rows, eps
  EXPECT_EQ(k->args[2].offset, 16u);
  EXPECT_EQ(k->args[2].size, 8u);
  EXPECT_EQ(k->args[4].offset, 28u);
  EXPECT_EQ(k->args[4].size, 4u);
  EXPECT_GE(k->kernarg_bytes, 32u);
  EXPECT_LT(k->entry, k->image.size());

  uint64_t x = 0x1111'2222'3333'4444, g = 0x10, y = 0x20;
  int rows = 3;
  float eps = 0.5f;
  void* args[] = {&x, &g, &y, &rows, &eps};
  DispatchShape shape;
  shape.grid[0] = 3;
  shape.block[0] = 128;
  auto d = prepare_dispatch(*k, args, shape, /*kernarg=*/0xabcd'0000'1000, /*packet=*/0x2000, /*queue=*/0x3000);
  ASSERT_TRUE(d.ok()) << d.error().message;
  uint64_t got_x;
  float got_eps;
  std::memcpy(&got_x, d->kernarg.data(), 8);
  std::memcpy(&got_eps, d->kernarg.data() + 28, 4);
  EXPECT_EQ(got_x, x);
  EXPECT_EQ(got_eps, eps);
  // The kernarg pointer is the only user SGPR pair this kernel enables: s[0:1].
  ASSERT_GE(d->user_sgprs.size(), 2u);
  EXPECT_EQ(d->user_sgprs[0], 0x0000'1000u);
  EXPECT_EQ(d->user_sgprs[1], 0xabcdu);
  // LDS in rsrc2 (granules of 512 bytes): the descriptor has 0 there, the dispatch does not.
  const uint32_t granules = (d->rsrc2 >> 15) & 0x1ff;
  EXPECT_EQ(granules, (k->group_segment_bytes + 511) / 512);
  EXPECT_GT(granules, 0u);

  shape.block[0] = 2048;
  EXPECT_EQ(prepare_dispatch(*k, args, shape, 0, 0, 0).error().code, Errc::invalid_argument);
}

TEST(HsacoImage, RefusesCorruptCodeObjects) {
  testing::TempDir dir;
  auto rt = testing::compile_only_runtime(dir.path());
  auto compiled = rt->compile(rmsnorm_spec(3, 7), "gfx942");
  ASSERT_TRUE(compiled.ok()) << compiled.error().message;
  const std::span<const uint8_t> code = (*compiled)->code_object();
  EXPECT_EQ(read_hsaco_kernel(code, "no_such_kernel").error().code, Errc::corrupt);
  EXPECT_EQ(read_hsaco_kernel(code.first(100), "kiln_rmsnorm").error().code, Errc::corrupt);
  std::vector<uint8_t> junk(4096, 0x5a);
  EXPECT_EQ(read_hsaco_kernel(junk, "kiln_rmsnorm").error().code, Errc::corrupt);
}
#endif

}  // namespace
}  // namespace kiln
