// What a root digest (an index or manifest in the store) needs: itself, every manifest below
// it, every config and layer. Used by ls (sizes) and gc (what the ref records keep alive).
// One graph walk over the store (graph.h): each node once, within GraphLimits, and a graph
// over a limit is refused (kRefused) rather than half-walked (gc would then remove what the
// unwalked part needs).
#pragma once

#include <set>
#include <string_view>

#include "hub/base/digest.h"
#include "hub/oci/graph.h"
#include "hub/store/store.h"

namespace kh {

struct Closure {
  std::set<Digest> manifests;  // the root and every manifest/index below it in the store
  std::set<Digest> blobs;      // configs and layers
  std::set<Digest> layers;     // the layers among them (what may have an unpacked tree)
  std::set<Digest> missing;    // referenced but not in the store (or damaged)
  uint64_t bytes = 0;          // sizes of everything present
};

// `what` names the root in errors (default: its digest). Documents that do not parse are kept
// with nothing below them.
Closure closure_of(const Store& store, const Digest& root, std::string_view what = {},
                   const oci::GraphLimits& limits = {});

}  // namespace kh
