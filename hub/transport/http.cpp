#include "hub/transport/http.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "hub/base/env.h"
#include "hub/base/error.h"
#include "hub/base/fs.h"
#include "hub/transport/curl_api.h"
#include "hub/transport/http_headers.h"
#include "hub/transport/redirect.h"
#include "hub/transport/tls.h"
#include "hub/transport/url.h"
#include "hub/transport/write_behind.h"

namespace kh::http {

namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kMaxErrorBody = 64 << 10;  // kept from failed blob responses for messages

// Loads libcurl (on first use only: commands that never touch the network never map it) and
// initialises it once per process.
const CurlApi& global_init() {
  const CurlApi& api = curl_api();
  static std::once_flag once;
  std::call_once(once, [&api] {
    if (api.global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
      throw Error(ErrorKind::kNetwork, "libcurl initialisation failed (curl_global_init)");
    }
  });
  return api;
}

bool retryable_status(long status) {
  return status == 408 || status == 429 || status == 500 || status == 502 || status == 503 ||
         status == 504;
}

bool transient_error(CURLcode rc) {
  switch (rc) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_PARTIAL_FILE:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_SSL_CONNECT_ERROR:
      return true;
    default:
      return false;
  }
}

void check_scheme(const Options& o, const std::string& url) {
  if (url.starts_with("https://")) return;
  if (url.starts_with("http://")) {
    if (o.allow_plain_http) return;
    throw Error(ErrorKind::kInvalidInput,
                "refusing plain-HTTP URL " + shown_url(url) +
                    ": only https is allowed; pass --plain-http (allow_plain_http) for a "
                    "registry on a trusted network");
  }
  throw Error(ErrorKind::kInvalidInput, "unsupported URL scheme in " + shown_url(url) +
                                            ": use https:// (or http:// when allowed)");
}

[[noreturn]] void throw_offline(const std::string& method, const std::string& url) {
  throw Error(ErrorKind::kOffline, "offline mode: refusing " + method + " " + shown_url(url) +
                                       "; unset KERNEL_HUB_OFFLINE or drop --offline to allow "
                                       "network access");
}

std::string excerpt(std::string_view body) {
  std::string s = trim(body.substr(0, 300));
  for (char& c : s) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return s;
}

// The PEM text of the CA file a handle would use: ca_bundle, else libcurl's default; read once a
// process per path (a bundle is a few hundred KiB), "" when there is none or it is unreadable.
std::string ca_file_text(CURL* h, const Options& o) {
  std::string path = o.ca_bundle;
  if (path.empty()) {
    char* fallback = nullptr;
    if (curl_api().easy_getinfo(h, CURLINFO_CAINFO, &fallback) == CURLE_OK && fallback)
      path = fallback;
  }
  if (path.empty()) return "";
  static std::mutex mu;
  static std::map<std::string, std::string> texts;
  std::lock_guard lock(mu);
  auto it = texts.find(path);
  if (it == texts.end()) {
    std::string text;
    try {
      text = fs::read_file(path, 64 << 20);
    } catch (const Error&) {  // libcurl reports an unusable file itself when it is the only one
    }
    it = texts.emplace(path, std::move(text)).first;
  }
  return it->second;
}

// Settings shared by small requests and blob downloads (REFERENCE §3.6).
void apply_common(CURL* h, const Options& o, const CertsD& certs, char* errbuf) {
  const CurlApi& api = curl_api();
  api.easy_setopt(h, CURLOPT_PROTOCOLS_STR, o.allow_plain_http ? "https,http" : "https");
  // Redirects are the client's to follow (redirect.h): each hop is set up for its own host.
  api.easy_setopt(h, CURLOPT_FOLLOWLOCATION, 0L);
  api.easy_setopt(h, CURLOPT_HTTP_VERSION, static_cast<long>(CURL_HTTP_VERSION_2TLS));
  api.easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, o.connect_timeout_ms);
  api.easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, o.low_speed_limit);
  api.easy_setopt(h, CURLOPT_LOW_SPEED_TIME, o.low_speed_time_s);
  api.easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  api.easy_setopt(h, CURLOPT_USERAGENT, o.user_agent.c_str());
  if (!o.ca_bundle.empty()) api.easy_setopt(h, CURLOPT_CAINFO, o.ca_bundle.c_str());
  if (!o.ca_dir.empty()) api.easy_setopt(h, CURLOPT_CAPATH, o.ca_dir.c_str());
  // KERNEL_HUB_CA_BUNDLE alone decides: libcurl's compiled-in directory (/etc/ssl/certs) would
  // otherwise still trust every system CA beside it.
  if (o.ca_exclusive) api.easy_setopt(h, CURLOPT_CAPATH, static_cast<char*>(nullptr));
  if (!certs.ca_pem.empty()) {
    // The host's certs.d CAs are added to the CA file, not put in its place: libcurl uses a
    // CAINFO_BLOB instead of CAINFO, so the blob holds both (copied by libcurl).
    std::string pem = ca_file_text(h, o);
    if (!pem.empty() && pem.back() != '\n') pem += '\n';
    pem += certs.ca_pem;
    curl_blob blob{pem.data(), pem.size(), CURL_BLOB_COPY};
    api.easy_setopt(h, CURLOPT_CAINFO_BLOB, &blob);
  }
  if (!certs.client_cert.empty()) {
    api.easy_setopt(h, CURLOPT_SSLCERT, certs.client_cert.c_str());
    api.easy_setopt(h, CURLOPT_SSLKEY, certs.client_key.c_str());
  }
  api.easy_setopt(h, CURLOPT_ERRORBUFFER, errbuf);
  errbuf[0] = 0;
}

