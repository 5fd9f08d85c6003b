// The resolver's IndexProvider on top of kh::Hub: indexes and variant manifests through
// Hub::info() (online, or from the cache's ref records when offline; a tag resolved on the hub is
// recorded by the hub), kernel.json from packages already unpacked in the store. Each ref is
// asked for once per provider. registry/index_providers.h stacks local packages and lock pins on
// top of it.
#pragma once

#include <map>
#include <memory>

#include "hub/hub.h"
#include "registry/resolver.h"

namespace kh {

class HubIndexProvider : public IndexProvider {
 public:
  explicit HubIndexProvider(Hub& hub) : hub_(hub) {}

  IndexRecord index(const Ref& ref) override;
  std::optional<oci::Manifest> manifest(const Ref& ref, const oci::Descriptor& variant) override;
  // kernel.json of the variant's layer when the store has it unpacked; nullopt otherwise.
  std::optional<PackageManifest> package(const Ref& ref, const oci::Descriptor& variant) override;

 private:
  const RefInfo& info(const Ref& ref);

  Hub& hub_;
  std::map<std::string, std::shared_ptr<RefInfo>> infos_;
};

// resolve() against a hub.
Resolution resolve_on_hub(const KernelConfig& config, const Device& device, Mode mode, Hub& hub,
                          const ResolveOptions& options = {});

}  // namespace kh
