// The target table. Adding a target = one row here + a prelude in codegen/preludes/ (see
// codegen.cpp's prelude_for) + the compiler flags in compile/.
#include <fmt/format.h>

#include "kiln/target.h"

namespace kiln {
namespace {
// LDS per workgroup: 64 KiB on gfx942 and gfx950 (gfx950 has 160 KiB per CU, but one workgroup
// still addresses 64 KiB); static shared memory on NVIDIA is limited to 48 KiB per block.
constexpr TargetInfo kTargets[] = {
    {"gfx942", Vendor::amd, "amdgcn-amd-amdhsa", "gfx942", 64, 304, 1024, 65536, "hsaco",
     "MI300X / MI325X", Fp8Encoding::fnuz},
    {"gfx950", Vendor::amd, "amdgcn-amd-amdhsa", "gfx950", 64, 256, 1024, 65536, "hsaco",
     "MI350X / MI355X", Fp8Encoding::ocp},
    {"sm_90a", Vendor::nvidia, "nvptx64-nvidia-cuda", "sm_90a", 32, 132, 1024, 49152, "cubin",
     "H100 / H200", Fp8Encoding::ocp},
};
}  // namespace

std::span<const TargetInfo> all_targets() { return kTargets; }

Result<const TargetInfo*> find_target(std::string_view name) {
  std::string names;
  for (const TargetInfo& t : kTargets) {
    if (t.name == name) return &t;
    names += fmt::format("{}{}", names.empty() ? "" : ", ", t.name);
  }
  return make_error(Errc::not_found,
                    fmt::format("unknown target '{}'; known targets: {}", name, names));
}

}  // namespace kiln
