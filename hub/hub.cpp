#include "hub/hub.h"
#include "hub/base/clock.h"

#include <fmt/format.h>

#include <atomic>
#include <cstdlib>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <thread>

#include "hub/base/env.h"
#include "hub/base/error.h"
#include "hub/base/log.h"
#include "hub/data_dir.h"

namespace kh {

namespace {

// Tag under which a pull is recorded: the tag, or the digest for pinned refs.
std::string record_name(const Ref& ref) {
  return ref.digest ? ref.digest->str() : ref.tag;
}

// Runs fn(0..n-1) on up to max_threads threads. fn must not throw.
void run_parallel(size_t n, size_t max_threads, const std::function<void(size_t)>& fn) {
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t i = next++; i < n; i = next++) fn(i);
  };
  std::vector<std::thread> threads;
  for (size_t t = 1; t < std::min(n, max_threads); ++t) threads.emplace_back(worker);
  worker();
  for (auto& t : threads) t.join();
}

[[noreturn]] void offline_miss(const Ref& ref, const std::string& what) {
  throw Error(ErrorKind::kOffline,
              fmt::format("{}: {} is not in the cache and offline mode is on; run `kernel-hub "
                          "pull {}` while online (or `kernel-hub import DIR` from a mirror)",
                          ref.str(), what, ref.str()));
}

}  // namespace

HubOptions HubOptions::from_env() {
  HubOptions o;
  o.offline = env_flag("KERNEL_HUB_OFFLINE");
  o.source.http = http::Options::from_env();
  o.source.http.offline = o.offline;
  o.source.http.allow_plain_http = env_flag("KERNEL_HUB_PLAIN_HTTP");
  o.source.mirrors = registry_mirrors_from_env();
  o.ref_ttl_s = HubOptions::kDefaultRefTtl;
  o.trust = trust::TrustPolicy::from_env();
  o.unpack_budget = UnpackBudget::limit_from_env();
  if (const char* ttl = std::getenv("KERNEL_HUB_REF_TTL"); ttl && *ttl) {
    char* end = nullptr;
    long long v = std::strtoll(ttl, &end, 10);
    if (*end != '\0' || v < 0) {
      throw Error(ErrorKind::kInvalidInput,
                  fmt::format("KERNEL_HUB_REF_TTL='{}' is not a number of seconds (0 = always ask "
                              "the hub)",
                              ttl));
    }
    o.ref_ttl_s = v;
  }
  return o;
}

HubAddress default_hub_address(const Store& /*store*/, bool plain_http) {
  const char* endpoint = std::getenv("KERNEL_HUB_ENDPOINT");
  if (endpoint && *endpoint) return HubAddress::parse(endpoint, plain_http);
  // The embedded default hub: the layout hub packed at build time, in the data directory of the
  // install or build tree this code runs from (hub/data_dir.h). None is an error, never an
  // empty hub: a moved binary that silently found nothing would look like a hub without kernels.
  const std::filesystem::path embedded = data_dir() / "default-hub";
  std::error_code ec;
  if (!std::filesystem::is_directory(embedded, ec)) {
    throw Error(ErrorKind::kNotFound,
                fmt::format("the embedded default hub {} is missing; reinstall kernel-hub (or "
                            "build the default_hub target), or set KERNEL_HUB_ENDPOINT to a hub",
                            embedded.string()));
  }
  return HubAddress::parse(embedded.string(), plain_http);
}

Hub::Hub(HubAddress address, Store& store, HubOptions options)
    : address_(std::move(address)), store_(store), options_(std::move(options)) {
  options_.source.http.offline = options_.offline;
  if (address_.kind == HubAddress::Kind::kRegistry && address_.plain_http) {
    options_.source.http.allow_plain_http = true;
  }
  if (address_.kind == HubAddress::Kind::kHttpLayout && address_.base_url.starts_with("http://")) {
    options_.source.http.allow_plain_http = true;
  }
  options_.source.http.progress = options_.progress;
  // This command's hub work is timed from here, whenever the source is opened.
  options_.source.http.start_command_clock();
  started_at_ns_ = unix_now_ns();
  unpack_budget_.limit = options_.unpack_budget;
}

Hub::~Hub() = default;

Source& Hub::source() {
  if (!source_) source_ = open_source(address_, options_.source);
  return *source_;
}

