#include "support/xxh3.h"

#include <xxhash.h>

namespace kiln {
std::string xxh3_128_hex(std::span<const uint8_t> bytes) {
  XXH128_canonical_t canonical;
  XXH128_canonicalFromHash(&canonical, XXH3_128bits(bytes.data(), bytes.size()));
  static const char* hex = "0123456789abcdef";
  std::string out(2 * sizeof(canonical.digest), '0');
  for (size_t i = 0; i < sizeof(canonical.digest); ++i) {
    out[2 * i] = hex[canonical.digest[i] >> 4];
    out[2 * i + 1] = hex[canonical.digest[i] & 15];
  }
  return out;
}
}  // namespace kiln
