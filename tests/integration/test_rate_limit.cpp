// A registry that rate-limits (HTTP 429 with Retry-After, as Docker Hub, ghcr.io and Harbor do
// when many ranks start at once): docker-registry 2.8.2 behind FaultProxy, pulled by a Hub.
// Retry-After is waited in full (seconds and HTTP-date forms), never less; a wait past the
// command deadline fails at once, naming it; a malformed value falls back to the normal backoff;
// a registry that keeps refusing ends with what was refused, how long we waited, what to do.
#include <gtest/gtest.h>

#include <chrono>
#include <ctime>

#include "hub/base/error.h"
#include "hub/hub.h"
#include "hub/store/store.h"
#include "hub/transport/source.h"
#include "tests/fixtures/fault_proxy.h"
#include "tests/fixtures/layout_builder.h"
#include "tests/fixtures/nginx_fixture.h"
#include "tests/fixtures/registry_fixture.h"
#include "tests/integration/blob_test_helpers.h"

namespace kh::test {
namespace {

using Clock = std::chrono::steady_clock;
using Action = FaultProxy::Action;

// Timer granularity and scheduling: a wait may end this much before its nominal length.
constexpr double kEpsilon = 0.05;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// An IMF-fixdate `seconds` from now ("Sun, 06 Nov 1994 08:49:37 GMT").
std::string http_date_in(int seconds) {
  std::time_t t = std::time(nullptr) + seconds;
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof buf, "%a, %d %b %Y %H:%M:%S GMT", &tm);
  return buf;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

class RateLimitTest : public ::testing::Test {
 protected:
  RegistryFixture reg;
  TempDir tmp{"kh-rate-limit-test"};
  std::unique_ptr<FaultProxy> proxy;
  const std::string repo = "org/limited";
  oci::Manifest manifest;

  void SetUp() override {
    if (!reg.available()) GTEST_SKIP() << reg.why();
    auto direct = registry_source(reg.oci_url(), fast_source_options());
    push_bytes(*direct, repo, tmp.path(), "{}", oci::empty_descriptor());
    manifest.config = oci::empty_descriptor();
    for (int i = 0; i < 2; ++i) {
      std::string bytes = test_bytes(300000 + i, 700 + i);
      manifest.layers.push_back(layer_descriptor(bytes));
      push_bytes(*direct, repo, tmp.path(), bytes, manifest.layers.back());
    }
    direct->push_manifest(repo, "v1", oci::serialize(manifest), oci::kMediaTypeManifest);
    proxy = std::make_unique<FaultProxy>(reg.port());
  }

  // Pulls repo@v1 through the proxy into a fresh cache; throws what the pull throws.
  void pull(SourceOptions source = fast_source_options()) {
    Store store(tmp.path() / ("cache" + std::to_string(++pulls_)));
    HubOptions o;
    o.progress = false;
    o.source = std::move(source);
    Hub hub(HubAddress::parse(proxy->oci_url(), true), store, o);
    hub.pull(Ref::parse(repo + "@v1"));
    for (auto& l : manifest.layers) EXPECT_TRUE(store.has_blob(l.digest)) << l.digest.str();
  }

