#include <fmt/format.h>

#include <atomic>

#include "runtime/device_impl.h"
#include "runtime/driver/cuda_api.h"
#include "support/log.h"

namespace kiln {
namespace {

class CudaModule final : public KernelFunction {
 public:
  CudaModule(const CudaApi* api, CUcontext ctx, CUmodule module, CUfunction fn)
      : api_(api), ctx_(ctx), module_(module), fn_(fn) {}
  ~CudaModule() override {
    api_->cuCtxSetCurrent(ctx_);
    api_->cuModuleUnload(module_);
  }
  Result<void> launch(const LaunchGeometry& g, void** args, Stream stream) const override {
    // More than 48 KiB of dynamic shared memory (the WGMMA GEMM's stages) needs the function's
    // opt-in limit raised first; done once per module, for the largest size asked for so far.
    constexpr uint32_t kDefaultDynamicLimit = 48 * 1024;
    if (g.dynamic_shared_bytes > kDefaultDynamicLimit && g.dynamic_shared_bytes > dynamic_limit_.load()) {
      KILN_CU(*api_, cuFuncSetAttribute(fn_, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                        static_cast<int>(g.dynamic_shared_bytes)));
      uint32_t seen = dynamic_limit_.load();
      while (seen < g.dynamic_shared_bytes && !dynamic_limit_.compare_exchange_weak(seen, g.dynamic_shared_bytes)) {
      }
    }
    // Programmatic dependent launch is an overlap, not a need: without cuLaunchKernelEx (a driver
    // before R525) such a launch is a plain one, after which the kernel's griddepcontrol.wait
    // returns at once. Clusters are a need, and are refused in launch_ex.
    const bool plain = g.cluster.x == 1 && g.cluster.y == 1 && g.cluster.z == 1 &&
                       (!g.programmatic_dependent_launch || !api_->cuLaunchKernelEx);
    if (plain) {
      // The common launch: no attribute, the same single driver call as a raw launch. The primary
      // context must be current on the calling thread; a launch refused for want of it (a new
      // thread, or another library made its own context current) binds it and launches again.
      // Asking for the current context first would cost a second driver call on every launch.
      auto launch = [&] {
        return api_->cuLaunchKernel(fn_, g.grid.x, g.grid.y, g.grid.z, g.block.x, g.block.y, g.block.z,
                                    g.dynamic_shared_bytes, static_cast<CUstream>(stream), args, nullptr);
      };
      CUresult rc = launch();
      if (rc != CUDA_SUCCESS && wrong_context(rc)) {
        KILN_CU(*api_, cuCtxSetCurrent(ctx_));
        rc = launch();
      }
      if (rc != CUDA_SUCCESS) return cuda_error(*api_, rc, "cuLaunchKernel", __FILE__, __LINE__);
      return ok();
    }
    CUcontext current = nullptr;
    if (api_->cuCtxGetCurrent(&current) != CUDA_SUCCESS || current != ctx_) KILN_CU(*api_, cuCtxSetCurrent(ctx_));
    return launch_ex(g, args, stream);
  }
  void* function() const override { return fn_; }

  // Whether a failed launch may be for want of this module's context on the calling thread: no
  // context current, or another one (the function is not a handle there).
  bool wrong_context(CUresult rc) const {
    if (rc != CUDA_ERROR_INVALID_CONTEXT && rc != CUDA_ERROR_INVALID_HANDLE && rc != CUDA_ERROR_CONTEXT_IS_DESTROYED)
      return false;
    CUcontext current = nullptr;
    return api_->cuCtxGetCurrent(&current) != CUDA_SUCCESS || current != ctx_;
  }

  // A launch with attributes (cluster dimensions, programmatic dependent launch) through
  // cuLaunchKernelEx; its configuration and attributes live on the stack.
  Result<void> launch_ex(const LaunchGeometry& g, void** args, Stream stream) const {
    if (!api_->cuLaunchKernelEx)  // only a cluster launch comes here without it
      return cuda_missing_symbol(*api_, "cuLaunchKernelEx", "a launch with thread-block clusters");
    CUlaunchAttribute attrs[2] = {};
    unsigned n = 0;
    if (g.cluster.x != 1 || g.cluster.y != 1 || g.cluster.z != 1) {
      attrs[n].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
      attrs[n].value.clusterDim.x = g.cluster.x;
      attrs[n].value.clusterDim.y = g.cluster.y;
      attrs[n].value.clusterDim.z = g.cluster.z;
      ++n;
    }
    if (g.programmatic_dependent_launch) {
      attrs[n].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
      attrs[n].value.programmaticStreamSerializationAllowed = 1;
      ++n;
    }
    CUlaunchConfig config = {};
    config.gridDimX = g.grid.x;
    config.gridDimY = g.grid.y;
    config.gridDimZ = g.grid.z;
    config.blockDimX = g.block.x;
    config.blockDimY = g.block.y;
    config.blockDimZ = g.block.z;
    config.sharedMemBytes = g.dynamic_shared_bytes;
    config.hStream = static_cast<CUstream>(stream);
    config.attrs = attrs;
    config.numAttrs = n;
    KILN_CU(*api_, cuLaunchKernelEx(&config, fn_, args, nullptr));
    return ok();
  }

