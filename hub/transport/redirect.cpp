#include "hub/transport/redirect.h"

#include <string_view>

#include "hub/transport/http_headers.h"

namespace kh::http {

namespace {

bool is_authorization(const std::string& header) {
  const size_t colon = header.find(':');
  return colon != std::string::npos &&
         lower(trim(std::string_view(header).substr(0, colon))) == "authorization";
}

}  // namespace

bool is_redirect(long status) {
  return status == 301 || status == 302 || status == 303 || status == 307 || status == 308;
}

Hop next_hop(const std::string& from, const std::string& target, long status,
             const std::string& method, int followed, bool allow_plain_http) {
  Hop hop;
  const std::string code = "HTTP " + std::to_string(status);
  const std::string from_host = host_of(from);
  if (target.empty()) {
    hop.refusal = "the server at " + from_host + " answered " + code +
                  " without a Location to follow; the hub (or a proxy before it) is misbehaving";
    return hop;
  }
  const std::string scheme = scheme_of(target);
  const std::string to_host = host_of(target);
  if (followed >= kMaxRedirects) {
    hop.refusal = "more than " + std::to_string(kMaxRedirects) + " redirects (the last from " +
                  from_host + " to " + to_host +
                  "); the hub's redirects loop or run too long: check the hub address and the "
                  "server's configuration";
    return hop;
  }
  if (scheme_of(from) == "https" && scheme != "https") {
    hop.refusal = "the server at " + from_host + " redirected to a plain-HTTP (or other) URL on " +
                  to_host +
                  ", and kernel-hub never follows a redirect from https to plain HTTP "
                  "(--plain-http covers only addresses given as http://); serve the redirect's "
                  "target over https (a registry's storage, say)";
    return hop;
  }
  if (scheme != "https" && scheme != "http") {
    hop.refusal =
        "the server at " + from_host + " redirected to a URL " +
        (scheme.empty() ? std::string("without a scheme") : "of scheme '" + scheme + "'") +
        ", which kernel-hub does not follow (https, or http with --plain-http, only)";
    return hop;
  }
  if (scheme == "http" && !allow_plain_http) {
    hop.refusal = "the server at " + from_host + " redirected to plain HTTP on " + to_host +
                  "; plain HTTP is refused unless --plain-http is given";
    return hop;
  }
  hop.url = target;
  hop.method = method;
  // As browsers and libcurl do: 303 always, and 301/302 after a POST, repeat the request as a GET
  // without its body; 307 and 308 repeat it as it was.
  if (method != "HEAD" &&
      (status == 303 || (method == "POST" && (status == 301 || status == 302)))) {
    hop.method = "GET";
    hop.keep_body = false;
  }
  // A request that writes (an upload's PUT or PATCH, a POST) goes on only within its origin: a
  // hop elsewhere would carry its body to a host the registry chose, with that host's client
  // certificate (certs.d), a write in the user's name that host trusts.
  if (hop.method != "GET" && hop.method != "HEAD" && origin_of(target) != origin_of(from)) {
    hop.refusal = "the server at " + from_host + " redirected a " + hop.method + " to " + to_host +
                  ", another origin; kernel-hub re-sends a request body only within the origin it "
                  "was sent to";
    hop.url.clear();
  }
  return hop;
}

std::vector<std::string> headers_for_hop(const std::vector<std::string>& headers,
                                         const std::string& first_url, const std::string& hop_url) {
  const std::string first = origin_of(first_url);
  if (!first.empty() && first == origin_of(hop_url)) return headers;
  std::vector<std::string> kept;
  for (const auto& h : headers) {
    if (!is_authorization(h)) kept.push_back(h);
  }
  return kept;
}

}  // namespace kh::http
