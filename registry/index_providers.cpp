#include "registry/index_providers.h"

#include <fmt/format.h>

#include "hub/base/error.h"
#include "hub/base/fs.h"
#include "loader/package_dir.h"

namespace kh {

namespace stdfs = std::filesystem;

// --- LockPinnedIndexProvider ---

Ref LockPinnedIndexProvider::pinned(const Ref& ref) const {
  if (lock_ && offline_ && !ref.digest) {
    if (const LockEntry* e = lock_->find(ref)) return Ref{ref.repo, "", e->index_digest};
  }
  return ref;
}

IndexRecord LockPinnedIndexProvider::index(const Ref& ref) {
  IndexRecord rec = inner_.index(pinned(ref));
  rec.ref = ref;  // the ref the config names, for traces and lock checks
  return rec;
}

std::optional<oci::Manifest> LockPinnedIndexProvider::manifest(const Ref& ref,
                                                               const oci::Descriptor& variant) {
  return inner_.manifest(pinned(ref), variant);
}

std::optional<PackageManifest> LockPinnedIndexProvider::package(const Ref& ref,
                                                                const oci::Descriptor& variant) {
  return inner_.package(pinned(ref), variant);
}

// --- LocalIndexProvider ---

void LocalIndexProvider::add(const std::string& repo, const stdfs::path& dir, const Device& device,
                             const ResolveOptions& options) {
  auto p = std::make_shared<LocalPackage>();
  p->dir = dir;
  PackageDir loader_view;
  try {
    loader_view = read_package_dir(dir);
  } catch (const Error& e) {
    throw Error(e.kind(), fmt::format("KERNEL_HUB_LOCAL {}={}: {}", repo, dir.string(), e.what()));
  }
  p->identity = loader_view.name + "@" + loader_view.version;
  std::string text = fs::read_file(dir / kPackageManifestName, kMaxPackageManifestBytes);
  try {
    p->manifest = PackageManifest::parse(text, (dir / kPackageManifestName).string());
  } catch (const Error&) {
    // The loader's short form (name, version, host_library): no layer list, no file digests.
  }
  oci::Descriptor layer;
  layer.media_type = std::string(oci::kMediaTypeLayerTarZstd);
  layer.digest =
      sha256_of("kernel-hub local package\n" + stdfs::absolute(dir).string() + "\n" + text);
  layer.size = static_cast<int64_t>(text.size());
  p->variant_manifest.artifact_type = std::string(oci::kArtifactTypeKernel);
  p->variant_manifest.config = oci::empty_descriptor();
  p->variant_manifest.layers.push_back(layer);
  p->entry = oci::describe(oci::serialize(p->variant_manifest), oci::kMediaTypeManifest);
  p->entry.platform = oci::Platform{device.os, device.arch, ""};
  auto& ann = p->entry.annotations;
  ann[std::string(kAnnotationDevice)] = device.key;
  ann[std::string(kAnnotationAbi)] =
      p->manifest ? fmt::format("{}.{}", p->manifest->abi_major, p->manifest->abi_minor)
                  : fmt::format("{}.{}", options.abi_major, options.abi_minor);
  if (device.is_cuda()) {
    ann[std::string(kAnnotationCudaVersion)] =
        p->manifest && !p->manifest->cuda_version.empty()
            ? p->manifest->cuda_version
            : fmt::format("{}.{}", device.cuda_major, device.cuda_minor);
    std::string sms;
    for (auto& [sm, f] : loader_view.cubins) sms += (sms.empty() ? "" : ",") + sm;
    if (!sms.empty()) ann[std::string(kAnnotationCudaSm)] = sms;
    ann[std::string(kAnnotationSource)] = loader_view.cuda_source.empty() ? "false" : "true";
  }
  oci::Index index;
  index.manifests.push_back(p->entry);
  p->index_digest = sha256_of(oci::serialize(index));
  packages_[repo] = std::move(p);
}

const LocalPackage* LocalIndexProvider::find(const Ref& ref) const {
  auto it = packages_.find(ref.repo);
  return it == packages_.end() ? nullptr : it->second.get();
}

std::optional<LockEntry> LocalIndexProvider::lock_entry(const Ref& ref,
                                                        const Device& device) const {
  const LocalPackage* p = find(ref);
  if (!p) return std::nullopt;
  LockEntry e;
  e.ref = ref;
  e.hub = hub_id_;
  e.index_digest = p->index_digest;
  const oci::Descriptor& layer = p->variant_manifest.layers[0];
  e.targets[device.str()] = LockTarget{p->entry.digest, layer.digest, layer.size};
  return e;
}

IndexRecord LocalIndexProvider::index(const Ref& ref) {
  const LocalPackage* p = find(ref);
  if (!p) return inner_.index(ref);
  IndexRecord rec;
  rec.ref = ref;
  rec.hub_id = hub_id_;
  rec.digest = p->index_digest;
  rec.index.manifests.push_back(p->entry);
  return rec;
}

std::optional<oci::Manifest> LocalIndexProvider::manifest(const Ref& ref,
                                                          const oci::Descriptor& variant) {
  const LocalPackage* p = find(ref);
  return p ? std::optional(p->variant_manifest) : inner_.manifest(ref, variant);
}

std::optional<PackageManifest> LocalIndexProvider::package(const Ref& ref,
                                                           const oci::Descriptor& variant) {
  const LocalPackage* p = find(ref);
  return p ? p->manifest : inner_.package(ref, variant);
}

}  // namespace kh
