// AMD devices through the HIP runtime. Built and checked statically here; no AMD GPU has run it.
#include <fmt/format.h>

#include "runtime/device_impl.h"
#include "runtime/driver/hip_api.h"
#include "support/log.h"

namespace kiln {

#if KILN_WITH_HIP
namespace {

// A cleanup call whose failure cannot be returned (a destructor, an error path): logged at debug
// level, since the caller's own result is what matters.
void cleanup(const HipApi& api, hipError_t rc, const char* call) {
  if (rc != hipSuccess) KILN_LOG_DEBUG("{} failed during cleanup: {}", call, api.hipGetErrorString(rc));
}

class HipModule final : public KernelFunction {
 public:
  HipModule(const HipApi* api, hipModule_t module, hipFunction_t fn) : api_(api), module_(module), fn_(fn) {}
  ~HipModule() override { cleanup(*api_, api_->hipModuleUnload(module_), "hipModuleUnload"); }
  Result<void> launch(const LaunchGeometry& g, void** args, Stream stream) const override {
    if (g.cluster.x != 1 || g.cluster.y != 1 || g.cluster.z != 1) return no_clusters();
    KILN_HIP(*api_, hipModuleLaunchKernel(fn_, g.grid.x, g.grid.y, g.grid.z, g.block.x, g.block.y, g.block.z,
                                          g.dynamic_shared_bytes, static_cast<hipStream_t>(stream), args, nullptr));
    return ok();
  }
  void* function() const override { return fn_; }

 private:
  static Error no_clusters() {
    return make_error(Errc::unsupported,
                      "thread-block clusters (LaunchGeometry::cluster) exist only on NVIDIA sm_90a; AMD launches "
                      "take a 1x1x1 cluster");
  }
  const HipApi* api_;
  hipModule_t module_;
  hipFunction_t fn_;
};

class HipDevice final : public DeviceImpl {
 public:
  HipDevice(const HipApi* api, int ordinal, std::string name, int cus, size_t cache_bytes, const TargetInfo* target)
      : api_(api), ordinal_(ordinal), name_(std::move(name)), cus_(cus), cache_bytes_(cache_bytes), target_(target) {}
  std::string name() const override { return name_; }
  const TargetInfo& target() const override { return *target_; }
  int compute_units() const override { return cus_; }
  size_t cache_bytes() const override { return cache_bytes_; }
  std::optional<MemoryLimit> free_memory() override {
    size_t free_bytes = 0, total_bytes = 0;
    if (!api_->hipMemGetInfo || api_->hipSetDevice(ordinal_) != hipSuccess ||
        api_->hipMemGetInfo(&free_bytes, &total_bytes) != hipSuccess)
      return std::nullopt;
    return MemoryLimit{free_bytes, fmt::format("the free memory of {} ({} of {}, hipMemGetInfo)", name(),
                                               format_bytes(free_bytes), format_bytes(total_bytes))};
  }
  Result<void*> malloc(size_t bytes) override {
    KILN_HIP(*api_, hipSetDevice(ordinal_));
    void* p = nullptr;
    KILN_HIP(*api_, hipExtMallocWithFlags(&p, bytes, hipDeviceMallocDefault));
    return p;
  }
  Result<void> free(void* ptr) override {
    KILN_HIP(*api_, hipFree(ptr));
    return ok();
  }
  Result<void> copy_to_device(void* dst, const void* src, size_t bytes) override {
    KILN_HIP(*api_, hipMemcpyHtoD(dst, const_cast<void*>(src), bytes));
    return ok();
  }
  Result<void> copy_to_host(void* dst, const void* src, size_t bytes) override {
    KILN_HIP(*api_, hipMemcpyDtoH(dst, const_cast<void*>(src), bytes));
    return ok();
  }
  Result<void> memset(void* dst, uint8_t value, size_t bytes) override {
    KILN_HIP(*api_, hipMemset(dst, value, bytes));
    return ok();
  }
  Result<void> synchronize(Stream stream) override {
    if (stream) {
      KILN_HIP(*api_, hipStreamSynchronize(static_cast<hipStream_t>(stream)));
    } else {
      KILN_HIP(*api_, hipDeviceSynchronize());
    }
    return ok();
  }
  Result<float> time_ms(Stream stream, const std::function<Result<void>()>& body) override {
    hipEvent_t start = nullptr, stop = nullptr;
    // Destroys whichever events were created, on every path out (an error of any call included).
    struct Guard {
      const HipApi* api;
      hipEvent_t& a;
      hipEvent_t& b;
      ~Guard() {
        if (a) cleanup(*api, api->hipEventDestroy(a), "hipEventDestroy");
        if (b) cleanup(*api, api->hipEventDestroy(b), "hipEventDestroy");
      }
    } guard{api_, start, stop};
    KILN_HIP(*api_, hipEventCreate(&start));
    KILN_HIP(*api_, hipEventCreate(&stop));
    KILN_HIP(*api_, hipEventRecord(start, static_cast<hipStream_t>(stream)));
    KILN_TRY(body());
    KILN_HIP(*api_, hipEventRecord(stop, static_cast<hipStream_t>(stream)));
    KILN_HIP(*api_, hipEventSynchronize(stop));
    float ms = 0;
    KILN_HIP(*api_, hipEventElapsedTime(&ms, start, stop));
    return ms;
  }
  Result<std::unique_ptr<KernelFunction>> load(const CodeObject& code, const std::string& kernel) override {
    KILN_HIP(*api_, hipSetDevice(ordinal_));
    hipModule_t module = nullptr;
    // The loader's log says why a code object is refused: keep it for the error message. ROCm's
    // runtime documents the options of hipModuleLoadDataEx as unused today, so the log may stay
    // empty; the error still names the code object, kernel and device.
    char error_log[8192] = {0};
    hipJitOption opts[] = {hipJitOptionErrorLogBuffer, hipJitOptionErrorLogBufferSizeBytes};
    void* vals[] = {error_log, reinterpret_cast<void*>(sizeof(error_log))};
    hipError_t loaded = api_->hipModuleLoadDataEx(&module, code.bytes.data(), 2, opts, vals);
    if (loaded != hipSuccess) {
      Error e = hip_error(*api_, loaded, "hipModuleLoadDataEx", __FILE__, __LINE__);
      e.message += fmt::format(" loading a {} of {} bytes for kernel '{}' on {}", code.format, code.bytes.size(),
                               kernel, name_);
      error_log[sizeof(error_log) - 1] = 0;
      if (error_log[0]) e.message += fmt::format("; loader log:\n{}", error_log);
      return e;
    }
    hipFunction_t fn = nullptr;
    hipError_t rc = api_->hipModuleGetFunction(&fn, module, kernel.c_str());
    if (rc != hipSuccess) {
      cleanup(*api_, api_->hipModuleUnload(module), "hipModuleUnload");
      return hip_error(*api_, rc, ("hipModuleGetFunction(" + kernel + ")").c_str(), __FILE__, __LINE__);
    }
    return std::unique_ptr<KernelFunction>(new HipModule(api_, module, fn));
  }