std::string curl_cause(CURLcode rc, const char* errbuf) {
  std::string s = curl_api().easy_strerror(rc);
  if (errbuf && errbuf[0]) s += " (" + trim(errbuf) + ")";
  return s;
}

// OpenSSL's words for a server that answered a TLS hello in plain HTTP.
bool plain_http_answer(CURLcode rc, const char* errbuf) {
  if (rc != CURLE_SSL_CONNECT_ERROR || !errbuf) return false;
  std::string e = lower(errbuf);
  return e.find("wrong version number") != std::string::npos ||
         e.find("packet length too long") != std::string::npos ||
         e.find("http request") != std::string::npos;
}

bool tls_failure(CURLcode rc) {
  return rc == CURLE_PEER_FAILED_VERIFICATION || rc == CURLE_SSL_CACERT_BADFILE ||
         rc == CURLE_SSL_CERTPROBLEM || rc == CURLE_SSL_CONNECT_ERROR || rc == CURLE_SSL_CIPHER ||
         rc == CURLE_SSL_ISSUER_ERROR || rc == CURLE_SSL_CLIENTCERT;
}

// Whether another attempt could succeed: a server speaking plain HTTP, a certificate nobody
// trusts, an unreadable CA file answer the same every time.
bool worth_retrying(CURLcode rc, const char* errbuf) {
  return transient_error(rc) && !plain_http_answer(rc, errbuf);
}

// The failure with what to do about it: the --plain-http hint for a plain-HTTP server, where
// trust comes from for TLS failures, the network otherwise.
std::string failure_advice(CURLcode rc, const char* errbuf, const std::string& url,
                           const Options& o, const CertsD& certs) {
  const std::string host = host_of(url);
  if (plain_http_answer(rc, errbuf)) {
    return "the server at " + host +
           " answers plain HTTP, not TLS; if it is a plain-HTTP registry on a trusted network, "
           "pass --plain-http (or give the hub as http://... for a static hub)";
  }
  if (tls_failure(rc)) {
    CaSettings ca{o.ca_bundle, o.ca_dir, o.ca_origin};
    return "TLS with " + host + " failed; " + tls_hint(host, ca, certs);
  }
  return "check the network, proxy settings (https_proxy, no_proxy) and the hub address";
}

// The command deadline ran out (Options::command_timeout_s): `what` names the request ("GET URL
// was in flight", "... could not start"). Deterministic: nothing is tried after it.
// Seconds for messages: "2.5", "30".
std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*f", s == std::floor(s) ? 0 : 1, s);
  return buf;
}

std::string command_deadline_passed(const Options& o, const std::string& what,
                                    const std::string& cause) {
  return what + " when this command's deadline of " + std::to_string(o.command_timeout_s) +
         " s for hub work passed" + (cause.empty() ? std::string() : " (last: " + cause + ")") +
         "; nothing more is tried. Run the command again when the hub is faster, or raise "
         "KERNEL_HUB_COMMAND_TIMEOUT_S (seconds, 0 = no deadline)";
}

// How long to wait before the next attempt, or why there is none: a wait that would end past the
// command deadline is not started (the jitter alone is dropped when only it would cross it).
struct RetryWait {
  double seconds = 0;
  std::string refusal;  // not empty: do not retry, fail with this message
};

constexpr double kMaxRetryAfterS = 3600;

RetryWait plan_retry(const Options& o, int attempt, double retry_after_s,
                     Clock::time_point deadline, const std::string& what,
                     const std::string& cause) {
  RetryWait w;
  // One wait is bounded on its own too: with the command deadline off, a server asking for a
  // day would otherwise hold the command (and a blob past its transfer deadline) that long.
  if (retry_after_s > kMaxRetryAfterS) {
    w.refusal = what + ": the registry answered " + cause + " and asked to wait " +
                seconds_text(retry_after_s) + " s (Retry-After), more than the " +
                seconds_text(kMaxRetryAfterS) +
                " s kernel-hub waits at once; nothing more is tried. Run the command again "
                "later";
    return w;
  }
  w.seconds = backoff_seconds(o, attempt, retry_after_s);
  if (deadline == Clock::time_point::max()) return w;
  const double left = std::chrono::duration<double>(deadline - Clock::now()).count();
  if (w.seconds < left) return w;
  if (retry_after_s > 0 && retry_after_s < left) {
    w.seconds = retry_after_s;
    return w;
  }
  if (retry_after_s > 0) {
    w.refusal = what + ": the registry answered " + cause + " and asked to wait " +
                seconds_text(retry_after_s) + " s (Retry-After), more than the " +
                seconds_text(std::max(0.0, left)) + " s left of this command's deadline of " +
                std::to_string(o.command_timeout_s) +
                " s for hub work; nothing more is tried. Run the command again in " +
                seconds_text(retry_after_s) +
                " s, or raise KERNEL_HUB_COMMAND_TIMEOUT_S (seconds, 0 = no deadline)";
  } else {
    w.refusal = command_deadline_passed(o, what + " was to be retried", cause);
  }
  return w;
}

// A curl timeout in milliseconds: `cap_ms` (0 = none) bounded by what is left before `deadline`
// (time_point::max() = none), at least 1. 0 when neither bounds it.
long timeout_ms(long cap_ms, Clock::time_point deadline, Clock::time_point now) {
  if (deadline == Clock::time_point::max()) return cap_ms;
  // Rounded up: a timeout that fired a fraction of a millisecond early would look like time left.
  auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - now).count();
  left = std::max<int64_t>(1, left);
  return static_cast<long>(cap_ms > 0 ? std::min<int64_t>(cap_ms, left) : left);
}

