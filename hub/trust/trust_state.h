// Rollback state (REFERENCE 4.3 step 4), kept with the trust store, not in the cache (clearing
// or sharing a cache must not reset it):
//   <trust dir>/state/<hub-id>/<org>/<name>/<tag>.json
//       {"hub_id", "repo", "tag", "serial", "index", "expires", "seen_at", "key_id", "key_ids"}
//   <trust dir>/state/.keys/<key id>/<org>/<name>/<tag>.json   (the same fields, one key)
// The highest statement serial verified for each (hub id, repo, tag), and for each trusted key
// that signed it (repo, tag), so that a hub or mirror serving an older, validly signed statement
// is refused, under its own hub id or another. Every write is temp -> fsync -> rename.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "hub/base/digest.h"

namespace kh::trust {

struct SerialRecord {
  std::string hub_id;
  std::string repo;
  std::string tag;
  uint64_t serial = 0;
  Digest index;         // the index digest that serial signed
  int64_t expires = 0;  // unix seconds, the statement's expiry
  int64_t seen_at = 0;  // unix seconds, when it was verified
  std::string key_id;   // the key that signed it ("" in records written before it was kept)
  // Every trusted key that signed it (key_id among them): a co-signed statement counts for each
  // signer's history. Read as {key_id} from records written before it was kept.
  std::vector<std::string> key_ids;
  bool operator==(const SerialRecord&) const = default;
};

class TrustState {
 public:
  // dir holds the records (TrustStore::state_dir()); nothing is created until the first write.
  explicit TrustState(std::filesystem::path dir);

  // Throws kInvalidInput when hub_id is not [A-Za-z0-9._-]+ (no leading '.'), repo not a
  // valid repository name or tag not a valid tag. A damaged record is reported on stderr and
  // read as absent (the next verification rewrites it).
  std::optional<SerialRecord> read(const std::string& hub_id, const std::string& repo,
                                   const std::string& tag) const;
  // The record of one key for (repo, tag): the highest serial it signed, under any hub id.
  std::optional<SerialRecord> read_key(const std::string& key_id, const std::string& repo,
                                       const std::string& tag) const;
  // The record with the highest serial for (repo, tag) signed by any of `key_ids`, under any hub
  // id (their own records, and hub ids' records naming them): the hub id is the signer's to
  // choose, so the same key's older statement under another one must not start a fresh count.
  // Other keys' records (another build tree's default hub, another publisher) are not compared.
  std::optional<SerialRecord> read_highest(const std::string& repo, const std::string& tag,
                                           const std::vector<std::string>& key_ids) const;
  // Replaces the hub id's record atomically.
  void write(const SerialRecord& record);
  // Under a lock shared by every process using this cache: writes the hub id's record, and each
  // of record.key_ids' own, only where none exists or its serial is lower, so concurrent
  // verifiers never move a serial backwards. Returns whether the hub id's record was written.
  bool advance(const SerialRecord& record);

  std::filesystem::path path_for(const std::string& hub_id, const std::string& repo,
                                 const std::string& tag) const;
  std::filesystem::path key_path_for(const std::string& key_id, const std::string& repo,
                                     const std::string& tag) const;
  const std::filesystem::path& root() const { return root_; }

 private:
  // The record at `p` for (repo, tag), or none (absent, or damaged: reported and ignored);
  // `disagreement` says what else about it contradicts its path ("" when nothing).
  std::optional<SerialRecord> read_at(
      const std::filesystem::path& p, const std::string& repo, const std::string& tag,
      const std::function<std::string(const SerialRecord&)>& disagreement) const;
  void write_at(const std::filesystem::path& p, const SerialRecord& record);

  std::filesystem::path root_;
};

}  // namespace kh::trust
