// Index providers that wrap another one, so that kernelize and the CLI resolve through a stack:
//
//   LocalIndexProvider -> LockPinnedIndexProvider -> HubIndexProvider   (MemoIndexProvider on top
//                                                                        per resolution pass)
//
// - LocalIndexProvider serves the repos KERNEL_HUB_LOCAL names from package directories, as a
//   one-variant index that fits the device as far as the package's device code allows; every
//   other repo goes to the provider below.
// - LockPinnedIndexProvider, under a lock and offline, asks for a locked tag by its locked index
//   digest (no ref record needed); otherwise it passes refs through.
// - HubIndexProvider (hub_index_provider.h) asks the hub; MemoIndexProvider (resolver.h) asks
//   each ref once.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "registry/device.h"
#include "registry/lock_file.h"
#include "registry/package_manifest.h"
#include "registry/resolver.h"

namespace kh {

class LockPinnedIndexProvider : public IndexProvider {
 public:
  LockPinnedIndexProvider(IndexProvider& inner, bool offline) : inner_(inner), offline_(offline) {}

  void set_lock(const LockFile* lock) { lock_ = lock; }

  IndexRecord index(const Ref& ref) override;
  std::optional<oci::Manifest> manifest(const Ref& ref, const oci::Descriptor& variant) override;
  std::optional<PackageManifest> package(const Ref& ref, const oci::Descriptor& variant) override;

 private:
  // The ref asked for below: by its locked index digest when offline under a lock.
  Ref pinned(const Ref& ref) const;

  IndexProvider& inner_;
  bool offline_;
  const LockFile* lock_ = nullptr;
};

// A KERNEL_HUB_LOCAL package directory.
struct LocalPackage {
  std::filesystem::path dir;
  std::string identity;                     // "name@version" from kernel.json
  std::optional<PackageManifest> manifest;  // when kernel.json is in the full registry form
  Digest index_digest;                      // of the one-variant index presenting it
  oci::Manifest variant_manifest;
  oci::Descriptor entry;  // the index entry (platform and annotations for the device)
};

class LocalIndexProvider : public IndexProvider {
 public:
  // hub_id: what index records and lock entries of local packages name.
  LocalIndexProvider(IndexProvider& inner, std::string hub_id)
      : inner_(inner), hub_id_(std::move(hub_id)) {}

  // Reads the package directory now (kernel.json; kNotFound / kInvalidInput naming it).
  void add(const std::string& repo, const std::filesystem::path& dir, const Device& device,
           const ResolveOptions& options);
  // The local package serving ref, or nullptr.
  const LocalPackage* find(const Ref& ref) const;
  // A lock entry that accepts the local package for ref on device (locals are not lock-checked).
  std::optional<LockEntry> lock_entry(const Ref& ref, const Device& device) const;

  IndexRecord index(const Ref& ref) override;
  std::optional<oci::Manifest> manifest(const Ref& ref, const oci::Descriptor& variant) override;
  std::optional<PackageManifest> package(const Ref& ref, const oci::Descriptor& variant) override;

 private:
  IndexProvider& inner_;
  std::string hub_id_;
  std::map<std::string, std::shared_ptr<const LocalPackage>> packages_;  // by repo
};

}  // namespace kh
