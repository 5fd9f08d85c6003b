// kernelize: one call from a KernelConfig to a runtime whose slots are bound, for every requested
// mode, to the kernels the config maps them to on this device.
//
//   kh::Runtime rt;                           // slots "RMSNorm", "SiluAndMul", ... with fallbacks
//   kh::Store store(kh::Store::default_root());
//   kh::Hub hub(kh::default_hub_address(store, false), store, kh::HubOptions::from_env());
//   auto report = kh::kernelize(rt, config, hub, kh::local_cpu_device(), {});
//   rt.set_mode(kh::Mode::kTrain);            // no I/O from here on
//
// Stages (registry/kernelize/stages.h), nothing loaded before the last:
//  1. plan: every slot (layer name = slot name) resolved for every mode against index metadata;
//     the signed index's kernelhub.layers annotation says which layers and ops each variant has,
//     so one pass decides (a train entry without a backward op falls through the mode chain as
//     the resolver documents).
//  2. trust: each chosen hub package's index signed by a key trusted for its repo, before
//     anything of the package is fetched or unpacked (a refused index leaves nothing unpacked).
//  3. fetch: only the chosen variants (variant manifest + its blobs, by digest), unpacked within
//     the Hub's unpack budget (KERNEL_HUB_UNPACK_BUDGET). For an index packed without the
//     annotation, plan, trust and fetch run again once the package's kernel.json is at hand.
//  4. verify: every package's files against its kernel.json, and kernel.json against the
//     annotation the plan relied on.
//  5. bind: each (slot, mode) through the loader (ELF preflight, dlopen, module table).
//
// - Slots the config does not map, or maps for no entry that fits, keep the runtime's fallback
//   (a log line each). A train binding without a backward op keeps the fallback unless strict;
//   strict also turns "a mapped layer fell back" into an error.
// - Under a lock (options.lock) only locked digests are accepted: a hub that now serves other
//   bytes for a ref is a kIntegrity error naming the ref, the expected and the found digest.
//   Offline, locked refs resolve from the lock's digests (no ref records needed).
// - Version channels follow the hub's ref TTL (HubOptions::ref_ttl_s, KERNEL_HUB_REF_TTL):
//   within it, and always offline, the cached ref record is used. The hub records what it
//   resolves; kernelize writes nothing to the store itself.
// - KERNEL_HUB_LOCAL="org/name=/path[,org/other=/path]" serves those repos from local package
//   directories (kernel authors): no hub, no lock check; still preflighted by the loader, and
//   file-verified when their kernel.json has a "files" map.
// - KERNEL_HUB_DISABLE=1 binds nothing: every slot keeps its fallback.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hub/hub.h"
#include "kernel_hub/kernel_hub.hpp"
#include "registry/device.h"
#include "registry/hub_index_provider.h"
#include "registry/index_providers.h"
#include "registry/kernel_config.h"
#include "registry/lock_file.h"
#include "registry/resolver.h"

namespace kh {

struct KernelizeOptions {
  std::vector<Mode> modes = {Mode::kEval, Mode::kTrain};
  bool strict = false;
  const LockFile* lock = nullptr;
  int cuda_ordinal = 0;  // the CUDA device bound when the Device is cuda
  int abi_major = KH_ABI_MAJOR;
  int abi_minor = KH_ABI_MINOR;
  // Local package overrides (repo -> directory); nullopt: read KERNEL_HUB_LOCAL.
  std::optional<std::map<std::string, std::filesystem::path>> local;
  // Bind nothing; nullopt: read KERNEL_HUB_DISABLE.
  std::optional<bool> disable;
  // The keys packages from the hub must be signed by; null: default_trust_store(). The policy
  // (unsigned, offline grace) is the hub's (HubOptions::trust).
  const trust::TrustStore* trust_keys = nullptr;
};

// Where a binding's package came from.
enum class BindingSource { kCache, kHub, kLocal, kFallback };
const char* binding_source_name(BindingSource source);

struct KernelizeBinding {
  std::string layer;  // the slot name
  Mode mode = Mode::kEval;
  BindingSource source = BindingSource::kFallback;
  std::string package;  // "name@version" from kernel.json; empty for fallback
  std::string kernel;   // the config's ref "org/name@v1:Layer"
  Digest index_digest;
  std::optional<Digest> variant_digest;
  std::string variant;  // "variant 0 host code"
  std::filesystem::path package_dir;
  double load_ms = 0;  // fetch wait excluded: verify + preflight + dlopen + bind
  // Why the fallback serves, when it does; "unserved: <why, per config entry tried>" when the
  // config maps this layer for the device but no entry could serve it (resolution.unserved).
  std::string note;
  std::string trust;           // "signed by <keyid> serial N", "UNSIGNED (allowed)", "local"
  LayerResolution resolution;  // with the full trace
};

struct KernelizeReport {
  Device device;
  std::vector<KernelizeBinding> bindings;  // per slot, per requested mode
  size_t fetched = 0;                      // variants fetched from the hub by this call
  double total_ms = 0;

