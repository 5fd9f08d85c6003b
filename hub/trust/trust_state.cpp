#include "hub/trust/trust_state.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>

#include "hub/base/error.h"
#include "hub/base/fs.h"
#include "hub/base/log.h"
#include "hub/oci/ref.h"
#include "hub/trust/signature.h"

namespace kh::trust {

namespace {

namespace stdfs = std::filesystem;

// A record names its signers: room for some hundred trusted co-signers.
constexpr uint64_t kMaxRecordBytes = 64 << 10;

}  // namespace

TrustState::TrustState(stdfs::path cache_root) : root_(std::move(cache_root)) {}

namespace {

// Each part is validated rather than encoded: valid hub ids, key ids, repository components and
// tags can never be "", "." or "..", nor hold a '/' other than the repo's separators, so a path
// cannot leave the state directory and no two records share a file.
void check_repo_tag(const std::string& repo, const std::string& tag) {
  if (repo.find('/') == std::string::npos || !is_valid_repo_name(repo)) {
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("invalid repository '{}' for the trust state: expected org/name",
                            repo.substr(0, 200)));
  }
  if (!is_valid_tag(tag)) {
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("invalid tag '{}' for the trust state", tag.substr(0, 200)));
  }
}

// Records per key live under a name no hub id can take (hub ids take no leading '.').
constexpr const char* kKeysDir = ".keys";

}  // namespace

stdfs::path TrustState::path_for(const std::string& hub_id, const std::string& repo,
                                 const std::string& tag) const {
  if (!is_valid_hub_id(hub_id)) {
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("invalid hub id '{}' for the trust state: use [A-Za-z0-9._-] (1..128 "
                            "characters, no leading '.')",
                            hub_id.substr(0, 200)));
  }
  check_repo_tag(repo, tag);
  return root_ / hub_id / repo / (tag + ".json");
}

stdfs::path TrustState::key_path_for(const std::string& key_id, const std::string& repo,
                                     const std::string& tag) const {
  if (!is_key_id(key_id)) {
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("invalid key id '{}' for the trust state: expected 64 hex digits",
                            key_id.substr(0, 80)));
  }
  check_repo_tag(repo, tag);
  return root_ / kKeysDir / key_id / repo / (tag + ".json");
}

std::optional<SerialRecord> TrustState::read_highest(
    const std::string& repo, const std::string& tag,
    const std::vector<std::string>& key_ids) const {
  std::optional<SerialRecord> best;
  auto consider = [&](std::optional<SerialRecord> r) {
    if (r && (!best || r->serial > best->serial)) best = std::move(r);
  };
  for (const auto& k : key_ids) {
    if (is_key_id(k)) consider(read_key(k, repo, tag));
  }
  // Records per hub id that name one of the keys: those written before the per-key records were
  // kept (and the per-key records' source of truth is the same verification, so they agree).
  auto shares_a_key = [&](const SerialRecord& r) {
    return std::any_of(r.key_ids.begin(), r.key_ids.end(), [&](const std::string& k) {
      return std::find(key_ids.begin(), key_ids.end(), k) != key_ids.end();
    });
  };
  std::error_code ec;
  for (auto it = stdfs::directory_iterator(root_, ec); !ec && it != stdfs::directory_iterator();
       it.increment(ec)) {
    const std::string hub_id = it->path().filename().string();
    if (!is_valid_hub_id(hub_id)) continue;  // not a record directory: nothing to read
    auto r = read(hub_id, repo, tag);
    if (r && shares_a_key(*r)) consider(std::move(r));
  }
  return best;
}

std::optional<SerialRecord> TrustState::read(const std::string& hub_id, const std::string& repo,
                                             const std::string& tag) const {
  return read_at(path_for(hub_id, repo, tag), repo, tag, [&](const SerialRecord& r) {
    return r.hub_id == hub_id ? "" : fmt::format("it describes hub id {}", r.hub_id);
  });
}

