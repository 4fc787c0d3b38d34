// The tensors of one kernel spec on a device, with fresh inputs: what `kiln run`, the GPU tests
// (check_on_device) and the autotuner (Runtime::tune) launch kernels on.
#pragma once

#include <memory>
#include <random>
#include <span>
#include <vector>

#include "kiln/device.h"
#include "templates/op_template.h"

namespace kiln {

class DeviceTensors {
 public:
  /// Allocates op.tensors(spec) on `device`. Inputs get uniform random values in [-1, 1], never
  /// zero, rounded to their dtype (gemm's B scaled by 1/sqrt(K), so that outputs stay O(1) for
  /// any K); outputs are poisoned with 0xff bytes (NaN in fp32, fp16 and bf16).
  /// Errors: Errc::driver_error (out of memory, a failed copy).
  static Result<DeviceTensors> make(Device& device, const OpTemplate& op, const KernelSpec& spec, std::mt19937_64& rng);

  /// Device pointers in the op's tensor order: the `buffers` of Kernel::launch.
  std::span<void* const> pointers() const { return ptrs_; }
  /// The tensors, in the same order.
  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  /// Host copies of the input values (dtype-rounded), in order: the CPU reference's inputs.
  const std::vector<std::vector<float>>& inputs() const { return inputs_; }
  /// Bytes of all tensors (what one launch reads and writes).
  double bytes() const { return bytes_; }

 private:
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