  const KernelizeBinding* find(std::string_view layer, Mode mode) const;
  std::string str() const;  // one line per binding
  nlohmann::json to_json() const;
};

// A device given as text, the short forms included: "cpu" (this machine's os/arch),
// "cpu:linux/arm64", "cuda:sm_90:cuda_13.0" (this machine's os/arch), and Device::str()'s full
// form "cuda:sm_90:cuda_13.0:linux/amd64". kInvalidInput lists the forms.
Device parse_device_target(std::string_view text);

// Parses KERNEL_HUB_LOCAL's syntax: "org/name=/path[,org/other=/path]". kInvalidInput names the
// item that is wrong.
std::map<std::string, std::filesystem::path> parse_local_overrides(std::string_view text);

// See the file comment. Throws kh::Error: kIntegrity (lock or file digests), kOffline (a miss in
// the cache when offline, naming the command to run), kRefused (preflight, strict), kNotFound,
// kInvalidInput (bad KERNEL_HUB_LOCAL).
KernelizeReport kernelize(Runtime& runtime, const KernelConfig& config, Hub& hub,
                          const Device& device, const KernelizeOptions& options = {});

// The provider stack kernelize and `kernel-hub resolve/why/lock/pull --config` resolve through
// (registry/index_providers.h): KERNEL_HUB_LOCAL packages, then (offline, under a lock) locked
// refs by their locked index digest, then the hub (indexes and variant manifests through
// Hub::info, each ref asked once; kernel.json from packages already unpacked in the store).
class KernelizeIndexProvider : public IndexProvider {
 public:
  explicit KernelizeIndexProvider(Hub& hub, const LockFile* lock = nullptr);

  void set_lock(const LockFile* lock) { pinned_.set_lock(lock); }
  LocalIndexProvider& local() { return local_; }
  const LocalIndexProvider& local() const { return local_; }

  IndexRecord index(const Ref& ref) override { return local_.index(ref); }
  std::optional<oci::Manifest> manifest(const Ref& ref, const oci::Descriptor& variant) override {
    return local_.manifest(ref, variant);
  }
  std::optional<PackageManifest> package(const Ref& ref, const oci::Descriptor& variant) override {
    return local_.package(ref, variant);
  }

 private:
  HubIndexProvider hub_;
  LockPinnedIndexProvider pinned_;
  LocalIndexProvider local_;
};

// Fetches one variant (its manifest and blobs, by digest) into the hub's store and returns its
// package layer's digest. Unpacks nothing: a package is unpacked (Hub::unpack) only once its
// index passed the trust check. Nothing is fetched when the store has it. *fetched (may be null)
// is set when the hub was asked.
Digest fetch_variant(Hub& hub, const std::string& repo, const oci::Descriptor& variant,
                     const std::optional<oci::Descriptor>& layer, bool* fetched);
// fetch_variant for a lock file's pinned variant and layer.
Digest fetch_lock_target(Hub& hub, const std::string& repo, const LockTarget& target,
                         bool* fetched = nullptr);

}  // namespace kh
