// The tensors of one kernel spec on a device, with fresh inputs: what `kiln run`, the GPU and
// emulator tests (check_on_device) and the autotuner (Runtime::tune) launch kernels on.
#pragma once

#include <memory>
#include <random>
#include <span>
#include <string_view>
#include <vector>

#include "kiln/device.h"
#include "templates/op_template.h"

namespace kiln {

/// Encodes float values as `t` elements (round to nearest even; fp8 saturating; integers
/// rounded), little-endian, dtype_size(t) bytes each.
std::vector<uint8_t> encode_values(std::span<const float> values, DType t);
/// Decodes element `i` of a buffer of `t` elements as a double.
double decode_value(const uint8_t* data, size_t i, DType t);
/// The byte that marks an element as unwritten: every bit set (NaN in fp32, fp16, bf16, e4m3 and
/// e5m2; -1 in integers), 0x80 in the FNUZ formats (their NaN).
uint8_t poison_byte(DType t);

class DeviceTensors {
 public:
  /// Allocates op.tensors(spec) on `device`; inputs from op.init_inputs (fresh random values,
  /// never zero, rounded to their dtype); outputs poisoned with poison_byte (NaN for floats),
  /// except an output written in place over an input (TensorInfo::overwrites), which shares the
  /// input's buffer and pointer.
  /// Before allocating anything it estimates the device memory (the tensors) and the host memory
  /// (the inputs as fp32 for the CPU reference, one input's dtype copy, plus `extra_host_bytes`
  /// that the caller will need, described by `extra_host_what`) and refuses a spec that cannot fit:
  /// the device's free memory where the driver tells it (cuMemGetInfo, hipMemGetInfo), and
  /// host_memory_limit() (MemAvailable, RLIMIT_AS, RLIMIT_DATA).
  /// `scalars`: the runtime scalars that the launches will take, for the inputs derived with them
  /// (OpTestHooks::init_inputs_with_scalars); empty: the defaults.
  /// Errors: Errc::invalid_argument (does not fit: the message gives the figures and the limit;
  /// or host allocation failed), Errc::driver_error (out of device memory, a failed copy).
  static Result<DeviceTensors> make(Device& device, const OpTemplate& op, const KernelSpec& spec, std::mt19937_64& rng,
                                    double extra_host_bytes = 0, std::string_view extra_host_what = {},
                                    const Scalars& scalars = {});
  /// The estimate of make() alone, for callers that refuse a spec before compiling it.
  static Result<void> ensure_fits(Device& device, const OpTemplate& op, const KernelSpec& spec,
                                 double extra_host_bytes = 0, std::string_view extra_host_what = {});

  /// Device pointers in the op's tensor order: the `buffers` of Kernel::launch.
  std::span<void* const> pointers() const { return ptrs_; }
  /// The tensors, in the same order.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  /// Host copies of the input values (dtype-rounded), in order: the CPU reference's inputs.
  const std::vector<std::vector<float>>& inputs() const { return inputs_; }
  /// Bytes of all tensors (what one launch reads and writes).
  double bytes() const { return bytes_; }

 private:
  static Result<DeviceTensors> make_checked(Device& device, const OpTemplate& op, const KernelSpec& spec,
                                            std::mt19937_64& rng, std::vector<TensorInfo> tensors,
                                            const Scalars& scalars);
  struct Free {
    Device* device;
    void operator()(void* p) const { (void)device->free(p); }
  };
  std::vector<std::unique_ptr<void, Free>> owned_;
  std::vector<void*> ptrs_;
  std::vector<TensorInfo> tensors_;
  std::vector<std::vector<float>> inputs_;
  double bytes_ = 0;
};

}  // namespace kiln
