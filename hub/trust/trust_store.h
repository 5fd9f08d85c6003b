// The keys a user trusts, each limited to the repositories it may sign (a publisher
// allowlist). Directory-backed, one file per key:
//   <dir>/<keyid>.json  {"keyid", "public_key" (PEM SubjectPublicKeyInfo), "repos": [patterns],
//                        "added_at" (unix seconds)}
// plus built-in keys held in memory only (the embedded default hub's key).
//
// Repository patterns:
//   "*"          every repository
//   "org/name"   exactly that repository (a valid repository name)
//   "org/*"      every repository under org/ (org/name, org/team/name); the prefix before "/*"
//                is a valid repository name of one or more components
// '*' is allowed only as the whole pattern or as a whole trailing component: "org*",
// "*/name", "org/*/name" and "org/" are invalid.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "hub/trust/signature.h"

namespace kh::trust {

bool is_valid_repo_pattern(std::string_view pattern);
bool repo_pattern_matches(std::string_view pattern, std::string_view repo);

struct TrustedKey {
  PublicKey key;
  std::vector<std::string> repos;  // patterns, in the order given, no duplicates
  int64_t added_at = 0;            // unix seconds; 0 for built-in keys
  bool builtin = false;
  std::filesystem::path path;  // the backing file; empty for built-in keys

  const std::string& key_id() const { return key.key_id(); }
  bool allows(std::string_view repo) const;
  std::string repos_text() const;  // "org/*, other/name" for messages
};

class TrustStore {
 public:
  // An empty store with no directory (built-in keys only); add/remove then throw kIo.
  TrustStore() = default;
  // Reads every <keyid>.json of dir (a missing dir is an empty store; it is created by add).
  // A damaged or inconsistent file is skipped with a warning on stderr, kept in problems():
  // its key is then simply not trusted, which fails closed.
  static TrustStore open(const std::filesystem::path& dir);
  // $KERNEL_HUB_TRUST_DIR, else $XDG_CONFIG_HOME/kernel-hub/trust, else
  // ~/.config/kernel-hub/trust.
  static std::filesystem::path default_dir();

  const std::filesystem::path& dir() const { return dir_; }
  // Where rollback state lives (TrustState): <dir>/state. Empty without a directory.
  std::filesystem::path state_dir() const { return dir_.empty() ? dir_ : dir_ / "state"; }

  // Trusts key for the patterns (at least one, each valid, else kInvalidInput), written
  // atomically to dir/<keyid>.json. Re-adding a key replaces its patterns (added_at is kept).
  const TrustedKey& add(const PublicKey& key, const std::vector<std::string>& patterns,
                        int64_t now = 0 /* 0: the current time */);
  // Removes the file of a key given by its keyid or a unique prefix of at least 8 lowercase
  // hex characters. kNotFound when no file-backed key matches, kInvalidInput when the prefix
  // is ambiguous or malformed, kRefused for a built-in key. Returns the full keyid.
  std::string remove(std::string_view keyid_or_prefix);
  // In memory only, listed with builtin = true; never written or removable.
  void add_builtin(const PublicKey& key, const std::vector<std::string>& patterns);

  // Built-in keys first, then file-backed ones, each by keyid. Pointers and references into
  // the store stay valid until the next add, add_builtin or remove.
  const std::vector<TrustedKey>& list() const { return keys_; }
  // Every entry for this keyid (a key can be both built in and added).
  std::vector<const TrustedKey*> find(std::string_view keyid) const;
  // Every entry whose patterns allow repo.
  std::vector<const TrustedKey*> keys_for(std::string_view repo) const;
  const std::vector<std::string>& problems() const { return problems_; }

 private:
  void sort();
  std::filesystem::path dir_;
  std::vector<TrustedKey> keys_;
  std::vector<std::string> problems_;
};

}  // namespace kh::trust
