// What the HTTP client reads from a server's response headers, as plain functions (no libcurl):
// the header block itself, a Range answer's Content-Range, and a registry's WWW-Authenticate
// challenge. Servers are untrusted: each takes any bytes (tests/fuzz/fuzz_http_headers.cpp).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

namespace kh::http {

// ASCII lower case, and `s` without leading and trailing white space.
std::string lower(std::string_view s);
std::string trim(std::string_view s);

// Adds one raw header line ("Name: value\r\n") to `headers`, names lower-cased and both sides
// trimmed. A status line ("HTTP/...") starts a new block (redirects, 100 Continue), so only the
// final response's headers are kept; a repeated name's values are joined with ", " as HTTP
// allows for list-valued headers (an empty one adds nothing); a line without a colon is ignored.
void add_header_line(std::map<std::string, std::string>& headers, std::string_view line);

// The first byte a 206 answer holds, from its Content-Range ("bytes <start>-<end>/<total>"; the
// bare "<start>-<end>" form, as upload PATCH requests spell it, is read too); 0 where it does not
// start with a number.
uint64_t content_range_start(const std::string& value);

// One WWW-Authenticate challenge: its scheme, lower-cased ("bearer", "basic"), and its
// parameters by lower-cased name (quoted values unescaped). Where several challenges are offered,
// Bearer's, else Basic's, else the first.
struct Challenge {
  std::string scheme;
  std::map<std::string, std::string> params;
};
Challenge parse_challenge(const std::string& header);

// Whether `token` can follow "Authorization: Bearer " in a request: not empty, visible ASCII
// only (0x21-0x7E). A CR or LF would end the header and start another of the server's choosing
// (libcurl sends custom headers as given), a space or other control byte would garble it.
bool bearer_token_ok(std::string_view token);

}  // namespace kh::http
