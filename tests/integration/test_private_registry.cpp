// Private registries as users already run them, against real servers on 127.0.0.1: HTTPS with a
// test CA (docker-registry and nginx), trust from each variable and from certs.d, mTLS, Basic
// auth and token auth with credentials from docker's config.json, containers' auth.json and
// docker-credential helpers, identity tokens, a forward proxy, and a plain-HTTP server met over
// TLS. Every command runs the CLI with a clean environment of its own (HOME, config dirs, CA and
// proxy variables), so nothing from the machine's own files leaks in.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <fstream>
#include <memory>

#include "hub/base/base64.h"
#include "tests/fixtures/fault_proxy.h"
#include "tests/fixtures/layout_builder.h"
#include "tests/fixtures/nginx_fixture.h"
#include "tests/fixtures/process.h"
#include "tests/fixtures/registry_fixture.h"
#include "tests/fixtures/test_pki.h"
#include "tests/fixtures/token_server.h"

namespace kh::test {
namespace {

namespace stdfs = std::filesystem;

constexpr const char* kRef = "private/pkg@v1";

void write_text(const stdfs::path& p, const std::string& text, mode_t mode = 0644) {
  stdfs::create_directories(p.parent_path());
  std::ofstream(p) << text;
  ::chmod(p.c_str(), mode);
}

std::string basic_auth(const std::string& user, const std::string& password) {
  return base64_encode(user + ":" + password);
}

// A CLI run in an environment of its own: every variable that could point at the machine's
// credentials, CAs or proxies is unset or points into `home`.
class PrivateRegistry : public ::testing::Test {
 protected:
  Env clean_env() const {
    Env env;
    for (const char* name : {"DOCKER_CONFIG",
                             "REGISTRY_AUTH_FILE",
                             "XDG_RUNTIME_DIR",
                             "XDG_CONFIG_HOME",
                             "KERNEL_HUB_CA_BUNDLE",
                             "SSL_CERT_FILE",
                             "SSL_CERT_DIR",
                             "CURL_CA_BUNDLE",
                             "KERNEL_HUB_USERNAME",
                             "KERNEL_HUB_PASSWORD",
                             "KERNEL_HUB_CREDENTIALS_HOST",
                             "KERNEL_HUB_CREDENTIALS",
                             "KERNEL_HUB_ENDPOINT",
                             "KERNEL_HUB_OFFLINE",
                             "KERNEL_HUB_PLAIN_HTTP",
                             "http_proxy",
                             "https_proxy",
                             "HTTPS_PROXY",
                             "all_proxy",
                             "ALL_PROXY",
                             "no_proxy",
                             "NO_PROXY"}) {
      env[name] = "\x01";
    }
    env["HOME"] = home_.path().string();
    env["KERNEL_HUB_CERTS_D"] = certs_d_.path().string();
    env["KERNEL_HUB_BACKOFF_S"] = "0.05";
    return env;
  }

  // kernel-hub ARGS against `hub`, with `extra` over the clean environment.
  ProcessResult cli(const std::vector<std::string>& args, const std::string& hub,
                    const Env& extra = {}, bool plain_http = false) {
    std::vector<std::string> argv = {cli_path(), "--cache", (cache_ / "c").string(), "--hub", hub};
    if (plain_http) argv.push_back("--plain-http");
    argv.insert(argv.end(), args.begin(), args.end());
    Env env = clean_env();
    for (const auto& [k, v] : extra) env[k] = v;
    return run_process(argv, env, 120);
  }
  ProcessResult pull(const std::string& hub, const Env& extra = {}, bool plain_http = false) {
    stdfs::remove_all(cache_ / "c");  // each pull fetches again
    return cli({"pull", kRef}, hub, extra, plain_http);
  }
  // Pushes a fresh two-variant layout to `hub` as kRef.
  void push(const std::string& hub, const Env& extra = {}, bool plain_http = false) {
    TempDir layout("kh-layout");
    build_layout(layout.path(), LayoutSpec{});
    auto r = cli({"push", layout.path().string(), kRef}, hub, extra, plain_http);
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }

  // certs.d/HOST/NAME for the test's KERNEL_HUB_CERTS_D.
  void add_certs_d(const std::string& host, const std::string& name, const stdfs::path& from) {
    stdfs::create_directories(certs_d_ / host);
    stdfs::copy_file(from, certs_d_ / host / name, stdfs::copy_options::overwrite_existing);
  }

