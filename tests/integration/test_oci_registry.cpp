// The registry transport against a real docker-registry 2.8.2 on 127.0.0.1 (REFERENCE §2.4).
#include <gtest/gtest.h>

#include <cstdlib>

#include "hub/base/base64.h"
#include "hub/base/error.h"
#include "hub/base/fs.h"
#include "hub/transport/http.h"
#include "hub/transport/source.h"
#include "tests/fixtures/fault_proxy.h"
#include "tests/fixtures/registry_fixture.h"
#include "tests/integration/blob_test_helpers.h"

namespace kh::test {
namespace {

#define REQUIRE_REGISTRY(reg) \
  if (!(reg).available()) GTEST_SKIP() << (reg).why();

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// Keeps credentials (and the hosts they are scoped to) from the developer's environment out of
// the tests.
class ScopedCredentialEnv {
 public:
  explicit ScopedCredentialEnv(const std::string& credentials_file) {
    for (const char* n : {"KERNEL_HUB_USERNAME", "KERNEL_HUB_PASSWORD", "KERNEL_HUB_CREDENTIALS",
                          "KERNEL_HUB_ENDPOINT", "KERNEL_HUB_CREDENTIALS_HOST"}) {
      if (const char* v = std::getenv(n)) saved_.emplace_back(n, v);
      ::unsetenv(n);
    }
    ::setenv("KERNEL_HUB_CREDENTIALS", credentials_file.c_str(), 1);
  }
  ~ScopedCredentialEnv() {
    for (const char* n : {"KERNEL_HUB_USERNAME", "KERNEL_HUB_PASSWORD", "KERNEL_HUB_CREDENTIALS",
                          "KERNEL_HUB_ENDPOINT", "KERNEL_HUB_CREDENTIALS_HOST"})
      ::unsetenv(n);
    for (auto& [n, v] : saved_) ::setenv(n.c_str(), v.c_str(), 1);
  }

