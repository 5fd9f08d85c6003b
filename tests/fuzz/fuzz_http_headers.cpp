// Fuzz target: what the HTTP client reads from a server's response headers
// (hub/transport/http_headers.h). The input is a header block, one line per '\n': every line goes
// through add_header_line, then the WWW-Authenticate value it kept through parse_challenge and
// the Content-Range one through content_range_start, and the whole input through both as one
// value. Checked beyond memory safety (ASan, UBSan): names come out lower-cased and trimmed,
// values trimmed; a challenge's scheme and parameter names are lower case and hold no space; a
// start parsed from "bytes N..." is N. A Location value goes through the redirect rules
// (hub/transport/redirect.h): a hop is either refused or taken, never from https down, a
// refusal holds no query of the target; a hop off the first origin keeps no Authorization.
#include <algorithm>
#include <cctype>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "hub/transport/http_headers.h"
#include "hub/transport/redirect.h"

namespace {

bool trimmed(const std::string& s) {
  return s.empty() || (!std::isspace(static_cast<unsigned char>(s.front())) &&
                       !std::isspace(static_cast<unsigned char>(s.back())));
}

bool lower_case(const std::string& s) {
  for (unsigned char c : s)
    if (std::isupper(c)) return false;
  return true;
}

void check_challenge(const std::string& value) {
  const kh::http::Challenge c = kh::http::parse_challenge(value);
  if (!lower_case(c.scheme) || c.scheme.find(' ') != std::string::npos) __builtin_trap();
  for (const auto& [name, param] : c.params)
    if (!lower_case(name) || name.find(' ') != std::string::npos) __builtin_trap();
}

void check_redirect(const std::string& location) {
  using namespace kh::http;
  const Hop hop = next_hop("https://registry.example/v2/x", location, 307, "GET", 0, true);
  if (hop.refusal.empty() == hop.url.empty()) __builtin_trap();
  if (!hop.url.empty() && scheme_of(hop.url) != "https") __builtin_trap();
  // A refusal names the target's host, never what follows it: no query (a signature) reaches it.
  if (hop.refusal.find('?') != std::string::npos) __builtin_trap();
  const std::vector<std::string> kept = headers_for_hop({"Authorization: Bearer t", "Accept: */*"},
                                                        "https://registry.example/v2/x", location);
  if (origin_of(location) != "https://registry.example" && kept.size() != 1) __builtin_trap();
  // A URL as messages show it: its origin, then a path at most; no query, fragment or userinfo.
  const std::string origin = origin_of(location), shown = shown_url(location);
  if (!origin.empty() && (!shown.starts_with(origin) ||
                          shown.find_first_of("?#", origin.size()) != std::string::npos ||
                          (shown.size() > origin.size() && shown[origin.size()] != '/')))
    __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  std::map<std::string, std::string> headers;
  for (size_t at = 0; at <= input.size();) {
    const size_t end = std::min(input.find('\n', at), input.size());
    kh::http::add_header_line(headers, std::string_view(input).substr(at, end - at + 1));
    at = end + 1;
  }
  for (const auto& [name, value] : headers)
    if (!lower_case(name) || !trimmed(name) || !trimmed(value)) __builtin_trap();
  if (auto it = headers.find("www-authenticate"); it != headers.end()) check_challenge(it->second);
  if (auto it = headers.find("content-range"); it != headers.end())
    (void)kh::http::content_range_start(it->second);
  if (auto it = headers.find("location"); it != headers.end()) check_redirect(it->second);
  check_redirect(input);
  check_challenge(input);
  const uint64_t start = kh::http::content_range_start(input);
  // "bytes " and up to 19 digits: the number they spell.
  if (input.starts_with("bytes ")) {
    uint64_t n = 0;
    size_t i = 6;
    while (i < input.size() && i < 6 + 19 && std::isdigit(static_cast<unsigned char>(input[i])))
      n = n * 10 + static_cast<uint64_t>(input[i++] - '0');
    const bool more = i < input.size() && std::isdigit(static_cast<unsigned char>(input[i]));
    if (i > 6 && !more && start != n) __builtin_trap();
  }
  return 0;
}
