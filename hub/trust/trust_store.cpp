#include "hub/trust/trust_store.h"

#include <fmt/format.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <ctime>
#include <nlohmann/json.hpp>

#include "hub/base/env.h"
#include "hub/base/error.h"
#include "hub/base/fs.h"
#include "hub/base/guarded_root.h"
#include "hub/base/log.h"
#include "hub/oci/ref.h"

namespace kh::trust {

namespace {

namespace stdfs = std::filesystem;
using nlohmann::json;

constexpr uint64_t kMaxTrustFileBytes = 64 * 1024;
constexpr size_t kMaxPatterns = 256;

bool is_lower_hex(std::string_view s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

// Validates and de-duplicates patterns, keeping the order given.
std::vector<std::string> checked_patterns(const std::vector<std::string>& patterns,
                                          const std::string& what) {
  if (patterns.empty()) {
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("{}: give at least one repository pattern the key may sign, e.g. "
                            "org/* or org/name (or * for every repository)",
                            what));
  }
  if (patterns.size() > kMaxPatterns) {
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("{}: {} repository patterns, over the limit of {}; use org/* "
                            "patterns",
                            what, patterns.size(), kMaxPatterns));
  }
  std::vector<std::string> out;
  for (const auto& p : patterns) {
    if (!is_valid_repo_pattern(p)) {
      throw Error(ErrorKind::kInvalidInput,
                  fmt::format("{}: invalid repository pattern '{}': use org/name, org/* (every "
                              "repository under org/) or * ('*' only as a whole last component)",
                              what, p.substr(0, 200)));
    }
    if (std::find(out.begin(), out.end(), p) == out.end()) out.push_back(p);
  }
  return out;
}

}  // namespace

bool is_valid_repo_pattern(std::string_view p) {
  if (p == "*") return true;
  if (p.ends_with("/*")) p.remove_suffix(2);
  return !p.empty() && is_valid_repo_name(p);
}

bool repo_pattern_matches(std::string_view pattern, std::string_view repo) {
  if (!is_valid_repo_pattern(pattern)) return false;
  if (pattern == "*") return true;
  if (pattern.ends_with("/*")) {
    pattern.remove_suffix(1);  // keep the '/': "org/*" matches "org/x", never "orgx/y"
    return repo.size() > pattern.size() && repo.starts_with(pattern);
  }
  return repo == pattern;
}

bool TrustedKey::allows(std::string_view repo) const {
  return std::any_of(repos.begin(), repos.end(),
                     [&](const std::string& p) { return repo_pattern_matches(p, repo); });
}

std::string TrustedKey::repos_text() const {
  std::string out;
  for (const auto& p : repos) out += (out.empty() ? "" : ", ") + p;
  return out;
}

stdfs::path TrustStore::default_dir() {
  return user_dir("KERNEL_HUB_TRUST_DIR", "XDG_CONFIG_HOME", ".config", "kernel-hub/trust");
}

TrustStore TrustStore::open(const stdfs::path& dir) {
  TrustStore store;
  // Absolute once: a guard recorded for a relative path would not cover it after a chdir.
  store.dir_ = stdfs::absolute(dir);
  std::error_code ec;
  // Keys decide what code runs: the directory must be this user's and private (StrictModes), and
  // no link inside it is followed.
  if (stdfs::exists(store.dir_, ec))
    fs::guard_root(store.dir_, fs::Sharing::kPrivate, "trust store");
  stdfs::directory_iterator it(store.dir_, ec);
  if (ec) {
    if (ec == std::errc::no_such_file_or_directory) return store;
    throw Error(ErrorKind::kIo, fmt::format("cannot read the trust directory {}: {}; check its "
                                            "permissions or set KERNEL_HUB_TRUST_DIR",
                                            dir.string(), ec.message()));
  }
  std::vector<stdfs::path> files;
  for (; it != stdfs::directory_iterator(); it.increment(ec)) {
    std::string name = it->path().filename().string();
    // Hidden names are our temp files (.<name>.<pid>.<rand>.part) or not ours.
    if (name.starts_with(".") || !name.ends_with(".json")) continue;
    files.push_back(it->path());
  }
  std::sort(files.begin(), files.end());
  for (const auto& path : files) {
    auto problem = [&](const std::string& why) {
      std::string msg = fmt::format(
          "ignoring trust file {}: {}; its key is not trusted until "
          "it is fixed, or re-add the key with `kernel-hub trust add`",
          path.string(), why);
      log_warning(msg);
      store.problems_.push_back(std::move(msg));
    };
    std::string stem = path.stem().string();
    if (stem.size() != 64 || !is_lower_hex(stem)) {
      problem("the name is not <keyid>.json (64 lowercase hex characters)");
      continue;
    }
    struct stat st {};
    if (::lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
      problem("it is not a regular file (links are not followed in the trust store)");
      continue;
    }
    if ((st.st_uid != ::geteuid() && st.st_uid != 0) || (st.st_mode & (S_IWGRP | S_IWOTH))) {
      problem(
          fmt::format("it is owned by uid {} with mode {:04o}; a trusted key must be yours "
                      "(or root's) and writable by no one else",
                      st.st_uid, st.st_mode & 07777));
      continue;
    }
    try {
      std::string text = fs::read_file(path, kMaxTrustFileBytes);
      json j = json::parse(text);
      std::string keyid = j.at("keyid").get<std::string>();
      PublicKey key = PublicKey::parse_pem(j.at("public_key").get<std::string>(), path.string());
      std::vector<std::string> repos = j.at("repos").get<std::vector<std::string>>();
      int64_t added_at = j.contains("added_at") ? j.at("added_at").get<int64_t>() : 0;
      if (key.key_id() != keyid || keyid != stem) {
        // A file renamed or edited to claim another key's id must not lend it that id.
        problem(fmt::format("\"keyid\" {} and the file name must both be the key's id {}",
                            keyid.substr(0, 64), key.key_id()));
        continue;
      }
      store.keys_.push_back(
          TrustedKey{key, checked_patterns(repos, path.string()), added_at, false, path});
    } catch (const std::exception& e) {
      problem(e.what());
    }
  }
  store.sort();
  return store;
}

