#include "compile/nvrtc_api.h"

#include "support/env.h"

namespace kiln {

Result<const NvrtcApi*> nvrtc_api() {
  static const Result<const NvrtcApi*> loaded = []() -> Result<const NvrtcApi*> {
    KILN_ASSIGN_OR_RETURN(auto api, load_library<NvrtcApi>({"NVRTC (the CUDA runtime compiler)",
                                                            env().nvrtc_lib,
                                                            {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so",
                                                             "/usr/local/cuda/lib64/libnvrtc.so.13",
                                                             "/usr/local/cuda/lib64/libnvrtc.so"},
                                                            ""}));
    api->nvrtcVersion(&api->major, &api->minor);
    return api.release();
  }();
  return loaded;
}

Result<const NvJitLinkApi*> nvjitlink_api() {
  static const Result<const NvJitLinkApi*> loaded = []() -> Result<const NvJitLinkApi*> {
    KILN_ASSIGN_OR_RETURN(auto api, load_library<NvJitLinkApi>({"nvJitLink (the CUDA PTX linker)",
                                                                env().nvjitlink_lib,
                                                                {"libnvJitLink.so.13", "libnvJitLink.so",
                                                                 "/usr/local/cuda/lib64/libnvJitLink.so.13"},
                                                                "Kiln was built against nvJitLink 13.0"}));
    return api.release();
  }();
  return loaded;
}

}  // namespace kiln
