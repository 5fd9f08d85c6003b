#include "registry/hub_index_provider.h"

#include "hub/base/error.h"
#include "registry/versions.h"

namespace kh {

const RefInfo& HubIndexProvider::info(const Ref& ref) {
  std::string key = ref.str();
  auto it = infos_.find(key);
  if (it == infos_.end()) {
    try {
      it = infos_.emplace(key, std::make_shared<RefInfo>(hub_.info(ref))).first;
    } catch (const Error& e) {
      // A tag the hub does not have: say which versions it does have.
      if (e.kind() == ErrorKind::kNotFound && !ref.digest)
        throw with_versions_hint(e, hub_, ref.repo);
      throw;
    }
  }
  return *it->second;
}

IndexRecord HubIndexProvider::index(const Ref& ref) {
  const RefInfo& i = info(ref);
  IndexRecord rec;
  rec.ref = ref;
  rec.digest = i.digest;
  rec.hub_id = hub_.address().id();
  rec.index.artifact_type = i.artifact_type;
  rec.index.annotations = i.annotations;
  // Hub::info lists the index's variant manifests (nested indexes left out); a ref naming one
  // manifest comes back as its single variant, described by its own annotations (pack writes
  // them there too), so a manifest copied without its index still resolves.
  bool single = !oci::is_index(i.media_type);
  for (auto& v : i.variants)
    rec.index.manifests.push_back(single ? describe_single_variant(v.descriptor, v.manifest)
                                         : v.descriptor);
  return rec;
}

std::optional<oci::Manifest> HubIndexProvider::manifest(const Ref& ref,
                                                        const oci::Descriptor& variant) {
  for (auto& v : info(ref).variants)
    if (v.descriptor.digest == variant.digest) return v.manifest;
  return std::nullopt;
}

std::optional<PackageManifest> HubIndexProvider::package(const Ref& ref,
                                                         const oci::Descriptor& variant) {
  auto m = manifest(ref, variant);
  auto layer = m ? package_layer_of(*m) : std::nullopt;
  if (!layer) return std::nullopt;
  auto dir = hub_.store().unpacked_path(layer->digest);
  if (!dir) return std::nullopt;
  // A package unpacked in the store was verified when it was stored; a kernel.json that does not
  // parse is reported with its path when kernelize verifies the package.
  try {
    return read_package_manifest(*dir);
  } catch (const Error&) {
    return std::nullopt;
  }
}

Resolution resolve_on_hub(const KernelConfig& config, const Device& device, Mode mode, Hub& hub,
                          const ResolveOptions& options) {
  HubIndexProvider provider(hub);
  return resolve(config, device, mode, provider, options);
}

}  // namespace kh
