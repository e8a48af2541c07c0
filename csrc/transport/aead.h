#pragma once
// AES-256-GCM, the cipher of encrypted tcp links (PYCOLLECTIVE_DATA_ENCRYPT), from OpenSSL's
// libcrypto loaded at run time (dlopen, as NCCL is): a build needs no OpenSSL headers, and every
// CPython with its ssl module already ships the library. The EVP calls used here have the same
// ABI in OpenSSL 1.1 and 3.
#include <cstddef>
#include <cstdint>
#include <string>

namespace pycollective {

class Aes256Gcm {
 public:
  static constexpr size_t kKeyBytes = 32, kNonceBytes = 12, kTagBytes = 16;

  // Loads libcrypto on first use; throws InvalidArgument naming what was tried when it cannot.
  explicit Aes256Gcm(const std::string& key);
  ~Aes256Gcm();
  Aes256Gcm(const Aes256Gcm&) = delete;
  Aes256Gcm& operator=(const Aes256Gcm&) = delete;

  // out = ciphertext of `in` (same length; may alias `in`), tag = its 16-byte tag over `aad` too.
  void seal(const uint8_t nonce[kNonceBytes], const uint8_t* aad, size_t aadBytes,
            const uint8_t* in, size_t bytes, uint8_t* out, uint8_t tag[kTagBytes]);
  // Decrypts into `out` (may alias `in`); false when the tag does not match (tampered,
  // replayed, reordered, or another key): `out` must then be ignored.
  bool open(const uint8_t nonce[kNonceBytes], const uint8_t* aad, size_t aadBytes,
            const uint8_t* in, size_t bytes, uint8_t* out, const uint8_t tag[kTagBytes]);

  // Which library was loaded ("libcrypto.so.3 (OpenSSL 3.0.x)"), loading it if needed.
  static std::string describeLibrary();

 private:
  void* ctx_ = nullptr;  // EVP_CIPHER_CTX*
  std::string key_;
};

}  // namespace pycollective
