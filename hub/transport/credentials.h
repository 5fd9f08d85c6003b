// Registry credentials, looked up where users already keep them. For a request to host[:port],
// the first source that has an entry wins:
//   1. the source options (SourceOptions::username/password, for the registry itself)
//   2. KERNEL_HUB_USERNAME / KERNEL_HUB_PASSWORD, when scoped to the host (KERNEL_HUB_CREDENTIALS_HOST,
//      else KERNEL_HUB_ENDPOINT's registry)
//   3. kernel-hub's credentials file ($KERNEL_HUB_CREDENTIALS, else
//      ~/.config/kernel-hub/credentials.json)
//   4. $REGISTRY_AUTH_FILE, else ${XDG_RUNTIME_DIR}/containers/auth.json then
//      ${XDG_CONFIG_HOME:-~/.config}/containers/auth.json (podman, skopeo, buildah)
//   5. $DOCKER_CONFIG/config.json, else ~/.docker/config.json (docker, oras)
// In 4 and 5 (one format, docker_config.h): the host's credHelpers entry, then credsStore, then its
// auths entry; a helper is docker-credential-<name> on PATH, run without a shell, with a timeout.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

#include "hub/transport/source.h"

namespace kh {

struct Credentials {
  std::string username;
  std::string password;
  std::string identity_token;  // OAuth2 refresh token, exchanged at the token realm
  std::string registry_token;  // bearer token sent to the registry as is
  std::string origin;          // for messages: "options", the variables, a file or a helper
};

// kernel-hub's own credentials file: $KERNEL_HUB_CREDENTIALS, else
// ~/.config/kernel-hub/credentials.json.
std::filesystem::path credentials_file();

// Credentials for the registry `host` (host[:port]) the options belong to, in the order above:
// for its own requests and for the token realm it names, wherever that is. Throws kInvalidInput naming a malformed file, kAuth naming a helper that
// failed, and what to do.
std::optional<Credentials> load_credentials(const SourceOptions& o, const std::string& host);

// What to do about refused or missing credentials at `host`: the places above, and why the
// environment's credentials were not sent there when they are set but scoped elsewhere.
std::string credentials_hint(const std::string& host);

}  // namespace kh