 private:
  std::vector<std::pair<std::string, std::string>> saved_;
};

// Pushes a one-layer artifact (config + layer + manifest by digest) and returns the
// manifest bytes and layer bytes.
struct Pushed {
  std::string layer;
  oci::Descriptor layer_desc;
  std::string manifest;
  oci::Descriptor manifest_desc;
};

Pushed push_artifact(Source& src, const std::string& repo, const std::filesystem::path& dir,
                     size_t layer_size, uint64_t seed) {
  Pushed p;
  p.layer = test_bytes(layer_size, seed);
  p.layer_desc = layer_descriptor(p.layer);
  push_bytes(src, repo, dir, "{}", oci::empty_descriptor());
  push_bytes(src, repo, dir, p.layer, p.layer_desc);
  p.manifest = artifact_manifest(p.layer_desc);
  p.manifest_desc = oci::describe(p.manifest, oci::kMediaTypeManifest);
  src.push_manifest(repo, p.manifest_desc.digest.str(), p.manifest, oci::kMediaTypeManifest);
  return p;
}

std::string index_of(const oci::Descriptor& manifest) {
  oci::Index idx;
  idx.artifact_type = std::string(oci::kArtifactTypeKernel);
  idx.manifests = {manifest};
  return oci::serialize(idx);
}

class RegistryTest : public ::testing::Test {
 protected:
  RegistryFixture reg;
  TempDir tmp{"kh-registry-test"};
  std::unique_ptr<Source> src;
  void SetUp() override {
    REQUIRE_REGISTRY(reg);
    src = registry_source(reg.oci_url(), fast_source_options());
  }
  http::Response raw(const std::string& method, const std::string& path,
                     std::vector<std::string> headers = {}, std::string body = "") {
    http::Options o = fast_source_options().http;
    http::Client c(o);
    http::Request r;
    r.method = method;
    r.url = reg.http_url() + path;
    r.headers = std::move(headers);
    r.body = std::move(body);
    return c.send(r);
  }
};

TEST_F(RegistryTest, PingAnswersEmptyJsonWithApiVersion) {  // quirk 1
  http::Response r = raw("GET", "/v2/");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.body, "{}");
  EXPECT_EQ(r.header("Docker-Distribution-Api-Version"), "registry/2.0");
}

TEST_F(RegistryTest, MonolithicPushThenHasBlobAndRangeRead) {
  std::string bytes = test_bytes(100000, 1);
  auto d = layer_descriptor(bytes);
  EXPECT_FALSE(src->has_blob("org/mono", d));
  push_bytes(*src, "org/mono", tmp.path(), bytes, d);
  EXPECT_TRUE(src->has_blob("org/mono", d));
  // A second push is a no-op (has_blob first) and must not fail.
  push_bytes(*src, "org/mono", tmp.path(), bytes, d);
  // Quirk 3: ranges answer 206 with Content-Range.
  http::Response r = raw("GET", "/v2/org/mono/blobs/" + d.digest.str(), {"Range: bytes=6-11"});
  EXPECT_EQ(r.status, 206);
  EXPECT_EQ(r.header("content-range"), "bytes 6-11/100000");
  EXPECT_EQ(r.body, bytes.substr(6, 6));
}

TEST_F(RegistryTest, PushRefusesFileThatDisagreesWithDescriptor) {
  auto d = layer_descriptor("abc");
  fs::write_file_atomic(tmp / "short", "ab");
  EXPECT_THROW(src->push_blob("org/x", d, tmp / "short"), Error);
}

TEST_F(RegistryTest, ChunkedPushUsesPatchesAndRoundTrips) {
  FaultProxy proxy(reg.port());
  SourceOptions o = fast_source_options();
  o.chunk_size = 1000;
  auto via_proxy = registry_source(proxy.oci_url(), o);
  std::string bytes = test_bytes(3500, 2);
  auto d = layer_descriptor(bytes);
  push_bytes(*via_proxy, "org/chunked", tmp.path(), bytes, d);
  EXPECT_EQ(proxy.count("PATCH", "/blobs/uploads/"), 4u);
  EXPECT_EQ(proxy.count("PUT", "/blobs/uploads/"), 1u);
  for (const auto& seen : proxy.requests()) EXPECT_TRUE(seen.range.empty());
  MemorySink sink(d);
  std::vector<BlobFetch> blobs{blob_fetch(d, &sink)};
  src->fetch_blobs("org/chunked", blobs, nullptr);
  ASSERT_TRUE(blobs[0].ok) << blobs[0].error;
  EXPECT_TRUE(sink.finish());
  EXPECT_EQ(sink.data(), bytes);
}

TEST_F(RegistryTest, ChunkedPushOfExactMultipleOfChunkSize) {
  SourceOptions o = fast_source_options();
  o.chunk_size = 1024;
  auto chunked = registry_source(reg.oci_url(), o);
  std::string bytes = test_bytes(4096, 3);
  auto d = layer_descriptor(bytes);
  push_bytes(*chunked, "org/chunked2", tmp.path(), bytes, d);
  EXPECT_TRUE(src->has_blob("org/chunked2", d));
}

TEST_F(RegistryTest, ManifestAndIndexByDigestAndTag) {
  Pushed p = push_artifact(*src, "org/pkg", tmp.path(), 5000, 4);
  std::string index = index_of(p.manifest_desc);
  Digest index_digest = sha256_of(index);
  src->push_manifest("org/pkg", index_digest.str(), index, oci::kMediaTypeIndex);
  src->push_manifest("org/pkg", "v1", index, oci::kMediaTypeIndex);

  FetchedManifest by_tag = src->get_manifest("org/pkg", "v1");
  EXPECT_EQ(by_tag.bytes, index);
  EXPECT_EQ(by_tag.digest, index_digest);
  EXPECT_EQ(by_tag.media_type, oci::kMediaTypeIndex);

  FetchedManifest by_digest = src->get_manifest("org/pkg", index_digest.str());
  EXPECT_EQ(by_digest.bytes, by_tag.bytes);

  FetchedManifest m = src->get_manifest("org/pkg", p.manifest_desc.digest.str());
  EXPECT_EQ(m.bytes, p.manifest);
  EXPECT_EQ(m.media_type, oci::kMediaTypeManifest);
  oci::Manifest parsed = oci::parse_manifest(m.bytes);
  EXPECT_EQ(parsed.layers.at(0).digest, p.layer_desc.digest);
}

TEST_F(RegistryTest, PushManifestUnderWrongDigestIsRefusedLocally) {
  Pushed p = push_artifact(*src, "org/wrong", tmp.path(), 10, 5);
  EXPECT_THROW(src->push_manifest("org/wrong", sha256_of("other").str(), p.manifest,
                                  oci::kMediaTypeManifest),
               Error);
}

TEST_F(RegistryTest, AcceptHeaderQuirk) {  // quirk 2
  Pushed p = push_artifact(*src, "org/accept", tmp.path(), 100, 6);
  src->push_manifest("org/accept", "v1", p.manifest, oci::kMediaTypeManifest);
  http::Response plain = raw("GET", "/v2/org/accept/manifests/v1");
  EXPECT_EQ(plain.status, 404);
  EXPECT_TRUE(contains(plain.body, "accept header does not support OCI manifests")) << plain.body;
  http::Response oci = raw("GET", "/v2/org/accept/manifests/v1",
                           {"Accept: " + std::string(oci::kMediaTypeManifest)});
  EXPECT_EQ(oci.status, 200);
  EXPECT_EQ(oci.header("etag"), "\"" + p.manifest_desc.digest.str() + "\"");
  EXPECT_EQ(src->get_manifest("org/accept", "v1").bytes, p.manifest);
}

TEST_F(RegistryTest, UploadPutWithoutOctetStreamIsRejectedByRegistry) {  // quirk 6
  std::string bytes = "quirk six";
  auto d = layer_descriptor(bytes);
  http::Response start = raw("POST", "/v2/org/q6/blobs/uploads/");
  ASSERT_EQ(start.status, 202);
  std::string loc = start.header("location");
  ASSERT_TRUE(loc.starts_with("http://127.0.0.1:")) << loc;  // quirk 5: absolute
  ASSERT_TRUE(contains(loc, "_state=")) << loc;
  http::Options o = fast_source_options().http;
  http::Client c(o);
  http::Request put;
  put.method = "PUT";
  put.url = loc + "&digest=" + d.digest.str();
  put.body = bytes;  // libcurl's default form Content-Type
  http::Response r = c.send(put);
  EXPECT_EQ(r.status, 400);
  EXPECT_TRUE(contains(r.body, "DIGEST_INVALID")) << r.body;
}

TEST_F(RegistryTest, ManifestWithMissingBlobNamesTheDigest) {  // quirk 9
  auto missing = layer_descriptor("never pushed");
  push_bytes(*src, "org/missing", tmp.path(), "{}", oci::empty_descriptor());
  std::string m = artifact_manifest(missing);
  try {
    src->push_manifest("org/missing", "v1", m, oci::kMediaTypeManifest);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "MANIFEST_BLOB_UNKNOWN")) << e.what();
    EXPECT_TRUE(contains(e.what(), missing.digest.str())) << e.what();
  }
}

