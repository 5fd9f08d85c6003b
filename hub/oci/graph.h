// The one walk over an OCI graph (index -> manifests -> config and layers), shared by pull and
// push (hub.cpp), ls and gc (closure.cpp, store.cpp), export and import (mirror.cpp). Modelled
// on oras-go's content.Successors (what a node's children are) and CopyGraph (a memoized walk
// that fetches each node once); where the documents come from is the caller's fetch function.
//
// Children (document_children):
//   index    -> manifests[]: each an index when is_index(its mediaType), else a manifest
//   manifest -> config, layers[] (leaves: the walk never fetches them)
// A subject is not a child. It points from a referrer (a signature) to what it signs: following
// it would make every referrer pull the package it signs, and kernel-hub fetches signatures by
// their subject (the referrers API or tag), never the other way round.
//
// Memoized: a node is one (digest, kind) pair, fetched and expanded once however many parents
// list it, so an index that lists one manifest 10000 times, or a chain of indexes each listing
// the next twice (2^depth paths), costs one visit per distinct node. A cycle cannot occur in
// content-addressed documents (a document would have to contain its own digest); one that a
// fetch function makes up anyway is refused, never followed.
//
// Limits (GraphLimits, one set for every walk): exceeding one throws kRefused naming the walk
// (`what`), the root digest, the limit and its value, and the node where it was exceeded.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "hub/oci/oci.h"

namespace kh::oci {

// The media types of an index: the OCI image index and the Docker manifest list (whose
// documents parse_index then refuses: kernel-hub reads OCI documents only).
bool is_index(std::string_view media_type);

// The media types of a manifest: the OCI image manifest and the Docker image manifest (refused
// by parse_manifest like the Docker list). An index lists only indexes and manifests.
bool is_manifest(std::string_view media_type);

enum class NodeKind { kIndex, kManifest, kConfig, kLayer };
const char* node_kind_name(NodeKind kind);  // "index", "manifest", "config", "layer"
inline bool is_document(NodeKind kind) {
  return kind == NodeKind::kIndex || kind == NodeKind::kManifest;
}
// The kind of the document a descriptor of this media type points at: an index when
// is_index, else a manifest (an index lists nothing else).
NodeKind document_kind(std::string_view media_type);

struct Child {
  NodeKind kind;
  Descriptor desc;
};

// A parsed index or manifest: its artifactType and its children, in listed order, repeats kept.
struct Document {
  std::string artifact_type;
  std::vector<Child> children;
};
// Parses bytes as `kind` (kIndex or kManifest). kInvalidInput naming `what` when they do not,
// or when an index lists a descriptor that is neither an index nor a manifest.
Document parse_document(std::string_view bytes, NodeKind kind, std::string_view what);

// Bounds on one walk. The defaults leave room far beyond a kernel package (one index of tens
// of variants, each with a config and a few layers) while refusing graphs built to exhaust
// time, memory or disk. Each document is also capped at kMaxManifestBytes when fetched.
struct GraphLimits {
  // Edges from the root to the deepest document: 4 allows indexes nested 4 deep below the root
  // (a kernel package needs 1: index -> variant manifests). Any path counts, not just the first.
  int max_depth = 4;
  // Descriptors one index or manifest lists, repeats included.
  size_t max_children = 16384;
  // Distinct nodes (indexes, manifests, configs, layers) in one walk.
  size_t max_nodes = 65536;
  // Total bytes of the indexes and manifests fetched.
  uint64_t max_document_bytes = 64ull << 20;
  // Total size of the distinct configs and layers, as their descriptors report it (1 TiB).
  uint64_t max_blob_bytes = 1ull << 40;
};

struct GraphNode {
  NodeKind kind = NodeKind::kManifest;
  Descriptor desc;  // as first listed (the root: as given)
  int depth = 0;    // edges from the root where the walk first reached it
  // Documents: the bytes fetch returned. nullopt for configs and layers, and for a document
  // fetch did not return (absent, or a branch the caller does not follow).
  std::optional<std::string> bytes;
  bool invalid = false;          // a document that did not parse (WalkOptions::tolerate_invalid)
  std::string artifact_type;     // of a document that parsed
  std::vector<size_t> children;  // into Graph::nodes: distinct, in listed order
};

struct Graph {
  std::vector<GraphNode> nodes;   // nodes[0] is the root, the rest in order of discovery
  std::vector<size_t> bottom_up;  // every node after all nodes below it (the order to push in)
  size_t fetches = 0;             // calls to fetch (one per distinct document reached)
};

// The bytes of a document (index or manifest) as d names it, verified against d by the
// function; nullopt when absent (the node is kept without children). Throw to stop the walk.
using FetchDocument = std::function<std::optional<std::string>(const Descriptor& d)>;
// Called with the distinct documents a node lists that the walk has not reached yet, just
// before it fetches them one by one (a remote source fetches them in parallel meanwhile).
using PrefetchDocuments = std::function<void(const std::vector<Descriptor>&)>;

struct WalkOptions {
  GraphLimits limits;
  // A document that does not parse is kept as a leaf (invalid) instead of failing the walk:
  // ls and gc keep what they cannot understand. Limits are enforced either way.
  bool tolerate_invalid = false;
  PrefetchDocuments prefetch;
};

// Walks the graph under root. `what` names the walk in errors ("acme/rmsnorm@v1", "push DIR").
// The root's kind comes from root.media_type, or when that is empty from the document's own
// mediaType (a manifest when it has none).
Graph walk_graph(const Descriptor& root, std::string_view what, const FetchDocument& fetch,
                 const WalkOptions& options = {});

}  // namespace kh::oci
