// The download client under injected faults: docker-registry 2.8.2 behind FaultProxy.
#include <gtest/gtest.h>

#include <chrono>

#include "hub/base/base64.h"
#include "hub/base/error.h"
#include "hub/hub.h"
#include "hub/store/store.h"
#include "hub/transport/source.h"
#include "tests/fixtures/fault_proxy.h"
#include "tests/fixtures/registry_fixture.h"
#include "tests/integration/blob_test_helpers.h"

namespace kh::test {
namespace {

using Clock = std::chrono::steady_clock;
using Rule = FaultProxy::Rule;
using Action = FaultProxy::Action;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

class FaultTest : public ::testing::Test {
 protected:
  RegistryFixture reg;
  TempDir tmp{"kh-fault-test"};
  std::unique_ptr<FaultProxy> proxy;
  std::string blob;
  oci::Descriptor desc;
  const std::string repo = "org/faulty";

  void SetUp() override {
    if (!reg.available()) GTEST_SKIP() << reg.why();
    auto direct = registry_source(reg.oci_url(), fast_source_options());
    blob = test_bytes(2 << 20, 42);
    desc = layer_descriptor(blob);
    push_bytes(*direct, repo, tmp.path(), blob, desc);
    proxy = std::make_unique<FaultProxy>(reg.port());
  }

  // Fetches the blob through the proxy; returns the fetch result and the sink's state.
  BlobFetch fetch(MemorySink& sink, SourceOptions o = fast_source_options()) {
    auto via = registry_source(proxy->oci_url(), o);
    std::vector<BlobFetch> blobs{blob_fetch(desc, &sink)};
    via->fetch_blobs(repo, blobs, nullptr);
    return blobs[0];
  }

  std::vector<FaultProxy::Seen> blob_gets() const {
    std::vector<FaultProxy::Seen> out;
    for (auto& s : proxy->requests()) {
      if (s.method == "GET" && s.target.find("/blobs/") != std::string::npos) out.push_back(s);
    }
    return out;
  }
};

uint64_t range_start(const std::string& range) {
  // "bytes=<n>-"
  EXPECT_TRUE(range.starts_with("bytes=")) << range;
  return std::strtoull(range.c_str() + 6, nullptr, 10);
}

TEST_F(FaultTest, ResetMidBlobResumesWithRange) {
  proxy->add_rule({"GET", "/blobs/", Action::kReset, 1, 300000});
  MemorySink sink(desc);
  BlobFetch r = fetch(sink);
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_TRUE(sink.finish());
  auto gets = blob_gets();
  ASSERT_EQ(gets.size(), 2u);
  EXPECT_TRUE(gets[0].range.empty());
  uint64_t start = range_start(gets[1].range);
  EXPECT_GT(start, 0u);
  EXPECT_LE(start, 300000u);
  EXPECT_EQ(sink.restarts(), 0);
}

TEST_F(FaultTest, StallTimesOutAndRetries) {
  // Stall early: libcurl averages speed over ~5 s, so a fast start would delay detection.
  proxy->add_rule({"GET", "/blobs/", Action::kStall, 1, 1000, 20});
  SourceOptions o = fast_source_options();
  o.http.low_speed_time_s = 2;
  MemorySink sink(desc);
  auto t0 = Clock::now();
  BlobFetch r = fetch(sink, o);
  double took = seconds_since(t0);
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_TRUE(sink.finish());
  EXPECT_GE(took, 1.5);
  EXPECT_LT(took, 15.0);
  auto gets = blob_gets();
  ASSERT_EQ(gets.size(), 2u);
  EXPECT_GT(range_start(gets[1].range), 0u);
}

// A blob that keeps coming just fast enough to pass the stall check (here: stall detection
// effectively off, the proxy holding the socket) ends at the overall deadline, attempts included.
TEST_F(FaultTest, ABlobThatNeverFinishesEndsAtTheTransferDeadline) {
  proxy->add_rule({"GET", "/blobs/", Action::kStall, 10, 1000, 60});
  SourceOptions o = fast_source_options();
  o.http.low_speed_time_s = 600;
  o.http.transfer_deadline_s = 2;
  o.http.max_attempts = 5;
  MemorySink sink(desc);
  auto t0 = Clock::now();
  BlobFetch r = fetch(sink, o);
  double took = seconds_since(t0);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find("did not complete within 2 s"), std::string::npos) << r.error;
  EXPECT_NE(r.error.find("KERNEL_HUB_TRANSFER_TIMEOUT_S"), std::string::npos) << r.error;
  EXPECT_GE(took, 1.5);
  EXPECT_LT(took, 20.0);
}

// A hub serving many slow documents, each well within its own request limit, cannot hold a
// command for their sum: the command deadline (KERNEL_HUB_COMMAND_TIMEOUT_S, here 2 s, started
// when the client is made) ends it, naming the request in flight. Without it: ~6 x 3 s.
TEST_F(FaultTest, SlowDocumentsEndAtTheCommandDeadline) {
  auto direct = registry_source(reg.oci_url(), fast_source_options());
  push_bytes(*direct, repo, tmp.path(), "{}", oci::empty_descriptor());
  std::string m = artifact_manifest(desc);
  const int kDocuments = 6;
  for (int i = 0; i < kDocuments; ++i) {
    std::string tag = "t" + std::to_string(i);
    direct->push_manifest(repo, tag, m, oci::kMediaTypeManifest);
    // Each is held 3 s once (under its own 30 s limit and the 5 s stall check), then served.
    proxy->add_rule({"GET", "/manifests/" + tag, Action::kStall, 1, 10, 3});
  }
  SourceOptions o = fast_source_options();
  o.http.command_timeout_s = 2;
  auto via = registry_source(proxy->oci_url(), o);
  auto t0 = Clock::now();
  try {
    for (int i = 0; i < kDocuments; ++i) via->get_manifest(repo, "t" + std::to_string(i));
    ADD_FAILURE() << "every document arrived: the command deadline was not applied";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kNetwork) << e.what();
    std::string what = e.what();
    EXPECT_NE(what.find("/manifests/t0 was in flight"), std::string::npos) << what;
    EXPECT_NE(what.find("deadline of 2 s"), std::string::npos) << what;
    EXPECT_NE(what.find("KERNEL_HUB_COMMAND_TIMEOUT_S"), std::string::npos) << what;
  }
  double took = seconds_since(t0);
  EXPECT_GE(took, 1.5);
  EXPECT_LT(took, 10.0);
  // Deterministic: nothing is asked again after the deadline.
  EXPECT_EQ(proxy->count("GET", "/manifests/t0"), 1u);
  EXPECT_EQ(proxy->count("GET", "/manifests/t1"), 0u);
}

