// Download client rules that need no server: backoff, offline refusal, scheme policy, and what
// it reads from response headers (the header block, Content-Range, WWW-Authenticate).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <string>
#include <string_view>

#include "hub/base/error.h"
#include "hub/base/progress.h"
#include "hub/transport/http.h"
#include "hub/transport/http_headers.h"

namespace kh::http {
namespace {

Options quick() {
  Options o;
  o.backoff_initial_s = 1.0;
  o.backoff_max_s = 8.0;
  return o;
}

TEST(Backoff, GrowsExponentiallyWithBoundedJitter) {
  Options o = quick();
  const double expected_base[] = {1, 2, 4, 8, 8, 8};
  for (int attempt = 1; attempt <= 6; ++attempt) {
    double base = expected_base[attempt - 1];
    for (int i = 0; i < 200; ++i) {
      double d = backoff_seconds(o, attempt, 0);
      EXPECT_GE(d, base) << "attempt " << attempt;
      EXPECT_LE(d, base * 1.25) << "attempt " << attempt;
    }
  }
}

TEST(Backoff, JitterActuallyVaries) {
  Options o = quick();
  double first = backoff_seconds(o, 3, 0);
  bool differs = false;
  for (int i = 0; i < 50 && !differs; ++i) differs = backoff_seconds(o, 3, 0) != first;
  EXPECT_TRUE(differs);
}

TEST(Backoff, CapHoldsForHugeAttemptCounts) {
  Options o = quick();
  EXPECT_LE(backoff_seconds(o, 1000, 0), o.backoff_max_s * 1.25);
  EXPECT_GE(backoff_seconds(o, 1000, 0), o.backoff_max_s);
}

TEST(Backoff, RetryAfterIsWaitedInFullPlusBoundedJitter) {
  Options o = quick();
  for (double asked : {1.0, 3.0, 30.0, 3600.0}) {
    bool varies = false;
    const double first = backoff_seconds(o, 5, asked);
    for (int i = 0; i < 200; ++i) {
      double d = backoff_seconds(o, 5, asked);
      EXPECT_GE(d, asked) << "never sooner than the registry asked";
      EXPECT_LE(d, asked * 1.10);
      varies = varies || d != first;
    }
    EXPECT_TRUE(varies) << "a fleet told the same Retry-After must not return in one burst";
  }
}

// The progress label is shortened from the middle so a line fits the terminal (a wrapped line
// leaves one behind at each \r redraw); short labels stay whole.
TEST(ProgressLabel, FitsTheTerminalKeepingBothEnds) {
  const std::string digest_ref =
      "kernel-hub/"
      "activation@sha256:a2b4abeb67fb7f1ad1197cad958f7906dabc20e9cd88786989751576fa503529";
  EXPECT_EQ(fit_label("org/x@v1", 60, 80), "org/x@v1");
  const std::string fitted = fit_label(digest_ref, 60, 80);
  EXPECT_EQ(fitted.size(), 19u);
  EXPECT_TRUE(fitted.starts_with("kernel-h")) << fitted;
  EXPECT_TRUE(fitted.ends_with("503529")) << fitted;
  EXPECT_NE(fitted.find("..."), std::string::npos) << fitted;
  EXPECT_EQ(fit_label(digest_ref, 60, 62), "k");
  EXPECT_EQ(fit_label(digest_ref, 60, 40), "");
}

TEST(Offline, SendIsRefusedBeforeAnyNetworkUse) {
  Options o;
  o.offline = true;
  o.allow_plain_http = true;
  Client client(o);
  Request r;
  r.url = "http://127.0.0.1:9/v2/";
  try {
    client.send(r);
    FAIL() << "expected kOffline";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kOffline);
    EXPECT_NE(std::string(e.what()).find("KERNEL_HUB_OFFLINE"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("GET http://127.0.0.1:9/v2/"), std::string::npos);
  }
  EXPECT_EQ(client.requests_made(), 0u);
}

class NullSink : public BlobSink {
 public:
  uint64_t offset() const override { return n_; }
  void write(const char*, size_t size) override { n_ += size; }
  void restart() override { n_ = 0; }

