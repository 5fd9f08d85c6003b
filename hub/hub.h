// The hub as the rest of the project sees it: a Source (where packages come from) joined to
// the Store (the local cache), with the offline policy. Everything here works without a GPU.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "hub/oci/address.h"
#include "hub/oci/graph.h"
#include "hub/oci/oci.h"
#include "hub/oci/ref.h"
#include "hub/store/store.h"
#include "hub/transport/source.h"
#include "hub/trust/trust_verify.h"

namespace kh {

struct HubOptions {
  bool offline = false;  // no network at all; tags resolve from ref records
  bool progress = true;  // progress bar on a TTY (quiet turns it off)
  // Version channels online: a tag whose ref record in the cache is younger than this many
  // seconds resolves from the record without asking the hub (warm loads make no request);
  // older records are re-resolved. 0: always ask the hub. Digests never ask; offline never.
  int64_t ref_ttl_s = 0;
  static constexpr int64_t kDefaultRefTtl = 600;
  // Pull refreshes an index's signatures from the hub at most once in this many seconds (or
  // the ref TTL, when longer) per cache, whichever process asked: a fleet pulling at once asks
  // once.
  static constexpr int64_t kSignaturesReuseS = 60;
  SourceOptions source;
  // Who may sign what, and the unsigned / expiry rules (KERNEL_HUB_ALLOW_UNSIGNED,
  // KERNEL_HUB_OFFLINE_GRACE).
  trust::TrustPolicy trust;
  // Bounds on the graph pull and push walk (nesting, fan-out, nodes, bytes; README "Graph
  // limits"): a hub serving more is refused (kRefused).
  oci::GraphLimits graph_limits;
  // The bytes all the package layers one Hub (one command) unpacks may expand to, over the
  // per-archive limits (KERNEL_HUB_UNPACK_BUDGET): over it, kRefused naming the layer.
  uint64_t unpack_budget = UnpackBudget::kDefault;

  // Offline from KERNEL_HUB_OFFLINE=1, plain HTTP from KERNEL_HUB_PLAIN_HTTP=1, the ref TTL from
  // KERNEL_HUB_REF_TTL (seconds, default kDefaultRefTtl), the unpack budget from
  // KERNEL_HUB_UNPACK_BUDGET (bytes), registry mirrors from KERNEL_HUB_MIRRORS
  // (hub/transport/registry_mirrors.h), plus the http::Options environment overrides (the
  // command deadline, KERNEL_HUB_COMMAND_TIMEOUT_S, among them).
  static HubOptions from_env();
};

struct PullReport {
  Ref ref;
  Digest digest;  // what the ref resolved to (index or manifest)
  std::string media_type;
  size_t manifests = 0;         // variant manifests
  size_t blobs = 0;             // distinct config/layer blobs referenced
  size_t blobs_downloaded = 0;  // fetched by this process
  uint64_t bytes_downloaded = 0;
  uint64_t total_bytes = 0;   // size of every referenced blob
  bool from_cache = false;    // resolved without the network (offline)
  bool kernel_index = false;  // an image index of kernel variants (signatures apply)
};

struct VariantInfo {
  oci::Descriptor descriptor;  // the index entry (platform, annotations)
  oci::Manifest manifest;
};

struct RefInfo {
  Ref ref;
  Digest digest;
  std::string media_type;
  oci::Annotations annotations;
  std::string artifact_type;
  std::vector<VariantInfo> variants;  // one per index entry; a single manifest gives one
  bool from_cache = false;
  int64_t resolved_at = 0;
};

struct PushReport {
  Ref ref;
  Digest digest;
  size_t blobs_uploaded = 0;
  size_t blobs_skipped = 0;  // already on the hub
  uint64_t bytes_uploaded = 0;
  size_t signatures_pushed = 0;   // envelopes of the layout for this repo, attached on the hub
  size_t signatures_skipped = 0;  // envelopes signed for another repo (they could not verify)
};

struct SignOptions {
  std::string hub_id;   // the statement's hub id; empty: derived from the hub address
  int64_t expires = 0;  // unix seconds; 0: now + kDefaultValidity
  uint64_t serial = 0;  // 0: max(now in seconds, the highest serial on the hub + 1)
  static constexpr int64_t kDefaultValidity = 90 * 24 * 3600;
};

struct SignReport {
  trust::Statement statement;
  std::string key_id;
};

// One Hub serves one command (a CLI command, one kernelize call): its command deadline
// (http::Options::command_timeout_s) starts when it is made, and its unpack budget covers every
// layer it unpacks.
class Hub {
 public:
  Hub(HubAddress address, Store& store, HubOptions options);
  ~Hub();

  const HubAddress& address() const { return address_; }
  Store& store() { return store_; }
  const HubOptions& options() const { return options_; }

