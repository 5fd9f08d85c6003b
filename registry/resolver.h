// Resolution: which kernel serves a layer on a device in a mode, and why. Pure: the resolver
// reads image indexes (and, when the provider has them, variant manifests and kernel.json)
// through an IndexProvider and does no I/O of its own; hub_index_provider.h joins it to kh::Hub.
//
// Order of decisions for one layer:
//  1. Device key: the layer's mapping for device.key ("cuda", "cpu"); none -> runtime fallback.
//  2. Capability range (cuda): among the entries whose range contains device.sm, the narrowest
//     wins; an entry without a range covers everything and loses to any range; of equal widths
//     the one registered last wins (a trace line says so). Wider ranges are not tried when the
//     narrowest one yields nothing (HF semantics).
//  3. Mode chain: eval -> eval entry, train entry, fallback entry; train -> train entry, fallback
//     entry. A candidate that fails (index unavailable, no fitting variant, package lacks the
//     layer, or for train lacks a backward op) is rejected and the next one is tried. After the
//     chain: the runtime's own implementation (LayerResolution::fallback). The chosen variant's
//     layers and ops are read from its kernel.json when the provider has it, else from the
//     index entry's kernelhub.layers annotation (what pack writes); with neither, the loader
//     checks them at bind (LayerResolution::layers_from says which).
//  4. Variant, among the index's manifests. Checks, in order (first failure is the reason):
//       media type is a manifest; platform os, then architecture equal to the device's (a tag
//       naming one variant manifest: from its own annotations, describe_single_variant);
//       kernelhub.abi major equal to the host's and minor <= host minor;
//       kernelhub.device equal to the device key;
//       cuda: kernelhub.cuda.version same major as the driver and minor <= the driver's;
//       cuda: a cubin in kernelhub.cuda.sm for the device (exact sm, incl. "90a" on 90; else
//             same major with a lower minor, never an "a" cubin), else kernelhub.source=true
//             (NVRTC from the packaged .cu), else rejected.
//     Preference among the variants that fit (documented order, tested):
//       1. exact cubin  >  same-major lower-minor cubin (higher minor first)  >  NVRTC source
//       2. newer kernelhub.cuda.version (still <= driver)
//       3. higher ABI minor
//       4. earlier in the index (the publisher's order)
//     With a lock (ResolveOptions::lock), the index digest must be the locked one and only the
//     locked variant manifest (and layer) is accepted; a difference throws kIntegrity.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "hub/base/error.h"
#include "hub/oci/oci.h"
#include "hub/oci/ref.h"
#include "kernel_hub/kernel_hub_abi.h"
#include "registry/device.h"
#include "registry/kernel_config.h"
#include "registry/lock_file.h"
#include "registry/package_manifest.h"

