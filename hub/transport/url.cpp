#include "hub/transport/url.h"

#include <cctype>
#include <string_view>

#include "hub/transport/http_headers.h"

namespace kh::http {

std::string host_of(const std::string& url) {
  auto start = url.find("://");
  start = start == std::string::npos ? 0 : start + 3;
  auto end = url.find_first_of("/?#", start);
  std::string authority =
      url.substr(start, end == std::string::npos ? std::string::npos : end - start);
  if (size_t at = authority.rfind('@'); at != std::string::npos) authority.erase(0, at + 1);
  return authority;
}

std::string scheme_of(const std::string& url) {
  const size_t end = url.find("://");
  if (end == std::string::npos || end == 0) return "";
  // RFC 3986: ALPHA *( ALPHA / DIGIT / "+" / "-" / "." ). Anything else before "://" is a path
  // or query, not a scheme, and is not repeated.
  for (size_t i = 0; i < end; ++i) {
    const unsigned char c = static_cast<unsigned char>(url[i]);
    if (!std::isalpha(c) && (i == 0 || (!std::isdigit(c) && c != '+' && c != '-' && c != '.')))
      return "";
  }
  return lower(std::string_view(url).substr(0, end));
}

std::string origin_of(const std::string& url) {
  const std::string scheme = scheme_of(url);
  return scheme.empty() ? std::string() : scheme + "://" + lower(host_of(url));
}

std::string shown_url(const std::string& url) {
  const std::string origin = origin_of(url);
  if (origin.empty()) return url;
  const size_t authority = url.find("://") + 3;
  const size_t path = url.find_first_of("/?#", authority);
  if (path == std::string::npos || url[path] != '/') return origin;
  const size_t end = url.find_first_of("?#", path);
  return origin + url.substr(path, end == std::string::npos ? std::string::npos : end - path);
}

}  // namespace kh::http
