// Fuzz target: signature envelopes, signature sets and statements come from hubs and mirrors
// and are parsed before anything else about a package is trusted.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "hub/base/error.h"
#include "hub/oci/oci.h"
#include "hub/trust/signature.h"

namespace {

// What parses serializes to a canonical form that parses back to the same value.
template <typename T>
void check_round_trip(std::string_view bytes) {
  T value;
  try {
    value = T::parse(bytes, "fuzz input");
  } catch (const kh::Error&) {
    return;
  }
  std::string once = value.serialize();
  T again;
  try {
    again = T::parse(once, "fuzz output");
  } catch (const kh::Error&) {
    __builtin_trap();
  }
  if (!(again == value) || again.serialize() != once) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  check_round_trip<kh::trust::Envelope>(bytes);
  check_round_trip<kh::trust::SignatureSet>(bytes);

  // A statement has exactly one byte form: whatever parses serializes to the input itself.
  try {
    kh::trust::Statement s = kh::trust::Statement::parse(bytes, "fuzz input");
    if (s.serialize() != bytes) __builtin_trap();
  } catch (const kh::Error&) {
  }

  // Strict base64 and RFC 3339 are canonical too.
  if (auto decoded = kh::base64_decode(bytes)) {
    if (kh::base64_encode(*decoded) != bytes) __builtin_trap();
  }
  if (auto t = kh::trust::parse_time_rfc3339(bytes)) {
    if (kh::trust::format_time_rfc3339(*t) != bytes) __builtin_trap();
  }
  return 0;
}
