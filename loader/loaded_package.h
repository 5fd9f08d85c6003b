// A package directory loaded into this process: its kernel.json (package_dir.h) and its host
// library's module (module.h), checked to agree on the package's identity. kh::Runtime::bind
// loads packages through here; tests and tools that inspect a loaded module use it directly.
#pragma once

#include <filesystem>

#include "loader/module.h"
#include "loader/package_dir.h"

namespace kh {

struct LoadedPackage {
  PackageDir dir;
  const LoadedModule* module = nullptr;
};

// Reads kernel.json, preflights, dlopens and validates the package's host library; checks that
// the module's name and version match kernel.json. Each library loads once per process.
// Throws kh::Error (kRefused with every failed check, kNotFound, kInvalidInput).
LoadedPackage load_package(const std::filesystem::path& package_dir);

}  // namespace kh
