#include "hub/base/digest.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <unistd.h>

#include "hub/base/error.h"
#include "hub/base/fs.h"

namespace kh {

namespace {
bool is_lower_hex(std::string_view s) {
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  }
  return true;
}
}  // namespace

bool Digest::is_valid(std::string_view text) {
  constexpr std::string_view kPrefix = "sha256:";
  if (text.size() != kPrefix.size() + 64 || text.substr(0, kPrefix.size()) != kPrefix) return false;
  return is_lower_hex(text.substr(kPrefix.size()));
}

Digest Digest::parse(std::string_view text) {
  if (!is_valid(text)) {
    throw Error(ErrorKind::kInvalidInput,
                "invalid digest '" + std::string(text) +
                    "': expected sha256: followed by 64 lowercase hex characters");
  }
  return Digest{std::string(text.substr(7))};
}

Digest Digest::from_hex(std::string_view hex) {
  if (hex.size() != 64 || !is_lower_hex(hex)) {
    throw Error(ErrorKind::kInvalidInput, "invalid sha256 hex '" + std::string(hex) +
                                              "': expected 64 lowercase hex characters");
  }
  return Digest{std::string(hex)};
}

std::string to_hex(const unsigned char* data, size_t size) {
  static const char* kHex = "0123456789abcdef";
  std::string out(size * 2, '0');
  for (size_t i = 0; i < size; ++i) {
    out[2 * i] = kHex[data[i] >> 4];
    out[2 * i + 1] = kHex[data[i] & 15];
  }
  return out;
}

struct Sha256::Impl {
  EVP_MD_CTX* ctx = nullptr;
};

Sha256::Sha256() : impl_(std::make_unique<Impl>()) {
  impl_->ctx = EVP_MD_CTX_new();
  if (impl_->ctx == nullptr) throw Error(ErrorKind::kIo, "OpenSSL: EVP_MD_CTX_new failed");
  reset();
}

Sha256::~Sha256() {
  EVP_MD_CTX_free(impl_->ctx);
}

void Sha256::reset() {
  if (EVP_DigestInit_ex(impl_->ctx, EVP_sha256(), nullptr) != 1) {
    throw Error(ErrorKind::kIo, "OpenSSL: EVP_DigestInit_ex(sha256) failed");
  }
}

void Sha256::update(const void* data, size_t size) {
  if (size == 0) return;
  if (EVP_DigestUpdate(impl_->ctx, data, size) != 1) {
    throw Error(ErrorKind::kIo, "OpenSSL: EVP_DigestUpdate failed");
  }
}

Digest Sha256::finish() {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (EVP_DigestFinal_ex(impl_->ctx, md, &len) != 1) {
    throw Error(ErrorKind::kIo, "OpenSSL: EVP_DigestFinal_ex failed");
  }
  return Digest{to_hex(md, len)};
}

Digest sha256_of(std::string_view bytes) {
  Sha256 h;
  h.update(bytes);
  return h.finish();
}

Digest sha256_of_file(const std::filesystem::path& path) {
  Sha256 h;
  fs::for_each_chunk(path, [&](const char* data, size_t n) { h.update(data, n); });
  return h.finish();
}

Digest sha256_of_fd(int fd, const std::filesystem::path& path) {
  Sha256 h;
  fs::for_each_chunk(fd, path, [&](const char* data, size_t n) { h.update(data, n); });
  return h.finish();
}

}  // namespace kh
