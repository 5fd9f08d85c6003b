#include "registry/versions.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <tuple>

#include "hub/base/error.h"

namespace kh {

namespace {

std::optional<long long> number(std::string_view s) {
  if (s.empty() || s.size() > 12) return std::nullopt;
  long long v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + (c - '0');
  }
  return v;
}

struct Semver {
  long long major = 0, minor = 0, patch = 0;
  std::string pre;  // after '-', empty for a release
};

// MAJOR.MINOR.PATCH[-PRE][+BUILD] (a leading 'v' is a channel, not a version).
std::optional<Semver> parse_semver(std::string_view s) {
  if (auto plus = s.find('+'); plus != std::string_view::npos) s = s.substr(0, plus);
  Semver v;
  if (auto dash = s.find('-'); dash != std::string_view::npos) {
    v.pre = std::string(s.substr(dash + 1));
    s = s.substr(0, dash);
  }
  auto d1 = s.find('.');
  if (d1 == std::string_view::npos) return std::nullopt;
  auto d2 = s.find('.', d1 + 1);
  if (d2 == std::string_view::npos) return std::nullopt;
  auto a = number(s.substr(0, d1)), b = number(s.substr(d1 + 1, d2 - d1 - 1)),
       c = number(s.substr(d2 + 1));
  if (!a || !b || !c) return std::nullopt;
  v.major = *a;
  v.minor = *b;
  v.patch = *c;
  return v;
}

std::optional<long long> channel_number(const std::string& tag) {
  if (tag.size() < 2 || tag[0] != 'v') return std::nullopt;
  return number(std::string_view(tag).substr(1));
}

bool is_referrers_tag(const std::string& tag) {
  return tag.size() == 71 && tag.starts_with("sha256-");
}

}  // namespace

bool tag_version_less(const std::string& a, const std::string& b) {
  auto va = parse_semver(a), vb = parse_semver(b);
  if (va && vb) {
    auto ka = std::tie(va->major, va->minor, va->patch);
    auto kb = std::tie(vb->major, vb->minor, vb->patch);
    if (ka != kb) return ka < kb;
    // A pre-release comes before its release; pre-releases by name.
    if (va->pre.empty() != vb->pre.empty()) return !va->pre.empty();
    if (va->pre != vb->pre) return va->pre < vb->pre;
    return a < b;
  }
  if (va || vb) return va.has_value();
  return a < b;
}

VersionList VersionList::from_tags(const std::vector<std::string>& tags) {
  VersionList out;
  for (auto& t : tags) {
    if (is_referrers_tag(t)) continue;
    if (channel_number(t))
      out.channels.push_back(t);
    else if (parse_semver(t))
      out.versions.push_back(t);
    else
      out.other.push_back(t);
  }
  std::sort(out.channels.begin(), out.channels.end(), [](auto& a, auto& b) {
    return std::make_pair(*channel_number(a), a) < std::make_pair(*channel_number(b), b);
  });
  std::sort(out.versions.begin(), out.versions.end(), tag_version_less);
  std::sort(out.other.begin(), out.other.end());
  return out;
}

std::vector<std::string> VersionList::all() const {
  std::vector<std::string> out = channels;
  out.insert(out.end(), versions.begin(), versions.end());
  out.insert(out.end(), other.begin(), other.end());
  return out;
}

std::string format_versions(const VersionList& list, size_t max) {
  auto all = list.all();
  if (all.empty()) return "none";
  std::string out;
  for (size_t i = 0; i < all.size() && i < max; ++i) out += (i ? ", " : "") + all[i];
  if (all.size() > max) out += fmt::format(" ... and {} more", all.size() - max);
  return out;
}

std::string not_found_versions_hint(Hub& hub, const std::string& repo, size_t max) {
  if (hub.options().offline) return "";
  try {
    VersionList list = VersionList::from_tags(hub.tags(repo));
    return fmt::format("; {} has: {} (kernel-hub versions {})", repo, format_versions(list, max),
                       repo);
  } catch (const Error& e) {
    if (e.kind() == ErrorKind::kNotFound)
      return fmt::format("; no repository {} on {}", repo, hub.address().text);
    return "";
  }
}

Error with_versions_hint(const Error& error, Hub& hub, const std::string& repo) {
  // A layout source's own message already lists its tags, or says the repository is missing.
  std::string_view what = error.what();
  if (error.kind() != ErrorKind::kNotFound ||
      what.find("tags present:") != std::string_view::npos ||
      what.find("no such repository") != std::string_view::npos)
    return error;
  return Error(error.kind(), std::string(error.what()) + not_found_versions_hint(hub, repo));
}

}  // namespace kh
