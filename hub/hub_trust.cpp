// Hub's side of trust: where signatures come from (the store's copy, the hub's referrers or
// sidecar), the one decision before anything is loaded, and signing an index on a hub.
#include <fmt/format.h>

#include <algorithm>

#include "hub/base/clock.h"
#include "hub/base/error.h"
#include "hub/base/guarded_root.h"
#include "hub/data_dir.h"
#include "hub/hub.h"

namespace kh {

namespace {

// Adds every envelope of `from` that set.add accepts. An envelope older than one already held
// for the same (hub, repo, tag, key) is dropped: the newer one supersedes it.
void merge_into(trust::SignatureSet& set, const trust::SignatureSet& from) {
  for (const auto& e : from.envelopes) {
    try {
      set.add(e);
    } catch (const Error&) {
    }
  }
}

trust::SignatureSet cached_signatures(const Store& store, const Digest& index) {
  auto bytes = store.read_signatures(index);
  if (!bytes) return {};
  try {
    return trust::SignatureSet::parse(*bytes, (store.root() / "signatures").string());
  } catch (const Error&) {
    return {};  // a damaged copy verifies nothing; online, the hub's copy replaces it
  }
}

}  // namespace

std::filesystem::path default_hub_key_dir() {
  return data_dir() / "default-hub-key";
}

trust::TrustStore default_trust_store() {
  trust::TrustStore store = trust::TrustStore::open(trust::TrustStore::default_dir());
  // No data directory: no built-in key (and no default hub: default_hub_address says so).
  const DataDirLookup data = find_data_dir();
  if (!data.dir) return store;
  auto pub = *data.dir / "default-hub-key" / "signing.pub";
  std::error_code ec;
  if (std::filesystem::is_regular_file(pub, ec))
    store.add_builtin(trust::PublicKey::load(pub), {"kernel-hub/*"});
  return store;
}

std::string default_hub_statement_id(const trust::PublicKey& key) {
  return fmt::format("{}-{}", kDefaultHubId, key.key_id().substr(0, 16));
}

std::string Hub::default_hub_id() const {
  std::string id = address_.id();
  std::replace(id.begin(), id.end(), '/', '_');
  while (!id.empty() && id.front() == '.') id.erase(id.begin());
  if (id.size() > 128) id.resize(128);
  return id.empty() ? "hub" : id;
}

trust::SignatureSet Hub::signatures(const std::string& repo, const Digest& index, bool ask_hub) {
  trust::SignatureSet set = cached_signatures(store_, index);
  if (!ask_hub || options_.offline) return set;
  oci::Descriptor subject;
  subject.digest = index;
  trust::SignatureSet remote = source().get_signatures(repo, subject);
  trust::SignatureSet merged = remote;
  merge_into(merged, set);
  // Written even when unchanged: its time says when the hub was last asked (refresh_signatures).
  store_.write_signatures(index, merged.serialize());
  return merged;
}

trust::SignatureSet Hub::refresh_signatures(const Ref& ref, const Digest& index, int64_t since_ns) {
  // A set written at or after `since_ns` is the hub's answer of then, by this or another process
  // sharing the cache: a fleet of processes pulling one package at once asks once. (A file time
  // can lag the clock by a tick, never lead it: the error is an extra request, never a stale set.)
  auto fresh = [&] {
    auto at = store_.signatures_written_at_ns(index);
    return at && *at >= since_ns && *at <= unix_now_ns() + 1000000000;
  };
  if (fresh()) return cached_signatures(store_, index);
  fs::FileLock held = store_.lock("signatures-" + index.hex,
                                  wait_for_other(ref, "the signatures of " + index.str()));
  if (fresh()) return cached_signatures(store_, index);  // fetched by the process we waited for
  return signatures(ref.repo, index, true);
}

trust::TrustDecision Hub::check_trust(const Ref& ref, const Digest& index,
                                      const trust::TrustStore& keys) {
  const std::string tag = ref.digest ? "" : ref.tag;
  // Keyed by what the store holds, not where it lives: another store at the same address (a
  // store rebuilt after `trust rm`) must not be answered with this one's decision.
  std::string memo_key = fmt::format("{}|{}|{}", index.str(), ref.repo, tag);
  for (const auto& k : keys.list())
    memo_key += fmt::format("|{}{}={}", k.builtin ? "*" : "", k.key_id(), k.repos_text());
  if (auto it = trust_memo_.find(memo_key); it != trust_memo_.end()) return it->second;

  trust::TrustRequest request;
  request.ref_text = ref.str();
  request.repo = ref.repo;
  request.tag = tag;
  request.index = index;
  request.offline = options_.offline;
  // Rollback state lives with the trust store (private to this user); a store with no
  // directory (built-in keys only) keeps it in the cache as before.
  std::filesystem::path state_dir = keys.state_dir();
  if (state_dir.empty()) {
    state_dir = store_.root() / "trust";
  } else {
    fs::guard_root(keys.dir(), fs::Sharing::kPrivate, "trust store");
  }
  trust::TrustState state(state_dir);
  // Cached signatures first: a warm load asks nothing of the hub. Online, when they do not
  // verify (none yet, expired, re-signed since), the hub's current set decides.
  trust::TrustPolicy strict = options_.trust;
  strict.allow_unsigned = false;
  trust::TrustDecision decision;
  try {
    decision = trust::verify_trust(request, cached_signatures(store_, index), keys, state, strict,
                                   unix_now());
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::kRefused) throw;
    if (options_.offline && !options_.trust.allow_unsigned) throw;
    // Asked since this command started (here, or by another process sharing the cache): that
    // answer is as current as asking again.
    trust::SignatureSet current = options_.offline ? signatures(ref.repo, index, false)
                                                   : refresh_signatures(ref, index, started_at_ns_);
    decision = trust::verify_trust(request, current, keys, state, options_.trust, unix_now());
  }
  trust_memo_.emplace(memo_key, decision);
  return decision;
}

SignReport Hub::sign(const Ref& ref, const trust::PrivateKey& key, const SignOptions& options) {
  if (options_.offline)
    throw Error(ErrorKind::kOffline, "sign " + ref.str() + " needs the hub; offline mode is on");
  if (ref.digest)
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("sign {}: name a tag (org/name@TAG): a statement binds repo, tag and "
                            "index digest",
                            ref.str()));
  FetchedManifest index = source().get_manifest(ref.repo, ref.tag);
  oci::Descriptor subject;
  subject.media_type =
      index.media_type.empty() ? oci::peek_media_type(index.bytes) : index.media_type;
  subject.digest = index.digest;
  subject.size = static_cast<int64_t>(index.bytes.size());

  const int64_t now = unix_now();
  SignReport report;
  trust::Statement& st = report.statement;
  st.hub_id = options.hub_id.empty() ? default_hub_id() : options.hub_id;
  st.repo = ref.repo;
  st.tag = ref.tag;
  st.index = index.digest;
  st.expires = options.expires ? options.expires : now + SignOptions::kDefaultValidity;
  st.serial = options.serial
                  ? options.serial
                  : trust::next_serial(source().get_signatures(ref.repo, subject), st, now);
  trust::Envelope envelope = trust::sign_statement(st, key);
  source().push_signature(ref.repo, subject, envelope);
  report.key_id = key.public_key().key_id();
  return report;
}

}  // namespace kh
