#include "runtime/device_tensors.h"

#include <cmath>
#include <cstring>

namespace kiln {
namespace {

std::vector<uint8_t> encode(const std::vector<float>& values, DType t) {
  std::vector<uint8_t> out(values.size() * dtype_size(t));
  for (size_t i = 0; i < values.size(); ++i) {
    if (t == DType::f32) {
      std::memcpy(&out[i * 4], &values[i], 4);
    } else {
      const uint16_t h = t == DType::bf16 ? float_to_bf16_bits(values[i]) : float_to_f16_bits(values[i]);
      std::memcpy(&out[i * 2], &h, 2);
    }
  }
  return out;
}

}  // namespace

Result<DeviceTensors> DeviceTensors::make(Device& device, const OpTemplate& op, const KernelSpec& spec,
                                          std::mt19937_64& rng) {
  DeviceTensors d;
  d.tensors_ = op.tensors(spec);
  for (const TensorInfo& t : d.tensors_) {
    const size_t bytes = static_cast<size_t>(t.elements()) * dtype_size(t.dtype);
    d.bytes_ += static_cast<double>(bytes);
    KILN_ASSIGN_OR_RETURN(void* ptr, device.malloc(bytes));
    d.owned_.emplace_back(ptr, Free{&device});
    d.ptrs_.push_back(ptr);
    if (t.output) {
      KILN_TRY(device.memset(ptr, 0xff, bytes));
      continue;
    }
    // Rounded to the tensor's dtype so the reference sees exactly what the GPU sees.
    const double scale = (op.name() == "gemm" && t.name == "B") ? 1.0 / std::sqrt(double(spec.param("K"))) : 1.0;
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::vector<float> values(static_cast<size_t>(t.elements()));
    for (float& v : values) {
      do v = round_to_dtype(static_cast<float>(dist(rng) * scale), t.dtype);
      while (v == 0.0f);
    }
    const auto encoded = encode(values, t.dtype);
    KILN_TRY(device.copy_to_device(ptr, encoded.data(), encoded.size()));
    d.inputs_.push_back(std::move(values));
  }
  return d;
}

}  // namespace kiln