  int pulls_ = 0;
};

// The first two requests (the tag's manifest, then its retry) are refused with Retry-After: 2:
// the pull waits at least 2 s after each, never the 50 ms backoff the options would give.
TEST_F(RateLimitTest, PullWaitsOutRetryAfterSeconds) {
  const int kWait = 2, kRefusals = 2;
  proxy->add_rule({"", "/v2/", Action::kStatus, kRefusals, 0, kWait, 429});
  auto t0 = Clock::now();
  pull();
  double took = seconds_since(t0);
  EXPECT_GE(took, kRefusals * kWait - kEpsilon);
  EXPECT_LT(took, kRefusals * kWait * 1.1 + 3.0) << "waited far longer than asked";
}

// Blobs in flight together: a 429 on one holds back every transfer to that host until its
// Retry-After has passed, and the pull still completes.
TEST_F(RateLimitTest, BlobDownloadsWaitOutRetryAfter) {
  const int kWait = 2;
  proxy->add_rule({"GET", "/blobs/", Action::kStatus, 1, 0, kWait, 429});
  auto t0 = Clock::now();
  pull();
  EXPECT_GE(seconds_since(t0), kWait - kEpsilon);
  EXPECT_LT(seconds_since(t0), kWait * 1.1 + 3.0);
}

// The HTTP-date form. Its resolution is one second (the date is rounded down when it is
// written, and the delay computed when it is read), so at least 3 - 1 s.
TEST_F(RateLimitTest, PullWaitsOutRetryAfterHttpDate) {
  FaultProxy::Rule rule{"GET", "/manifests/", Action::kStatus, 1, 0, 0, 503};
  rule.retry_after = http_date_in(3);
  proxy->add_rule(rule);
  auto t0 = Clock::now();
  pull();
  double took = seconds_since(t0);
  EXPECT_GE(took, 2.0 - kEpsilon) << "Retry-After: " << rule.retry_after;
  EXPECT_LT(took, 3.3 + 3.0);
}

// Retry-After longer than what is left of the command's deadline: fail at once (no waiting
// until the deadline to fail then), naming the wait, the deadline and the variable.
TEST_F(RateLimitTest, RetryAfterPastTheCommandDeadlineFailsAtOnce) {
  proxy->add_rule({"GET", "/manifests/", Action::kStatus, 1, 0, 30, 429});
  SourceOptions o = fast_source_options();
  o.http.command_timeout_s = 5;
  auto t0 = Clock::now();
  try {
    pull(o);
    ADD_FAILURE() << "the pull waited past its deadline";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kNetwork) << e.what();
    std::string what = e.what();
    EXPECT_TRUE(contains(what, "HTTP 429")) << what;
    EXPECT_TRUE(contains(what, "asked to wait 30 s (Retry-After)")) << what;
    EXPECT_TRUE(contains(what, "deadline of 5 s")) << what;
    EXPECT_TRUE(contains(what, "KERNEL_HUB_COMMAND_TIMEOUT_S")) << what;
  }
  EXPECT_LT(seconds_since(t0), 1.5) << "it waited instead of failing at once";
  EXPECT_EQ(proxy->count("GET", "/manifests/"), 1u) << "nothing is asked again";
}

// A wait longer than an hour is refused at once even with the command deadline off.
TEST_F(RateLimitTest, RetryAfterOverAnHourFailsAtOnceWithoutADeadline) {
  FaultProxy::Rule rule{"GET", "/manifests/", Action::kStatus, 1, 0, 0, 503};
  rule.retry_after = "100000";
  proxy->add_rule(rule);
  SourceOptions o = fast_source_options();
  o.http.command_timeout_s = 0;
  auto t0 = Clock::now();
  try {
    pull(o);
    ADD_FAILURE() << "the pull waited a day";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kNetwork) << e.what();
    EXPECT_TRUE(contains(e.what(), "asked to wait 100000 s (Retry-After)")) << e.what();
    EXPECT_TRUE(contains(e.what(), "3600 s kernel-hub waits at once")) << e.what();
  }
  EXPECT_LT(seconds_since(t0), 1.5) << "it waited instead of failing at once";
}

// The same on the blob path (parallel downloads).
TEST_F(RateLimitTest, BlobRetryAfterPastTheCommandDeadlineFailsAtOnce) {
  proxy->add_rule({"GET", "/blobs/", Action::kStatus, 1, 0, 30, 429});
  SourceOptions o = fast_source_options();
  o.http.command_timeout_s = 5;
  auto t0 = Clock::now();
  try {
    pull(o);
    ADD_FAILURE() << "the pull waited past its deadline";
  } catch (const Error& e) {
    std::string what = e.what();
    EXPECT_TRUE(contains(what, "asked to wait 30 s (Retry-After)")) << what;
    EXPECT_TRUE(contains(what, "deadline of 5 s")) << what;
  }
  EXPECT_LT(seconds_since(t0), 1.5) << "it waited instead of failing at once";
}

// A Retry-After that is neither seconds nor an HTTP-date (or a date already past) is ignored:
// the normal backoff (50 ms here) applies, not a guess.
TEST_F(RateLimitTest, MalformedRetryAfterFallsBackToTheBackoff) {
  for (std::string value : {"soon, please", "-5", "Mon, 01 Jan 2001 00:00:00 GMT"}) {
    FaultProxy::Rule rule{"GET", "/manifests/", Action::kStatus, 1, 0, 0, 429};
    rule.retry_after = value;
    proxy->add_rule(rule);
    const size_t before = proxy->count("GET", "/manifests/");
    auto t0 = Clock::now();
    pull();
    EXPECT_LT(seconds_since(t0), 1.5) << "Retry-After: " << value;
    EXPECT_EQ(proxy->count("GET", "/manifests/") - before, 2u) << "one refusal, one retry";
  }
}

