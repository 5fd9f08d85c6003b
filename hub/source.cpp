#include "hub/source.h"

namespace kh {

std::unique_ptr<Source> open_source(const HubAddress& address, const SourceOptions& options) {
  if (address.kind == HubAddress::Kind::kRegistry) return open_registry_source(address, options);
  return open_layout_source(address, options);
}

}  // namespace kh
