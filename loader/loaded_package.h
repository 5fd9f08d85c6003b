// A package directory loaded into this process: its kernel.json (package_dir.h) and its host
// library's module (module.h), checked to agree on the package's identity. kh::Runtime::bind
// loads packages through here; tests and tools that inspect a loaded module use it directly.
#pragma once

#include <filesystem>
#include <optional>

#include "loader/module.h"
#include "loader/package_dir.h"

namespace kh {

struct LoadedPackage {
  PackageDir dir;
  const LoadedModule* module = nullptr;
};

// Reads kernel.json (checked against `manifest_digest` when given), preflights, dlopens and
// validates the package's host library, checked against kernel.json's digest for it, all through
// the descriptors that were hashed (loader/verified_file.h); checks that the module's name and
// version match kernel.json. Each (library, content) loads once per process.
// Throws kh::Error (kRefused with every failed check, kIntegrity, kNotFound, kInvalidInput).
LoadedPackage load_package(const std::filesystem::path& package_dir,
                           const std::optional<Digest>& manifest_digest = std::nullopt);

}  // namespace kh
