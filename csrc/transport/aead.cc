#include "transport/aead.h"

#include <mutex>

#include "core/dynlib.h"
#include "core/error.h"

namespace pycollective {

namespace {

// The EVP entry points, resolved once per process.
struct Crypto {
  void* (*ctxNew)();
  void (*ctxFree)(void*);
  const void* (*aes256gcm)();
  int (*encryptInit)(void*, const void*, void*, const unsigned char*, const unsigned char*);
  int (*encryptUpdate)(void*, unsigned char*, int*, const unsigned char*, int);
  int (*encryptFinal)(void*, unsigned char*, int*);
  int (*decryptInit)(void*, const void*, void*, const unsigned char*, const unsigned char*);
  int (*decryptUpdate)(void*, unsigned char*, int*, const unsigned char*, int);
  int (*decryptFinal)(void*, unsigned char*, int*);
  int (*ctxCtrl)(void*, int, int, void*);
  const char* (*version)(int);
  DynamicLibrary library;
};

// From openssl/evp.h (stable since 1.1).
constexpr int kCtrlGcmSetTag = 0x11, kCtrlGcmGetTag = 0x10;
constexpr int kOpensslVersion = 0;

template <typename Fn>
void resolve(const DynamicLibrary& lib, const char* name, Fn* slot, std::string* missing) {
  std::string error;
  void* sym = lib.symbol(name, &error);
  if (sym == nullptr) *missing += (missing->empty() ? "" : ", ") + std::string(name);
  *slot = reinterpret_cast<Fn>(sym);
}

const Crypto& crypto() {
  static std::once_flag once;
  static Crypto* loaded = nullptr;
  static std::string failure;
  std::call_once(once, [] {
    std::string tried;
    for (const char* name : {"libcrypto.so.3", "libcrypto.so.1.1", "libcrypto.so"}) {
      std::string error;
      DynamicLibrary lib = DynamicLibrary::open(name, &error);
      if (!lib.loaded()) {
        tried += std::string(tried.empty() ? "" : "; ") + error;
        continue;
      }
      auto* c = new Crypto();
      std::string missing;
      resolve(lib, "EVP_CIPHER_CTX_new", &c->ctxNew, &missing);
      resolve(lib, "EVP_CIPHER_CTX_free", &c->ctxFree, &missing);
      resolve(lib, "EVP_aes_256_gcm", &c->aes256gcm, &missing);
      resolve(lib, "EVP_EncryptInit_ex", &c->encryptInit, &missing);
      resolve(lib, "EVP_EncryptUpdate", &c->encryptUpdate, &missing);
      resolve(lib, "EVP_EncryptFinal_ex", &c->encryptFinal, &missing);
      resolve(lib, "EVP_DecryptInit_ex", &c->decryptInit, &missing);
      resolve(lib, "EVP_DecryptUpdate", &c->decryptUpdate, &missing);
      resolve(lib, "EVP_DecryptFinal_ex", &c->decryptFinal, &missing);
      resolve(lib, "EVP_CIPHER_CTX_ctrl", &c->ctxCtrl, &missing);
      resolve(lib, "OpenSSL_version", &c->version, &missing);
      if (!missing.empty()) {
        tried += std::string(tried.empty() ? "" : "; ") + name + " lacks " + missing;
        delete c;
        continue;
      }
      c->library = std::move(lib);
      loaded = c;  // kept for the life of the process
      return;
    }
    failure = tried;
  });
  if (loaded == nullptr)
    throw InvalidArgument(
        "encrypted data links (PYCOLLECTIVE_DATA_ENCRYPT=1) need OpenSSL's libcrypto (1.1 or 3), "
        "which could not be loaded: " +
        failure + ". Install it (Debian/Ubuntu: libssl3) or unset PYCOLLECTIVE_DATA_ENCRYPT.");
  return *loaded;
}

}  // namespace

Aes256Gcm::Aes256Gcm(const std::string& key) : key_(key) {
  PC_CHECK(key.size() == kKeyBytes, "an AES-256-GCM key has 32 bytes, not ", key.size());
  ctx_ = crypto().ctxNew();
  PC_CHECK(ctx_ != nullptr, "EVP_CIPHER_CTX_new failed (out of memory?)");
}

Aes256Gcm::~Aes256Gcm() {
  if (ctx_ != nullptr) crypto().ctxFree(ctx_);
}

void Aes256Gcm::seal(const uint8_t nonce[kNonceBytes], const uint8_t* aad, size_t aadBytes,
                     const uint8_t* in, size_t bytes, uint8_t* out, uint8_t tag[kTagBytes]) {
  const Crypto& c = crypto();
  const auto* key = reinterpret_cast<const unsigned char*>(key_.data());
  int n = 0;
  bool ok = c.encryptInit(ctx_, c.aes256gcm(), nullptr, key, nonce) == 1 &&
            (aadBytes == 0 || c.encryptUpdate(ctx_, nullptr, &n, aad, int(aadBytes)) == 1) &&
            (bytes == 0 || c.encryptUpdate(ctx_, out, &n, in, int(bytes)) == 1) &&
            c.encryptFinal(ctx_, out + (bytes == 0 ? 0 : n), &n) == 1 &&
            c.ctxCtrl(ctx_, kCtrlGcmGetTag, int(kTagBytes), tag) == 1;
  PC_CHECK(ok, "AES-256-GCM encryption failed inside libcrypto");
}

bool Aes256Gcm::open(const uint8_t nonce[kNonceBytes], const uint8_t* aad, size_t aadBytes,
                     const uint8_t* in, size_t bytes, uint8_t* out, const uint8_t tag[kTagBytes]) {
  const Crypto& c = crypto();
  const auto* key = reinterpret_cast<const unsigned char*>(key_.data());
  int n = 0;
  PC_CHECK(c.decryptInit(ctx_, c.aes256gcm(), nullptr, key, nonce) == 1,
           "AES-256-GCM set-up failed inside libcrypto");
  if (aadBytes != 0 && c.decryptUpdate(ctx_, nullptr, &n, aad, int(aadBytes)) != 1) return false;
  if (bytes != 0 && c.decryptUpdate(ctx_, out, &n, in, int(bytes)) != 1) return false;
  if (c.ctxCtrl(ctx_, kCtrlGcmSetTag, int(kTagBytes), const_cast<uint8_t*>(tag)) != 1) return false;
  int tail = 0;
  return c.decryptFinal(ctx_, out + (bytes == 0 ? 0 : n), &tail) == 1;
}

std::string Aes256Gcm::describeLibrary() {
  const Crypto& c = crypto();
  return c.library.name() + " (" + c.version(kOpensslVersion) + ")";
}

}  // namespace pycollective
