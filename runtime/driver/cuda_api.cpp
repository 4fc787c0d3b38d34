#include "runtime/driver/cuda_api.h"

#include <fmt/format.h>

#include "support/env.h"

namespace kiln {

Result<const CudaApi*> cuda_api() {
  static const Result<const CudaApi*> loaded = []() -> Result<const CudaApi*> {
    KILN_ASSIGN_OR_RETURN(auto api, load_library<CudaApi>(
                                        {"libcuda (the NVIDIA driver)",
                                         env().cuda_lib,
                                         {"libcuda.so.1", "libcuda.so", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"},
                                         "the driver is too old for Kiln: install a current NVIDIA driver"}));
    if (api->cuDriverGetVersion(&api->driver_version) != CUDA_SUCCESS) api->driver_version = 0;
    return api.release();  // lives for the process: the driver must outlive every module
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

std::string cuda_version_string(int version) {
  if (version <= 0) return "an unknown CUDA version";
  return fmt::format("CUDA {}.{}", version / 1000, version % 1000 / 10);
}

Error cuda_missing_symbol(const CudaApi& api, const char* symbol, const char* use) {
  return make_error(Errc::unsupported,
                    fmt::format("{} needs {}, which the NVIDIA driver at {} ({}) lacks: {} needs CUDA 12.0 or "
                                "newer (driver R525+); update the NVIDIA driver, or point KILN_CUDA_LIB at a newer libcuda",
                                use, symbol, api.path, cuda_version_string(api.driver_version), symbol));
}

}  // namespace kiln
