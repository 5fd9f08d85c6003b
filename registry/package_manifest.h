// The package manifest: kernel.json at the root of every kernel package (schema:
// manifests/schemas/package-manifest.schema.json). A superset of what loader/package_dir.cpp
// reads (name, version, host_library), so one file serves both.
//
//   {
//     "name": "kernel-hub/norm", "version": "1.2.0",
//     "abi": {"major": 1, "minor": 0},
//     "device": "cuda",
//     "host_library": "libnorm.so",
//     "cuda": {"version": "12.4"},
//     "cubins": {"80": "norm.sm_80.cubin", "90a": "norm.sm_90a.cubin"},
//     "cuda_source": "norm.cu",
//     "layers": {
//       "RMSNorm": {"ops": {"forward": "rms_norm", "forward_train": "rms_norm_train",
//                           "backward": "rms_norm_backward"},
//                   "flags": ["backward", "graph_safe", "deterministic"],
//                   "dtypes": ["bf16", "fp16", "fp32"]}
//     },
//     "files": {"libnorm.so": "sha256:...", "norm.cu": "sha256:...", ...}
//   }
//
// "cubins" and "cuda_source" are the fields loader/package_dir.cpp reads (plain file names in the
// package directory). "files" lists every file of the package but kernel.json itself with its
// SHA-256; a package with a file that differs, is missing or is not listed is refused. Unknown
// top-level keys are ignored (newer writers may add fields; the ABI minor covers what hosts must
// understand).
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "hub/base/digest.h"

namespace kh {

struct PackageLayer {
  std::string forward;        // op name (required)
  std::string forward_train;  // optional; train calls forward when empty
  std::string backward;       // required with the "backward" flag
  bool has_backward = false;
  bool graph_safe = false;
  bool deterministic = false;
  std::vector<std::string> dtypes;  // "bf16", "fp16", "fp32"; at least one

  bool operator==(const PackageLayer&) const = default;
};

struct PackageManifest {
  std::string name;
  std::string version;
  int abi_major = 0;
  int abi_minor = 0;
  std::string device;        // "cuda" or "cpu"
  std::string host_library;  // file name inside the package
  // cuda only
  std::string cuda_version;                   // "12.4": the CUDA the device code needs
  std::map<std::string, std::string> cubins;  // sm ("80", "90a") -> file name
  std::string cuda_source;                    // .cu file for NVRTC, empty when none
  std::map<std::string, PackageLayer> layers;
  std::map<std::string, Digest> files;  // relative path -> sha256

  bool has_source() const { return !cuda_source.empty(); }
  std::vector<std::string> sm_list() const;  // keys of cubins, in order

  // Parses and validates (kInvalidInput naming `what` and the JSON path).
  static PackageManifest parse(std::string_view json_text, std::string_view what = "kernel.json");
  // Canonical JSON (sorted keys, 2-space indent).
  std::string serialize() const;
};

// The file name of the manifest inside a package directory.
inline constexpr std::string_view kPackageManifestName = "kernel.json";
// Upper bound on kernel.json; larger is refused.
inline constexpr uint64_t kMaxPackageManifestBytes = 1 << 20;

// A package's layers alone, in kernel.json's "layers" form as compact JSON: the value of the
// kernelhub.layers annotation pack writes on each index entry and variant manifest, so that
// resolution knows a variant's layers and ops without fetching it (registry/resolver.h).
std::string serialize_package_layers(const std::map<std::string, PackageLayer>& layers);
// Parses and validates that form, as kernel.json's "layers" are validated. The text comes from a
// hub: at most kMaxLayersAnnotationBytes, else kInvalidInput naming `what`.
std::map<std::string, PackageLayer> parse_package_layers(std::string_view json_text,
                                                         std::string_view what);
// Upper bound on a kernelhub.layers annotation (a hundred layers take about 12 KiB).
inline constexpr uint64_t kMaxLayersAnnotationBytes = 32 << 10;

// Reads and parses dir/kernel.json.
PackageManifest read_package_manifest(const std::filesystem::path& dir);

// Checks the package directory against manifest.files: every listed file exists as a regular
// file with that SHA-256, and no other file (or symlink, device, ...) exists besides
// kernel.json. Throws kIntegrity naming the file and what differed (expected and found digest,
// missing, not listed, not a regular file).
void verify_package_files(const std::filesystem::path& dir, const PackageManifest& manifest);

// "files" for a directory: every regular file but kernel.json with its digest (for packers and
// tests). Throws kRefused on symlinks and other non-regular files.
std::map<std::string, Digest> hash_package_files(const std::filesystem::path& dir);

}  // namespace kh
