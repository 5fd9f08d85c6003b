// A registry hub behind pull-through mirrors (registry_mirrors.h): reads go to each mirror in
// turn, then to the hub; writes go to the hub only.
//
// A mirror is passed over for one item (a manifest, a tag list, a blob) when it fails it in any
// way: no answer, an HTTP error (404 and 5xx included), refused credentials, or content that does
// not match its digest. It is passed over for the rest of the command (this Source) when it
// cannot be reached or refuses us (network and auth errors), so that a stopped mirror costs one
// failed connection, not one per request. Mirror requests are not retried (max_attempts 1): the
// hub is the retry.
//
// Verification is unchanged: manifests are checked by RegistrySource as from the hub, and every
// blob from a mirror is hashed here (VerifyingSink) before it counts as fetched, so that a bad
// mirror blob is dropped and fetched again from the hub instead of failing at the store's commit.
// The store's writer hashes the same bytes again: one extra hash, for mirror-served blobs only.
#include <fmt/format.h>

#include <atomic>
#include <mutex>
#include <set>

#include "hub/base/error.h"
#include "hub/base/log.h"
#include "hub/transport/source.h"
#include "hub/transport/verifying_sink.h"
#include "hub/trust/signature.h"

namespace kh {

namespace {

struct Mirror {
  std::string host;
  std::unique_ptr<Source> source;
  std::atomic<bool> down{false};
};

std::string mib(uint64_t bytes) {
  return fmt::format("{:.1f} MiB", static_cast<double>(bytes) / (1 << 20));
}

class MirroredSource : public Source {
 public:
  MirroredSource(std::unique_ptr<Source> hub, std::vector<std::unique_ptr<Mirror>> mirrors)
      : hub_(std::move(hub)), mirrors_(std::move(mirrors)) {}

  // The hub's: ref records, statements and rollback state never depend on which host served.
  const HubAddress& address() const override { return hub_->address(); }

  FetchedManifest get_manifest(const std::string& repo, const std::string& reference) override {
    return read<FetchedManifest>(
        repo, "manifest '" + reference + "' of " + repo,
        [&](Source& s) { return s.get_manifest(repo, reference); },
        [](const FetchedManifest&) { return true; });
  }

  std::vector<std::string> list_tags(const std::string& repo) override {
    return read<std::vector<std::string>>(
        repo, "the tags of " + repo, [&](Source& s) { return s.list_tags(repo); },
        [](const std::vector<std::string>&) { return true; });
  }

  // A mirror without signatures for the index (a copy that left them out) is passed over.
  trust::SignatureSet get_signatures(const std::string& repo,
                                     const oci::Descriptor& index) override {
    return read<trust::SignatureSet>(
        repo, "the signatures of " + repo + "@" + index.digest.str(),
        [&](Source& s) { return s.get_signatures(repo, index); },
        [](const trust::SignatureSet& set) { return !set.envelopes.empty(); });
  }

  void fetch_blobs(const std::string& repo, std::vector<BlobFetch>& blobs,
                   Progress* progress) override {
    std::vector<size_t> pending;
    for (size_t i = 0; i < blobs.size(); ++i) {
      blobs[i].ok = false;
      blobs[i].integrity = false;
      blobs[i].error.clear();
      pending.push_back(i);
    }
    for (auto& m : mirrors_) {
      if (pending.empty()) break;
      if (m->down) continue;
      pending = fetch_from_mirror(*m, repo, blobs, pending, progress);
    }
    if (pending.empty()) return;
    std::vector<BlobFetch> sub;
    uint64_t bytes = 0;
    for (size_t i : pending) {
      sub.push_back(BlobFetch{blobs[i].desc, blobs[i].sink, false, {}, false});
      bytes += static_cast<uint64_t>(blobs[i].desc.size);
    }
    hub_->fetch_blobs(repo, sub, progress);
    size_t served = 0;
    for (size_t k = 0; k < pending.size(); ++k) {
      BlobFetch& b = blobs[pending[k]];
      b.ok = sub[k].ok;
      b.error = std::move(sub[k].error);
      b.integrity = sub[k].integrity;
      served += b.ok ? 1 : 0;
    }
    if (served > 0)
      note(kLogInfo, fmt::format("{}: {} blob(s) ({}) from the hub {}", repo, served, mib(bytes),
                                 hub_->address().text));
  }

  bool has_blob(const std::string& repo, const oci::Descriptor& desc) override {
    return hub_->has_blob(repo, desc);  // asked before a push: the hub is what counts
  }
  void push_blob(const std::string& repo, const oci::Descriptor& desc,
                 const std::filesystem::path& file) override {
    hub_->push_blob(repo, desc, file);
  }
  void push_manifest(const std::string& repo, const std::string& reference, std::string_view bytes,
                     std::string_view media_type) override {
    hub_->push_manifest(repo, reference, bytes, media_type);
  }
  void push_signature(const std::string& repo, const oci::Descriptor& index,
                      const trust::Envelope& envelope) override {
    hub_->push_signature(repo, index, envelope);
  }

 private:
  // The first usable answer of the mirrors, else the hub's (whose errors are the caller's).
  template <typename T, typename Fetch, typename Usable>
  T read(const std::string& repo, const std::string& what, Fetch fetch, Usable usable) {
    for (auto& m : mirrors_) {
      if (m->down) continue;
      try {
        T got = fetch(*m->source);
        if (usable(got)) {
          served_once(repo, "mirror " + m->host);
          return got;
        }
        note(kLogInfo, fmt::format("{}: mirror {} has none; asking the hub {}", what, m->host,
                                   hub_->address().text));
      } catch (const Error& e) {
        if (e.kind() == ErrorKind::kOffline) throw;
        passed_over(*m, what, e);
      }
    }
    T got = fetch(*hub_);
    if (!mirrors_.empty()) served_once(repo, "the hub " + hub_->address().text);
    return got;
  }