TEST_F(RegistryTest, ListTagsAndUnknownRepository) {
  Pushed p = push_artifact(*src, "org/tags", tmp.path(), 10, 7);
  std::string index = index_of(p.manifest_desc);
  for (const char* tag : {"v1", "v2", "1.0.0"}) {
    src->push_manifest("org/tags", tag, index, oci::kMediaTypeIndex);
  }
  auto tags = src->list_tags("org/tags");
  std::sort(tags.begin(), tags.end());
  EXPECT_EQ(tags, (std::vector<std::string>{"1.0.0", "v1", "v2"}));
  try {
    src->list_tags("org/does-not-exist");
    FAIL() << "expected kNotFound";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kNotFound);
    EXPECT_TRUE(contains(e.what(), "org/does-not-exist")) << e.what();
  }
}

// A registry or mirror paging its tag list in a loop is refused, not followed for 10000 pages.
TEST_F(RegistryTest, TagListPagesInALoopAreRefused) {
  Pushed p = push_artifact(*src, "org/loop", tmp.path(), 10, 17);
  src->push_manifest("org/loop", "v1", index_of(p.manifest_desc), oci::kMediaTypeIndex);
  FaultProxy proxy(reg.port());
  FaultProxy::Rule next;
  next.method = "GET";
  next.path = "/tags/list";
  next.action = FaultProxy::Action::kHeader;
  next.header = "Link: </v2/org/loop/tags/list?last=v1>; rel=\"next\"";
  next.times = 100;
  proxy.add_rule(next);
  auto via = registry_source(proxy.oci_url(), fast_source_options());
  try {
    via->list_tags("org/loop");
    ADD_FAILURE() << "a looping tag list was followed to its end";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kRefused) << e.what();
    EXPECT_TRUE(contains(e.what(), "in a loop")) << e.what();
  }
  EXPECT_EQ(proxy.count("GET", "/tags/list"), 2u);
}

