// Static quality report of an AMDGPU code object: the kernel's machine code, disassembled in
// process with LLVM's MC disassembler, its hot loop and that loop's instruction mix, and the
// occupancy its registers and LDS allow. Used by `kiln inspect --emit meta` for gfx942/gfx950.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "compile/code_object.h"
#include "kiln/result.h"
#include "kiln/target.h"

namespace kiln {

/// Instruction counts of a range of machine code.
struct InstructionMix {
  int total = 0;
  int mfma = 0;     ///< v_mfma_* (matrix cores)
  int lds = 0;      ///< ds_* (LDS reads, writes, permutes)
  int global = 0;   ///< global_*, buffer_*, flat_* (memory)
  int waitcnt = 0;  ///< s_waitcnt*
  int barrier = 0;  ///< s_barrier
  int valu = 0;     ///< other v_* (vector ALU, moves, accvgpr reads and writes)
  int salu = 0;     ///< other s_* (scalar ALU, branches)
};

/// The hot loop: of the code's loops (a branch back to an earlier address, and the code between),
/// the one with the most MFMAs, and of those the longest (a body with conditional blocks has
/// several back branches to its head). `found` is false for straight-line code.
struct HotLoop {
  bool found = false;
  uint64_t begin = 0, end = 0;  ///< byte offsets in the kernel's code: the loop head, the back branch
  InstructionMix mix;
};

struct AmdgpuCodeReport {
  InstructionMix kernel;  ///< the whole kernel
  HotLoop hot_loop;
  /// The kernel's metadata note, as the compiler reports it (read_amdgpu_metadata): registers (arch
  /// VGPRs), agprs, sgprs, shared_bytes (LDS), scratch_bytes, spill_stores (VGPR+SGPR spill count).
  CodeObjectInfo meta;
  int waves_per_simd = -1;                 ///< occupancy: the busiest SIMD's waves (occupancy_waves_per_simd)
  int waves_per_cu = -1;                   ///< the CU's waves (occupancy_waves_per_cu)
  std::string occupancy_limit;             ///< "VGPRs+AGPRs", "LDS", "waves" or "workgroup size"
};

/// Waves per CU of a kernel on gfx942/gfx950 (CDNA3/4): whole workgroups of `threads` threads,
/// their waves dealt over the CU's 4 SIMDs; at most 8 waves per SIMD; 512 unified VGPRs+AGPRs
/// per lane per SIMD, allocated in granules of 8 (AGPRs start at a granule boundary);
/// `lds_per_cu` bytes of LDS per CU (64 KiB gfx942, 160 KiB gfx950) shared by the workgroups.
/// `limit` names the binding resource. (A 2-wave workgroup of 17 KiB of LDS: 3 per CU on gfx942,
/// 6 waves, 2 SIMDs with 2 and 2 with 1.)
int occupancy_waves_per_cu(int vgprs, int agprs, int lds_bytes, int threads, int lds_per_cu,
                           std::string* limit = nullptr);
/// The busiest SIMD's waves: ceil(occupancy_waves_per_cu / 4).
int occupancy_waves_per_simd(int vgprs, int agprs, int lds_bytes, int threads, int lds_per_cu,
                             std::string* limit = nullptr);

/// LDS bytes per CU of an AMD target: 65536 for gfx942, 163840 for gfx950.
int amd_lds_bytes_per_cu(const TargetInfo& target);

/// Disassembles `kernel` in `hsaco` (an AMDGPU code object for `target`) and reports its hot loop,
/// registers, LDS, scratch and occupancy, for a workgroup of `threads` threads.
/// Errors: corrupt (not a code object, no such kernel, undecodable code), unsupported (a build
/// without LLVM).
Result<AmdgpuCodeReport> amdgpu_code_report(std::span<const uint8_t> hsaco, const std::string& kernel,
                                            const TargetInfo& target, int threads);

}  // namespace kiln
