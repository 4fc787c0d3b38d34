#include "runtime/driver/hip_api.h"

#if KILN_WITH_HIP
#include <fmt/format.h>

#include "support/env.h"

namespace kiln {

Result<const HipApi*> hip_api() {
  static const Result<const HipApi*> loaded = []() -> Result<const HipApi*> {
    KILN_ASSIGN_OR_RETURN(auto api, load_library<HipApi>({"libamdhip64 (the HIP runtime)",
                                                          env().hip_lib,
                                                          {"libamdhip64.so.6", "libamdhip64.so.5", "libamdhip64.so",
                                                           "/opt/rocm/lib/libamdhip64.so"},
                                                          "the HIP runtime is too old for Kiln: install ROCm 5.2 or newer"}));
    return api.release();
  }();
  return loaded;
}

Error hip_error(const HipApi& api, hipError_t rc, const char* call, const char* file, int line) {
  const char* name = api.hipGetErrorName(rc);
  const char* text = api.hipGetErrorString(rc);
  return make_error(Errc::driver_error, fmt::format("{} failed: {} ({}: {}) at {}:{}", call,
                                                    static_cast<int>(rc), name ? name : "?",
                                                    text ? text : "?", file, line));
}

}  // namespace kiln
#endif
