// The CUDA driver API (libcuda), dlopen'd. One symbol list generates the table and its loader.
#pragma once

#include <cuda.h>

#include <string>

#include "kiln/result.h"
#include "support/dynlib.h"

namespace kiln {

// Required symbols exist in every driver Kiln runs on (CUDA 11.x and newer); the optional ones are
// newer and null on older drivers:
//   cuTensorMapEncodeTiled  CUDA 12.0 (driver R525): the TMA kernels' tensor maps;
//   cuLaunchKernelEx        CUDA 12.0 (driver R525): thread-block clusters and programmatic
//                           dependent launch.
#define KILN_CUDA_SYMBOLS(REQUIRED, OPTIONAL)                                                             \
  REQUIRED(cuInit) REQUIRED(cuDriverGetVersion) REQUIRED(cuGetErrorName) REQUIRED(cuGetErrorString)       \
  REQUIRED(cuDeviceGet) REQUIRED(cuDeviceGetCount) REQUIRED(cuDeviceGetName) REQUIRED(cuDeviceGetAttribute) \
  REQUIRED(cuDevicePrimaryCtxRetain) REQUIRED(cuDevicePrimaryCtxRelease) REQUIRED(cuCtxSetCurrent)         \
  REQUIRED(cuCtxGetCurrent) REQUIRED(cuCtxSynchronize) REQUIRED(cuModuleLoadData)                          \
  REQUIRED(cuModuleLoadDataEx) REQUIRED(cuModuleUnload) REQUIRED(cuModuleGetFunction)                      \
  REQUIRED(cuFuncGetAttribute) REQUIRED(cuFuncSetAttribute) REQUIRED(cuLaunchKernel) REQUIRED(cuMemAlloc)  \
  REQUIRED(cuMemFree) REQUIRED(cuMemcpyHtoD) REQUIRED(cuMemcpyDtoH) REQUIRED(cuMemsetD8)                   \
  REQUIRED(cuStreamCreate) REQUIRED(cuStreamDestroy) REQUIRED(cuStreamSynchronize) REQUIRED(cuEventCreate) \
  REQUIRED(cuEventDestroy) REQUIRED(cuEventRecord) REQUIRED(cuEventSynchronize)                            \
  REQUIRED(cuEventElapsedTime) OPTIONAL(cuTensorMapEncodeTiled) OPTIONAL(cuLaunchKernelEx)                \
  OPTIONAL(cuMemGetInfo)

struct CudaApi {
  KILN_SYMBOL_TABLE(KILN_CUDA_SYMBOLS)
  int driver_version = 0;  ///< cuDriverGetVersion: 1000 * major + 10 * minor (12080 = CUDA 12.8).
};

/// Loads libcuda once per process (KILN_CUDA_LIB, then a copy already loaded, then libcuda.so.1,
/// libcuda.so). Errors: Errc::driver_unavailable (not found, or lacking a required symbol).
Result<const CudaApi*> cuda_api();

/// "cuLaunchKernel(...) failed: CUDA_ERROR_INVALID_VALUE (invalid argument) at file:line".
Error cuda_error(const CudaApi& api, CUresult rc, const char* call, const char* file, int line);

/// "CUDA 11.8" for a cuDriverGetVersion value.
std::string cuda_version_string(int version);

/// The error for an optional entry point (both need CUDA 12.0) that this driver lacks: "`use`
/// needs `symbol`, which the NVIDIA driver at PATH (CUDA 11.8) lacks: `symbol` needs CUDA 12.0 or
/// newer (driver R525+); ...". Errc::unsupported.
Error cuda_missing_symbol(const CudaApi& api, const char* symbol, const char* use);

}  // namespace kiln

/// Checks a driver call, returning an Error that carries the code, its name, the message and the
/// call as written.
#define KILN_CU(api, call)                                                       \
  do {                                                                           \
    CUresult kiln_cu_rc_ = (api).call;                                           \
    if (kiln_cu_rc_ != CUDA_SUCCESS)                                             \
      return ::kiln::cuda_error((api), kiln_cu_rc_, #call, __FILE__, __LINE__);  \
  } while (0)