 private:
  uint64_t n_ = 0;
};

TEST(Offline, DownloadIsRefusedBeforeAnyNetworkUse) {
  Options o;
  o.offline = true;
  Client client(o);
  NullSink sink;
  std::vector<Download> jobs(1);
  jobs[0].url = "https://127.0.0.1:9/blob";
  jobs[0].sink = &sink;
  EXPECT_THROW(
      {
        try {
          client.download(jobs, nullptr);
        } catch (const Error& e) {
          EXPECT_EQ(e.kind(), ErrorKind::kOffline);
          throw;
        }
      },
      Error);
  EXPECT_EQ(client.requests_made(), 0u);
}

TEST(Offline, FromEnvReadsTheSwitch) {
  ::setenv("KERNEL_HUB_OFFLINE", "1", 1);
  EXPECT_TRUE(Options::from_env().offline);
  ::setenv("KERNEL_HUB_OFFLINE", "0", 1);
  EXPECT_FALSE(Options::from_env().offline);
  ::unsetenv("KERNEL_HUB_OFFLINE");
  EXPECT_FALSE(Options::from_env().offline);
}

TEST(Options, FromEnvOverridesAndRejectsGarbage) {
  ::setenv("KERNEL_HUB_MAX_ATTEMPTS", "3", 1);
  ::setenv("KERNEL_HUB_BACKOFF_S", "0.05", 1);
  ::setenv("KERNEL_HUB_STALL_TIMEOUT_S", "7", 1);
  ::setenv("KERNEL_HUB_CONNECT_TIMEOUT_MS", "1500", 1);
  ::setenv("KERNEL_HUB_CA_BUNDLE", "/etc/ssl/certs/ca-certificates.crt", 1);
  Options o = Options::from_env();
  EXPECT_EQ(o.max_attempts, 3);
  EXPECT_DOUBLE_EQ(o.backoff_initial_s, 0.05);
  EXPECT_EQ(o.low_speed_time_s, 7);
  EXPECT_EQ(o.connect_timeout_ms, 1500);
  EXPECT_EQ(o.ca_bundle, "/etc/ssl/certs/ca-certificates.crt");
  ::setenv("KERNEL_HUB_MAX_ATTEMPTS", "many", 1);
  EXPECT_THROW(Options::from_env(), Error);
  for (const char* v :
       {"KERNEL_HUB_MAX_ATTEMPTS", "KERNEL_HUB_BACKOFF_S", "KERNEL_HUB_STALL_TIMEOUT_S",
        "KERNEL_HUB_CONNECT_TIMEOUT_MS", "KERNEL_HUB_CA_BUNDLE"}) {
    ::unsetenv(v);
  }
}

// KERNEL_HUB_COMMAND_TIMEOUT_S: the deadline starts once (the Hub starts it; a Client made later
// keeps it), 0 means none, and once it has passed no request is even started.
TEST(Options, CommandDeadlineStartsOnceAndStopsEveryRequest) {
  using Clock = std::chrono::steady_clock;
  ::setenv("KERNEL_HUB_COMMAND_TIMEOUT_S", "5", 1);
  Options o = Options::from_env();
  EXPECT_EQ(o.command_timeout_s, 5);
  auto before = Clock::now();
  o.start_command_clock();
  auto deadline = o.command_deadline;
  EXPECT_GE(deadline, before + std::chrono::seconds(5));
  EXPECT_LE(deadline, Clock::now() + std::chrono::seconds(5));
  o.start_command_clock();
  EXPECT_EQ(o.command_deadline, deadline);
  ::setenv("KERNEL_HUB_COMMAND_TIMEOUT_S", "0", 1);
  Options none = Options::from_env();
  none.start_command_clock();
  EXPECT_EQ(none.command_deadline, Clock::time_point::max());
  ::setenv("KERNEL_HUB_COMMAND_TIMEOUT_S", "-1", 1);
  EXPECT_THROW(Options::from_env(), Error);
  ::unsetenv("KERNEL_HUB_COMMAND_TIMEOUT_S");
  EXPECT_EQ(Options::from_env().command_timeout_s, 7200);

  Options passed;
  passed.allow_plain_http = true;
  passed.command_deadline = Clock::now() - std::chrono::seconds(1);
  Client client(passed);
  Request r;
  r.url = "http://127.0.0.1:9/v2/";
  try {
    client.send(r);
    ADD_FAILURE() << "a request started after the command deadline";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kNetwork);
    EXPECT_NE(std::string(e.what()).find("GET http://127.0.0.1:9/v2/ could not start"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("KERNEL_HUB_COMMAND_TIMEOUT_S"), std::string::npos);
  }
  EXPECT_EQ(client.requests_made(), 0u);
}

TEST(Scheme, PlainHttpRefusedUnlessAllowed) {
  Options o;
  Client client(o);
  Request r;
  r.url = "http://127.0.0.1:9/v2/";
  try {
    client.send(r);
    FAIL() << "expected kInvalidInput";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
    EXPECT_NE(std::string(e.what()).find("http://127.0.0.1:9/v2/"), std::string::npos);
  }
  // A URL a server named: its query (an upload's state, a signature) and any user:password are
  // not repeated.
  r.url = "http://user:secret@127.0.0.1:9/v2/o/blobs/uploads/u?_state=SECRET&digest=d";
  try {
    client.send(r);
    FAIL() << "expected kInvalidInput";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("http://127.0.0.1:9/v2/o/blobs/uploads/u:"), std::string::npos) << what;
    EXPECT_EQ(what.find("SECRET"), std::string::npos) << what;
    EXPECT_EQ(what.find("secret"), std::string::npos) << what;
  }
  EXPECT_EQ(client.requests_made(), 0u);
  r.url = "ftp://127.0.0.1/x";
  EXPECT_THROW(client.send(r), Error);
}

TEST(Scheme, PlainHttpAllowedReachesTheNetwork) {
  Options o;
  o.allow_plain_http = true;
  o.max_attempts = 1;
  o.connect_timeout_ms = 2000;
  Client client(o);
  Request r;
  r.url = "http://127.0.0.1:9/v2/";  // discard port: nothing listens, connect is refused
  try {
    client.send(r);
    FAIL() << "expected kNetwork";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kNetwork);
  }
  EXPECT_EQ(client.requests_made(), 1u);
}

