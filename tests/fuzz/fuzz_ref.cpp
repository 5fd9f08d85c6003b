// Fuzz target: refs and hub addresses come from users, configs and lock files.
#include <cstddef>
#include <cstdint>
#include <string>

#include "hub/base/error.h"
#include "hub/oci/address.h"
#include "hub/oci/ref.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  try {
    kh::Ref r = kh::Ref::parse(text);
    // A parsed ref prints as a ref that parses to itself.
    if (!(kh::Ref::parse(r.str()) == r)) __builtin_trap();
  } catch (const kh::Error&) {
  }
  try {
    auto a = kh::HubAddress::parse(text, size % 2 == 0);
    // Ids become cache paths: never an empty, "." or ".." component, never a NUL.
    std::string id = a.id();
    if (id.find('\0') != std::string::npos) __builtin_trap();
    size_t start = 0;
    while (start <= id.size()) {
      size_t end = id.find('/', start);
      if (end == std::string::npos) end = id.size();
      std::string part = id.substr(start, end - start);
      if (part.empty() || part == "." || part == "..") __builtin_trap();
      start = end + 1;
    }
  } catch (const kh::Error&) {
  }
  return 0;
}
