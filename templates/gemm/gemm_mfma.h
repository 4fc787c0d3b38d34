// The AMD matrix-core (MFMA) GEMM's configurations and its throughput model (gemm_mfma.kernel).
// Self-contained so that the op layer can move it: GemmOp calls mfma_applies, mfma_choose_config,
// mfma_candidates and mfma_lds_bytes; `kiln inspect --emit meta` calls mfma_model.
// The model is documented in docs/amd-gemm-model.md; its figures are modelled, not measured.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kiln/target.h"
#include "templates/op_template.h"

namespace kiln {

/// True for bf16/fp16 inputs on gfx942 and gfx950: the MFMA kernel serves them.
bool mfma_applies(const KernelSpec& spec, const TargetInfo& target);

/// Every MFMA tile configuration of `target` (MFMA=1, MFMA_K, BM, BN, BK, WAVES_M, WAVES_N,
/// THREADS), largest tile first; each fits the target's LDS (64 KiB gfx942, 160 KiB gfx950).
std::vector<KernelConfig> mfma_configs(const TargetInfo& target);

/// The configurations of `target` that serve `spec`: leading dimensions that are not multiples of
/// 8 elements allow at most 128 x 128; an M- or N-contiguous operand (NN, TN) rules out gfx942's
/// 256 x 128 x 32 on 4 waves (more than 256 registers).
std::vector<KernelConfig> mfma_usable_configs(const KernelSpec& spec, const TargetInfo& target);

/// The configuration with the least modelled time for the exact shape (ties: the less padded
/// work, then the larger tile). Leading dimensions that are not multiples of 8 elements (no
/// 16-byte loads) limit the tile to 128 x 128.
KernelConfig mfma_choose_config(const KernelSpec& spec, const TargetInfo& target);

/// The heuristic's configuration first, then the other usable configurations.
std::vector<KernelConfig> mfma_candidates(const KernelSpec& spec, const TargetInfo& target);

/// LDS bytes of a configuration: two stages of [BM + BN][BK + 8] 16-bit elements.
int64_t mfma_lds_bytes(const KernelConfig& config);

/// The device a model speaks of: datasheet figures plus the documented assumptions.
struct MfmaDevice {
  std::string name;            ///< "MI300X", "MI355X"
  int compute_units;
  double clock_ghz;            ///< peak engine clock
  double flops_per_simd_cycle; ///< dense bf16/fp16 MFMA FLOPs per SIMD per cycle
  double lds_bytes_per_cycle;  ///< LDS bandwidth per CU
  double l2_bytes_per_cycle;   ///< L2-to-CU bandwidth per CU (assumption, see the doc)
  double hbm_tb_s;             ///< HBM bandwidth, TB/s
  int lds_bytes_per_cu;
  double peak_tflops() const { return compute_units * 4.0 * flops_per_simd_cycle * clock_ghz * 1e-3; }
};
/// MI300X for gfx942, MI355X for gfx950.
const MfmaDevice& mfma_device(const TargetInfo& target);

/// A configuration's modelled throughput on one shape. Modelled, not measured.
struct MfmaModel {
  std::string device;
  int64_t mfma_per_k_tile = 0;     ///< MFMA instructions per wave per BK k-tile (the hot loop)
  double mfma_cycles = 0;          ///< per block k-tile, per CU (4 SIMDs)
  double lds_cycles = 0;           ///< LDS bytes (fragment reads + staging writes) / LDS bandwidth
  double global_cycles = 0;        ///< staged bytes / L2 bandwidth
  double latency_cycles = 0;       ///< exposed per k-tile by one block (global load, barrier, LDS latency)
  int blocks_per_cu = 0;           ///< resident blocks per CU (LDS, registers, waves)
  int waves_per_simd = 0;
  int64_t tiles = 0, rounds = 0;   ///< output tiles, and rounds of blocks_per_cu x CUs of them
  double seconds = 0;
  double tflops = 0;
  double peak_tflops = 0;
  std::string bound;               ///< "MFMA", "LDS", "L2", "HBM" or "latency"
};
/// `vgprs_per_lane`: the compiled kernel's arch VGPRs + AGPRs (a negative value: estimated from
/// the accumulator tile).
MfmaModel mfma_model(const KernelSpec& spec, const KernelConfig& config, const TargetInfo& target,
                     int vgprs_per_lane = -1);

}  // namespace kiln
