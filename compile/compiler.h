// Compile stage: KernelSource -> CodeObject.
//   clang/LLVM 22 in-process (ClangCompiler, when built with KILN_WITH_LLVM): AMDGPU hsaco via the
//     clang frontend, the AMDGPU backend and lld; NVPTX PTX via the NVPTX backend, assembled into a
//     cubin in-process by nvJitLink.
//   NVRTC (NvrtcCompiler, dlopen'd): sm_90a cubins; the default for NVIDIA targets.
// What a compiler produces (CodeObject, CodeObjectInfo, CompiledCode) is in compile/code_object.h.
// compile/ sits below cache/ (whose keys name a Compiler) and includes nothing from runtime/.
#pragma once

#include <string>
#include <string_view>

#include "codegen/codegen.h"
#include "compile/code_object.h"
#include "kiln/result.h"

namespace kiln {

/// What `kiln inspect --emit` can ask a compiler for besides the code object.
enum class Emit { llvm_ir, assembly };

class Compiler {
 public:
  virtual ~Compiler() = default;
  /// "clang" or "nvrtc".
  virtual std::string_view name() const = 0;
  /// Exact version ("22.1.8", "13.0"); part of the cache key.
  virtual std::string version() const = 0;
  /// The options that shape the code, as one string; part of the cache key.
  virtual std::string flags(const TargetInfo& target) const = 0;
  virtual bool supports(const TargetInfo& target) const = 0;
  virtual Result<CompiledCode> compile(const KernelSource& source) = 0;
  /// LLVM IR (clang only) or assembly: AMDGPU ISA, or PTX for NVIDIA.
  virtual Result<std::string> emit(const KernelSource& source, Emit what) = 0;
};

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
