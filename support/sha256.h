// SHA-256 through OpenSSL's EVP interface.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

namespace kiln {
/// Lower-case hex SHA-256 of bytes.
std::string sha256_hex(std::span<const uint8_t> bytes);
inline std::string sha256_hex(std::string_view text) {
  return sha256_hex(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
}

/// A SHA-256 in progress, for texts that share a prefix: hash the prefix once, then copy the state
/// for each text and add the rest (OpenSSL's EVP_MD_CTX_copy_ex). prefix.hex_of(rest) is
/// sha256_hex(prefix_text + rest), byte for byte. Copying, hex_of and the const members are safe
/// from many threads at once; update() is not.
class Sha256 {
 public:
  Sha256();
  Sha256(const Sha256& other);
  Sha256& operator=(const Sha256&) = delete;
  ~Sha256();
  void update(std::string_view text);
  /// The hex digest of everything added so far and then `rest`; this state is left as it was.
  std::string hex_of(std::string_view rest = {}) const;

 private:
  struct Ctx;
  std::unique_ptr<Ctx> ctx_;
};
}  // namespace kiln