TEST(Scheme, DownloadJobWithForbiddenSchemeFailsWithoutNetwork) {
  Options o;
  Client client(o);
  NullSink sink;
  std::vector<Download> jobs(1);
  jobs[0].url = "http://127.0.0.1:9/blob";
  jobs[0].sink = &sink;
  client.download(jobs, nullptr);
  EXPECT_FALSE(jobs[0].ok);
  EXPECT_NE(jobs[0].error.find("http://127.0.0.1:9/blob"), std::string::npos);
  EXPECT_EQ(client.requests_made(), 0u);
}

TEST(Response, HeaderLookupIsCaseInsensitive) {
  Response r;
  r.headers["docker-content-digest"] = "sha256:abc";
  EXPECT_EQ(r.header("Docker-Content-Digest"), "sha256:abc");
  EXPECT_EQ(r.header("missing"), "");
}

TEST(Headers, TheFinalResponsesBlockWithLowerCasedNamesAndJoinedRepeats) {
  std::map<std::string, std::string> h;
  for (const char* line :
       {"HTTP/1.1 307 Temporary Redirect\r\n", "Location: /elsewhere\r\n", "\r\n",
        "HTTP/1.1 200 OK\r\n", "Content-Type:  application/json \r\n",
        "WWW-Authenticate: Bearer realm=\"a\"\r\n", "www-authenticate: Basic realm=\"b\"\r\n",
        "no colon here\r\n", "Empty:\r\n", "Empty: later\r\n", "Content-Type:\r\n"})
    add_header_line(h, line);
  EXPECT_EQ(h.count("location"), 0u) << "the redirect's headers are dropped";
  EXPECT_EQ(h.at("content-type"), "application/json");
  EXPECT_EQ(h.at("www-authenticate"), "Bearer realm=\"a\", Basic realm=\"b\"");
  // Empty elements of a list add nothing: no ", " before or after them.
  EXPECT_EQ(h.at("empty"), "later");
  EXPECT_EQ(h.size(), 3u);
}

