// The AMD matrix-core (MFMA) GEMM without AMD hardware: the heuristic's choice, the static quality
// of the code objects of the shipped Llama-3.1-8B manifest's GEMMs (v_mfma in the hot loop, no
// scratch, LDS within the target's limit, occupancy), and the throughput model's invariants.
// Correctness runs in the CDNA emulator (the emulator tests and `kiln run --emulator --check`).
#include <gtest/gtest.h>

#include "codegen/codegen.h"
#include "kiln/manifest.h"
#include "compile/amdgpu_code_report.h"
#include "compile/compiler.h"
#include "templates/gemm/gemm_mfma.h"
#include "templates/registry.h"
#include "test_util.h"

namespace kiln {
namespace {

using testing::gemm_spec;

bool has(const KernelConfig& c, const char* key) { return c.count(key) && c.at(key) != 0; }

TEST(AmdGemm, HeuristicChoosesMatrixCoresFor16BitInputsOnly) {
  const OpTemplate* gemm = *find_op("gemm");
  for (const char* arch : {"gfx942", "gfx950"}) {
    const TargetInfo& target = **find_target(arch);
    for (DType dt : {DType::bf16, DType::f16}) {
      const KernelConfig c = gemm->choose_config(gemm_spec(8192, 4096, 4096, false, true, dt, dt), target);
      EXPECT_TRUE(has(c, "MFMA")) << arch;
      EXPECT_EQ(c.at("MFMA_K"), std::string(arch) == "gfx950" ? 16 : 8);
      EXPECT_EQ(c.at("THREADS"), 64 * c.at("WAVES_M") * c.at("WAVES_N"));
      EXPECT_LE(mfma_lds_bytes(c), amd_lds_bytes_per_cu(target));
      EXPECT_EQ(gemm->tuning_candidates(gemm_spec(8192, 4096, 4096, false, true, dt, dt), target).front(), c);
    }
    // fp32 stays on the portable LDS kernel.
    EXPECT_FALSE(has(gemm->choose_config(gemm_spec(64, 64, 64, false, true, DType::f32, DType::f32), target), "MFMA"));
  }
  // NVIDIA never gets it.
  EXPECT_FALSE(has(gemm->choose_config(gemm_spec(8192, 4096, 4096, false, true), **find_target("sm_90a")), "MFMA"));
}

TEST(AmdGemm, SmallShapesGetSmallTiles) {
  const OpTemplate* gemm = *find_op("gemm");
  for (const char* arch : {"gfx942", "gfx950"}) {
    const KernelConfig c = gemm->choose_config(gemm_spec(7, 129, 64, false, false), **find_target(arch));
    EXPECT_EQ(c.at("BM"), 64) << arch;
    EXPECT_EQ(c.at("BN"), 64) << arch;
  }
}

TEST(AmdGemm, MisalignedLeadingDimensionsGetAtMost128x128) {
  const OpTemplate* gemm = *find_op("gemm");
  for (const char* arch : {"gfx942", "gfx950"}) {
    const TargetInfo& target = **find_target(arch);
    // K = 4095: rows of A and B (NT) are not 16-byte aligned.
    const KernelConfig c = gemm->choose_config(gemm_spec(8192, 8192, 4095, false, true), target);
    EXPECT_LE(c.at("BM") * c.at("BN"), 128 * 128) << arch;
    // Aligned, gfx942's model prefers a larger tile (gfx950's prefers 128 x 128 at 2 blocks per CU).
    const KernelConfig aligned = gemm->choose_config(gemm_spec(8192, 8192, 4096, false, true), target);
    if (std::string(arch) == "gfx942") {
      EXPECT_GT(aligned.at("BM") * aligned.at("BN"), 128 * 128);
    }
  }
}

TEST(AmdGemm, TransposingLayoutsSkipGfx942s256x128) {
  const OpTemplate* gemm = *find_op("gemm");
  const TargetInfo& target = **find_target("gfx942");
  for (auto [ta, tb] : {std::pair{false, false}, std::pair{true, false}})
    for (const KernelConfig& c : gemm->tuning_candidates(gemm_spec(8192, 8192, 8192, ta, tb), target))
      EXPECT_FALSE(c.at("BM") == 256 && c.at("BN") == 128) << config_string(c);
  EXPECT_EQ(gemm->tuning_candidates(gemm_spec(8192, 8192, 8192, false, true), target).size(), 4u);
}

TEST(AmdGemm, OccupancyFromRegistersAndLds) {
  std::string limit;
  // 128 VGPRs + 128 AGPRs: 256 of 512 registers per lane, 2 waves per SIMD.
  EXPECT_EQ(occupancy_waves_per_simd(128, 128, 0, 256, 65536, &limit), 2);
  EXPECT_EQ(limit, "VGPRs+AGPRs");
  // Few registers: 8 waves, the hardware's limit, if LDS allows.
  EXPECT_EQ(occupancy_waves_per_simd(32, 0, 0, 256, 65536, &limit), 8);
  EXPECT_EQ(limit, "waves");
  // 48 KiB of LDS: one 256-thread workgroup per CU on gfx942, one wave per SIMD; three on gfx950.
  EXPECT_EQ(occupancy_waves_per_simd(64, 0, 49152, 256, 65536, &limit), 1);
  EXPECT_EQ(limit, "LDS");
  EXPECT_EQ(occupancy_waves_per_simd(64, 0, 49152, 256, 163840), 3);
  // 512 threads are 2 waves per SIMD per workgroup: 3 register-limited waves hold one workgroup.
  EXPECT_EQ(occupancy_waves_per_simd(168, 0, 0, 512, 65536), 2);
  // 2-wave workgroups (the MFMA attention kernels): a workgroup takes a wave slot on two SIMDs.
  // 17424 bytes of LDS: 3 per CU on gfx942, 6 waves (the busiest SIMDs 2), though the registers
  // (167 VGPRs: 3 waves per SIMD) would hold 6 workgroups; 9 on gfx950, capped by the registers
  // at 6 workgroups, 12 waves.
  EXPECT_EQ(occupancy_waves_per_cu(167, 0, 17424, 128, 65536, &limit), 6);
  EXPECT_EQ(limit, "LDS");
  EXPECT_EQ(occupancy_waves_per_simd(167, 0, 17424, 128, 65536), 2);
  EXPECT_EQ(occupancy_waves_per_cu(167, 0, 17424, 128, 163840, &limit), 12);
  EXPECT_EQ(limit, "VGPRs+AGPRs");
  // One 2-wave workgroup of 52 KiB per CU: 2 waves, two SIMDs idle.
  EXPECT_EQ(occupancy_waves_per_cu(225, 0, 52480, 128, 65536), 2);
  EXPECT_EQ(occupancy_waves_per_simd(225, 0, 52480, 128, 65536), 1);
}

TEST(AmdGemm, ModelStaysUnderThePeakAndCountsTheHotLoop) {
  for (const char* arch : {"gfx942", "gfx950"}) {
    const TargetInfo& target = **find_target(arch);
    const KernelSpec spec = gemm_spec(8192, 8192, 8192, false, true);
    for (const KernelConfig& c : mfma_configs(target)) {
      SCOPED_TRACE(std::string(arch) + " " + config_string(c));
      const MfmaModel m = mfma_model(spec, c, target);
      EXPECT_GT(m.tflops, 0.2 * m.peak_tflops);
      EXPECT_LE(m.tflops, m.peak_tflops * 1.0001);
      EXPECT_GE(m.blocks_per_cu, 1);
      // (BM/WAVES_M/32) x (BN/WAVES_N/32) blocks x BK / MFMA_K instructions per wave per k-tile.
      EXPECT_EQ(m.mfma_per_k_tile, (c.at("BM") / c.at("WAVES_M") / 32) * (c.at("BN") / c.at("WAVES_N") / 32) *
                                       (c.at("BK") / c.at("MFMA_K")));
    }
    EXPECT_NEAR(mfma_device(target).peak_tflops(), std::string(arch) == "gfx950" ? 2517 : 1307, 5);
  }
}

// The static quality report for every GEMM of the shipped Llama-3.1-8B manifest on both targets:
// v_mfma in the hot loop, no scratch or spills, LDS within the target's limit.
TEST(AmdGemm, ManifestGemmsHaveMfmaHotLoopsAndNoScratch) {
#if !KILN_WITH_LLVM
  GTEST_SKIP() << "built without LLVM (KILN_WITH_LLVM=OFF): no AMD compiler or disassembler";
#else
  auto manifest = read_manifest(KILN_SOURCE_DIR "/manifests/llama3.1-8b.json");
  ASSERT_TRUE(manifest.ok()) << manifest.error().message;
  auto compiler = clang_compiler();
  ASSERT_TRUE(compiler.ok());
  int gemms = 0;
  for (const ManifestEntry& e : manifest->kernels) {
    if (e.spec.op != "gemm") continue;
    ++gemms;
    for (const char* arch : {"gfx942", "gfx950"}) {
      const TargetInfo& target = **find_target(arch);
      SCOPED_TRACE(e.label + " " + arch);
      auto src = generate(e.spec, target);
      ASSERT_TRUE(src.ok()) << src.error().message;
      ASSERT_TRUE(has(src->config, "MFMA")) << config_string(src->config);
      auto out = (*compiler)->compile(*src);
      ASSERT_TRUE(out.ok()) << out.error().message;
      auto r = amdgpu_code_report(out->code.bytes, src->kernel_name, target,
                                  static_cast<int>(src->config.at("THREADS")));
      ASSERT_TRUE(r.ok()) << r.error().message;
      ASSERT_TRUE(r->hot_loop.found);
      const InstructionMix& loop = r->hot_loop.mix;
      // The k-loop: exactly the tile's MFMAs per wave per k-tile, its LDS traffic, one barrier.
      EXPECT_EQ(loop.mfma, mfma_model(e.spec, src->config, target).mfma_per_k_tile);
      // Fragment reads (a 16-byte read per 32-row block per 16 k) and the staging writes.
      const KernelConfig& c = src->config;
      const int64_t threads = c.at("THREADS"), bk = c.at("BK");
      const int64_t reads = (c.at("BM") / c.at("WAVES_M") / 32 + c.at("BN") / c.at("WAVES_N") / 32) * (bk / 16);
      auto writes = [&](int64_t rows, bool kmajor) {
        const int64_t units = kmajor ? rows * bk / 8 : rows / 8 * (bk / 8);
        return (units + threads - 1) / threads * (kmajor ? 1 : 8);
      };
      const bool ta = e.spec.param("trans_a") != 0, tb = e.spec.param("trans_b") != 0;
      EXPECT_EQ(loop.lds, reads + writes(c.at("BM"), !ta) + writes(c.at("BN"), tb));
      EXPECT_GT(loop.global, 0);
      EXPECT_EQ(loop.barrier, 1);
      EXPECT_EQ(r->meta.scratch_bytes, 0);
      EXPECT_EQ(r->meta.spill_stores, 0);
      EXPECT_GT(r->meta.shared_bytes, 0);
      EXPECT_LE(r->meta.shared_bytes, std::string(arch) == "gfx950" ? 163840 : 65536);
      EXPECT_EQ(r->meta.shared_bytes, mfma_lds_bytes(src->config));
      EXPECT_GE(r->waves_per_simd, 1);
    }
  }
  EXPECT_EQ(gemms, 15);
#endif
}

TEST(AmdGemm, CodeReportRejectsWhatIsNotACodeObject) {
  const std::vector<uint8_t> junk(256, 0x5a);
  auto r = amdgpu_code_report(junk, "kiln_gemm", **find_target("gfx942"), 256);
  ASSERT_FALSE(r.ok());
#if KILN_WITH_LLVM
  EXPECT_EQ(r.error().code, Errc::corrupt);
#endif
}

}  // namespace
}  // namespace kiln
