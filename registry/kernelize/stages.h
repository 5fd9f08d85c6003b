// kernelize's stages (registry/kernelize.h says what the whole does). Each is a function from
// the previous stage's output to its own; registry/kernelize.cpp runs them in order:
//
//   plan         config + slots + modes + device  -> one Planned per (slot, mode)   (no fetch)
//   check_trust  Planned                          -> TrustChecked (signature per index)
//   fetch        Planned + TrustChecked           -> + package directory and source
//   (plan, check and fetch again while a fetch brought a package whose layers the plan did not
//    know: indexes packed before the kernelhub.layers annotation)
//   strict       Planned                          -> kRefused when a mapped layer fell back
//   verify       Planned                          -> Verified (files checked, identities)
//   bind         Planned + TrustChecked + Verified -> KernelizeBinding per (slot, mode)
//
// Nothing is loaded before bind, so a refusal in any earlier stage leaves the runtime as it was;
// nothing is fetched or unpacked before its index passed check_trust (the index digest is known
// after plan), so a refused index leaves nothing unpacked.
#pragma once

#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "hub/hub.h"
#include "registry/index_providers.h"
#include "registry/kernelize.h"

namespace kh::kernelize_stage {

// One (slot, mode) on its way through the stages.
struct Planned {
  LayerResolution resolution;                       // plan
  std::filesystem::path dir;                        // fetch: the package directory
  BindingSource source = BindingSource::kFallback;  // fetch: cache, hub or local
};

struct PlanInput {
  const KernelConfig& config;
  const std::vector<std::string>& slots;  // the runtime's slots (layer name = slot name)
  const std::vector<Mode>& modes;
  const Device& device;
  const ResolveOptions& resolve;  // ABI and the effective lock
};

// Resolves every slot for every mode (mode by mode, as the report lists them), asking the
// provider for each ref once.
std::vector<Planned> plan(const PlanInput& in, IndexProvider& provider);

// Every slot in every mode keeps its fallback, with `note` as the reason (KERNEL_HUB_DISABLE).
std::vector<KernelizeBinding> keep_fallbacks(const std::vector<std::string>& slots,
                                             const std::vector<Mode>& modes,
                                             const std::string& note);

// Strict: kRefused, with the trace, for a layer the config maps for this device that no kernel
// serves.
void require_mapped_served(const std::vector<Planned>& plan, const KernelConfig& config,
                           const Device& device);

// What fetch did across plan rounds, by "repo@variant digest".
struct FetchLog {
  std::set<std::string> downloaded;  // fetched from the hub by this call
  std::set<std::string> learnt;      // fetched while the plan did not know the variant's layers
};

// Signature checks, one per (ref, index).
class TrustChecked {
 public:
  explicit TrustChecked(bool locked) : locked_(locked) {}
  // The ref a resolution's signature is checked for: under a lock, the repo at the locked index.
  Ref checked_ref(const LayerResolution& r) const;
  bool contains(const LayerResolution& r) const { return summaries_.count(key(r)) != 0; }
  void add(const LayerResolution& r, std::string summary) {
    summaries_[key(r)] = std::move(summary);
  }
  // "signed by <keyid> serial N", "UNSIGNED (allowed)"; empty for a resolution not checked.
  std::string summary(const LayerResolution& r) const;

 private:
  std::string key(const LayerResolution& r) const;

  bool locked_;
  std::map<std::string, std::string> summaries_;
};

// Each hub package's index must carry a valid signature by a key trusted for its repo
// (hub/trust/trust_verify.h), online or offline; kRefused otherwise (the hub's policy decides
// about unsigned). Under a lock the digest is the user's pin: any statement for it counts and
// rollback is not checked. Adds the indexes `out` has not checked yet (a later plan round checks
// only what it newly chose); locals are not checked.
void check_trust(const std::vector<Planned>& plan, Hub& hub, const trust::TrustStore& keys,
                 const LocalIndexProvider& local, TrustChecked& out);

// Fetches the chosen variants (manifest and blobs by digest) and unpacks them within the hub's
// unpack budget (Hub::unpack); nothing for locals, which are served where they are. Sets each
// Planned's dir and source. Every hub resolution must be in `trust` (std::logic_error
// otherwise): nothing is fetched or unpacked before its index is trusted. Returns true when a
// package arrived whose layers the plan did not know: plan again, now that its kernel.json is at
// hand.
bool fetch(std::vector<Planned>& plan, Hub& hub, const LocalIndexProvider& local,
           const TrustChecked& trust, FetchLog& log);

struct Verified {
  std::map<std::filesystem::path, std::string> identity;  // package dir -> "name@version"
  // package dir -> kernel.json's digest as the signed index gives it (hub packages whose index
  // carries kernelhub.package-manifest); the loader checks kernel.json against it again from the
  // descriptor it parses, and every file against kernel.json.
  std::map<std::filesystem::path, Digest> manifest_digest;
};

// Checks every package's files against its kernel.json (kIntegrity naming the ref and file), and
// kernel.json against the kernelhub.layers annotation the plan relied on (kIntegrity: the index
// says other layers than the package has). Where the signed index gives kernel.json's digest, an
// unpacked tree that does not match it is derived data gone bad: it is unpacked again from the
// verified blob, and refused (kIntegrity) if it still does not match. Locals without a "files"
// map are logged, not checked.
Verified verify(const std::vector<Planned>& plan, const LocalIndexProvider& local, Hub& hub);

struct BindInput {
  int device_index = kCpuDevice;  // kCpuDevice or the CUDA ordinal
  bool strict = false;
  const TrustChecked& trust;
  const Verified& verified;
};

// Binds each (slot, mode) through the loader (preflight, dlopen, module table); fallbacks are
// reported with their reason. A train binding without a backward op keeps the fallback (strict:
// the loader refuses it).
std::vector<KernelizeBinding> bind(std::vector<Planned> plan, Runtime& runtime,
                                   const BindInput& in);

}  // namespace kh::kernelize_stage
