#include "hub/oci/closure.h"

#include <optional>
#include <string>

#include "hub/base/error.h"
#include "hub/oci/oci.h"

namespace kh {

Closure closure_of(const Store& store, const Digest& root, std::string_view what,
                   const oci::GraphLimits& limits) {
  oci::Descriptor desc;
  desc.digest = root;  // no media type: the document says what it is
  oci::WalkOptions options;
  options.limits = limits;
  options.tolerate_invalid = true;
  std::string label = what.empty() ? root.str() : std::string(what);
  oci::Graph graph = oci::walk_graph(
      desc, label,
      [&](const oci::Descriptor& d) -> std::optional<std::string> {
        try {
          return store.read_blob(d.digest, oci::kMaxManifestBytes);  // verified, or absent
        } catch (const Error&) {
          return std::nullopt;  // too large for a document: nothing below it is known
        }
      },
      options);

  Closure c;
  for (const oci::GraphNode& n : graph.nodes) {
    const Digest& d = n.desc.digest;
    if (oci::is_document(n.kind)) {
      if (n.bytes) {
        c.manifests.insert(d);
        c.bytes += n.bytes->size();
      } else {
        c.missing.insert(d);
      }
      continue;
    }
    if (n.kind == oci::NodeKind::kLayer) c.layers.insert(d);
    if (!c.blobs.insert(d).second) continue;  // a config that is also a layer: counted once
    if (store.has_blob(d)) {
      c.bytes += static_cast<uint64_t>(n.desc.size);
    } else {
      c.missing.insert(d);
    }
  }
  return c;
}

}  // namespace kh
