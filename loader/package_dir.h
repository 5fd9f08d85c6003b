// Reads a package directory's kernel.json: {"name", "version", "host_library": "lib....so"},
// optionally with device code: "cubins": {"90": "toy.sm_90.cubin", "90a": ...} (target ->
// cubin file) and "cuda_source": "toy.cu" (compiled by NVRTC for GPUs without a cubin).
// The full package manifest comes later; this is the one place that reads the file, so that the
// rest of the loader only sees PackageDir.
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>

#include "hub/base/digest.h"

namespace kh {

struct PackageDir {
  std::filesystem::path dir;
  std::string name;
  std::string version;
  std::filesystem::path host_library;  // dir / host_library, checked to stay inside dir
  // Device code, all paths dir / <plain file name>. Keys are targets as kernel.json names them
  // ("90", "90a"), checked to parse as a CudaArch.
  std::map<std::string, std::filesystem::path> cubins;
  std::filesystem::path cuda_source;  // empty when the package has none
  // kernel.json's own digest (of the bytes parsed here) and its "files" digests (plain file
  // name -> SHA-256), which every file the loader uses is checked against, from the descriptor
  // it is then used through (loader/verified_file.h). Empty for packages without "files".
  Digest manifest_digest;
  std::map<std::string, Digest> files;

  // The digest kernel.json lists for `file` (a path in this directory), if any.
  std::optional<Digest> expected_digest(const std::filesystem::path& file) const;
};

// Throws kh::Error: kNotFound without kernel.json, kInvalidInput when it is malformed or
// host_library, a cubin or cuda_source escapes the directory, or a cubin target is malformed,
// kIntegrity when `manifest_digest` is given (the digest the signed chain gives for kernel.json)
// and kernel.json differs. kernel.json is read through one descriptor, without following links
// beneath a guarded root.
PackageDir read_package_dir(const std::filesystem::path& dir,
                            const std::optional<Digest>& manifest_digest = std::nullopt);

}  // namespace kh