  TempDir home_{"kh-home"};
  TempDir certs_d_{"kh-certs-d"};
  TempDir cache_{"kh-cache"};
};

// ---------------------------------------------------------------- HTTPS and certificates

class PrivateHttps : public PrivateRegistry {
 protected:
  static void SetUpTestSuite() {
    pki_ = new TestPki();
    if (!pki_->available()) return;
    RegistryFixture::Options o;
    o.tls_cert = pki_->server_cert();
    o.tls_key = pki_->server_key();
    registry_ = new RegistryFixture(o);
  }
  static void TearDownTestSuite() {
    delete registry_;
    delete pki_;
    registry_ = nullptr;
    pki_ = nullptr;
  }
  void SetUp() override {
    if (!pki_->available()) GTEST_SKIP() << pki_->why();
    if (!registry_->available()) GTEST_SKIP() << registry_->why();
    if (!pushed_) {
      push(registry_->oci_url(), {{"KERNEL_HUB_CA_BUNDLE", pki_->ca_cert().string()}});
      pushed_ = !HasFatalFailure();
    }
  }
  void TearDown() override {
    if (HasFailure() && registry_) std::cerr << "registry log:\n" << registry_->log();
  }

  static inline TestPki* pki_ = nullptr;
  static inline RegistryFixture* registry_ = nullptr;
  static inline bool pushed_ = false;
};

TEST_F(PrivateHttps, UntrustedCaFailsAtOnceNamingWhatToSet) {
  auto start = std::chrono::steady_clock::now();
  auto r = pull(registry_->oci_url(), {{"KERNEL_HUB_BACKOFF_S", "2"}});
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_NE(r.exit_code, 0);
  for (const char* what : {"KERNEL_HUB_CA_BUNDLE", "SSL_CERT_FILE", "SSL_CERT_DIR",
                           "CURL_CA_BUNDLE", "certs.d", "system CA bundle"}) {
    EXPECT_NE(r.err.find(what), std::string::npos) << what << " not in: " << r.err;
  }
  EXPECT_NE(r.err.find(certs_d_.path().string() + "/" + registry_->host() + "/ca.crt"),
            std::string::npos)
      << r.err;
  EXPECT_LT(seconds, 2.0) << "a certificate nobody trusts was retried";
}

TEST_F(PrivateHttps, TrustFromKernelHubCaBundle) {
  auto r = pull(registry_->oci_url(), {{"KERNEL_HUB_CA_BUNDLE", pki_->ca_cert().string()}});
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST_F(PrivateHttps, TrustFromSslCertFile) {
  auto r = pull(registry_->oci_url(), {{"SSL_CERT_FILE", pki_->ca_cert().string()}});
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST_F(PrivateHttps, TrustFromCurlCaBundle) {
  auto r = pull(registry_->oci_url(), {{"CURL_CA_BUNDLE", pki_->ca_cert().string()}});
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST_F(PrivateHttps, TrustFromSslCertDir) {
  TempDir dir("kh-cert-dir");
  stdfs::copy_file(pki_->ca_cert(), dir / "test-ca.pem");
  auto rehash = run_process({"openssl", "rehash", dir.path().string()});
  ASSERT_EQ(rehash.exit_code, 0) << rehash.err;
  auto r = pull(registry_->oci_url(), {{"SSL_CERT_DIR", dir.path().string()}});
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST_F(PrivateHttps, KernelHubCaBundleWinsOverSslCertFile) {
  // The other CA's certificate in KERNEL_HUB_CA_BUNDLE: SSL_CERT_FILE's right one is not used.
  auto r =
      pull(registry_->oci_url(), {{"KERNEL_HUB_CA_BUNDLE", (pki_->dir() / "other_ca.crt").string()},
                                  {"SSL_CERT_FILE", pki_->ca_cert().string()}});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("KERNEL_HUB_CA_BUNDLE="), std::string::npos) << r.err;
}

TEST_F(PrivateHttps, TrustFromCertsD) {
  add_certs_d(registry_->host(), "ca.crt", pki_->ca_cert());
  auto r = pull(registry_->oci_url());
  EXPECT_EQ(r.exit_code, 0) << r.err;
  // certs.d is per host: the same CA under another port's directory does not count.
  stdfs::rename(certs_d_ / registry_->host(), certs_d_ / "127.0.0.1:1");
  auto other = pull(registry_->oci_url());
  EXPECT_NE(other.exit_code, 0);
}

// certs.d adds its CAs to the CA file, not in its place: the registry's CA from
// KERNEL_HUB_CA_BUNDLE still counts beside an unrelated CA in the host's certs.d (blob
// redirects to a CDN signed by a bundle CA depend on it).
TEST_F(PrivateHttps, CertsDAddsToTheCaBundle) {
  add_certs_d(registry_->host(), "ca.crt", pki_->dir() / "other_ca.crt");
  auto r = pull(registry_->oci_url(), {{"KERNEL_HUB_CA_BUNDLE", pki_->ca_cert().string()}});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  auto file = pull(registry_->oci_url(), {{"SSL_CERT_FILE", pki_->ca_cert().string()}});
  EXPECT_EQ(file.exit_code, 0) << file.err;
}

TEST_F(PrivateHttps, ProxyTunnelsHttps) {
  FaultProxy proxy(0);
  auto r = pull(registry_->oci_url(), {{"KERNEL_HUB_CA_BUNDLE", pki_->ca_cert().string()},
                                       {"https_proxy", "http://" + proxy.host()}});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_GT(proxy.count("CONNECT", registry_->host()), 0u);
}

// A static (layout) hub served by nginx over HTTPS, and with mTLS.
class PrivateStaticHttps : public PrivateRegistry {
 protected:
  void SetUp() override {
    if (!pki_.available()) GTEST_SKIP() << pki_.why();
    if (!NginxFixture::installed()) GTEST_SKIP() << "nginx is not installed";
    // Publish into a directory hub, then serve it.
    TempDir layout("kh-layout");
    build_layout(layout.path(), LayoutSpec{});
    auto r = cli({"push", layout.path().string(), kRef}, "file://" + hub_dir_.path().string());
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  // HTTPS with the test CA's server certificate; with mtls, clients must present one it signed.
  NginxFixture::Options tls(bool mtls = false) const {
    NginxFixture::Options o;
    o.tls_cert = pki_.server_cert();
    o.tls_key = pki_.server_key();
    if (mtls) o.client_ca = pki_.ca_cert();
    return o;
  }
  std::unique_ptr<NginxFixture> serve(bool mtls) {
    return std::make_unique<NginxFixture>(hub_dir_.path(), tls(mtls));
  }
  std::string host(const NginxFixture& n) const { return "127.0.0.1:" + std::to_string(n.port()); }
  // The test client certificate in `n`'s certs.d directory.
  void add_client_certificate(const NginxFixture& n) {
    add_certs_d(host(n), "client.cert", pki_.client_cert());
    add_certs_d(host(n), "client.key", pki_.client_key());
  }

  TestPki pki_;
  TempDir hub_dir_{"kh-static-hub"};
};

TEST_F(PrivateStaticHttps, PullsWithTheCa) {
  auto nginx = serve(false);
  auto untrusted = pull(nginx->base_url());
  EXPECT_NE(untrusted.exit_code, 0);
  EXPECT_NE(untrusted.err.find("KERNEL_HUB_CA_BUNDLE"), std::string::npos) << untrusted.err;
  auto r = pull(nginx->base_url(), {{"SSL_CERT_FILE", pki_.ca_cert().string()}});
  EXPECT_EQ(r.exit_code, 0) << r.err << nginx->error_log();
}

TEST_F(PrivateStaticHttps, MutualTlsWithACertsDClientCertificate) {
  auto nginx = serve(true);
  add_certs_d(host(*nginx), "ca.crt", pki_.ca_cert());
  auto without = pull(nginx->base_url());
  EXPECT_NE(without.exit_code, 0) << "nginx served a client without a certificate";
  add_client_certificate(*nginx);
  auto r = pull(nginx->base_url());
  EXPECT_EQ(r.exit_code, 0) << r.err << nginx->error_log();
}

// An https hub redirecting to plain HTTP is refused even with --plain-http: plain HTTP is for
// what the user names over it, and a redirect never downgrades a TLS request.
TEST_F(PrivateStaticHttps, ARedirectFromHttpsToPlainHttpIsRefused) {
  NginxFixture plain(hub_dir_.path());
  NginxFixture::Options o = tls();
  o.redirect_to = plain.base_url();
  NginxFixture front(hub_dir_.path(), o);
  const Env ca = {{"SSL_CERT_FILE", pki_.ca_cert().string()}};
  auto direct = pull(plain.base_url(), ca);
  ASSERT_EQ(direct.exit_code, 0) << direct.err;  // the hub itself serves
  auto r = pull(front.base_url(), ca, /*plain_http=*/true);
  EXPECT_NE(r.exit_code, 0) << "followed a redirect from https to " << plain.base_url();
  EXPECT_NE(r.err.find("never follows a redirect from https to plain HTTP"), std::string::npos)
      << r.err;
}

// docker-registry behind a TLS proxy that passes no X-Forwarded-Proto names its upload Location
// as http:// on the proxy's host and port. The push is refused there, naming the cause, before
// anything goes over plain HTTP (the access log has the POST and nothing after it: such a request
// at the TLS port would show as a 400 there); pulls through the proxy, which name no URL, work.
TEST_F(PrivateStaticHttps, AnHttpsRegistrysPlainHttpUploadLocationIsRefused) {
  RegistryFixture registry;
  if (!registry.available()) GTEST_SKIP() << registry.why();
  push(registry.oci_url(), {}, /*plain_http=*/true);
  NginxFixture::Options o = tls();
  o.proxy_to = registry.http_url();
  NginxFixture proxy(hub_dir_.path(), o);
  const Env ca = {{"SSL_CERT_FILE", pki_.ca_cert().string()}};
  const std::string hub = "oci://" + host(proxy);
  auto pulled = pull(hub, ca);
  ASSERT_EQ(pulled.exit_code, 0) << pulled.err << proxy.error_log();
  TempDir layout("kh-layout");
  build_layout(layout.path(), LayoutSpec{});  // fresh random layers: the push uploads them
  auto r = cli({"push", layout.path().string(), "private/other@v1"}, hub, ca);
  EXPECT_NE(r.exit_code, 0) << "pushed through " << hub;
  // The cause, not the client's https-only rule: that message repeated the whole upload URL and
  // advised --plain-http, which would make the whole address plain HTTP.
  EXPECT_NE(r.err.find("named a plain-HTTP URL on " + host(proxy)), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("X-Forwarded-Proto"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("_state="), std::string::npos) << "the upload URL repeated: " << r.err;
  // Nothing after the POST: the fixture's own start-up probe is the one plain-HTTP request (a
  // 400) before it.
  const std::string log = proxy.access_log();
  const size_t post = log.find("\"POST /v2/private/other/blobs/uploads/");
  ASSERT_NE(post, std::string::npos) << log;
  EXPECT_EQ(log.find('\n', post) + 1, log.size()) << "requests after the POST:\n" << log;
}

// A client certificate from a host's certs.d is that host's alone: a redirect to another host
// does not carry it (libcurl, following redirects itself, presented it to every hop that asked),
// and the other host gets what its own certs.d holds.
TEST_F(PrivateStaticHttps, AClientCertificateGoesToItsOwnHostOnly) {
  NginxFixture::Options storage_options = tls(/*mtls=*/true);
  storage_options.client_cert_optional = true;  // asks every client for one, takes none too
  NginxFixture storage(hub_dir_.path(), storage_options);
  NginxFixture::Options front_options = tls(/*mtls=*/true);
  front_options.redirect_to = storage.base_url();
  NginxFixture front(hub_dir_.path(), front_options);
  add_client_certificate(front);
  const Env ca = {{"SSL_CERT_FILE", pki_.ca_cert().string()}};

  auto r = pull(front.base_url(), ca);
  ASSERT_EQ(r.exit_code, 0) << r.err << front.error_log() << storage.error_log();
  ASSERT_NE(front.access_log().find("kh-client"), std::string::npos)
      << "the front never saw the certificate:\n"
      << front.access_log();
  const std::string seen = storage.access_log();
  EXPECT_NE(seen.find("GET /"), std::string::npos) << "the pull never reached " << host(storage);
  EXPECT_EQ(seen.find("kh-client"), std::string::npos)
      << "the front's client certificate went to " << host(storage) << ":\n"
      << seen;
}

TEST_F(PrivateStaticHttps, ARedirectedHostGetsItsOwnClientCertificate) {
  NginxFixture storage(hub_dir_.path(), tls(/*mtls=*/true));
  NginxFixture::Options front_options = tls();
  front_options.redirect_to = storage.base_url();
  NginxFixture front(hub_dir_.path(), front_options);
  add_client_certificate(storage);
  const Env ca = {{"SSL_CERT_FILE", pki_.ca_cert().string()}};

  auto r = pull(front.base_url(), ca);
  EXPECT_EQ(r.exit_code, 0) << r.err << storage.error_log();
  EXPECT_NE(storage.access_log().find("kh-client"), std::string::npos) << storage.access_log();
}

// A static hub behind HTTP Basic auth takes the credentials the user has for its host (here the
// credentials file); a password in the address is refused, as it would reach messages and
// cache paths.
TEST_F(PrivateStaticHttps, AStaticHubBehindBasicAuthTakesTheUsersCredentials) {
  NginxFixture::Options o;
  o.basic_user = "alice";
  o.basic_password = "static-secret";
  NginxFixture nginx(hub_dir_.path(), o);
  auto anonymous = pull(nginx.base_url());
  EXPECT_NE(anonymous.exit_code, 0);
  EXPECT_NE(anonymous.err.find("HTTP 401"), std::string::npos) << anonymous.err;
  EXPECT_NE(anonymous.err.find("docker login " + host(nginx)), std::string::npos) << anonymous.err;
  const stdfs::path creds = cache_ / "credentials.json";
  std::ofstream(creds) << R"({")" << host(nginx)
                       << R"(": {"username": "alice", "password": "static-secret"}})";
  auto r = pull(nginx.base_url(), {{"KERNEL_HUB_CREDENTIALS", creds.string()}});
  EXPECT_EQ(r.exit_code, 0) << r.err << nginx.error_log();
  std::ofstream(creds, std::ios::trunc)
      << R"({")" << host(nginx) << R"(": {"username": "alice", "password": "wrong"}})";
  auto wrong = pull(nginx.base_url(), {{"KERNEL_HUB_CREDENTIALS", creds.string()}});
  EXPECT_NE(wrong.exit_code, 0);
  EXPECT_NE(
      wrong.err.find("refuses the credentials for " + host(nginx) + " from " + creds.string()),
      std::string::npos)
      << wrong.err;
  auto inline_password =
      pull("http://alice:static-secret@" + host(nginx), {{"KERNEL_HUB_CREDENTIALS", ""}});
  EXPECT_EQ(inline_password.exit_code, 2) << inline_password.err;
  EXPECT_EQ(inline_password.err.find("static-secret"), std::string::npos)
      << "the password was repeated: " << inline_password.err;
}

// ---------------------------------------------------------------- plain HTTP met over TLS

TEST_F(PrivateRegistry, PlainHttpRegistryOverTlsFailsFastWithTheHint) {
  RegistryFixture registry;
  if (!registry.available()) GTEST_SKIP() << registry.why();
  auto start = std::chrono::steady_clock::now();
  // Default retry settings: a retried failure would take many seconds.
  auto r = pull(registry.oci_url(), {{"KERNEL_HUB_BACKOFF_S", "\x01"}});
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("--plain-http"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("plain HTTP, not TLS"), std::string::npos) << r.err;
  EXPECT_LT(seconds, 2.0) << r.err;
}

TEST_F(PrivateRegistry, PlainHttpProxyForwardsRequests) {
  RegistryFixture registry;
  if (!registry.available()) GTEST_SKIP() << registry.why();
  push(registry.oci_url(), {}, true);
  FaultProxy proxy(0);
  auto r = pull(registry.oci_url(), {{"http_proxy", "http://" + proxy.host()}}, true);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_GT(proxy.count("GET", "http://" + registry.host() + "/v2/"), 0u);
  // no_proxy takes the registry off the proxy.
  size_t before = proxy.total();
  auto direct = pull(registry.oci_url(),
                     {{"http_proxy", "http://" + proxy.host()}, {"no_proxy", "127.0.0.1"}}, true);
  ASSERT_EQ(direct.exit_code, 0) << direct.err;
  EXPECT_EQ(proxy.total(), before);
}

// ---------------------------------------------------------------- Basic auth

class PrivateBasicAuth : public PrivateRegistry {
 protected:
  static void SetUpTestSuite() {
    RegistryFixture::Options o;
    o.basic_auth = true;
    registry_ = new RegistryFixture(o);
  }
  static void TearDownTestSuite() {
    delete registry_;
    registry_ = nullptr;
  }
  void SetUp() override {
    if (!registry_->available()) GTEST_SKIP() << registry_->why();
    if (!pushed_) {
      push(registry_->oci_url(),
           {{"KERNEL_HUB_USERNAME", user()},
            {"KERNEL_HUB_PASSWORD", password()},
            {"KERNEL_HUB_CREDENTIALS_HOST", host()}},
           true);
      pushed_ = !HasFatalFailure();
    }
  }
  static std::string host() { return registry_->host(); }
  static std::string user() { return registry_->options().username; }
  static std::string password() { return registry_->options().password; }
  ProcessResult pull_plain(const Env& extra = {}) {
    return pull(registry_->oci_url(), extra, true);
  }

  // A docker-credential-test on a PATH of its own that answers `reply` for `host` (anything
  // else: "credentials not found"), and records each call in calls.log.
  Env helper_env(const std::string& reply) {
    write_text(bin_ / "docker-credential-test",
               "#!/bin/sh\n"
               "read server\n"
               "echo \"$1 $server\" >> " +
                   (bin_ / "calls.log").string() +
                   "\n"
                   "if [ \"$server\" = \"" +
                   host() + "\" ]; then\n  printf '%s' '" + reply +
                   "'\nelse\n  echo 'credentials not found in native keychain'\n  exit 1\nfi\n",
               0755);
    return {{"PATH", bin_.path().string() + ":" + std::getenv("PATH")}};
  }
  std::string helper_calls() const {
    std::ifstream in(bin_ / "calls.log");
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

  static inline RegistryFixture* registry_ = nullptr;
  static inline bool pushed_ = false;
  TempDir config_{"kh-docker-config"};
  TempDir bin_{"kh-bin"};
};

TEST_F(PrivateBasicAuth, NoCredentialsFailsNamingDockerLogin) {
  auto r = pull_plain();
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("docker login " + host()), std::string::npos) << r.err;
}

TEST_F(PrivateBasicAuth, DockerConfigAuths) {
  write_text(config_ / "config.json", R"({"auths": {"http://)" + host() + R"(/v2/": {"auth": ")" +
                                          basic_auth(user(), password()) + R"("}}})");
  auto r = pull_plain({{"DOCKER_CONFIG", config_.path().string()}});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  // The same file at ~/.docker/config.json.
  write_text(home_ / ".docker/config.json", R"({"auths": {")" + host() + R"(": {"auth": ")" +
                                                basic_auth(user(), password()) + R"("}}})");
  auto from_home = pull_plain();
  EXPECT_EQ(from_home.exit_code, 0) << from_home.err;
}

