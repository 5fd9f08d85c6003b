// Hub addresses:
//   oci://HOST[:PORT][/NAMESPACE]  an OCI distribution registry (HTTPS; plain HTTP on request)
//   http(s)://BASE                 a static hub: OCI image layouts served by any HTTP server
//   file://DIR or DIR              a hub directory of OCI image layouts
// A layout hub holds one OCI image layout per repository, at <base>/<org>/<name>/
// (oci-layout, index.json, blobs/sha256/...), tags in org.opencontainers.image.ref.name.
#pragma once

#include <filesystem>
#include <string>
#include <string_view>

namespace kh {

struct HubAddress {
  enum class Kind { kRegistry, kHttpLayout, kDirLayout };
  Kind kind = Kind::kDirLayout;
  std::string text;           // as given, for messages
  std::string host;           // registry: host[:port]
  std::string ns;             // registry: namespace prefix for repos ("" or "team/x")
  std::string base_url;       // registry: scheme://host[:port]; http layout: base URL
  std::filesystem::path dir;  // dir layout
  bool plain_http = false;    // registry over http://

  // Throws kInvalidInput with the accepted forms in the message.
  static HubAddress parse(std::string_view text, bool plain_http);

  // Stable id used for ref records in the cache: "registry/127.0.0.1_5000/ns", ...
  std::string id() const;
  // Repository path on this hub (adds the registry namespace).
  std::string repo_path(const std::string& repo) const;
};

}  // namespace kh