// The same for a pull of several slow blobs, one at a time: the deadline starts when the Hub is
// made for the command, bounds the blob in flight, and no other blob starts after it. Each blob
// alone is far within its own deadline (KERNEL_HUB_TRANSFER_TIMEOUT_S). Without it: ~4 x 3 s.
TEST_F(FaultTest, APullOfSlowBlobsEndsAtTheCommandDeadline) {
  auto direct = registry_source(reg.oci_url(), fast_source_options());
  push_bytes(*direct, repo, tmp.path(), "{}", oci::empty_descriptor());
  oci::Manifest m;
  m.config = oci::empty_descriptor();
  for (int i = 0; i < 4; ++i) {
    std::string bytes = test_bytes(200000 + i, 300 + i);
    m.layers.push_back(layer_descriptor(bytes));
    push_bytes(*direct, repo, tmp.path(), bytes, m.layers.back());
    proxy->add_rule({"GET", m.layers.back().digest.hex, Action::kStall, 1, 1000, 3});
  }
  direct->push_manifest(repo, "slow", oci::serialize(m), oci::kMediaTypeManifest);

  Store store(tmp.path() / "cache");
  HubOptions o;
  o.progress = false;
  o.source = fast_source_options();
  o.source.http.max_parallel = 1;
  o.source.http.command_timeout_s = 2;
  auto t0 = Clock::now();
  Hub hub(HubAddress::parse(proxy->oci_url(), true), store, o);
  try {
    hub.pull(Ref::parse(repo + "@slow"));
    ADD_FAILURE() << "every blob arrived: the command deadline was not applied";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kNetwork) << e.what();
    std::string what = e.what();
    EXPECT_NE(what.find("was in flight when this command's deadline of 2 s"), std::string::npos)
        << what;
    EXPECT_NE(what.find("could not start"), std::string::npos) << what;
    EXPECT_NE(what.find("KERNEL_HUB_COMMAND_TIMEOUT_S"), std::string::npos) << what;
  }
  double took = seconds_since(t0);
  EXPECT_GE(took, 1.5);
  EXPECT_LT(took, 10.0);
  std::string seen;
  for (auto& g : blob_gets()) seen += "\n  " + g.target + " " + g.range;
  EXPECT_EQ(blob_gets().size(), 1u) << "a blob was asked for after the deadline:" << seen;
  for (auto& l : m.layers) EXPECT_FALSE(store.has_blob(l.digest));
}

