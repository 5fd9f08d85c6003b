#include <fmt/format.h>

#include <stdexcept>

#include "hub/base/error.h"
#include "registry/kernelize/stages.h"

namespace kh {

namespace stdfs = std::filesystem;

Digest fetch_variant(Hub& hub, const std::string& repo, const oci::Descriptor& variant,
                     const std::optional<oci::Descriptor>& layer, bool* fetched) {
  Store& store = hub.store();
  if (fetched) *fetched = false;
  // Already at hand: the tree (checked against the signed index by verify, re-derived from the
  // blob when it does not match) or the blobs.
  if (layer && (store.unpacked_path(layer->digest) ||
                (store.has_blob(variant.digest) && store.has_blob(layer->digest))))
    return layer->digest;
  PullReport r = hub.pull(Ref{repo, "", variant.digest});
  if (fetched) *fetched = !r.from_cache;
  auto bytes = store.read_blob(variant.digest, oci::kMaxManifestBytes);
  if (!bytes)
    throw Error(ErrorKind::kIntegrity, fmt::format("{}@{}: the variant manifest vanished from the "
                                                   "cache after the pull; run it again",
                                                   repo, variant.digest.str()));
  oci::Manifest m = oci::parse_manifest(*bytes, repo + "@" + variant.digest.str());
  auto pkg = package_layer_of(m);
  if (!pkg)
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("{}@{}: the variant manifest has no tar+zstd package layer; repack it "
                            "with kernel-hub pack",
                            repo, variant.digest.str()));
  if (layer && pkg->digest != layer->digest)
    throw Error(ErrorKind::kIntegrity,
                fmt::format("{}@{}: package layer digest mismatch: expected {}, found {}", repo,
                            variant.digest.str(), layer->digest.str(), pkg->digest.str()));
  return pkg->digest;
}

Digest fetch_lock_target(Hub& hub, const std::string& repo, const LockTarget& target,
                         bool* fetched) {
  oci::Descriptor variant;
  variant.media_type = std::string(oci::kMediaTypeManifest);
  variant.digest = target.manifest_digest;
  oci::Descriptor layer;
  layer.media_type = std::string(oci::kMediaTypeLayerTarZstd);
  layer.digest = target.layer_digest;
  layer.size = target.layer_size;
  return fetch_variant(hub, repo, variant, layer, fetched);
}

namespace kernelize_stage {

bool fetch(std::vector<Planned>& plan, Hub& hub, const LocalIndexProvider& local,
           const TrustChecked& trust, FetchLog& log) {
  bool learnt = false;
  for (auto& p : plan) {
    const LayerResolution& r = p.resolution;
    if (r.fallback) continue;
    if (const LocalPackage* l = local.find(r.kernel.ref)) {
      p.dir = l->dir;
      p.source = BindingSource::kLocal;
      continue;
    }
    // The order is the point: nothing a hub serves is expanded before its index is trusted.
    if (!trust.contains(r))
      throw std::logic_error("kernelize: fetch before the trust check of " + r.kernel.ref.str());
    const oci::Descriptor& variant = r.variant->descriptor;
    bool fetched = false;
    try {
      p.dir = hub.unpack(fetch_variant(hub, r.kernel.ref.repo, variant, r.package_layer, &fetched));
    } catch (const Error& e) {
      // The variant is fetched by digest: name the ref the config asked for too.
      throw Error(e.kind(), fmt::format("{}: {}", r.kernel.ref.str(), e.what()));
    }
    std::string key = r.kernel.ref.repo + "@" + variant.digest.str();
    if (fetched) log.downloaded.insert(key);
    if (r.layers_from == LayersSource::kUnknown && log.learnt.insert(key).second) learnt = true;
    p.source = log.downloaded.count(key) ? BindingSource::kHub : BindingSource::kCache;
  }
  return learnt;
}

}  // namespace kernelize_stage
}  // namespace kh