  // Fetches blobs[pending] from one mirror, each verified here; returns those still to fetch
  // (their sinks restarted: nothing a mirror sent is kept unless it matched its digest).
  std::vector<size_t> fetch_from_mirror(Mirror& m, const std::string& repo,
                                        std::vector<BlobFetch>& blobs,
                                        const std::vector<size_t>& pending, Progress* progress) {
    std::vector<std::unique_ptr<VerifyingSink>> sinks;
    std::vector<BlobFetch> sub;
    for (size_t i : pending) {
      sinks.push_back(std::make_unique<VerifyingSink>(blobs[i].sink));
      sub.push_back(BlobFetch{blobs[i].desc, sinks.back().get(), false, {}, false});
    }
    try {
      m.source->fetch_blobs(repo, sub, progress);
    } catch (const Error& e) {
      if (e.kind() == ErrorKind::kOffline) throw;
      passed_over(m, "blobs of " + repo, e);
      for (size_t i : pending) blobs[i].sink->restart();
      return pending;
    }
    std::vector<size_t> left;
    size_t served = 0;
    uint64_t bytes = 0;
    for (size_t k = 0; k < pending.size(); ++k) {
      BlobFetch& b = blobs[pending[k]];
      if (sub[k].ok) {
        const Digest got = sinks[k]->digest();
        if (got == b.desc.digest) {
          b.ok = true;
          ++served;
          bytes += static_cast<uint64_t>(b.desc.size);
          continue;
        }
        note(kLogWarn,
             fmt::format("mirror {} served blob {} of {} with other bytes (they hash to {}); "
                         "nothing of it was kept, fetching it from the hub {} (tell the mirror's "
                         "operator)",
                         m.host, b.desc.digest.str(), repo, got.str(), hub_->address().text));
      } else {
        note(sub[k].integrity ? kLogWarn : kLogInfo,
             fmt::format("mirror {} did not serve blob {} of {} ({}); fetching it from the hub {}",
                         m.host, b.desc.digest.str(), repo, sub[k].error, hub_->address().text));
      }
      b.sink->restart();
      left.push_back(pending[k]);
    }
    if (served > 0) {
      note(kLogInfo,
           fmt::format("{}: {} blob(s) ({}) from mirror {}", repo, served, mib(bytes), m.host));
    } else if (!left.empty()) {
      // Nothing at all (a mirror that went away after the manifests, or lacks everything):
      // not worth asking again in this command.
      mark_down(m, "it served none of the " + std::to_string(left.size()) + " blob(s) asked");
    }
    return left;
  }

  void passed_over(Mirror& m, const std::string& what, const Error& e) {
    const ErrorKind kind = e.kind();
    if (kind == ErrorKind::kNetwork || kind == ErrorKind::kAuth ||
        kind == ErrorKind::kUnsupported) {
      mark_down(m, e.what());
      return;
    }
    note(kind == ErrorKind::kNotFound ? kLogInfo : kLogWarn,
         fmt::format("{}: mirror {} failed ({}); asking the hub {}", what, m.host, e.what(),
                     hub_->address().text));
  }

  void mark_down(Mirror& m, const std::string& why) {
    if (m.down.exchange(true)) return;
    note(kLogWarn, fmt::format("mirror {} of {} is not used for the rest of this command: {}; "
                               "fetching from the hub directly (check the mirror, or remove it "
                               "from KERNEL_HUB_MIRRORS)",
                               m.host, hub_->address().text, why));
  }

  void served_once(const std::string& repo, const std::string& by) {
    {
      std::lock_guard lock(mu_);
      if (!served_logged_.insert(repo + "|" + by).second) return;
    }
    note(kLogInfo, fmt::format("{}: documents from {}", repo, by));
  }

  void note(int level, const std::string& line) { log_line(level, line); }

  std::unique_ptr<Source> hub_;
  std::vector<std::unique_ptr<Mirror>> mirrors_;
  std::mutex mu_;
  std::set<std::string> served_logged_;
};

}  // namespace

std::unique_ptr<Source> open_mirrored_registry_source(const HubAddress& address,
                                                      const SourceOptions& options) {
  std::unique_ptr<Source> hub = open_registry_source(address, options);
  const std::vector<RegistryMirror> mirrors = mirrors_for(options.mirrors, address.host);
  if (mirrors.empty()) return hub;
  std::vector<std::unique_ptr<Mirror>> opened;
  for (const RegistryMirror& m : mirrors) {
    const bool plain = m.scheme.empty() ? address.plain_http : m.scheme == "http";
    HubAddress at =
        HubAddress::parse("oci://" + m.host + (address.ns.empty() ? "" : "/" + address.ns), plain);
    SourceOptions o = options;
    o.mirrors.clear();
    // Credentials given in the API are the hub's; the mirror gets its own host's (credentials.h).
    o.username.clear();
    o.password.clear();
    o.http.allow_plain_http = plain;
    o.http.max_attempts = 1;  // the hub is the retry
    auto mirror = std::make_unique<Mirror>();
    mirror->host = m.host;
    mirror->source = open_registry_source(at, o);
    opened.push_back(std::move(mirror));
  }
  return std::make_unique<MirroredSource>(std::move(hub), std::move(opened));
}

}  // namespace kh
