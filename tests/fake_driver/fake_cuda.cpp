// A fake CUDA driver (libcuda) for tests on machines without a GPU: it exports the driver entry
// points Kiln loads (runtime/driver/cuda_api.h), reports one sm_90a device with 132 SMs, backs
// device memory with host memory, accepts any code object, and records kernel launches without
// running them. Tests read what it saw through the C API of fake_cuda.h (dlsym).
//
// Built twice: libkiln_fake_cuda.so (a CUDA 13 driver) and, with KILN_FAKE_CUDA_OLD_DRIVER,
// libkiln_fake_cuda_old.so, a driver older than CUDA 12.0: no cuTensorMapEncodeTiled and no
// cuLaunchKernelEx. The launch path is cheap (no allocation, no lock), so it can also serve to
// profile Kiln's host-side cost per launch.
#include <cuda.h>
#include <elf.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "fake_driver/fake_cuda.h"

#define FAKE_EXPORT __attribute__((visibility("default")))

// The opaque handle types of cuda.h, defined here.
struct CUctx_st {
  int device = 0;
};
struct CUstream_st {
  int id = 0;
};
struct CUevent_st {
  std::chrono::steady_clock::time_point when{};
};
struct CUfunc_st {
  std::string name;
  int params = -1;
  int max_dynamic_shared = 48 * 1024;
};
struct CUmod_st {
  std::vector<unsigned char> image;
  std::vector<std::unique_ptr<CUfunc_st>> functions;  // owned by the module, as the driver's are
};

namespace {

constexpr int kDriverVersion =
#ifdef KILN_FAKE_CUDA_OLD_DRIVER
    11080;
#else
    13000;
#endif

CUctx_st g_primary;
thread_local CUcontext t_current = nullptr;
std::atomic<bool> g_initialized{false};

std::atomic<int> g_launches{0}, g_tensor_maps{0}, g_modules{0}, g_allocations{0}, g_events{0}, g_memsets{0};
// cuMemAlloc calls of the device's flush size (2 x the fake's 1 MiB L2): the tuner's flush buffers.
std::atomic<int> g_flush_sized_allocs{0};
std::atomic<size_t> g_last_memset_bytes{0};
std::atomic<int> g_fail_launches{0};
std::mutex g_last_mu;  // guards g_last (launch records are rare enough in tests; uncontended otherwise)
FakeCudaLaunch g_last{};
bool g_has_last = false;

// The number of kernel parameters of `kernel` in a cubin: the EIATTR_KPARAM_INFO attributes of its
// .nv.info.<kernel> section (-1 when the image is not an ELF cubin or has no such section).
int count_params(const std::vector<unsigned char>& image, const std::string& kernel) {
  if (image.size() < sizeof(Elf64_Ehdr) || std::memcmp(image.data(), ELFMAG, SELFMAG) != 0) return -1;
  Elf64_Ehdr eh;
  std::memcpy(&eh, image.data(), sizeof(eh));
  if (eh.e_shentsize != sizeof(Elf64_Shdr) || eh.e_shoff + uint64_t{eh.e_shnum} * sizeof(Elf64_Shdr) > image.size() ||
      eh.e_shstrndx >= eh.e_shnum)
    return -1;
  auto section = [&](size_t i) {
    Elf64_Shdr sh;
    std::memcpy(&sh, image.data() + eh.e_shoff + i * sizeof(Elf64_Shdr), sizeof(sh));
    return sh;
  };
  const Elf64_Shdr names = section(eh.e_shstrndx);
  const std::string want = ".nv.info." + kernel;
  for (size_t i = 0; i < eh.e_shnum; ++i) {
    const Elf64_Shdr sh = section(i);
    if (names.sh_offset + sh.sh_name + want.size() + 1 > image.size() || sh.sh_offset + sh.sh_size > image.size())
      continue;
    if (std::memcmp(image.data() + names.sh_offset + sh.sh_name, want.c_str(), want.size() + 1) != 0) continue;
    // Attributes: u8 format, u8 attribute, then a u16 value, or (format 0x04, EIFMT_SVAL) a u16
    // size and that many bytes.
    const unsigned char* p = image.data() + sh.sh_offset;
    size_t off = 0;
    int params = 0;
    while (off + 4 <= sh.sh_size) {
      const unsigned format = p[off], attribute = p[off + 1];
      const unsigned size = p[off + 2] | (p[off + 3] << 8);
      if (attribute == 0x17) ++params;  // EIATTR_KPARAM_INFO, one per parameter
      off += 4 + (format == 0x04 ? size : 0);
    }
    return params;
  }
  return -1;
}

CUresult record_launch(CUfunction f, const unsigned grid[3], const unsigned block[3], unsigned shared,
                       CUstream stream, const unsigned cluster[3], bool ex, bool programmatic) {
  if (!f) return CUDA_ERROR_INVALID_HANDLE;
  if (int fail = g_fail_launches.load(std::memory_order_relaxed)) return static_cast<CUresult>(fail);
  if (!t_current) return CUDA_ERROR_INVALID_CONTEXT;
  for (int i = 0; i < 3; ++i)
    if (grid[i] == 0 || block[i] == 0) return CUDA_ERROR_INVALID_VALUE;
  if (block[0] * block[1] * block[2] > 1024) return CUDA_ERROR_INVALID_VALUE;
  if (shared > static_cast<unsigned>(f->max_dynamic_shared)) return CUDA_ERROR_INVALID_VALUE;
  {
    std::lock_guard lock(g_last_mu);
    for (int i = 0; i < 3; ++i) {
      g_last.grid[i] = grid[i];
      g_last.block[i] = block[i];
      g_last.cluster[i] = cluster[i];
    }
    g_last.shared_bytes = shared;
    g_last.params = f->params;
    g_last.via_launch_ex = ex;
    g_last.programmatic = programmatic;
    g_last.stream = stream;
    std::strncpy(g_last.kernel, f->name.c_str(), sizeof(g_last.kernel) - 1);
    g_last.kernel[sizeof(g_last.kernel) - 1] = 0;
    g_has_last = true;
  }
  g_launches.fetch_add(1, std::memory_order_relaxed);
  return CUDA_SUCCESS;
}

}  // namespace

