// NVRTC (libnvrtc) and nvJitLink (libnvJitLink), dlopen'd from the CUDA toolkit.
#pragma once

#include <nvJitLink.h>
#include <nvrtc.h>

#include <string>

#include "kiln/result.h"
#include "support/dynlib.h"

namespace kiln {

#define KILN_NVRTC_SYMBOLS(REQUIRED, OPTIONAL)                                                          \
  REQUIRED(nvrtcVersion) REQUIRED(nvrtcGetErrorString) REQUIRED(nvrtcCreateProgram)                       \
  REQUIRED(nvrtcDestroyProgram) REQUIRED(nvrtcCompileProgram) REQUIRED(nvrtcGetProgramLogSize)            \
  REQUIRED(nvrtcGetProgramLog) REQUIRED(nvrtcGetPTXSize) REQUIRED(nvrtcGetPTX) REQUIRED(nvrtcGetCUBINSize) \
  REQUIRED(nvrtcGetCUBIN)

struct NvrtcApi {
  KILN_SYMBOL_TABLE(KILN_NVRTC_SYMBOLS)
  int major = 0, minor = 0;
};
/// Loads NVRTC once (KILN_NVRTC_LIB, libnvrtc.so.13, libnvrtc.so.12, libnvrtc.so, CUDA's lib64).
Result<const NvrtcApi*> nvrtc_api();

// nvJitLink's entry points carry the toolkit version in their symbol names (nvJitLink.h maps
// nvJitLinkCreate to __nvJitLinkCreate_13_0): the table names the versioned symbols.
#define KILN_NVJITLINK_SYMBOLS(REQUIRED, OPTIONAL)                                               \
  REQUIRED(__nvJitLinkCreate_13_0) REQUIRED(__nvJitLinkDestroy_13_0) REQUIRED(__nvJitLinkAddData_13_0) \
  REQUIRED(__nvJitLinkComplete_13_0) REQUIRED(__nvJitLinkGetLinkedCubinSize_13_0)               \
  REQUIRED(__nvJitLinkGetLinkedCubin_13_0) REQUIRED(__nvJitLinkGetErrorLogSize_13_0)            \
  REQUIRED(__nvJitLinkGetErrorLog_13_0) REQUIRED(__nvJitLinkGetInfoLogSize_13_0)                \
  REQUIRED(__nvJitLinkGetInfoLog_13_0)

struct NvJitLinkApi {
  KILN_SYMBOL_TABLE(KILN_NVJITLINK_SYMBOLS)
};
/// Loads nvJitLink once (KILN_NVJITLINK_LIB, libnvJitLink.so.13, CUDA's lib64): it assembles
/// clang's PTX into a cubin in-process.
Result<const NvJitLinkApi*> nvjitlink_api();

}  // namespace kiln