TEST_F(PrivateBasicAuth, WrongPasswordInDockerConfigNamesTheFile) {
  write_text(config_ / "config.json", R"({"auths": {")" + host() + R"(": {"auth": ")" +
                                          basic_auth(user(), "wrong") + R"("}}})");
  auto r = pull_plain({{"DOCKER_CONFIG", config_.path().string()}});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find((config_ / "config.json").string()), std::string::npos) << r.err;
}

TEST_F(PrivateBasicAuth, ContainersAuthJson) {
  const std::string auth =
      R"({"auths": {")" + host() + R"(": {"auth": ")" + basic_auth(user(), password()) + R"("}}})";
  write_text(config_ / "auth.json", auth);
  auto r = pull_plain({{"REGISTRY_AUTH_FILE", (config_ / "auth.json").string()}});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  TempDir run("kh-run");
  write_text(run / "containers/auth.json", auth);
  auto runtime = pull_plain({{"XDG_RUNTIME_DIR", run.path().string()}});
  EXPECT_EQ(runtime.exit_code, 0) << runtime.err;
  write_text(home_ / ".config/containers/auth.json", auth);
  auto from_home = pull_plain();
  EXPECT_EQ(from_home.exit_code, 0) << from_home.err;
}

TEST_F(PrivateBasicAuth, KernelHubVariablesStayOnTop) {
  // Right credentials in docker's file, wrong ones in the variables: the variables win (and fail).
  write_text(config_ / "config.json", R"({"auths": {")" + host() + R"(": {"auth": ")" +
                                          basic_auth(user(), password()) + R"("}}})");
  auto r = pull_plain({{"DOCKER_CONFIG", config_.path().string()},
                       {"KERNEL_HUB_USERNAME", user()},
                       {"KERNEL_HUB_PASSWORD", "wrong"},
                       {"KERNEL_HUB_CREDENTIALS_HOST", host()}});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("KERNEL_HUB_USERNAME/KERNEL_HUB_PASSWORD"), std::string::npos) << r.err;
}

