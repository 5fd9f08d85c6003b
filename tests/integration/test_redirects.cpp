// The HTTP client following redirects hop by hop (redirect.h), against nginx on 127.0.0.1 with
// two FaultProxy fronts as two origins: one answers redirects, the other is where they point.
// What each origin received is recorded, so where credentials went is checked, not assumed.
#include <gtest/gtest.h>

#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "hub/base/error.h"
#include "hub/transport/http.h"
#include "tests/fixtures/fault_proxy.h"
#include "tests/fixtures/nginx_fixture.h"
#include "tests/fixtures/process.h"
#include "tests/integration/blob_test_helpers.h"

namespace kh::test {
namespace {

using Action = FaultProxy::Action;

constexpr const char* kAuth = "Authorization: Basic YWxpY2U6c2VjcmV0";  // alice:secret

class Redirects : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!NginxFixture::installed()) GTEST_SKIP() << "nginx is not installed";
    blob_ = test_bytes(300 << 10, 7);
    std::ofstream(root_ / "blob", std::ios::binary) << blob_;
    nginx_ = std::make_unique<NginxFixture>(root_.path());
    front_ = std::make_unique<FaultProxy>(nginx_->port());
    storage_ = std::make_unique<FaultProxy>(nginx_->port());
  }

  http::Client client() const {
    http::Options o;
    o.allow_plain_http = true;
    o.max_attempts = 3;
    o.backoff_initial_s = 0.01;
    o.backoff_max_s = 0.05;
    return http::Client(o);
  }
  std::string at(const FaultProxy& p, const std::string& path) const {
    return "http://" + p.host() + path;
  }
  // `from` answers `status` with a Location on `to` (same path) for `times` requests.
  static void redirect(FaultProxy& from, const FaultProxy& to, long status, int times = 100,
                       const std::string& method = "") {
    from.add_rule({method, "/blob", Action::kRedirect, times, 0, 0, static_cast<int>(status),
                   "http://" + to.host()});
  }

  // Downloads the front's /blob into `sink`, sending `headers`; the job as it ended.
  http::Download download(MemorySink& sink, std::vector<std::string> headers = {}) const {
    std::vector<http::Download> jobs(1);
    jobs[0].url = at(*front_, "/blob");
    jobs[0].headers = std::move(headers);
    jobs[0].expected_size = blob_.size();
    jobs[0].sink = &sink;
    client().download(jobs, nullptr);
    return jobs[0];
  }

  TempDir root_{"kh-redirect-root"};
  std::string blob_;
  std::unique_ptr<NginxFixture> nginx_;
  std::unique_ptr<FaultProxy> front_;
  std::unique_ptr<FaultProxy> storage_;
};

TEST_F(Redirects, AHopToAnotherOriginCarriesNoAuthorization) {
  redirect(*front_, *storage_, 307);
  http::Request r;
  r.url = at(*front_, "/blob");
  r.headers = {kAuth, "Accept: */*"};
  http::Response res = client().send(r);
  EXPECT_EQ(res.status, 200);
  EXPECT_EQ(res.body, blob_);
  EXPECT_EQ(res.effective_url, at(*storage_, "/blob"));
  ASSERT_EQ(front_->requests().size(), 1u);
  EXPECT_EQ(front_->requests()[0].authorization, "Basic YWxpY2U6c2VjcmV0");
  ASSERT_EQ(storage_->requests().size(), 1u);
  EXPECT_EQ(storage_->requests()[0].authorization, "") << "the front's credentials left it";
}

TEST_F(Redirects, AHopWithinTheOriginKeepsAuthorization) {
  redirect(*front_, *front_, 302, /*times=*/1);
  http::Request r;
  r.url = at(*front_, "/blob");
  r.headers = {kAuth};
  http::Response res = client().send(r);
  EXPECT_EQ(res.status, 200);
  ASSERT_EQ(front_->requests().size(), 2u);
  for (const auto& seen : front_->requests()) {
    EXPECT_EQ(seen.authorization, "Basic YWxpY2U6c2VjcmV0") << seen.target;
  }
}

TEST_F(Redirects, ALoopEndsAfterTheLimitNamingTheHosts) {
  redirect(*front_, *front_, 302);
  http::Request r;
  r.url = at(*front_, "/blob");
  http::Client c = client();
  try {
    c.send(r);
    FAIL() << "a redirect loop was followed to its end";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kRefused);
    EXPECT_NE(std::string(e.what()).find("more than 10 redirects"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(front_->host()), std::string::npos) << e.what();
  }
  EXPECT_EQ(front_->requests().size(), 11u) << "the first request and ten redirects";
}

