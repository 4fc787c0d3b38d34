#include "compile/code_object.h"

#include <fmt/format.h>

#include <string_view>

namespace kiln {

Result<void> validate_code_object(const CodeObject& code, const TargetInfo& target) {
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

}  // namespace kiln