std::optional<SerialRecord> TrustState::read_key(const std::string& key_id, const std::string& repo,
                                                 const std::string& tag) const {
  return read_at(key_path_for(key_id, repo, tag), repo, tag, [&](const SerialRecord& r) {
    return r.key_ids == std::vector<std::string>{key_id}
               ? ""
               : fmt::format("it describes key {}", r.key_id.substr(0, 80));
  });
}

std::optional<SerialRecord> TrustState::read_at(
    const stdfs::path& p, const std::string& repo, const std::string& tag,
    const std::function<std::string(const SerialRecord&)>& disagreement) const {
  std::optional<std::string> text;
  auto warn = [&](const std::string& why) {
    log_warning(fmt::format(
        "ignoring damaged trust state {} ({}); the next verified signature for {}@{} rewrites it",
        p.string(), why, repo, tag));
  };
  try {
    text = fs::read_file_if_exists(p, kMaxRecordBytes);
  } catch (const Error& e) {
    warn(e.what());
    return std::nullopt;
  }
  if (!text) return std::nullopt;
  try {
    auto j = nlohmann::json::parse(*text);
    SerialRecord r;
    r.hub_id = j.at("hub_id").get<std::string>();
    r.repo = j.at("repo").get<std::string>();
    r.tag = j.at("tag").get<std::string>();
    r.serial = j.at("serial").get<uint64_t>();
    r.index = Digest::parse(j.at("index").get<std::string>());
    r.expires = j.at("expires").get<int64_t>();
    r.seen_at = j.at("seen_at").get<int64_t>();
    if (auto k = j.find("key_id"); k != j.end()) r.key_id = k->get<std::string>();
    if (auto k = j.find("key_ids"); k != j.end()) {
      r.key_ids = k->get<std::vector<std::string>>();
    } else if (!r.key_id.empty()) {
      r.key_ids = {r.key_id};
    }
    // The record's own fields must agree with its path: a file copied elsewhere would
    // otherwise lend its serial to another tag, hub id or key.
    std::string differs = r.repo != repo || r.tag != tag
                              ? fmt::format("it describes {}@{}", r.repo, r.tag)
                              : disagreement(r);
    if (!differs.empty()) {
      warn(differs);
      return std::nullopt;
    }
    return r;
  } catch (const std::exception& e) {
    warn(e.what());
    return std::nullopt;
  }
}

void TrustState::write_at(const stdfs::path& p, const SerialRecord& r) {
  nlohmann::json j{{"hub_id", r.hub_id},   {"repo", r.repo},         {"tag", r.tag},
                   {"serial", r.serial},   {"index", r.index.str()}, {"expires", r.expires},
                   {"seen_at", r.seen_at}, {"key_id", r.key_id},     {"key_ids", r.key_ids}};
  Digest::parse(r.index.str());  // never persist a record we could not read back
  std::string text = j.dump() + "\n";
  if (text.size() > kMaxRecordBytes)
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("trust state record for {}@{} would be {} bytes, more than the {} a "
                            "record may hold",
                            r.repo, r.tag, text.size(), kMaxRecordBytes));
  fs::write_file_atomic(p, text, 0644);
}

void TrustState::write(const SerialRecord& r) {
  write_at(path_for(r.hub_id, r.repo, r.tag), r);
}

bool TrustState::advance(const SerialRecord& r) {
  path_for(r.hub_id, r.repo, r.tag);  // validate before taking the lock
  for (const auto& k : r.key_ids) key_path_for(k, r.repo, r.tag);
  // One lock for all records: the critical section is a few small reads and writes.
  fs::FileLock lock = fs::FileLock::acquire(root_ / ".lock");
  // Each signer's own record first: every key that vouched for this index has seen this serial,
  // whichever hub id's record holds it and whatever other keys sign later.
  for (const auto& k : r.key_ids) {
    auto mine = read_key(k, r.repo, r.tag);
    if (mine && mine->serial >= r.serial) continue;
    SerialRecord kr = r;
    kr.key_id = k;
    kr.key_ids = {k};
    write_at(key_path_for(k, r.repo, r.tag), kr);
  }
  auto current = read(r.hub_id, r.repo, r.tag);
  if (current && current->serial >= r.serial) return false;
  write(r);
  return true;
}

}  // namespace kh::trust
