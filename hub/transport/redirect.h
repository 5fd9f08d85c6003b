// How the HTTP client follows a redirect: itself, hop by hop, not through libcurl
// (CURLOPT_FOLLOWLOCATION). libcurl keeps the first request's TLS settings for every hop, so the
// client certificate from one host's certs.d went to whatever host a redirect named. Here each
// hop is a request of its own, set up for its own host (certs.d, CAs); Authorization goes only
// to the first request's origin; a redirect never steps down from https; a chain is bounded.
// Plain functions, no libcurl: the client calls them, tests/unit/test_redirect.cpp holds them.
#pragma once

#include <string>
#include <vector>

#include "hub/transport/url.h"

namespace kh::http {

// Redirects followed for one request at most (libcurl's own default is far higher).
constexpr int kMaxRedirects = 10;

// 301, 302, 303, 307 and 308: the answers a client follows (300 and 304 are not redirects to
// follow).
bool is_redirect(long status);

// The request a redirect asks for, or why it is not followed.
struct Hop {
  std::string url;        // absolute
  std::string method;     // 303 (and 301/302 after a POST) turn into GET; HEAD stays HEAD
  bool keep_body = true;  // false where the method became GET: the body is not resent
  std::string refusal;    // not empty: not followed, and why (names hosts, never the URLs)
};

// The hop after the server at `from` answered `method` with `status` (is_redirect) and a
// Location that libcurl resolved to `target` ("" when there was none). `followed` redirects came
// before this one. Refused: no Location, more than kMaxRedirects, a scheme other than http(s),
// https to anything but https, plain HTTP where `allow_plain_http` is off, and a request that
// keeps its method and body (a PUT, PATCH or POST repeated as it was) sent to another origin.
Hop next_hop(const std::string& from, const std::string& target, long status,
             const std::string& method, int followed, bool allow_plain_http);

// The headers for a request to `hop_url` made for one to `first_url`: `headers` as they are
// when both share an origin, else without Authorization (as libcurl treats its own credentials,
// for a custom header too).
std::vector<std::string> headers_for_hop(const std::vector<std::string>& headers,
                                         const std::string& first_url, const std::string& hop_url);

}  // namespace kh::http