TEST_F(PrivateBasicAuth, CredHelper) {
  Env env = helper_env(R"({"ServerURL": ")" + host() + R"(", "Username": ")" + user() +
                       R"(", "Secret": ")" + password() + R"("})");
  write_text(config_ / "config.json",
             R"({"auths": {}, "credHelpers": {")" + host() + R"(": "test"}})");
  env["DOCKER_CONFIG"] = config_.path().string();
  auto r = pull_plain(env);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(helper_calls().find("get " + host()), std::string::npos) << helper_calls();
}

TEST_F(PrivateBasicAuth, CredsStore) {
  Env env = helper_env(R"({"ServerURL": ")" + host() + R"(", "Username": ")" + user() +
                       R"(", "Secret": ")" + password() + R"("})");
  write_text(config_ / "config.json", R"({"credsStore": "test"})");
  env["DOCKER_CONFIG"] = config_.path().string();
  auto r = pull_plain(env);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(helper_calls().find("get " + host()), std::string::npos) << helper_calls();
}

// A helper's stderr is not its reply (helpers print warnings there; docker reads stdout only).
TEST_F(PrivateBasicAuth, HelperWarningsOnStderrAreNotTheReply) {
  write_text(bin_ / "docker-credential-test",
             "#!/bin/sh\nread server\necho 'WARNING: this helper is deprecated' >&2\n"
             "printf '%s' '{\"ServerURL\": \"" +
                 host() + "\", \"Username\": \"" + user() + "\", \"Secret\": \"" + password() +
                 "\"}'\n",
             0755);
  write_text(config_ / "config.json", R"({"credsStore": "test"})");
  auto r = pull_plain({{"DOCKER_CONFIG", config_.path().string()},
                       {"PATH", bin_.path().string() + ":" + std::getenv("PATH")}});
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

// A helper that closes its output and lingers is still held to the deadline (and killed).
TEST_F(PrivateBasicAuth, ALingeringHelperIsHeldToTheDeadline) {
  write_text(bin_ / "docker-credential-test", "#!/bin/sh\nexec >/dev/null 2>&1\nsleep 60\n", 0755);
  write_text(config_ / "config.json", R"({"credsStore": "test"})");
  const auto start = std::chrono::steady_clock::now();
  auto r = pull_plain({{"DOCKER_CONFIG", config_.path().string()},
                       {"PATH", bin_.path().string() + ":" + std::getenv("PATH")},
                       {"KERNEL_HUB_CREDENTIAL_HELPER_TIMEOUT_S", "1"}});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("did not answer within 1 s"), std::string::npos) << r.err;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
}

