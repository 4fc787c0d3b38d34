// The C API of the fake CUDA driver (libkiln_fake_cuda.so, tests/fake_driver/fake_cuda.cpp), read by
// tests through dlsym on the handle of the library Kiln loaded. No GPU: the fake reports one sm_90a
// device with 132 SMs, backs device memory with host memory, accepts any code object and records
// launches without running them.
#pragma once

#include <stdint.h>

extern "C" {

/// The last kernel launch the fake saw.
struct FakeCudaLaunch {
  uint32_t grid[3];
  uint32_t block[3];
  uint32_t cluster[3];      ///< Cluster dimensions (CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION; 1 1 1 without).
  uint32_t shared_bytes;    ///< Dynamic shared memory.
  int params;               ///< Kernel parameters, from the cubin's .nv.info (-1 when it could not be read).
  int via_launch_ex;        ///< 1: cuLaunchKernelEx; 0: cuLaunchKernel.
  int programmatic;         ///< CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION was set to 1.
  void* stream;
  char kernel[128];         ///< The function's name (cuModuleGetFunction), truncated.
};

/// Type names of the entry points, for dlsym.
typedef int (*FakeCudaCountFn)(void);
typedef int (*FakeCudaLastLaunchFn)(FakeCudaLaunch*);
typedef void (*FakeCudaResetFn)(void);
typedef void (*FakeCudaFailLaunchesFn)(int);

/// Launches recorded since load or fake_cuda_reset (cuLaunchKernel and cuLaunchKernelEx).
int fake_cuda_launch_count(void);
/// Copies the last launch into *out; returns 0 when there was none.
int fake_cuda_last_launch(FakeCudaLaunch* out);
/// cuTensorMapEncodeTiled calls since load or reset.
int fake_cuda_tensor_map_count(void);
/// Modules loaded and not yet unloaded.
int fake_cuda_live_modules(void);
/// Device allocations not yet freed.
int fake_cuda_live_allocations(void);
/// cuMemsetD8 calls since load, and the byte count of the last one (the fake reports an L2 of
/// 1 MiB, so the tuner's cache flushes are 2 MiB each).
int fake_cuda_memset_count(void);
size_t fake_cuda_last_memset_bytes(void);
/// cuMemAlloc calls of exactly 2 MiB (twice the fake's L2: a cache-flush buffer) since load.
int fake_cuda_flush_sized_allocations(void);
/// Events created and not yet destroyed.
int fake_cuda_live_events(void);
/// 1 when this build lacks cuTensorMapEncodeTiled and cuLaunchKernelEx (a pre-12.0 driver).
int fake_cuda_is_old_driver(void);
/// Makes every following launch return `result` (a CUresult; 0 = success again).
void fake_cuda_fail_launches(int result);
/// Clears the counters and the last launch.
void fake_cuda_reset(void);
}
