#include "hub/oci/address.h"

#include <cctype>

#include "hub/base/error.h"

namespace kh {

namespace {
std::string sanitize(std::string_view s) {
  std::string out;
  for (char c : s) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '-' || c == '/';
    out += ok ? c : '_';
  }
  while (!out.empty() && out.back() == '/') out.pop_back();
  // No empty, "." or ".." components in the result.
  std::string clean;
  size_t start = 0;
  while (start <= out.size()) {
    size_t end = out.find('/', start);
    if (end == std::string::npos) end = out.size();
    std::string part = out.substr(start, end - start);
    if (!part.empty() && part != "." && part != "..") clean += (clean.empty() ? "" : "/") + part;
    start = end + 1;
  }
  return clean.empty() ? "_" : clean;
}

// "scheme://" of an address, "" without one: all of it a message may repeat when the rest may
// hold a password.
std::string scheme_prefix(std::string_view text) {
  const size_t end = text.find("://");
  return end == std::string_view::npos ? std::string() : std::string(text.substr(0, end + 3));
}

// A user:password@ in an address would reach every message, the hub's id and the cache's
// directory names: refused, without repeating it. `rest` is what follows "scheme://". A URL's
// '@' past its authority is a path's; a registry address has none anywhere (hosts and
// namespaces do not take it), so there any '@' is taken for credentials: a password with an
// unencoded '/', '?' or '#' ends the authority early and would otherwise be echoed as a host
// and namespace.
void refuse_credentials(std::string_view text, std::string_view rest, bool url) {
  const std::string_view authority = url ? rest.substr(0, rest.find_first_of("/?#")) : rest;
  if (authority.find('@') == std::string_view::npos) return;
  // What follows the address's last '@', never its first: a password may hold an '@' too.
  throw Error(ErrorKind::kInvalidInput,
              "invalid hub address " + scheme_prefix(text) + "...@" +
                  std::string(rest.substr(rest.rfind('@') + 1)) +
                  ": credentials in the address (user:password@) would show in messages and "
                  "cache paths; put them in the credentials file (KERNEL_HUB_CREDENTIALS, else "
                  "~/.config/kernel-hub/credentials.json) under the host[:port], or in docker's "
                  "or podman's auth file");
}

// An http(s) hub's authority must be HOST[:PORT] (a name or IPv4 address, or [IPv6]; a numeric
// port). Anything else is refused without repeating what follows the scheme: a password with an
// unencoded '/', '?' or '#' ends the authority early ("alice:s3c" of "alice:s3c/r3t@host"), so
// that text may hold one.
void require_host_port(std::string_view text, std::string_view rest) {
  const std::string_view authority = rest.substr(0, rest.find_first_of("/?#"));
  std::string_view host = authority, port;
  if (authority.starts_with('[')) {
    const size_t close = authority.find(']');
    host = authority.substr(0, close == std::string_view::npos ? authority.size() : close + 1);
    if (close == std::string_view::npos) host = {};
    std::string_view after = authority.substr(host.size());
    if (!after.empty() && (after.front() != ':' || after.size() == 1)) host = {};
    if (!after.empty()) port = after.substr(1);
  } else if (const size_t colon = authority.find(':'); colon != std::string_view::npos) {
    host = authority.substr(0, colon);
    port = authority.substr(colon + 1);
    if (port.empty()) host = {};
  }
  bool ok = !host.empty() && port.size() <= 5;
  for (char c : host) {
    // Bytes past ASCII: an internationalised name in UTF-8, which libcurl converts (IDN).
    const bool name = std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' ||
                      c == '_' || c == '~' || c == '%' || static_cast<unsigned char>(c) >= 0x80;
    const bool ipv6 = host.front() == '[' && (std::isxdigit(static_cast<unsigned char>(c)) ||
                                              c == ':' || c == '.' || c == '[' || c == ']');
    ok = ok && (name || ipv6);
  }
  for (char c : port) ok = ok && std::isdigit(static_cast<unsigned char>(c));
  if (ok) return;
  throw Error(ErrorKind::kInvalidInput,
              "invalid hub address " + scheme_prefix(text) +
                  "...: what stands for the host is not HOST[:PORT] (a name, an IPv4 address or "
                  "[IPv6], and a numeric port); it is not repeated here in case it holds a "
                  "password (user:password@ with an unencoded '/', '?' or '#'). Give the address "
                  "as http(s)://HOST[:PORT]/PATH, with credentials in the credentials file "
                  "(KERNEL_HUB_CREDENTIALS, else ~/.config/kernel-hub/credentials.json) under the "
                  "host[:port]");
}

}  // namespace

HubAddress HubAddress::parse(std::string_view text, bool plain_http) {
  HubAddress a;
  a.text = std::string(text);
  // An address holding an '@' is not repeated: the '@' may end a password.
  const std::string shown =
      text.find('@') == std::string_view::npos
          ? "'" + std::string(text) + "'"
          : "'" + scheme_prefix(text) +
                "...' (not repeated: it holds an '@', which may end a password)";
  auto bad = [&](const std::string& why) {
    throw Error(ErrorKind::kInvalidInput,
                "invalid hub address " + shown + ": " + why +
                    " (expected oci://HOST[:PORT][/NAMESPACE], http(s)://URL, file://DIR or a "
                    "directory path)");
  };
  if (text.empty()) bad("empty");
  for (char c : text) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) bad("control character in address");
  }
  if (text.starts_with("oci://")) {
    std::string_view rest = text.substr(6);
    while (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
    refuse_credentials(text, rest, false);
    auto slash = rest.find('/');
    a.kind = Kind::kRegistry;
    a.host = std::string(rest.substr(0, slash));
    if (slash != std::string_view::npos) a.ns = std::string(rest.substr(slash + 1));
    if (a.host.empty()) bad("missing host");
    for (char c : a.host) {
      if (!(isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == ':' ||
            c == '[' || c == ']')) {
        bad("invalid character in host");
      }
    }
    a.plain_http = plain_http;
    a.base_url = (plain_http ? "http://" : "https://") + a.host;
    return a;
  }
  if (text.starts_with("http://") || text.starts_with("https://")) {
    a.kind = Kind::kHttpLayout;
    std::string_view rest = text.substr(text.find("://") + 3);
    if (rest.empty() || rest.front() == '/') bad("missing host");
    // user:password@ would reach every message, the hub's id and the cache's directory names.
    refuse_credentials(text, rest, true);
    require_host_port(text, rest);
    a.base_url = std::string(text);
    while (a.base_url.size() > 8 && a.base_url.back() == '/') a.base_url.pop_back();
    return a;
  }
  if (text.starts_with("file://")) text = text.substr(7);
  if (text.find("://") != std::string_view::npos) bad("unknown scheme");
  if (text.empty()) bad("empty path");
  a.kind = Kind::kDirLayout;
  std::error_code ec;
  a.dir = std::filesystem::absolute(std::filesystem::path(text), ec).lexically_normal();
  if (ec) bad(ec.message());
  return a;
}

std::string HubAddress::id() const {
  switch (kind) {
    case Kind::kRegistry:
      return "registry/" + sanitize(host + (ns.empty() ? "" : "/" + ns));
    case Kind::kHttpLayout: {
      std::string_view u = base_url;
      u = u.substr(u.find("://") + 3);
      return "http/" + sanitize(u);
    }
    case Kind::kDirLayout:
      return "dir/" + sanitize(dir.string());
  }
  return "unknown";
}

std::string HubAddress::repo_path(const std::string& repo) const {
  return ns.empty() ? repo : ns + "/" + repo;
}

}  // namespace kh
