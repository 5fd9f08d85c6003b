// Rollback state (REFERENCE 4.3 step 4), kept with the trust store, not in the cache (clearing
// or sharing a cache must not reset it):
//   <trust dir>/state/<hub-id>/<org>/<name>/<tag>.json
//       {"hub_id", "repo", "tag", "serial", "index", "expires", "seen_at", "key_id", "key_ids"}
// The highest statement serial verified for each (hub id, repo, tag), so that a hub or mirror
// serving an older, validly signed statement is refused. Every write is temp -> fsync ->
// rename.
#pragma once

#include <cstdint>
#include <filesystem>
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
  // The record with the highest serial for (repo, tag) signed by any of `key_ids`, under any hub
  // id: the hub id is the signer's to choose, so the same key's older statement under another one
  // must not start a fresh count. Other keys' records (another build tree's default hub, another
  // publisher) are not compared.
  std::optional<SerialRecord> read_highest(const std::string& repo, const std::string& tag,
                                           const std::vector<std::string>& key_ids) const;
  // Replaces the record atomically.
  void write(const SerialRecord& record);
  // Under a lock shared by every process using this cache: writes the record only when none
  // exists or its serial is greater than the stored one, so concurrent verifiers never move a
  // serial backwards. Returns whether it wrote.
  bool advance(const SerialRecord& record);

  std::filesystem::path path_for(const std::string& hub_id, const std::string& repo,
                                 const std::string& tag) const;
  const std::filesystem::path& root() const { return root_; }

 private:
  std::filesystem::path root_;
};

}  // namespace kh::trust
