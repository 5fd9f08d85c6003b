// HTTP client on libcurl: small requests with retries, and parallel blob downloads
// (one multi handle, HTTP/2 where offered) with Range resume, restart when Range is
// ignored, exponential backoff with jitter honouring Retry-After on 429/503, connect
// and low-speed (stall) timeouts, proxies from the environment, and a progress bar.
// In offline mode every request is refused before any connection is made.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "hub/base/progress.h"
#include "hub/transport/blob_sink.h"
#include "hub/transport/url.h"  // host_of, for the client's users

namespace kh::http {

struct Options {
  bool offline = false;           // refuse every request with kOffline
  bool allow_plain_http = false;  // permit http:// URLs (else https only)
  long connect_timeout_ms = 10000;
  long low_speed_limit = 1024;  // bytes/s; slower than this for low_speed_time_s = stall
  long low_speed_time_s = 30;
  long metadata_timeout_s = 120;  // whole-request limit for small requests, never for blobs
  // Overall deadline for one blob download, over all its attempts (0 = none): a hub serving a
  // slow trickle cannot hold a pull forever. KERNEL_HUB_TRANSFER_TIMEOUT_S.
  long transfer_deadline_s = 3600;
  // Overall deadline for one command's hub work (0 = none): a hub serving many slow documents or
  // blobs, each within its own limits, cannot hold a command for their sum. Every request's
  // timeout is capped by what is left; no request or retry starts after it.
  // KERNEL_HUB_COMMAND_TIMEOUT_S.
  long command_timeout_s = 7200;
  // When the command's clock ran out: set by start_command_clock() (the Hub calls it when it is
  // made for a command), else when the Client is made. max(): no deadline.
  std::chrono::steady_clock::time_point command_deadline{};
  int max_attempts = 5;
  double backoff_initial_s = 1.0;  // doubled per attempt, capped, plus jitter
  double backoff_max_s = 8.0;
  // A 429/503 Retry-After (seconds or HTTP-date) is waited in full, plus up to 10% jitter, never
  // less: retrying sooner only earns another refusal. It is bounded by the command deadline (a
  // wait past it fails at once, naming it) and by max_attempts; a missing, malformed or past
  // Retry-After falls back to the backoff above.
  int max_parallel = 8;  // concurrent blob transfers
  // CA file and hashed directory (tls.h says which variables set them, in what order), and
  // those variables for messages. Per-registry certs.d directories are read per host.
  std::string ca_bundle;
  std::string ca_dir;
  std::string ca_origin;
  bool ca_exclusive = false;  // ca_bundle alone decides (libcurl's default directory is dropped)
  bool progress = false;      // progress bar on a TTY
  std::string user_agent = "kernel-hub/0.1.0";

  // Defaults overridden from the environment: KERNEL_HUB_CA_BUNDLE (SSL_CERT_FILE,
  // CURL_CA_BUNDLE, SSL_CERT_DIR: tls.h),
  // KERNEL_HUB_CONNECT_TIMEOUT_MS, KERNEL_HUB_STALL_TIMEOUT_S, KERNEL_HUB_TRANSFER_TIMEOUT_S,
  // KERNEL_HUB_COMMAND_TIMEOUT_S, KERNEL_HUB_MAX_ATTEMPTS,
  // KERNEL_HUB_BACKOFF_S (initial backoff; tests use small values).
  static Options from_env();

  // Starts the command deadline now (command_timeout_s from now; none when it is 0), unless it
  // was started already.
  void start_command_clock();
};

struct Request {
  std::string method = "GET";
  std::string url;
  std::vector<std::string> headers;  // "Name: value"
  std::string body;                  // request body for POST/PUT/PATCH
  // Streaming upload of a file range instead of body (PUT/PATCH of blobs).
  std::filesystem::path upload_file;
  uint64_t upload_offset = 0;
  uint64_t upload_length = 0;
  uint64_t max_body = 4 << 20;  // responses larger than this fail (kRefused)
  // Redirects are followed by the client, hop by hop (redirect.h): each hop with its own host's
  // TLS settings, Authorization only within the first request's origin.
  bool follow_redirects = true;
  bool retry = true;  // retry transient failures (408, 429, 5xx, transport)
};

struct Response {
  long status = 0;
  std::string body;
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string effective_url;                   // the URL that answered (the last hop's)
  // Where a redirect answer points, resolved against effective_url ("" for other answers, or
  // without a Location): what a caller that follows no redirects may look at.
  std::string redirect_url;
  int attempts = 1;     // requests sent for it (retries included)
  double waited_s = 0;  // seconds slept between those attempts (backoff and Retry-After)
  // Header value by case-insensitive name, "" when absent.
  std::string header(std::string_view name) const;
};

struct Download {
  std::string url;
  std::vector<std::string> headers;
  uint64_t expected_size = 0;
  BlobSink* sink = nullptr;
  // Filled in by download():
  bool ok = false;
  long status = 0;
  std::string error;       // why it failed after all attempts
  bool integrity = false;  // failed because the bytes were not the ones named (more than
                           // expected_size): another attempt would get the same
};

class Client {
 public:
  explicit Client(Options options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Sends one request; transient failures are retried. Returns the last response, which
  // may be a 4xx/5xx. Throws kOffline, kNetwork (transport failure after retries),
  // kInvalidInput (URL scheme not allowed).
  Response send(const Request& request);

  // Runs the downloads in parallel. Each job's ok/status/error is set; never throws for a
  // failed job (the caller decides), only for offline mode or programming errors.
  void download(std::vector<Download>& jobs, Progress* progress);

  const Options& options() const { return options_; }
  // Requests that reached the network (each attempt counts). Tests use it.
  uint64_t requests_made() const { return requests_.load(); }

 private:
  struct Impl;
  // One hop of send(): the request with its retries. `what` names it in messages.
  Response send_hop(const Request& hop, const std::string& what);

  Options options_;
  std::unique_ptr<Impl> impl_;
  std::atomic<uint64_t> requests_{0};
};

// Seconds to wait before attempt `attempt` (1-based retry count), exponential with jitter,
// or Retry-After when the server sent one (> 0), plus up to 10% jitter. Exposed for unit tests.
double backoff_seconds(const Options& o, int attempt, double retry_after_s);

// For the error when a server still answers 408/429/5xx after every attempt: the status, how many
// attempts over how many seconds of waiting, and what to do (wait, KERNEL_HUB_MAX_ATTEMPTS, a
// mirror).
std::string refusal_advice(const Options& o, long status, int attempts, double waited_s);

}  // namespace kh::http
