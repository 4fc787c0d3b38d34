// Every op compiles for every target with every compiler, and the code objects are what the
// drivers expect: AMDGPU ELF shared objects whose metadata notes name the kernel with its
// registers and LDS, and CUDA ELF cubins that define the kernel symbol.
#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>

#include "templates/lib/library.h"
#include "templates/registry.h"
#include "codegen/codegen.h"
#include "compile/compiler.h"
#include "templates/gemm/gemm_mfma.h"
#include "test_util.h"

#if KILN_WITH_LLVM
#include <llvm/Object/ELFObjectFile.h>

#include "compile/amdgpu_metadata.h"
#endif

namespace kiln {
namespace {
using testing::gemm_spec;
using testing::rmsnorm_spec;
using testing::swiglu_spec;

struct Case {
  const char* target;
  const char* compiler;
};

// ptxas's advisories C7512 / C7513 / C7515 mean that it serialized every wgmma.mma_async of the
// kernel (too few registers; a non-WGMMA instruction defines a WGMMA's input or accumulator
// registers inside a pipeline stage). The Hopper attention forward had C7515 from its masks' writes
// into the score accumulators: removing it took the forward from 0.81 to 0.97 of cuDNN
// (2026-11-26). NVRTC's log carries ptxas's report (--ptxas-options=-v); clang's compile does not.
void expect_wgmma_not_serialized(const std::string& nvrtc_log) {
  for (const char* advisory : {"C7512", "C7513", "C7515"})
    EXPECT_EQ(nvrtc_log.find(advisory), std::string::npos) << "ptxas serialized the WGMMAs:\n" << nvrtc_log;
}

// The Hopper backward's register budget (sm_90a, NVRTC): `config` of `spec` compiles with its WGMMAs
// pipelined and at most 32 bytes of spill stores.
void expect_fits_the_hopper_backward(Compiler& compiler, const KernelSpec& spec, const KernelConfig& config) {
  auto src = generate(spec, **find_target("sm_90a"), &config);
  ASSERT_TRUE(src.ok()) << src.error().message;
  auto out = compiler.compile(*src);
  ASSERT_TRUE(out.ok()) << out.error().message;
  EXPECT_LE(out->info.spill_stores, 32);
  expect_wgmma_not_serialized(out->log);
}

// Every op's own test specs for the target (a new op is compiled here without a line in this
// file), one per distinct baked spec, plus two large GEMMs.
std::vector<KernelSpec> every_op_and_dtype(const TargetInfo& target) {
  std::vector<KernelSpec> specs;
  std::set<std::string> seen;
  for (const OpTemplate* op : all_ops())
    for (const TestSpec& t : op->test_specs(target))
      if (seen.insert(to_string(op->baked_spec(t.spec))).second) specs.push_back(t.spec);
  specs.push_back(gemm_spec(8192, 6144, 4096, false, false));  // big tiles, dgrad
  specs.push_back(gemm_spec(8192, 6144, 4096, false, true));   // the forward
  return specs;
}

#if KILN_WITH_LLVM
std::set<std::string> elf_symbols(std::span<const uint8_t> bytes) {
  std::set<std::string> names;
  auto file = llvm::object::ELF64LEObjectFile::create(
      llvm::MemoryBufferRef(llvm::StringRef(reinterpret_cast<const char*>(bytes.data()), bytes.size()), "code"));
  if (!file) {
    llvm::consumeError(file.takeError());
    return names;
  }
  for (const auto& sym : file->symbols())
    if (auto name = sym.getName()) names.insert(name->str());
    else llvm::consumeError(name.takeError());
  return names;
}
#endif

class CompileEveryTarget : public ::testing::TestWithParam<Case> {};

TEST_P(CompileEveryTarget, ProducesAValidCodeObject) {
  const Case c = GetParam();
  const TargetInfo& target = **find_target(c.target);
#if !KILN_WITH_LLVM
  if (std::string(c.compiler) == "clang") GTEST_SKIP() << "built without LLVM (KILN_WITH_LLVM=OFF)";
#endif
  auto compiler = compiler_for(target, c.compiler);
  if (!compiler && compiler.error().code == Errc::driver_unavailable) GTEST_SKIP() << compiler.error().message;
  ASSERT_TRUE(compiler.ok()) << compiler.error().message;
  for (const KernelSpec& spec : every_op_and_dtype(target)) {
    SCOPED_TRACE(to_string(spec));
    auto src = generate(spec, target);
    ASSERT_TRUE(src.ok()) << src.error().message;
    auto out = (*compiler)->compile(*src);
    ASSERT_TRUE(out.ok()) << out.error().message;
    // No compiler warnings (clang's are CompiledCode::log), but one known: clang's NVPTX does not
    // unroll quantize_fp8's grid-stride amax loop (`#pragma unroll 4` over a runtime trip count;
    // NVRTC, the default NVIDIA compiler, and the AMD compile do).
    const bool known_warning = spec.op == "quantize_fp8" && target.vendor == Vendor::nvidia &&
                               out->log.find("loop not unrolled") != std::string::npos;
    // NVRTC writes its own as "warning #177-D: ..." (until 2026-11-28 every NVIDIA kernel had #177,
    // unused constants of the prelude, and the causal attention forward #39, a division by zero in
    // its discarded softcap branch).
    if (!known_warning) {
      EXPECT_EQ(out->log.find("warning:"), std::string::npos) << to_string(spec) << ": " << out->log;
      EXPECT_EQ(out->log.find("warning #"), std::string::npos) << to_string(spec) << ": " << out->log;
    }
    const CodeObject& code = out->code;
    EXPECT_TRUE(validate_code_object(code, target).ok());
    EXPECT_EQ(code.format, target.vendor == Vendor::amd ? "hsaco" : "cubin");
    const auto& b = code.bytes;
    ASSERT_GT(b.size(), 64u);
    EXPECT_EQ(b[0], 0x7f);
    EXPECT_EQ(b[1], 'E');
    const unsigned e_machine = b[18] | (b[19] << 8);
    EXPECT_EQ(e_machine, target.vendor == Vendor::amd ? 224u : 190u);  // EM_AMDGPU / EM_CUDA

    const CodeObjectInfo& info = out->info;
    EXPECT_EQ(info.kernel, src->kernel_name);
    EXPECT_GT(info.registers, 0);
    EXPECT_GE(info.shared_bytes, 0);
    EXPECT_EQ(info.wave_size, target.wave_size);
    if (spec.op == "gemm" && src->config.count("WGMMA")) {
      // The WGMMA kernel's stages are dynamic shared memory: nothing static.
      EXPECT_EQ(info.shared_bytes, 0);
    } else if (spec.op == "gemm" && src->config.count("MFMA")) {
      // The MFMA kernel's two LDS stages of [BM + BN][BK + 8] 16-bit elements.
      EXPECT_EQ(info.shared_bytes, mfma_lds_bytes(src->config));
    } else if (spec.op == "gemm") {
      // The LDS tiles: (BK x (BM + 1) + BK x (BN + 1)) fp32.
      const int64_t expect = 4 * src->config.at("BK") * (src->config.at("BM") + 1 + src->config.at("BN") + 1);
      EXPECT_EQ(info.shared_bytes, expect);
    }
    // Known: NVRTC spills 16 bytes in the portable fp32 gemm.kernel with trans_a on sm_90a (fp32
    // GEMMs do not take the tensor-core path there), and 8 bytes in the portable gemm_fp8.kernel on
    // sm_90a at 64 registers (not yet understood; that kernel stands in until the fp8 WGMMA one).
    // Known: the Hopper attention kernels (384 threads, so ptxas gives them 168 registers) spill:
    // the forward (attention_sm90.kernel) up to a few hundred bytes with clang's PTX and none with
    // NVRTC's (the default NVIDIA compiler); the backward (attention_bwd_sm90.kernel) up to 32
    // bytes with NVRTC and up to about 1100 with clang, 1704 in the atomic-dQ dK/dV kernel at head
    // dim 128 (the choice for MHA and unmasked batches since 2026-11-29). The TMA kernels of the
    // fp8 GEMM and the grouped GEMM (384 or 512 threads) spill nothing with NVRTC and up to about 900
    // bytes with clang's PTX, where ptxas does not give the consumer warpgroups the registers
    // setmaxnreg raises them to. The one-block delayed-scaling history push
    // (kiln_fp8_amax_history, 1024 threads: 64 registers), in the module of every spec whose plan
    // launches it (quantize_fp8 and the fused fp8 outputs with delayed scaling), spills 20 bytes
    // with clang's PTX, none with NVRTC's. cross_entropy's grad_inplace kernel (1024 threads on
    // NVIDIA: 64 registers) spills up to about 80 bytes with clang's PTX, none with NVRTC's.
    // Everything else must not spill.
    const bool known_spill = (spec.op == "gemm" && spec.dtype == DType::f32 && target.vendor == Vendor::nvidia) ||
                             (spec.op == "gemm_fp8" && target.vendor == Vendor::nvidia);
    const bool clang = std::string(c.compiler) == "clang";
    const bool warp_specialized = ((spec.op == "attention" || spec.op == "attention_bwd") && src->config.count("WGMMA")) ||
                                  ((spec.op == "gemm_fp8" || spec.op == "grouped_gemm") && src->config.count("TMA"));
    const OpTemplate& op = **find_op(spec.op);
    const Plan plan = op.plan(op.with_defaults(spec), src->config);
    const bool history_push =
        target.vendor == Vendor::nvidia && clang &&
        std::any_of(plan.launches.begin(), plan.launches.end(),
                    [](const Launch& l) { return l.kernel == "kiln_fp8_amax_history"; });
    const bool ce_grad = target.vendor == Vendor::nvidia && clang && src->config.count("GRAD");
    const int64_t allowed = warp_specialized ? (clang ? 2048 : spec.op == "attention_bwd" ? 32 : 0)
                            : history_push    ? 32
                            : ce_grad         ? 128
                            : known_spill     ? 16
                                              : 0;
    EXPECT_LE(info.spill_stores, allowed) << "no spills expected in these small kernels";
    if (target.vendor == Vendor::nvidia && !clang) expect_wgmma_not_serialized(out->log);
#if KILN_WITH_LLVM
    const auto symbols = elf_symbols(b);
    EXPECT_TRUE(symbols.count(src->kernel_name)) << "kernel symbol missing from the ELF";
    if (target.vendor == Vendor::amd) {
      // The metadata note, read independently of the compile path's own parse.
      auto meta = read_amdgpu_metadata(b, src->kernel_name);
      ASSERT_TRUE(meta.ok()) << meta.error().message;
      EXPECT_EQ(meta->wave_size, 64);
      EXPECT_GT(meta->sgprs, 0);
      EXPECT_EQ(meta->scratch_bytes, 0);
    }
#endif
  }
}

INSTANTIATE_TEST_SUITE_P(Targets, CompileEveryTarget,
                         ::testing::Values(Case{"gfx942", "clang"}, Case{"gfx950", "clang"}, Case{"sm_90a", "nvrtc"},
                                           Case{"sm_90a", "clang"}),
                         [](const auto& info) { return std::string(info.param.target) + "_" + info.param.compiler; });

// The NVIDIA compilers of this build: NVRTC, and clang where it has LLVM.
std::vector<const char*> nvidia_compilers() {
#if KILN_WITH_LLVM
  return {"nvrtc", "clang"};
#else
  return {"nvrtc"};
#endif
}

// rmsnorm's LOAD candidates (sm_90a): inline PTX that both NVIDIA compilers accept, the cache
// hints in the PTX, and no spills.
TEST(Compile, RmsNormLoadCandidatesCarryTheirCacheHints) {
  const TargetInfo& target = **find_target("sm_90a");
  const OpTemplate* norm = *find_op("rmsnorm");
  for (const char* name : nvidia_compilers()) {
    auto compiler = compiler_for(target, name);
    if (!compiler && compiler.error().code == Errc::driver_unavailable) GTEST_SKIP() << compiler.error().message;
    ASSERT_TRUE(compiler.ok()) << compiler.error().message;
    for (int64_t hidden : {4096, 16384}) {
      const KernelSpec spec = rmsnorm_spec(8, hidden);
      int loads = 0;
      for (const KernelConfig& c : norm->tuning_candidates(spec, target)) {
        if (!c.count("LOAD")) continue;
        ++loads;
        SCOPED_TRACE(std::string(name) + ": " + config_string(c));
        auto src = generate(spec, target, &c);
        ASSERT_TRUE(src.ok()) << src.error().message;
        auto out = (*compiler)->compile(*src);
        ASSERT_TRUE(out.ok()) << out.error().message;
        EXPECT_EQ(out->info.spill_stores, 0);
        auto ptx = (*compiler)->emit(*src, Emit::assembly);
        ASSERT_TRUE(ptx.ok()) << ptx.error().message;
        const int64_t load = c.at("LOAD");
        EXPECT_EQ(ptx->find("ld.global.nc") == std::string::npos, true) << "x and gamma bypass the read-only path";
        EXPECT_EQ(ptx->find("L2::evict_last") != std::string::npos, load >= 2);
        EXPECT_EQ(ptx->find("L2::evict_first") != std::string::npos, load == 3);
      }
      EXPECT_EQ(loads, 3) << hidden;
    }
  }
}

// The PTX of spec's heuristic kernel for sm_90a from the NVIDIA compiler `name`.
Result<std::string> sm90_ptx(const KernelSpec& spec, const char* name) {
  const TargetInfo& target = **find_target("sm_90a");
  auto compiler = compiler_for(target, name);
  if (!compiler) return compiler.error();
  auto src = generate(spec, target);
  if (!src) return src.error();
  return (*compiler)->emit(*src, Emit::assembly);
}

// Calls check(spec, ptx) on the sm_90a PTX of each spec from each NVIDIA compiler, with the
// compiler and spec in the failure trace. Returns why the test should skip (no NVIDIA compiler
// here), or "" once every spec was checked (or one failed to compile, a test failure).
template <class Check>
std::string check_sm90_ptx(std::span<const KernelSpec> specs, Check check) {
  for (const char* name : nvidia_compilers())
    for (const KernelSpec& spec : specs) {
      SCOPED_TRACE(std::string(name) + ": " + to_string(spec));
      auto ptx = sm90_ptx(spec, name);
      if (!ptx && ptx.error().code == Errc::driver_unavailable) return ptx.error().message;
      EXPECT_TRUE(ptx.ok()) << ptx.error().message;
      if (!ptx) return "";
      check(spec, *ptx);
    }
  return "";
}

// Cross-entropy's passes are issue-bound on an H200 (ncu, 2026-11-28: 1.11e9 instructions for
// 1.05e9 logits, issue slots 73% busy): each exponential is one ex2.approx.ftz (the plain form
// scales subnormal results around it, four instructions) and each pair of bf16 results one
// cvt.rn.bf16x2.f32 (lib/pack's from_floats), in the loss, its fused gradient and the backward.
// rmsnorm's forward converts a pack at a time too, with and without the residual (H100,
// 2026-11-28: hidden 16384 0.1872 -> 0.1825 ms).
TEST(Compile, CrossEntropyAndRmsNormConvertAPackAtATime) {
  KernelSpec residual = rmsnorm_spec(8192, 16384);
  residual.params["residual"] = 1;
  const KernelSpec specs[] = {
      {"cross_entropy", DType::bf16, DType::bf16, {{"tokens", 8192}, {"vocab", 128256}, {"grad_inplace", 1}}},
      {"cross_entropy", DType::bf16, DType::bf16, {{"tokens", 8192}, {"vocab", 32000}, {"grad_inplace", 1}}},
      {"cross_entropy_bwd", DType::bf16, DType::bf16, {{"tokens", 8192}, {"vocab", 128256}}},
      rmsnorm_spec(8192, 16384),
      residual};
  const std::string skip = check_sm90_ptx(specs, [](const KernelSpec& spec, const std::string& ptx) {
    if (spec.op != "rmsnorm") {
      EXPECT_NE(ptx.find("ex2.approx.ftz.f32"), std::string::npos);
      EXPECT_EQ(ptx.find("ex2.approx.f32"), std::string::npos) << "an exponential with the subnormal scaling";
    }
    EXPECT_NE(ptx.find("cvt.rn.bf16x2.f32"), std::string::npos);
    EXPECT_EQ(ptx.find("cvt.rn.bf16.f32"), std::string::npos) << "a bf16 result converted alone";
  });
  if (!skip.empty()) GTEST_SKIP() << skip;
}

// swiglu's and swiglu_bwd's sigmoid (the preludes' kiln::sigmoid) is one ex2.approx.ftz and one
// rcp.approx.ftz: no IEEE division (div.rn / rcp.rn, with their slow paths) and no exponential with
// the subnormal scaling. On an H200 that took both ops' rows from 0.93 to 1.0x torch.compile.
TEST(Compile, SwigluSigmoidIsOneExponentialAndOneReciprocal) {
  std::vector<KernelSpec> specs;
  for (const char* op : {"swiglu", "swiglu_bwd"})
    for (int64_t fp8_out : {0, 1})
      specs.push_back({op, DType::bf16, DType::bf16, {{"rows", 8192}, {"intermediate", 14336}, {"fp8_out", fp8_out}}});
  const std::string skip = check_sm90_ptx(specs, [](const KernelSpec& spec, const std::string& ptx) {
    EXPECT_NE(ptx.find("ex2.approx.ftz.f32"), std::string::npos);
    EXPECT_NE(ptx.find("rcp.approx.ftz.f32"), std::string::npos);
    EXPECT_EQ(ptx.find("ex2.approx.f32"), std::string::npos) << "an exponential with the subnormal scaling";
    if (spec.param("fp8_out") != 0) return;  // the fp8 kernels divide once a row, for the scale
    EXPECT_EQ(ptx.find("div.rn.f32"), std::string::npos) << "an IEEE division";
    EXPECT_EQ(ptx.find("rcp.rn.f32"), std::string::npos) << "an IEEE reciprocal";
  });
  if (!skip.empty()) GTEST_SKIP() << skip;
}

TEST(Compile, EveryTuningCandidateCompilesWithItsTileOrderGroup) {
  const TargetInfo& target = **find_target("sm_90a");
  const OpTemplate* gemm = *find_op("gemm");
  for (auto [ta, tb] : {std::pair{false, true}, std::pair{false, false}, std::pair{true, false}})
  for (const char* name : nvidia_compilers()) {
    const KernelSpec spec = gemm_spec(1024, 1024, 1024, ta, tb);
    auto compiler = compiler_for(target, name);
    if (!compiler && compiler.error().code == Errc::driver_unavailable) GTEST_SKIP() << compiler.error().message;
    ASSERT_TRUE(compiler.ok()) << compiler.error().message;
    for (const KernelConfig& c : gemm->tuning_candidates(spec, target)) {
      SCOPED_TRACE(std::string(name) + ": " + config_string(c));
      auto src = generate(spec, target, &c);
      ASSERT_TRUE(src.ok()) << src.error().message;
      // The kernel's GROUP_M is the configuration's (8, the kernel's own, when it has none).
      src->text += fmt::format("\nstatic_assert(GROUP_M == {}, \"tile-order group\");\n",
                               c.count("GROUP_M") ? c.at("GROUP_M") : 8);
      auto out = (*compiler)->compile(*src);
      ASSERT_TRUE(out.ok()) << out.error().message;
      EXPECT_EQ(out->info.spill_stores, 0);
    }
  }
}

// The Hopper attention forward's tuning candidates at head dim 128 without a mask, 176-key blocks
// (m64n176k16, 88 accumulators) among them, compile with NVRTC without spills and without ptxas
// serializing the WGMMAs (its advisories C7512 / C7513 / C7515).
TEST(Compile, AttentionTuningCandidatesCompileWithTheirKeyBlocks) {
  const TargetInfo& target = **find_target("sm_90a");
  const OpTemplate* op = *find_op("attention");
  auto compiler = compiler_for(target, "nvrtc");
  if (!compiler && compiler.error().code == Errc::driver_unavailable) GTEST_SKIP() << compiler.error().message;
  ASSERT_TRUE(compiler.ok()) << compiler.error().message;
  for (DType t : {DType::bf16, DType::f16}) {
    const KernelSpec spec{"attention", t, t,
                          {{"batch", 1}, {"seqlen_q", 300}, {"seqlen_k", 300}, {"heads", 4}, {"kv_heads", 2}, {"head_dim", 128}}};
    int wide = 0;
    for (const KernelConfig& c : op->tuning_candidates(op->with_defaults(spec), target)) {
      if (!c.count("WGMMA")) continue;
      SCOPED_TRACE(fmt::format("{}: {}", dtype_name(t), config_string(c)));
      wide += c.count("BN") && c.at("BN") == 176;
      auto src = generate(spec, target, &c);
      ASSERT_TRUE(src.ok()) << src.error().message;
      auto out = (*compiler)->compile(*src);
      ASSERT_TRUE(out.ok()) << out.error().message;
      EXPECT_EQ(out->info.spill_stores, 0);
      expect_wgmma_not_serialized(out->log);
    }
    EXPECT_EQ(wide, 2) << "176-key blocks, persistent and not";
  }
}

// The PTX of the Hopper (TMA + WGMMA) kernels of an attention op at heads 4/2, 300 tokens, causal
// (NVRTC): `kernel(name)` the text from an .entry to the next (empty name: all of it), and the
// count of `what` in it.
struct AttentionPtx {
  std::string text;
  std::string_view kernel(const std::string& name = "") const {
    if (name.empty()) return text;
    const size_t at = text.find(".entry " + name + "(");
    if (at == std::string::npos) return {};
    return std::string_view(text).substr(at, text.find(".entry ", at + 1) - at);
  }
  int count(const std::string& what, const std::string& from = "") const {
    const std::string_view k = kernel(from);
    if (k.empty()) return -1;
    int n = 0;
    for (size_t i = k.find(what); i != std::string_view::npos; i = k.find(what, i + 1)) ++n;
    return n;
  }
};
// `pick` (optional) chooses the configuration among the op's tuning candidates instead of the
// heuristic's.
Result<AttentionPtx> attention_ptx(const char* op, int64_t head_dim, int64_t softcap, int64_t deterministic = 0,
                                   const std::function<bool(const KernelConfig&)>& pick = {}) {
  const TargetInfo& target = **find_target("sm_90a");
  KILN_ASSIGN_OR_RETURN(auto compiler, compiler_for(target, "nvrtc"));
  KernelSpec spec{op, DType::bf16, DType::bf16,
                  {{"batch", 1}, {"seqlen_q", 300}, {"seqlen_k", 300}, {"heads", 4}, {"kv_heads", 2},
                   {"head_dim", head_dim}, {"causal", 1}, {"softcap", softcap}}};
  if (std::string_view(op) == "attention_bwd") spec.params["deterministic"] = deterministic;
  std::optional<KernelConfig> config;
  if (pick) {
    const OpTemplate& o = **find_op(op);
    const auto cs = o.tuning_candidates(o.with_defaults(spec), target);
    const auto c = std::find_if(cs.begin(), cs.end(), pick);
    if (c == cs.end()) return make_error(Errc::unsupported, "no tuning candidate of that kind");
    config = *c;
  }
  KILN_ASSIGN_OR_RETURN(auto src, generate(spec, target, config ? &*config : nullptr));
  if (!src.config.count("WGMMA")) return make_error(Errc::unsupported, "not the TMA + WGMMA kernels");
  KILN_ASSIGN_OR_RETURN(std::string ptx, compiler->emit(src, Emit::assembly));
  return AttentionPtx{std::move(ptx)};
}

// The Hopper backward keeps few copies of its passes: NVRTC's optimizer and ptxas take time with
// the code's size, and issue 15 asks for a cold compile under 1 s. Counted by P's exponentials in
// each kernel's PTX, 32 per copy of a pass (a thread's 64 x 64 tile fragment): the dq kernel's
// pipelined loop holds three copies of its step (alternate_last_in_a), each with a masked-tile
// copy of its pass at head dim 128 and none at 64 (the pairs past the limit cleared after the
// pass); the dK/dV kernel five steps at 64 (alternate) without masked copies, and one step with
// its masked copy at 128. d3d30d3 had 320 in the dq kernel at both head dims and in the dK/dV
// kernel at 64 (five steps, two copies each); attention_bwd took 1.1-1.2 s to compile there.
// (deterministic = 1: at head dim 64 the default is otherwise the atomic-dQ dK/dV kernel.)
TEST(Compile, AttentionBackwardKeepsFewCopiesOfItsPasses) {
  struct Expect {
    int64_t head_dim;
    int dq, dkdv;
  };
  for (const Expect& e : {Expect{64, 96, 160}, Expect{128, 192, 64}}) {
    SCOPED_TRACE(fmt::format("head_dim {}", e.head_dim));
    auto ptx = attention_ptx("attention_bwd", e.head_dim, 0, 1);
    if (!ptx && ptx.error().code == Errc::driver_unavailable) GTEST_SKIP() << ptx.error().message;
    ASSERT_TRUE(ptx.ok()) << ptx.error().message;
    // Exponentials per kernel: from its .entry to the next.
    EXPECT_EQ(ptx->count("ex2.approx", "kiln_attention_bwd_dq"), e.dq);
    EXPECT_EQ(ptx->count("ex2.approx", "kiln_attention_bwd_dkdv"), e.dkdv);
  }
}

// The atomic-dQ backward (ATOMIC_DQ, FlashAttention-3's five GEMMs: the dK/dV kernel adds dQ into
// an fp32 workspace) is a tuning candidate with deterministic = 0 only, and the choice there for
// fixed-length batches at head dim 64 and, at 128, for MHA or unmasked ones (the deterministic
// kernels then a candidate); with NVRTC its dK/dV kernel has its WGMMAs pipelined and spills at
// most the 32 bytes allowed the Hopper backward above (with dS^T as a register operand ptxas
// serialized every WGMMA; all of dQ beside P^T in registers spilled 772 bytes; at head dim 128,
// dQ's column halves beside block n + 1's S^T and dP^T spilled 316 bytes, serialized, and the
// stmatrix addresses per 16-byte chunk held live 28 more).
TEST(Compile, AttentionBackwardAtomicDqIsACandidateWithoutDeterminismAndFitsTheRegisters) {
  const TargetInfo& target = **find_target("sm_90a");
  const OpTemplate& op = **find_op("attention_bwd");
  auto atomic = [](const KernelConfig& c) { return c.count("ATOMIC_DQ") && c.at("ATOMIC_DQ") != 0; };
  auto spec = [](int64_t d, int64_t causal, int64_t det, DType t) {
    return KernelSpec{"attention_bwd", t, t,
                      {{"batch", 2}, {"seqlen_q", 333}, {"seqlen_k", 400}, {"heads", 4}, {"kv_heads", 2},
                       {"head_dim", d}, {"causal", causal}, {"deterministic", det}}};
  };
  auto has_atomic = [&](const KernelSpec& s, const TargetInfo& t) {
    const auto cs = op.tuning_candidates(op.with_defaults(s), t);
    return std::any_of(cs.begin(), cs.end(), atomic);
  };
  EXPECT_TRUE(has_atomic(spec(64, 1, 0, DType::bf16), target));
  EXPECT_FALSE(has_atomic(spec(64, 1, 1, DType::bf16), target)) << "deterministic = 1 keeps the ordered dq";
  EXPECT_TRUE(has_atomic(spec(128, 1, 0, DType::bf16), target)) << "head dim 128: dQ's columns split between the consumers";
  EXPECT_TRUE(atomic(op.variants(op.with_defaults(spec(128, 0, 0, DType::bf16)), target).front()))
      << "head dim 128 without a mask: the choice";
  EXPECT_FALSE(atomic(op.variants(op.with_defaults(spec(128, 1, 0, DType::bf16)), target).front()))
      << "head dim 128, causal GQA: the deterministic kernels (a tie on the H200)";
  for (int64_t d : {64, 128}) {
    const KernelSpec packed{"attention_bwd", DType::bf16, DType::bf16,
                            {{"layout", 1}, {"batch", 2}, {"total_q", 666}, {"total_k", 800}, {"max_seqlen_q", 333},
                             {"max_seqlen_k", 400}, {"heads", 4}, {"kv_heads", 2}, {"head_dim", d}, {"deterministic", 0}}};
    EXPECT_FALSE(atomic(op.variants(op.with_defaults(packed), target).front()))
        << "head dim " << d << ", packed: the deterministic kernels (2-17% ahead on the H200)";
    EXPECT_TRUE(has_atomic(packed, target));
  }
  EXPECT_FALSE(has_atomic(spec(64, 1, 0, DType::bf16), **find_target("gfx942")));
  EXPECT_TRUE(atomic(op.variants(op.with_defaults(spec(64, 1, 0, DType::bf16)), target).front()));
  EXPECT_FALSE(atomic(op.variants(op.with_defaults(spec(64, 1, 1, DType::bf16)), target).front()));
  for (int64_t d : {64, 128}) {
    const auto cands = op.tuning_candidates(op.with_defaults(spec(d, 1, 0, DType::bf16)), target);
    EXPECT_TRUE(std::any_of(cands.begin(), cands.end(), [&](const KernelConfig& c) { return !atomic(c); }))
        << "the deterministic kernels stay a tuning candidate";
  }
  auto compiler = compiler_for(target, "nvrtc");
  if (!compiler && compiler.error().code == Errc::driver_unavailable) GTEST_SKIP() << compiler.error().message;
  ASSERT_TRUE(compiler.ok()) << compiler.error().message;
  for (const KernelSpec& s : {spec(64, 1, 0, DType::bf16), spec(64, 0, 0, DType::f16), spec(128, 1, 0, DType::bf16),
                              spec(128, 0, 0, DType::f16)}) {
    SCOPED_TRACE(to_string(s));
    const auto cs = op.tuning_candidates(op.with_defaults(s), target);
    const auto c = std::find_if(cs.begin(), cs.end(), atomic);
    ASSERT_NE(c, cs.end());
    expect_fits_the_hopper_backward(**compiler, s, *c);
    // D, dK/dV (with dQ), [dk and dv from their workspace,] then dq from the workspace
    const Plan plan = op.plan(op.with_defaults(s), *c);
    const bool split = c->count("KV_SPLIT") && c->at("KV_SPLIT") == 2;
    ASSERT_EQ(plan.launches.size(), split ? 4u : 3u);
    EXPECT_EQ(plan.launches.back().kernel, "kiln_attention_bwd_dq_convert");
    EXPECT_GT(plan.workspace_bytes, uint64_t{2 * 4 * 333 * 4} + uint64_t(4 * 333 * s.param("head_dim") * 4));
  }
}

// Head dim 128's atomic dK/dV kernel adds its half of dQ as soon as dQ's own WGMMA group completes,
// under dK and block n + 1's S^T: the reductions (red.global.add.v4.f32) follow a wait for all but
// one group, not the step's last wait. Issued after the last wait, their source registers held the
// next step's first product back until the load/store unit had sent them (ncu, H200, 2026-11-29:
// 10% of the kernel's warp-stall samples); the order below is 3-5% faster (docs/attention.md).
// 433226d's kernel: none after a wait<1>, 48 after a wait<0>.
TEST(Compile, AttentionBackwardAddsDqUnderTheNextProducts) {
  auto ptx = attention_ptx("attention_bwd", 128, 0, 0, [](const KernelConfig& k) {  // the atomic dQ, KV_SPLIT 2
    return k.count("ATOMIC_DQ") && k.at("ATOMIC_DQ") == 1 && k.count("KV_SPLIT") && k.at("KV_SPLIT") == 2;
  });
  if (!ptx && ptx.error().code == Errc::driver_unavailable) GTEST_SKIP() << ptx.error().message;
  ASSERT_TRUE(ptx.ok()) << ptx.error().message;
  const std::string_view t = ptx->kernel("kiln_attention_bwd_dkdv");
  ASSERT_FALSE(t.empty());
  int under = 0, after_all = 0;
  constexpr std::string_view wait = "wgmma.wait_group.sync.aligned";
  for (size_t i = t.find("red.global.add"); i != std::string_view::npos; i = t.find("red.global.add", i + 1)) {
    const size_t w = t.rfind(wait, i);
    if (w == std::string_view::npos) continue;
    const char n = t[t.find_first_not_of(" \t", w + wait.size())];
    (n == '1' ? under : after_all) += 1;
  }
  // A step's eight reductions of dQ's half after wait_group 1; after the last wait only the 32 of
  // KV_SPLIT's dK and dV sums once the loop is done.
  EXPECT_GE(under, 8);
  EXPECT_EQ(after_all, 32);
}

// KV_SPLIT 2: with the atomic dQ, a causal GQA backward splits each kv head's group of query heads
// between two blocks per 128 keys (the heuristic's choice at head dim 64; a candidate wherever the
// group is even), whose dK and dV sums meet in an fp32 workspace that a launch converts: twice the
// dK/dV blocks, the workspace zeroed by the D launch also without queries, every kernel within the
// Hopper backward's 32 bytes of spill with NVRTC.
TEST(Compile, AttentionBackwardSplitsTheGroupsOfACausalGqaBackward) {
  const TargetInfo& target = **find_target("sm_90a");
  const OpTemplate& op = **find_op("attention_bwd");
  auto split = [](const KernelConfig& c) { return c.count("KV_SPLIT") && c.at("KV_SPLIT") == 2; };
  auto spec = [](int64_t heads, int64_t kv_heads, int64_t d, int64_t causal, int64_t det) {
    return KernelSpec{"attention_bwd", DType::bf16, DType::bf16,
                      {{"batch", 2}, {"seqlen_q", 333}, {"seqlen_k", 400}, {"heads", heads}, {"kv_heads", kv_heads},
                       {"head_dim", d}, {"causal", causal}, {"deterministic", det}}};
  };
  auto choice = [&](const KernelSpec& s) { return op.variants(op.with_defaults(s), target).front(); };
  auto candidates = [&](const KernelSpec& s) { return op.tuning_candidates(op.with_defaults(s), target); };
  auto has_split = [&](const KernelSpec& s) {
    const auto cs = candidates(s);
    return std::any_of(cs.begin(), cs.end(), split);
  };
  EXPECT_TRUE(split(choice(spec(8, 2, 64, 1, 0))));
  EXPECT_FALSE(split(choice(spec(8, 2, 64, 0, 0)))) << "no mask: equal blocks";
  EXPECT_TRUE(has_split(spec(8, 2, 64, 0, 0)));
  EXPECT_FALSE(split(choice(spec(4, 4, 64, 1, 0)))) << "no group to split";
  EXPECT_FALSE(has_split(spec(6, 2, 64, 1, 0))) << "an odd group";
  EXPECT_FALSE(has_split(spec(8, 2, 64, 1, 1))) << "deterministic = 1 keeps the ordered kernels";
  EXPECT_FALSE(split(choice(spec(8, 2, 128, 1, 0)))) << "head dim 128, causal GQA: the deterministic kernels";
  EXPECT_TRUE(has_split(spec(8, 2, 128, 1, 0)));

  const KernelSpec s = op.with_defaults(spec(8, 2, 64, 1, 0));
  const KernelConfig c = choice(s);
  KernelConfig unsplit = c;
  unsplit["KV_SPLIT"] = 1;
  const Plan plan = op.plan(s, c), plain = op.plan(s, unsplit);
  ASSERT_EQ(plan.launches.size(), 4u);
  EXPECT_EQ(plan.launches[2].kernel, "kiln_attention_bwd_dkdv_convert");
  EXPECT_EQ(plan.launches[1].geometry.grid.y, 2 * plain.launches[1].geometry.grid.y);
  // dK and dV's workspace: (400 x 2 / 128 + 2 + 1) tiles x 2 kv heads x 2 x 128 x 64 fp32
  EXPECT_EQ(plan.workspace_bytes - plain.workspace_bytes, uint64_t{9 * 2 * 2 * 128 * 64 * 4});
  KernelSpec no_queries = s;  // sequences of no queries: dk, dv = 0 from the zeroed workspace
  no_queries.params["seqlen_q"] = 0;
  const Plan empty = op.plan(no_queries, c);
  ASSERT_EQ(empty.launches.size(), 3u);
  EXPECT_EQ(empty.launches[0].kernel, "kiln_attention_bwd_dot");
  EXPECT_EQ(empty.launches[0].geometry.grid.x, 1u);
  EXPECT_EQ(empty.launches[2].kernel, "kiln_attention_bwd_dkdv_convert");

  auto compiler = compiler_for(target, "nvrtc");
  if (!compiler && compiler.error().code == Errc::driver_unavailable) GTEST_SKIP() << compiler.error().message;
  ASSERT_TRUE(compiler.ok()) << compiler.error().message;
  for (const KernelSpec& t : {spec(8, 2, 64, 1, 0), spec(8, 2, 128, 1, 0)}) {
    SCOPED_TRACE(to_string(t));
    const auto cs = candidates(t);
    const auto k = std::find_if(cs.begin(), cs.end(), split);
    ASSERT_NE(k, cs.end());
    expect_fits_the_hopper_backward(**compiler, t, *k);
  }
}

// The logit softcap's tanh is one tanh.approx.f32 (MUFU.TANH), without IEEE division (div.rn.f32,
// whose out-of-line slow path ptxas kept in every pass). H200, heads 32/8, head dim 128, s8192,
// causal, softcap 30, forward / backward: 2.92 / 7.03 ms with div.rn in tanh's exp form, 1.52 / 4.41
// with div.full, 1.09 / 3.73 with tanh.approx (2026-11-28, bench/results/h200-2026-11-28-session22).
TEST(Compile, AttentionSoftcapIsOneTanhInstruction) {
  for (const char* op : {"attention", "attention_bwd"})
    for (int64_t head_dim : {64, 128}) {
      SCOPED_TRACE(fmt::format("{} head_dim {}", op, head_dim));
      auto ptx = attention_ptx(op, head_dim, 30);
      if (!ptx && ptx.error().code == Errc::driver_unavailable) GTEST_SKIP() << ptx.error().message;
      ASSERT_TRUE(ptx.ok()) << ptx.error().message;
      // The forward keeps a few IEEE divisions outside its passes (scale / softcap, 1 / rowsum);
      // tanh's exp form with div_f had 131-256 (one per tanh of a pass).
      EXPECT_LE(ptx->count("div.rn.f32"), 4);
      EXPECT_GE(ptx->count("tanh.approx.f32"), 128);
    }
}

// gfx950's fp8 MFMA kernels (gemm_fp8 and grouped_gemm) compile in both tuning candidates, each
// with its MFMA: the 32x32x16 fp8 form (the choice, four per 64 k) or the 32x32x64 f8f6f4 form (one
// per 64 k); no scratch, no spills, 64 x 64 and 128 x 128 tiles.
TEST(Compile, Gfx950Fp8MfmaCandidatesCompileWithTheirMfma) {
#if !KILN_WITH_LLVM
  GTEST_SKIP() << "built without LLVM (KILN_WITH_LLVM=OFF)";
#else
  const TargetInfo& target = **find_target("gfx950");
  auto compiler = compiler_for(target, "clang");
  ASSERT_TRUE(compiler.ok()) << compiler.error().message;
  auto fp8_gemm = [](int64_t M, int64_t N, int64_t K, int64_t g) {
    return KernelSpec{"gemm_fp8", DType::e4m3, DType::bf16, {{"M", M}, {"N", N}, {"K", K}, {"granularity", g}}};
  };
  const KernelSpec specs[] = {
      fp8_gemm(64, 64, 128, 0),      // tensorwise, 64 x 64 tiles
      fp8_gemm(130, 136, 300, 2),    // blockwise, K tail
      fp8_gemm(2048, 2048, 512, 3),  // block1x128, 128 x 128 tiles
      {"grouped_gemm", DType::e4m3, DType::bf16, {{"mode", 0}, {"groups", 3}, {"tokens", 70}, {"N", 64}, {"K", 160}}}};
  for (const KernelSpec& spec : specs) {
    const OpTemplate& op = **find_op(spec.op);
    const std::vector<KernelConfig> candidates = op.tuning_candidates(spec, target);
    ASSERT_EQ(candidates.size(), 2u) << to_string(spec);
    for (const KernelConfig& c : candidates) {
      SCOPED_TRACE(to_string(spec) + ": " + config_string(c));
      auto src = generate(spec, target, &c);
      ASSERT_TRUE(src.ok()) << src.error().message;
      auto out = (*compiler)->compile(*src);
      ASSERT_TRUE(out.ok()) << out.error().message;
      EXPECT_EQ(out->info.spill_stores, 0);
      EXPECT_EQ(out->info.scratch_bytes, 0);
      auto isa = (*compiler)->emit(*src, Emit::assembly);
      ASSERT_TRUE(isa.ok()) << isa.error().message;
      const bool k64 = c.at("MFMA_K") == 64;
      EXPECT_EQ(isa->find("v_mfma_f32_32x32x64_f8f6f4") != std::string::npos, k64);
      EXPECT_EQ(isa->find("v_mfma_f32_32x32x16_fp8_fp8") != std::string::npos, !k64);
    }
  }
#endif
}

// A module with two kernels (rmsnorm_bwd's row pass and its dgamma reduction): the report
// shows the worst of them, whatever order ptxas lists them in (it used to show the first only,
// which hid a row pass that spilled behind a reduction that did not).
TEST(Compile, PtxasReportShowsTheLargestKernelOfTheModule) {
  const std::string log =
      "ptxas info    : 0 bytes gmem\n"
      "ptxas info    : Compiling entry function 'kiln_rmsnorm_bwd_dgamma' for 'sm_90a'\n"
      "ptxas info    : Function properties for kiln_rmsnorm_bwd_dgamma\n"
      "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
      "ptxas info    : Used 26 registers, used 1 barriers, 4224 bytes smem\n"
      "ptxas info    : Compiling entry function 'kiln_rmsnorm_bwd' for 'sm_90a'\n"
      "ptxas info    : Function properties for kiln_rmsnorm_bwd\n"
      "    328 bytes stack frame, 588 bytes spill stores, 592 bytes spill loads\n"
      "ptxas info    : Used 128 registers, used 1 barriers, 328 bytes cumulative stack size, 16640 bytes smem\n";
  CodeObjectInfo info;
  parse_ptxas_report(log, info);
  EXPECT_EQ(info.registers, 128);
  EXPECT_EQ(info.shared_bytes, 16640);
  EXPECT_EQ(info.scratch_bytes, 328);
  EXPECT_EQ(info.spill_stores, 588);
  EXPECT_EQ(info.spill_loads, 592);
  CodeObjectInfo one;
  parse_ptxas_report("ptxas info    : Used 40 registers, 0 bytes smem, 380 bytes cmem[0]\n"
                     "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n",
                     one);
  EXPECT_EQ(one.registers, 40);
  EXPECT_EQ(one.shared_bytes, 0);
  EXPECT_EQ(one.spill_stores, 0);
}

TEST(Compile, CompilerErrorsCarryTheLogAndTheSource) {
  const TargetInfo& target = **find_target("sm_90a");
  auto src = generate(swiglu_spec(1, 64), target);
  ASSERT_TRUE(src.ok());
  src->text += "\nthis is not C++;\n";
  for (const char* name : nvidia_compilers()) {
    auto compiler = compiler_for(target, name);
    ASSERT_TRUE(compiler.ok());
    auto out = (*compiler)->compile(*src);
    ASSERT_FALSE(out.ok()) << name;
    EXPECT_EQ(out.error().code, Errc::compile_failed);
    EXPECT_NE(out.error().message.find("this is not C++"), std::string::npos) << "the source is attached";
    EXPECT_NE(out.error().message.find("error"), std::string::npos) << "the compiler log is attached";
  }
}

TEST(Compile, WrongTargetCodeObjectsAreCaught) {
  CodeObject fake{"cubin", std::vector<uint8_t>(128, 0)};
  EXPECT_FALSE(validate_code_object(fake, **find_target("sm_90a")).ok());
  fake.format = "hsaco";
  EXPECT_FALSE(validate_code_object(fake, **find_target("sm_90a")).ok()) << "an hsaco cannot serve sm_90a";
}

TEST(Compile, EmitsIsaPtxAndLlvmIr) {
#if !KILN_WITH_LLVM
  GTEST_SKIP() << "built without LLVM (KILN_WITH_LLVM=OFF)";
#else
  auto amd = generate(rmsnorm_spec(1, 8192), **find_target("gfx942"));
  auto isa = (*clang_compiler())->emit(*amd, Emit::assembly);
  ASSERT_TRUE(isa.ok()) << isa.error().message;
  EXPECT_NE(isa->find("s_barrier"), std::string::npos);
  EXPECT_NE(isa->find("ds_bpermute_b32"), std::string::npos) << "wavefront shuffle";
  EXPECT_NE(isa->find("global_load_dwordx4"), std::string::npos) << "16-byte vector loads";
  EXPECT_NE(isa->find("global_store_dwordx4"), std::string::npos) << "16-byte vector stores";
  auto ir = (*clang_compiler())->emit(*amd, Emit::llvm_ir);
  ASSERT_TRUE(ir.ok());
  EXPECT_NE(ir->find("amdgpu_kernel void @kiln_rmsnorm("), std::string::npos);
  auto nv = generate(rmsnorm_spec(1, 8192), **find_target("sm_90a"));
  auto ptx = (*nvrtc_compiler())->emit(*nv, Emit::assembly);
  ASSERT_TRUE(ptx.ok()) << ptx.error().message;
  EXPECT_NE(ptx->find(".target sm_90a"), std::string::npos);
  EXPECT_NE(ptx->find("shfl.sync.bfly"), std::string::npos);
  EXPECT_NE(ptx->find("ld.global.nc.v4.u32"), std::string::npos) << "16-byte vector loads:\n" << *ptx;
#endif
}

// Every part of the device-code library compiles on every target it serves, with every compiler,
// and its templates instantiate: one source that includes every such part and calls each helper.
TEST(Library, EveryPartCompilesOnEveryTargetItServes) {
  const char* common = R"(
KILN_GLOBAL KILN_LAUNCH_BOUNDS(256) void kiln_library_test(float* out, const kiln::bf16* in, unsigned char* q) {
  KILN_SHARED float scratch[256 / kiln::kWaveSize];
  const float v = kiln::to_float(in[kiln::thread_x()]);
  float s = kiln::block_sum<256>(v, scratch);
  kiln::barrier();
  s += kiln::block_max<256>(v, scratch);
  s += kiln::group_sum<4>(v) + kiln::group_max<4>(v) + kiln::wave_sum(v) + kiln::wave_max(v);
  kiln::SoftmaxState st = kiln::softmax_empty();
  const float scale = kiln::softmax_update_max(st, kiln::group_max<4>(v));
  st.sum += kiln::softmax_weight(st, v);
  st = kiln::softmax_group_merge<4>(kiln::softmax_merge(st, kiln::softmax_empty()));
  s += scale * kiln::softmax_inverse_sum(st) + kiln::softmax_lse(st) + kiln::exp2(v) + kiln::log(v);
  q[kiln::thread_x()] = kiln::from_float<kiln::fp8_e4m3>(s).bits;
  q[kiln::thread_x() + 256] = kiln::from_float<kiln::fp8_e5m2fnuz>(s).bits;
  s += kiln::to_float(kiln::fp8_e4m3{q[0]}) + kiln::to_float(kiln::fp8_e5m2fnuz{q[1]});
  kiln::Pack<kiln::bf16, 8> p = reinterpret_cast<const kiln::Pack<kiln::bf16, 8>*>(in)[kiln::thread_x()];
  kiln::opaque(p);
  KILN_SHARED int rows[2];
  if (kiln::thread_x() < 2) rows[kiln::thread_x()] = kiln::thread_x() == 0 ? 1 : -1;
  kiln::barrier();
  kiln::moe_scatter_row<kiln::bf16, 2, 8, 256, 1, 64>(in, rows, reinterpret_cast<kiln::bf16*>(q), 0);
  kiln::moe_gather_rows<kiln::bf16, float, 2, 8, 256, 1, 64>(in, rows, out + 512, out + 256, 0);
  KILN_SHARED kiln::bf16 tile[16 * 72];
  kiln::attention_load_tile<16, 64, 72, 256>(tile, in, 64, 0, 10);
  kiln::barrier();
  s += kiln::attention_dot_lds<64>(tile, tile + 72) + kiln::attention_tanh(v);
  s += kiln::attention_visible<true, 4, -1>(1, 2, 3, 4) ? 1.0f : 0.0f;
  float sn, cs;
  kiln::rope_sincos(v, sn, cs);
  s += sn + cs;
  kiln::rope_token<2, 1, 64, 32, true, false, false, false, -1, 64, 4, 8, 4>(
      in, in, (const int*)q, scratch, scratch, [](float* f) { f[0] = 1.0f; }, tile, tile, 3, 1, 8, 128, 64);
  kiln::rope_token<2, 1, 8, 8, false, true, true, true, 1, 8, 4, 1, 1>(
      in, in, (const int*)q, scratch, scratch, [](float*) {}, out, out, 3, 1, 8, 16, 8);
  s += kiln::fp8_current_scale<kiln::fp8_e4m3>(v) + kiln::fp8_delayed_scale<kiln::fp8_e5m2fnuz>(v, 1);
  s += kiln::fp8_history_max<256>(out, 16, scratch);
  kiln::fp8_history_push<kiln::fp8_e4m3, 256>(out, 4, out + 16, 16, 0, out + 40, scratch);
  KILN_SHARED float qscratch[2 * 256 / kiln::kWaveSize];
  kiln::Pack<kiln::bf16, 8> row8[1] = {p};
  s += kiln::fp8_quantize_row<kiln::fp8_e4m3, kiln::bf16, 2, 256, 8, 1, 2048>(
      row8, reinterpret_cast<kiln::fp8_e4m3*>(q), out, 1.0f, qscratch);
  kiln::Pack<float, 1> row1[2] = {{v}, {s}};
  s += kiln::fp8_quantize_row<kiln::fp8_e5m2fnuz, float, 2, 256, 1, 2, 300>(
      row1, reinterpret_cast<kiln::fp8_e5m2fnuz*>(q), out, 1.0f, qscratch);
  s += kiln::fp8_quantize_row<kiln::fp8_e4m3, float, 1, 256, 1, 2, 300>(
      row1, reinterpret_cast<kiln::fp8_e4m3*>(q), out, 1.0f, qscratch);
  s += kiln::fp8_quantize_row<kiln::fp8_e4m3, float, 0, 256, 1, 2, 300>(
      row1, reinterpret_cast<kiln::fp8_e4m3*>(q), out, 2.0f, qscratch);
  s += (float)(kiln::row_chunk<1>().row + kiln::row_chunk<0>().chunk);
  out[kiln::thread_x()] = s + kiln::to_float(p.e[3]);
}
)";
  const char* amd = R"(
KILN_GLOBAL KILN_LAUNCH_BOUNDS(64) void kiln_library_mfma(float* out, const unsigned* in) {
  using namespace kiln::amd;
  const u32x4 a = reinterpret_cast<const u32x4*>(in)[kiln::thread_x()];
  f32x16 acc = {};
  f32x4 acc4 = {};
  acc = mfma_32x32x8<true>(a.xy, a.zw, acc);
  acc = mfma_32x32x8<false>(a.xy, a.zw, acc);
  acc4 = mfma_16x16x16<true>(a.xy, a.zw, acc4);
  acc4 = mfma_16x16x16<false>(a.xy, a.zw, acc4);
  acc = mfma_32x32x16_f8<false, false>(a.xy, a.zw, acc);
  acc = mfma_32x32x16_f8<false, true>(a.xy, a.zw, acc);
  acc = mfma_32x32x16_f8<true, false>(a.xy, a.zw, acc);
  acc = mfma_32x32x16_f8<true, true>(a.xy, a.zw, acc);
  GFX950_ONLY
  out[kiln::thread_x()] = acc[0] + acc[15] + acc4[0] + acc4[3];
}
)";
  const char* gfx950 = R"(acc = mfma_32x32x16<true>(a, a, acc);
  acc = mfma_32x32x16<false>(a, a, acc);
  acc4 = mfma_16x16x32<true>(a, a, acc4);
  acc4 = mfma_16x16x32<false>(a, a, acc4);
  const u32x8 w = __builtin_shufflevector(a, a, 0, 1, 2, 3, 3, 2, 1, 0);
  acc = mfma_32x32x64_f8<false, false>(w, w, acc);
  acc = mfma_32x32x64_f8<true, false>(w, w, acc);
  acc = mfma_32x32x64_f8<false, true>(w, w, acc);)";
  const char* sm90 = R"(