struct SlistDeleter {
  void operator()(curl_slist* l) const { curl_api().slist_free_all(l); }
};
using Slist = std::unique_ptr<curl_slist, SlistDeleter>;

Slist make_headers(const std::vector<std::string>& headers) {
  const CurlApi& api = curl_api();
  curl_slist* list = nullptr;
  for (const auto& h : headers) list = api.slist_append(list, h.c_str());
  // No "Expect: 100-continue" round trip before uploads.
  list = api.slist_append(list, "Expect:");
  return Slist(list);
}

// ---- small requests ----

struct SendState {
  Response* response = nullptr;
  uint64_t max_body = 0;
  bool too_large = false;
  int upload_fd = -1;
  uint64_t upload_offset = 0;
  uint64_t upload_length = 0;
  uint64_t upload_pos = 0;  // relative to upload_offset
  std::string upload_error;
};

size_t send_write(char* data, size_t size, size_t nmemb, void* user) {
  auto* st = static_cast<SendState*>(user);
  size_t n = size * nmemb;
  if (st->response->body.size() + n > st->max_body) {
    st->too_large = true;
    return 0;
  }
  st->response->body.append(data, n);
  return n;
}

size_t send_header(char* data, size_t size, size_t nmemb, void* user) {
  auto* st = static_cast<SendState*>(user);
  add_header_line(st->response->headers, std::string_view(data, size * nmemb));
  return size * nmemb;
}

size_t send_read(char* buffer, size_t size, size_t nitems, void* user) {
  auto* st = static_cast<SendState*>(user);
  uint64_t left = st->upload_length - st->upload_pos;
  size_t want = static_cast<size_t>(std::min<uint64_t>(left, size * nitems));
  if (want == 0) return 0;
  ssize_t got =
      ::pread(st->upload_fd, buffer, want, static_cast<off_t>(st->upload_offset + st->upload_pos));
  if (got <= 0) {
    st->upload_error = got == 0 ? "file shorter than expected" : std::strerror(errno);
    return CURL_READFUNC_ABORT;
  }
  st->upload_pos += static_cast<uint64_t>(got);
  return static_cast<size_t>(got);
}

// libcurl rewinds the upload when it must resend it (redirects, auth).
int send_seek(void* user, curl_off_t offset, int origin) {
  auto* st = static_cast<SendState*>(user);
  if (origin != SEEK_SET || offset < 0 || static_cast<uint64_t>(offset) > st->upload_length) {
    return CURL_SEEKFUNC_CANTSEEK;
  }
  st->upload_pos = static_cast<uint64_t>(offset);
  return CURL_SEEKFUNC_OK;
}

struct FdCloser {
  int fd;
  ~FdCloser() {
    if (fd >= 0) ::close(fd);
  }
};

// ---- blob downloads ----

struct Transfer {
  Download* job = nullptr;
  // The hop this attempt asks (job->url, or where it redirected), and its headers (the job's,
  // less Authorization past the job's origin). Every retry starts again from job->url: a
  // redirect's target (a signed storage URL, say) may have expired.
  std::string url;
  int redirects = 0;
  // The job's sink behind the write-behind thread: offsets and restarts go through it (they wait
  // for the queued bytes), writes are queued.
  WriteBehind* behind = nullptr;
  WriteBehind::Lane* lane = nullptr;
  Progress* progress = nullptr;
  CURL* easy = nullptr;
  Slist headers;
  char errbuf[CURL_ERROR_SIZE] = {};
  enum class State { kWaiting, kRunning, kDone } state = State::kWaiting;
  Clock::time_point not_before{};
  Clock::time_point deadline = Clock::time_point::max();  // over every attempt of this blob
  bool command_deadline_bounds = false;  // this attempt's timeout is the command deadline
  int failures = 0;
  double waited_s = 0;  // seconds this blob's retries were to wait (backoff and Retry-After)
  // Per attempt:
  uint64_t start_offset = 0;
  std::string range;  // CURLOPT_RANGE's text while the attempt runs ("" = none)
  bool body_started = false;
  bool to_sink = false;
  std::map<std::string, std::string> response_headers;
  std::string error_body;
  std::string abort_reason;      // set when the write callback stopped the transfer
  bool abort_final = false;      // ...for a reason a retry would meet again (fail at once)
  bool abort_integrity = false;  // ...because the bytes were not the ones named
  std::string last_cause;

  void restart_sink() {
    uint64_t had = behind->offset(*lane);
    behind->restart(*lane);
    if (progress && had > 0) progress->advance(-static_cast<int64_t>(had));
  }

  // Why the sink refused bytes: kept for finish(), which fails at once when another attempt
  // would meet the same (more bytes than the descriptor says, a disk error).
  void sink_failed(std::exception_ptr error) {
    try {
      std::rethrow_exception(error);
    } catch (const Error& e) {
      abort_reason = e.what();
      abort_final = e.kind() == ErrorKind::kIntegrity || e.kind() == ErrorKind::kRefused ||
                    e.kind() == ErrorKind::kIo;
      abort_integrity = e.kind() == ErrorKind::kIntegrity;
    } catch (const std::exception& e) {
      abort_reason = e.what();
    } catch (...) {
      abort_reason = "unknown error while writing the blob";
    }
  }
};

size_t transfer_header(char* data, size_t size, size_t nmemb, void* user) {
  auto* t = static_cast<Transfer*>(user);
  add_header_line(t->response_headers, std::string_view(data, size * nmemb));
  return size * nmemb;
}

