// Ed25519 signatures through OpenSSL, for cache archives (`kiln cache export --sign KEYFILE`, and
// KILN_TRUSTED_KEYS on import). Keys are PEM files as `openssl genpkey -algorithm ed25519` and
// `openssl pkey -pubout` write them.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "kiln/result.h"

namespace kiln {

/// A public key: its raw 32 bytes, as hex, and the file it came from (for messages).
struct TrustedKey {
  std::string public_hex;
  std::string source;
};

struct Signature {
  std::string public_hex;     ///< The signer's public key (raw 32 bytes, hex).
  std::string signature_hex;  ///< 64 bytes, hex.
};

/// Signs `message` with the Ed25519 private key in the PEM file `key_path`.
/// Errors: Errc::io_error (unreadable), invalid_argument (not an Ed25519 private key).
Result<Signature> sign_ed25519(const std::string& key_path, std::string_view message);

/// The public keys of KILN_TRUSTED_KEYS: ':'-separated PEM files, each holding one Ed25519 public
/// (or private) key. Errors: Errc::io_error, invalid_argument, naming the file.
Result<std::vector<TrustedKey>> load_trusted_keys(const std::string& list);

/// Whether `sig` is a valid signature of `message` by one of `keys` (its public key must be one of
/// them: a signature by an untrusted key is no signature).
bool verify_ed25519(const std::vector<TrustedKey>& keys, std::string_view message, const Signature& sig);

}  // namespace kiln