  Result<void> encode_tensor_map(const TensorMapInfo& m, DType dtype, const void* address,
                                 TensorMapBytes& out) const override {
    static_assert(sizeof(CUtensorMap) == sizeof(TensorMapBytes));
    if (!api_->cuTensorMapEncodeTiled)
      return cuda_missing_symbol(*api_, "cuTensorMapEncodeTiled", "encoding this kernel's TMA tensor maps");
    // TMA's rules (cuTensorMapEncodeTiled): 16-byte aligned base, strides multiples of 16 bytes.
    const size_t elem = dtype_size(dtype);
    if (reinterpret_cast<uintptr_t>(address) % 16 != 0)
      return make_error(Errc::invalid_argument,
                        fmt::format("address {} is not 16-byte aligned; this kernel loads it with TMA, which "
                                    "needs a 16-byte aligned base (every device allocation is: pass a view that "
                                    "starts a multiple of 16 bytes into it)",
                                    address));
    // fp8 (1-byte) tensors are plain bytes to TMA.
    const CUtensorMapDataType type = dtype == DType::bf16  ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                     : dtype == DType::f16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                     : elem == 1           ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                                                           : CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
    const cuuint64_t dims[2] = {m.inner, m.outer};
    const cuuint64_t strides[1] = {m.inner * elem};
    const cuuint32_t box[2] = {m.box_inner, m.box_outer};
    const cuuint32_t element_strides[2] = {1, 1};
    auto* map = reinterpret_cast<CUtensorMap*>(out.bytes);
    KILN_CU(*api_, cuTensorMapEncodeTiled(map, type, 2, const_cast<void*>(address), dims, strides, box,
                                          element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                          CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
    return ok();
  }

 private:
  const CudaApi* api_;
  CUcontext ctx_;
  CUmodule module_;
  CUfunction fn_;
  mutable std::atomic<uint32_t> dynamic_limit_{0};
};

class CudaDevice final : public DeviceImpl {
 public:
  CudaDevice(const CudaApi* api, CUdevice dev, CUcontext ctx, std::string name, int sms, size_t l2_bytes,
             const TargetInfo* target)
      : api_(api), dev_(dev), ctx_(ctx), name_(std::move(name)), sms_(sms), l2_bytes_(l2_bytes), target_(target) {}
  ~CudaDevice() override { api_->cuDevicePrimaryCtxRelease(dev_); }

  std::string name() const override { return name_; }
  const TargetInfo& target() const override { return *target_; }
  int compute_units() const override { return sms_; }
  size_t cache_bytes() const override { return l2_bytes_; }

  std::optional<MemoryLimit> free_memory() override {
    size_t free_bytes = 0, total_bytes = 0;
    if (!api_->cuMemGetInfo || !bind() || api_->cuMemGetInfo(&free_bytes, &total_bytes) != CUDA_SUCCESS)
      return std::nullopt;
    return MemoryLimit{free_bytes, fmt::format("the free memory of {} ({} of {}, cuMemGetInfo)", name_,
                                               format_bytes(free_bytes), format_bytes(total_bytes))};
  }
  Result<void*> malloc(size_t bytes) override {
    KILN_TRY(bind());
    CUdeviceptr p = 0;
    KILN_CU(*api_, cuMemAlloc(&p, bytes));
    return reinterpret_cast<void*>(p);
  }
  Result<void> free(void* ptr) override {
    KILN_TRY(bind());
    KILN_CU(*api_, cuMemFree(reinterpret_cast<CUdeviceptr>(ptr)));
    return ok();
  }
  Result<void> copy_to_device(void* dst, const void* src, size_t bytes) override {
    KILN_TRY(bind());
    KILN_CU(*api_, cuMemcpyHtoD(reinterpret_cast<CUdeviceptr>(dst), src, bytes));
    return ok();
  }
  Result<void> copy_to_host(void* dst, const void* src, size_t bytes) override {
    KILN_TRY(bind());
    KILN_CU(*api_, cuMemcpyDtoH(dst, reinterpret_cast<CUdeviceptr>(src), bytes));
    return ok();
  }
  Result<void> memset(void* dst, uint8_t value, size_t bytes) override {
    KILN_TRY(bind());
    KILN_CU(*api_, cuMemsetD8(reinterpret_cast<CUdeviceptr>(dst), value, bytes));
    return ok();
  }
  Result<void> synchronize(Stream stream) override {
    KILN_TRY(bind());
    if (stream) {
      KILN_CU(*api_, cuStreamSynchronize(static_cast<CUstream>(stream)));
    } else {
      KILN_CU(*api_, cuCtxSynchronize());
    }
    return ok();
  }
  Result<float> time_ms(Stream stream, const std::function<Result<void>()>& body) override {
    KILN_TRY(bind());
    CUevent start = nullptr, stop = nullptr;
    KILN_CU(*api_, cuEventCreate(&start, CU_EVENT_DEFAULT));
    KILN_CU(*api_, cuEventCreate(&stop, CU_EVENT_DEFAULT));
    struct Guard {
      const CudaApi* api;
      CUevent a, b;
      ~Guard() {
        api->cuEventDestroy(a);
        api->cuEventDestroy(b);
      }
    } guard{api_, start, stop};
    KILN_CU(*api_, cuEventRecord(start, static_cast<CUstream>(stream)));
    KILN_TRY(body());
    KILN_CU(*api_, cuEventRecord(stop, static_cast<CUstream>(stream)));
    KILN_CU(*api_, cuEventSynchronize(stop));
    float ms = 0;
    KILN_CU(*api_, cuEventElapsedTime(&ms, start, stop));
    return ms;
  }

  Result<std::unique_ptr<KernelFunction>> load(const CodeObject& code, const std::string& kernel) override {
    KILN_TRY(bind());
    CUmodule module = nullptr;
    // The JIT log matters when the driver compiles PTX: keep it for the error message.
    char error_log[8192] = {0};
    CUjit_option opts[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
    void* vals[] = {error_log, reinterpret_cast<void*>(sizeof(error_log))};
    std::vector<uint8_t> data = code.bytes;
    if (code.format == "ptx") data.push_back(0);  // PTX is loaded as a NUL-terminated string
    CUresult rc = api_->cuModuleLoadDataEx(&module, data.data(), 2, opts, vals);
    if (rc != CUDA_SUCCESS) {
      Error e = cuda_error(*api_, rc, "cuModuleLoadDataEx", __FILE__, __LINE__);
      e.message += fmt::format(" loading a {} of {} bytes for kernel '{}' on {}", code.format, code.bytes.size(),
                               kernel, name_);
      if (error_log[0]) e.message += fmt::format("; JIT log:\n{}", error_log);
      return e;
    }
    CUfunction fn = nullptr;
    rc = api_->cuModuleGetFunction(&fn, module, kernel.c_str());
    if (rc != CUDA_SUCCESS) {
      api_->cuModuleUnload(module);
      return cuda_error(*api_, rc, ("cuModuleGetFunction(" + kernel + ")").c_str(), __FILE__, __LINE__);
    }
    return std::unique_ptr<KernelFunction>(new CudaModule(api_, ctx_, module, fn));
  }

 private:
  Result<void> bind() {
    KILN_CU(*api_, cuCtxSetCurrent(ctx_));
    return ok();
  }
  const CudaApi* api_;
  CUdevice dev_;
  CUcontext ctx_;
  std::string name_;
  int sms_;
  size_t l2_bytes_;  // CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE (50 MiB on an H100)
  const TargetInfo* target_;
};

}  // namespace

Result<std::unique_ptr<DeviceImpl>> open_cuda_device(int ordinal) {
  KILN_ASSIGN_OR_RETURN(const CudaApi* api, cuda_api());
  KILN_CU(*api, cuInit(0));
  int count = 0;
  KILN_CU(*api, cuDeviceGetCount(&count));
  if (ordinal < 0 || ordinal >= count)
    return make_error(Errc::driver_unavailable,
                      fmt::format("NVIDIA device {} does not exist ({} device(s) found)", ordinal, count));
  CUdevice dev = 0;
  KILN_CU(*api, cuDeviceGet(&dev, ordinal));
  char name[256] = {0};
  KILN_CU(*api, cuDeviceGetName(name, sizeof(name), dev));
  int major = 0, minor = 0, sms = 0;
  KILN_CU(*api, cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
  KILN_CU(*api, cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev));
  KILN_CU(*api, cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
  int l2 = 0;  // 0 (no flush before the tuner's launches) where the driver does not say
  if (api->cuDeviceGetAttribute(&l2, CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE, dev) != CUDA_SUCCESS || l2 < 0) l2 = 0;
  const std::string arch = fmt::format("sm_{}{}a", major, minor);
  auto target = find_target(arch);
  if (!target)
    return make_error(Errc::unsupported, fmt::format("{} is {} (compute capability {}.{}); Kiln has no "
                                                     "target for it yet (supported: sm_90a)",
                                                     name, arch, major, minor));
  CUcontext ctx = nullptr;
  KILN_CU(*api, cuDevicePrimaryCtxRetain(&ctx, dev));
  KILN_CU(*api, cuCtxSetCurrent(ctx));
  KILN_LOG_INFO("using {} ({}, {} SMs) through {}", name, arch, sms, api->path);
  return std::unique_ptr<DeviceImpl>(new CudaDevice(api, dev, ctx, name, sms, static_cast<size_t>(l2), *target));
}

}  // namespace kiln