TEST(Headers, BearerTokensAreVisibleAsciiOnly) {
  EXPECT_TRUE(bearer_token_ok("eyJhbGciOiJFUzI1NiJ9.eyJzdWIiOiJ4In0.c2ln-_~+/="));
  for (std::string_view bad :
       {std::string_view(""), std::string_view("a\r\nX-Injected: 1"), std::string_view("a\nb"),
        std::string_view("two words"), std::string_view("tab\t"), std::string_view("nul\0x", 5),
        std::string_view("caf\xc3\xa9"), std::string_view("del\x7f")})
    EXPECT_FALSE(bearer_token_ok(bad)) << bad;
}

TEST(Headers, ContentRangeStartTakesDigitsOnly) {
  EXPECT_EQ(content_range_start("bytes 100-199/200"), 100u);
  EXPECT_EQ(content_range_start("100-199/200"), 100u);  // the bare form (upload PATCH requests)
  EXPECT_EQ(content_range_start("bytes 18446744073709551615-0/1"), UINT64_MAX);
  // Not a start the client asked for: 0 (strtoull took a sign and wrapped "-5" to 2^64 - 5).
  for (const char* bad : {"", "bytes ", "bytes -5-9/10", " 5-9/10", "bytes +5-9/10",
                          "bytes 18446744073709551616-0/1", "bytes x", "*/200"})
    EXPECT_EQ(content_range_start(bad), 0u) << bad;
}

TEST(Headers, ChallengesPreferBearerAndUnquoteParameters) {
  Challenge c = parse_challenge(
      R"(Bearer realm="https://auth.example/token",service="registry.example",scope="repository:a/b:pull,push")");
  EXPECT_EQ(c.scheme, "bearer");
  EXPECT_EQ(c.params.at("realm"), "https://auth.example/token");
  EXPECT_EQ(c.params.at("service"), "registry.example");
  EXPECT_EQ(c.params.at("scope"), "repository:a/b:pull,push");
  // Basic first, then Bearer: Bearer's parameters; names lower-cased, escapes undone, unquoted
  // values up to the next comma.
  c = parse_challenge(R"(Basic realm="basic", BEARER Realm="r\"q",Service=plain,scope="s")");
  EXPECT_EQ(c.scheme, "bearer");
  EXPECT_EQ(c.params.at("realm"), "r\"q");
  EXPECT_EQ(c.params.at("service"), "plain");
  EXPECT_EQ(c.params.at("scope"), "s");
  c = parse_challenge(R"(Basic realm="registry")");
  EXPECT_EQ(c.scheme, "basic");
  EXPECT_EQ(c.params.at("realm"), "registry");
  // A scheme's name inside a quoted value is a value; Bearer's parameters stay its own when a
  // Basic challenge follows.
  c = parse_challenge(R"(Basic realm="bearer x")");
  EXPECT_EQ(c.scheme, "basic");
  EXPECT_EQ(c.params.at("realm"), "bearer x");
  c = parse_challenge(R"(Bearer realm="a",service="b", Basic realm="c")");
  EXPECT_EQ(c.scheme, "bearer");
  EXPECT_EQ(c.params.at("realm"), "a");
  EXPECT_EQ(c.params.at("service"), "b");
  // Neither Bearer nor Basic: the first offered.
  c = parse_challenge(R"(Negotiate, Digest realm="d", nonce="n")");
  EXPECT_EQ(c.scheme, "negotiate");
  EXPECT_TRUE(c.params.empty());
  // Cut short anywhere: what was read, nothing past the end.
  c = parse_challenge(R"(Bearer realm="unterminated)");
  EXPECT_EQ(c.params.at("realm"), "unterminated");
  EXPECT_TRUE(parse_challenge("Bearer").params.empty());
  EXPECT_TRUE(parse_challenge("").params.empty());
}

}  // namespace
}  // namespace kh::http
