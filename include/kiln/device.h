// A GPU as Kiln drives it: memory, streams, timing and module launches, behind the CUDA driver API
// (libcuda) or the HIP runtime (libamdhip64), both dlopen'd.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

#include "kiln/result.h"
#include "kiln/target.h"

namespace kiln {

/// A stream handle: a CUstream on NVIDIA, a hipStream_t on AMD; nullptr is the default stream.
using Stream = void*;

class Device {
 public:
  virtual ~Device() = default;
  /// Marketing name ("NVIDIA H100 80GB HBM3").
  virtual std::string name() const = 0;
  /// The code-generation target of this device ("sm_90a", "gfx942").
  virtual const TargetInfo& target() const = 0;
  /// Multiprocessors (NVIDIA SMs, AMD CUs).
  virtual int compute_units() const = 0;
  /// Bytes of cache that can still hold a launch's inputs from the launch before it: an NVIDIA
  /// GPU's L2 (CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE); an AMD GPU's L2 and its 256 MiB Infinity
  /// Cache; 0 when unknown. Timing that wants no input cached (Runtime::tune, `kiln run --bench`)
  /// writes twice this much before each timed launch.
  virtual size_t cache_bytes() const { return 0; }

  /// Device memory, in bytes. Errors: Errc::driver_error (out of memory, ...).
  virtual Result<void*> malloc(size_t bytes) = 0;
  virtual Result<void> free(void* ptr) = 0;
  virtual Result<void> copy_to_device(void* dst, const void* src, size_t bytes) = 0;
  virtual Result<void> copy_to_host(void* dst, const void* src, size_t bytes) = 0;
  /// Fills `bytes` bytes with `value` (e.g. 0xff makes every fp16/bf16/fp32 element a NaN).
  virtual Result<void> memset(void* dst, uint8_t value, size_t bytes) = 0;
  virtual Result<void> synchronize(Stream stream = nullptr) = 0;
  /// Milliseconds of device time `body` enqueues on `stream`, measured with device events.
  virtual Result<float> time_ms(Stream stream, const std::function<Result<void>()>& body) = 0;
};

}  // namespace kiln
