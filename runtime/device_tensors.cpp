#include "runtime/device_tensors.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <new>
#include <stdexcept>

#include "runtime/device_impl.h"
#include "support/memory.h"
#include "support/parallel.h"

namespace kiln {

std::vector<uint8_t> encode_values(std::span<const float> values, DType t) {
  const size_t size = dtype_size(t);
  std::vector<uint8_t> out(values.size() * size);
  // GPU-sized inputs are billions of elements: every core encodes its own range.
  parallel_for(values.size(), size_t{1} << 18, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
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
        case DType::e8m0: *p = float_to_e8m0_bits(values[i]); break;
        default: *p = float_to_fp8_bits(values[i], t); break;
      }
    }
  });
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
    case DType::e8m0: return e8m0_bits_to_float(*p);
    default: return fp8_bits_to_float(*p, t);
  }
}

// 0xFF is NaN in the OCP fp8 formats (e4m3: S.1111.111, e5m2: a NaN) and in e8m0.
uint8_t poison_byte(DType t) { return t == DType::e4m3fnuz || t == DType::e5m2fnuz ? 0x80 : 0xff; }

namespace {

// Elements and bytes in double: hostile sizes overflow 64-bit products.
double elements_of(const TensorInfo& t) {
  double n = 1;
  for (int64_t d : t.shape) n *= static_cast<double>(d);
  return n;
}

std::string bytes_text(double bytes) {
  return bytes >= 1.8e19 ? fmt::format("{:.3g} bytes", bytes) : format_bytes(static_cast<uint64_t>(bytes));
}

// Refuses a spec whose tensors cannot fit the device's free memory or whose host copies cannot fit
// what this process may still allocate, before anything is allocated.
Result<void> check_memory(Device& device, const KernelSpec& spec, const std::vector<TensorInfo>& tensors,
                          double extra_host_bytes, std::string_view extra_host_what) {
  double device_bytes = 0, host_inputs = 0, largest_input = 0;
  std::vector<std::string> parts;
  for (const TensorInfo& t : tensors) {
    const double bytes = elements_of(t) * static_cast<double>(dtype_size(t.dtype));
    device_bytes += std::max(bytes, 256.0);
    parts.push_back(fmt::format("{} {}", t.name, bytes_text(bytes)));
    if (!t.output) {
      host_inputs += elements_of(t) * 4;
      largest_input = std::max(largest_input, bytes);
    }
  }
  const std::string what = to_string(spec);
  if (auto* impl = dynamic_cast<DeviceImpl*>(&device)) {
    if (auto free = impl->free_memory(); free && device_bytes > static_cast<double>(free->bytes))
      return make_error(Errc::invalid_argument,
                        fmt::format("{}: its tensors need {} of device memory ({}), more than {}; give smaller sizes",
                                    what, bytes_text(device_bytes), fmt::join(parts, ", "), free->source));
  }
  const double host_bytes = host_inputs + largest_input + extra_host_bytes;
  if (auto limit = host_memory_limit(); limit && host_bytes > static_cast<double>(limit->bytes)) {
    std::string how = fmt::format("the inputs as fp32 for the CPU reference {}, one input's {} copy {}",
                                  bytes_text(host_inputs), "dtype", bytes_text(largest_input));
    if (extra_host_bytes > 0) how += fmt::format(", {} {}", extra_host_what, bytes_text(extra_host_bytes));
    return make_error(Errc::invalid_argument,
                      fmt::format("{}: running it needs {} of host memory ({}), more than this process may still "
                                  "take: {}; give smaller sizes",
                                  what, bytes_text(host_bytes), how, limit->source));
  }
  return ok();
}

}  // namespace

Result<void> DeviceTensors::ensure_fits(Device& device, const OpTemplate& op, const KernelSpec& spec,
                                       double extra_host_bytes, std::string_view extra_host_what) {
  try {
    return check_memory(device, spec, op.tensors(spec), extra_host_bytes, extra_host_what);
  } catch (const std::bad_alloc&) {
    return make_error(Errc::invalid_argument, fmt::format("{}: out of host memory; give smaller sizes", to_string(spec)));
  }
}

Result<DeviceTensors> DeviceTensors::make(Device& device, const OpTemplate& op, const KernelSpec& spec,
                                          std::mt19937_64& rng, double extra_host_bytes,
                                          std::string_view extra_host_what, const Scalars& scalars) {
  // Sizes come from users: estimate before allocating, and turn a failed host allocation into an
  // error (no exception leaves the library).
  try {
    std::vector<TensorInfo> tensors = op.tensors(spec);
    KILN_TRY(check_memory(device, spec, tensors, extra_host_bytes, extra_host_what));
    return make_checked(device, op, spec, rng, std::move(tensors), scalars);
  } catch (const std::bad_alloc&) {
    return make_error(Errc::invalid_argument,
                      fmt::format("{}: out of host memory while making its inputs; give smaller sizes", to_string(spec)));
  } catch (const std::length_error&) {
    return make_error(Errc::invalid_argument,
                      fmt::format("{}: its tensors are too large for this host; give smaller sizes", to_string(spec)));
  }
}

Result<DeviceTensors> DeviceTensors::make_checked(Device& device, const OpTemplate& op, const KernelSpec& spec,
                                                  std::mt19937_64& rng, std::vector<TensorInfo> tensors,
                                                  const Scalars& scalars) {
  DeviceTensors d;
  d.tensors_ = std::move(tensors);
  std::vector<TensorInfo> inputs;
  for (const TensorInfo& t : d.tensors_)
    if (!t.output) inputs.push_back(t);
  op.init_inputs_with_scalars(op.with_defaults(spec), scalars, inputs, d.inputs_, rng);
  size_t next_input = 0;
  for (const TensorInfo& t : d.tensors_) {
    const size_t bytes = t.bytes();
    d.bytes_ += static_cast<double>(bytes);
    if (t.output && t.overwrites >= 0) {
      // Written in place over an input: its buffer, holding the input, is the output's. There
      // is no poison to put there, but the output's reference differs from the input, so an
      // element left unwritten still fails the comparison.
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