TEST_F(RegistryTest, NotFoundErrorsNameTheReference) {
  push_artifact(*src, "org/nf", tmp.path(), 10, 8);
  for (std::string ref : {std::string("nope"), sha256_of("nothing").str()}) {
    try {
      src->get_manifest("org/nf", ref);
      FAIL() << "expected kNotFound for " << ref;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kNotFound);
      EXPECT_TRUE(contains(e.what(), "repository org/nf has no tag or digest '" + ref + "'"))
          << e.what();
      EXPECT_TRUE(contains(e.what(), reg.oci_url())) << e.what();
    }
  }
}

TEST_F(RegistryTest, FetchBlobsInParallel) {
  std::vector<std::string> contents;
  std::vector<oci::Descriptor> descs;
  for (size_t i = 0; i < 6; ++i) {
    contents.push_back(test_bytes(1 + i * 300000, 100 + i));
    descs.push_back(layer_descriptor(contents.back()));
    push_bytes(*src, "org/many", tmp.path(), contents.back(), descs.back());
  }
  auto missing = layer_descriptor("not on the registry");
  std::vector<std::unique_ptr<MemorySink>> sinks;
  std::vector<BlobFetch> blobs;
  for (auto& d : descs) {
    sinks.push_back(std::make_unique<MemorySink>(d));
    blobs.push_back(blob_fetch(d, sinks.back().get()));
  }
  sinks.push_back(std::make_unique<MemorySink>(missing));
  blobs.push_back(blob_fetch(missing, sinks.back().get()));
  SourceOptions o = fast_source_options();
  o.http.max_parallel = 4;
  auto parallel = registry_source(reg.oci_url(), o);
  Progress progress("test", false);
  parallel->fetch_blobs("org/many", blobs, &progress);
  for (size_t i = 0; i < descs.size(); ++i) {
    ASSERT_TRUE(blobs[i].ok) << blobs[i].error;
    EXPECT_TRUE(sinks[i]->finish());
    EXPECT_EQ(sinks[i]->data(), contents[i]);
  }
  EXPECT_FALSE(blobs.back().ok);
  EXPECT_TRUE(contains(blobs.back().error, missing.digest.str())) << blobs.back().error;
  EXPECT_TRUE(contains(blobs.back().error, "404")) << blobs.back().error;
}

TEST_F(RegistryTest, InlineDataNeedsNoRequest) {
  FaultProxy proxy(reg.port());
  auto via_proxy = registry_source(proxy.oci_url(), fast_source_options());
  auto d = oci::empty_descriptor();
  MemorySink sink(d);
  std::vector<BlobFetch> blobs{blob_fetch(d, &sink)};
  via_proxy->fetch_blobs("org/inline", blobs, nullptr);
  ASSERT_TRUE(blobs[0].ok) << blobs[0].error;
  EXPECT_TRUE(sink.finish());
  EXPECT_EQ(proxy.total(), 0u);
}

