#include "hub/oci/ref.h"

#include <regex>

#include "hub/base/error.h"

namespace kh {

bool is_valid_repo_name(std::string_view name) {
  // OCI distribution spec name grammar.
  static const std::regex kName(
      "[a-z0-9]+((\\.|_|__|-+)[a-z0-9]+)*(/[a-z0-9]+((\\.|_|__|-+)[a-z0-9]+)*)*");
  return name.size() <= 200 && std::regex_match(name.begin(), name.end(), kName);
}

bool is_valid_tag(std::string_view tag) {
  static const std::regex kTag("[a-zA-Z0-9_][a-zA-Z0-9._-]{0,127}");
  return std::regex_match(tag.begin(), tag.end(), kTag);
}

Ref Ref::parse(std::string_view text) {
  auto fail = [&](const std::string& why) -> Ref {
    throw Error(ErrorKind::kInvalidInput,
                "invalid ref '" + std::string(text) + "': " + why +
                    " (expected org/name[@TAG|@sha256:HEX], e.g. kernel-hub/norm@v1)");
  };
  Ref r;
  std::string_view name = text;
  std::string_view version;
  if (auto at = text.find('@'); at != std::string_view::npos) {
    name = text.substr(0, at);
    version = text.substr(at + 1);
    if (version.empty()) return fail("empty version after '@'");
  }
  if (name.find(':') != std::string_view::npos) {
    return fail("':' is not allowed here; use '@' before a tag or digest");
  }
  if (name.find('/') == std::string_view::npos) return fail("the name needs an org: org/name");
  if (!is_valid_repo_name(name)) {
    return fail("'" + std::string(name) +
                "' is not a valid repository name (lowercase letters, digits, '.', '_', '-', '/')");
  }
  r.repo = std::string(name);
  if (version.empty()) {
    r.tag = std::string(kDefaultTag);
  } else if (version.starts_with("sha256:")) {
    if (!Digest::is_valid(version)) return fail("digest must be sha256: and 64 lowercase hex");
    r.digest = Digest::parse(version);
  } else if (version.find(':') != std::string_view::npos) {
    return fail("unsupported digest algorithm (only sha256)");
  } else {
    if (!is_valid_tag(version)) return fail("'" + std::string(version) + "' is not a valid tag");
    r.tag = std::string(version);
  }
  return r;
}

std::string Ref::str() const {
  return repo + "@" + reference();
}

}  // namespace kh
