#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "hub/base/error.h"
#include "hub/oci/address.h"
#include "hub/oci/ref.h"

namespace kh {

TEST(Ref, DefaultTagIsV1) {
  Ref r = Ref::parse("kernel-hub/norm");
  EXPECT_EQ(r.repo, "kernel-hub/norm");
  EXPECT_EQ(r.tag, "v1");
  EXPECT_FALSE(r.digest);
  EXPECT_EQ(r.str(), "kernel-hub/norm@v1");
}

TEST(Ref, TagsAndDigests) {
  EXPECT_EQ(Ref::parse("org/name@1.4.2").tag, "1.4.2");
  EXPECT_EQ(Ref::parse("org/sub/name@v2").repo, "org/sub/name");
  std::string d = "sha256:" + std::string(64, 'b');
  Ref r = Ref::parse("org/name@" + d);
  ASSERT_TRUE(r.digest);
  EXPECT_EQ(r.digest->str(), d);
  EXPECT_EQ(r.reference(), d);
  EXPECT_TRUE(r.tag.empty());
}

TEST(Ref, Rejections) {
  for (const char* bad :
       {"", "name", "Org/name", "org/name@", "org/name:v1", "org//name", "org/name@sha256:xyz",
        "org/name@md5:abc", "org/name@-bad", "/org/name", "org/name/"}) {
    try {
      Ref::parse(bad);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput) << bad;
      EXPECT_NE(std::string(e.what()).find("expected org/name"), std::string::npos) << e.what();
    }
  }
}

TEST(HubAddress, Kinds) {
  auto r = HubAddress::parse("oci://127.0.0.1:5000/team", false);
  EXPECT_EQ(r.kind, HubAddress::Kind::kRegistry);
  EXPECT_EQ(r.host, "127.0.0.1:5000");
  EXPECT_EQ(r.ns, "team");
  EXPECT_EQ(r.base_url, "https://127.0.0.1:5000");
  EXPECT_EQ(r.repo_path("org/x"), "team/org/x");
  EXPECT_EQ(HubAddress::parse("oci://h:1", true).base_url, "http://h:1");
  EXPECT_EQ(HubAddress::parse("https://cdn.example/hub/", false).kind,
            HubAddress::Kind::kHttpLayout);
  EXPECT_EQ(HubAddress::parse("https://cdn.example/hub/", false).base_url,
            "https://cdn.example/hub");
  auto d = HubAddress::parse("file:///srv/hub", false);
  EXPECT_EQ(d.kind, HubAddress::Kind::kDirLayout);
  EXPECT_EQ(d.dir, "/srv/hub");
  EXPECT_EQ(HubAddress::parse("/srv/hub", false).id(), d.id());
  EXPECT_THROW(HubAddress::parse("ftp://x", false), Error);
  EXPECT_THROW(HubAddress::parse("oci://", false), Error);
}

TEST(HubAddress, FuzzFindingsStayFixed) {
  // Found by fuzz_ref: a NUL inside a path, an http URL without a host, the root directory.
  EXPECT_THROW(HubAddress::parse(std::string("oci:/..72\0.0.0.1:5000/team", 27), false), Error);
  EXPECT_THROW(HubAddress::parse("https://", false), Error);
  EXPECT_THROW(HubAddress::parse("http:///x", false), Error);
  EXPECT_EQ(HubAddress::parse("/", false).id(), "dir/_");
}

// Parsing `address` is refused (kInvalidInput), its message holding `needle` and none of
// `secrets`.
static void expect_refused_unrepeated(const std::string& address,
                                      const std::vector<std::string>& secrets,
                                      const std::string& needle = "") {
  try {
    HubAddress::parse(address, false);
    ADD_FAILURE() << "accepted " << address;
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput) << address;
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    for (const auto& part : secrets)
      EXPECT_EQ(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

// A password in a static hub's address would reach messages, the hub's id and cache paths:
// refused, without repeating it; an '@' in the path is not a password.
TEST(HubAddress, PasswordsInTheAddressAreRefusedUnrepeated) {
  expect_refused_unrepeated("https://alice:s3cret@cdn.example/hub", {"s3cret"}, "credentials file");
  // A registry address takes no '@' anywhere: a password with an unencoded '/', '?' or '#'
  // (which ends a URL's authority early) is still taken for one.
  for (const char* address :
       {"oci://alice:s3cret@registry.example", "http://alice:s3cret@h/x",
        "oci://alice:s3c/r3t@registry.example/ns", "oci://alice:s3c?r3t@registry.example",
        "oci://alice:s3c#r3t@registry.example"}) {
    expect_refused_unrepeated(address, {"s3c", "r3t", "alice"});
  }
  EXPECT_EQ(HubAddress::parse("https://cdn.example/v@1/hub", false).kind,
            HubAddress::Kind::kHttpLayout);
}

// A static hub's URL may carry an '@' in its path, so there a password with an unencoded '/',
// '?' or '#' is caught by the authority it leaves behind: not HOST[:PORT], refused unrepeated.
TEST(HubAddress, AStaticHubsAuthorityIsAHostAndPort) {
  for (const char* address :
       {"https://alice:s3c/r3t@cdn.example/hub", "https://alice:s3c?r3t@cdn.example",
        "http://alice:s3c#r3t@cdn.example/x", "https://alice:/r3t@cdn.example", "https://s3c!r3t/x",
        "https://[::1/x", "https://[::1]s3c/x", "https://[::1]:/x", "https://h:123456/x",
        "https://h:8o/x"}) {
    expect_refused_unrepeated(address, {"s3c", "r3t", "alice", "::1", "123456", "8o"},
                              "not HOST[:PORT]");
  }
  // Nothing after the scheme is repeated where the address holds an '@', whatever else is wrong.
  for (const char* address :
       {"https://alice:p@ss/w0rd@cdn.example/hub", "HTTPS://alice:s3cret@cdn.example/hub",
        "https:///alice:s3cret@cdn.example", "oci://alice:p@ss/w0rd@registry.example/ns"}) {
    expect_refused_unrepeated(address, {"alice", "s3cret", "w0rd", "p@ss"});
  }
  for (const char* address : {"https://cdn.example/hub", "http://127.0.0.1:8080",
                              "https://b\xc3\xbc"
                              "cher.example/hub",
                              "https://[::1]:8443/hub", "https://[fe80::1%25eth0]/x",
                              "https://my_host.example:443/a@b/c", "http://h?x", "http://h#y"}) {
    EXPECT_EQ(HubAddress::parse(address, false).kind, HubAddress::Kind::kHttpLayout) << address;
  }
}

TEST(HubAddress, IdsAreStableAndSafe) {
  auto id = HubAddress::parse("oci://127.0.0.1:5000", false).id();
  EXPECT_EQ(id, "registry/127.0.0.1_5000");
  EXPECT_EQ(HubAddress::parse("/a/../b", false).id().find(".."), std::string::npos);
}

}  // namespace kh