// Never lets an exception cross into libcurl: a throwing sink aborts the transfer.
size_t transfer_write(char* data, size_t size, size_t nmemb, void* user) {
  auto* t = static_cast<Transfer*>(user);
  size_t n = size * nmemb;
  try {
    if (!t->body_started) {
      t->body_started = true;
      long code = 0;
      curl_api().easy_getinfo(t->easy, CURLINFO_RESPONSE_CODE, &code);
      t->to_sink = code == 200 || code == 206;
      if (code == 200 && t->start_offset > 0) {
        // The server ignored Range and sends the whole blob: start over.
        t->restart_sink();
        t->start_offset = 0;
      } else if (code == 206) {
        auto it = t->response_headers.find("content-range");
        uint64_t start = it == t->response_headers.end() ? 0 : content_range_start(it->second);
        if (start != t->start_offset) {
          t->abort_reason = "server answered a Range request for offset " +
                            std::to_string(t->start_offset) + " with Content-Range '" +
                            (it == t->response_headers.end() ? "" : it->second) + "'";
          return 0;
        }
      }
    }
    if (!t->to_sink) {
      if (t->error_body.size() < kMaxErrorBody) {
        t->error_body.append(data, std::min(n, kMaxErrorBody - t->error_body.size()));
      }
      return n;
    }
    // The sink's work happens on the write-behind thread; an error it met stops the transfer.
    if (std::exception_ptr failed = t->behind->error(*t->lane)) std::rethrow_exception(failed);
    t->behind->push(*t->lane, data, n);
    if (t->progress) t->progress->advance(static_cast<int64_t>(n));
    return n;
  } catch (...) {
    t->sink_failed(std::current_exception());
  }
  return 0;
}

}  // namespace

// ---- Options ----

Options Options::from_env() {
  Options o;
  CaSettings ca = CaSettings::from_env();
  o.ca_bundle = ca.file;
  o.ca_dir = ca.dir;
  o.ca_origin = ca.origin;
  o.ca_exclusive = ca.exclusive;
  o.connect_timeout_ms = env_long("KERNEL_HUB_CONNECT_TIMEOUT_MS", o.connect_timeout_ms, 1);
  o.low_speed_time_s = env_long("KERNEL_HUB_STALL_TIMEOUT_S", o.low_speed_time_s, 1);
  o.transfer_deadline_s = env_long("KERNEL_HUB_TRANSFER_TIMEOUT_S", o.transfer_deadline_s, 0);
  o.command_timeout_s = env_long("KERNEL_HUB_COMMAND_TIMEOUT_S", o.command_timeout_s, 0);
  o.max_attempts = static_cast<int>(env_long("KERNEL_HUB_MAX_ATTEMPTS", o.max_attempts, 1));
  if (const char* v = std::getenv("KERNEL_HUB_BACKOFF_S"); v && *v) {
    char* end = nullptr;
    double x = std::strtod(v, &end);
    if (*end != 0 || !(x >= 0) || x > 3600) {
      throw Error(ErrorKind::kInvalidInput, std::string("invalid KERNEL_HUB_BACKOFF_S='") + v +
                                                "': expected seconds between 0 and 3600");
    }
    o.backoff_initial_s = x;
    o.backoff_max_s = std::max(o.backoff_max_s, x);
  }
  // Offline mode is also switched on by the environment (HF_HUB_OFFLINE precedent).
  o.offline = env_flag("KERNEL_HUB_OFFLINE");
  return o;
}

void Options::start_command_clock() {
  if (command_deadline != Clock::time_point{}) return;
  command_deadline = command_timeout_s > 0 ? Clock::now() + std::chrono::seconds(command_timeout_s)
                                           : Clock::time_point::max();
}

std::string Response::header(std::string_view name) const {
  auto it = headers.find(lower(name));
  return it == headers.end() ? std::string() : it->second;
}

double backoff_seconds(const Options& o, int attempt, double retry_after_s) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  if (retry_after_s > 0) {
    // Never sooner than asked; up to +10% so that a fleet told the same time does not come back
    // in one burst.
    std::uniform_real_distribution<double> jitter(0.0, 0.10);
    return retry_after_s * (1.0 + jitter(rng));
  }
  int exponent = std::clamp(attempt - 1, 0, 30);
  double base = std::min(o.backoff_initial_s * std::ldexp(1.0, exponent), o.backoff_max_s);
  // Up to +25% jitter so parallel clients do not retry in lockstep.
  std::uniform_real_distribution<double> jitter(0.0, 0.25);
  return base * (1.0 + jitter(rng));
}

std::string refusal_advice(const Options& o, long status, int attempts, double waited_s) {
  const char* state = status == 429   ? "is rate-limiting this client"
                      : status == 503 ? "is unavailable or overloaded"
                                      : "is failing or overloaded";
  return "the server answered HTTP " + std::to_string(status) + " to " + std::to_string(attempts) +
         " attempt(s) over " + seconds_text(waited_s) + " s of waiting; it " + state +
         ". Run the command again later, raise KERNEL_HUB_MAX_ATTEMPTS (now " +
         std::to_string(std::max(1, o.max_attempts)) +
         ") to keep trying longer, or pull through a mirror";
}

// ---- Client ----

struct Client::Impl {
  // Connections, DNS and TLS sessions shared by all small requests of this client. Made on the
  // first request, so that a client that never sends one (offline mode) never loads libcurl.
  std::once_flag share_once;
  CURLSH* share = nullptr;
  std::mutex locks[CURL_LOCK_DATA_LAST];

