// GPU targets Kiln generates code for.
#pragma once

#include <span>
#include <string_view>

#include "kiln/dtype.h"
#include "kiln/result.h"

namespace kiln {

enum class Vendor { amd, nvidia };

/// One code-generation target. Adding a target (gfx90a, sm_100a) is a prelude and one entry in
/// the table in codegen/targets.cpp.
struct TargetInfo {
  std::string_view name;          ///< "gfx942", "gfx950", "sm_90a": the --arch spelling.
  Vendor vendor;
  std::string_view llvm_triple;   ///< "amdgcn-amd-amdhsa" or "nvptx64-nvidia-cuda".
  std::string_view cpu;           ///< LLVM target CPU ("gfx942", "sm_90a").
  int wave_size;                  ///< Wavefront (AMD, 64) or warp (NVIDIA, 32) size in lanes.
  int compute_units;              ///< CUs (AMD) or SMs (NVIDIA) of the largest part, for heuristics.
  int max_threads_per_block;
  int shared_bytes_per_block;     ///< Static LDS / shared memory available to one block.
  std::string_view code_object;   ///< "hsaco" or "cubin": the file suffix of the code object.
  std::string_view gpus;          ///< Human description ("MI300X / MI325X").
  /// The fp8 encoding the hardware converts: FNUZ on gfx942, OCP on gfx950 and sm_90a
  /// (fp8_for_target in dtype.h maps a format to it).
  Fp8Encoding fp8_encoding = Fp8Encoding::ocp;
};

/// Every target, in the order of the table.
std::span<const TargetInfo> all_targets();
/// Looks a target up by name; the error lists the known names.
Result<const TargetInfo*> find_target(std::string_view name);

}  // namespace kiln
