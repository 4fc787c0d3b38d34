// The CUDA driver API (libcuda), dlopen'd. One symbol list generates the table and its loader.
#pragma once

#include <cuda.h>

#include <string>

#include "kiln/result.h"
#include "support/dynlib.h"

namespace kiln {

#define KILN_CUDA_SYMBOLS(X)                                                                \
  X(cuInit) X(cuDriverGetVersion) X(cuGetErrorName) X(cuGetErrorString) X(cuDeviceGet)      \
  X(cuDeviceGetCount) X(cuDeviceGetName) X(cuDeviceGetAttribute) X(cuDevicePrimaryCtxRetain) \
  X(cuDevicePrimaryCtxRelease) X(cuCtxSetCurrent) X(cuCtxGetCurrent) X(cuCtxSynchronize)    \
  X(cuModuleLoadData) X(cuModuleLoadDataEx) X(cuModuleUnload) X(cuModuleGetFunction) X(cuFuncGetAttribute) X(cuFuncSetAttribute)      \
  X(cuLaunchKernel) X(cuMemAlloc) X(cuMemFree) X(cuMemcpyHtoD) X(cuMemcpyDtoH)              \
  X(cuMemsetD8) X(cuStreamCreate) X(cuStreamDestroy) X(cuStreamSynchronize)                 \
  X(cuEventCreate) X(cuEventDestroy) X(cuEventRecord) X(cuEventSynchronize)                 \
  X(cuEventElapsedTime) X(cuTensorMapEncodeTiled)

struct CudaApi {
  KILN_CUDA_SYMBOLS(KILN_DECLARE_SYMBOL)
  std::string path;
};

/// Loads libcuda once per process (KILN_CUDA_LIB, then libcuda.so.1, libcuda.so).
Result<const CudaApi*> cuda_api();

/// "cuLaunchKernel(...) failed: CUDA_ERROR_INVALID_VALUE (invalid argument) at file:line".
Error cuda_error(const CudaApi& api, CUresult rc, const char* call, const char* file, int line);

}  // namespace kiln

/// Checks a driver call, returning an Error that carries the code, its name, the message and the
/// call as written.
#define KILN_CU(api, call)                                                       \
  do {                                                                           \
    CUresult kiln_cu_rc_ = (api).call;                                           \
    if (kiln_cu_rc_ != CUDA_SUCCESS)                                             \
      return ::kiln::cuda_error((api), kiln_cu_rc_, #call, __FILE__, __LINE__);  \
  } while (0)
