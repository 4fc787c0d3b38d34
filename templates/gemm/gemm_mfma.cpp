#include "templates/gemm/gemm_mfma.h"

#include <algorithm>
#include <cmath>

namespace kiln {
namespace {
bool is_gfx950(const TargetInfo& target) { return target.name == "gfx950"; }

KernelConfig make(const TargetInfo& target, int64_t bm, int64_t bn, int64_t bk, int64_t wm, int64_t wn) {
  return {{"MFMA", 1},       {"MFMA_K", is_gfx950(target) ? 16 : 8},
          {"BM", bm},        {"BN", bn},
          {"BK", bk},        {"WAVES_M", wm},
          {"WAVES_N", wn},   {"THREADS", 64 * wm * wn}};
}
}  // namespace

bool mfma_applies(const KernelSpec& spec, const TargetInfo& target) {
  return target.vendor == Vendor::amd && (target.name == "gfx942" || target.name == "gfx950") &&
         (spec.dtype == DType::bf16 || spec.dtype == DType::f16);
}

std::vector<KernelConfig> mfma_configs(const TargetInfo& target) {
  if (is_gfx950(target))
    // 160 KiB of LDS: 64-deep k-tiles. 256x256 with 8 waves (128x64 per wave) is 144 KiB.
    return {make(target, 256, 256, 64, 2, 4), make(target, 256, 128, 64, 2, 2), make(target, 128, 128, 64, 2, 2),
            make(target, 64, 64, 64, 2, 2)};
  // 64 KiB of LDS: 256x256 with 16-deep k-tiles (48 KiB), 256x128 with 32 (60 KiB).
  return {make(target, 256, 256, 16, 2, 4), make(target, 256, 128, 32, 2, 2), make(target, 128, 128, 32, 2, 2),
          make(target, 64, 64, 32, 2, 2)};
}

int64_t mfma_lds_bytes(const KernelConfig& c) { return 2 * (c.at("BM") + c.at("BN")) * (c.at("BK") + 8) * 2; }

std::vector<KernelConfig> mfma_usable_configs(const KernelSpec& spec, const TargetInfo& target) {
  std::vector<KernelConfig> configs = mfma_configs(target);
  // Leading dimensions that are not multiples of 8 elements rule out 16-byte loads: the kernel
  // stages element by element, which needs more registers than the tiles above 128 x 128 have.
  const int64_t lda = spec.param("trans_a") ? spec.param("M") : spec.param("K");
  const int64_t ldb = spec.param("trans_b") ? spec.param("K") : spec.param("N");
  const bool misaligned = lda % 8 != 0 || ldb % 8 != 0;
  // An M- or N-contiguous operand (NN's B, TN's A) is staged as 8 x 8 blocks (32 registers per
  // block): gfx942's 256 x 128 x 32 tile on 4 waves then needs up to 264 registers (248-254 at
  // 8192^3; 260-264 with a K tail), and past 256 the compiler puts MFMA A operands in AGPRs
  // (ds_read_b128 a[0:3]; v_mfma_f32_32x32x8_bf16 v[..], a[0:1], v[..]). The emulator reads MFMA
  // A/B operands from VGPRs whatever their register file (checked 2026-11-26: those kernels fail
  // there, the same tile at <= 256 registers passes), so such a kernel would go unproven: excluded
  // until the emulator is fixed (docs/amd-gemm-model.md has the reproducer).
  const bool transposing = spec.param("trans_a") != 0 || spec.param("trans_b") == 0;
  std::erase_if(configs, [&](const KernelConfig& c) {
    const int64_t area = c.at("BM") * c.at("BN");
    if (misaligned && area > 128 * 128) return true;
    return transposing && c.at("MFMA_K") == 8 && area == 256 * 128 && c.at("THREADS") == 256;
  });
  return configs;
}

KernelConfig mfma_choose_config(const KernelSpec& spec, const TargetInfo& target) {
  // The least modelled time; within 0.1%, the least padded work (tiles x BM x BN), then the
  // larger tile (the earlier configuration).
  const std::vector<KernelConfig> configs = mfma_usable_configs(spec, target);
  size_t best = 0;
  MfmaModel best_m = mfma_model(spec, configs[0], target);
  auto padded = [](const MfmaModel& m, const KernelConfig& c) { return m.tiles * c.at("BM") * c.at("BN"); };
  for (size_t i = 1; i < configs.size(); ++i) {
    const MfmaModel m = mfma_model(spec, configs[i], target);
    const bool faster = m.seconds < best_m.seconds * 0.999;
    const bool tie = !faster && m.seconds <= best_m.seconds * 1.001;
    if (faster || (tie && padded(m, configs[i]) < padded(best_m, configs[best]))) best = i, best_m = m;
  }
  return configs[best];
}

std::vector<KernelConfig> mfma_candidates(const KernelSpec& spec, const TargetInfo& target) {
  std::vector<KernelConfig> out = {mfma_choose_config(spec, target)};
  for (const KernelConfig& c : mfma_usable_configs(spec, target))
    if (c != out.front()) out.push_back(c);
  return out;
}

const MfmaDevice& mfma_device(const TargetInfo& target) {
  // Datasheets (reference/BENCHMARKS.md): MI300X 304 CUs, 2.1 GHz, 1307 TFLOP/s dense bf16
  // (512 FLOPs per SIMD per cycle: v_mfma_f32_32x32x8_bf16 is 16384 FLOPs in 32 cycles), 5.3 TB/s,
  // 64 KiB LDS per CU at 128 bytes per cycle. MI355X 256 CUs, 2.4 GHz, 2.5 PFLOP/s (1024 FLOPs
  // per SIMD per cycle: 32x32x16 in 32 cycles), 8 TB/s, 160 KiB LDS per CU with doubled read
  // bandwidth (256 bytes per cycle). L2 to CU: 64 bytes per cycle per CU (an assumption).
  static const MfmaDevice mi300x{"MI300X", 304, 2.1, 512, 128, 64, 5.3, 65536};
  static const MfmaDevice mi355x{"MI355X", 256, 2.4, 1024, 256, 64, 8.0, 163840};
  return is_gfx950(target) ? mi355x : mi300x;
}

MfmaModel mfma_model(const KernelSpec& spec, const KernelConfig& c, const TargetInfo& target, int vgprs_per_lane) {
  const MfmaDevice& d = mfma_device(target);
  const double M = static_cast<double>(spec.param("M")), N = static_cast<double>(spec.param("N")),
               K = static_cast<double>(spec.param("K"));
  const int64_t bm = c.at("BM"), bn = c.at("BN"), bk = c.at("BK"), mfma_k = c.at("MFMA_K");
  const int64_t waves = c.at("WAVES_M") * c.at("WAVES_N");
  const int64_t frag_m = bm / c.at("WAVES_M") / 32, frag_n = bn / c.at("WAVES_N") / 32;
  MfmaModel m;
  m.device = d.name;
  m.peak_tflops = d.peak_tflops();
  m.mfma_per_k_tile = frag_m * frag_n * (bk / mfma_k);
  // The whole tile is computed, tails included (zeros): a k-tile costs the same everywhere.
  m.mfma_cycles = 2.0 * bm * bn * bk / (4.0 * d.flops_per_simd_cycle);
  // Each wave reads frag_m + frag_n fragments of 64 lanes x 16 bytes per 16-k step; the block
  // writes its staged (BM + BN) x BK elements once.
  const double lds_bytes = waves * (frag_m + frag_n) * 1024.0 * (bk / 16) + (bm + bn) * bk * 2.0;
  m.lds_cycles = lds_bytes / d.lds_bytes_per_cycle;
  m.global_cycles = (bm + bn) * bk * 2.0 / d.l2_bytes_per_cycle;
  // A k-tile's global loads are issued before its MFMAs and waited for after them: they are
  // hidden when the k-tile's busiest resource takes longer than their latency (800 cycles, an
  // assumption). The barrier and the first LDS reads of each k-tile add 256 cycles (an assumption).
  const double global_latency = 800, sync_latency = 256;
  // Occupancy: LDS per CU, the 512 unified VGPRs+AGPRs per lane per SIMD (granules of 8), and at
  // most 8 waves per SIMD.
  const int64_t regs = vgprs_per_lane > 0 ? vgprs_per_lane : frag_m * frag_n * 16 + 4 * (frag_m + frag_n) + 48;
  const int64_t waves_by_regs = std::min<int64_t>(8, 512 / ((regs + 7) / 8 * 8));
  const int64_t waves_per_simd_per_block = (waves + 3) / 4;
  const int64_t by_lds = d.lds_bytes_per_cu / mfma_lds_bytes(c);
  const int64_t by_regs = waves_by_regs / waves_per_simd_per_block;
  m.blocks_per_cu = static_cast<int>(std::max<int64_t>(0, std::min(by_lds, by_regs)));
  m.waves_per_simd = static_cast<int>(m.blocks_per_cu * waves_per_simd_per_block);
  m.tiles = static_cast<int64_t>(std::ceil(M / bm) * std::ceil(N / bn));
  if (m.blocks_per_cu == 0) {
    m.bound = "does not fit";
    m.seconds = INFINITY;
    return m;
  }
  const int64_t slots = static_cast<int64_t>(m.blocks_per_cu) * d.compute_units;
  m.rounds = (m.tiles + slots - 1) / slots;
  // A CU runs up to blocks_per_cu blocks at once (fewer when there are fewer tiles than that per
  // CU): one k-tile of each takes the busiest resource's time for all of them, or one block's
  // k-tile with its exposed latency, whichever is longer.
  const int64_t resident = std::min<int64_t>(m.blocks_per_cu, (m.tiles + d.compute_units - 1) / d.compute_units);
  const double busiest = std::max({m.mfma_cycles, m.lds_cycles, m.global_cycles});
  const double one_block = std::max(busiest, global_latency) + sync_latency;
  m.latency_cycles = one_block - busiest;
  const double per_round_k_tile = std::max(resident * busiest, one_block);
  const double k_tiles = std::ceil(K / bk);
  const double compute_s = m.rounds * k_tiles * per_round_k_tile / (d.clock_ghz * 1e9);
  // HBM: A, B and C at least once each (L2 and MALL reuse within a round are assumed perfect).
  const double hbm_s = (M * K + K * N) * 2.0 + M * N * dtype_size(spec.out_dtype);
  const double hbm_seconds = hbm_s / (d.hbm_tb_s * 1e12);
  m.seconds = std::max(compute_s, hbm_seconds);
  m.tflops = 2.0 * M * N * K / m.seconds * 1e-12;
  if (hbm_seconds >= compute_s) m.bound = "HBM";
  else if (resident * busiest < one_block) m.bound = "latency";
  else if (busiest == m.mfma_cycles) m.bound = "MFMA";
  else if (busiest == m.lds_cycles) m.bound = "LDS";
  else m.bound = "L2";
  return m;
}

}  // namespace kiln
