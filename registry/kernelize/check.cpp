#include <fmt/format.h>

#include <optional>

#include "hub/base/error.h"
#include "hub/base/fs.h"
#include "hub/base/log.h"
#include "hub/store/archive.h"
#include "loader/verified_file.h"
#include "registry/kernelize/stages.h"

namespace kh::kernelize_stage {

namespace stdfs = std::filesystem;

// --- check trust ---

Ref TrustChecked::checked_ref(const LayerResolution& r) const {
  return locked_ ? Ref{r.kernel.ref.repo, "", r.index_digest} : r.kernel.ref;
}

std::string TrustChecked::key(const LayerResolution& r) const {
  return checked_ref(r).str() + "|" + r.index_digest.str();
}

std::string TrustChecked::summary(const LayerResolution& r) const {
  auto it = summaries_.find(key(r));
  return it == summaries_.end() ? std::string() : it->second;
}

void check_trust(const std::vector<Planned>& plan, Hub& hub, const trust::TrustStore& keys,
                 const LocalIndexProvider& local, TrustChecked& out) {
  for (auto& p : plan) {
    const LayerResolution& r = p.resolution;
    if (r.fallback || local.find(r.kernel.ref) || out.contains(r)) continue;
    trust::TrustDecision d = hub.check_trust(out.checked_ref(r), r.index_digest, keys);
    if (!d.warning.empty()) log_line(kLogWarn, "kernelize: " + d.warning);
    out.add(r, d.signed_ok ? fmt::format("signed by {} serial {}{}", d.key_id.substr(0, 16),
                                         d.serial, d.in_grace ? " (expired, grace)" : "")
                           : "UNSIGNED (allowed)");
  }
}

// --- verify ---

namespace {

// Where kernel.json and the index's kernelhub.layers annotation first disagree, or "".
std::string layers_difference(const std::map<std::string, PackageLayer>& annotated,
                              const std::map<std::string, PackageLayer>& packaged) {
  for (auto& [name, layer] : annotated) {
    auto it = packaged.find(name);
    if (it == packaged.end()) return fmt::format("layer {} is not in kernel.json", name);
    if (!(it->second == layer))
      return fmt::format("layer {} has other ops, flags or dtypes in kernel.json", name);
  }
  for (auto& [name, layer] : packaged)
    if (!annotated.count(name)) return fmt::format("layer {} is not in the annotation", name);
  return "";
}

// The plan chose this variant on the strength of its index annotation; the package must say the
// same, or the publisher's index describes another package than it ships.
void require_annotation_matches(const LayerResolution& r, const PackageManifest& m) {
  const oci::Descriptor& variant = r.variant->descriptor;
  const std::string& text = variant.annotations.at(std::string(kAnnotationLayers));
  std::string what =
      fmt::format("{} variant {} {}", r.kernel.ref.str(), variant.digest.str(), kAnnotationLayers);
  std::string diff = layers_difference(parse_package_layers(text, what), m.layers);
  if (!diff.empty())
    throw Error(ErrorKind::kIntegrity,
                fmt::format("{}: the index's {} annotation for variant {} does not match the "
                            "package's kernel.json ({}); the index was not written with this "
                            "package: repack and republish it with kernel-hub pack",
                            r.kernel.ref.str(), kAnnotationLayers, variant.digest.str(), diff));
}

// kernel.json's digest as the signed index gives it for the chosen variant, if it does.
std::optional<Digest> signed_manifest_digest(const LayerResolution& r) {
  if (!r.variant) return std::nullopt;
  const auto& ann = r.variant->descriptor.annotations;
  auto it = ann.find(std::string(kAnnotationPackageManifest));
  if (it == ann.end()) return std::nullopt;
  try {
    return Digest::parse(it->second);
  } catch (const Error&) {
    throw Error(
        ErrorKind::kIntegrity,
        fmt::format("{}: the index's {} annotation '{}' is not a sha256 digest; repack "
                    "and republish the package with kernel-hub pack",
                    r.kernel.ref.str(), kAnnotationPackageManifest, it->second.substr(0, 80)));
  }
}

// The digest of the tree's kernel.json; nullopt when it has none.
std::optional<Digest> tree_manifest_digest(const stdfs::path& dir) {
  try {
    return open_verified(dir / kPackageManifestName).digest;
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::kNotFound || e.kind() == ErrorKind::kRefused) return std::nullopt;
    throw;
  }
}

// The variant's package layer: from the plan, or from its manifest (cached by now when the plan
// came from the index alone).
std::optional<oci::Descriptor> package_layer(const LayerResolution& r, Store& store) {
  if (r.package_layer || !r.variant) return r.package_layer;
  if (auto bytes = store.read_blob(r.variant->descriptor.digest, oci::kMaxManifestBytes))
    return package_layer_of(oci::parse_manifest(*bytes, r.kernel.ref.str()));
  return std::nullopt;
}

// kernel.json's digest for an index that names none (packed before
// kernelhub.package-manifest): read from the package layer itself, the blob whose digest the
// signed manifest fixes, through the descriptor that was hashed. The tree is then held to it
// as a newer index holds it, never trusted because it exists.
Digest manifest_digest_from_layer(const LayerResolution& r, Hub& hub) {
  Store& store = hub.store();
  std::optional<oci::Descriptor> layer = package_layer(r, store);
  auto refuse = [&](const std::string& why) {
    return Error(ErrorKind::kIntegrity,
                 fmt::format("{}: its index names no kernel.json digest and {}; nothing was "
                             "loaded (repack and republish it with kernel-hub pack)",
                             r.kernel.ref.str(), why));
  };
  if (!layer || !r.variant) throw refuse("its package layer is unknown");
  if (!store.has_blob(layer->digest))
    hub.pull(Ref{r.kernel.ref.repo, "", r.variant->descriptor.digest});
  const VerifiedFile blob = open_verified(store.blob_path(layer->digest), layer->digest);
  std::optional<std::string> manifest =
      read_archive_member(blob.fd_path(), kPackageManifestName, oci::kMaxManifestBytes);
  if (!manifest) throw refuse("its package layer " + layer->digest.str() + " holds none");
  return sha256_of(*manifest);
}

// An unpacked tree is derived data: when its kernel.json is not the one the signature covers (a
// replaced or planted tree), unpack it again from the blob, whose digest the signed manifest
// fixes (fetched first when the cache does not hold it), once.
void rederive_if_tampered(const LayerResolution& r, const stdfs::path& dir, const Digest& want,
                          Hub& hub) {
  if (tree_manifest_digest(dir) == want) return;
  Store& store = hub.store();
  std::optional<oci::Descriptor> layer_desc = package_layer(r, store);
  if (!layer_desc || !r.variant || dir != store.unpacked_path(layer_desc->digest))
    throw Error(ErrorKind::kIntegrity,
                fmt::format("{}: {} in {} is not the kernel.json the signed index names ({}); "
                            "nothing was loaded. Remove that directory and pull again",
                            r.kernel.ref.str(), kPackageManifestName, dir.string(), want.str()));
  log_warning(
      fmt::format("kernelize: {}: the unpacked package {} does not match its signed "
                  "index; unpacking it again from the verified blob",
                  r.kernel.ref.str(), dir.string()));
  fs::remove_tree(dir);
  const Digest& layer = layer_desc->digest;
  try {
    if (!store.has_blob(layer)) hub.pull(Ref{r.kernel.ref.repo, "", r.variant->descriptor.digest});
    hub.unpack(layer);  // the index passed check_trust before the first unpack
  } catch (const Error& e) {
    throw Error(ErrorKind::kIntegrity,
                fmt::format("{}: the unpacked package did not match its signed index and could "
                            "not be unpacked again ({}); nothing was loaded",
                            r.kernel.ref.str(), e.what()));
  }
  if (tree_manifest_digest(dir) != want)
    throw Error(ErrorKind::kIntegrity,
                fmt::format("{}: the package layer {} holds a kernel.json other than the one the "
                            "signed index names ({}); the publisher's index and package disagree: "
                            "nothing was loaded",
                            r.kernel.ref.str(), layer.str(), want.str()));
}

}  // namespace

