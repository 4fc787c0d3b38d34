// Internal side of kiln::Device: loading code objects and launching their kernels. It sees what it
// loads (compile/code_object.h, a leaf) and what it launches (templates/plan.h, the launch types),
// not the compilers nor the op contract.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "compile/code_object.h"
#include "kiln/device.h"
#include "kiln/dtype.h"
#include "support/memory.h"
#include "templates/plan.h"

namespace kiln {

/// The 128 bytes of a TMA tensor map (CUtensorMap), as a kernel argument passed by value.
struct alignas(64) TensorMapBytes {
  uint8_t bytes[128];
};

/// One kernel function of a code object loaded on a device: the function (CUfunction /
/// hipFunction_t) and the module that holds it (CUmodule / hipModule_t), loaded per entry point.
class KernelFunction {
 public:
  virtual ~KernelFunction() = default;
  /// Encodes the tensor map of a kernel argument for the tensor at `address` (NVIDIA only:
  /// cuTensorMapEncodeTiled; the error names the tensor's requirement that failed).
  virtual Result<void> encode_tensor_map(const TensorMapInfo& /*info*/, DType /*dtype*/, const void* /*address*/,
                                         TensorMapBytes& /*out*/) const {
    return make_error(Errc::unsupported, "TMA tensor maps exist only on NVIDIA GPUs (sm_90a)");
  }
  /// `args` is the kernel-parameter array of cuLaunchKernel / hipModuleLaunchKernel.
  virtual Result<void> launch(const LaunchGeometry& geometry, void** args, Stream stream) const = 0;
  /// The raw function handle (CUfunction / hipFunction_t), for benchmarks against the driver.
  virtual void* function() const = 0;
};

class DeviceImpl : public Device {
 public:
  virtual Result<std::unique_ptr<KernelFunction>> load(const CodeObject& code, const std::string& kernel) = 0;
  /// Device memory free now (cuMemGetInfo / hipMemGetInfo; the emulator's is the host's
  /// MemAvailable), to refuse a request that cannot fit before allocating it; nullopt when the
  /// driver cannot say.
  virtual std::optional<MemoryLimit> free_memory() { return std::nullopt; }
};

/// Opens NVIDIA device `ordinal` through libcuda (primary context). Errors name what is missing.
Result<std::unique_ptr<DeviceImpl>> open_cuda_device(int ordinal);
/// Opens AMD device `ordinal` through libamdhip64 (Errc::unsupported in builds without HIP headers).
Result<std::unique_ptr<DeviceImpl>> open_hip_device(int ordinal);
/// Opens an emulated AMD device of `target` ("gfx942", "gfx950") whose kernels run in tinygrad's
/// CDNA emulator in a Python child process (runtime/emulator/). Errors: invalid_argument (target),
/// driver_unavailable (no emulator, Python or clang: the message names the variable to set),
/// unsupported (a build without LLVM), timeout.
Result<std::unique_ptr<DeviceImpl>> open_emulator_device(std::string_view target);

}  // namespace kiln