TEST_F(RegistryTest, OfflineRefusesEverythingWithoutConnecting) {
  FaultProxy proxy(reg.port());
  SourceOptions o = fast_source_options();
  o.http.offline = true;
  auto offline = registry_source(proxy.oci_url(), o);
  auto d = layer_descriptor("x");
  MemorySink sink(d);
  std::vector<BlobFetch> blobs{blob_fetch(d, &sink)};
  EXPECT_THROW(offline->get_manifest("org/a", "v1"), Error);
  EXPECT_THROW(offline->fetch_blobs("org/a", blobs, nullptr), Error);
  EXPECT_THROW(offline->list_tags("org/a"), Error);
  try {
    offline->has_blob("org/a", d);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kOffline);
  }
  EXPECT_EQ(proxy.total(), 0u);
}

TEST_F(RegistryTest, StoppedRegistryIsANetworkErrorAndRestartKeepsData) {
  Pushed p = push_artifact(*src, "org/restart", tmp.path(), 10, 9);
  int port = reg.port();
  reg.stop();
  SourceOptions o = fast_source_options();
  o.http.max_attempts = 2;
  auto s = registry_source(reg.oci_url(), o);
  try {
    s->get_manifest("org/restart", p.manifest_desc.digest.str());
    FAIL() << "expected kNetwork";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kNetwork) << e.what();
  }
  ASSERT_TRUE(reg.start()) << reg.log();
  EXPECT_EQ(reg.port(), port);
  EXPECT_EQ(s->get_manifest("org/restart", p.manifest_desc.digest.str()).bytes, p.manifest);
}

// --- Basic auth (htpasswd) ---

class BasicAuthTest : public ::testing::Test {
 protected:
  RegistryFixture reg{RegistryFixture::Options{true, "alice", "s3cret-pass"}};
  TempDir tmp{"kh-basic-test"};
  void SetUp() override { REQUIRE_REGISTRY(reg); }
};

TEST_F(BasicAuthTest, RightCredentialsWork) {
  ScopedCredentialEnv env((tmp / "none.json").string());
  SourceOptions o = fast_source_options();
  o.username = "alice";
  o.password = "s3cret-pass";
  auto src = registry_source(reg.oci_url(), o);
  Pushed p = push_artifact(*src, "org/private", tmp.path(), 2000, 10);
  src->push_manifest("org/private", "v1", p.manifest, oci::kMediaTypeManifest);
  EXPECT_EQ(src->get_manifest("org/private", "v1").bytes, p.manifest);
  MemorySink sink(p.layer_desc);
  std::vector<BlobFetch> blobs{blob_fetch(p.layer_desc, &sink)};
  src->fetch_blobs("org/private", blobs, nullptr);
  ASSERT_TRUE(blobs[0].ok) << blobs[0].error;
  EXPECT_TRUE(sink.finish());
}

TEST_F(BasicAuthTest, MissingCredentialsGiveAuthErrorWithHint) {
  ScopedCredentialEnv env((tmp / "none.json").string());
  auto src = registry_source(reg.oci_url(), fast_source_options());
  try {
    src->get_manifest("org/private", "v1");
    FAIL() << "expected kAuth";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kAuth);
    EXPECT_TRUE(contains(e.what(), "KERNEL_HUB_USERNAME")) << e.what();
    EXPECT_TRUE(contains(e.what(), "credentials file")) << e.what();
  }
}

TEST_F(BasicAuthTest, WrongPasswordGivesAuthError) {
  ScopedCredentialEnv env((tmp / "none.json").string());
  SourceOptions o = fast_source_options();
  o.username = "alice";
  o.password = "wrong";
  auto src = registry_source(reg.oci_url(), o);
  try {
    src->list_tags("org/private");
    FAIL() << "expected kAuth";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kAuth);
    EXPECT_TRUE(contains(e.what(), "alice")) << e.what();
  }
}

