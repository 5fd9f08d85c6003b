// Pull-through mirrors (hub/transport/registry_mirrors.h): a docker-registry in proxy mode in
// front of the hub's docker-registry, configured with KERNEL_HUB_MIRRORS. What each server saw
// is read from its access log, where the user agent tells kernel-hub's requests from the
// mirror's own fetches from the hub.
#include <gtest/gtest.h>

#include <chrono>
#include <mutex>

#include "hub/base/error.h"
#include "hub/hub.h"
#include "hub/store/store.h"
#include "hub/transport/registry_mirrors.h"
#include "tests/fixtures/fault_proxy.h"
#include "tests/fixtures/layout_builder.h"
#include "tests/fixtures/process.h"
#include "tests/fixtures/registry_fixture.h"

namespace kh::test {
namespace {

using Clock = std::chrono::steady_clock;

const std::string kRepo = "org/mirrored";
const std::string kRef = kRepo + "@v1";

// Access-log lines of blob GETs (any user agent when `agent` is empty).
size_t blob_gets(const RegistryFixture& reg, const std::string& agent = "") {
  size_t n = 0;
  for (const auto& line : reg.access_log()) {
    if (line.find("\"GET /v2/" + kRepo + "/blobs/sha256:") == std::string::npos) continue;
    if (agent.empty() || line.find("\"" + agent) != std::string::npos) ++n;
  }
  return n;
}

// Log lines of one scope (the process-wide sink), level and text.
class LogCapture {
 public:
  LogCapture() {
    previous_ = set_log_sink([this](int level, const std::string& line) {
      std::lock_guard lock(mu_);
      lines_.emplace_back(level, line);
    });
  }
  ~LogCapture() { set_log_sink(previous_); }
  // The first line at `level` containing every part, or "".
  std::string find(int level, std::initializer_list<std::string> parts) const {
    std::lock_guard lock(mu_);
    for (const auto& [l, line] : lines_) {
      bool all = l == level;
      for (const auto& p : parts) all = all && line.find(p) != std::string::npos;
      if (all) return line;
    }
    return "";
  }
  std::string all() const {
    std::lock_guard lock(mu_);
    std::string out;
    for (const auto& [l, line] : lines_) out += std::to_string(l) + ": " + line + "\n";
    return out;
  }

 private:
  LogSink previous_;
  mutable std::mutex mu_;
  std::vector<std::pair<int, std::string>> lines_;
};

class PullMirrorTest : public ::testing::Test {
 protected:
  TempDir tmp{"kh-pull-mirror"};
  std::unique_ptr<RegistryFixture> hub;
  std::unique_ptr<RegistryFixture> mirror;
  BuiltLayout built;

  void SetUp() override {
    hub = std::make_unique<RegistryFixture>();
    if (!hub->available()) GTEST_SKIP() << hub->why();
    RegistryFixture::Options proxy;
    proxy.proxy_remote_url = hub->http_url();
    mirror = std::make_unique<RegistryFixture>(proxy);
    ASSERT_TRUE(mirror->available()) << mirror->why();
    LayoutSpec spec;
    spec.variants = 3;
    spec.layer_bytes = 300 << 10;
    built = build_layout(tmp / "layout", spec);
    ProcessResult r =
        run_process({cli_path(), "--cache", (tmp / "push-cache").string(), "--plain-http", "--hub",
                     hub->oci_url(), "-q", "push", (tmp / "layout").string(), kRef},
                    {{"KERNEL_HUB_MIRRORS", "\x01"}});
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }

  ProcessResult cli_pull(const std::string& cache, const std::string& mirrors) {
    return run_process({cli_path(), "--cache", (tmp / cache).string(), "--plain-http", "--hub",
                        hub->oci_url(), "pull", kRef},
                       {{"KERNEL_HUB_MIRRORS", mirrors}, {"KERNEL_HUB_BACKOFF_S", "0.05"}}, 120);
  }

