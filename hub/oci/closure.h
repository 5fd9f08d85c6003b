// What a root digest (an index or manifest in the store) needs: itself, every manifest below
// it, every config and layer. Used by ls (sizes), gc (roots) and export.
#pragma once

#include <set>

#include "hub/base/digest.h"
#include "hub/store/store.h"

namespace kh {

struct Closure {
  std::set<Digest> manifests;  // the root and every manifest/index below it
  std::set<Digest> blobs;      // configs and layers
  std::set<Digest> missing;    // referenced but not in the store (or damaged)
  uint64_t bytes = 0;          // sizes of everything present
};

Closure closure_of(const Store& store, const Digest& root);

}  // namespace kh
