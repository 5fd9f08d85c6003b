// Fuzz target: OCI documents from a hub (manifests, indexes, descriptors) are untrusted input.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "hub/base/error.h"
#include "hub/oci/oci.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  try {
    auto m = kh::oci::parse_manifest(bytes);
    // What parses must serialize and parse again to the same document.
    auto again = kh::oci::parse_manifest(kh::oci::serialize(m));
    if (kh::oci::serialize(again) != kh::oci::serialize(m)) __builtin_trap();
  } catch (const kh::Error&) {
  }
  try {
    auto x = kh::oci::parse_index(bytes);
    if (kh::oci::serialize(kh::oci::parse_index(kh::oci::serialize(x))) != kh::oci::serialize(x)) {
      __builtin_trap();
    }
  } catch (const kh::Error&) {
  }
  try {
    kh::oci::parse_descriptor_json(bytes);
  } catch (const kh::Error&) {
  }
  kh::oci::peek_media_type(bytes);
  kh::base64_decode(bytes);
  return 0;
}
