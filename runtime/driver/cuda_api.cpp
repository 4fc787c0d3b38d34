#include "runtime/driver/cuda_api.h"

#include <fmt/format.h>

#include "support/env.h"

namespace kiln {

Result<const CudaApi*> cuda_api() {
  static const Result<const CudaApi*> loaded = []() -> Result<const CudaApi*> {
    KILN_ASSIGN_OR_RETURN(auto lib, DynLib::open("libcuda (the NVIDIA driver)", env().cuda_lib,
                                                 {"libcuda.so.1", "libcuda.so",
                                                  "/usr/lib/x86_64-linux-gnu/libcuda.so.1"}));
    auto* api = new CudaApi();  // lives for the process: the driver must outlive every module
    std::string missing;
    KILN_CUDA_SYMBOLS(KILN_LOAD_SYMBOL)
    if (!missing.empty())
      return make_error(Errc::driver_unavailable,
                        fmt::format("{} lacks {}: the driver is too old", lib->path(), missing));
    api->path = lib->path();
    lib.release();  // keep the library mapped for the life of the process
    return static_cast<const CudaApi*>(api);
  }();
  return loaded;
}

Error cuda_error(const CudaApi& api, CUresult rc, const char* call, const char* file, int line) {
  const char* name = nullptr;
  const char* text = nullptr;
  api.cuGetErrorName(rc, &name);
  api.cuGetErrorString(rc, &text);
  return make_error(Errc::driver_error,
                    fmt::format("{} failed: {} ({}: {}) at {}:{}", call, static_cast<int>(rc),
                                name ? name : "?", text ? text : "?", file, line));
}

}  // namespace kiln
