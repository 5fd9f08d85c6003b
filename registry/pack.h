// Packing a built kernel package directory into an OCI image layout (`kernel-hub pack`).
//
// Input: a package directory as the build leaves it: the host library, a kernel.json naming at
// least name, version and host_library (optionally cuda_source / device_source, cuda.version and
// prebuilt cubins), and the .cu source. Output: one image index, tagged with the channel (v1) and
// the exact version (1.0.0), whose variant manifests (one per device: cuda, cpu) each hold one
// tar+zstd layer of the variant's files and a registry-format kernel.json (every file's SHA-256).
//
// Steps: the loader's preflight and module check on the host library (a bad library is refused
// with the same messages as `kernel-hub check`); the layer table comes from the module itself;
// the .cu is compiled to a cubin per sm with NVRTC (no GPU needed); each variant is staged in a
// temp directory and archived reproducibly; manifests and the index are serialized canonically
// without timestamps, so the same inputs always give the same digests.
//
// The index carries no top-level artifactType (skopeo 1.9.3 drops the field when copying and
// then fails its digest check; see tests/fixtures/layout_builder.cpp); the variant manifests
// carry application/vnd.kernelhub.kernel.v1. Index entries carry platform linux/<arch> and the
// annotations registry/resolver.cpp matches on: kernelhub.device, kernelhub.abi,
// kernelhub.cuda.version, kernelhub.cuda.sm, kernelhub.source, and kernelhub.layers (the
// variant's layers, ops, flags and dtypes as in kernel.json, compact JSON; also on the variant
// manifest), which lets resolution decide without fetching the variant.
#pragma once

#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "hub/base/digest.h"
#include "hub/oci/oci.h"
#include "hub/trust/signature.h"
#include "registry/package_manifest.h"

namespace kh {

struct ModuleView;  // loader/module.h

struct PackOptions {
  std::filesystem::path package_dir;  // the built package directory
  // Where to write. Without `repo`: a single OCI image layout (what `skopeo copy ... oci:DIR:TAG`
  // reads, and what `kernel-hub push DIR REF` uploads). With `repo` ("org/name"): a layout hub
  // directory, the layout at <output>/<repo>/ (the embedded default hub's form).
  std::filesystem::path output;
  std::string repo;
  // Targets to compile the .cu for (cuda variant): "80", "86", "89", "90", "90a", ...
  std::vector<std::string> sms = {"80", "86", "89", "90", "90a"};
  // Channel tags; the exact version from kernel.json is always added. Empty: "v<major>".
  std::vector<std::string> tags;
  // Device variants, in index order. "cuda" needs device code (a .cu or prebuilt cubins).
  std::vector<std::string> devices = {"cuda", "cpu"};
  // The CUDA version the cuda variant needs (kernelhub.cuda.version). Empty: NVRTC's major.minor
  // when cubins are compiled, else kernel.json's cuda.version, else "12.0".
  std::string cuda_version;
  bool include_source = true;  // ship the .cu (NVRTC fallback) in the cuda variant
  std::string os;              // OCI platform; empty: this machine's
  std::string arch;

  // pack --sign: one signed statement per tag, kept beside the layout's index
  // (signatures/sha256-<hex>.json) and carried along by `kernel-hub push`.
  const trust::PrivateKey* sign_key = nullptr;
  std::string sign_repo;  // the repo statements name; empty: repo, else kernel.json's name
  std::string sign_hub_id = "kernel-hub";
  int64_t sign_expires = 0;  // unix seconds; 0: now + SignOptions::kDefaultValidity
  uint64_t sign_serial = 0;  // 0: now in unix seconds
};

struct PackedVariant {
  std::string device;
  oci::Descriptor entry;           // the index entry (platform, annotations, manifest digest)
  oci::Descriptor layer;           // the tar+zstd layer
  std::vector<std::string> files;  // files in the package, kernel.json included
};

struct PackReport {
  std::string name;
  std::string version;
  std::filesystem::path layout;  // the layout directory written
  oci::Descriptor index;         // the tagged image index
  std::vector<std::string> tags;
  std::vector<PackedVariant> variants;
  std::vector<std::string> notes;  // preflight warnings and the like
  std::vector<trust::Statement> signed_statements;
};

// Packs and writes. Throws kh::Error: kRefused with every failed check when the host library
// fails the preflight or module check; kInvalidInput for a malformed kernel.json, a bad sm, tag
// or device list; kNotFound when NVRTC is missing but cubins were asked for (the message says to
// install it or pass an empty sm list for a source-only variant).
PackReport pack_package(const PackOptions& options);

// The layers as a module table declares them, in kernel.json's form: what pack publishes and
// `kernel-hub manifest` writes (the loader binds from the table, so the manifest must say the
// same). kRefused naming `dir` when a layer declares no dtype or the module no layer.
std::map<std::string, PackageLayer> package_layers_of(const ModuleView& module,
                                                      const std::filesystem::path& dir);

// "1.0.0" -> "v1"; nullopt when the version does not start with a number.
std::optional<std::string> channel_tag_of(const std::string& version);

}  // namespace kh