Digest Hub::resolve(const Ref& ref, bool* from_cache, int64_t* resolved_at) {
  if (options_.offline) {
    *from_cache = true;
    if (ref.digest) {
      if (!store_.has_blob(*ref.digest)) offline_miss(ref, "its index " + ref.digest->str());
      *resolved_at = 0;
      return *ref.digest;
    }
    auto rec = store_.read_ref(address_.id(), ref.repo, ref.tag);
    if (!rec) offline_miss(ref, "the tag '" + ref.tag + "' from " + address_.text);
    *resolved_at = rec->resolved_at;
    return rec->digest;
  }
  if (!ref.digest && options_.ref_ttl_s > 0) {
    // A fresh enough ref record answers without a request (version channels move slowly).
    auto rec = store_.read_ref(address_.id(), ref.repo, ref.tag);
    int64_t now = unix_now();
    if (rec && rec->resolved_at <= now && now - rec->resolved_at < options_.ref_ttl_s &&
        store_.has_blob(rec->digest)) {
      *from_cache = true;
      *resolved_at = rec->resolved_at;
      return rec->digest;
    }
  }
  *from_cache = false;
  FetchedManifest fm = source().get_manifest(ref.repo, ref.reference());
  std::string mt = fm.media_type.empty() ? oci::peek_media_type(fm.bytes) : fm.media_type;
  if (!store_.has_blob(fm.digest)) store_.put_blob(oci::describe(fm.bytes, mt), fm.bytes);
  *resolved_at = unix_now();
  return fm.digest;
}

// Returns the bytes of a manifest referenced by an index entry, from the store or the hub.
std::string Hub::ensure_manifest(const Ref& ref, const oci::Descriptor& desc) {
  if (desc.size > static_cast<int64_t>(oci::kMaxManifestBytes)) {
    throw Error(ErrorKind::kRefused,
                fmt::format("{}: manifest {} is {} bytes, over the {} limit", ref.str(),
                            desc.digest.str(), desc.size, oci::kMaxManifestBytes));
  }
  if (auto bytes = store_.read_blob(desc.digest, oci::kMaxManifestBytes)) {
    oci::verify_bytes(desc, *bytes, ref.str() + ": manifest");
    return *bytes;
  }
  if (options_.offline) offline_miss(ref, "manifest " + desc.digest.str());
  // Single flight across processes, as for blobs: the one holding the lock fetches, the others
  // read what it stored (verified again here: the cache is untrusted storage).
  std::optional<fs::FileLock> mine =
      store_.claim_blob(desc.digest, wait_for_other(ref, "manifest " + desc.digest.str()));
  if (!mine) {
    if (auto bytes = store_.read_blob(desc.digest, oci::kMaxManifestBytes)) {
      oci::verify_bytes(desc, *bytes, ref.str() + ": manifest");
      return *bytes;
    }
    // Damaged (and removed) since it was stored: fetched here after all.
  }
  FetchedManifest fm = source().get_manifest(ref.repo, desc.digest.str());
  oci::verify_bytes(desc, fm.bytes, ref.str() + ": manifest");
  store_.put_blob(desc, fm.bytes);
  return fm.bytes;
}

fs::LockWait Hub::wait_for_other(const Ref& ref, const std::string& what) const {
  fs::LockWait wait;
  wait.deadline = options_.source.http.command_deadline;
  if (wait.deadline == std::chrono::steady_clock::time_point{}) {
    wait.deadline = std::chrono::steady_clock::time_point::max();
  }
  const long timeout_s = options_.source.http.command_timeout_s;
  wait.on_wait = [ref_text = ref.str(), what](const std::string& holder) {
    log_line(kLogInfo, fmt::format("{}: waiting for another process downloading {} ({}) into the "
                                   "shared cache",
                                   ref_text, what, holder));
  };
  wait.timeout_message = [ref_text = ref.str(), what, timeout_s,
                          root = store_.root()](const std::string& holder) {
    return fmt::format(
        "{}: gave up waiting for another process downloading {} into the cache {} ({} holds its "
        "lock) when this command's deadline of {} s for hub work passed. If that process is "
        "stuck (stopped with Ctrl-Z, or hung), resume or end it (its lock goes with it) and run "
        "the command again, or raise KERNEL_HUB_COMMAND_TIMEOUT_S (seconds, 0 = no deadline)",
        ref_text, what, root.string(), holder, timeout_s);
  };
  return wait;
}

