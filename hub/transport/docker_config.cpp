#include "hub/transport/docker_config.h"

#include <cctype>
#include <nlohmann/json.hpp>

#include "hub/base/base64.h"
#include "hub/base/error.h"

namespace kh {

namespace {

using json = nlohmann::json;

[[noreturn]] void malformed(const std::string& origin, const std::string& what) {
  throw Error(
      ErrorKind::kInvalidInput,
      origin + ": " + what + "; fix or remove the entry (docker login / podman login rewrite it)");
}

// A string member, "" when absent or null; anything else is malformed.
std::string string_member(const json& obj, const char* name, const std::string& origin,
                          const std::string& where) {
  auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) return "";
  if (!it->is_string()) malformed(origin, where + "." + name + " is not a string");
  return it->get<std::string>();
}

AuthEntry parse_auth_entry(const json& e, const std::string& origin, const std::string& key) {
  const std::string where = "auths[\"" + key + "\"]";
  if (!e.is_object()) malformed(origin, where + " is not an object");
  AuthEntry a;
  if (std::string auth = string_member(e, "auth", origin, where); !auth.empty()) {
    auto decoded = base64_decode(auth);
    size_t colon = decoded ? decoded->find(':') : std::string::npos;
    if (colon == std::string::npos) {
      malformed(origin, where + ".auth is not base64 of \"username:password\"");
    }
    a.username = decoded->substr(0, colon);
    a.password = decoded->substr(colon + 1);
  } else {
    a.username = string_member(e, "username", origin, where);
    a.password = string_member(e, "password", origin, where);
  }
  a.identity_token = string_member(e, "identitytoken", origin, where);
  a.registry_token = string_member(e, "registrytoken", origin, where);
  return a;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// The key of `map` naming `host`: an exact key first, then the first normalised match.
template <typename Map>
typename Map::const_iterator find_key(const Map& map, const std::string& host) {
  const std::string want = registry_key_host(host);
  if (auto it = map.find(host); it != map.end()) return it;
  for (auto it = map.begin(); it != map.end(); ++it) {
    if (registry_key_host(it->first) == want) return it;
  }
  return map.end();
}

}  // namespace

std::string registry_key_host(std::string_view key) {
  std::string k(key);
  if (size_t s = k.find("://"); s != std::string::npos) k.erase(0, s + 3);
  k = lower(k.substr(0, k.find('/')));
  if (k == "index.docker.io" || k == "registry-1.docker.io" || k == "registry.hub.docker.com") {
    return "docker.io";
  }
  return k;
}

std::optional<AuthEntry> DockerConfig::auth_for(const std::string& host) const {
  auto it = find_key(auths, host);
  if (it == auths.end()) return std::nullopt;
  return it->second;
}

std::string DockerConfig::helper_for(const std::string& host) const {
  auto it = find_key(cred_helpers, host);
  return it == cred_helpers.end() ? std::string() : it->second;
}

DockerConfig parse_docker_config(std::string_view text, const std::string& origin) {
  json doc = json::parse(text, nullptr, false);
  if (doc.is_discarded()) malformed(origin, "not valid JSON");
  if (!doc.is_object()) malformed(origin, "not a JSON object");
  DockerConfig c;
  if (auto it = doc.find("auths"); it != doc.end() && !it->is_null()) {
    if (!it->is_object()) malformed(origin, "\"auths\" is not an object");
    for (const auto& [key, entry] : it->items())
      c.auths[key] = parse_auth_entry(entry, origin, key);
  }
  if (auto it = doc.find("credHelpers"); it != doc.end() && !it->is_null()) {
    if (!it->is_object()) malformed(origin, "\"credHelpers\" is not an object");
    for (const auto& [key, name] : it->items()) {
      if (!name.is_string() || name.get<std::string>().empty()) {
        malformed(origin, "credHelpers[\"" + key + "\"] is not a helper name");
      }
      c.cred_helpers[key] = name.get<std::string>();
    }
  }
  c.creds_store = string_member(doc, "credsStore", origin, "config");
  // The name becomes part of a program name: refuse one that could name another path.
  auto check_name = [&](const std::string& name) {
    if (name.find('/') != std::string::npos || name == "." || name == "..") {
      malformed(origin, "credential helper name '" + name + "' contains '/'");
    }
  };
  check_name(c.creds_store);
  for (const auto& [key, name] : c.cred_helpers) check_name(name);
  return c;
}

AuthEntry parse_helper_reply(std::string_view text, const std::string& origin) {
  json doc = json::parse(text, nullptr, false);
  if (!doc.is_object()) {
    throw Error(ErrorKind::kInvalidInput,
                origin + " did not print a JSON object {\"ServerURL\", \"Username\", \"Secret\"}");
  }
  AuthEntry a;
  std::string user = string_member(doc, "Username", origin, "reply");
  std::string secret = string_member(doc, "Secret", origin, "reply");
  if (user == "<token>") {
    a.identity_token = secret;
  } else {
    a.username = user;
    a.password = secret;
  }
  return a;
}

}  // namespace kh
