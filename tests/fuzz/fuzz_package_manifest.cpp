// Fuzz target: kernel.json comes inside packages from any hub.
#include <cstddef>
#include <cstdint>
#include <string>

#include "hub/base/error.h"
#include "registry/package_manifest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  kh::PackageManifest m;
  try {
    m = kh::PackageManifest::parse(text);
  } catch (const kh::Error&) {
    return 0;
  }
  // Every named file stays inside the package and is covered by "files".
  if (!m.files.count(m.host_library)) __builtin_trap();
  for (auto& [path, digest] : m.files)
    if (path.empty() || path[0] == '/' || path.find("..") == 0) __builtin_trap();
  std::string once = m.serialize();
  kh::PackageManifest again;
  try {
    again = kh::PackageManifest::parse(once);
  } catch (const kh::Error&) {
    __builtin_trap();
  }
  if (again.serialize() != once) __builtin_trap();
  return 0;
}