// Fetches the manifests an index lists that the store lacks, several at a time: one round
// trip each would otherwise dominate the pull of a small package with many variants.
void Hub::prefetch_manifests(const Ref& ref, const std::vector<oci::Descriptor>& manifests) {
  if (options_.offline) return;
  std::vector<const oci::Descriptor*> todo;
  for (auto& d : manifests) {
    if (!store_.has_blob(d.digest)) todo.push_back(&d);
  }
  if (todo.size() < 2) return;
  source();  // opened here, before the threads share it
  run_parallel(todo.size(), 8, [&](size_t i) {
    try {
      ensure_manifest(ref, *todo[i]);
    } catch (const Error&) {
      // Reported by the sequential pass that follows, with its context.
    }
  });
}

void Hub::fetch_missing(const Ref& ref, const std::vector<oci::Descriptor>& blobs,
                        PullReport& report) {
  std::vector<oci::Descriptor> missing;
  for (auto& d : blobs) {
    // Checked, not only present: a pull reports what it has as verified.
    if (store_.has_intact_blob(d)) continue;
    if (d.data) {  // inline content (the empty config): no request needed
      auto raw = base64_decode(*d.data);
      if (raw) {
        store_.put_blob(d, *raw);
        continue;
      }
    }
    missing.push_back(d);
  }
  if (missing.empty()) return;
  if (options_.offline) offline_miss(ref, "blob " + missing.front().digest.str());

  // Single flight across processes: a blob whose lock another process holds is being
  // downloaded there; wait for it after our own downloads, then use what it stored (or take
  // the blob over when that process failed or died).
  std::vector<oci::Descriptor> mine, theirs;
  std::vector<fs::FileLock> held;
  for (auto& d : missing) {
    if (auto lock = store_.try_claim_blob(d.digest)) {
      held.push_back(std::move(*lock));
      mine.push_back(d);
    } else if (!store_.has_blob(d.digest)) {
      theirs.push_back(d);
    }
  }

  auto download = [&](const std::vector<oci::Descriptor>& list) {
    if (list.empty()) return;
    uint64_t total = 0;
    for (auto& d : list) total += static_cast<uint64_t>(std::max<int64_t>(d.size, 0));
    store_.require_free_space(total, fmt::format("{} blobs of {}", list.size(), ref.str()));
    std::vector<std::unique_ptr<BlobWriter>> writers;
    std::vector<BlobFetch> fetches;
    for (auto& d : list) {
      writers.push_back(store_.begin_blob(d));
      fetches.push_back(BlobFetch{d, writers.back().get(), false, {}});
    }
    Progress progress(ref.str(), options_.progress);
    source().fetch_blobs(ref.repo, fetches, &progress);
    progress.finish();
    // Commits (digest check, fsync, rename) in parallel: the fsyncs overlap on the device.
    std::vector<char> committed(fetches.size(), 0), damaged(fetches.size(), 0);
    run_parallel(fetches.size(), 8, [&](size_t i) {
      damaged[i] = fetches[i].integrity;
      if (!fetches[i].ok) return;
      try {
        writers[i]->commit();
        committed[i] = 1;
      } catch (const Error& e) {
        fetches[i].error = e.what();
        damaged[i] = e.kind() == ErrorKind::kIntegrity;
      }
    });
    std::string errors;
    bool integrity = false;  // bytes arrived but were not the ones named: not worth a retry
    for (size_t i = 0; i < fetches.size(); ++i) {
      integrity = integrity || damaged[i];
      if (committed[i]) {
        ++report.blobs_downloaded;
        report.bytes_downloaded += static_cast<uint64_t>(fetches[i].desc.size);
      } else {
        errors += fmt::format("\n  {}: {}", fetches[i].desc.digest.str(), fetches[i].error);
      }
    }
    if (!errors.empty() && integrity) {
      throw Error(ErrorKind::kIntegrity,
                  fmt::format("{}: {} served a blob whose bytes do not match its digest; nothing "
                              "was kept (tell the hub operator if it persists):{}",
                              ref.str(), address_.text, errors));
    }
    if (!errors.empty()) {
      throw Error(ErrorKind::kNetwork,
                  fmt::format("{}: could not fetch every blob from {}; nothing partial was kept, "
                              "run the pull again:{}",
                              ref.str(), address_.text, errors));
    }
  };

  download(mine);
  held.clear();
  std::vector<oci::Descriptor> taken_over;
  for (auto& d : theirs) {
    if (auto lock = store_.claim_blob(d.digest, wait_for_other(ref, "blob " + d.digest.str()))) {
      held.push_back(std::move(*lock));  // the other process failed or died: ours now
      taken_over.push_back(d);
    }
  }
  download(taken_over);
}

