#include "hub/oci/closure.h"

#include <functional>

#include "hub/base/error.h"
#include "hub/oci/oci.h"

namespace kh {

Closure closure_of(const Store& store, const Digest& root) {
  Closure c;
  std::function<void(const Digest&, int)> walk = [&](const Digest& d, int depth) {
    if (depth > 4 || c.manifests.count(d)) return;
    auto bytes = store.read_blob(d, oci::kMaxManifestBytes);
    if (!bytes) {
      c.missing.insert(d);
      return;
    }
    c.manifests.insert(d);
    c.bytes += bytes->size();
    try {
      if (oci::peek_media_type(*bytes) == oci::kMediaTypeIndex) {
        for (auto& m : oci::parse_index(*bytes).manifests) walk(m.digest, depth + 1);
        return;
      }
      oci::Manifest m = oci::parse_manifest(*bytes);
      std::vector<oci::Descriptor> blobs = m.layers;
      blobs.push_back(m.config);
      for (auto& b : blobs) {
        if (!c.blobs.insert(b.digest).second) continue;
        if (store.has_blob(b.digest)) {
          c.bytes += static_cast<uint64_t>(b.size);
        } else {
          c.missing.insert(b.digest);
        }
      }
    } catch (const Error&) {
      // Not a manifest we understand: it is kept, nothing below it is known.
    }
  };
  walk(root, 0);
  return c;
}

}  // namespace kh