namespace kh {

// Annotation keys on index entries (REFERENCE §2.2), prefix oci::kAnnotationPrefix.
inline constexpr std::string_view kAnnotationDevice = "kernelhub.device";
inline constexpr std::string_view kAnnotationCudaVersion = "kernelhub.cuda.version";
inline constexpr std::string_view kAnnotationCudaSm = "kernelhub.cuda.sm";
inline constexpr std::string_view kAnnotationAbi = "kernelhub.abi";
inline constexpr std::string_view kAnnotationSource = "kernelhub.source";
// The variant's layers in kernel.json's "layers" form, compact JSON (parse_package_layers).
inline constexpr std::string_view kAnnotationLayers = "kernelhub.layers";
// The SHA-256 of the variant's kernel.json ("sha256:<hex>"): through the signed index it ties
// kernel.json, and by its "files" every file of the package, to the signature.
inline constexpr std::string_view kAnnotationPackageManifest = "kernelhub.package-manifest";
// On a variant manifest itself (pack writes every key above there too): its platform, "os/arch"
// (an OCI image manifest has no platform field; only index entries do).
inline constexpr std::string_view kAnnotationPlatform = "kernelhub.platform";

// The index entry a variant manifest would have, from the manifest's own annotations: for a tag
// that names one variant manifest directly (copied without its index). The descriptor keeps its
// digest, size and media type; annotations and platform come from the manifest.
oci::Descriptor describe_single_variant(const oci::Descriptor& descriptor,
                                        const oci::Manifest& manifest);

struct ResolveOptions {
  // The host's package ABI: a variant of a newer minor is skipped.
  int abi_major = KH_ABI_MAJOR;
  int abi_minor = KH_ABI_MINOR;
  const LockFile* lock = nullptr;  // when set, only locked digests are accepted
};

enum class TraceStage { kLayer, kCapability, kMode, kIndex, kVariant, kPackage, kLock };
const char* trace_stage_name(TraceStage stage);

// One candidate considered and the verdict on it.
struct TraceStep {
  TraceStage stage;
  std::string candidate;  // "[80, 89] at $.RMSNorm.cuda[0]", "eval: org/n@v1:RMSNorm", ...
  bool accepted = false;
  std::string reason;
};

// How a chosen variant runs on the device.
enum class VariantCode { kHost, kCubinExact, kCubinCompatible, kNvrtcSource };
const char* variant_code_name(VariantCode code);

struct VariantChoice {
  size_t position = 0;  // in index.manifests
  oci::Descriptor descriptor;
  VariantCode code = VariantCode::kHost;
  std::string cubin_sm;      // the cubin that runs ("90a", "80"); empty otherwise
  std::string cuda_version;  // kernelhub.cuda.version ("" for cpu)
  int abi_major = 0;
  int abi_minor = 0;
};

struct VariantSelection {
  std::optional<VariantChoice> chosen;
  std::vector<TraceStep> trace;  // one step per index entry, in index order
};

// Chooses among index.manifests for the device (step 4 above). `only` restricts the choice to
// one manifest digest (a lock); the others are rejected with that reason.
VariantSelection select_variant(const oci::Index& index, const Device& device,
                                const ResolveOptions& options,
                                const std::optional<Digest>& only = std::nullopt);

// What a provider returns for a ref: the index it resolved to (a ref that names a single
// manifest is given as an index of that one manifest).
struct IndexRecord {
  Ref ref;
  Digest digest;  // of the index (or the single manifest)
  oci::Index index;
  std::string hub_id;  // HubAddress::id(), recorded in lock files
};

class IndexProvider {
 public:
  virtual ~IndexProvider() = default;
  // Throws kh::Error (kNotFound, kOffline, kNetwork, ...) when the index cannot be had.
  virtual IndexRecord index(const Ref& ref) = 0;
  // The variant manifest, for its package layer; nullopt when the provider does not have it.
  virtual std::optional<oci::Manifest> manifest(const Ref& ref, const oci::Descriptor& variant) = 0;
  // The variant's kernel.json when already at hand (e.g. unpacked in the cache); nullopt means
  // "not known before fetching": the index entry's kernelhub.layers annotation then tells the
  // layer's ops, or without one the loader checks them at bind.
  virtual std::optional<PackageManifest> package(const Ref& /*ref*/,
                                                 const oci::Descriptor& /*variant*/) {
    return std::nullopt;
  }
};

// Where the resolver learnt which layers and ops the chosen variant has.
enum class LayersSource {
  kUnknown,          // nowhere before fetching: the loader checks the ops at bind
  kPackage,          // its kernel.json, already unpacked (or a local package's)
  kIndexAnnotation,  // the signed index entry's kernelhub.layers annotation
};

// The package layer of a variant manifest: its tar+zstd layer (or its only layer).
std::optional<oci::Descriptor> package_layer_of(const oci::Manifest& manifest);

struct LayerResolution {
  std::string layer;
  Mode requested = Mode::kEval;
  bool fallback = true;  // true: the runtime's own implementation serves this layer
  // The rest is set when a kernel serves (fallback == false).
  ModeKey entry_mode = Mode::kEval;  // the config entry that served
  std::string entry_path;            // its JSON path
  KernelRef kernel;
  std::string hub_id;
  Digest index_digest;
  std::optional<VariantChoice> variant;
  std::optional<oci::Descriptor> package_layer;  // the variant's tar+zstd layer, when known
  LayersSource layers_from = LayersSource::kUnknown;
  std::vector<TraceStep> trace;
  // Set when the fallback serves although the config maps this layer for the device: why each
  // config entry tried could not serve ("eval: kernels-community/x@v1:L: not on this hub ...;
  // fallback: ..."). Empty when a kernel serves or the config has no entry to try here (no
  // mapping, no entry for this device key or capability, no entry for the mode).
  std::string unserved;