PullReport Hub::pull(const Ref& ref) {
  PullReport report;
  report.ref = ref;
  int64_t resolved_at = 0;
  report.digest = resolve(ref, &report.from_cache, &resolved_at);

  auto root = store_.read_blob(report.digest, oci::kMaxManifestBytes);
  if (!root) {
    if (options_.offline) offline_miss(ref, "index " + report.digest.str());
    throw Error(ErrorKind::kIntegrity,
                ref.str() + ": the index " + report.digest.str() + " vanished from the cache");
  }
  report.media_type = oci::peek_media_type(*root);

  // Every document under the root, each fetched once (from the store, else the hub), within
  // the graph limits; then the configs and layers the store lacks.
  oci::WalkOptions walk;
  walk.limits = options_.graph_limits;
  walk.prefetch = [&](const std::vector<oci::Descriptor>& docs) { prefetch_manifests(ref, docs); };
  oci::Graph graph = oci::walk_graph(
      oci::describe(*root, report.media_type), ref.str(),
      [&](const oci::Descriptor& d) -> std::optional<std::string> {
        return d.digest == report.digest ? *root : ensure_manifest(ref, d);
      },
      walk);

  bool kernel_artifact = false;
  std::map<Digest, oci::Descriptor> blobs;
  for (const oci::GraphNode& n : graph.nodes) {
    if (n.artifact_type == oci::kArtifactTypeKernel) kernel_artifact = true;
    if (n.kind == oci::NodeKind::kManifest) ++report.manifests;
    if (oci::is_document(n.kind)) continue;
    blobs.emplace(n.desc.digest, n.desc);
  }
  report.blobs = blobs.size();
  std::vector<oci::Descriptor> list;
  for (auto& [d, desc] : blobs) {
    list.push_back(desc);
    report.total_bytes += static_cast<uint64_t>(desc.size);
  }
  fetch_missing(ref, list, report);

  // Nothing is unpacked here: trees are made by unpack(), after the trust check of their index.
  // The index's signatures travel into the cache with it, so that offline loads can verify.
  report.kernel_index = kernel_artifact && oci::is_index(report.media_type);
  // Asked at most once a reuse window per cache (or ref TTL, when longer), whichever process
  // asks; a load whose cached signatures do not verify asks again (check_trust).
  if (report.kernel_index && !options_.offline) {
    const int64_t window = std::max(options_.ref_ttl_s, HubOptions::kSignaturesReuseS);
    refresh_signatures(ref, report.digest, unix_now_ns() - window * 1000000000);
  }
  if (!report.from_cache) record_ref(ref, report.digest, resolved_at);
  return report;
}

std::filesystem::path Hub::unpack(const Digest& layer) {
  return store_.unpack(layer, ArchiveLimits{}, &unpack_budget_);
}

void Hub::record_ref(const Ref& ref, const Digest& digest, int64_t resolved_at) {
  store_.write_ref(RefRecord{address_.id(), ref.repo, record_name(ref), digest, resolved_at});
}

RefInfo Hub::info(const Ref& ref) {
  RefInfo info;
  info.ref = ref;
  info.digest = resolve(ref, &info.from_cache, &info.resolved_at);
  auto root = store_.read_blob(info.digest, oci::kMaxManifestBytes);
  if (!root) offline_miss(ref, "index " + info.digest.str());
  info.media_type = oci::peek_media_type(*root);
  if (oci::is_index(info.media_type)) {
    oci::Index index = oci::parse_index(*root, ref.str() + ": index");
    info.annotations = index.annotations;
    info.artifact_type = index.artifact_type;
    for (auto& d : index.manifests) {
      if (oci::is_index(d.media_type)) continue;  // nested indexes are listed by pull only
      info.variants.push_back(
          VariantInfo{d, oci::parse_manifest(ensure_manifest(ref, d), ref.str() + ": manifest")});
    }
  } else {
    oci::Manifest m = oci::parse_manifest(*root, ref.str() + ": manifest");
    info.annotations = m.annotations;
    info.artifact_type = m.artifact_type;
    info.variants.push_back(VariantInfo{oci::describe(*root, info.media_type), m});
  }
  // Tags only: a digest resolves without a record, and a record is a gc root (pull makes one
  // for what it fetched whole; info fetches no blobs).
  if (!info.from_cache && !ref.digest) record_ref(ref, info.digest, info.resolved_at);
  return info;
}

