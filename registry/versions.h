// The versions a repository has: its tags, sorted for people (`kernel-hub versions`, and the
// list a not-found error ends with). Channels (v1, v2: what a config names) come first by number,
// then exact versions (1.4.2, 1.10.0-rc1) in semver order, then any other tag by name. Referrers
// tags (sha256-<hex>, where registries without the referrers API keep signatures) are not
// versions and are left out.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "hub/base/error.h"
#include "hub/hub.h"

namespace kh {

struct VersionList {
  std::vector<std::string> channels;  // v1, v2, ...
  std::vector<std::string> versions;  // 1.0.0, 1.4.2, 2.0.0-rc1, ...
  std::vector<std::string> other;     // latest, main, ...

  static VersionList from_tags(const std::vector<std::string>& tags);
  // Every tag in the documented order.
  std::vector<std::string> all() const;
  size_t size() const { return channels.size() + versions.size() + other.size(); }
};

// Semver-aware order of exact versions: numeric MAJOR.MINOR.PATCH, a pre-release before its
// release; tags that are not versions compare by name after every version.
bool tag_version_less(const std::string& a, const std::string& b);

// "v1, v2, 1.0.0, 1.1.0" with at most `max` names ("... and N more"); "none" when empty.
std::string format_versions(const VersionList& list, size_t max = 20);

// For a not-found error about `repo`: "; <repo> has: v1, 1.0.0 (kernel-hub versions <repo>)",
// or "; no repository <repo> on <hub>" when listing it is not found either. Empty when the hub
// cannot list (offline, a network error): the error stands as it is.
std::string not_found_versions_hint(Hub& hub, const std::string& repo, size_t max = 20);

// The same error, its message ending with not_found_versions_hint when it is a kNotFound.
Error with_versions_hint(const Error& error, Hub& hub, const std::string& repo);

}  // namespace kh