TEST_F(PrivateBasicAuth, MissingHelperIsNamed) {
  write_text(config_ / "config.json", R"({"credsStore": "kh-absent"})");
  auto r = pull_plain({{"DOCKER_CONFIG", config_.path().string()}});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("docker-credential-kh-absent"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("credsStore in " + (config_ / "config.json").string()), std::string::npos)
      << r.err;
}

TEST_F(PrivateBasicAuth, MalformedConfigIsNamed) {
  write_text(config_ / "config.json", R"({"auths": {")" + host() + R"(": {"auth": "!!"}}})");
  auto r = pull_plain({{"DOCKER_CONFIG", config_.path().string()}});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find((config_ / "config.json").string()), std::string::npos) << r.err;
  EXPECT_NE(r.err.find(".auth is not base64"), std::string::npos) << r.err;
}

// ---------------------------------------------------------------- token auth

class PrivateTokenAuth : public PrivateRegistry {
 protected:
  static void SetUpTestSuite() {
    pki_ = new TestPki();
    if (!pki_->available()) return;
    TokenServer::Options t;
    t.signer_key = pki_->signer_key();
    t.signer_cert = pki_->signer_cert();
    tokens_ = new TokenServer(t);
    RegistryFixture::Options o;
    o.token_realm = tokens_->realm();
    o.token_service = t.service;
    o.token_issuer = t.issuer;
    o.token_root_cert = pki_->signer_cert();
    registry_ = new RegistryFixture(o);
  }
  static void TearDownTestSuite() {
    delete registry_;
    delete tokens_;
    delete pki_;
    registry_ = nullptr;
    tokens_ = nullptr;
    pki_ = nullptr;
  }
  void SetUp() override {
    if (!pki_->available()) GTEST_SKIP() << pki_->why();
    if (!registry_->available()) GTEST_SKIP() << registry_->why();
    if (!pushed_) {
      // The realm is on another port than the registry: it gets the registry's credentials.
      push(registry_->oci_url(),
           {{"KERNEL_HUB_USERNAME", tokens_->options().username},
            {"KERNEL_HUB_PASSWORD", tokens_->options().password},
            {"KERNEL_HUB_CREDENTIALS_HOST", registry_->host()}},
           true);
      pushed_ = !HasFatalFailure();
    }
  }
  void TearDown() override {
    if (HasFailure() && registry_) std::cerr << "registry log:\n" << registry_->log();
  }
  ProcessResult pull_with_config(const std::string& config) {
    write_text(config_ / "config.json", config);
    return pull(registry_->oci_url(), {{"DOCKER_CONFIG", config_.path().string()}}, true);
  }