TEST_F(FaultTest, CorruptedBytesFailTheDigestCheckAndKeepNothing) {
  proxy->add_rule({"GET", "/blobs/", Action::kCorrupt, 100, 12345});
  MemorySink sink(desc);
  BlobFetch r = fetch(sink);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find(desc.digest.str()), std::string::npos) << r.error;
  EXPECT_NE(r.error.find("corrupted"), std::string::npos) << r.error;
  EXPECT_FALSE(sink.finish());
  EXPECT_FALSE(sink.committed());
  EXPECT_EQ(sink.offset(), 0u);
}

TEST_F(FaultTest, TooManyRequestsHonoursRetryAfter) {
  proxy->add_rule({"GET", "/blobs/", Action::kStatus, 1, 0, 1, 429});
  MemorySink sink(desc);
  auto t0 = Clock::now();
  BlobFetch r = fetch(sink);
  double took = seconds_since(t0);
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_TRUE(sink.finish());
  EXPECT_GE(took, 0.95);
  EXPECT_EQ(blob_gets().size(), 2u);
}

TEST_F(FaultTest, TooManyRequestsOnManifestHonoursRetryAfter) {
  auto direct = registry_source(reg.oci_url(), fast_source_options());
  push_bytes(*direct, repo, tmp.path(), "{}", oci::empty_descriptor());
  std::string m = artifact_manifest(desc);
  direct->push_manifest(repo, "v1", m, oci::kMediaTypeManifest);
  proxy->add_rule({"GET", "/manifests/", Action::kStatus, 1, 0, 1, 429});
  auto via = registry_source(proxy->oci_url(), fast_source_options());
  auto t0 = Clock::now();
  EXPECT_EQ(via->get_manifest(repo, "v1").bytes, m);
  EXPECT_GE(seconds_since(t0), 0.95);
  EXPECT_EQ(proxy->count("GET", "/manifests/v1"), 2u);
}

TEST_F(FaultTest, ManifestAlteredInTransitIsAnIntegrityError) {
  auto direct = registry_source(reg.oci_url(), fast_source_options());
  push_bytes(*direct, repo, tmp.path(), "{}", oci::empty_descriptor());
  std::string m = artifact_manifest(desc);
  direct->push_manifest(repo, "v1", m, oci::kMediaTypeManifest);
  proxy->add_rule({"GET", "/manifests/", Action::kCorrupt, 1, 10});
  auto via = registry_source(proxy->oci_url(), fast_source_options());
  try {
    via->get_manifest(repo, "v1");
    FAIL() << "expected kIntegrity";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIntegrity) << e.what();
    EXPECT_NE(std::string(e.what()).find("Docker-Content-Digest"), std::string::npos);
  }
  EXPECT_EQ(via->get_manifest(repo, "v1").bytes, m);  // the rule was used up
}

