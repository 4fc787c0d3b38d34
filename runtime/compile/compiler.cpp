#include <fmt/format.h>

#include "runtime/compile/clang_options.h"
#include "runtime/compile/compiler.h"

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

Result<void> check_code_object(const CodeObject& code, const TargetInfo& target) {
  const auto& b = code.bytes;
  if (code.format == "ptx") {
    const std::string_view text(reinterpret_cast<const char*>(b.data()), b.size());
    if (target.vendor != Vendor::nvidia || text.find(".target") == std::string_view::npos)
      return make_error(Errc::corrupt, fmt::format("the PTX code object is not PTX for {}", target.name));
    return ok();
  }
  const bool amd = target.vendor == Vendor::amd;
  if (code.format != (amd ? "hsaco" : "cubin"))
    return make_error(Errc::corrupt, fmt::format("a {} code object cannot serve {}", code.format, target.name));
  // ELF header: magic, EI_CLASS = 2 (64-bit), EI_DATA = 1 (little endian), e_type at 16, e_machine at 18.
  if (b.size() < 64 || b[0] != 0x7f || b[1] != 'E' || b[2] != 'L' || b[3] != 'F' || b[4] != 2 || b[5] != 1)
    return make_error(Errc::corrupt, fmt::format("the {} code object is not a 64-bit little-endian ELF file", code.format));
  const unsigned e_type = b[16] | (b[17] << 8);
  const unsigned e_machine = b[18] | (b[19] << 8);
  constexpr unsigned kEmAmdgpu = 224, kEmCuda = 190, kEtDyn = 3;
  if (e_machine != (amd ? kEmAmdgpu : kEmCuda))
    return make_error(Errc::corrupt, fmt::format("the code object is an ELF file for machine {}, not {} ({})", e_machine,
                                                 amd ? "EM_AMDGPU (224)" : "EM_CUDA (190)", target.name));
  if (amd && e_type != kEtDyn)
    return make_error(Errc::corrupt, "the hsaco is not a linked shared object (e_type ET_DYN)");
  return ok();
}

Result<Compiler*> compiler_for(const TargetInfo& target, std::string_view nvidia_compiler) {
  if (target.vendor == Vendor::amd) {
    return clang_compiler();
  }
  if (nvidia_compiler == "clang") return clang_compiler();
  if (nvidia_compiler == "nvrtc" || nvidia_compiler.empty()) return nvrtc_compiler();
  return make_error(Errc::unknown, fmt::format("unknown NVIDIA compiler '{}'; use nvrtc or clang", nvidia_compiler));
}

}  // namespace kiln