TEST_F(BasicAuthTest, CredentialsFromEnvironmentAndFile) {
  auto file = tmp / "creds.json";
  ScopedCredentialEnv env(file.string());
  ::setenv("KERNEL_HUB_USERNAME", "alice", 1);
  ::setenv("KERNEL_HUB_PASSWORD", "s3cret-pass", 1);
  ::setenv("KERNEL_HUB_ENDPOINT", reg.oci_url().c_str(), 1);  // the registry they belong to
  auto from_env = registry_source(reg.oci_url(), fast_source_options());
  EXPECT_FALSE(from_env->has_blob("org/private", layer_descriptor("x")));
  ::unsetenv("KERNEL_HUB_ENDPOINT");
  ::unsetenv("KERNEL_HUB_USERNAME");
  ::unsetenv("KERNEL_HUB_PASSWORD");

  fs::write_file_atomic(
      file, R"({")" + reg.host() + R"(": {"username": "alice", "password": "s3cret-pass"}})");
  auto from_file = registry_source(reg.oci_url(), fast_source_options());
  EXPECT_FALSE(from_file->has_blob("org/private", layer_descriptor("x")));

  fs::write_file_atomic(file, "{not json");
  auto malformed = registry_source(reg.oci_url(), fast_source_options());
  try {
    malformed->has_blob("org/private", layer_descriptor("x"));
    FAIL() << "expected kInvalidInput";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
    EXPECT_TRUE(contains(e.what(), file.string())) << e.what();
  }
}

// KERNEL_HUB_USERNAME/PASSWORD belong to one registry: the one KERNEL_HUB_ENDPOINT names, or
// KERNEL_HUB_CREDENTIALS_HOST. Another registry (here: the same one through a proxy on another
// port, which records what it receives) never gets them, and its 401 error says why.
TEST_F(BasicAuthTest, EnvironmentCredentialsGoOnlyToTheRegistryTheyAreScopedTo) {
  ScopedCredentialEnv env((tmp / "none.json").string());
  ::setenv("KERNEL_HUB_USERNAME", "alice", 1);
  ::setenv("KERNEL_HUB_PASSWORD", "s3cret-pass", 1);
  const std::string basic = "Basic " + base64_encode("alice:s3cret-pass");
  FaultProxy other(reg.port());
  auto never_sent_to_other = [&] {
    for (const auto& s : other.requests())
      EXPECT_NE(s.authorization, basic) << "the password went to " << other.host() << s.target;
  };
  auto expect_refused = [&](const std::string& scoped_to) {
    auto via = registry_source(other.oci_url(), fast_source_options());
    try {
      via->list_tags("org/private");
      ADD_FAILURE() << "expected kAuth";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kAuth) << e.what();
      EXPECT_TRUE(contains(e.what(),
                           "KERNEL_HUB_USERNAME/KERNEL_HUB_PASSWORD are set but were "
                           "not sent to " +
                               other.host()))
          << e.what();
      EXPECT_TRUE(contains(e.what(), scoped_to)) << e.what();
      EXPECT_TRUE(contains(e.what(), "KERNEL_HUB_CREDENTIALS_HOST=" + other.host())) << e.what();
    }
    EXPECT_GE(other.total(), 1u);
    never_sent_to_other();
  };
  // Scoped by neither variable: sent nowhere.
  expect_refused("neither names one");
  // Scoped to the registry KERNEL_HUB_ENDPOINT names: it gets them, the other port does not.
  ::setenv("KERNEL_HUB_ENDPOINT", reg.oci_url().c_str(), 1);
  EXPECT_FALSE(registry_source(reg.oci_url(), fast_source_options())
                   ->has_blob("org/private", layer_descriptor("x")));
  expect_refused("scoped to " + reg.host());
  // KERNEL_HUB_CREDENTIALS_HOST overrides the endpoint's host.
  ::setenv("KERNEL_HUB_CREDENTIALS_HOST", other.host().c_str(), 1);
  EXPECT_FALSE(registry_source(other.oci_url(), fast_source_options())
                   ->has_blob("org/private", layer_descriptor("x")));
  bool sent = false;
  for (const auto& s : other.requests()) sent = sent || s.authorization == basic;
  EXPECT_TRUE(sent) << "KERNEL_HUB_CREDENTIALS_HOST did not send them to " << other.host();
  try {
    registry_source(reg.oci_url(), fast_source_options())->list_tags("org/private");
    ADD_FAILURE() << "the endpoint's registry still got the credentials";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kAuth) << e.what();
    EXPECT_TRUE(contains(e.what(), "scoped to " + other.host())) << e.what();
  }
  // A credentials file entry for the other host is used there, whatever the scope.
  ::unsetenv("KERNEL_HUB_CREDENTIALS_HOST");
  fs::write_file_atomic(
      tmp / "none.json",
      R"({")" + other.host() + R"(": {"username": "alice", "password": "s3cret-pass"}})");
  EXPECT_FALSE(registry_source(other.oci_url(), fast_source_options())
                   ->has_blob("org/private", layer_descriptor("x")));
}

