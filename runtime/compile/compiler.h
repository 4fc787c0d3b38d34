// Compile stage: KernelSource -> CodeObject.
//   clang/LLVM 22 in-process (ClangCompiler, when built with KILN_WITH_LLVM): AMDGPU hsaco via the
//     clang frontend, the AMDGPU backend and lld; NVPTX PTX via the NVPTX backend, assembled into a
//     cubin in-process by nvJitLink.
//   NVRTC (NvrtcCompiler, dlopen'd): sm_90a cubins; the default for NVIDIA targets.
// The types (CodeObject, CodeObjectInfo, CompiledCode) and the Compiler interface are in
// codegen/code_object.h.
#pragma once

#include <string>
#include <string_view>

#include "codegen/code_object.h"
#include "codegen/codegen.h"
#include "kiln/result.h"

namespace kiln {

/// The compiler for a target: "clang" or "nvrtc" for sm_90a (default nvrtc), clang for AMD.
/// Errors: Errc::unsupported (AMD in a build without LLVM), driver_unavailable (no NVRTC).
Result<Compiler*> compiler_for(const TargetInfo& target, std::string_view nvidia_compiler);
/// The clang compiler, or an error in a build without LLVM.
Result<Compiler*> clang_compiler();
Result<Compiler*> nvrtc_compiler();

/// Parses a ptxas -v report ("Used 64 registers, ... 8320 bytes smem", "0 bytes stack frame, ...")
/// into `info`: the largest figures over the module's entry functions (a plan may launch several).
void parse_ptxas_report(const std::string& log, CodeObjectInfo& info);

}  // namespace kiln
