#include <fmt/format.h>

#include "runtime/compile/compiler.h"

namespace kiln {

#if !KILN_WITH_LLVM
Result<Compiler*> clang_compiler() {
  return make_error(Errc::unsupported,
                    "this Kiln was built without LLVM (KILN_WITH_LLVM=OFF): AMD targets and "
                    "clang-built NVIDIA kernels need a build with clang/LLVM 22");
}
#endif

Result<Compiler*> compiler_for(const TargetInfo& target, std::string_view nvidia_compiler) {
  if (target.vendor == Vendor::amd) {
    auto c = clang_compiler();
    if (!c) return make_error(c.error().code, fmt::format("cannot compile for {}: {}", target.name, c.error().message));
    return c;
  }
  if (nvidia_compiler == "clang") return clang_compiler();
  if (nvidia_compiler == "nvrtc" || nvidia_compiler.empty()) return nvrtc_compiler();
  return make_error(Errc::unknown, fmt::format("unknown NVIDIA compiler '{}'; use nvrtc or clang", nvidia_compiler));
}

}  // namespace kiln