Verified verify(const std::vector<Planned>& plan, const LocalIndexProvider& local, Hub& hub_) {
  const HubAddress& hub = hub_.address();
  Verified out;
  std::map<stdfs::path, PackageManifest> manifests;  // hub packages, verified
  for (auto& p : plan) {
    const LayerResolution& r = p.resolution;
    if (r.fallback) continue;
    if (p.source == BindingSource::kLocal) {
      if (out.identity.count(p.dir)) continue;
      const LocalPackage* l = local.find(r.kernel.ref);
      if (l->manifest) {
        verify_package_files(p.dir, *l->manifest);
      } else {
        log_line(kLogInfo,
                 fmt::format("kernelize: local package {} has no \"files\" digests in kernel.json; "
                             "not file-verified",
                             p.dir.string()));
      }
      out.identity[p.dir] = l->identity;
      continue;
    }
    auto it = manifests.find(p.dir);
    if (it == manifests.end()) {
      std::optional<Digest> want = signed_manifest_digest(r);
      if (!want) want = manifest_digest_from_layer(r, hub_);
      rederive_if_tampered(r, p.dir, *want, hub_);
      out.manifest_digest[p.dir] = *want;
      PackageManifest m;
      try {
        m = read_package_manifest(p.dir);
      } catch (const Error& e) {
        throw Error(ErrorKind::kIntegrity,
                    fmt::format("{}: the package from {} has no valid kernel.json ({}); repack it "
                                "with kernel-hub pack",
                                r.kernel.ref.str(), hub.text, e.what()));
      }
      try {
        verify_package_files(p.dir, m);
      } catch (const Error& e) {
        // Name the ref, as every other refusal before a load does.
        throw Error(e.kind(), fmt::format("{}: {}", r.kernel.ref.str(), e.what()));
      }
      out.identity[p.dir] = m.name + "@" + m.version;
      it = manifests.emplace(p.dir, std::move(m)).first;
    }
    if (r.layers_from == LayersSource::kIndexAnnotation) require_annotation_matches(r, it->second);
  }
  return out;
}

}  // namespace kh::kernelize_stage