// A host the registry redirects a manifest to, answering 401 with a token realm of its own, gets
// no login: the registry's credentials and tokens are the registry's alone.
TEST_F(FaultTest, AHostARedirectNamesIsNotGivenTheRegistrysCredentials) {
  auto direct = registry_source(reg.oci_url(), fast_source_options());
  push_bytes(*direct, repo, tmp.path(), "{}", oci::empty_descriptor());
  direct->push_manifest(repo, "v1", artifact_manifest(desc), oci::kMediaTypeManifest);
  FaultProxy storage(reg.port());
  storage.enable_bearer("storage-token");
  proxy->add_rule(
      {"GET", "/manifests/", Action::kRedirect, 100, 0, 0, 307, "http://" + storage.host()});
  SourceOptions o = fast_source_options();
  o.username = "alice";
  o.password = "registry-secret";
  auto via = registry_source(proxy->oci_url(), o);
  try {
    via->get_manifest(repo, "v1");
    FAIL() << "the redirect target's 401 was answered";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kAuth) << e.what();
    EXPECT_NE(std::string(e.what()).find(storage.host() + ", where the registry redirected it"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(storage.token_requests(), 0u) << "the registry's credentials went to its realm";
  for (const auto& seen : storage.requests()) EXPECT_EQ(seen.authorization, "") << seen.target;
}

TEST_F(FaultTest, ServerErrorsThenSuccess) {
  proxy->add_rule({"GET", "/blobs/", Action::kStatus, 1, 0, 0, 500});
  proxy->add_rule({"GET", "/blobs/", Action::kStatus, 1, 0, 0, 503});
  MemorySink sink(desc);
  BlobFetch r = fetch(sink);
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_TRUE(sink.finish());
  EXPECT_EQ(blob_gets().size(), 3u);
}

TEST_F(FaultTest, PersistentFailureReportsUrlStatusAndAttempts) {
  proxy->add_rule({"GET", "/blobs/", Action::kStatus, 100, 0, 0, 503});
  SourceOptions o = fast_source_options();
  o.http.max_attempts = 3;
  MemorySink sink(desc);
  BlobFetch r = fetch(sink, o);
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.error.find(proxy->host() + "/v2/" + repo + "/blobs/" + desc.digest.str()),
            std::string::npos)
      << r.error;
  EXPECT_NE(r.error.find("503"), std::string::npos) << r.error;
  EXPECT_NE(r.error.find("3 attempts"), std::string::npos) << r.error;
  EXPECT_EQ(blob_gets().size(), 3u);
}

TEST_F(FaultTest, IgnoredRangeAfterResetRestartsFromZero) {
  proxy->add_rule({"GET", "/blobs/", Action::kReset, 1, 200000});
  proxy->add_rule({"GET", "/blobs/", Action::kIgnoreRange, 100});
  MemorySink sink(desc);
  BlobFetch r = fetch(sink);
  ASSERT_TRUE(r.ok) << r.error;
  EXPECT_TRUE(sink.finish());
  EXPECT_EQ(sink.data(), blob);
  EXPECT_GE(sink.restarts(), 1);
  auto gets = blob_gets();
  ASSERT_GE(gets.size(), 2u);
  EXPECT_FALSE(gets[1].range.empty());  // we asked to resume; the server ignored it
}

TEST_F(FaultTest, OversizedBlobIsAbortedAndReported) {
  // The descriptor claims fewer bytes than the registry serves: the sink refuses the excess.
  oci::Descriptor lying = desc;
  lying.size = 1000;
  SourceOptions o = fast_source_options();
  o.http.max_attempts = 5;
  auto via = registry_source(proxy->oci_url(), o);
  MemorySink sink(lying);
  std::vector<BlobFetch> blobs{blob_fetch(lying, &sink)};
  via->fetch_blobs(repo, blobs, nullptr);
  EXPECT_FALSE(blobs[0].ok);
  EXPECT_NE(blobs[0].error.find("larger than"), std::string::npos) << blobs[0].error;
  EXPECT_FALSE(sink.finish());
  // Deterministic: another attempt would get the same bytes, so there is none.
  EXPECT_EQ(blob_gets().size(), 1u) << "an oversized blob was fetched again";
}

TEST_F(FaultTest, OneFaultyTransferDoesNotHoldUpTheOthers) {
  auto direct = registry_source(reg.oci_url(), fast_source_options());
  std::vector<std::string> contents;
  std::vector<oci::Descriptor> descs;
  for (int i = 0; i < 4; ++i) {
    contents.push_back(test_bytes(500000 + i, 200 + i));
    descs.push_back(layer_descriptor(contents.back()));
    push_bytes(*direct, repo, tmp.path(), contents.back(), descs.back());
  }
  proxy->add_rule({"GET", descs[1].digest.hex, Action::kReset, 2, 1000});
  proxy->add_rule({"GET", descs[2].digest.hex, Action::kStatus, 1, 0, 0, 502});
  auto via = registry_source(proxy->oci_url(), fast_source_options());
  std::vector<std::unique_ptr<MemorySink>> sinks;
  std::vector<BlobFetch> blobs;
  for (auto& d : descs) {
    sinks.push_back(std::make_unique<MemorySink>(d));
    blobs.push_back(blob_fetch(d, sinks.back().get()));
  }
  via->fetch_blobs(repo, blobs, nullptr);
  for (size_t i = 0; i < blobs.size(); ++i) {
    ASSERT_TRUE(blobs[i].ok) << blobs[i].error;
    EXPECT_TRUE(sinks[i]->finish());
    EXPECT_EQ(sinks[i]->data(), contents[i]);
  }
}

TEST_F(FaultTest, ResetDuringMonolithicUploadStartsAFreshUpload) {
  // The proxy cuts the first upload PUT's response; the push starts over and succeeds.
  std::string bytes = test_bytes(300000, 77);
  auto d = layer_descriptor(bytes);
  proxy->add_rule({"PUT", "/blobs/uploads/", Action::kStatus, 1, 0, 0, 500});
  auto via = registry_source(proxy->oci_url(), fast_source_options());
  push_bytes(*via, repo, tmp.path(), bytes, d);
  auto direct = registry_source(reg.oci_url(), fast_source_options());
  EXPECT_TRUE(direct->has_blob(repo, d));
  EXPECT_EQ(proxy->count("POST", "/blobs/uploads/"), 2u);
}

// --- credentials scoped to one host (issue 12) ---

// KERNEL_HUB_USERNAME/PASSWORD go to the one host[:port] they are scoped to: the registry of
// KERNEL_HUB_ENDPOINT, or KERNEL_HUB_CREDENTIALS_HOST, and to the token realm that registry
// names. Here the registry (a proxy asking for a Bearer token) sends its token realm to another
// proxy; each proxy records what it received.
TEST_F(FaultTest, EnvironmentCredentialsReachOnlyTheHostTheyAreScopedTo) {
  const char* names[] = {"KERNEL_HUB_USERNAME", "KERNEL_HUB_PASSWORD", "KERNEL_HUB_CREDENTIALS",
                         "KERNEL_HUB_ENDPOINT", "KERNEL_HUB_CREDENTIALS_HOST"};
  for (const char* n : names) ::unsetenv(n);
  ::setenv("KERNEL_HUB_CREDENTIALS", (tmp / "none.json").c_str(), 1);
  ::setenv("KERNEL_HUB_USERNAME", "alice", 1);
  ::setenv("KERNEL_HUB_PASSWORD", "env-secret", 1);
  const std::string basic = "Basic " + base64_encode("alice:env-secret");
  auto received = [&](const FaultProxy& p) {
    size_t n = 0;
    for (const auto& s : p.requests()) n += s.authorization == basic;
    return n;
  };
  auto fetch_blob_via = [&](FaultProxy& registry, FaultProxy& realm) {
    realm.enable_bearer("tok");
    registry.enable_bearer("tok", "http://" + realm.host() + "/token");
    auto via = registry_source(registry.oci_url(), fast_source_options());
    MemorySink sink(desc);
    std::vector<BlobFetch> blobs{blob_fetch(desc, &sink)};
    via->fetch_blobs(repo, blobs, nullptr);
    EXPECT_TRUE(blobs[0].ok) << blobs[0].error;
  };
  {  // scoped to the registry: its token realm (on another port) gets them
    FaultProxy realm(reg.port());
    ::setenv("KERNEL_HUB_ENDPOINT", proxy->oci_url().c_str(), 1);
    fetch_blob_via(*proxy, realm);
    EXPECT_GE(received(realm), 1u);
  }
  {  // scoped to the realm's host: not spent on another registry's behalf (anonymous request)
    FaultProxy realm(reg.port());
    ::setenv("KERNEL_HUB_CREDENTIALS_HOST", realm.host().c_str(), 1);
    fetch_blob_via(*proxy, realm);
    EXPECT_EQ(received(realm), 0u)
        << "credentials for " << realm.host() << " spent for " << proxy->host();
    EXPECT_GE(realm.token_requests(), 1u);
  }
  EXPECT_EQ(received(*proxy), 0u) << "the password went to the registry (it asks for Bearer)";
  for (const char* n : names) ::unsetenv(n);
}

}  // namespace
}  // namespace kh::test
