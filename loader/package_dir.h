// Reads a package directory's kernel.json: {"name", "version", "host_library": "lib....so"}.
// The full package manifest comes later; this is the one place that reads the file, so that the
// rest of the loader only sees PackageDir.
#pragma once

#include <filesystem>
#include <string>

namespace kh {

struct PackageDir {
  std::filesystem::path dir;
  std::string name;
  std::string version;
  std::filesystem::path host_library;  // dir / host_library, checked to stay inside dir
};

// Throws kh::Error: kNotFound without kernel.json, kInvalidInput when it is malformed or
// host_library escapes the directory.
PackageDir read_package_dir(const std::filesystem::path& dir);

}  // namespace kh