  static void lock(CURL*, curl_lock_data data, curl_lock_access, void* user) {
    static_cast<Impl*>(user)->locks[data].lock();
  }
  static void unlock(CURL*, curl_lock_data data, void* user) {
    static_cast<Impl*>(user)->locks[data].unlock();
  }

  // certs.d entries by host, read once per client.
  std::mutex certs_mu;
  std::map<std::string, std::shared_ptr<const CertsD>> certs;
  std::shared_ptr<const CertsD> certs_for(const std::string& url) {
    const std::string host = host_of(url);
    std::lock_guard lock(certs_mu);
    auto& entry = certs[host];
    if (!entry) entry = std::make_shared<const CertsD>(certs_d_for(host));
    return entry;
  }

  CURLSH* shared() {
    std::call_once(share_once, [this] { make_share(); });
    return share;
  }

  void make_share() {
    const CurlApi& api = global_init();
    share = api.share_init();
    if (!share) throw Error(ErrorKind::kNetwork, "curl_share_init failed");
    api.share_setopt(share, CURLSHOPT_LOCKFUNC, &Impl::lock);
    api.share_setopt(share, CURLSHOPT_UNLOCKFUNC, &Impl::unlock);
    api.share_setopt(share, CURLSHOPT_USERDATA, this);
    api.share_setopt(share, CURLSHOPT_SHARE, CURL_LOCK_DATA_DNS);
    api.share_setopt(share, CURLSHOPT_SHARE, CURL_LOCK_DATA_SSL_SESSION);
    api.share_setopt(share, CURLSHOPT_SHARE, CURL_LOCK_DATA_CONNECT);
  }
  ~Impl() {
    if (share) curl_api().share_cleanup(share);
  }
};

Client::Client(Options options) : options_(std::move(options)), impl_(std::make_unique<Impl>()) {
  options_.start_command_clock();  // a no-op when the command's Hub started it
}

Client::~Client() = default;

Response Client::send(const Request& request) {
  if (options_.offline) throw_offline(request.method, request.url);
  check_scheme(options_, request.url);
  Request hop = request;
  for (int followed = 0;; ++followed) {
    const std::string what =
        request.method + " " + request.url +
        (followed > 0 ? " (redirected to " + host_of(hop.url) + ")" : std::string());
    Response response = send_hop(hop, what);
    if (!request.follow_redirects || !is_redirect(response.status)) return response;
    const Hop next = next_hop(hop.url, response.redirect_url, response.status, hop.method, followed,
                              options_.allow_plain_http);
    if (!next.refusal.empty()) throw Error(ErrorKind::kRefused, what + ": " + next.refusal);
    hop.url = next.url;
    hop.method = next.method;
    if (!next.keep_body) {
      hop.body.clear();
      hop.upload_file.clear();
    }
    hop.headers = headers_for_hop(request.headers, request.url, hop.url);
  }
}