extern "C" {

// --- Initialisation, version, errors -------------------------------------------------------------

FAKE_EXPORT CUresult cuInit(unsigned int) {
  g_initialized = true;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuDriverGetVersion(int* version) {
  if (!version) return CUDA_ERROR_INVALID_VALUE;
  *version = kDriverVersion;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuGetErrorName(CUresult error, const char** name) {
  if (!name) return CUDA_ERROR_INVALID_VALUE;
  switch (error) {
    case CUDA_SUCCESS: *name = "CUDA_SUCCESS"; break;
    case CUDA_ERROR_INVALID_VALUE: *name = "CUDA_ERROR_INVALID_VALUE"; break;
    case CUDA_ERROR_OUT_OF_MEMORY: *name = "CUDA_ERROR_OUT_OF_MEMORY"; break;
    case CUDA_ERROR_NOT_INITIALIZED: *name = "CUDA_ERROR_NOT_INITIALIZED"; break;
    case CUDA_ERROR_INVALID_CONTEXT: *name = "CUDA_ERROR_INVALID_CONTEXT"; break;
    case CUDA_ERROR_INVALID_HANDLE: *name = "CUDA_ERROR_INVALID_HANDLE"; break;
    case CUDA_ERROR_NOT_FOUND: *name = "CUDA_ERROR_NOT_FOUND"; break;
    case CUDA_ERROR_LAUNCH_FAILED: *name = "CUDA_ERROR_LAUNCH_FAILED"; break;
    case CUDA_ERROR_INVALID_IMAGE: *name = "CUDA_ERROR_INVALID_IMAGE"; break;
    default: *name = "CUDA_ERROR_UNKNOWN"; return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuGetErrorString(CUresult error, const char** text) {
  if (!text) return CUDA_ERROR_INVALID_VALUE;
  *text = error == CUDA_SUCCESS ? "no error" : "fake driver error";
  return CUDA_SUCCESS;
}

// --- Devices and contexts ------------------------------------------------------------------------

FAKE_EXPORT CUresult cuDeviceGetCount(int* count) {
  if (!g_initialized) return CUDA_ERROR_NOT_INITIALIZED;
  *count = 1;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuDeviceGet(CUdevice* device, int ordinal) {
  if (!g_initialized) return CUDA_ERROR_NOT_INITIALIZED;
  if (ordinal != 0) return CUDA_ERROR_INVALID_DEVICE;
  *device = 0;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuDeviceGetName(char* name, int len, CUdevice device) {
  if (device != 0) return CUDA_ERROR_INVALID_DEVICE;
  if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
  std::snprintf(name, static_cast<size_t>(len), "%s", "Kiln fake H100 (no GPU)");
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuDeviceGetAttribute(int* value, CUdevice_attribute attribute, CUdevice device) {
  if (device != 0) return CUDA_ERROR_INVALID_DEVICE;
  switch (attribute) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *value = 9; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *value = 0; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *value = 132; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *value = 1024; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *value = 32; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: *value = 227 * 1024; break;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: *value = 1 << 20; break;  // 1 MiB (an H100 has 50): cheap tuner flushes
    default: *value = 0; break;
  }
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext* ctx, CUdevice device) {
  if (device != 0) return CUDA_ERROR_INVALID_DEVICE;
  *ctx = &g_primary;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice device) {
  return device == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}
FAKE_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx) {
  t_current = ctx;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuCtxGetCurrent(CUcontext* ctx) {
  *ctx = t_current;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuCtxSynchronize(void) { return t_current ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT; }

// --- Modules and functions -----------------------------------------------------------------------

FAKE_EXPORT CUresult cuModuleLoadDataEx(CUmodule* module, const void* image, unsigned int, CUjit_option*, void**) {
  if (!module || !image) return CUDA_ERROR_INVALID_VALUE;
  if (!t_current) return CUDA_ERROR_INVALID_CONTEXT;
  auto* m = new CUmod_st();
  // The image's size is not passed: an ELF's is its section table's end; anything else (PTX) is a
  // NUL-terminated string.
  const auto* bytes = static_cast<const unsigned char*>(image);
  size_t size = 0;
  if (std::memcmp(bytes, ELFMAG, SELFMAG) == 0) {
    Elf64_Ehdr eh;
    std::memcpy(&eh, bytes, sizeof(eh));
    size = eh.e_shoff + size_t{eh.e_shnum} * eh.e_shentsize;
  } else {
    size = std::strlen(static_cast<const char*>(image)) + 1;
  }
  m->image.assign(bytes, bytes + size);
  *module = m;
  g_modules.fetch_add(1);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuModuleLoadData(CUmodule* module, const void* image) {
  return cuModuleLoadDataEx(module, image, 0, nullptr, nullptr);
}
FAKE_EXPORT CUresult cuModuleUnload(CUmodule module) {
  if (!module) return CUDA_ERROR_INVALID_HANDLE;
  delete module;
  g_modules.fetch_sub(1);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuModuleGetFunction(CUfunction* fn, CUmodule module, const char* name) {
  if (!fn || !module || !name) return CUDA_ERROR_INVALID_VALUE;
  // A real driver finds the symbol; the fake at least wants the name somewhere in the image.
  const std::string n(name);
  const auto& img = module->image;
  if (std::search(img.begin(), img.end(), n.begin(), n.end()) == img.end()) return CUDA_ERROR_NOT_FOUND;
  for (const auto& known : module->functions)
    if (known->name == n) {
      *fn = known.get();
      return CUDA_SUCCESS;
    }
  auto f = std::make_unique<CUfunc_st>();
  f->name = n;
  f->params = count_params(img, n);
  *fn = f.get();
  module->functions.push_back(std::move(f));
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuFuncGetAttribute(int* value, CUfunction_attribute attribute, CUfunction f) {
  if (!value || !f) return CUDA_ERROR_INVALID_VALUE;
  switch (attribute) {
    case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *value = 1024; break;
    case CU_FUNC_ATTRIBUTE_NUM_REGS: *value = 32; break;
    case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES: *value = f->max_dynamic_shared; break;
    default: *value = 0; break;
  }
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuFuncSetAttribute(CUfunction f, CUfunction_attribute attribute, int value) {
  if (!f) return CUDA_ERROR_INVALID_HANDLE;
  if (attribute == CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES) {
    if (value < 0 || value > 227 * 1024) return CUDA_ERROR_INVALID_VALUE;
    f->max_dynamic_shared = value;
  }
  return CUDA_SUCCESS;
}

// --- Launches ------------------------------------------------------------------------------------

FAKE_EXPORT CUresult cuLaunchKernel(CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,
                                    unsigned int by, unsigned int bz, unsigned int shared, CUstream stream, void**,
                                    void**) {
  // As the real driver: a launch needs a current context, and the function's own.
  if (!t_current) return CUDA_ERROR_INVALID_CONTEXT;
  if (t_current != &g_primary) return CUDA_ERROR_INVALID_HANDLE;
  const unsigned grid[3] = {gx, gy, gz}, block[3] = {bx, by, bz}, cluster[3] = {1, 1, 1};
  return record_launch(f, grid, block, shared, stream, cluster, false, false);
}

#ifndef KILN_FAKE_CUDA_OLD_DRIVER
FAKE_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig* config, CUfunction f, void**, void**) {
  if (!config) return CUDA_ERROR_INVALID_VALUE;
  unsigned cluster[3] = {1, 1, 1};
  bool programmatic = false;
  for (unsigned i = 0; i < config->numAttrs; ++i) {
    const CUlaunchAttribute& a = config->attrs[i];
    if (a.id == CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION) {
      cluster[0] = a.value.clusterDim.x;
      cluster[1] = a.value.clusterDim.y;
      cluster[2] = a.value.clusterDim.z;
    } else if (a.id == CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION) {
      programmatic = a.value.programmaticStreamSerializationAllowed != 0;
    }
  }
  const unsigned grid[3] = {config->gridDimX, config->gridDimY, config->gridDimZ};
  const unsigned block[3] = {config->blockDimX, config->blockDimY, config->blockDimZ};
  // The grid must be a whole number of clusters, and a cluster has at most 8 blocks (16 opt-in).
  for (int i = 0; i < 3; ++i)
    if (cluster[i] == 0 || grid[i] % cluster[i] != 0) return CUDA_ERROR_INVALID_VALUE;
  if (cluster[0] * cluster[1] * cluster[2] > 16) return CUDA_ERROR_INVALID_VALUE;
  return record_launch(f, grid, block, config->sharedMemBytes, config->hStream, cluster, true, programmatic);
}

FAKE_EXPORT CUresult cuTensorMapEncodeTiled(CUtensorMap* map, CUtensorMapDataType, cuuint32_t rank, void* address,
                                            const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,
                                            const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                            CUtensorMapL2promotion, CUtensorMapFloatOOBfill) {
  if (!map || rank == 0 || rank > 5 || !dims || !box) return CUDA_ERROR_INVALID_VALUE;
  if (reinterpret_cast<uintptr_t>(address) % 16 != 0) return CUDA_ERROR_INVALID_VALUE;
  for (cuuint32_t i = 0; i + 1 < rank; ++i)
    if (!strides || strides[i] % 16 != 0) return CUDA_ERROR_INVALID_VALUE;
  std::memset(map, 0, sizeof(*map));
  std::memcpy(map, &address, sizeof(address));
  g_tensor_maps.fetch_add(1, std::memory_order_relaxed);
  return CUDA_SUCCESS;
}
#endif

// --- Memory (host memory standing in for device memory) -------------------------------------------

FAKE_EXPORT CUresult cuMemAlloc(CUdeviceptr* ptr, size_t bytes) {
  if (!ptr) return CUDA_ERROR_INVALID_VALUE;
  if (!t_current) return CUDA_ERROR_INVALID_CONTEXT;
  // 256-byte aligned, as cuMemAlloc's allocations are.
  void* p = std::aligned_alloc(256, (bytes + 255) / 256 * 256 + (bytes == 0 ? 256 : 0));
  if (!p) return CUDA_ERROR_OUT_OF_MEMORY;
  *ptr = reinterpret_cast<CUdeviceptr>(p);
  g_allocations.fetch_add(1);
  if (bytes == size_t{2} << 20) g_flush_sized_allocs.fetch_add(1);
  return CUDA_SUCCESS;
}
// An H100's 80 GiB, all free: Kiln refuses a request larger than that before allocating it.
FAKE_EXPORT CUresult cuMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  if (!free_bytes || !total_bytes) return CUDA_ERROR_INVALID_VALUE;
  if (!t_current) return CUDA_ERROR_INVALID_CONTEXT;
  *free_bytes = *total_bytes = size_t{80} << 30;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuMemFree(CUdeviceptr ptr) {
  if (!ptr) return CUDA_ERROR_INVALID_VALUE;
  std::free(reinterpret_cast<void*>(ptr));
  g_allocations.fetch_sub(1);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuMemcpyHtoD(CUdeviceptr dst, const void* src, size_t bytes) {
  if (bytes) std::memcpy(reinterpret_cast<void*>(dst), src, bytes);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuMemcpyDtoH(void* dst, CUdeviceptr src, size_t bytes) {
  if (bytes) std::memcpy(dst, reinterpret_cast<const void*>(src), bytes);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuMemsetD8(CUdeviceptr dst, unsigned char value, size_t count) {
  if (count) std::memset(reinterpret_cast<void*>(dst), value, count);
  g_memsets.fetch_add(1);
  g_last_memset_bytes.store(count);
  return CUDA_SUCCESS;
}

// --- Streams and events --------------------------------------------------------------------------

FAKE_EXPORT CUresult cuStreamCreate(CUstream* stream, unsigned int) {
  if (!stream) return CUDA_ERROR_INVALID_VALUE;
  *stream = new CUstream_st();
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuStreamDestroy(CUstream stream) {
  delete stream;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuStreamSynchronize(CUstream) { return CUDA_SUCCESS; }
FAKE_EXPORT CUresult cuEventCreate(CUevent* event, unsigned int) {
  if (!event) return CUDA_ERROR_INVALID_VALUE;
  *event = new CUevent_st();
  g_events.fetch_add(1);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuEventDestroy(CUevent event) {
  if (!event) return CUDA_ERROR_INVALID_HANDLE;
  delete event;
  g_events.fetch_sub(1);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuEventRecord(CUevent event, CUstream) {
  if (!event) return CUDA_ERROR_INVALID_HANDLE;
  event->when = std::chrono::steady_clock::now();
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult cuEventSynchronize(CUevent event) { return event ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE; }
FAKE_EXPORT CUresult cuEventElapsedTime(float* ms, CUevent start, CUevent stop) {
  if (!ms || !start || !stop) return CUDA_ERROR_INVALID_VALUE;
  *ms = std::chrono::duration<float, std::milli>(stop->when - start->when).count();
  return CUDA_SUCCESS;
}

// --- The fake's own C API (fake_cuda.h) ----------------------------------------------------------

FAKE_EXPORT int fake_cuda_launch_count(void) { return g_launches.load(); }
FAKE_EXPORT int fake_cuda_last_launch(FakeCudaLaunch* out) {
  std::lock_guard lock(g_last_mu);
  if (!g_has_last || !out) return 0;
  *out = g_last;
  return 1;
}
FAKE_EXPORT int fake_cuda_tensor_map_count(void) { return g_tensor_maps.load(); }
FAKE_EXPORT int fake_cuda_live_modules(void) { return g_modules.load(); }
FAKE_EXPORT int fake_cuda_live_allocations(void) { return g_allocations.load(); }
FAKE_EXPORT int fake_cuda_live_events(void) { return g_events.load(); }
FAKE_EXPORT int fake_cuda_memset_count(void) { return g_memsets.load(); }
FAKE_EXPORT size_t fake_cuda_last_memset_bytes(void) { return g_last_memset_bytes.load(); }
FAKE_EXPORT int fake_cuda_flush_sized_allocations(void) { return g_flush_sized_allocs.load(); }
FAKE_EXPORT int fake_cuda_is_old_driver(void) {
#ifdef KILN_FAKE_CUDA_OLD_DRIVER
  return 1;
#else
  return 0;
#endif
}
FAKE_EXPORT void fake_cuda_fail_launches(int result) { g_fail_launches = result; }
FAKE_EXPORT void fake_cuda_reset(void) {
  std::lock_guard lock(g_last_mu);
  g_launches = 0;
  g_tensor_maps = 0;
  g_has_last = false;
  g_last = FakeCudaLaunch{};
}

}  // extern "C"