  static inline TestPki* pki_ = nullptr;
  static inline TokenServer* tokens_ = nullptr;
  static inline RegistryFixture* registry_ = nullptr;
  static inline bool pushed_ = false;
  TempDir config_{"kh-docker-config"};
};

TEST_F(PrivateTokenAuth, AnonymousIsRefused) {
  size_t refused = tokens_->refused();
  auto r = pull(registry_->oci_url(), {}, true);
  EXPECT_NE(r.exit_code, 0);
  EXPECT_GT(tokens_->refused(), refused);
  EXPECT_NE(r.err.find("anonymously"), std::string::npos) << r.err;
}

TEST_F(PrivateTokenAuth, PasswordFromDockerConfig) {
  size_t before = tokens_->password_grants();
  auto r = pull_with_config(R"({"auths": {")" + registry_->host() + R"(": {"auth": ")" +
                            basic_auth(tokens_->options().username, tokens_->options().password) +
                            R"("}}})");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_GT(tokens_->password_grants(), before);
}

// The user's credentials for the token server's own host are not the registry's: a registry
// could name that server as its realm to have a token minted with them (a confused deputy).
TEST_F(PrivateTokenAuth, TheRealmHostsOwnCredentialsAreNotSpentForTheRegistry) {
  size_t before = tokens_->password_grants();
  auto r = pull_with_config(R"({"auths": {")" + tokens_->host() + R"(": {"auth": ")" +
                            basic_auth(tokens_->options().username, tokens_->options().password) +
                            R"("}}})");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_EQ(tokens_->password_grants(), before) << r.err;
  EXPECT_NE(r.err.find("anonymously"), std::string::npos) << r.err;
}

