// Strict base64, shared by OCI inline descriptor data, registry Basic auth and signature
// envelopes.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace kh {

// Base64 (RFC 4648 alphabet, '=' padding, no line breaks). decode is strict: nullopt for any
// other character, missing or extra padding, or non-zero unused bits (non-canonical text), so
// that one value has one text (inline descriptor data, signature envelopes).
std::string base64_encode(std::string_view bytes);
std::optional<std::string> base64_decode(std::string_view text);

}  // namespace kh