  HubOptions hub_options(const std::string& mirrors) {
    HubOptions o;
    o.progress = false;
    o.source.http.backoff_initial_s = 0.05;
    o.source.http.backoff_max_s = 0.2;
    o.source.mirrors = parse_registry_mirrors(mirrors, "test");
    return o;
  }

  // Every layer is in the cache, and hashes to its name (Store::read_blob checks).
  void expect_cached(Store& store) {
    for (const auto& l : built.layers) {
      auto bytes = store.read_blob(l.digest, 1 << 20);
      ASSERT_TRUE(bytes.has_value()) << l.digest.str();
      EXPECT_EQ(bytes->size(), static_cast<size_t>(l.size));
    }
  }
};

TEST(RegistryMirrors, ParsesEntriesInOrder) {
  auto m = parse_registry_mirrors(
      " mirror.local:5001 , reg.example=https://m2.example, "
      "oci://reg.example:5000=http://[::1]:6000/",
      "KERNEL_HUB_MIRRORS");
  ASSERT_EQ(m.size(), 3u);
  EXPECT_EQ(m[0].registry, "");
  EXPECT_EQ(m[0].host, "mirror.local:5001");
  EXPECT_EQ(m[0].scheme, "");
  EXPECT_EQ(m[1].registry, "reg.example");
  EXPECT_EQ(m[1].scheme, "https");
  EXPECT_EQ(m[2].registry, "reg.example:5000");
  EXPECT_EQ(m[2].host, "[::1]:6000");
  EXPECT_EQ(m[2].scheme, "http");

  // Per registry, in the order written; a mirror naming the hub itself is dropped.
  auto for_reg = mirrors_for(m, "reg.example");
  ASSERT_EQ(for_reg.size(), 2u);
  EXPECT_EQ(for_reg[0].host, "mirror.local:5001");
  EXPECT_EQ(for_reg[1].host, "m2.example");
  EXPECT_EQ(mirrors_for(m, "other:1").size(), 1u);
  EXPECT_TRUE(mirrors_for(m, "mirror.local:5001").empty());
  EXPECT_TRUE(parse_registry_mirrors("  ", "X").empty());
}

TEST(RegistryMirrors, RefusesMalformedEntriesNamingThem) {
  for (const char* bad : {"a,,b", "ftp://m:1", "m:1/path", "=m:1", "r=", "m 1"}) {
    try {
      parse_registry_mirrors(bad, "KERNEL_HUB_MIRRORS");
      ADD_FAILURE() << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput) << bad;
      EXPECT_NE(std::string(e.what()).find("KERNEL_HUB_MIRRORS"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("[REGISTRY=]MIRROR"), std::string::npos) << e.what();
    }
  }
}

// A password in a mirror entry is refused without being repeated.
TEST(RegistryMirrors, RefusesCredentialsWithoutRepeatingThem) {
  try {
    parse_registry_mirrors("r.example=alice:s3cret@mirror.example", "KERNEL_HUB_MIRRORS");
    ADD_FAILURE() << "accepted a password";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
    EXPECT_EQ(std::string(e.what()).find("s3cret"), std::string::npos) << e.what();
  }
}

// A pull goes through the mirror; a second process's pull is served by the mirror's cache without
// a single blob request reaching the hub; the ref is recorded under the hub's id.
TEST_F(PullMirrorTest, PullsThroughTheMirrorAndASecondProcessLeavesTheHubAlone) {
  ProcessResult r = cli_pull("cache-a", mirror->host());
  ASSERT_EQ(r.exit_code, 0) << r.err << mirror->log();
  const size_t layers = built.layers.size();
  EXPECT_GE(blob_gets(*mirror, "kernel-hub"), layers) << r.err;
  // The hub saw the mirror's fetches, none of kernel-hub's own.
  EXPECT_EQ(blob_gets(*hub, "kernel-hub"), 0u);
  EXPECT_GE(blob_gets(*hub), layers);

  const size_t hub_blob_gets = blob_gets(*hub);
  const size_t mirror_blob_gets = blob_gets(*mirror, "kernel-hub");
  r = cli_pull("cache-b", mirror->host());
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(blob_gets(*mirror, "kernel-hub"), mirror_blob_gets + layers);
  EXPECT_EQ(blob_gets(*hub), hub_blob_gets) << "the mirror went to the hub for cached blobs";
  EXPECT_EQ(r.err.find("warning: mirror "), std::string::npos) << r.err;  // no fallback

  Store store(tmp / "cache-b");
  expect_cached(store);
  const std::string hub_id = HubAddress::parse(hub->oci_url(), true).id();
  auto rec = store.read_ref(hub_id, kRepo, "v1");
  ASSERT_TRUE(rec.has_value()) << "no ref record under the hub's id " << hub_id;
  EXPECT_EQ(rec->digest, built.index.digest);
  EXPECT_FALSE(store.read_ref(HubAddress::parse(mirror->oci_url(), true).id(), kRepo, "v1"));
}

// Which host served is logged at info level.
TEST_F(PullMirrorTest, LogsWhichHostServed) {
  LogCapture log;
  Store store(tmp / "cache");
  Hub h(HubAddress::parse(hub->oci_url(), true), store, hub_options(mirror->host()));
  PullReport report = h.pull(Ref::parse(kRef));
  EXPECT_EQ(report.blobs_downloaded, built.layers.size());
  EXPECT_NE(log.find(kLogInfo, {kRepo, "blob(s)", "from mirror " + mirror->host()}), "")
      << log.all();
  EXPECT_EQ(log.find(kLogInfo, {"blob(s)", "from the hub"}), "") << log.all();
  // The index is unsigned: the mirror has no signatures for it, so the hub is asked for them.
  EXPECT_NE(log.find(kLogInfo, {"the signatures of", "mirror " + mirror->host() + " has none"}), "")
      << log.all();
  EXPECT_EQ(log.find(kLogWarn, {}), "") << log.all();
}

// A stopped mirror: one refused connection, a warning naming it, and the pull is served by the
// hub (its access log has kernel-hub's own blob requests).
TEST_F(PullMirrorTest, StoppedMirrorFallsBackToTheHubWithAWarning) {
  const std::string mirror_host = mirror->host();
  mirror->stop();
  auto t0 = Clock::now();
  ProcessResult r = cli_pull("cache", mirror_host);
  const double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_LT(seconds, 20.0) << "falling back should not wait out retries";
  EXPECT_NE(r.err.find("warning: mirror " + mirror_host + " of " + hub->oci_url() +
                       " is not used for the rest of this command"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(blob_gets(*hub, "kernel-hub"), built.layers.size());
  Store store(tmp / "cache");
  expect_cached(store);
}

// A mirror serving corrupted blobs (a fault proxy flipping a byte in front of it): each is
// rejected by its digest, nothing of it is kept, and the pull succeeds from the hub. The hub is
// the authority on content; a mirror must not be able to deny a pull the hub can serve.
TEST_F(PullMirrorTest, CorruptedMirrorBlobIsRejectedAndFetchedFromTheHub) {
  FaultProxy bad_mirror(mirror->port());
  bad_mirror.add_rule({"GET", "/blobs/sha256:", FaultProxy::Action::kCorrupt, 100, 1000});
  LogCapture log;
  Store store(tmp / "cache");
  Hub h(HubAddress::parse(hub->oci_url(), true), store, hub_options(bad_mirror.host()));
  PullReport report = h.pull(Ref::parse(kRef));
  EXPECT_EQ(report.blobs_downloaded, built.layers.size());
  expect_cached(store);
  for (const auto& l : built.layers) {
    EXPECT_NE(log.find(kLogWarn, {"mirror " + bad_mirror.host(), "served blob " + l.digest.str(),
                                  "other bytes", "nothing of it was kept"}),
              "")
        << log.all();
  }
  EXPECT_GE(bad_mirror.count("GET", "/blobs/"), built.layers.size());
  EXPECT_EQ(blob_gets(*hub, "kernel-hub"), built.layers.size());
  EXPECT_NE(log.find(kLogInfo, {"blob(s)", "from the hub " + hub->oci_url()}), "") << log.all();
}

// A mirror redirecting blobs to another host (as registries send them to object storage): the
// pull follows, the bytes are verified as always, and the mirror's token never reaches that host.
TEST_F(PullMirrorTest, RedirectToAnotherHostCarriesNoMirrorCredentials) {
  FaultProxy storage(hub->port());  // the other host: records what it receives
  FaultProxy redirecting(mirror->port());
  redirecting.enable_bearer("mirror-token");
  redirecting.add_rule({"GET", "/blobs/sha256:", FaultProxy::Action::kRedirect, 100, 0, 0, 307,
                        "http://" + storage.host()});
  Store store(tmp / "cache");
  Hub h(HubAddress::parse(hub->oci_url(), true), store, hub_options(redirecting.host()));
  PullReport report = h.pull(Ref::parse(kRef));
  EXPECT_EQ(report.blobs_downloaded, built.layers.size());
  expect_cached(store);
  size_t storage_gets = 0;
  for (const auto& seen : storage.requests()) {
    if (seen.target.find("/blobs/") == std::string::npos) continue;
    ++storage_gets;
    EXPECT_EQ(seen.authorization, "") << seen.target;
  }
  EXPECT_EQ(storage_gets, built.layers.size());
  size_t with_token = 0;
  for (const auto& seen : redirecting.requests()) {
    if (seen.target.find("/blobs/") != std::string::npos &&
        seen.authorization == "Bearer mirror-token")
      ++with_token;
  }
  EXPECT_EQ(with_token, built.layers.size());
}

// Pushes go to the hub only, never to a mirror.
TEST_F(PullMirrorTest, PushesGoToTheHubOnly) {
  LayoutSpec spec;
  spec.tag = "v2";
  build_layout(tmp / "layout2", spec);
  Store store(tmp / "cache");
  Hub h(HubAddress::parse(hub->oci_url(), true), store, hub_options(mirror->host()));
  const size_t mirror_lines = mirror->access_log().size();
  PushReport report = h.push(tmp / "layout2", Ref::parse(kRepo + "@v2"));
  EXPECT_GT(report.blobs_uploaded, 0u);
  EXPECT_EQ(mirror->access_log().size(), mirror_lines);
  EXPECT_EQ(h.tags(kRepo).size(), 2u);
}

// Tags resolve through the mirror, as containerd resolves them: a mirror that is not a proxy
// and holds another index under the tag is believed for the tag. Its content is still checked
// against the digests it names, and signatures (trust) decide whether that index is used; here
// the record keeps the hub's id.
TEST_F(PullMirrorTest, TagsResolveThroughTheMirror) {
  RegistryFixture other;  // a plain registry posing as a mirror, with its own v1
  ASSERT_TRUE(other.available()) << other.why();
  LayoutSpec spec;
  BuiltLayout theirs = build_layout(tmp / "theirs", spec);
  ProcessResult r =
      run_process({cli_path(), "--cache", (tmp / "push-cache2").string(), "--plain-http", "--hub",
                   other.oci_url(), "-q", "push", (tmp / "theirs").string(), kRef},
                  {{"KERNEL_HUB_MIRRORS", "\x01"}});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  Store store(tmp / "cache");
  Hub h(HubAddress::parse(hub->oci_url(), true), store, hub_options(other.host()));
  PullReport report = h.pull(Ref::parse(kRef));
  EXPECT_EQ(report.digest, theirs.index.digest);
  auto rec = store.read_ref(HubAddress::parse(hub->oci_url(), true).id(), kRepo, "v1");
  ASSERT_TRUE(rec.has_value());
  EXPECT_EQ(rec->digest, theirs.index.digest);
  // Unsigned: the trust check refuses it as it would refuse the hub serving it.
  EXPECT_THROW(h.check_trust(Ref::parse(kRef), report.digest, trust::TrustStore{}), Error);
}

}  // namespace
}  // namespace kh::test
