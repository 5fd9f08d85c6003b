// Source for an OCI distribution registry (distribution-spec v1.1, end-1..end-8), with
// Bearer token and Basic authentication. Quirks of docker-registry 2.8.2 (REFERENCE §2.4)
// are handled: OCI-only Accept matching, absolute upload Locations with a query, explicit
// octet-stream on upload PUTs, Content-Range without "bytes ", no Link paging.
#include <fmt/format.h>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <thread>

#include "hub/base/digest.h"
#include "hub/base/env.h"
#include "hub/base/error.h"
#include "hub/base/log.h"
#include "hub/oci/ref.h"
#include "hub/transport/credentials.h"
#include "hub/transport/http_headers.h"
#include "hub/transport/source.h"
#include "hub/transport/url.h"
#include "hub/transport/verifying_sink.h"
#include "hub/trust/signature.h"

namespace kh {

namespace {

using json = nlohmann::json;

constexpr uint64_t kMaxTokenBytes = 128 << 10;
constexpr const char* kManifestAccept =
    "Accept: application/vnd.oci.image.index.v1+json, "
    "application/vnd.oci.image.manifest.v1+json, "
    "application/vnd.docker.distribution.manifest.list.v2+json;q=0.5, "
    "application/vnd.docker.distribution.manifest.v2+json;q=0.5";

std::string percent_encode(std::string_view s) {
  static const char* hex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += hex[c >> 4];
      out += hex[c & 15];
    }
  }
  return out;
}

std::string append_query(const std::string& url, const std::string& param) {
  return url + (url.find('?') == std::string::npos ? "?" : "&") + param;
}

// The registry's {"errors":[{"code","message","detail"}]} as one line; raw text otherwise.
std::string registry_errors(const std::string& body) {
  auto parsed = json::parse(body, nullptr, false);
  std::string out;
  if (parsed.is_object() && parsed.contains("errors") && parsed["errors"].is_array()) {
    for (const auto& e : parsed["errors"]) {
      if (!e.is_object()) continue;
      std::string one = e.value("code", std::string());
      std::string msg = e.contains("message") && e["message"].is_string()
                            ? e["message"].get<std::string>()
                            : std::string();
      if (!msg.empty()) one += (one.empty() ? "" : ": ") + msg;
      if (e.contains("detail") && !e["detail"].is_null()) {
        one += " (" +
               (e["detail"].is_string() ? e["detail"].get<std::string>() : e["detail"].dump()) +
               ")";
      }
      out += (out.empty() ? "" : "; ") + one;
    }
    if (!out.empty()) return out;
  }
  std::string text = body.substr(0, 300);
  for (char& c : text) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  while (!text.empty() && text.back() == ' ') text.pop_back();
  return text;
}

std::string base_media_type(const std::string& content_type) {
  std::string t = content_type.substr(0, content_type.find(';'));
  while (!t.empty() && t.back() == ' ') t.pop_back();
  return t;
}

// The host of "host[:port]" ("[v6]:port" too), lower-cased.
std::string host_part(const std::string& host_port) {
  std::string host = host_port;
  if (host.starts_with("[")) {
    const size_t end = host.find(']');
    host = host.substr(1, end == std::string::npos ? 0 : end - 1);
  } else if (size_t colon = host.rfind(':'); colon != std::string::npos) {
    host.erase(colon);
  }
  for (char& c : host) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return host;
}