PushReport Hub::push(const std::filesystem::path& layout_dir, const Ref& ref) {
  if (options_.offline) {
    throw Error(ErrorKind::kOffline, "push needs the network; offline mode is on");
  }
  if (ref.digest) {
    throw Error(ErrorKind::kInvalidInput,
                "push " + ref.str() + ": push to a tag (org/name@TAG), not to a digest");
  }
  PushReport report;
  report.ref = ref;
  auto layout = open_single_layout_source(layout_dir, options_.source);

  // Which index in the layout: the one tagged like the destination, else the only one.
  std::vector<std::string> tags = layout->list_tags("");
  std::string tag;
  for (auto& t : tags) {
    if (t == ref.tag) tag = t;
  }
  if (tag.empty()) {
    if (tags.size() != 1) {
      std::string list;
      for (auto& t : tags) list += (list.empty() ? "" : ", ") + t;
      throw Error(
          ErrorKind::kInvalidInput,
          fmt::format("push: layout {} has {} tags ({}) and none is '{}'; name one with "
                      "REF@TAG",
                      layout_dir.string(), tags.size(), list.empty() ? "none" : list, ref.tag));
    }
    tag = tags.front();
  }
  FetchedManifest root = layout->get_manifest("", tag);
  report.digest = root.digest;

  // Stage everything in the store first (verifying it), then upload: blobs, manifests
  // (children before parents), the index by digest, and the tag last.
  std::string root_mt =
      root.media_type.empty() ? oci::peek_media_type(root.bytes) : root.media_type;
  oci::WalkOptions walk;
  walk.limits = options_.graph_limits;
  oci::Graph graph = oci::walk_graph(
      oci::describe(root.bytes, root_mt), "push " + layout_dir.string(),
      [&](const oci::Descriptor& d) -> std::optional<std::string> {
        if (d.digest == root.digest) return root.bytes;
        FetchedManifest child = layout->get_manifest("", d.digest.str());
        oci::verify_bytes(d, child.bytes, layout_dir.string() + ": manifest");
        return std::move(child.bytes);
      },
      walk);
  std::map<Digest, oci::Descriptor> blobs;
  for (const oci::GraphNode& n : graph.nodes) {
    if (!oci::is_document(n.kind)) blobs.emplace(n.desc.digest, n.desc);
  }

  std::vector<std::unique_ptr<BlobWriter>> writers;
  std::vector<BlobFetch> fetches;
  for (auto& [d, desc] : blobs) {
    if (store_.has_blob(d)) continue;
    writers.push_back(store_.begin_blob(desc));
    fetches.push_back(BlobFetch{desc, writers.back().get(), false, {}});
  }
  layout->fetch_blobs("", fetches, nullptr);
  for (size_t i = 0; i < fetches.size(); ++i) {
    if (!fetches[i].ok) {
      throw Error(ErrorKind::kIntegrity,
                  fmt::format("push: layout {}: blob {}: {}", layout_dir.string(),
                              fetches[i].desc.digest.str(), fetches[i].error));
    }
    writers[i]->commit();
  }

  for (auto& [d, desc] : blobs) {
    if (source().has_blob(ref.repo, desc)) {
      ++report.blobs_skipped;
      continue;
    }
    source().push_blob(ref.repo, desc, store_.blob_path(d));
    ++report.blobs_uploaded;
    report.bytes_uploaded += static_cast<uint64_t>(desc.size);
  }
  for (size_t i : graph.bottom_up) {
    const oci::GraphNode& n = graph.nodes[i];
    if (n.bytes) source().push_manifest(ref.repo, n.desc.digest.str(), *n.bytes, n.desc.media_type);
  }
  // Signatures before the tag moves, so that no reader sees the new tag unsigned. Envelopes
  // signed for another repo stay behind: a statement binds its repo and could never verify.
  oci::Descriptor subject;
  subject.media_type = root_mt;
  subject.digest = root.digest;
  subject.size = static_cast<int64_t>(root.bytes.size());
  for (const auto& envelope : layout->get_signatures("", subject).envelopes) {
    std::string repo;
    try {
      repo = trust::Statement::parse(envelope.statement, "signature").repo;
    } catch (const Error&) {
    }
    if (repo != ref.repo) {
      ++report.signatures_skipped;
      continue;
    }
    source().push_signature(ref.repo, subject, envelope);
    ++report.signatures_pushed;
  }
  source().push_manifest(ref.repo, ref.tag, root.bytes, root_mt);
  return report;
}

std::vector<std::string> Hub::tags(const std::string& repo) {
  if (options_.offline) {
    throw Error(ErrorKind::kOffline, "listing tags of " + repo + " needs the network");
  }
  return source().list_tags(repo);
}

}  // namespace kh