TEST_F(Redirects, SeeOtherRepeatsAPostAsAGetAndTemporaryRedirectRepeatsItWithinItsOrigin) {
  redirect(*front_, *storage_, 303, 1, "POST");
  http::Request r;
  r.method = "POST";
  r.url = at(*front_, "/blob");
  r.body = "{}";
  http::Response res = client().send(r);
  EXPECT_EQ(res.status, 200);
  EXPECT_EQ(res.body, blob_);
  ASSERT_EQ(storage_->requests().size(), 1u);
  EXPECT_EQ(storage_->requests()[0].method, "GET");

  // A 307 repeats the POST, body and all: within its origin only.
  redirect(*front_, *front_, 307, 1, "POST");
  client().send(r);  // nginx refuses a POST to a file: what matters is what reached it
  ASSERT_EQ(front_->requests().size(), 3u);
  EXPECT_EQ(front_->requests()[2].method, "POST");
  redirect(*front_, *storage_, 307, 1, "POST");
  try {
    client().send(r);
    ADD_FAILURE() << "a POST was repeated to another origin";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kRefused);
    EXPECT_NE(std::string(e.what()).find("redirected a POST to " + storage_->host()),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(storage_->requests().size(), 1u) << "the body went to " << storage_->host();
}

TEST_F(Redirects, AnAnswerWithoutALocationIsRefused) {
  front_->add_rule({"", "/blob", Action::kStatus, 1, 0, 0, 302});
  http::Request r;
  r.url = at(*front_, "/blob");
  try {
    client().send(r);
    FAIL() << "a 302 without a Location was taken as an answer";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("without a Location"), std::string::npos) << e.what();
  }
  // A caller that follows no redirects gets the answer as it is.
  front_->add_rule({"", "/blob", Action::kStatus, 1, 0, 0, 302});
  r.follow_redirects = false;
  EXPECT_EQ(client().send(r).status, 302);
  redirect(*front_, *storage_, 308, 1);
  http::Response unfollowed = client().send(r);
  EXPECT_EQ(unfollowed.status, 308);
  EXPECT_EQ(unfollowed.redirect_url, at(*storage_, "/blob"));
  EXPECT_EQ(storage_->requests().size(), 0u);
}

// Blob downloads follow too, with the same rules, and a failed hop is retried from the first
// URL (a signed storage URL may have expired; the front hands out a fresh one).
TEST_F(Redirects, DownloadsFollowWithoutAuthorizationAndRetryFromTheFirstUrl) {
  redirect(*front_, *storage_, 307);
  storage_->add_rule({"GET", "/blob", Action::kStatus, 1, 0, 0, 503});
  MemorySink sink(layer_descriptor(blob_));
  const http::Download job = download(sink, {kAuth});
  ASSERT_TRUE(job.ok) << job.error;
  EXPECT_TRUE(sink.finish());
  EXPECT_EQ(front_->requests().size(), 2u) << "the retry starts at the front again";
  ASSERT_EQ(storage_->requests().size(), 2u);
  for (const auto& seen : storage_->requests()) EXPECT_EQ(seen.authorization, "");
}

// A transfer cut off at the redirect's target resumes from what it has: the retry asks the front
// for the rest (Range), follows its redirect, which has a body as docker-distribution's do, and
// the target answers the Range. Resuming with libcurl's own resume option failed on that body
// and started the blob over.
TEST_F(Redirects, ADownloadCutOffPastARedirectResumes) {
  redirect(*front_, *storage_, 307);
  const uint64_t cut = 100 << 10;
  storage_->add_rule({"GET", "/blob", Action::kReset, 1, cut});
  MemorySink sink(layer_descriptor(blob_));
  const http::Download job = download(sink);
  ASSERT_TRUE(job.ok) << job.error;
  EXPECT_TRUE(sink.finish());
  EXPECT_EQ(sink.restarts(), 0) << "the blob started over";
  const auto seen = storage_->requests();
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].range, "");
  EXPECT_TRUE(seen[1].range.starts_with("bytes=")) << seen[1].range;
  EXPECT_NE(seen[1].range, "bytes=0-");
}

TEST_F(Redirects, ADownloadLoopFailsTheJobNamingTheLimit) {
  redirect(*front_, *front_, 301);
  MemorySink sink(layer_descriptor(blob_));
  const http::Download job = download(sink);
  EXPECT_FALSE(job.ok);
  EXPECT_NE(job.error.find("more than 10 redirects"), std::string::npos) << job.error;
  EXPECT_EQ(front_->requests().size(), 11u);
  EXPECT_EQ(sink.offset(), 0u);
}

}  // namespace
}  // namespace kh::test