TEST_F(PrivateTokenAuth, IdentityTokenFromDockerConfig) {
  size_t before = tokens_->refresh_grants();
  auto r = pull_with_config(R"({"auths": {")" + registry_->host() + R"(": {"identitytoken": ")" +
                            tokens_->options().identity_token + R"("}}})");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_GT(tokens_->refresh_grants(), before);
}

TEST_F(PrivateTokenAuth, WrongIdentityTokenIsRefused) {
  auto r = pull_with_config(R"({"auths": {")" + registry_->host() +
                            R"(": {"identitytoken": "not-the-token"}}})");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("identity token"), std::string::npos) << r.err;
}

// A token that a request header cannot carry is refused before it is sent: from the token server
// (whose address the registry names), a line break that would add a header of its choosing;
// from the user's docker config, a space.
TEST_F(PrivateTokenAuth, TokensNoHeaderCanCarryAreRefused) {
  const std::string config = R"({"auths": {")" + registry_->host() + R"(": {"auth": ")" +
                             basic_auth(tokens_->options().username, tokens_->options().password) +
                             R"("}}})";
  tokens_->answer_token("abc\r\nX-Injected: 1");
  auto r = pull_with_config(config);
  tokens_->answer_token("");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("token server " + tokens_->realm()), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("line break"), std::string::npos) << r.err;
  EXPECT_EQ(registry_->log().find("X-Injected"), std::string::npos) << "sent to the registry";
  r = pull_with_config(R"({"auths": {")" + registry_->host() +
                       R"(": {"registrytoken": "two words"}}})");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("registry token"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("config.json"), std::string::npos) << r.err;
  // And the server's real tokens still work.
  r = pull_with_config(config);
  EXPECT_EQ(r.exit_code, 0) << r.err;
}

TEST_F(PrivateTokenAuth, IdentityTokenFromAHelper) {
  TempDir bin("kh-bin");
  write_text(bin / "docker-credential-test",
             "#!/bin/sh\nprintf '%s' '{\"ServerURL\": \"x\", \"Username\": \"<token>\", "
             "\"Secret\": \"" +
                 tokens_->options().identity_token + "\"}'\n",
             0755);
  write_text(config_ / "config.json",
             R"({"credHelpers": {")" + registry_->host() + R"(": "test"}})");
  size_t before = tokens_->refresh_grants();
  auto r = pull(registry_->oci_url(),
                {{"DOCKER_CONFIG", config_.path().string()},
                 {"PATH", bin.path().string() + ":" + std::getenv("PATH")}},
                true);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_GT(tokens_->refresh_grants(), before);
}

}  // namespace
}  // namespace kh::test
