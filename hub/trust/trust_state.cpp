#include "hub/trust/trust_state.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "hub/base/error.h"
#include "hub/base/fs.h"
#include "hub/base/log.h"
#include "hub/oci/ref.h"
#include "hub/trust/signature.h"

namespace kh::trust {

namespace {

namespace stdfs = std::filesystem;

constexpr uint64_t kMaxRecordBytes = 4096;

}  // namespace

TrustState::TrustState(stdfs::path cache_root) : root_(std::move(cache_root)) {}

stdfs::path TrustState::path_for(const std::string& hub_id, const std::string& repo,
                                 const std::string& tag) const {
  // Each part is validated rather than encoded: valid hub ids, repository components and
  // tags can never be "", "." or "..", nor hold a '/' other than the repo's separators, so the
  // path cannot leave trust/ and no two keys share a file.
  if (!is_valid_hub_id(hub_id)) {
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("invalid hub id '{}' for the trust state: use [A-Za-z0-9._-] (1..128 "
                            "characters, no leading '.')",
                            hub_id.substr(0, 200)));
  }
  if (repo.find('/') == std::string::npos || !is_valid_repo_name(repo)) {
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("invalid repository '{}' for the trust state: expected org/name",
                            repo.substr(0, 200)));
  }
  if (!is_valid_tag(tag)) {
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("invalid tag '{}' for the trust state", tag.substr(0, 200)));
  }
  return root_ / hub_id / repo / (tag + ".json");
}

std::optional<SerialRecord> TrustState::read_highest(
    const std::string& repo, const std::string& tag,
    const std::vector<std::string>& key_ids) const {
  auto shares_a_key = [&](const SerialRecord& r) {
    return std::any_of(r.key_ids.begin(), r.key_ids.end(), [&](const std::string& k) {
      return std::find(key_ids.begin(), key_ids.end(), k) != key_ids.end();
    });
  };
  std::optional<SerialRecord> best;
  std::error_code ec;
  for (auto it = stdfs::directory_iterator(root_, ec); !ec && it != stdfs::directory_iterator();
       it.increment(ec)) {
    const std::string hub_id = it->path().filename().string();
    if (!is_valid_hub_id(hub_id)) continue;  // not a record directory: nothing to read
    auto r = read(hub_id, repo, tag);
    if (r && shares_a_key(*r) && (!best || r->serial > best->serial)) best = std::move(r);
  }
  return best;
}

std::optional<SerialRecord> TrustState::read(const std::string& hub_id, const std::string& repo,
                                             const std::string& tag) const {
  stdfs::path p = path_for(hub_id, repo, tag);
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
    // otherwise lend its serial to another tag.
    if (r.hub_id != hub_id || r.repo != repo || r.tag != tag) {
      warn(fmt::format("it describes {} {}@{}", r.hub_id, r.repo, r.tag));
      return std::nullopt;
    }
    return r;
  } catch (const std::exception& e) {
    warn(e.what());
    return std::nullopt;
  }
}

void TrustState::write(const SerialRecord& r) {
  stdfs::path p = path_for(r.hub_id, r.repo, r.tag);
  nlohmann::json j{{"hub_id", r.hub_id},   {"repo", r.repo},         {"tag", r.tag},
                   {"serial", r.serial},   {"index", r.index.str()}, {"expires", r.expires},
                   {"seen_at", r.seen_at}, {"key_id", r.key_id},     {"key_ids", r.key_ids}};
  Digest::parse(r.index.str());  // never persist a record we could not read back
  fs::write_file_atomic(p, j.dump() + "\n", 0644);
}

bool TrustState::advance(const SerialRecord& r) {
  path_for(r.hub_id, r.repo, r.tag);  // validate before taking the lock
  // One lock for all records: the critical section is one small read and write.
  fs::FileLock lock = fs::FileLock::acquire(root_ / ".lock");
  auto current = read(r.hub_id, r.repo, r.tag);
  if (current && current->serial >= r.serial) return false;
  write(r);
  return true;
}

}  // namespace kh::trust
