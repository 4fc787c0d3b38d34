#include "support/signature.h"

#include <fmt/format.h>
#include <openssl/evp.h>
#include <openssl/pem.h>

#include <memory>

#include "support/fs.h"

namespace kiln {
namespace {

struct PkeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct MdCtxFree {
  void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};
using Pkey = std::unique_ptr<EVP_PKEY, PkeyFree>;

std::string to_hex(const unsigned char* p, size_t n) {
  static const char* hex = "0123456789abcdef";
  std::string out(2 * n, '0');
  for (size_t i = 0; i < n; ++i) {
    out[2 * i] = hex[p[i] >> 4];
    out[2 * i + 1] = hex[p[i] & 15];
  }
  return out;
}

bool from_hex(const std::string& s, std::vector<unsigned char>& out) {
  if (s.size() % 2) return false;
  out.clear();
  for (size_t i = 0; i < s.size(); i += 2) {
    auto nib = [](char c) -> int {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'a' && c <= 'f') return c - 'a' + 10;
      return -1;
    };
    const int hi = nib(s[i]), lo = nib(s[i + 1]);
    if (hi < 0 || lo < 0) return false;
    out.push_back(static_cast<unsigned char>(hi * 16 + lo));
  }
  return true;
}

/// A PEM key file: private when `want_private`, else public (a private key gives its public half).
Result<Pkey> read_key(const std::string& path, bool want_private) {
  KILN_ASSIGN_OR_RETURN(std::string pem, read_file(path, 64 << 10));
  std::unique_ptr<BIO, BioFree> bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  Pkey key(want_private ? PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr) : nullptr);
  if (!key && !want_private) {
    key.reset(PEM_read_bio_PUBKEY(bio.get(), nullptr, nullptr, nullptr));
    if (!key) {
      std::unique_ptr<BIO, BioFree> again(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
      key.reset(PEM_read_bio_PrivateKey(again.get(), nullptr, nullptr, nullptr));
    }
  }
  if (!key || EVP_PKEY_get_base_id(key.get()) != EVP_PKEY_ED25519)
    return make_error(Errc::invalid_argument,
                      fmt::format("'{}' is not an Ed25519 {} key in PEM (make one with 'openssl genpkey -algorithm "
                                  "ed25519 -out KEY.pem'{})",
                                  path, want_private ? "private" : "public",
                                  want_private ? "" : " and 'openssl pkey -in KEY.pem -pubout -out PUB.pem'"));
  return key;
}

std::string raw_public_hex(EVP_PKEY* key) {
  unsigned char raw[64];
  size_t len = sizeof raw;
  if (EVP_PKEY_get_raw_public_key(key, raw, &len) != 1) return {};
  return to_hex(raw, len);
}

}  // namespace

Result<Signature> sign_ed25519(const std::string& key_path, std::string_view message) {
  KILN_ASSIGN_OR_RETURN(Pkey key, read_key(key_path, /*want_private=*/true));
  std::unique_ptr<EVP_MD_CTX, MdCtxFree> ctx(EVP_MD_CTX_new());
  unsigned char sig[64];
  size_t len = sizeof sig;
  if (!ctx || EVP_DigestSignInit(ctx.get(), nullptr, nullptr, nullptr, key.get()) != 1 ||
      EVP_DigestSign(ctx.get(), sig, &len, reinterpret_cast<const unsigned char*>(message.data()), message.size()) != 1)
    return make_error(Errc::invalid_argument, fmt::format("cannot sign with '{}' (OpenSSL error)", key_path));
  return Signature{raw_public_hex(key.get()), to_hex(sig, len)};
}

Result<std::vector<TrustedKey>> load_trusted_keys(const std::string& list) {
  std::vector<TrustedKey> keys;
  for (size_t pos = 0, next; pos <= list.size(); pos = next + 1) {
    next = list.find(':', pos);
    if (next == std::string::npos) next = list.size();
    const std::string path = list.substr(pos, next - pos);
    if (path.empty()) continue;
    auto key = read_key(path, /*want_private=*/false);
    if (!key) return make_error(key.error().code, "KILN_TRUSTED_KEYS: " + key.error().message);
    keys.push_back({raw_public_hex(key->get()), path});
  }
  if (keys.empty())
    return make_error(Errc::invalid_argument, "KILN_TRUSTED_KEYS is set but names no key file; give ':'-separated PEM "
                                              "files of Ed25519 public keys, or unset it");
  return keys;
}

bool verify_ed25519(const std::vector<TrustedKey>& keys, std::string_view message, const Signature& sig) {
  std::vector<unsigned char> pub, raw_sig;
  if (!from_hex(sig.public_hex, pub) || pub.size() != 32 || !from_hex(sig.signature_hex, raw_sig) || raw_sig.size() != 64)
    return false;
  bool trusted = false;
  for (const TrustedKey& k : keys) trusted = trusted || k.public_hex == sig.public_hex;
  if (!trusted) return false;
  Pkey key(EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, nullptr, pub.data(), pub.size()));
  std::unique_ptr<EVP_MD_CTX, MdCtxFree> ctx(EVP_MD_CTX_new());
  return key && ctx && EVP_DigestVerifyInit(ctx.get(), nullptr, nullptr, nullptr, key.get()) == 1 &&
         EVP_DigestVerify(ctx.get(), raw_sig.data(), raw_sig.size(), reinterpret_cast<const unsigned char*>(message.data()),
                          message.size()) == 1;
}

}  // namespace kiln