  // Fetches the index, every variant manifest and every blob into the store, verifies them
  // (each by its digest), and records the ref. Unpacks nothing: a package is unpacked (unpack())
  // when it is about to be used, after its index passed the trust check. Several processes
  // pulling the same ref into one store download each blob once. Offline: resolves from the ref
  // record and checks that everything is cached; a miss throws kOffline naming the command to run.
  PullReport pull(const Ref& ref);

  // The unpacked tree of a cached package layer (Store::unpack), made now if needed, within this
  // Hub's unpack budget (HubOptions::unpack_budget). Call it only for a layer whose index passed
  // check_trust: the trust check comes before any expansion a hub's bytes can cause.
  std::filesystem::path unpack(const Digest& layer);

  // The index and its variant manifests (fetched into the store, no blobs). A tag resolved on
  // the hub is recorded as pull records it, so that the ref TTL and later offline runs (kernelize
  // resolves through info) find it.
  RefInfo info(const Ref& ref);

  // Uploads the image index tagged ref.tag in the OCI layout at layout_dir (or its only one)
  // and everything it references to ref on this hub; the tag moves last.
  PushReport push(const std::filesystem::path& layout_dir, const Ref& ref);

  std::vector<std::string> tags(const std::string& repo);

  // Signature envelopes of an index: the store's copy, merged with (and refreshed from) the
  // hub's when ask_hub is set and the hub is online.
  trust::SignatureSet signatures(const std::string& repo, const Digest& index, bool ask_hub);
  // The trust decision for `ref` resolved to `index` (REFERENCE 4.3) with these keys: cached
  // signatures first; online, when they do not verify, the hub's current ones. Throws kRefused
  // naming the ref and the failed check; with options().trust.allow_unsigned an unsigned ref is
  // allowed with a warning. Decisions are memoized per (index, tag, keys) in this Hub.
  trust::TrustDecision check_trust(const Ref& ref, const Digest& index,
                                   const trust::TrustStore& keys);
  // Signs the index ref's tag names on this hub and attaches the envelope there.
  SignReport sign(const Ref& ref, const trust::PrivateKey& key, const SignOptions& options);
  // The hub id statements signed for this hub carry by default: a stable name from the
  // address ([A-Za-z0-9._-]).
  std::string default_hub_id() const;

 private:
  Source& source();
  Digest resolve(const Ref& ref, bool* from_cache, int64_t* resolved_at);
  // Writes the ref record for ref resolved on the hub. The hub facade is the only writer of ref
  // records (hub/base/cache_layout.h).
  void record_ref(const Ref& ref, const Digest& digest, int64_t resolved_at);
  std::string ensure_manifest(const Ref& ref, const oci::Descriptor& desc);
  void prefetch_manifests(const Ref& ref, const std::vector<oci::Descriptor>& manifests);
  void fetch_missing(const Ref& ref, const std::vector<oci::Descriptor>& blobs, PullReport& report);
  // How this command waits for another process fetching `what` (a digest) into the shared
  // cache: until the command deadline, saying so at info level.
  fs::LockWait wait_for_other(const Ref& ref, const std::string& what) const;
  // An index's signatures as the hub answered at or after `since_ns` (unix nanoseconds): the
  // stored set when it was written since then, else the hub's (merged and stored). Single flight
  // across the processes sharing the cache (locks/signatures-<hex>.lock): a waiter uses what
  // the process it waited for stored.
  trust::SignatureSet refresh_signatures(const Ref& ref, const Digest& index, int64_t since_ns);

  HubAddress address_;
  Store& store_;
  HubOptions options_;
  std::unique_ptr<Source> source_;
  std::map<std::string, trust::TrustDecision> trust_memo_;
  UnpackBudget unpack_budget_;
  int64_t started_at_ns_ = 0;  // unix nanoseconds: when this command's hub work began
};

// The keys kernelize and pull check against: the user's trust store (TrustStore::default_dir())
// plus, when this build made one, the embedded default hub's public key, built in and trusted for
// kernel-hub/* (its private half signed the default hub at build time and never leaves the build
// tree).
trust::TrustStore default_trust_store();
// Where that key pair is: <data dir>/default-hub-key (hub/data_dir.h): signing.pem (0600, in the
// build tree only) and signing.pub. Throws kNotFound when there is no data directory.
std::filesystem::path default_hub_key_dir();
// The hub id the embedded default hub's statements carry: kDefaultHubId-<first 16 hex digits of
// its key id>. Every build (and install) makes its own key pair, so each default hub is its own
// hub to the trust state: rollback records of one build tree's default hub never refuse another's
// (older) one on the same machine.
inline constexpr std::string_view kDefaultHubId = "kernel-hub-default";
std::string default_hub_statement_id(const trust::PublicKey& key);

// KERNEL_HUB_ENDPOINT when set, else the embedded default hub (a layout directory).
HubAddress default_hub_address(const Store& store, bool plain_http);

}  // namespace kh