Response Client::send_hop(const Request& request, const std::string& what) {
  FdCloser upload{-1};
  if (!request.upload_file.empty()) {
    upload.fd = ::open(request.upload_file.c_str(), O_RDONLY | O_CLOEXEC);
    if (upload.fd < 0) throw_errno("cannot open " + request.upload_file.string() + " to upload");
  }
  CURLSH* share = impl_->shared();
  const std::shared_ptr<const CertsD> certs = impl_->certs_for(request.url);
  const CurlApi& api = curl_api();
  Slist headers = make_headers(request.headers);
  int max_attempts = request.retry ? std::max(1, options_.max_attempts) : 1;
  const Clock::time_point deadline = options_.command_deadline;
  std::string last_cause;
  double waited_s = 0;

  for (int attempt = 1;; ++attempt) {
    const Clock::time_point now = Clock::now();
    if (now >= deadline) {
      throw Error(ErrorKind::kNetwork,
                  command_deadline_passed(options_, what + " could not start", last_cause));
    }
    Response response;
    SendState st;
    st.response = &response;
    st.max_body = request.max_body;
    st.upload_fd = upload.fd;
    st.upload_offset = request.upload_offset;
    st.upload_length = request.upload_length;
    char errbuf[CURL_ERROR_SIZE];

    std::unique_ptr<CURL, decltype(&curl_easy_cleanup)> h(api.easy_init(), api.easy_cleanup);
    if (!h) throw Error(ErrorKind::kNetwork, "curl_easy_init failed");
    CURL* c = h.get();
    apply_common(c, options_, *certs, errbuf);
    api.easy_setopt(c, CURLOPT_SHARE, share);
    api.easy_setopt(c, CURLOPT_URL, request.url.c_str());
    api.easy_setopt(c, CURLOPT_HTTPHEADER, headers.get());
    // Uploads are blobs: no whole-request limit of their own, only the stall (low-speed) check;
    // the command deadline bounds every request.
    const long cap_ms = upload.fd < 0 ? options_.metadata_timeout_s * 1000 : 0;
    const long attempt_ms = timeout_ms(cap_ms, deadline, now);
    // A timeout of this attempt is the command deadline when the deadline set it.
    const bool deadline_bounds =
        deadline != Clock::time_point::max() && (cap_ms == 0 || attempt_ms < cap_ms);
    api.easy_setopt(c, CURLOPT_TIMEOUT_MS, attempt_ms);
    api.easy_setopt(c, CURLOPT_WRITEFUNCTION, &send_write);
    api.easy_setopt(c, CURLOPT_WRITEDATA, &st);
    api.easy_setopt(c, CURLOPT_HEADERFUNCTION, &send_header);
    api.easy_setopt(c, CURLOPT_HEADERDATA, &st);

    const std::string& m = request.method;
    if (m == "HEAD") {
      api.easy_setopt(c, CURLOPT_NOBODY, 1L);
    } else if (upload.fd >= 0) {
      api.easy_setopt(c, CURLOPT_UPLOAD, 1L);
      api.easy_setopt(c, CURLOPT_READFUNCTION, &send_read);
      api.easy_setopt(c, CURLOPT_READDATA, &st);
      api.easy_setopt(c, CURLOPT_SEEKFUNCTION, &send_seek);
      api.easy_setopt(c, CURLOPT_SEEKDATA, &st);
      api.easy_setopt(c, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(request.upload_length));
      if (m != "PUT") api.easy_setopt(c, CURLOPT_CUSTOMREQUEST, m.c_str());
    } else if (m != "GET") {
      if (m == "POST" || m == "PUT" || m == "PATCH" || !request.body.empty()) {
        api.easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE,
                        static_cast<curl_off_t>(request.body.size()));
        api.easy_setopt(c, CURLOPT_POSTFIELDS, request.body.data());
      }
      if (m != "POST") api.easy_setopt(c, CURLOPT_CUSTOMREQUEST, m.c_str());
    }

    ++requests_;
    CURLcode rc = api.easy_perform(c);
    if (st.too_large) {
      throw Error(ErrorKind::kRefused, what + ": response body larger than the limit of " +
                                           std::to_string(request.max_body) + " bytes");
    }
    if (!st.upload_error.empty()) {
      throw Error(ErrorKind::kIo, "reading " + request.upload_file.string() +
                                      " for upload failed: " + st.upload_error);
    }
    curl_off_t retry_after = 0;
    if (rc == CURLE_OK) {
      api.easy_getinfo(c, CURLINFO_RESPONSE_CODE, &response.status);
      char* eff = nullptr;
      api.easy_getinfo(c, CURLINFO_EFFECTIVE_URL, &eff);
      if (eff) response.effective_url = eff;
      char* location = nullptr;
      if (is_redirect(response.status) &&
          api.easy_getinfo(c, CURLINFO_REDIRECT_URL, &location) == CURLE_OK && location) {
        response.redirect_url = location;
      }
      // libcurl reads both forms (delay-seconds and HTTP-date); 0 when absent or malformed.
      api.easy_getinfo(c, CURLINFO_RETRY_AFTER, &retry_after);
      response.attempts = attempt;
      response.waited_s = waited_s;
      if (!retryable_status(response.status) || attempt >= max_attempts) return response;
      last_cause = "HTTP " + std::to_string(response.status);
    } else if (Clock::now() >= deadline || (rc == CURLE_OPERATION_TIMEDOUT && deadline_bounds)) {
      throw Error(ErrorKind::kNetwork, command_deadline_passed(options_, what + " was in flight",
                                                               curl_cause(rc, errbuf)));
    } else if (!worth_retrying(rc, errbuf) || attempt >= max_attempts) {
      throw Error(ErrorKind::kNetwork,
                  what + " failed after " + std::to_string(attempt) +
                      " attempt(s): " + curl_cause(rc, errbuf) + "; " +
                      failure_advice(rc, errbuf, request.url, options_, *certs));
    }
    if (rc != CURLE_OK) last_cause = curl_cause(rc, errbuf);
    const RetryWait wait =
        plan_retry(options_, attempt, static_cast<double>(retry_after), deadline, what, last_cause);
    if (!wait.refusal.empty()) throw Error(ErrorKind::kNetwork, wait.refusal);
    std::this_thread::sleep_for(std::chrono::duration<double>(wait.seconds));
    waited_s += wait.seconds;
  }
}

