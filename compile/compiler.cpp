#include <fmt/format.h>

#include "compile/clang_options.h"
#include "compile/compiler.h"

namespace kiln {

#if !KILN_WITH_LLVM
namespace {
// Without LLVM, clang is known only by its identity: its cache keys can be computed, so entries
// prewarmed by an LLVM build load, but nothing can be compiled.
class ClangIdentity final : public Compiler {
 public:
  std::string_view name() const override { return "clang"; }
  std::string version() const override { return clang_version(); }
  std::string flags(const TargetInfo& target) const override { return clang_flags(target); }
  bool supports(const TargetInfo&) const override { return false; }
  Result<CompiledCode> compile(const KernelSource& src) override {
    return make_error(Errc::unsupported,
                      fmt::format("cannot compile {} for {}: this Kiln was built without LLVM "
                                  "(KILN_WITH_LLVM=OFF); prewarm the cache with a build that has "
                                  "clang/LLVM 22 and copy it here, or use NVRTC for sm_90a",
                                  to_string(src.spec), src.target->name));
  }
  Result<std::string> emit(const KernelSource& src, Emit) override { return compile(src).take_error(); }
};
}  // namespace

Result<Compiler*> clang_compiler() {
  static ClangIdentity identity;
  return static_cast<Compiler*>(&identity);
}
#endif

Result<Compiler*> compiler_for(const TargetInfo& target, std::string_view nvidia_compiler) {
  if (target.vendor == Vendor::amd) {
    return clang_compiler();
  }
  if (nvidia_compiler == "clang") return clang_compiler();
  if (nvidia_compiler == "nvrtc" || nvidia_compiler.empty()) return nvrtc_compiler();
  return make_error(Errc::not_found, fmt::format("unknown NVIDIA compiler '{}'; use nvrtc or clang", nvidia_compiler));
}

}  // namespace kiln
