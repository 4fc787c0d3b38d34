// SHA-256 through OpenSSL's EVP interface.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace kiln {
/// Lower-case hex SHA-256 of bytes.
std::string sha256_hex(std::span<const uint8_t> bytes);
inline std::string sha256_hex(std::string_view text) {
  return sha256_hex(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
}
}  // namespace kiln
