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
#define KILN_HIP_SYMBOLS(REQUIRED, OPTIONAL)                                                              \
  REQUIRED(hipInit) REQUIRED(hipDriverGetVersion) REQUIRED(hipGetErrorName) REQUIRED(hipGetErrorString)    \
  REQUIRED(hipGetDeviceCount) REQUIRED(hipSetDevice) REQUIRED(hipGetDeviceProperties)                      \
  REQUIRED(hipModuleLoadDataEx) REQUIRED(hipModuleUnload) REQUIRED(hipModuleGetFunction)                   \
  REQUIRED(hipModuleLaunchKernel) REQUIRED(hipExtMallocWithFlags) REQUIRED(hipFree) REQUIRED(hipMemcpyHtoD) \
  REQUIRED(hipMemcpyDtoH) REQUIRED(hipMemset) REQUIRED(hipStreamSynchronize) REQUIRED(hipDeviceSynchronize) \
  REQUIRED(hipEventCreate) REQUIRED(hipEventDestroy) REQUIRED(hipEventRecord) REQUIRED(hipEventSynchronize) \
  REQUIRED(hipEventElapsedTime) OPTIONAL(hipMemGetInfo)

struct HipApi {
  KILN_SYMBOL_TABLE(KILN_HIP_SYMBOLS)
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
