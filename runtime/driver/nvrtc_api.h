// NVRTC (libnvrtc) and nvJitLink (libnvJitLink), dlopen'd from the CUDA toolkit.
#pragma once

#include <nvJitLink.h>
#include <nvrtc.h>

#include <string>

#include "kiln/result.h"
#include "support/dynlib.h"

namespace kiln {

#define KILN_NVRTC_SYMBOLS(X)                                                                  \
  X(nvrtcVersion) X(nvrtcGetErrorString) X(nvrtcCreateProgram) X(nvrtcDestroyProgram)          \
  X(nvrtcCompileProgram) X(nvrtcGetProgramLogSize) X(nvrtcGetProgramLog) X(nvrtcGetPTXSize)    \
  X(nvrtcGetPTX) X(nvrtcGetCUBINSize) X(nvrtcGetCUBIN)

struct NvrtcApi {
  KILN_NVRTC_SYMBOLS(KILN_DECLARE_SYMBOL)
  std::string path;
  int major = 0, minor = 0;
};
/// Loads NVRTC once (KILN_NVRTC_LIB, libnvrtc.so.13, libnvrtc.so.12, libnvrtc.so, CUDA's lib64).
Result<const NvrtcApi*> nvrtc_api();

// nvJitLink's entry points carry the toolkit version in their symbol names (nvJitLink.h maps
// nvJitLinkCreate to __nvJitLinkCreate_13_0): the table names the versioned symbols.
#define KILN_NVJITLINK_SYMBOLS(X)                                                            \
  X(__nvJitLinkCreate_13_0) X(__nvJitLinkDestroy_13_0) X(__nvJitLinkAddData_13_0)            \
  X(__nvJitLinkComplete_13_0) X(__nvJitLinkGetLinkedCubinSize_13_0)                         \
  X(__nvJitLinkGetLinkedCubin_13_0) X(__nvJitLinkGetErrorLogSize_13_0)                      \
  X(__nvJitLinkGetErrorLog_13_0) X(__nvJitLinkGetInfoLogSize_13_0) X(__nvJitLinkGetInfoLog_13_0)

struct NvJitLinkApi {
  KILN_NVJITLINK_SYMBOLS(KILN_DECLARE_SYMBOL)
  std::string path;
};
/// Loads nvJitLink once (KILN_NVJITLINK_LIB, libnvJitLink.so.13, CUDA's lib64): it assembles
/// clang's PTX into a cubin in-process.
Result<const NvJitLinkApi*> nvjitlink_api();

}  // namespace kiln