void TrustStore::sort() {
  std::stable_sort(keys_.begin(), keys_.end(), [](const TrustedKey& a, const TrustedKey& b) {
    if (a.builtin != b.builtin) return a.builtin;
    return a.key_id() < b.key_id();
  });
}

const TrustedKey& TrustStore::add(const PublicKey& key, const std::vector<std::string>& patterns,
                                  int64_t now) {
  std::string what = "trust key " + key.key_id();
  std::vector<std::string> repos = checked_patterns(patterns, what);
  if (dir_.empty()) {
    throw Error(ErrorKind::kIo, what +
                                    ": this trust store has no directory; open one with "
                                    "TrustStore::open");
  }
  if (now == 0) now = static_cast<int64_t>(::time(nullptr));
  fs::guard_root(dir_, fs::Sharing::kPrivate, "trust store");  // created private if missing
  stdfs::path path = dir_ / (key.key_id() + ".json");
  TrustedKey* existing = nullptr;
  for (auto& k : keys_) {
    if (!k.builtin && k.key_id() == key.key_id()) existing = &k;
  }
  int64_t added_at = existing ? existing->added_at : now;
  json j{
      {"keyid", key.key_id()}, {"public_key", key.pem()}, {"repos", repos}, {"added_at", added_at}};
  fs::write_file_atomic(path, j.dump(2) + "\n", 0644);
  if (existing) {
    existing->repos = std::move(repos);
    existing->path = path;
    return *existing;
  }
  keys_.push_back(TrustedKey{key, std::move(repos), added_at, false, path});
  sort();
  for (const auto& k : keys_) {
    if (!k.builtin && k.key_id() == key.key_id()) return k;
  }
  throw Error(ErrorKind::kIo, what + ": lost after adding (internal error)");
}

std::string TrustStore::remove(std::string_view prefix) {
  if (prefix.size() < 8 || prefix.size() > 64 || !is_lower_hex(prefix)) {
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("'{}' is not a key id: give the key's id or at least its first 8 "
                            "lowercase hex characters, as `kernel-hub trust ls` shows them",
                            std::string(prefix.substr(0, 80))));
  }
  std::vector<size_t> matches;
  bool builtin_match = false;
  for (size_t i = 0; i < keys_.size(); ++i) {
    if (!keys_[i].key_id().starts_with(prefix)) continue;
    if (keys_[i].builtin) {
      builtin_match = true;
    } else {
      matches.push_back(i);
    }
  }
  if (matches.empty()) {
    if (builtin_match) {
      throw Error(ErrorKind::kRefused,
                  fmt::format("key {} is built in (the embedded default hub's key, trusted for "
                              "kernel-hub/* only) and cannot be removed; to run without it, set "
                              "KERNEL_HUB_DATA_DIR to a data directory without default-hub-key/ "
                              "(an empty one also leaves out the embedded default hub)",
                              std::string(prefix)));
    }
    throw Error(ErrorKind::kNotFound,
                fmt::format("no trusted key {} in {}; list the trusted keys with `kernel-hub "
                            "trust ls`",
                            std::string(prefix), dir_.string()));
  }
  // The same keyid can match only once among file-backed keys, so two matches are two keys.
  if (matches.size() > 1) {
    std::string ids;
    for (size_t i : matches) ids += "\n  " + keys_[i].key_id();
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("key id prefix {} matches {} trusted keys; give more of it:{}",
                            std::string(prefix), matches.size(), ids));
  }
  TrustedKey& k = keys_[matches.front()];
  std::string keyid = k.key_id();
  if (::unlink(k.path.c_str()) != 0 && errno != ENOENT) {
    throw_errno("cannot remove trust file " + k.path.string());
  }
  fs::fsync_dir(k.path.parent_path());
  keys_.erase(keys_.begin() + static_cast<std::ptrdiff_t>(matches.front()));
  return keyid;
}

void TrustStore::add_builtin(const PublicKey& key, const std::vector<std::string>& patterns) {
  std::vector<std::string> repos = checked_patterns(patterns, "built-in key " + key.key_id());
  for (auto& k : keys_) {
    if (k.builtin && k.key_id() == key.key_id()) {
      k.repos = std::move(repos);
      return;
    }
  }
  keys_.push_back(TrustedKey{key, std::move(repos), 0, true, {}});
  sort();
}

std::vector<const TrustedKey*> TrustStore::find(std::string_view keyid) const {
  std::vector<const TrustedKey*> out;
  for (const auto& k : keys_) {
    if (k.key_id() == keyid) out.push_back(&k);
  }
  return out;
}

std::vector<const TrustedKey*> TrustStore::keys_for(std::string_view repo) const {
  std::vector<const TrustedKey*> out;
  for (const auto& k : keys_) {
    if (k.allows(repo)) out.push_back(&k);
  }
  return out;
}

}  // namespace kh::trust
