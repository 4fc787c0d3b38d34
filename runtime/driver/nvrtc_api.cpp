#include "runtime/driver/nvrtc_api.h"

#include <fmt/format.h>

#include "support/env.h"

namespace kiln {

Result<const NvrtcApi*> nvrtc_api() {
  static const Result<const NvrtcApi*> loaded = []() -> Result<const NvrtcApi*> {
    KILN_ASSIGN_OR_RETURN(auto lib, DynLib::open("NVRTC (the CUDA runtime compiler)", env().nvrtc_lib,
                                                 {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so",
                                                  "/usr/local/cuda/lib64/libnvrtc.so.13",
                                                  "/usr/local/cuda/lib64/libnvrtc.so"}));
    auto* api = new NvrtcApi();
    std::string missing;
    KILN_NVRTC_SYMBOLS(KILN_LOAD_SYMBOL)
    if (!missing.empty())
      return make_error(Errc::driver_unavailable, fmt::format("{} lacks {}", lib->path(), missing));
    api->path = lib->path();
    api->nvrtcVersion(&api->major, &api->minor);
    lib.release();
    return static_cast<const NvrtcApi*>(api);
  }();
  return loaded;
}

Result<const NvJitLinkApi*> nvjitlink_api() {
  static const Result<const NvJitLinkApi*> loaded = []() -> Result<const NvJitLinkApi*> {
    KILN_ASSIGN_OR_RETURN(auto lib, DynLib::open("nvJitLink (the CUDA PTX linker)", env().nvjitlink_lib,
                                                 {"libnvJitLink.so.13", "libnvJitLink.so",
                                                  "/usr/local/cuda/lib64/libnvJitLink.so.13"}));
    auto* api = new NvJitLinkApi();
    std::string missing;
    KILN_NVJITLINK_SYMBOLS(KILN_LOAD_SYMBOL)
    if (!missing.empty())
      return make_error(Errc::driver_unavailable,
                        fmt::format("{} lacks {} (Kiln was built against nvJitLink 13.0)", lib->path(), missing));
    api->path = lib->path();
    lib.release();
    return static_cast<const NvJitLinkApi*>(api);
  }();
  return loaded;
}

}  // namespace kiln
