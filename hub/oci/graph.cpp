#include "hub/oci/graph.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "hub/base/error.h"

namespace kh::oci {

bool is_index(std::string_view media_type) {
  return media_type == kMediaTypeIndex ||
         media_type == "application/vnd.docker.distribution.manifest.list.v2+json";
}

const char* node_kind_name(NodeKind kind) {
  switch (kind) {
    case NodeKind::kIndex:
      return "index";
    case NodeKind::kManifest:
      return "manifest";
    case NodeKind::kConfig:
      return "config";
    case NodeKind::kLayer:
      return "layer";
  }
  return "node";
}

NodeKind document_kind(std::string_view media_type) {
  return is_index(media_type) ? NodeKind::kIndex : NodeKind::kManifest;
}

bool is_manifest(std::string_view media_type) {
  return media_type == kMediaTypeManifest ||
         media_type == "application/vnd.docker.distribution.manifest.v2+json";
}

Document parse_document(std::string_view bytes, NodeKind kind, std::string_view what) {
  Document doc;
  if (kind == NodeKind::kIndex) {
    Index index = parse_index(bytes, what);
    doc.artifact_type = std::move(index.artifact_type);
    doc.children.reserve(index.manifests.size());
    for (auto& d : index.manifests) {
      // An index lists documents only: anything else (a layer posing as a variant) would be
      // fetched from the manifest endpoint and misread.
      if (!is_index(d.media_type) && !is_manifest(d.media_type)) {
        throw Error(ErrorKind::kInvalidInput,
                    fmt::format("{}: lists {} as media type '{}', which is neither an image "
                                "manifest nor an index: an index lists only those (the hub serves "
                                "a malformed index)",
                                what, d.digest.str(), d.media_type));
      }
      doc.children.push_back(Child{document_kind(d.media_type), d});
    }
    return doc;
  }
  Manifest m = parse_manifest(bytes, what);
  doc.artifact_type = std::move(m.artifact_type);
  doc.children.reserve(1 + m.layers.size());
  doc.children.push_back(Child{NodeKind::kConfig, std::move(m.config)});
  for (auto& l : m.layers) doc.children.push_back(Child{NodeKind::kLayer, std::move(l)});
  return doc;
}

namespace {

class Walker {
 public:
  Walker(std::string_view what, const FetchDocument& fetch, const WalkOptions& options)
      : what_(what), fetch_(fetch), options_(options), limits_(options.limits) {}

  Graph run(const Descriptor& root) {
    root_ = root.digest;
    std::optional<std::string> bytes;
    NodeKind kind;
    if (root.media_type.empty()) {
      // The kind is the document's own to say: fetch it first.
      bytes = call_fetch(root);
      kind = document_kind(bytes ? peek_media_type(*bytes) : std::string());
    } else {
      kind = document_kind(root.media_type);
    }
    size_t n = add_node(kind, root, 0);
    if (!root.media_type.empty()) bytes = call_fetch(root);
    expand(n, std::move(bytes));
    return std::move(graph_);
  }

 private:
  enum class State { kOpen, kDone };

  std::optional<std::string> call_fetch(const Descriptor& d) {
    ++graph_.fetches;
    return fetch_(d);
  }

  [[noreturn]] void refuse(size_t n, const std::string& detail, const char* limit,
                           uint64_t value) const {
    const GraphNode& node = graph_.nodes[n];
    throw Error(ErrorKind::kRefused,
                fmt::format("{}: refused the OCI graph under {}: {} {} {}, over the limit {} = {} "
                            "(see \"Graph limits\" in the README). Kernel packages (one index of "
                            "variant manifests) stay far inside the limits: tell whoever "
                            "publishes this graph",
                            what_, root_.str(), node_kind_name(node.kind), node.desc.digest.str(),
                            detail, limit, value));
  }

  // A node reached for the first time: counted against max_nodes and, for configs and layers,
  // max_blob_bytes.
  size_t add_node(NodeKind kind, const Descriptor& d, int depth) {
    size_t n = graph_.nodes.size();
    graph_.nodes.push_back(GraphNode{kind, d, depth, std::nullopt, false, {}, {}});
    state_.push_back(State::kOpen);
    height_.push_back(0);
    deepest_.push_back(n);
    memo_.emplace(std::make_pair(d.digest, kind), n);
    if (graph_.nodes.size() > limits_.max_nodes) {
      refuse(n, fmt::format("is node {} of the walk", graph_.nodes.size()), "max_nodes",
             limits_.max_nodes);
    }
    if (!is_document(kind)) {
      uint64_t size = d.size > 0 ? static_cast<uint64_t>(d.size) : 0;
      if (size > limits_.max_blob_bytes - std::min(blob_bytes_, limits_.max_blob_bytes)) {
        refuse(n,
               fmt::format("({} bytes) brings the configs and layers to {} bytes", size,
                           blob_bytes_ + size),
               "max_blob_bytes", limits_.max_blob_bytes);
      }
      blob_bytes_ += size;
      state_[n] = State::kDone;
      graph_.bottom_up.push_back(n);
    }
    return n;
  }

