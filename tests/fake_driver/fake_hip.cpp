// A fake HIP runtime (libamdhip64) for tests on machines without an AMD GPU: it exports the entry
// points Kiln loads (runtime/driver/hip_api.h), reports one gfx942 device with 304 CUs, backs
// device memory with host memory, accepts any code object and records launches without running
// them. Tests steer and read it through the C functions at the end (dlsym).
#include <elf.h>
#include <hip/hip_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#define FAKE_EXPORT __attribute__((visibility("default")))

struct ihipModule_t {
  std::vector<unsigned char> image;
};
struct ihipModuleSymbol_t {
  std::string name;
};
struct ihipEvent_t {
  int id = 0;
};

namespace {

std::atomic<int> g_events{0}, g_modules{0}, g_launches{0};
std::mutex g_mu;
std::string g_fail;  // the call that fails next ("hipEventRecord", "hipModuleLoadDataEx"), once

bool should_fail(const char* call) {
  std::lock_guard lock(g_mu);
  if (g_fail != call) return false;
  g_fail.clear();
  return true;
}

}  // namespace

extern "C" {

FAKE_EXPORT hipError_t hipInit(unsigned int) { return hipSuccess; }
FAKE_EXPORT hipError_t hipDriverGetVersion(int* version) {
  *version = 50200000;
  return hipSuccess;
}
FAKE_EXPORT const char* hipGetErrorName(hipError_t error) {
  switch (error) {
    case hipSuccess: return "hipSuccess";
    case hipErrorInvalidValue: return "hipErrorInvalidValue";
    case hipErrorInvalidImage: return "hipErrorInvalidImage";
    default: return "hipErrorUnknown";
  }
}
FAKE_EXPORT const char* hipGetErrorString(hipError_t error) { return error == hipSuccess ? "no error" : "fake error"; }
FAKE_EXPORT hipError_t hipGetDeviceCount(int* count) {
  *count = 1;
  return hipSuccess;
}
FAKE_EXPORT hipError_t hipSetDevice(int device) { return device == 0 ? hipSuccess : hipErrorInvalidDevice; }
FAKE_EXPORT hipError_t hipGetDeviceProperties(hipDeviceProp_t* props, int device) {
  if (device != 0) return hipErrorInvalidDevice;
  std::memset(props, 0, sizeof(*props));
  std::snprintf(props->name, sizeof(props->name), "%s", "Kiln fake MI300X (no GPU)");
  std::snprintf(props->gcnArchName, sizeof(props->gcnArchName), "%s", "gfx942:sramecc+:xnack-");
  props->multiProcessorCount = 304;
  props->warpSize = 64;
  return hipSuccess;
}
FAKE_EXPORT hipError_t hipModuleLoadDataEx(hipModule_t* module, const void* image, unsigned int n,
                                           hipJitOption* options, void** values) {
  if (should_fail("hipModuleLoadDataEx")) {
    char* log = nullptr;
    size_t size = 0;
    for (unsigned i = 0; i < n; ++i) {
      if (options[i] == hipJitOptionErrorLogBuffer) log = static_cast<char*>(values[i]);
      if (options[i] == hipJitOptionErrorLogBufferSizeBytes) size = reinterpret_cast<size_t>(values[i]);
    }
    if (log && size) std::snprintf(log, size, "%s", "fake loader log: the code object is for gfx000, not gfx942");
    return hipErrorInvalidImage;
  }
  auto* m = new ihipModule_t();
  const auto* bytes = static_cast<const unsigned char*>(image);
  // The image's size is not passed: an ELF's (hsaco) is its section table's end; anything else is
  // taken as a NUL-terminated string.
  size_t size = std::strlen(static_cast<const char*>(image));
  if (std::memcmp(bytes, ELFMAG, SELFMAG) == 0) {
    Elf64_Ehdr eh;
    std::memcpy(&eh, bytes, sizeof(eh));
    size = eh.e_shoff + size_t{eh.e_shnum} * eh.e_shentsize;
  }
  m->image.assign(bytes, bytes + size);
  *module = m;
  ++g_modules;
  return hipSuccess;
}
FAKE_EXPORT hipError_t hipModuleLoadData(hipModule_t* module, const void* image) {
  return hipModuleLoadDataEx(module, image, 0, nullptr, nullptr);
}
FAKE_EXPORT hipError_t hipModuleUnload(hipModule_t module) {
  delete module;
  --g_modules;
  return hipSuccess;
}
FAKE_EXPORT hipError_t hipModuleGetFunction(hipFunction_t* fn, hipModule_t module, const char* name) {
  const std::string n(name);
  if (std::search(module->image.begin(), module->image.end(), n.begin(), n.end()) == module->image.end())
    return hipErrorNotFound;
  static std::mutex mu;
  static std::vector<ihipModuleSymbol_t*> all;  // process lifetime, as tests are
  std::lock_guard lock(mu);
  all.push_back(new ihipModuleSymbol_t{n});
  *fn = all.back();
  return hipSuccess;
}
FAKE_EXPORT hipError_t hipModuleLaunchKernel(hipFunction_t fn, unsigned int, unsigned int, unsigned int, unsigned int,
                                             unsigned int, unsigned int, unsigned int, hipStream_t, void**, void**) {
  if (!fn) return hipErrorInvalidResourceHandle;
  ++g_launches;
  return hipSuccess;
}
FAKE_EXPORT hipError_t hipExtMallocWithFlags(void** ptr, size_t bytes, unsigned int) {
  *ptr = std::aligned_alloc(256, (bytes + 255) / 256 * 256 + 256);
  return *ptr ? hipSuccess : hipErrorOutOfMemory;
}
FAKE_EXPORT hipError_t hipFree(void* ptr) {
  std::free(ptr);
  return hipSuccess;
}
FAKE_EXPORT hipError_t hipMemcpyHtoD(hipDeviceptr_t dst, void* src, size_t bytes) {
  std::memcpy(dst, src, bytes);
  return hipSuccess;
}
FAKE_EXPORT hipError_t hipMemcpyDtoH(void* dst, hipDeviceptr_t src, size_t bytes) {
  std::memcpy(dst, src, bytes);
  return hipSuccess;
}
FAKE_EXPORT hipError_t hipMemset(void* dst, int value, size_t bytes) {
  std::memset(dst, value, bytes);
  return hipSuccess;
}
FAKE_EXPORT hipError_t hipStreamSynchronize(hipStream_t) { return hipSuccess; }
FAKE_EXPORT hipError_t hipDeviceSynchronize(void) { return hipSuccess; }
FAKE_EXPORT hipError_t hipEventCreate(hipEvent_t* event) {
  *event = new ihipEvent_t();
  ++g_events;
  return hipSuccess;
}
FAKE_EXPORT hipError_t hipEventDestroy(hipEvent_t event) {
  if (!event) return hipErrorInvalidResourceHandle;
  delete event;
  --g_events;
  return hipSuccess;
}
FAKE_EXPORT hipError_t hipEventRecord(hipEvent_t event, hipStream_t) {
  if (!event) return hipErrorInvalidResourceHandle;
  return should_fail("hipEventRecord") ? hipErrorInvalidValue : hipSuccess;
}
FAKE_EXPORT hipError_t hipEventSynchronize(hipEvent_t event) {
  return event ? hipSuccess : hipErrorInvalidResourceHandle;
}
FAKE_EXPORT hipError_t hipEventElapsedTime(float* ms, hipEvent_t, hipEvent_t) {
  *ms = 0.5f;
  return hipSuccess;
}

// The fake's own API.
FAKE_EXPORT int fake_hip_live_events(void) { return g_events.load(); }
FAKE_EXPORT int fake_hip_live_modules(void) { return g_modules.load(); }
FAKE_EXPORT int fake_hip_launch_count(void) { return g_launches.load(); }
/// The next call of `call` ("hipEventRecord", "hipModuleLoadDataEx") fails; the module load also
/// writes a loader log into the error-log buffer its options pass.
FAKE_EXPORT void fake_hip_fail_next(const char* call) {
  std::lock_guard lock(g_mu);
  g_fail = call;
}

}  // extern "C"
