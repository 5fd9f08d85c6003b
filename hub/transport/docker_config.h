// The credential files docker, podman, skopeo and oras share: docker's config.json and
// containers-auth.json(5) (one format): "auths" entries keyed by registry, per-registry
// "credHelpers" and a default "credsStore" (docker-credential-<name> programs). Parsing and key
// matching only; running helpers is credentials.cpp's.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>

namespace kh {

// One "auths" entry, decoded.
struct AuthEntry {
  std::string username;  // from "auth" (base64 user:password) or "username"
  std::string password;
  std::string identity_token;  // "identitytoken": an OAuth2 refresh token for the token realm
  std::string registry_token;  // "registrytoken": a bearer token sent as is
  bool empty() const {
    return username.empty() && password.empty() && identity_token.empty() && registry_token.empty();
  }
};

struct DockerConfig {
  std::map<std::string, AuthEntry> auths;           // keys as written in the file
  std::map<std::string, std::string> cred_helpers;  // registry key -> helper name
  std::string creds_store;                          // default helper name ("" = none)

  // The entry for `host` (host[:port], lower-case) as docker matches keys: the key with its
  // scheme and path dropped (registry_key_host), docker.io also under
  // "https://index.docker.io/v1/". An exact key wins over a normalised one. nullopt when none.
  std::optional<AuthEntry> auth_for(const std::string& host) const;
  // The helper for `host` in credHelpers ("" when none), keys matched as in auth_for.
  std::string helper_for(const std::string& host) const;
};

// Parses a config.json / auth.json text. Throws kh::Error (kInvalidInput) naming `origin` (the
// file) and the malformed member. Unknown members are ignored (the files hold much else).
DockerConfig parse_docker_config(std::string_view text, const std::string& origin);

// The host[:port] a key names: "https://reg.example:5000/v2/" -> "reg.example:5000"; docker
// Hub's names (index.docker.io, registry-1.docker.io, "https://index.docker.io/v1/") -> "docker.io".
// Lower-case.
std::string registry_key_host(std::string_view key);

// What a docker-credential helper's `get` printed: {"ServerURL", "Username", "Secret"}. A
// Username of "<token>" means Secret is an identity token. Throws kInvalidInput naming `origin`.
AuthEntry parse_helper_reply(std::string_view text, const std::string& origin);

}  // namespace kh
