// The compile stage's product: what a compiler produces (CodeObject, CodeObjectInfo, CompiledCode)
// and the check of a code object against its target (validate_code_object, which cache/ runs on every
// load). A leaf header (the standard library and kiln/target.h): the device layer
// (runtime/device_impl.h) loads a CodeObject without seeing the compilers, and cache/ stores one.
// The Compiler interface and the compilers are in compile/compiler.h.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/result.h"
#include "kiln/target.h"

namespace kiln {

/// A code object: the bytes a driver loads (hsaco or cubin ELF, or PTX text for the driver JIT).
struct CodeObject {
  std::string format;           ///< "hsaco", "cubin" or "ptx".
  std::vector<uint8_t> bytes;
};

/// Resource usage of a kernel, read from the code object (AMDGPU metadata notes) or from the
/// assembler's report (ptxas -v through NVRTC / nvJitLink). -1 = unknown.
struct CodeObjectInfo {
  std::string kernel;
  int registers = -1;      ///< NVIDIA registers per thread, AMD VGPRs (arch VGPRs).
  int sgprs = -1;          ///< AMD scalar registers.
  int agprs = -1;          ///< AMD accumulation registers (gfx90a+).
  int shared_bytes = -1;   ///< Static LDS / shared memory per block.
  int scratch_bytes = -1;  ///< Private segment (AMD) / stack frame (NVIDIA) per thread.
  int spill_stores = -1;   ///< NVIDIA spill-store bytes; AMD VGPR+SGPR spill count.
  int spill_loads = -1;    ///< NVIDIA spill-load bytes.
  int wave_size = -1;
  std::string extra;       ///< Raw assembler report lines, when any.
};

struct CompiledCode {
  CodeObject code;
  CodeObjectInfo info;
  std::string log;     ///< Compiler warnings (empty when clean).
  double compile_ms = 0;
};

/// Checks that a code object is what its target loads: a 64-bit little-endian ELF for EM_AMDGPU
/// (hsaco, a shared object) or EM_CUDA (cubin), or PTX text. Catches a wrong-target or truncated
/// object before a driver sees it.
Result<void> validate_code_object(const CodeObject& code, const TargetInfo& target);

}  // namespace kiln