// A registry that refuses every attempt: the error says what was refused, how many attempts
// over how long (the Retry-After waits, 1 s each), and what to do.
TEST_F(RateLimitTest, RegistryThatKeepsRefusingSaysWhatAndHowLong) {
  proxy->add_rule({"GET", "/manifests/", Action::kStatus, 100, 0, 1, 429});
  SourceOptions o = fast_source_options();
  o.http.max_attempts = 3;
  auto t0 = Clock::now();
  try {
    pull(o);
    ADD_FAILURE() << "the pull succeeded through a registry refusing everything";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kNetwork) << e.what();
    std::string what = e.what();
    EXPECT_TRUE(contains(what, "manifest 'v1' of org/limited")) << what;
    EXPECT_TRUE(contains(what, "HTTP 429 to 3 attempt(s) over 2")) << what;
    EXPECT_TRUE(contains(what, "rate-limiting")) << what;
    EXPECT_TRUE(contains(what, "KERNEL_HUB_MAX_ATTEMPTS (now 3)")) << what;
  }
  EXPECT_GE(seconds_since(t0), 2.0 - kEpsilon);
  EXPECT_EQ(proxy->count("GET", "/manifests/"), 3u);
}

TEST_F(RateLimitTest, BlobThatKeepsBeingRefusedSaysWhatAndHowLong) {
  proxy->add_rule({"GET", "/blobs/", Action::kStatus, 100, 0, 1, 503});
  SourceOptions o = fast_source_options();
  o.http.max_attempts = 2;
  try {
    pull(o);
    ADD_FAILURE() << "the pull succeeded through a registry refusing every blob";
  } catch (const Error& e) {
    std::string what = e.what();
    EXPECT_TRUE(contains(what, "/blobs/sha256:")) << what;
    EXPECT_TRUE(contains(what, "HTTP 503 to 2 attempt(s) over 1")) << what;
    EXPECT_TRUE(contains(what, "KERNEL_HUB_MAX_ATTEMPTS")) << what;
  }
}

// A static hub (OCI layouts on nginx) behind the same proxy: the same waits, the same error.
class StaticHubRateLimitTest : public ::testing::Test {
 protected:
  TempDir root{"kh-rate-limit-static"};
  std::unique_ptr<NginxFixture> nginx;
  std::unique_ptr<FaultProxy> proxy;
  const std::string repo = "org/static";

  void SetUp() override {
    if (!NginxFixture::installed()) GTEST_SKIP() << "nginx is not installed";
    build_layout(root.path() / repo, LayoutSpec{});
    nginx = std::make_unique<NginxFixture>(root.path());
    proxy = std::make_unique<FaultProxy>(nginx->port());
  }

  std::unique_ptr<Source> source(SourceOptions o = fast_source_options()) {
    return open_layout_source(HubAddress::parse("http://" + proxy->host(), true), o);
  }
};

TEST_F(StaticHubRateLimitTest, WaitsOutRetryAfter) {
  proxy->add_rule({"GET", "index.json", Action::kStatus, 1, 0, 2, 429});
  auto t0 = Clock::now();
  EXPECT_EQ(source()->get_manifest(repo, "v1").media_type, oci::kMediaTypeIndex);
  EXPECT_GE(seconds_since(t0), 2.0 - kEpsilon);
  EXPECT_EQ(proxy->count("GET", "index.json"), 2u);
}

TEST_F(StaticHubRateLimitTest, KeepsRefusingSaysWhatAndHowLong) {
  proxy->add_rule({"GET", "index.json", Action::kStatus, 100, 0, 1, 429});
  SourceOptions o = fast_source_options();
  o.http.max_attempts = 2;
  try {
    source(o)->get_manifest(repo, "v1");
    ADD_FAILURE() << "the static hub refused everything, yet the manifest came";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kNetwork) << e.what();
    std::string what = e.what();
    EXPECT_TRUE(contains(what, "index.json answered HTTP 429")) << what;
    EXPECT_TRUE(contains(what, "HTTP 429 to 2 attempt(s) over 1")) << what;
    EXPECT_TRUE(contains(what, "KERNEL_HUB_MAX_ATTEMPTS (now 2)")) << what;
  }
}

}  // namespace
}  // namespace kh::test