// Whether "host[:port]" names this machine (where plain HTTP crosses no network).
bool is_loopback(const std::string& host_port) {
  const std::string host = host_part(host_port);
  in_addr v4{};
  if (::inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (::inet_pton(AF_INET6, host.c_str(), &v6) == 1)
    return IN6_IS_ADDR_LOOPBACK(&v6) || (IN6_IS_ADDR_V4MAPPED(&v6) && v6.s6_addr[12] == 127);
  return host == "localhost";
}

class RegistrySource : public Source {
 public:
  RegistrySource(const HubAddress& address, const SourceOptions& options)
      : address_(address), options_(options), client_(client_options(address, options)) {}

  const HubAddress& address() const override { return address_; }

  FetchedManifest get_manifest(const std::string& repo, const std::string& reference) override {
    http::Request req;
    req.url = repo_url(repo) + "/manifests/" + reference;
    req.headers.push_back(kManifestAccept);
    req.max_body = oci::kMaxManifestBytes;
    http::Response resp = request(req, pull_scope(repo));
    if (resp.status == 404) {
      throw Error(ErrorKind::kNotFound, "repository " + repo + " has no tag or digest '" +
                                            reference + "' on " + address_.text + " (" +
                                            registry_errors(resp.body) + ")");
    }
    if (resp.status != 200) fail_status(resp, "GET", "manifest '" + reference + "' of " + repo);
    FetchedManifest m;
    m.bytes = std::move(resp.body);
    m.digest = sha256_of(m.bytes);
    std::string sent = resp.header("docker-content-digest");
    if (!sent.empty() && sent != m.digest.str()) {
      throw Error(ErrorKind::kIntegrity,
                  "manifest '" + reference + "' of " + repo + " from " + address_.text +
                      ": registry says Docker-Content-Digest " + sent + " but the bytes hash to " +
                      m.digest.str() + "; the registry or a proxy altered the document");
    }
    if (Digest::is_valid(reference) && Digest::parse(reference) != m.digest) {
      throw Error(ErrorKind::kIntegrity, "manifest " + reference + " of " + repo + " from " +
                                             address_.text + " hashes to " + m.digest.str() +
                                             "; refusing content that does not match its digest");
    }
    m.media_type = base_media_type(resp.header("content-type"));
    if (m.media_type.empty() || m.media_type == "application/json" ||
        m.media_type == "text/plain") {
      m.media_type = oci::peek_media_type(m.bytes);
    }
    return m;
  }

  void fetch_blobs(const std::string& repo, std::vector<BlobFetch>& blobs,
                   Progress* progress) override {
    std::vector<size_t> todo;
    for (size_t i = 0; i < blobs.size(); ++i) {
      BlobFetch& b = blobs[i];
      b.ok = false;
      b.error.clear();
      if (b.desc.data) {
        fetch_inline(b);
      } else {
        todo.push_back(i);
      }
    }
    if (todo.empty()) return;
    if (client_.options().offline) {
      throw Error(ErrorKind::kOffline, "offline mode: refusing GET " +
                                           blob_url(repo, blobs[todo[0]].desc) +
                                           "; unset KERNEL_HUB_OFFLINE or drop --offline to "
                                           "allow network access");
    }
    std::string scope = pull_scope(repo);
    for (int round = 0; round < 2 && !todo.empty(); ++round) {
      std::vector<std::unique_ptr<VerifyingSink>> sinks;
      std::vector<http::Download> jobs;
      std::string auth = auth_header(scope, address_.host);
      for (size_t i : todo) {
        // Sinks that verify themselves (the store's) are not hashed twice.
        sinks.push_back(blobs[i].sink->verifies_digest()
                            ? nullptr
                            : std::make_unique<VerifyingSink>(blobs[i].sink));
        http::Download d;
        d.url = blob_url(repo, blobs[i].desc);
        if (!auth.empty()) d.headers.push_back(auth);
        d.expected_size = static_cast<uint64_t>(blobs[i].desc.size);
        d.sink = sinks.back() ? static_cast<BlobSink*>(sinks.back().get()) : blobs[i].sink;
        jobs.push_back(std::move(d));
      }
      client_.download(jobs, progress);
      std::vector<size_t> unauthorized;
      for (size_t k = 0; k < todo.size(); ++k) {
        BlobFetch& b = blobs[todo[k]];
        const http::Download& d = jobs[k];
        if (d.ok) {
          Digest got = sinks[k] ? sinks[k]->digest() : b.desc.digest;
          if (got == b.desc.digest) {
            b.ok = true;
          } else {
            b.sink->restart();
            b.integrity = true;
            b.error = "blob " + b.desc.digest.str() + " from " + d.url + " hashes to " + got.str() +
                      ": corrupted in transit or on the registry; nothing was kept, "
                      "retry the pull and tell the hub operator if it persists";
          }
        } else if (d.status == 401 && round == 0) {
          unauthorized.push_back(todo[k]);
        } else if (d.status == 404) {
          b.error = "blob " + b.desc.digest.str() + " of " + repo + " not found on " +
                    address_.text + " (" + d.error + ")";
        } else {
          b.error = d.error;
          b.integrity = d.integrity;
        }
      }
      if (unauthorized.empty()) break;
      // The token expired or was never fetched: authenticate once through a HEAD, retry.
      {
        std::lock_guard lock(auth_mu_);
        tokens_.erase(token_key(address_.host, scope));
      }
      http::Request head;
      head.method = "HEAD";
      head.url = blob_url(repo, blobs[unauthorized[0]].desc);
      request(head, scope);
      todo = std::move(unauthorized);
    }
    for (size_t i : todo) {
      if (!blobs[i].ok && blobs[i].error.empty()) {
        blobs[i].error = "blob " + blobs[i].desc.digest.str() + " of " + repo + " on " +
                         address_.text + ": access denied after re-authentication; " + auth_hint();
      }
    }
  }

  bool has_blob(const std::string& repo, const oci::Descriptor& desc) override {
    return has_blob_with(repo, desc, pull_scope(repo));
  }

  // Push checks use the push scope, so a push needs one token, not two.
  bool has_blob_with(const std::string& repo, const oci::Descriptor& desc,
                     const std::string& scope) {
    http::Request req;
    req.method = "HEAD";
    req.url = blob_url(repo, desc);
    http::Response resp = request(req, scope);
    if (resp.status == 200) return true;
    if (resp.status == 404) return false;
    fail_status(resp, "HEAD", "blob " + desc.digest.str() + " of " + repo);
  }

  void push_blob(const std::string& repo, const oci::Descriptor& desc,
                 const std::filesystem::path& file) override {
    std::error_code ec;
    uint64_t size = std::filesystem::file_size(file, ec);
    if (ec) throw Error(ErrorKind::kIo, "cannot read " + file.string() + ": " + ec.message());
    if (size != static_cast<uint64_t>(desc.size)) {
      throw Error(ErrorKind::kIntegrity, "blob " + desc.digest.str() + ": file " + file.string() +
                                             " has " + std::to_string(size) +
                                             " bytes, descriptor says " +
                                             std::to_string(desc.size));
    }
    if (has_blob_with(repo, desc, push_scope(repo))) return;
    const int attempts = std::max(1, client_.options().max_attempts);
    for (int attempt = 1;; ++attempt) {
      try {
        upload_once(repo, desc, file, size);
        return;
      } catch (const Error& e) {
        // A broken upload session cannot be resumed reliably: start a fresh one.
        if (e.kind() != ErrorKind::kNetwork || attempt >= attempts) throw;
        if (has_blob_with(repo, desc, push_scope(repo))) return;
        std::this_thread::sleep_for(
            std::chrono::duration<double>(http::backoff_seconds(client_.options(), attempt, 0)));
      }
    }
  }

  void push_manifest(const std::string& repo, const std::string& reference, std::string_view bytes,
                     std::string_view media_type) override {
    Digest ours = sha256_of(bytes);
    if (Digest::is_valid(reference) && Digest::parse(reference) != ours) {
      throw Error(ErrorKind::kInvalidInput, "refusing to push a manifest under digest " +
                                                reference + ": its bytes hash to " + ours.str());
    }
    http::Request req;
    req.method = "PUT";
    req.url = repo_url(repo) + "/manifests/" + reference;
    req.headers.push_back("Content-Type: " + std::string(media_type));
    req.body = std::string(bytes);
    http::Response resp = request(req, push_scope(repo));
    if (resp.status != 201 && resp.status != 200 && resp.status != 202) {
      std::string errs = registry_errors(resp.body);
      if (errs.find("BLOB_UNKNOWN") != std::string::npos) {
        throw Error(ErrorKind::kInvalidInput, "registry " + address_.text + " refused manifest " +
                                                  ours.str() + " (" + reference + ") for " + repo +
                                                  ": it references a blob the registry does "
                                                  "not have: " +
                                                  errs +
                                                  "; push the blobs and child manifests first");
      }
      if (resp.status == 400 || resp.status == 413) {
        throw Error(ErrorKind::kInvalidInput, "registry " + address_.text + " refused manifest " +
                                                  ours.str() + " (" + reference + ") for " + repo +
                                                  ": HTTP " + std::to_string(resp.status) + ": " +
                                                  errs);
      }
      fail_status(resp, "PUT", "manifest " + ours.str() + " (" + reference + ") of " + repo);
    }
    std::string sent = resp.header("docker-content-digest");
    if (!sent.empty() && sent != ours.str()) {
      throw Error(ErrorKind::kIntegrity, "registry " + address_.text + " stored manifest " +
                                             reference + " of " + repo + " as " + sent +
                                             " but we sent " + ours.str() +
                                             "; the registry rewrote the document");
    }
  }

  // Bounded in total, not only per page: a registry or mirror answering endless pages (each
  // under the 4 MiB body limit) could otherwise grow the list without end.
  static constexpr size_t kMaxTags = 100000;
  static constexpr int kMaxTagPages = 10000;

  std::vector<std::string> list_tags(const std::string& repo) override {
    std::vector<std::string> tags;
    std::set<std::string> visited;
    std::string url = repo_url(repo) + "/tags/list";
    for (int page = 0; page < kMaxTagPages && !url.empty(); ++page) {
      if (!visited.insert(url).second)
        throw Error(ErrorKind::kRefused, "registry " + address_.text + " pages the tags of " +
                                             repo + " in a loop (" + url + " again); refused");
      http::Request req;
      req.url = url;
      http::Response resp = request(req, pull_scope(repo));
      if (resp.status == 404) {
        throw Error(ErrorKind::kNotFound, "repository " + repo + " not found on " + address_.text +
                                              " (" + registry_errors(resp.body) +
                                              "); check the name");
      }
      if (resp.status != 200) fail_status(resp, "GET", "tags of " + repo);
      auto doc = json::parse(resp.body, nullptr, false);
      if (!doc.is_object()) {
        throw Error(ErrorKind::kUnsupported, "GET " + url + ": tag list is not a JSON object");
      }
      if (doc.contains("tags") && doc["tags"].is_array()) {
        for (const auto& t : doc["tags"]) {
          // What is not a tag is not listed (nor kept): only names a ref can carry.
          if (!t.is_string() || !is_valid_tag(t.get_ref<const std::string&>())) continue;
          if (tags.size() == kMaxTags)
            throw Error(ErrorKind::kRefused,
                        "registry " + address_.text + " lists more than " +
                            std::to_string(kMaxTags) + " tags for " + repo +
                            "; refused (a tag list that long is not a kernel package's)");
          tags.push_back(t.get<std::string>());
        }
      }
      url = next_link(resp.header("link"));
    }
    return tags;
  }

  trust::SignatureSet get_signatures(const std::string& repo,
                                     const oci::Descriptor& index) override {
    trust::SignatureSet set;
    for (const oci::Descriptor& d : referrers(repo, index.digest)) {
      if (d.artifact_type != oci::kArtifactTypeSignature) continue;
      std::string what = repo + " signature " + d.digest.str() + " of " + index.digest.str();
      try {
        FetchedManifest m = get_manifest(repo, d.digest.str());
        oci::Manifest sig = oci::parse_manifest(m.bytes, what);
        if (sig.layers.size() != 1 || !sig.subject || sig.subject->digest != index.digest) continue;
        std::string bytes = fetch_small_blob(*this, repo, sig.layers[0], trust::kMaxEnvelopeBytes);
        set.add(trust::Envelope::parse(bytes, what));
      } catch (const Error& e) {
        // A broken or superseded referrer cannot make anything verify; the others still count.
        if (e.kind() == ErrorKind::kNetwork || e.kind() == ErrorKind::kAuth ||
            e.kind() == ErrorKind::kOffline)
          throw;
      }
    }
    return set;
  }

  void push_signature(const std::string& repo, const oci::Descriptor& index,
                      const trust::Envelope& envelope) override {
    std::string bytes = envelope.serialize();
    oci::Descriptor layer = oci::describe(bytes, oci::kArtifactTypeSignature);
    push_small_blob(*this, repo, layer, bytes);
    oci::Descriptor config = oci::empty_descriptor();
    config.data.reset();
    push_small_blob(*this, repo, config, "{}");
    oci::Manifest m;
    m.artifact_type = std::string(oci::kArtifactTypeSignature);
    m.config = config;
    m.layers.push_back(layer);
    oci::Descriptor subject;
    subject.media_type = index.media_type;
    subject.digest = index.digest;
    subject.size = index.size;
    m.subject = subject;
    std::string manifest = oci::serialize(m);
    oci::Descriptor self = oci::describe(manifest, oci::kMediaTypeManifest);
    self.artifact_type = m.artifact_type;
    push_manifest(repo, self.digest.str(), manifest, oci::kMediaTypeManifest);
    if (referrers_api(repo, index.digest)) return;  // the registry indexes subjects itself
    // No referrers API: maintain the referrers tag (pull, append, push). Two concurrent
    // signers can lose an update; the re-read below tells the loser.
    std::string tag = referrers_tag(index.digest);
    oci::Index list = referrers_tag_index(repo, index.digest);
    for (auto& d : list.manifests)
      if (d.digest == self.digest) return;
    list.manifests.push_back(self);
    push_manifest(repo, tag, oci::serialize(list), oci::kMediaTypeIndex);
    bool present = false;
    for (auto& d : referrers_tag_index(repo, index.digest).manifests)
      present = present || d.digest == self.digest;
    if (!present)
      throw Error(ErrorKind::kNetwork, "signing " + repo + "@" + index.digest.str() +
                                           ": another publisher replaced the "
                                           "referrers tag " +
                                           tag + " at the same time; run the command again");
  }

 private:
  static http::Options client_options(const HubAddress& a, const SourceOptions& o) {
    http::Options h = o.http;
    if (a.plain_http) h.allow_plain_http = true;
    return h;
  }

  // GET /v2/<name>/referrers/<digest>: the referrer descriptors, or nullopt when the registry
  // has no referrers API (404: docker-registry 2.8). A supporting registry never 404s here.
  std::optional<std::vector<oci::Descriptor>> referrers_api(const std::string& repo,
                                                            const Digest& subject) {
    http::Request req;
    req.url = repo_url(repo) + "/referrers/" + subject.str() +
              "?artifactType=" + percent_encode(oci::kArtifactTypeSignature);
    req.headers.push_back("Accept: " + std::string(oci::kMediaTypeIndex));
    req.max_body = oci::kMaxManifestBytes;
    http::Response resp = request(req, pull_scope(repo));
    if (resp.status == 404 || resp.status == 405) return std::nullopt;
    if (resp.status != 200)
      fail_status(resp, "GET", "referrers of " + subject.str() + " in " + repo);
    // Filtering is optional for the registry (OCI-Filters-Applied): callers filter again.
    return oci::parse_index(resp.body, "referrers of " + subject.str() + " in " + repo).manifests;
  }

  oci::Index referrers_tag_index(const std::string& repo, const Digest& subject) {
    try {
      FetchedManifest m = get_manifest(repo, referrers_tag(subject));
      return oci::parse_index(m.bytes, repo + ":" + referrers_tag(subject));
    } catch (const Error& e) {
      if (e.kind() != ErrorKind::kNotFound) throw;
      return oci::Index{};
    }
  }

  std::vector<oci::Descriptor> referrers(const std::string& repo, const Digest& subject) {
    if (auto api = referrers_api(repo, subject)) return *api;
    return referrers_tag_index(repo, subject).manifests;
  }

  std::string repo_url(const std::string& repo) const {
    return address_.base_url + "/v2/" + address_.repo_path(repo);
  }
  std::string blob_url(const std::string& repo, const oci::Descriptor& d) const {
    return repo_url(repo) + "/blobs/" + d.digest.str();
  }
  std::string pull_scope(const std::string& repo) const {
    return "repository:" + address_.repo_path(repo) + ":pull";
  }
  std::string push_scope(const std::string& repo) const {
    return "repository:" + address_.repo_path(repo) + ":pull,push";
  }
  static std::string token_key(const std::string& host, const std::string& scope) {
    return host + "|" + scope;
  }

  // A URL the registry names (an upload's Location, a Link) as an absolute one. An https
  // registry's may not go to plain HTTP (the client refuses such a URL too, but its message
  // repeats the URL and advises --plain-http, which would make the whole address plain HTTP):
  // docker-registry behind a TLS proxy that sets no X-Forwarded-Proto writes such Locations
  // (http://, the proxy's host and port), so the message names that cause.
  std::string absolute(const std::string& location) const {
    if (location.starts_with("https://")) return location;
    if (location.starts_with("http://")) {
      if (http::scheme_of(address_.base_url) == "https")
        throw Error(ErrorKind::kRefused,
                    fmt::format("registry {} named a plain-HTTP URL on {} for a request made over "
                                "https (an upload's Location, or a Link), and kernel-hub does not "
                                "send the registry's credentials or data unencrypted; behind a "
                                "TLS proxy, have the proxy pass X-Forwarded-Proto: https (or set "
                                "the registry's http.relativeurls: true)",
                                address_.host, http::host_of(location)));
      return location;
    }
    if (location.starts_with("/")) return address_.base_url + location;
    return address_.base_url + "/" + location;
  }

  std::string next_link(const std::string& link) const {
    // Link: </v2/org/name/tags/list?n=100&last=x>; rel="next"
    auto lt = link.find('<');
    auto gt = link.find('>', lt == std::string::npos ? 0 : lt);
    if (lt == std::string::npos || gt == std::string::npos) return "";
    if (link.find("rel=\"next\"", gt) == std::string::npos &&
        link.find("rel=next", gt) == std::string::npos) {
      return "";
    }
    return absolute(link.substr(lt + 1, gt - lt - 1));
  }

  // What to do about a refused authentication at `host` (the registry's, or a token realm's).
  std::string auth_hint(const std::string& host) const { return credentials_hint(host); }
  std::string auth_hint() const { return auth_hint(address_.host); }

  const std::optional<Credentials>& credentials() {
    std::lock_guard lock(auth_mu_);
    if (!credentials_loaded_) {
      credentials_ = load_credentials(options_, address_.host);
      credentials_loaded_ = true;
    }
    return credentials_;
  }

  // The Authorization header for a request to `host`, or "" (never sent to other hosts).
  std::string auth_header(const std::string& scope, const std::string& host) const {
    std::lock_guard lock(auth_mu_);
    if (host != address_.host) return "";
    auto it = tokens_.find(token_key(address_.host, scope));
    if (it == tokens_.end() && scope.ends_with(":pull")) {
      // A push token covers pulls of the same repository.
      it = tokens_.find(token_key(address_.host, scope + ",push"));
    }
    if (it != tokens_.end()) return "Authorization: Bearer " + it->second;
    if (!basic_header_.empty()) return basic_header_;
    return "";
  }

  void show_warnings(const http::Response& resp) {
    std::string w = resp.header("warning");
    std::lock_guard lock(auth_mu_);
    if (w.empty() || !warned_.insert(w).second) return;
    log_warning(fmt::format("{} says: {}", address_.host, w));
  }

  // Sends a request with the cached credentials; on 401 authenticates once and retries.
  http::Response request(const http::Request& base, const std::string& scope) {
    for (int round = 0;; ++round) {
      http::Request req = base;
      std::string auth = auth_header(scope, http::host_of(req.url));
      if (!auth.empty()) req.headers.push_back(auth);
      http::Response resp = client_.send(req);
      show_warnings(resp);
      if (resp.status == 403) {
        throw Error(ErrorKind::kAuth, base.method + " " + base.url + ": access denied (HTTP 403: " +
                                          registry_errors(resp.body) + "); " + auth_hint() +
                                          " with an account that may access " + scope);
      }
      if (resp.status != 401) return resp;
      // Answered by a host the registry redirected to (object storage, say): the registry's
      // credentials, and tokens minted with them, are for the registry alone, so that host's
      // challenge (a token realm of its choosing) is not answered.
      if (!resp.effective_url.empty() &&
          http::origin_of(resp.effective_url) != http::origin_of(req.url)) {
        throw Error(ErrorKind::kAuth,
                    base.method + " " + base.url + ": " + http::host_of(resp.effective_url) +
                        ", where the registry redirected it, asks for authentication (HTTP 401); "
                        "kernel-hub authenticates with the registry " +
                        address_.host +
                        " only, and never sends its credentials to a host a redirect names. "
                        "The registry's storage must accept the redirect as it is (a signed URL)");
      }
      if (round > 0) {
        std::string who = credentials() ? "as '" + credentials()->username + "' (from " +
                                              credentials()->origin + ")"
                                        : "anonymously";
        throw Error(ErrorKind::kAuth, "registry " + address_.host + " refused " + base.method +
                                          " " + base.url + " after authenticating " + who +
                                          " for " + scope + " (" + registry_errors(resp.body) +
                                          "); " + auth_hint());
      }
      authenticate(resp, scope);
    }
  }

  // Serialized, so that parallel callers needing the same token fetch it once.
  void authenticate(const http::Response& resp, const std::string& scope) {
    std::lock_guard lock(auth_mu_);
    http::Challenge ch = http::parse_challenge(resp.header("www-authenticate"));
    if (ch.scheme == "bearer") {
      std::string realm = ch.params["realm"];
      if (realm.empty()) {
        throw Error(ErrorKind::kUnsupported,
                    "registry " + address_.host + " sent a Bearer challenge without a realm");
      }
      std::set<std::string> scopes{scope};
      std::string hinted = ch.params["scope"];
      for (size_t i = 0; i < hinted.size();) {
        size_t sp = hinted.find(' ', i);
        std::string s = hinted.substr(i, sp == std::string::npos ? std::string::npos : sp - i);
        if (!s.empty()) scopes.insert(s);
        i = sp == std::string::npos ? hinted.size() : sp + 1;
      }
      // A registry token (docker config "registrytoken") is the bearer token itself.
      if (const auto& creds = credentials(); creds && !creds->registry_token.empty()) {
        if (!http::bearer_token_ok(creds->registry_token))
          throw Error(ErrorKind::kRefused,
                      "the registry token for " + address_.host + " from " + creds->origin +
                          " holds a space, control byte or non-ASCII byte, which a request "
                          "header cannot carry; fix or remove it there");
        tokens_[token_key(address_.host, scope)] = creds->registry_token;
        return;
      }
      tokens_[token_key(address_.host, scope)] = fetch_token(realm, ch.params["service"], scopes);
      return;
    }
    if (ch.scheme == "basic") {
      const auto& creds = credentials();
      if (creds && creds->username.empty()) {
        throw Error(ErrorKind::kAuth, "registry " + address_.host +
                                          " asks for a username and password (Basic auth) but "
                                          "the credentials from " +
                                          creds->origin +
                                          " hold only a token, which goes to Bearer token "
                                          "realms; " +
                                          auth_hint());
      }
      if (!creds) {
        throw Error(ErrorKind::kAuth, "registry " + address_.host +
                                          " requires a username and password (Basic auth); " +
                                          auth_hint());
      }
      basic_header_ =
          "Authorization: Basic " + base64_encode(creds->username + ":" + creds->password);
      return;
    }
    throw Error(ErrorKind::kAuth, "registry " + address_.host +
                                      " answered 401 with an unsupported challenge '" +
                                      resp.header("www-authenticate") + "'; " + auth_hint());
  }

  std::string fetch_token(const std::string& realm, const std::string& service,
                          const std::set<std::string>& scopes) {
    std::string url = realm;
    if (!service.empty()) url = append_query(url, "service=" + percent_encode(service));
    for (const auto& s : scopes) url = append_query(url, "scope=" + percent_encode(s));
    http::Request req;
    req.max_body = kMaxTokenBytes;
    // The registry's own credentials, wherever its realm is (as docker, containerd and
    // containers/image send them). Never the user's credentials for the realm's host: the
    // registry names the realm and the scopes, so it could have a token minted with another
    // registry's credentials (for that registry's repositories, push included) and be handed it.
    // The registry gains nothing here that a Basic challenge of its own would not give it.
    const std::string realm_host = http::host_of(realm);
    const std::optional<Credentials> creds = credentials();
    if (creds && host_part(realm_host) != host_part(address_.host) &&
        realm.starts_with("http://") && !is_loopback(realm_host))
      throw Error(ErrorKind::kRefused,
                  "registry " + address_.host + " names the token realm " + realm +
                      ", another host over plain HTTP: its credentials (from " + creds->origin +
                      ") would cross the network in clear text; refused, nothing sent. The "
                      "realm must be https (or on the registry's own host)");
    if (creds && !creds->identity_token.empty()) {
      // An identity token is an OAuth2 refresh token: POST it to the realm (distribution token
      // spec, "OAuth2 Token"), which answers an access_token.
      std::string joined;
      for (const auto& s : scopes) joined += (joined.empty() ? "" : " ") + s;
      req.method = "POST";
      req.url = realm;
      req.headers.push_back("Content-Type: application/x-www-form-urlencoded");
      // A redirect would re-POST the refresh token (the body) to wherever it points.
      req.follow_redirects = false;
      req.body = "grant_type=refresh_token&client_id=kernel-hub&refresh_token=" +
                 percent_encode(creds->identity_token) +
                 (service.empty() ? "" : "&service=" + percent_encode(service)) +
                 "&scope=" + percent_encode(joined);
    } else {
      req.url = url;
      if (creds && !creds->username.empty()) {
        req.headers.push_back("Authorization: Basic " +
                              base64_encode(creds->username + ":" + creds->password));
      }
    }
    http::Response resp = client_.send(req);
    if (resp.status == 401 || resp.status == 403) {
      std::string as = !creds ? "anonymously"
                              : "with " +
                                    std::string(creds->identity_token.empty()
                                                    ? "the password of '" + creds->username + "'"
                                                    : "an identity token") +
                                    " from " + creds->origin;
      throw Error(ErrorKind::kAuth, "token server " + realm + " refused a token for " +
                                        address_.host + " asked " + as + " (HTTP " +
                                        std::to_string(resp.status) + "); " + auth_hint());
    }
    if (resp.status != 200) {
      throw Error(ErrorKind::kAuth, "token server " + realm + " answered HTTP " +
                                        std::to_string(resp.status) + ": " +
                                        registry_errors(resp.body));
    }
    auto doc = json::parse(resp.body, nullptr, false);
    for (const char* field : {"token", "access_token"}) {
      if (doc.is_object() && doc.contains(field) && doc[field].is_string() &&
          !doc[field].get<std::string>().empty()) {
        std::string token = doc[field].get<std::string>();
        // The realm is the registry's to name: the token is not trusted to be header-safe.
        if (!http::bearer_token_ok(token))
          throw Error(ErrorKind::kRefused,
                      "token server " + realm + " answered a " + field +
                          " holding a space, control byte (a line break would start another "
                          "request header) or non-ASCII byte; refused, nothing sent with it");
        return token;
      }
    }
    throw Error(ErrorKind::kUnsupported,
                "token server " + realm + " answered without a token or access_token field");
  }

  [[noreturn]] void fail_status(const http::Response& resp, const std::string& method,
                                const std::string& what) const {
    std::string msg = method + " " + what + " on " + address_.text + " failed: HTTP " +
                      std::to_string(resp.status);
    std::string errs = registry_errors(resp.body);
    if (!errs.empty()) msg += ": " + errs;
    ErrorKind kind = ErrorKind::kUnsupported;
    if (resp.status == 404) kind = ErrorKind::kNotFound;
    if (resp.status == 401 || resp.status == 403) kind = ErrorKind::kAuth;
    if (resp.status == 400) kind = ErrorKind::kInvalidInput;
    if (resp.status == 408 || resp.status == 429 || resp.status >= 500) {
      kind = ErrorKind::kNetwork;
      msg +=
          "; " + http::refusal_advice(client_.options(), resp.status, resp.attempts, resp.waited_s);
    }
    throw Error(kind, msg);
  }

  void fetch_inline(BlobFetch& b) {
    try {
      auto raw = base64_decode(*b.desc.data);
      if (!raw) throw Error(ErrorKind::kIntegrity, "inline data is not valid base64");
      oci::verify_bytes(b.desc, *raw, "inline data of " + b.desc.digest.str());
      b.sink->restart();
      b.sink->write(raw->data(), raw->size());
      b.ok = true;
    } catch (const std::exception& e) {
      b.error = e.what();
    }
  }

  void upload_once(const std::string& repo, const oci::Descriptor& desc,
                   const std::filesystem::path& file, uint64_t size) {
    std::string scope = push_scope(repo);
    std::string what = "upload of blob " + desc.digest.str() + " to " + repo;
    http::Request start;
    start.method = "POST";
    start.url = repo_url(repo) + "/blobs/uploads/";
    http::Response resp = request(start, scope);
    if (resp.status == 201) return;  // a registry that mounted or accepted it already
    if (resp.status != 202) fail_status(resp, "POST", what);
    std::string location = resp.header("location");
    if (location.empty()) {
      throw Error(ErrorKind::kUnsupported,
                  "registry " + address_.text + " started an upload without a Location header");
    }
    location = absolute(location);

    const uint64_t chunk = options_.chunk_size;
    if (chunk > 0 && size > chunk) {
      for (uint64_t offset = 0; offset < size; offset += chunk) {
        uint64_t len = std::min(chunk, size - offset);
        http::Request patch;
        patch.method = "PATCH";
        patch.url = location;
        patch.retry = false;  // a half-sent chunk leaves the session in an unknown state
        patch.headers = {
            "Content-Type: application/octet-stream",
            "Content-Range: " + std::to_string(offset) + "-" + std::to_string(offset + len - 1)};
        patch.upload_file = file;
        patch.upload_offset = offset;
        patch.upload_length = len;
        http::Response r = request(patch, scope);
        if (r.status != 202) fail_status(r, "PATCH", what);
        if (!r.header("location").empty()) location = absolute(r.header("location"));
      }
    }
    http::Request put;
    put.method = "PUT";
    put.url = append_query(location, "digest=" + percent_encode(desc.digest.str()));
    put.retry = false;
    // docker-registry 2.8.2 answers DIGEST_INVALID without an explicit octet-stream type.
    put.headers = {"Content-Type: application/octet-stream"};
    if (!(chunk > 0 && size > chunk)) {
      put.upload_file = file;
      put.upload_offset = 0;
      put.upload_length = size;
    }
    http::Response r = request(put, scope);
    if (r.status != 201) fail_status(r, "PUT", what);
    std::string sent = r.header("docker-content-digest");
    if (!sent.empty() && sent != desc.digest.str()) {
      throw Error(ErrorKind::kIntegrity, "registry " + address_.text + " stored blob " +
                                             desc.digest.str() + " as " + sent);
    }
  }

  HubAddress address_;
  SourceOptions options_;
  http::Client client_;
  std::map<std::string, std::string> tokens_;  // (host|scope) -> bearer token
  std::string basic_header_;                   // set after a Basic challenge
  std::optional<Credentials> credentials_;
  bool credentials_loaded_ = false;
  std::set<std::string> warned_;
  // Guards the auth state above; recursive because authenticate() reads credentials().
  mutable std::recursive_mutex auth_mu_;
};

}  // namespace

std::unique_ptr<Source> open_registry_source(const HubAddress& address,
                                             const SourceOptions& options) {
  if (address.kind != HubAddress::Kind::kRegistry) {
    throw Error(ErrorKind::kInvalidInput,
                "hub address '" + address.text + "' is not an OCI registry (oci://HOST[:PORT])");
  }
  return std::make_unique<RegistrySource>(address, options);
}

}  // namespace kh
