// SHA-256 digests in OCI form ("sha256:<64 lowercase hex>"), computed while streaming.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

namespace kh {

struct Digest {
  std::string hex;  // 64 lowercase hex characters

  // Parses "sha256:<hex>"; throws kInvalidInput naming the text otherwise.
  // Other registered algorithms (sha512, blake3) are refused: kernel-hub uses sha256 only.
  static Digest parse(std::string_view text);
  static bool is_valid(std::string_view text);
  static Digest from_hex(std::string_view hex);

  std::string str() const { return "sha256:" + hex; }
  bool empty() const { return hex.empty(); }
  bool operator==(const Digest& o) const = default;
  auto operator<=>(const Digest& o) const = default;
};

// Incremental SHA-256 on OpenSSL EVP.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void update(const void* data, size_t size);
  void update(std::string_view s) { update(s.data(), s.size()); }
  Digest finish();  // the object can be reused after reset()
  void reset();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

Digest sha256_of(std::string_view bytes);
Digest sha256_of_file(const std::filesystem::path& path);
// The digest of what `fd` reads from its offset to its end (`path` names it in errors).
Digest sha256_of_fd(int fd, const std::filesystem::path& path);

std::string to_hex(const unsigned char* data, size_t size);

}  // namespace kh
