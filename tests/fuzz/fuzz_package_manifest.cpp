// Fuzz target: kernel.json comes inside packages from any hub, and its "layers" also as the
// kernelhub.layers annotation of every index entry (parse_package_layers): the same input goes to
// both parsers.
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>

#include "hub/base/error.h"
#include "registry/package_manifest.h"

namespace {

void layers_annotation(const std::string& text) {
  std::map<std::string, kh::PackageLayer> layers;
  try {
    layers = kh::parse_package_layers(text, "kernelhub.layers");
  } catch (const kh::Error&) {
    return;
  }
  if (text.size() > kh::kMaxLayersAnnotationBytes || layers.empty()) __builtin_trap();
  for (auto& [name, l] : layers)
    if (l.forward.empty() || l.dtypes.empty() || l.has_backward == l.backward.empty())
      __builtin_trap();
  std::string once = kh::serialize_package_layers(layers);
  try {
    if (kh::parse_package_layers(once, "again") != layers) __builtin_trap();
  } catch (const kh::Error&) {
    __builtin_trap();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  layers_annotation(text);
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