// --- Bearer tokens through the proxy's fake realm ---

TEST_F(RegistryTest, BearerTokenIsFetchedOnceAndReused) {
  Pushed p = push_artifact(*src, "org/bearer", tmp.path(), 3000, 11);
  src->push_manifest("org/bearer", "v1", p.manifest, oci::kMediaTypeManifest);
  FaultProxy proxy(reg.port());
  proxy.enable_bearer("tok-123");
  ScopedCredentialEnv env((tmp / "none.json").string());
  auto via = registry_source(proxy.oci_url(), fast_source_options());

  EXPECT_EQ(via->get_manifest("org/bearer", "v1").bytes, p.manifest);
  EXPECT_TRUE(via->has_blob("org/bearer", p.layer_desc));
  MemorySink sink(p.layer_desc);
  std::vector<BlobFetch> blobs{blob_fetch(p.layer_desc, &sink)};
  via->fetch_blobs("org/bearer", blobs, nullptr);
  ASSERT_TRUE(blobs[0].ok) << blobs[0].error;
  EXPECT_TRUE(sink.finish());
  EXPECT_EQ(via->list_tags("org/bearer"), std::vector<std::string>{"v1"});
  EXPECT_EQ(proxy.token_requests(), 1u);
  // Only the first manifest request went out without the token.
  size_t unauthenticated = 0;
  for (const auto& s : proxy.requests()) {
    if (!s.target.starts_with("/token") && s.authorization != "Bearer tok-123") ++unauthenticated;
  }
  EXPECT_EQ(unauthenticated, 1u);
  // The token request carried the scope of the repository.
  for (const auto& s : proxy.requests()) {
    if (s.target.starts_with("/token")) {
      EXPECT_TRUE(contains(s.target, "service=fake")) << s.target;
      EXPECT_TRUE(contains(s.target, "scope=repository%3Aorg%2Fbearer%3Apull")) << s.target;
    }
  }

  // Pushing needs a push-scoped token: one more token request, then uploads go through.
  auto extra = test_bytes(500, 12);
  push_bytes(*via, "org/bearer", tmp.path(), extra, layer_descriptor(extra));
  EXPECT_EQ(proxy.token_requests(), 2u);
  EXPECT_TRUE(src->has_blob("org/bearer", layer_descriptor(extra)));
}

