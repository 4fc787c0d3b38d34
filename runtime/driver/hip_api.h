// The HIP runtime (libamdhip64), dlopen'd. Built only where the HIP headers are installed
// (Debian's libamdhip64-dev); elsewhere AMD launches return a clear error.
#pragma once

#include <string>

#include "kiln/result.h"

#if KILN_WITH_HIP
#include <hip/hip_runtime_api.h>

#include "support/dynlib.h"

namespace kiln {

// hipMalloc is overloaded in C++ (a template wrapper), so allocation goes through
// hipExtMallocWithFlags, which has one declaration.
#define KILN_HIP_SYMBOLS(X)                                                                    \
  X(hipInit) X(hipDriverGetVersion) X(hipGetErrorName) X(hipGetErrorString)                    \
  X(hipGetDeviceCount) X(hipSetDevice) X(hipGetDeviceProperties) X(hipModuleLoadData)          \
  X(hipModuleUnload) X(hipModuleGetFunction) X(hipModuleLaunchKernel) X(hipExtMallocWithFlags) \
  X(hipFree) X(hipMemcpyHtoD) X(hipMemcpyDtoH) X(hipMemset) X(hipStreamSynchronize)            \
  X(hipDeviceSynchronize) X(hipEventCreate) X(hipEventDestroy) X(hipEventRecord)               \
  X(hipEventSynchronize) X(hipEventElapsedTime)

struct HipApi {
  KILN_HIP_SYMBOLS(KILN_DECLARE_SYMBOL)
  std::string path;
};

/// Loads libamdhip64 once (KILN_HIP_LIB, libamdhip64.so.6, .so.5, .so, /opt/rocm/lib).
Result<const HipApi*> hip_api();
Error hip_error(const HipApi& api, hipError_t rc, const char* call, const char* file, int line);

}  // namespace kiln

#define KILN_HIP(api, call)                                                     \
  do {                                                                          \
    hipError_t kiln_hip_rc_ = (api).call;                                       \
    if (kiln_hip_rc_ != hipSuccess)                                             \
      return ::kiln::hip_error((api), kiln_hip_rc_, #call, __FILE__, __LINE__); \
  } while (0)
#endif
