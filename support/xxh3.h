// XXH3-128 through libxxhash (Debian's libxxhash-dev; Collet's xxHash, https://xxhash.com).
// A checksum, not a cryptographic hash: it finds damage (a torn write, a flipped bit), which is
// what a cache entry's files need on every load, at tens of GB/s where SHA-256 runs at about 2.
// Nothing that must resist a chosen input (a key, a signed archive, a remote entry) uses it.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace kiln {
/// Lower-case hex of the canonical (big-endian) XXH3-128 of bytes: 32 characters.
std::string xxh3_128_hex(std::span<const uint8_t> bytes);
inline std::string xxh3_128_hex(std::string_view text) {
  return xxh3_128_hex(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
}
}  // namespace kiln