  [[noreturn]] void refuse_depth(size_t n, int depth) const {
    refuse(n, fmt::format("is {} levels below the root", depth), "max_depth",
           static_cast<uint64_t>(limits_.max_depth));
  }

  // Parses a fetched document and visits its children; `bytes` is what fetch returned for it.
  void expand(size_t n, std::optional<std::string> bytes) {
    GraphNode* node = &graph_.nodes[n];
    const int depth = node->depth;
    Document doc;
    if (bytes) {
      uint64_t size = bytes->size();
      if (size > limits_.max_document_bytes - std::min(document_bytes_, limits_.max_document_bytes))
        refuse(n,
               fmt::format("({} bytes) brings the indexes and manifests fetched to {} bytes", size,
                           document_bytes_ + size),
               "max_document_bytes", limits_.max_document_bytes);
      document_bytes_ += size;
      std::string label =
          fmt::format("{}: {} {}", what_, node_kind_name(node->kind), node->desc.digest.str());
      try {
        doc = parse_document(*bytes, node->kind, label);
      } catch (const Error&) {
        if (!options_.tolerate_invalid) throw;
        node->invalid = true;
      }
      node->bytes = std::move(bytes);
      node->artifact_type = doc.artifact_type;
    }
    if (doc.children.size() > limits_.max_children) {
      refuse(n, fmt::format("lists {} descriptors", doc.children.size()), "max_children",
             limits_.max_children);
    }

    if (options_.prefetch) {
      std::vector<Descriptor> ahead;
      std::set<std::pair<Digest, NodeKind>> seen;
      for (const Child& c : doc.children) {
        auto key = std::make_pair(c.desc.digest, c.kind);
        if (is_document(c.kind) && !memo_.count(key) && seen.insert(key).second)
          ahead.push_back(c.desc);
      }
      if (!ahead.empty()) options_.prefetch(ahead);
    }

    std::set<size_t> listed;
    for (const Child& c : doc.children) {
      size_t child = visit(c, depth + 1);
      if (listed.insert(child).second) graph_.nodes[n].children.push_back(child);
      if (is_document(c.kind) && height_[child] + 1 > height_[n]) {
        height_[n] = height_[child] + 1;
        deepest_[n] = deepest_[child];
      }
    }
    state_[n] = State::kDone;
    graph_.bottom_up.push_back(n);
  }

  // A child at `depth`: the memoized node, or a new one fetched and expanded now.
  size_t visit(const Child& c, int depth) {
    if (auto it = memo_.find(std::make_pair(c.desc.digest, c.kind)); it != memo_.end()) {
      size_t n = it->second;
      if (state_[n] == State::kOpen) {
        throw Error(ErrorKind::kRefused,
                    fmt::format("{}: refused the OCI graph under {}: {} {} lists itself through "
                                "its children (a cycle, which content-addressed documents cannot "
                                "have): the source serves documents that do not match their "
                                "digests",
                                what_, root_.str(), node_kind_name(c.kind), c.desc.digest.str()));
      }
      // Reached again by another path: the documents below it sit deeper on this one.
      if (is_document(c.kind) && depth + height_[n] > limits_.max_depth)
        refuse_depth(deepest_[n], depth + height_[n]);
      return n;
    }
    size_t n = add_node(c.kind, c.desc, depth);
    if (!is_document(c.kind)) return n;
    if (depth > limits_.max_depth) refuse_depth(n, depth);
    expand(n, call_fetch(c.desc));
    return n;
  }

  std::string what_;
  const FetchDocument& fetch_;
  const WalkOptions& options_;
  const GraphLimits& limits_;
  Digest root_;
  Graph graph_;
  std::map<std::pair<Digest, NodeKind>, size_t> memo_;
  std::vector<State> state_;
  std::vector<int> height_;      // document levels below a finished node
  std::vector<size_t> deepest_;  // the document at that depth
  uint64_t document_bytes_ = 0;
  uint64_t blob_bytes_ = 0;
};

}  // namespace

Graph walk_graph(const Descriptor& root, std::string_view what, const FetchDocument& fetch,
                 const WalkOptions& options) {
  return Walker(what, fetch, options).run(root);
}

}  // namespace kh::oci