void Client::download(std::vector<Download>& jobs, Progress* progress) {
  if (jobs.empty()) return;
  if (options_.offline) throw_offline("GET", jobs.front().url);
  const CurlApi& api = global_init();

  WriteBehind behind;  // outlives the transfers' lanes
  std::vector<std::unique_ptr<Transfer>> transfers;
  for (auto& job : jobs) {
    if (!job.sink) throw std::logic_error("http::Client::download: job without a sink");
    job.ok = false;
    job.status = 0;
    job.error.clear();
    auto t = std::make_unique<Transfer>();
    t->job = &job;
    t->behind = &behind;
    t->lane = &behind.lane(job.sink);
    t->progress = progress;
    t->url = job.url;
    t->headers = make_headers(job.headers);
    if (progress) {
      progress->add_total(job.expected_size);
      progress->advance(static_cast<int64_t>(job.sink->offset()));
    }
    try {
      check_scheme(options_, job.url);
    } catch (const Error& e) {
      job.error = e.what();
      t->state = Transfer::State::kDone;
    }
    transfers.push_back(std::move(t));
  }

  std::unique_ptr<CURLM, decltype(&curl_multi_cleanup)> multi_owner(api.multi_init(),
                                                                    api.multi_cleanup);
  CURLM* multi = multi_owner.get();
  if (!multi) throw Error(ErrorKind::kNetwork, "curl_multi_init failed");
  const long parallel = std::max(1, options_.max_parallel);
  api.multi_setopt(multi, CURLMOPT_PIPELINING, static_cast<long>(CURLPIPE_MULTIPLEX));
  api.multi_setopt(multi, CURLMOPT_MAX_HOST_CONNECTIONS, parallel);
  api.multi_setopt(multi, CURLMOPT_MAX_TOTAL_CONNECTIONS, parallel);

  const Clock::time_point command_deadline = options_.command_deadline;
  // Set when a transfer timed out at the command deadline: the deadline has passed then, whatever
  // steady_clock says. curl times a transfer on its own clock from its own start (libcurl reads
  // CLOCK_MONOTONIC_RAW where there is one, which NTP does not slew), so its timeout can fire a
  // fraction of a millisecond before `command_deadline` by ours, and a blob waiting for the slot
  // would then start (probably what FaultTest.APullOfSlowBlobsEndsAtTheCommandDeadline saw once,
  // a second blob GET, in three clean-clone runs; not reproduced since).
  bool deadline_hit = false;
  // A 429/503 with Retry-After slows every transfer to that host, not just the one hit.
  std::map<std::string, Clock::time_point> host_not_before;
  long running = 0;

  auto start = [&](Transfer& t) {
    t.start_offset = behind.offset(*t.lane);
    t.body_started = false;
    t.to_sink = false;
    t.response_headers.clear();
    t.error_body.clear();
    t.abort_reason.clear();
    const auto now = Clock::now();
    if (t.deadline == Clock::time_point::max() && options_.transfer_deadline_s > 0)
      t.deadline = now + std::chrono::seconds(options_.transfer_deadline_s);
    CURL* c = api.easy_init();
    if (!c) throw Error(ErrorKind::kNetwork, "curl_easy_init failed");
    t.easy = c;
    apply_common(c, options_, *impl_->certs_for(t.url), t.errbuf);
    api.easy_setopt(c, CURLOPT_URL, t.url.c_str());
    api.easy_setopt(c, CURLOPT_HTTPHEADER, t.headers.get());
    api.easy_setopt(c, CURLOPT_PIPEWAIT, 1L);
    // Large receive buffer: blobs are megabytes, and 16 KiB reads cost a recv + write + hash
    // call each (measured: 17k of each for 256 MiB).
    api.easy_setopt(c, CURLOPT_BUFFERSIZE, 512L * 1024);
    api.easy_setopt(c, CURLOPT_WRITEFUNCTION, &transfer_write);
    api.easy_setopt(c, CURLOPT_WRITEDATA, &t);
    api.easy_setopt(c, CURLOPT_HEADERFUNCTION, &transfer_header);
    api.easy_setopt(c, CURLOPT_HEADERDATA, &t);
    api.easy_setopt(c, CURLOPT_PRIVATE, static_cast<void*>(&t));
    // "Range: bytes=<offset>-" when resuming, as a plain Range request, not CURLOPT_RESUME_FROM:
    // libcurl holds a resumed transfer's first answer to the offset, so a redirect with a body
    // (docker-distribution's to object storage) failed as CURLE_RANGE_ERROR and the blob started
    // over from 0. transfer_write checks what a 200 or 206 answer holds instead.
    t.range = t.start_offset > 0 ? std::to_string(t.start_offset) + "-" : std::string();
    api.easy_setopt(c, CURLOPT_RANGE, t.range.empty() ? nullptr : t.range.c_str());
    // What is left of the blob's deadline, and of the command's, bounds this attempt: a trickle
    // just fast enough to pass the stall check still ends.
    if (long ms = timeout_ms(0, std::min(t.deadline, command_deadline), now); ms > 0)
      api.easy_setopt(c, CURLOPT_TIMEOUT_MS, ms);
    t.command_deadline_bounds =
        command_deadline != Clock::time_point::max() && command_deadline <= t.deadline;
    t.state = Transfer::State::kRunning;
    ++running;
    ++requests_;
    api.multi_add_handle(multi, c);
  };

  auto go_to = [&](Transfer& t, std::string url, int redirects) {
    t.redirects = redirects;
    if (url == t.url) return;
    t.headers = make_headers(headers_for_hop(t.job->headers, t.job->url, url));
    t.url = std::move(url);
  };

  auto finish = [&](Transfer& t, CURLcode rc) {
    long code = 0;
    curl_off_t retry_after = 0;
    std::string redirect_url;
    api.easy_getinfo(t.easy, CURLINFO_RESPONSE_CODE, &code);
    api.easy_getinfo(t.easy, CURLINFO_RETRY_AFTER, &retry_after);
    if (char* location = nullptr;
        rc == CURLE_OK && is_redirect(code) &&
        api.easy_getinfo(t.easy, CURLINFO_REDIRECT_URL, &location) == CURLE_OK && location) {
      redirect_url = location;
    }
    api.multi_remove_handle(multi, t.easy);
    api.easy_cleanup(t.easy);
    t.easy = nullptr;
    --running;
    Download& job = *t.job;
    job.status = code;
    const std::string what =
        "GET " + job.url +
        (t.url != job.url ? " (redirected to " + host_of(t.url) + ")" : std::string());
    // Everything received is in the sink before its offset (or digest) is looked at.
    if (std::exception_ptr failed = behind.settle(*t.lane); failed && t.abort_reason.empty()) {
      t.sink_failed(failed);
      rc = CURLE_WRITE_ERROR;
    }

    auto fail_now = [&](const std::string& cause) {
      job.ok = false;
      job.error = what + " failed" +
                  (code ? " (HTTP " + std::to_string(code) + ")" : std::string()) + ": " + cause;
      t.state = Transfer::State::kDone;
    };
    auto fail_with = [&](std::string error) {
      job.ok = false;
      job.error = std::move(error);
      t.state = Transfer::State::kDone;
    };
    auto retry_later = [&](const std::string& cause, double retry_after_s) {
      ++t.failures;
      t.last_cause = cause;
      go_to(t, job.url, 0);
      if (Clock::now() >= t.deadline) {
        job.ok = false;
        job.error = what + " did not complete within " +
                    std::to_string(options_.transfer_deadline_s) + " s over " +
                    std::to_string(t.failures) + " attempt(s) (last: " + cause +
                    "); KERNEL_HUB_TRANSFER_TIMEOUT_S sets this deadline";
        t.state = Transfer::State::kDone;
        return;
      }
      if (t.failures >= std::max(1, options_.max_attempts)) {
        job.ok = false;
        job.error =
            what + " failed after " + std::to_string(t.failures) + " attempts" +
            (code ? " (last HTTP status " + std::to_string(code) + ")" : std::string()) + ": " +
            cause +
            (retryable_status(code) ? "; " + refusal_advice(options_, code, t.failures, t.waited_s)
                                    : std::string());
        t.state = Transfer::State::kDone;
        return;
      }
      const RetryWait wait =
          plan_retry(options_, t.failures, retry_after_s, command_deadline, what, cause);
      if (!wait.refusal.empty()) {
        fail_with(wait.refusal);
        return;
      }
      const Clock::time_point wake =
          Clock::now() +
          std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(wait.seconds));
      t.not_before = wake;
      t.waited_s += wait.seconds;
      if (retry_after_s > 0) {
        auto& gate = host_not_before[host_of(job.url)];
        gate = std::max(gate, t.not_before);
      }
      t.state = Transfer::State::kWaiting;
    };

    if (rc == CURLE_OK) {
      if (code == 200 || code == 206) {
        uint64_t got = job.sink->offset();
        if (job.expected_size > 0 && got != job.expected_size) {
          t.restart_sink();
          retry_later("received " + std::to_string(got) + " bytes, expected " +
                          std::to_string(job.expected_size),
                      0);
          return;
        }
        job.ok = true;
        t.state = Transfer::State::kDone;
      } else if (is_redirect(code)) {
        const Hop next =
            next_hop(t.url, redirect_url, code, "GET", t.redirects, options_.allow_plain_http);
        if (!next.refusal.empty()) {
          fail_with(what + ": " + next.refusal);
          return;
        }
        go_to(t, next.url, t.redirects + 1);  // at once, and not counted as a failure
        t.state = Transfer::State::kWaiting;
        t.not_before = Clock::now();
      } else if (code == 416 && t.start_offset > 0) {
        // Our resume offset is not satisfiable (a stale partial): fetch from 0 again.
        t.restart_sink();
        retry_later("HTTP 416 for Range bytes=" + std::to_string(t.start_offset) + "-", 0);
      } else if (retryable_status(code)) {
        retry_later("HTTP " + std::to_string(code) + " " + excerpt(t.error_body),
                    static_cast<double>(retry_after));
      } else {
        fail_now(t.error_body.empty() ? "unexpected response" : excerpt(t.error_body));
      }
    } else if (rc == CURLE_WRITE_ERROR && t.abort_final) {
      fail_now(t.abort_reason);  // deterministic (too many bytes, disk error): no retry
      job.integrity = t.abort_integrity;
    } else if (rc == CURLE_WRITE_ERROR && !t.abort_reason.empty()) {
      // The range was wrong (a server quirk): restart from 0.
      t.restart_sink();
      retry_later(t.abort_reason, 0);
    } else if (rc == CURLE_OPERATION_TIMEDOUT && t.command_deadline_bounds) {
      deadline_hit = true;
      fail_with(
          command_deadline_passed(options_, what + " was in flight", curl_cause(rc, t.errbuf)));
    } else if (worth_retrying(rc, t.errbuf)) {
      retry_later(curl_cause(rc, t.errbuf), 0);
    } else {
      fail_now(curl_cause(rc, t.errbuf) + "; " +
               failure_advice(rc, t.errbuf, t.url, options_, *impl_->certs_for(t.url)));
    }
  };

  try {
    for (;;) {
      auto now = Clock::now();
      bool pending = false;
      Clock::time_point next_wake = now + std::chrono::seconds(1);
      for (auto& t : transfers) {
        if (t->state != Transfer::State::kWaiting) continue;
        // Waited for a free slot (or a retry) past the deadline.
        if (deadline_hit || now >= command_deadline) {
          t->job->error = command_deadline_passed(
              options_, "GET " + t->job->url + " could not start", t->last_cause);
          t->state = Transfer::State::kDone;
          continue;
        }
        pending = true;
        Clock::time_point ready = t->not_before;
        if (auto it = host_not_before.find(host_of(t->job->url)); it != host_not_before.end()) {
          ready = std::max(ready, it->second);
        }
        if (ready <= now && running < parallel) {
          start(*t);
        } else if (ready > now) {
          next_wake = std::min(next_wake, ready);
        }
      }
      if (!pending && running == 0) break;

      int still = 0;
      api.multi_perform(multi, &still);
      int queued = 0;
      bool finished_any = false;
      while (CURLMsg* msg = api.multi_info_read(multi, &queued)) {
        if (msg->msg != CURLMSG_DONE) continue;
        char* priv = nullptr;
        api.easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, &priv);
        finish(*reinterpret_cast<Transfer*>(priv), msg->data.result);
        finished_any = true;
      }
      if (finished_any) continue;
      auto wait = std::chrono::duration_cast<std::chrono::milliseconds>(next_wake - Clock::now());
      int timeout_ms = static_cast<int>(std::clamp<int64_t>(wait.count(), 0, 1000));
      api.multi_poll(multi, nullptr, 0, timeout_ms, nullptr);
    }
  } catch (...) {
    for (auto& t : transfers) {
      if (t->easy) {
        api.multi_remove_handle(multi, t->easy);
        api.easy_cleanup(t->easy);
        t->easy = nullptr;
      }
    }
    throw;
  }
}

}  // namespace kh::http
