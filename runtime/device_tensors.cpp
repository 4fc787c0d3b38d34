#include "runtime/device_tensors.h"

#include <cmath>
#include <cstring>

namespace kiln {

std::vector<uint8_t> encode_values(std::span<const float> values, DType t) {
  const size_t size = dtype_size(t);
  std::vector<uint8_t> out(values.size() * size);
  for (size_t i = 0; i < values.size(); ++i) {
    uint8_t* p = &out[i * size];
    switch (t) {
      case DType::f32: std::memcpy(p, &values[i], 4); break;
      case DType::bf16: {
        const uint16_t h = float_to_bf16_bits(values[i]);
        std::memcpy(p, &h, 2);
        break;
      }
      case DType::f16: {
        const uint16_t h = float_to_f16_bits(values[i]);
        std::memcpy(p, &h, 2);
        break;
      }
      case DType::i32: {
        const int32_t v = static_cast<int32_t>(std::nearbyint(values[i]));
        std::memcpy(p, &v, 4);
        break;
      }
      case DType::i64: {
        const int64_t v = static_cast<int64_t>(std::nearbyint(values[i]));
        std::memcpy(p, &v, 8);
        break;
      }
      default: *p = float_to_fp8_bits(values[i], t); break;
    }
  }
  return out;
}

double decode_value(const uint8_t* data, size_t i, DType t) {
  const uint8_t* p = data + i * dtype_size(t);
  switch (t) {
    case DType::f32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case DType::bf16:
    case DType::f16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return t == DType::bf16 ? bf16_bits_to_float(h) : f16_bits_to_float(h);
    }
    case DType::i32: {
      int32_t v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case DType::i64: {
      int64_t v;
      std::memcpy(&v, p, 8);
      return static_cast<double>(v);
    }
    default: return fp8_bits_to_float(*p, t);
  }
}

uint8_t poison_byte(DType t) { return t == DType::e4m3fnuz || t == DType::e5m2fnuz ? 0x80 : 0xff; }

Result<DeviceTensors> DeviceTensors::make(Device& device, const OpTemplate& op, const KernelSpec& spec,
                                          std::mt19937_64& rng) {
  DeviceTensors d;
  d.tensors_ = op.tensors(spec);
  std::vector<TensorInfo> inputs;
  for (const TensorInfo& t : d.tensors_)
    if (!t.output) inputs.push_back(t);
  op.init_inputs(op.with_defaults(spec), inputs, d.inputs_, rng);
  size_t next_input = 0;
  for (const TensorInfo& t : d.tensors_) {
    const size_t bytes = t.bytes();
    d.bytes_ += static_cast<double>(bytes);
    if (t.overwrites >= 0) {  // in place: the input's buffer, holding the input
      d.ptrs_.push_back(d.ptrs_[static_cast<size_t>(t.overwrites)]);
      continue;
    }
    // At least one allocation unit, so that empty tensors (0 rows) still have a valid address.
    KILN_ASSIGN_OR_RETURN(void* ptr, device.malloc(std::max<size_t>(bytes, 256)));
    d.owned_.emplace_back(ptr, Free{&device});
    d.ptrs_.push_back(ptr);
    if (bytes == 0) {
      if (!t.output) ++next_input;
      continue;
    }
    if (t.output) {
      KILN_TRY(device.memset(ptr, poison_byte(t.dtype), bytes));
      continue;
    }
    const auto encoded = encode_values(d.inputs_[next_input++], t.dtype);
    KILN_TRY(device.copy_to_device(ptr, encoded.data(), encoded.size()));
  }
  return d;
}

}  // namespace kiln
