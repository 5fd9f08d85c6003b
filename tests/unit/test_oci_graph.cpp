// The one OCI graph walker (hub/oci/graph.h) and its users: graphs whose indexes repeat their
// children (one manifest listed 10000 times; a 20-level chain of indexes each listing the next
// twice, 2^20 paths) cost one visit per distinct node, directly and through Hub::pull, Hub::push,
// closure_of and Store::gc; graphs over a limit (depth, fan-out, nodes, bytes) are refused with
// kRefused naming the root, the limit, its value and the node, by pull and gc alike.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "hub/base/error.h"
#include "hub/hub.h"
#include "hub/oci/closure.h"
#include "hub/oci/graph.h"
#include "hub/oci/oci.h"
#include "hub/store/store.h"
#include "hub/transport/source.h"
#include "tests/fixtures/hostile_hub.h"
#include "tests/fixtures/process.h"

namespace kh {
namespace {

namespace stdfs = std::filesystem;
using oci::Descriptor;
using oci::NodeKind;
using test::TempDir;

constexpr const char* kRepo = "org/graph";
// Generous bound for walks that are linear in distinct nodes (they take milliseconds); the
// naive expansion of the 2^20-path graph would not finish in hours.
constexpr auto kGenerous = std::chrono::seconds(60);

// The graphs (repeated children, chains of indexes, wide indexes) are the hostile hub's.
using test::add_manifest;
using test::document;
using test::index_chain;
using test::repeated_manifest;
using test::TestGraph;
using test::wide_index;

// Documents from memory, verified, each call counted.
struct CountingFetch {
  explicit CountingFetch(const TestGraph& g) : docs(g.by_digest()) {}
  std::optional<std::string> operator()(const Descriptor& d) {
    ++calls[d.digest];
    auto it = docs.find(d.digest);
    if (it == docs.end()) return std::nullopt;
    oci::verify_bytes(d, it->second, "test document");
    return it->second;
  }
  size_t max_calls() const {
    size_t most = 0;
    for (auto& [d, n] : calls) most = std::max(most, n);
    return most;
  }
  std::map<Digest, std::string> docs;
  std::map<Digest, size_t> calls;
};

std::string refused_message(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kRefused) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "expected kRefused";
  return {};
}

void expect_contains(const std::string& text, const std::string& needle) {
  EXPECT_NE(text.find(needle), std::string::npos) << "'" << text << "' lacks '" << needle << "'";
}

template <typename F>
double seconds_of(F&& f) {
  auto start = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// --- the walker itself ---

TEST(OciGraph, ChildrenAreManifestsOfAnIndexAndConfigAndLayersOfAManifest) {
  EXPECT_TRUE(oci::is_index(oci::kMediaTypeIndex));
  EXPECT_TRUE(oci::is_index("application/vnd.docker.distribution.manifest.list.v2+json"));
  EXPECT_FALSE(oci::is_index(oci::kMediaTypeManifest));
  EXPECT_EQ(oci::document_kind(oci::kMediaTypeIndex), NodeKind::kIndex);
  EXPECT_EQ(oci::document_kind(oci::kMediaTypeManifest), NodeKind::kManifest);

  TestGraph g = wide_index(2);
  oci::Document index = oci::parse_document(g.documents.back().second, NodeKind::kIndex, "index");
  ASSERT_EQ(index.children.size(), 2u);
  EXPECT_EQ(index.children[0].kind, NodeKind::kManifest);

  // A subject is not a child: a referrer does not pull in what it refers to.
  oci::Manifest m;
  m.config = g.blobs[0].first;
  m.layers = {g.blobs[1].first};
  m.subject = g.root();
  oci::Document doc = oci::parse_document(oci::serialize(m), NodeKind::kManifest, "manifest");
  ASSERT_EQ(doc.children.size(), 2u);
  EXPECT_EQ(doc.children[0].kind, NodeKind::kConfig);
  EXPECT_EQ(doc.children[1].kind, NodeKind::kLayer);

  // An index lists indexes and manifests only: a layer listed as a variant is refused.
  oci::Index bad;
  bad.manifests = {g.blobs[1].first};
  try {
    oci::parse_document(oci::serialize(bad), NodeKind::kIndex, "index");
    ADD_FAILURE() << "an index listing a layer was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
    expect_contains(e.what(), g.blobs[1].first.digest.str());
    expect_contains(e.what(), "neither an image manifest nor an index");
  }
}

TEST(OciGraph, RepeatedChildrenAreFetchedOnce) {
  TestGraph g = repeated_manifest(10000);
  CountingFetch fetch(g);
  std::vector<size_t> prefetched;
  oci::WalkOptions options;
  options.prefetch = [&](const std::vector<Descriptor>& docs) {
    prefetched.push_back(docs.size());
  };
  oci::Graph graph = oci::walk_graph(g.root(), "test", std::ref(fetch), options);
  EXPECT_EQ(graph.fetches, 2u);  // the index and its one manifest
  EXPECT_EQ(fetch.calls.size(), 2u);
  EXPECT_EQ(fetch.max_calls(), 1u);
  ASSERT_EQ(graph.nodes.size(), 4u);  // index, manifest, config, layer
  EXPECT_EQ(graph.nodes[0].kind, NodeKind::kIndex);
  EXPECT_EQ(graph.nodes[0].children.size(), 1u);  // distinct children
  EXPECT_EQ(prefetched, std::vector<size_t>{1});  // distinct documents ahead, not 10000
}

TEST(OciGraph, ADagOfTwoToTheTwentyPathsCostsOneVisitPerNode) {
  TestGraph g = index_chain(20);
  CountingFetch fetch(g);
  oci::WalkOptions options;
  options.limits.max_depth = 20;
  oci::Graph graph;
  double s =
      seconds_of([&] { graph = oci::walk_graph(g.root(), "test", std::ref(fetch), options); });
  EXPECT_LT(s, kGenerous.count());
  EXPECT_EQ(graph.fetches, 21u);  // 20 indexes and the manifest
  EXPECT_EQ(fetch.max_calls(), 1u);
  EXPECT_EQ(graph.nodes.size(), 23u);
  // bottom_up: every node after its children, each node once, the root last.
  ASSERT_EQ(graph.bottom_up.size(), graph.nodes.size());
  std::set<size_t> done;
  for (size_t n : graph.bottom_up) {
    for (size_t c : graph.nodes[n].children) EXPECT_TRUE(done.count(c)) << n << " before " << c;
    EXPECT_TRUE(done.insert(n).second);
  }
  EXPECT_EQ(graph.bottom_up.back(), 0u);
}

TEST(OciGraph, DepthOverTheLimitIsRefusedNamingRootLimitAndNode) {
  TestGraph g = index_chain(20);
  CountingFetch fetch(g);
  std::string msg =
      refused_message([&] { oci::walk_graph(g.root(), "org/graph@v1", std::ref(fetch)); });
  expect_contains(msg, "org/graph@v1");
  expect_contains(msg, g.root().digest.str());
  expect_contains(msg, "max_depth = 4");
  expect_contains(msg, "5 levels below the root");
  // The node: the index 5 levels down (documents are pushed deepest first).
  expect_contains(msg, "index " + g.documents[g.documents.size() - 6].first.digest.str());
  EXPECT_LE(fetch.calls.size(), 5u);  // refused before fetching past the limit
}

TEST(OciGraph, EveryPathCountsForDepthWhicheverIsWalkedFirst) {
  // `shallow` is an index with a manifest 3 levels below it; the root lists it directly and
  // through `detour`, which puts it 2 levels down: 2 + 3 = 5 > 4, in either order.
  TestGraph g = index_chain(3);
  const Descriptor shallow = g.root();
  const Descriptor manifest = g.documents.front().first;
  oci::Index detour;
  detour.manifests = {shallow};
  g.documents.push_back(document(detour));
  const Descriptor deep = g.documents.back().first;
  for (bool deep_first : {true, false}) {
    TestGraph h = g;
    oci::Index root;
    root.manifests = deep_first ? std::vector<Descriptor>{deep, shallow}
                                : std::vector<Descriptor>{shallow, deep};
    h.documents.push_back(document(root));
    CountingFetch fetch(h);
    std::string msg = refused_message([&] { oci::walk_graph(h.root(), "t", std::ref(fetch)); });
    expect_contains(msg, "max_depth = 4");
    expect_contains(msg, "manifest " + manifest.digest.str() + " is 5 levels below the root");
    EXPECT_EQ(fetch.max_calls(), 1u);
  }
  // One level less is within the limit.
  oci::Index root;
  root.manifests = {shallow, shallow};
  g.documents.push_back(document(root));
  CountingFetch fetch(g);
  EXPECT_EQ(oci::walk_graph(g.root(), "t", std::ref(fetch)).fetches,
            5u);  // root, 3 indexes, manifest
}

TEST(OciGraph, FanOutNodesAndBytesOverTheLimitsAreRefused) {
  TestGraph many = repeated_manifest(101);
  CountingFetch fetch(many);
  oci::WalkOptions options;
  options.limits.max_children = 100;
  std::string msg =
      refused_message([&] { oci::walk_graph(many.root(), "t", std::ref(fetch), options); });
  expect_contains(msg, "max_children = 100");
  expect_contains(msg, "index " + many.root().digest.str() + " lists 101 descriptors");
  options.limits.max_children = 101;
  EXPECT_NO_THROW(oci::walk_graph(many.root(), "t", std::ref(fetch), options));

  TestGraph wide = wide_index(5);  // 1 + 5 * 3 = 16 nodes
  CountingFetch wide_fetch(wide);
  options = {};
  options.limits.max_nodes = 15;
  msg = refused_message([&] { oci::walk_graph(wide.root(), "t", std::ref(wide_fetch), options); });
  expect_contains(msg, "max_nodes = 15");
  expect_contains(msg, "is node 16 of the walk");
  options.limits.max_nodes = 16;
  EXPECT_NO_THROW(oci::walk_graph(wide.root(), "t", std::ref(wide_fetch), options));

  options = {};
  options.limits.max_blob_bytes = 1000;  // each layer is over 1000 bytes
  msg = refused_message([&] { oci::walk_graph(wide.root(), "t", std::ref(wide_fetch), options); });
  expect_contains(msg, "max_blob_bytes = 1000");
  expect_contains(msg, "layer ");

  options = {};
  options.limits.max_document_bytes = wide.root().size;  // the root fits, its first child not
  msg = refused_message([&] { oci::walk_graph(wide.root(), "t", std::ref(wide_fetch), options); });
  expect_contains(msg, "max_document_bytes = " + std::to_string(wide.root().size));
  expect_contains(msg, "manifest " + wide.documents.front().first.digest.str());
}

TEST(OciGraph, ACycleIsRefusedNotFollowed) {
  // Content addressing rules cycles out; a fetch function that ignores digests must still not
  // make the walk loop. Both documents claim digests they do not have.
  Descriptor a, b;
  a.media_type = b.media_type = std::string(oci::kMediaTypeIndex);
  a.digest = sha256_of("a");
  b.digest = sha256_of("b");
  oci::Index ia, ib;
  ia.manifests = {b};
  ib.manifests = {a};
  size_t calls = 0;
  auto fetch = [&](const Descriptor& d) -> std::optional<std::string> {
    ++calls;
    return oci::serialize(d.digest == a.digest ? ia : ib);
  };
  oci::WalkOptions options;
  options.limits.max_depth = 1000;
  std::string msg = refused_message([&] { oci::walk_graph(a, "t", fetch, options); });
  expect_contains(msg, "cycle");
  EXPECT_EQ(calls, 2u);
}

TEST(OciGraph, AbsentAndInvalidDocumentsAreLeavesWhenTolerated) {
  TestGraph g = wide_index(2);
  CountingFetch fetch(g);
  fetch.docs.erase(g.documents[0].first.digest);         // the first manifest is absent
  fetch.docs[g.documents[1].first.digest] = "not json";  // the second does not parse
  auto tolerant = [&](const Descriptor& d) -> std::optional<std::string> {
    ++fetch.calls[d.digest];
    auto it = fetch.docs.find(d.digest);
    return it == fetch.docs.end() ? std::nullopt : std::optional<std::string>(it->second);
  };
  oci::WalkOptions options;
  options.tolerate_invalid = true;
  oci::Graph graph = oci::walk_graph(g.root(), "t", tolerant, options);
  ASSERT_EQ(graph.nodes.size(), 3u);
  EXPECT_FALSE(graph.nodes[1].bytes.has_value());
  EXPECT_TRUE(graph.nodes[2].invalid);
  EXPECT_TRUE(graph.nodes[2].children.empty());
  // Not tolerated: the parse error, naming the walk and the document.
  try {
    oci::walk_graph(g.root(), "org/graph@v1", tolerant);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
    expect_contains(e.what(), "org/graph@v1: manifest " + g.documents[1].first.digest.str());
  }
}

// --- pull and push through a layout hub ---

// Writes g into the hub directory at dir, tagged v1.
void publish(const TestGraph& g, const stdfs::path& dir) {
  test::HostileHub::layout(dir).publish(g, kRepo, "v1");
}

HubOptions hub_options() {
  HubOptions o;
  o.progress = false;
  return o;
}

class GraphHub : public ::testing::Test {
 protected:
  PullReport pull(const TestGraph& g, const HubOptions& options = hub_options()) {
    publish(g, hub_.path());
    Hub hub(HubAddress::parse(hub_.path().string(), false), store_, options);
    return hub.pull(Ref::parse(std::string(kRepo) + "@v1"));
  }
  TempDir hub_{"kh-graph-hub"};
  TempDir cache_{"kh-graph-cache"};
  Store store_{cache_.path()};
};

TEST_F(GraphHub, PullsAnIndexListingOneManifest10000Times) {
  TestGraph g = repeated_manifest(10000);
  PullReport report;
  double s = seconds_of([&] { report = pull(g); });
  EXPECT_LT(s, kGenerous.count());
  EXPECT_EQ(report.manifests, 1u);
  EXPECT_EQ(report.blobs, 2u);
  EXPECT_EQ(report.blobs_downloaded, 2u);
  for (auto& [d, bytes] : g.blobs) EXPECT_TRUE(store_.has_blob(d.digest));
}

TEST_F(GraphHub, PullsAndPushesA2To20PathDagOnceEach) {
  TestGraph g = index_chain(20);
  HubOptions options = hub_options();
  options.graph_limits.max_depth = 20;
  PullReport report;
  double s = seconds_of([&] { report = pull(g, options); });
  EXPECT_LT(s, kGenerous.count());
  EXPECT_EQ(report.manifests, 1u);
  EXPECT_EQ(report.blobs, 2u);
  for (auto& [d, bytes] : g.documents) EXPECT_TRUE(store_.has_blob(d.digest));

  // Push the same graph from the hub's layout directory to a second hub: each document once,
  // children first (a layout hub refuses a manifest whose children are not there yet).
  TempDir second("kh-graph-hub2");
  Hub target(HubAddress::parse(second.path().string(), false), store_, options);
  PushReport pushed;
  s = seconds_of([&] { pushed = target.push(hub_.path() / kRepo, Ref::parse("org/copy@v1")); });
  EXPECT_LT(s, kGenerous.count());
  EXPECT_EQ(pushed.blobs_uploaded, 2u);
  for (auto& [d, bytes] : g.documents)
    EXPECT_TRUE(stdfs::exists(second.path() / "org/copy/blobs/sha256" / d.digest.hex));
}

TEST_F(GraphHub, PullRefusesGraphsOverTheLimits) {
  TestGraph chain = index_chain(20);
  std::string msg = refused_message([&] { pull(chain); });  // default limits: depth 4
  expect_contains(msg, "org/graph@v1");
  expect_contains(msg, chain.root().digest.str());
  expect_contains(msg, "max_depth = 4");

  HubOptions options = hub_options();
  options.graph_limits.max_children = 1000;
  msg = refused_message([&] { pull(repeated_manifest(10000), options); });
  expect_contains(msg, "max_children = 1000");
  expect_contains(msg, "lists 10000 descriptors");

  options = hub_options();
  options.graph_limits.max_nodes = 10;
  msg = refused_message([&] { pull(wide_index(5), options); });
  expect_contains(msg, "max_nodes = 10");
  // Nothing of a refused graph is recorded as pulled.
  EXPECT_TRUE(store_.list_refs().empty());
}

// --- closure_of and gc over the store ---

void put(Store& store, const TestGraph& g) {
  for (auto& [d, bytes] : g.blobs) store.put_blob(d, bytes);
  for (auto& [d, bytes] : g.documents) store.put_blob(d, bytes);
  store.write_ref({"dir/test", kRepo, "v1", g.root().digest, 0});
}

class GraphStore : public ::testing::Test {
 protected:
  // What gc removes with no grace period: an orphan, unless the walk is refused.
  GcResult gc(const oci::GraphLimits& limits = {}) {
    GcOptions o;
    o.grace_s = 0;
    o.graph_limits = limits;
    return store_.gc(o);
  }
  void put_orphan() { store_.put_blob(oci::describe(orphan_, "x/y"), orphan_); }
  bool has_orphan() const { return store_.has_blob(sha256_of(orphan_)); }

  TempDir cache_{"kh-graph-store"};
  Store store_{cache_.path()};
  std::string orphan_ = "an orphan blob";
};

TEST_F(GraphStore, ClosureAndGcOfRepeatedChildren) {
  TestGraph g = repeated_manifest(10000);
  put(store_, g);
  put_orphan();
  Closure c;
  double s = seconds_of([&] { c = closure_of(store_, g.root().digest); });
  EXPECT_LT(s, kGenerous.count());
  EXPECT_EQ(c.manifests.size(), 2u);
  EXPECT_EQ(c.blobs.size(), 2u);
  EXPECT_EQ(c.layers.size(), 1u);
  EXPECT_TRUE(c.missing.empty());
  GcResult res = gc();
  EXPECT_EQ(res.removed_entries, 1u);
  EXPECT_FALSE(has_orphan());
  for (auto& [d, bytes] : g.documents) EXPECT_TRUE(store_.has_blob(d.digest));
  for (auto& [d, bytes] : g.blobs) EXPECT_TRUE(store_.has_blob(d.digest));
}

TEST_F(GraphStore, ClosureAndGcOfA2To20PathDag) {
  TestGraph g = index_chain(20);
  put(store_, g);
  put_orphan();
  oci::GraphLimits limits;
  limits.max_depth = 20;
  Closure c;
  double s = seconds_of([&] { c = closure_of(store_, g.root().digest, "t", limits); });
  EXPECT_LT(s, kGenerous.count());
  EXPECT_EQ(c.manifests.size(), 21u);
  EXPECT_EQ(c.blobs.size(), 2u);
  s = seconds_of([&] { gc(limits); });
  EXPECT_LT(s, kGenerous.count());
  EXPECT_FALSE(has_orphan());
  for (auto& [d, bytes] : g.documents) EXPECT_TRUE(store_.has_blob(d.digest));
  for (auto& [d, bytes] : g.blobs) EXPECT_TRUE(store_.has_blob(d.digest));
}

TEST_F(GraphStore, GcAndClosureRefuseGraphsOverTheLimitsAndRemoveNothing) {
  TestGraph chain = index_chain(20);
  put(store_, chain);
  put_orphan();
  std::string msg = refused_message([&] { closure_of(store_, chain.root().digest); });
  expect_contains(msg, chain.root().digest.str());
  expect_contains(msg, "max_depth = 4");
  msg = refused_message([&] { gc(); });
  expect_contains(msg, "gc: org/graph@v1");
  expect_contains(msg, chain.root().digest.str());
  expect_contains(msg, "max_depth = 4");
  expect_contains(msg, "gc removed nothing");
  EXPECT_TRUE(has_orphan());
  for (auto& [d, bytes] : chain.documents) EXPECT_TRUE(store_.has_blob(d.digest));

  Store fan_store(cache_.path() / "fan");
  put(fan_store, repeated_manifest(10000));
  GcOptions o;
  o.grace_s = 0;
  o.graph_limits.max_children = 1000;
  msg = refused_message([&] { fan_store.gc(o); });
  expect_contains(msg, "max_children = 1000");

  Store wide_store(cache_.path() / "wide");
  put(wide_store, wide_index(5));
  o = {};
  o.grace_s = 0;
  o.graph_limits.max_nodes = 10;
  msg = refused_message([&] { wide_store.gc(o); });
  expect_contains(msg, "max_nodes = 10");
}

}  // namespace
}  // namespace kh