 private:
  const HipApi* api_;
  int ordinal_;
  std::string name_;
  int cus_;
  size_t cache_bytes_;
  const TargetInfo* target_;
};

}  // namespace

Result<std::unique_ptr<DeviceImpl>> open_hip_device(int ordinal) {
  KILN_ASSIGN_OR_RETURN(const HipApi* api, hip_api());
  KILN_HIP(*api, hipInit(0));
  int count = 0;
  KILN_HIP(*api, hipGetDeviceCount(&count));
  if (ordinal < 0 || ordinal >= count)
    return make_error(Errc::driver_unavailable,
                      fmt::format("AMD device {} does not exist ({} device(s) found)", ordinal, count));
  hipDeviceProp_t props{};
  KILN_HIP(*api, hipGetDeviceProperties(&props, ordinal));
  // gcnArchName is e.g. "gfx942:sramecc+:xnack-"; the target is the part before the first ':'.
  std::string arch = props.gcnArchName;
  arch = arch.substr(0, arch.find(':'));
  auto target = find_target(arch);
  if (!target)
    return make_error(Errc::unsupported, fmt::format("{} is {}; Kiln has no target for it yet (supported: "
                                                     "gfx942, gfx950)",
                                                     props.name, arch));
  // The L2 that the driver reports, and the 256 MiB Infinity Cache (MALL) of every CDNA3/CDNA4
  // Instinct part Kiln targets (MI300X, MI325X, MI350X, MI355X), which hipDeviceProp_t does not list.
  const size_t cache = static_cast<size_t>(props.l2CacheSize > 0 ? props.l2CacheSize : 0) + (size_t{256} << 20);
  return std::unique_ptr<DeviceImpl>(
      new HipDevice(api, ordinal, props.name, props.multiProcessorCount, cache, *target));
}

#else
Result<std::unique_ptr<DeviceImpl>> open_hip_device(int) {
  return make_error(Errc::unsupported,
                    "this Kiln was built without the HIP headers (install libamdhip64-dev and rebuild) "
                    "and cannot drive AMD GPUs");
}
#endif

}  // namespace kiln
