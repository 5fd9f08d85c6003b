// The redirect policy the HTTP client follows hop by hop (redirect.h), without a server: which
// answers are followed, where, with which method, and which headers a hop keeps.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "hub/transport/redirect.h"

namespace kh::http {
namespace {

TEST(Redirect, OnlyTheFiveRedirectStatusesAreFollowed) {
  for (long s : {301L, 302L, 303L, 307L, 308L}) EXPECT_TRUE(is_redirect(s)) << s;
  for (long s : {200L, 206L, 300L, 304L, 305L, 306L, 309L, 401L, 404L}) {
    EXPECT_FALSE(is_redirect(s)) << s;
  }
}

TEST(Redirect, OriginIsSchemeHostAndPortWithoutUserinfo) {
  EXPECT_EQ(origin_of("https://Registry.Example:5000/v2/x?y#z"), "https://registry.example:5000");
  EXPECT_EQ(origin_of("http://user:pw@h/p"), "http://h");
  EXPECT_EQ(origin_of("HTTPS://h"), "https://h");
  EXPECT_EQ(origin_of("no-scheme/path"), "");
  // What stands before "://" is a scheme only in a scheme's characters: never a path or query.
  EXPECT_EQ(scheme_of("/p?sig=secret://x"), "");
  EXPECT_EQ(scheme_of("://x"), "");
  EXPECT_EQ(scheme_of("1http://x"), "");
  EXPECT_EQ(scheme_of("git+SSH://x"), "git+ssh");
  EXPECT_NE(origin_of("https://h/"), origin_of("http://h/"));
  EXPECT_NE(origin_of("https://h:1/"), origin_of("https://h:2/"));
}

TEST(Redirect, AShownUrlIsOriginAndPathOnly) {
  EXPECT_EQ(shown_url("https://u:pw@H:5000/v2/x/blobs/uploads/id?_state=s&digest=d#f"),
            "https://h:5000/v2/x/blobs/uploads/id");
  EXPECT_EQ(shown_url("http://h?sig=1"), "http://h");
  EXPECT_EQ(shown_url("http://h#frag"), "http://h");
  EXPECT_EQ(shown_url("http://h/"), "http://h/");
  EXPECT_EQ(shown_url("ftp://h/file"), "ftp://h/file");
  EXPECT_EQ(shown_url("no-scheme/path?q"), "no-scheme/path?q");  // a path the caller wrote
}

TEST(Redirect, AHopIsTakenAsAskedWithinTheRules) {
  Hop hop = next_hop("https://a/v2/blob", "https://storage.b/x?sig=1", 307, "GET", 0, false);
  EXPECT_EQ(hop.refusal, "");
  EXPECT_EQ(hop.url, "https://storage.b/x?sig=1");
  EXPECT_EQ(hop.method, "GET");
  EXPECT_TRUE(hop.keep_body);
  // Plain HTTP to plain HTTP where it is allowed, and up to https.
  EXPECT_EQ(next_hop("http://a/", "http://b/", 302, "GET", 3, true).refusal, "");
  EXPECT_EQ(next_hop("http://a/", "https://b/", 302, "GET", 3, false).refusal, "");
}

TEST(Redirect, MethodsChangeAsBrowsersAndLibcurlChangeThem) {
  struct Case {
    long status;
    const char* method;
    const char* method_after;
    bool keep_body;
  };
  const Case cases[] = {
      {303, "POST", "GET", false},   {303, "PUT", "GET", false},  {303, "HEAD", "HEAD", true},
      {301, "POST", "GET", false},   {302, "POST", "GET", false}, {301, "PUT", "PUT", true},
      {302, "PATCH", "PATCH", true}, {307, "POST", "POST", true}, {308, "PUT", "PUT", true},
      {302, "HEAD", "HEAD", true},   {303, "GET", "GET", false},
  };
  for (const Case& c : cases) {
    Hop hop = next_hop("https://a/x", "https://a/y", c.status, c.method, 0, false);
    EXPECT_EQ(hop.method, c.method_after) << c.status << " " << c.method;
    EXPECT_EQ(hop.keep_body, c.keep_body) << c.status << " " << c.method;
  }
}

TEST(Redirect, RefusalsNameHostsAndNeverTheTargetUrl) {
  // A signed storage URL is a credential for its life: messages name its host only.
  const std::string secret_target = "http://storage.b/blob?X-Amz-Signature=secret";
  Hop down = next_hop("https://a/v2/x", secret_target, 307, "GET", 0, true);
  EXPECT_NE(down.refusal.find("never follows a redirect from https to plain HTTP"),
            std::string::npos)
      << down.refusal;
  EXPECT_NE(down.refusal.find("storage.b"), std::string::npos);
  EXPECT_EQ(down.refusal.find("secret"), std::string::npos) << down.refusal;
  EXPECT_EQ(down.url, "");

  EXPECT_NE(next_hop("http://a/", "http://b/", 302, "GET", 0, false).refusal.find("--plain-http"),
            std::string::npos);
  EXPECT_NE(next_hop("http://a/", "ftp://b/x", 302, "GET", 0, true).refusal.find("'ftp'"),
            std::string::npos);
  EXPECT_NE(next_hop("http://a/", "file:///etc/passwd", 302, "GET", 0, true).refusal.find("'file'"),
            std::string::npos);
  EXPECT_NE(next_hop("https://a/", "", 302, "GET", 0, false).refusal.find("without a Location"),
            std::string::npos);
  const Hop odd = next_hop("http://a/", "/p?sig=secret://x", 302, "GET", 0, true);
  EXPECT_NE(odd.refusal.find("without a scheme"), std::string::npos) << odd.refusal;
  EXPECT_EQ(odd.refusal.find("secret"), std::string::npos) << odd.refusal;
}

// A write repeated as it was goes on only within its origin: elsewhere it would carry its body
// to a host the registry chose, with that host's client certificate.
TEST(Redirect, AWriteIsRepeatedOnlyWithinItsOrigin) {
  for (const char* method : {"PUT", "PATCH", "POST"}) {
    for (long status : {307L, 308L}) {
      const Hop away = next_hop("https://r/v2/x/blobs/uploads/1", "https://internal/x", status,
                                method, 0, false);
      EXPECT_EQ(away.url, "") << method << " " << status;
      EXPECT_NE(away.refusal.find("redirected a " + std::string(method) + " to internal"),
                std::string::npos)
          << away.refusal;
      EXPECT_EQ(next_hop("https://r/a", "https://r/b", status, method, 0, false).refusal, "");
    }
  }
  // Turned into a GET, it carries nothing: followed anywhere a GET is.
  EXPECT_EQ(next_hop("https://r/a", "https://elsewhere/b", 303, "PUT", 0, false).refusal, "");
  EXPECT_EQ(next_hop("https://r/a", "https://elsewhere/b", 302, "POST", 0, false).refusal, "");
  EXPECT_NE(next_hop("https://r/a", "https://elsewhere/b", 302, "PUT", 0, false).refusal, "");
}

TEST(Redirect, AChainEndsAfterTheLimit) {
  EXPECT_EQ(next_hop("https://a/", "https://a/", 302, "GET", kMaxRedirects - 1, false).refusal, "");
  Hop last = next_hop("https://a/", "https://b/", 302, "GET", kMaxRedirects, false);
  EXPECT_NE(last.refusal.find("more than " + std::to_string(kMaxRedirects) + " redirects"),
            std::string::npos)
      << last.refusal;
}

TEST(Redirect, AuthorizationStaysWithinTheFirstOrigin) {
  const std::vector<std::string> headers = {"Accept: application/json",
                                            "Authorization: Bearer t0k3n", " authorization : x",
                                            "X-Authorization-Hint: kept"};
  EXPECT_EQ(headers_for_hop(headers, "https://a:5000/v2/x", "https://A:5000/v2/y"), headers);
  const std::vector<std::string> stripped = {"Accept: application/json",
                                             "X-Authorization-Hint: kept"};
  for (const char* other :
       {"https://b:5000/v2/y", "https://a:5001/v2/y", "http://a:5000/v2/y", "https://a/v2/y"}) {
    EXPECT_EQ(headers_for_hop(headers, "https://a:5000/v2/x", other), stripped) << other;
  }
}

}  // namespace
}  // namespace kh::http