// A token realm gets the credentials of the registry that names it, wherever it is, and never
// the user's credentials for the realm's own host: else a registry could name another
// registry's token server (and scopes of its choosing), have a token minted with that
// registry's credentials and be handed it (a confused deputy).
TEST_F(RegistryTest, ATokenRealmGetsTheRegistrysCredentialsNeverItsOwn) {
  Pushed p = push_artifact(*src, "org/realm", tmp.path(), 10, 14);
  FaultProxy realm(reg.port());  // stands in for a token server on another host[:port]
  realm.enable_bearer("tok-far");
  FaultProxy proxy(reg.port());
  proxy.enable_bearer("tok-far", "http://127.0.0.1:" + std::to_string(realm.port()) + "/token");
  const auto file = tmp / "creds.json";
  ScopedCredentialEnv env(file.string());
  auto token_auth = [](const FaultProxy& server) {
    for (const auto& s : server.requests())
      if (s.target.starts_with("/token")) return s.authorization;
    return std::string("(no token request)");
  };
  {  // the registry's credentials (the environment's, scoped to it) go to its realm
    ::setenv("KERNEL_HUB_USERNAME", "alice", 1);
    ::setenv("KERNEL_HUB_PASSWORD", "registry-secret", 1);
    ::setenv("KERNEL_HUB_ENDPOINT", proxy.oci_url().c_str(), 1);
    auto via = registry_source(proxy.oci_url(), fast_source_options());
    EXPECT_EQ(via->get_manifest("org/realm", p.manifest_desc.digest.str()).bytes, p.manifest);
    EXPECT_EQ(token_auth(realm), "Basic " + base64_encode("alice:registry-secret"));
    ::unsetenv("KERNEL_HUB_USERNAME");
    ::unsetenv("KERNEL_HUB_PASSWORD");
  }
  // The deputy: the user has credentials for the realm's host only. The registry's token request
  // goes out anonymously; the realm's own entry is not spent on the registry's behalf.
  FaultProxy realm2(reg.port());
  realm2.enable_bearer("tok-far2");
  proxy.enable_bearer("tok-far2", "http://127.0.0.1:" + std::to_string(realm2.port()) + "/token");
  fs::write_file_atomic(file, R"({"127.0.0.1:)" + std::to_string(realm2.port()) +
                                  R"(": {"username": "bob", "password": "realm-secret"}})");
  auto via = registry_source(proxy.oci_url(), fast_source_options());
  EXPECT_EQ(via->get_manifest("org/realm", p.manifest_desc.digest.str()).bytes, p.manifest);
  EXPECT_EQ(token_auth(realm2), "")
      << "the realm host's own credentials were spent for " << proxy.host();
  // A realm on another host over plain HTTP would carry the registry's credentials in clear
  // text across the network: refused before anything is sent (192.0.2.1 is TEST-NET-1).
  proxy.enable_bearer("tok-far2", "http://192.0.2.1/token");
  fs::write_file_atomic(
      file, R"({")" + proxy.host() + R"(": {"username": "carol", "password": "registry-secret"}})");
  auto plain = registry_source(proxy.oci_url(), fast_source_options());
  try {
    plain->get_manifest("org/realm", p.manifest_desc.digest.str());
    ADD_FAILURE() << "the credentials went to a plain-HTTP realm on another host";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kRefused) << e.what();
    EXPECT_NE(std::string(e.what()).find("plain HTTP"), std::string::npos) << e.what();
  }
}

TEST_F(RegistryTest, ExpiredBearerTokenIsRefreshedOnce) {
  FaultProxy proxy(reg.port());
  proxy.enable_bearer("tok-abc");
  ScopedCredentialEnv env((tmp / "none.json").string());
  auto via = registry_source(proxy.oci_url(), fast_source_options());
  Pushed p = push_artifact(*src, "org/rotate", tmp.path(), 10, 13);
  EXPECT_EQ(via->get_manifest("org/rotate", p.manifest_desc.digest.str()).bytes, p.manifest);
  EXPECT_EQ(proxy.token_requests(), 1u);
  // The realm now hands out a new token and refuses the cached one (as after expiry).
  proxy.enable_bearer("tok-rotated");
  EXPECT_EQ(via->get_manifest("org/rotate", p.manifest_desc.digest.str()).bytes, p.manifest);
  EXPECT_EQ(proxy.token_requests(), 2u);
  // Blob downloads that hit 401 re-authenticate once and are retried.
  proxy.enable_bearer("tok-third");
  MemorySink sink(p.layer_desc);
  std::vector<BlobFetch> blobs{blob_fetch(p.layer_desc, &sink)};
  via->fetch_blobs("org/rotate", blobs, nullptr);
  ASSERT_TRUE(blobs[0].ok) << blobs[0].error;
  EXPECT_TRUE(sink.finish());
  EXPECT_EQ(proxy.token_requests(), 3u);
}

}  // namespace
}  // namespace kh::test
