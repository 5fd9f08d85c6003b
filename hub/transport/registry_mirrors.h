// Pull-through mirrors of OCI registries (as containerd's hosts.toml and docker's
// registry-mirrors): a registry (often docker-registry in proxy mode) that serves the same
// repositories as a hub, tried before the hub itself for everything a pull reads.
//
//   KERNEL_HUB_MIRRORS="[REGISTRY=]MIRROR[,...]"   MIRROR: [http://|https://]HOST[:PORT]
//
// An entry with REGISTRY (HOST[:PORT], as the hub address spells it) applies to that registry
// only; one without applies to every registry hub. A hub's mirrors are the entries that apply to
// it, in the order written; the hub itself comes last. A mirror without a scheme uses the hub's
// (https, or http with --plain-http); `http://` allows plain HTTP to that mirror only.
//
// What a mirror changes is where bytes come from, nothing else: the hub id (ref records,
// signed statements, rollback state) stays the hub's, every manifest and blob is verified
// against its digest as it is from the hub, and pushes and signing go to the hub only.
// Credentials and TLS settings are those of the host a request goes to (the credentials
// lookup and certs.d are per host already).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace kh {

struct RegistryMirror {
  std::string registry;  // HOST[:PORT] it mirrors; "" for every registry
  std::string host;      // the mirror's HOST[:PORT]
  // "http" or "https" when the entry names one; "" follows the hub's scheme.
  std::string scheme;

  std::string str() const;  // as written in KERNEL_HUB_MIRRORS
};

// Parses the KERNEL_HUB_MIRRORS syntax above. Throws kInvalidInput naming `origin` and the
// entry (an empty entry, a path or query after the host, an unknown scheme, a bad host).
std::vector<RegistryMirror> parse_registry_mirrors(std::string_view text,
                                                   const std::string& origin);

// $KERNEL_HUB_MIRRORS parsed (none when unset or empty).
std::vector<RegistryMirror> registry_mirrors_from_env();

// The mirrors that apply to the registry `registry_host`, in order.
std::vector<RegistryMirror> mirrors_for(const std::vector<RegistryMirror>& all,
                                        const std::string& registry_host);

}  // namespace kh