  // "RMSNorm eval: org/n@v1:RMSNorm (train entry), variant 1 cubin sm_90" or
  // "RMSNorm train: runtime fallback".
  std::string summary() const;
};

struct Resolution {
  Device device;
  Mode mode = Mode::kEval;
  std::vector<LayerResolution> layers;  // in config order (sorted by layer name)
  const LayerResolution* find(std::string_view layer) const;
};

// Resolves one layer (steps 1-4) for a requested mode.
// Provider failures become rejected candidates in the trace; lock violations throw.
LayerResolution resolve_layer(const KernelConfig& config, std::string_view layer,
                              const Device& device, Mode mode, IndexProvider& provider,
                              const ResolveOptions& options = {});

// Every layer of the config. Each ref's index is asked for once.
Resolution resolve(const KernelConfig& config, const Device& device, Mode mode,
                   IndexProvider& provider, const ResolveOptions& options = {});

// Why an entry's index could not be had, with what to do: the error, plus a hint when the ref is
// a Hugging Face Hub repository (kernels-community/...), or its tag is a branch name (main) or a
// git commit rather than a tag or digest.
std::string explain_index_failure(const Ref& ref, const Error& error);

// The trace as lines for `kernel-hub why`: "  [variant] rejected sha256:ab12… : needs CUDA 13.2
// ...".
std::string format_trace(const LayerResolution& resolution);

// Wraps a provider so that each ref's index and each manifest is asked for once.
class MemoIndexProvider : public IndexProvider {
 public:
  explicit MemoIndexProvider(IndexProvider& inner) : inner_(inner) {}
  IndexRecord index(const Ref& ref) override;
  std::optional<oci::Manifest> manifest(const Ref& ref, const oci::Descriptor& variant) override;
  std::optional<PackageManifest> package(const Ref& ref, const oci::Descriptor& variant) override;

 private:
  IndexProvider& inner_;
  std::map<std::string, std::shared_ptr<IndexRecord>> indexes_;
  std::map<std::string, std::pair<ErrorKind, std::string>> failures_;  // asked once
  std::map<std::string, std::optional<oci::Manifest>> manifests_;
  std::map<std::string, std::optional<PackageManifest>> packages_;
};

struct LockBuild {
  LockFile lock;
  std::vector<std::string> misses;  // "org/n@v1 for cuda:sm_90:...: no variant fits (...)"
  // Config entries that cannot be served and are left out of the lock (a layer then keeps its
  // fallback): an index that cannot be had (not on the hub, no such tag, a revision that is not a
  // tag or digest), a package without the entry's layer. "RMSNorm cpu eval: org/n@v1:L: why".
  std::vector<std::string> unserved;

  // Throws kNotFound listing every miss (and, with include_unserved, every unserved entry), for
  // `what` ("lock", "export") that writes nothing to `out` when a ref cannot be served on every
  // target. lock passes its --strict; export is always complete.
  void require_complete(std::string_view what, std::string_view out,
                        bool include_unserved = true) const;
};

// For every ref of the config and every device whose key uses it: the index digest and the
// variant select_variant chooses, with its layer. Needs the provider's manifests. A ref whose
// index cannot be had goes to `unserved` (kernelize falls back past it, lock or no lock); a ref
// with no variant for a target goes to `misses`; an entry whose package lacks its layer goes to
// `unserved` (its ref is still locked).
LockBuild build_lock(const KernelConfig& config, const std::vector<Device>& devices,
                     IndexProvider& provider, const ResolveOptions& options = {});

}  // namespace kh