KILN_GLOBAL KILN_LAUNCH_BOUNDS_MIN(256, 1) void kiln_library_sm90(const KILN_GRID_CONSTANT kiln::sm90::TensorMap map,
                                                                  float* out) {
  using namespace kiln::sm90;
  extern KILN_SHARED __attribute__((aligned(1024))) unsigned char kiln_smem[];
  const unsigned base = smem_u32(kiln_smem);
  const int tid = (int)kiln::thread_x();
  if (tid == 0) {
    prefetch_map(&map);
    mbar_init(base, 1);
    mbar_fence_init();
  }
  kiln::barrier();
  if (tid / 128 == 0) {
    setmaxnreg_dec<40>();
    if (tid == 0) {
      mbar_expect_tx(base, 64 * 128);
      tma_load(base + 1024, &map, 0, 0, base);
    }
    return;
  }
  setmaxnreg_inc<232>();
  mbar_wait(base, 0);
  float d[64] = {};
  float d2[128] = {};
  wgmma_fence();
  wgmma_m64k16<0, 1, true>(d, make_desc(base + 1024, 16, 1024), make_desc(base + 1024, 16, 1024));
  wgmma_m64k16<0, 1, false>(d, make_desc(base + 1024, 16, 1024), make_desc(base + 1024, 16, 1024));
  wgmma_m64k16<1, 0, true>(d2, make_desc(base + 1024, 16, 1024), make_desc(base + 1024, 16, 1024));
  wgmma_commit();
  wgmma_wait<0>();
  cp_async16(base + 2048 + 16 * tid, out + 4 * tid, 16);
  cp_async_commit();
  cp_async_wait<0>();
  st_shared16(base + 4096 + 16 * tid, 1, 2, 3, 4);
  fence_proxy_async();
  named_barrier(1, 128);
  if (tid == 128) {
    tma_store(&map, base + 1024, 0, 0);
    bulk_commit();
    bulk_wait_read<0>();
    bulk_wait_all();
  }
  mbar_arrive(base);
  out[tid + grid_x()] = d[0] + d2[5];
}
)";
  int compiled = 0;
  for (const char* t : {"gfx942", "gfx950", "sm_90a"}) {
    const TargetInfo& target = **find_target(t);
    std::string includes;
    for (const LibraryPart& p : library_parts())
      if (p.serves(target)) includes += fmt::format("#include \"lib/{}.kernel\"\n", p.name);
    std::string kernels = common;
    if (target.vendor == Vendor::amd) {
      std::string k = amd;
      k.replace(k.find("GFX950_ONLY"), 11, std::string(t) == "gfx950" ? gfx950 : "");
      kernels += k;
    } else {
      kernels += sm90;
    }
    auto expanded = expand_library(includes, target, "the library test");
    ASSERT_TRUE(expanded.ok()) << expanded.error().message;
    size_t served = 0;
    for (const LibraryPart& p : library_parts()) served += p.serves(target);
    EXPECT_EQ(expanded->parts.size(), served) << t;
    auto src = generate(swiglu_spec(1, 64), target);  // a KernelSource of the target, text replaced
    ASSERT_TRUE(src.ok());
    src->text = fmt::format("{}\n{}{}\n{}", prelude_for(target), expanded->library, expanded->body, kernels);
    src->kernel_name = "kiln_library_test";
    for (const char* name : {"nvrtc", "clang"}) {
      if (target.vendor == Vendor::amd && std::string(name) == "nvrtc") continue;
#if !KILN_WITH_LLVM
      if (std::string(name) == "clang") continue;
#endif
      auto compiler = compiler_for(target, name);
      if (!compiler && compiler.error().code == Errc::driver_unavailable) continue;
      ASSERT_TRUE(compiler.ok()) << compiler.error().message;
      auto out = (*compiler)->compile(*src);
      ASSERT_TRUE(out.ok()) << t << " " << name << ": " << out.error().message.substr(0, 4000);
      // Every kernel includes the library: a warning here is one in every kernel's compile.
      if (std::string(name) == "clang") {
        EXPECT_EQ(out->log.find("warning:"), std::string::npos) << t << ": " << out->log;
      }
      ++compiled;
    }
  }
  EXPECT_GE(compiled, KILN_WITH_LLVM ? 3 : 0);
}

}  // namespace
}  // namespace kiln
