#include "hub/transport/registry_mirrors.h"

#include <fmt/format.h>

#include <cctype>

#include "hub/base/env.h"
#include "hub/base/error.h"

namespace kh {

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// HOST[:PORT] as HubAddress accepts a registry host: letters, digits, '.', '-', ':', '[', ']'.
bool valid_host(std::string_view host) {
  if (host.empty() || host.front() == ':') return false;
  for (char c : host) {
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '-' || c == ':' ||
          c == '[' || c == ']')) {
      return false;
    }
  }
  return true;
}

}  // namespace

std::string RegistryMirror::str() const {
  return (registry.empty() ? "" : registry + "=") + (scheme.empty() ? "" : scheme + "://") + host;
}

std::vector<RegistryMirror> parse_registry_mirrors(std::string_view text,
                                                   const std::string& origin) {
  std::vector<RegistryMirror> out;
  if (trim(text).empty()) return out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string_view::npos) comma = text.size();
    const std::string_view entry = trim(text.substr(start, comma - start));
    start = comma + 1;
    auto bad = [&](const std::string& why) {
      throw Error(ErrorKind::kInvalidInput,
                  fmt::format("{}: mirror entry '{}' {}; expected [REGISTRY=]MIRROR[,...] with "
                              "MIRROR as [http://|https://]HOST[:PORT] (e.g. "
                              "registry.example=127.0.0.1:5001)",
                              origin, entry, why));
    };
    if (entry.empty()) bad("is empty");
    // Not echoed: it would print a password. Mirrors get no credentials (they serve what the
    // hub's digests pin), so there is nowhere else to put one.
    if (entry.find('@') != std::string_view::npos)
      throw Error(ErrorKind::kInvalidInput,
                  fmt::format("{}: a mirror entry holds user:password@ (not repeated here); "
                              "mirrors are asked anonymously: remove it",
                              origin));
    RegistryMirror m;
    std::string_view rest = entry;
    if (size_t eq = rest.find('='); eq != std::string_view::npos) {
      std::string_view reg = trim(rest.substr(0, eq));
      // A registry written as a hub address or URL names the same host.
      for (std::string_view prefix : {"oci://", "https://", "http://"}) {
        if (reg.starts_with(prefix)) reg.remove_prefix(prefix.size());
      }
      if (!valid_host(reg)) bad("names no valid registry HOST[:PORT] before '='");
      m.registry = std::string(reg);
      rest = trim(rest.substr(eq + 1));
    }
    if (size_t sep = rest.find("://"); sep != std::string_view::npos) {
      m.scheme = std::string(rest.substr(0, sep));
      if (m.scheme != "http" && m.scheme != "https") bad("has a scheme other than http or https");
      rest.remove_prefix(sep + 3);
    }
    while (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
    if (rest.find_first_of("/?#") != std::string_view::npos) {
      bad("has a path: a mirror serves the hub's repositories at the same paths");
    }
    if (!valid_host(rest)) bad("has no valid mirror HOST[:PORT]");
    m.host = std::string(rest);
    out.push_back(std::move(m));
  }
  return out;
}

std::vector<RegistryMirror> registry_mirrors_from_env() {
  return parse_registry_mirrors(env_string("KERNEL_HUB_MIRRORS"), "KERNEL_HUB_MIRRORS");
}

std::vector<RegistryMirror> mirrors_for(const std::vector<RegistryMirror>& all,
                                        const std::string& registry_host) {
  std::vector<RegistryMirror> out;
  for (const auto& m : all) {
    // A mirror of itself would only send every request twice.
    if ((m.registry.empty() || m.registry == registry_host) && m.host != registry_host)
      out.push_back(m);
  }
  return out;
}

}  // namespace kh
