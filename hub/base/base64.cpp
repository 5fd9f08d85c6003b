#include "hub/base/base64.h"

#include <openssl/evp.h>

#include <climits>
#include <cstdint>

namespace kh {

std::string base64_encode(std::string_view bytes) {
  std::string out(4 * ((bytes.size() + 2) / 3) + 1, '\0');
  int n = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(bytes.data()),
                          static_cast<int>(bytes.size()));
  out.resize(static_cast<size_t>(n));
  return out;
}

std::optional<std::string> base64_decode(std::string_view text) {
  // EVP_DecodeBlock skips whitespace and does not report the padding, so check the form
  // ourselves first: groups of four alphabet characters, '=' only as the last one or two.
  if (text.size() % 4 != 0 || text.size() > INT32_MAX / 2) return std::nullopt;
  size_t pad = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    bool alpha = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                 c == '+' || c == '/';
    if (c == '=') {
      if (i + 2 < text.size()) return std::nullopt;  // '=' only in the last two places
      ++pad;
    } else if (!alpha || pad > 0) {
      return std::nullopt;
    }
  }
  if (text.empty()) return std::string();
  std::string out(3 * (text.size() / 4), '\0');
  int n = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                          reinterpret_cast<const unsigned char*>(text.data()),
                          static_cast<int>(text.size()));
  if (n < 0 || static_cast<size_t>(n) != out.size()) return std::nullopt;
  out.resize(out.size() - pad);
  // Non-zero unused bits ("QQ==" vs "QR==") would give two texts for one value.
  if (base64_encode(out) != text) return std::nullopt;
  return out;
}

}  // namespace kh
