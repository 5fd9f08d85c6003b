#include "registry/kernelize.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <set>

#include "hub/base/clock.h"
#include "hub/base/env.h"
#include "hub/base/error.h"
#include "hub/base/fs.h"
#include "hub/base/log.h"
#include "loader/package_dir.h"
#include "registry/package_manifest.h"

namespace kh {

namespace stdfs = std::filesystem;

const char* binding_source_name(BindingSource source) {
  switch (source) {
    case BindingSource::kCache:
      return "cache";
    case BindingSource::kHub:
      return "hub";
    case BindingSource::kLocal:
      return "local";
    case BindingSource::kFallback:
      return "fallback";
  }
  return "?";
}

Device parse_device_target(std::string_view text) {
  std::string t(text);
  if (t == "cpu") return local_cpu_device();
  size_t colons = std::count(t.begin(), t.end(), ':');
  if (t.starts_with("cuda:") && colons == 2) t += ":" + local_os() + "/" + local_arch();
  try {
    return parse_device_spec(t);
  } catch (const Error&) {
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("device '{}': expected cpu, cpu:OS/ARCH, cuda:sm_NN:cuda_X.Y or "
                            "cuda:sm_NN:cuda_X.Y:OS/ARCH (e.g. cuda:sm_90:cuda_13.0)",
                            text));
  }
}

std::map<std::string, stdfs::path> parse_local_overrides(std::string_view text) {
  std::map<std::string, stdfs::path> out;
  size_t start = 0;
  while (start < text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string_view::npos) comma = text.size();
    std::string_view item = text.substr(start, comma - start);
    start = comma + 1;
    if (item.empty()) continue;
    size_t eq = item.find('=');
    std::string repo(item.substr(0, eq));
    if (eq == std::string_view::npos || eq + 1 >= item.size() || !is_valid_repo_name(repo))
      throw Error(ErrorKind::kInvalidInput,
                  fmt::format("KERNEL_HUB_LOCAL: '{}' is not org/name=/path; expected "
                              "\"org/name=/path[,org/other=/path]\"",
                              item));
    out[repo] = stdfs::path(std::string(item.substr(eq + 1)));
  }
  return out;
}

namespace {

Mode loader_mode(KernelMode m) {
  return m == KernelMode::kTrain ? Mode::kTrain : Mode::kEval;
}

std::optional<oci::Descriptor> package_layer_of(const oci::Manifest& m) {
  for (auto& l : m.layers)
    if (l.media_type == oci::kMediaTypeLayerTarZstd) return l;
  if (m.layers.size() == 1) return m.layers[0];
  return std::nullopt;
}

}  // namespace

// A KERNEL_HUB_LOCAL package, presented to the resolver as a one-variant index.
struct KernelizeIndexProvider::LocalPackage {
  stdfs::path dir;
  PackageDir loader_view;
  std::optional<PackageManifest> manifest;  // when kernel.json is in the full registry form
  Digest index_digest;
  oci::Manifest variant_manifest;
  oci::Descriptor entry;
};

KernelizeIndexProvider::KernelizeIndexProvider(Hub& hub, const LockFile* lock)
    : hub_(hub), lock_(lock) {}
KernelizeIndexProvider::~KernelizeIndexProvider() = default;

void KernelizeIndexProvider::add_local(const std::string& repo, const stdfs::path& dir,
                                       const Device& device, const ResolveOptions& ro) {
  auto p = std::make_shared<LocalPackage>();
  p->dir = dir;
  try {
    p->loader_view = read_package_dir(dir);
  } catch (const Error& e) {
    throw Error(e.kind(), fmt::format("KERNEL_HUB_LOCAL {}={}: {}", repo, dir.string(), e.what()));
  }
  std::string text = fs::read_file(dir / kPackageManifestName, kMaxPackageManifestBytes);
  try {
    p->manifest = PackageManifest::parse(text, (dir / kPackageManifestName).string());
  } catch (const Error&) {
    // The loader's short form (name, version, host_library): no layer list, no file digests.
  }
  oci::Descriptor layer;
  layer.media_type = std::string(oci::kMediaTypeLayerTarZstd);
  layer.digest =
      sha256_of("kernel-hub local package\n" + stdfs::absolute(dir).string() + "\n" + text);
  layer.size = static_cast<int64_t>(text.size());
  p->variant_manifest.artifact_type = std::string(oci::kArtifactTypeKernel);
  p->variant_manifest.config = oci::empty_descriptor();
  p->variant_manifest.layers.push_back(layer);
  p->entry = oci::describe(oci::serialize(p->variant_manifest), oci::kMediaTypeManifest);
  p->entry.platform = oci::Platform{device.os, device.arch, ""};
  auto& ann = p->entry.annotations;
  ann[std::string(kAnnotationDevice)] = device.key;
  ann[std::string(kAnnotationAbi)] =
      p->manifest ? fmt::format("{}.{}", p->manifest->abi_major, p->manifest->abi_minor)
                  : fmt::format("{}.{}", ro.abi_major, ro.abi_minor);
  if (device.is_cuda()) {
    ann[std::string(kAnnotationCudaVersion)] =
        p->manifest && !p->manifest->cuda_version.empty()
            ? p->manifest->cuda_version
            : fmt::format("{}.{}", device.cuda_major, device.cuda_minor);
    std::string sms;
    for (auto& [sm, f] : p->loader_view.cubins) sms += (sms.empty() ? "" : ",") + sm;
    if (!sms.empty()) ann[std::string(kAnnotationCudaSm)] = sms;
    ann[std::string(kAnnotationSource)] = p->loader_view.cuda_source.empty() ? "false" : "true";
  }
  oci::Index index;
  index.manifests.push_back(p->entry);
  p->index_digest = sha256_of(oci::serialize(index));
  locals_[repo] = std::move(p);
}

const KernelizeIndexProvider::LocalPackage* KernelizeIndexProvider::local(const Ref& ref) const {
  auto it = locals_.find(ref.repo);
  return it == locals_.end() ? nullptr : it->second.get();
}

const stdfs::path* KernelizeIndexProvider::local_dir(const Ref& ref) const {
  auto* l = local(ref);
  return l ? &l->dir : nullptr;
}

std::optional<PackageManifest> KernelizeIndexProvider::local_manifest(const Ref& ref) const {
  auto* l = local(ref);
  return l ? l->manifest : std::nullopt;
}

std::string KernelizeIndexProvider::local_identity(const Ref& ref) const {
  auto* l = local(ref);
  return l ? l->loader_view.name + "@" + l->loader_view.version : std::string();
}

std::optional<LockEntry> KernelizeIndexProvider::local_lock_entry(const Ref& ref,
                                                                  const Device& device) const {
  auto* l = local(ref);
  if (!l) return std::nullopt;
  LockEntry e;
  e.ref = ref;
  e.hub = hub_.address().id();
  e.index_digest = l->index_digest;
  const oci::Descriptor& layer = l->variant_manifest.layers[0];
  e.targets[device.str()] = LockTarget{l->entry.digest, layer.digest, layer.size};
  return e;
}

const RefInfo& KernelizeIndexProvider::info(const Ref& asked) {
  Ref ref = effective(asked);
  std::string key = ref.str();
  if (auto it = infos_.find(key); it != infos_.end()) return *it->second;
  auto info = std::make_shared<RefInfo>(hub_.info(ref));
  // A tag resolved on the hub is recorded, as a pull records it: the ref TTL and offline runs
  // read it back.
  if (!info->from_cache && !ref.digest)
    hub_.store().write_ref(
        RefRecord{hub_.address().id(), ref.repo, ref.tag, info->digest, info->resolved_at});
  return *infos_.emplace(key, std::move(info)).first->second;
}

Ref KernelizeIndexProvider::effective(const Ref& ref) const {
  if (lock_ && hub_.options().offline && !ref.digest) {
    if (const LockEntry* e = lock_->find(ref)) return Ref{ref.repo, "", e->index_digest};
  }
  return ref;
}

IndexRecord KernelizeIndexProvider::index(const Ref& ref) {
  IndexRecord rec;
  rec.ref = ref;
  rec.hub_id = hub_.address().id();
  if (auto* l = local(ref)) {
    rec.digest = l->index_digest;
    rec.index.manifests.push_back(l->entry);
    return rec;
  }
  const RefInfo& i = info(ref);
  rec.digest = i.digest;
  rec.index.artifact_type = i.artifact_type;
  rec.index.annotations = i.annotations;
  for (auto& v : i.variants) rec.index.manifests.push_back(v.descriptor);
  return rec;
}

std::optional<oci::Manifest> KernelizeIndexProvider::manifest(const Ref& ref,
                                                              const oci::Descriptor& variant) {
  if (auto* l = local(ref)) return l->variant_manifest;
  for (auto& v : info(ref).variants)
    if (v.descriptor.digest == variant.digest) return v.manifest;
  return std::nullopt;
}

std::optional<PackageManifest> KernelizeIndexProvider::package(const Ref& ref,
                                                               const oci::Descriptor& variant) {
  if (auto* l = local(ref)) return l->manifest;
  auto m = manifest(ref, variant);
  if (!m) return std::nullopt;
  auto layer = package_layer_of(*m);
  if (!layer) return std::nullopt;
  auto dir = hub_.store().unpacked_path(layer->digest);
  if (!dir) return std::nullopt;
  try {
    return read_package_manifest(*dir);
  } catch (const Error&) {
    return std::nullopt;  // reported with its path when kernelize verifies the package
  }
}

namespace {

// What one resolved (slot, mode) needs to be bound.
struct Planned {
  LayerResolution resolution;
  stdfs::path dir;
  BindingSource source = BindingSource::kFallback;
};

}  // namespace

stdfs::path fetch_variant(Hub& hub, const std::string& repo, const oci::Descriptor& variant,
                          const std::optional<oci::Descriptor>& layer, bool* fetched) {
  Store& store = hub.store();
  if (fetched) *fetched = false;
  if (layer) {
    if (auto dir = store.unpacked_path(layer->digest)) return *dir;
    if (store.has_blob(variant.digest) && store.has_blob(layer->digest))
      return store.unpack(layer->digest);
  }
  PullReport r = hub.pull(Ref{repo, "", variant.digest});
  if (fetched) *fetched = !r.from_cache;
  auto bytes = store.read_blob(variant.digest, oci::kMaxManifestBytes);
  if (!bytes)
    throw Error(ErrorKind::kIntegrity, fmt::format("{}@{}: the variant manifest vanished from the "
                                                   "cache after the pull; run it again",
                                                   repo, variant.digest.str()));
  oci::Manifest m = oci::parse_manifest(*bytes, repo + "@" + variant.digest.str());
  auto pkg = package_layer_of(m);
  if (!pkg)
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("{}@{}: the variant manifest has no tar+zstd package layer; repack it "
                            "with kernel-hub pack",
                            repo, variant.digest.str()));
  if (layer && pkg->digest != layer->digest)
    throw Error(ErrorKind::kIntegrity,
                fmt::format("{}@{}: package layer digest mismatch: expected {}, found {}", repo,
                            variant.digest.str(), layer->digest.str(), pkg->digest.str()));
  if (auto dir = store.unpacked_path(pkg->digest)) return *dir;
  return store.unpack(pkg->digest);
}

stdfs::path fetch_lock_target(Hub& hub, const std::string& repo, const LockTarget& target,
                              bool* fetched) {
  oci::Descriptor variant;
  variant.media_type = std::string(oci::kMediaTypeManifest);
  variant.digest = target.manifest_digest;
  oci::Descriptor layer;
  layer.media_type = std::string(oci::kMediaTypeLayerTarZstd);
  layer.digest = target.layer_digest;
  layer.size = target.layer_size;
  return fetch_variant(hub, repo, variant, layer, fetched);
}

KernelizeReport kernelize(Runtime& runtime, const KernelConfig& config, Hub& hub,
                          const Device& device, const KernelizeOptions& options) {
  auto t0 = std::chrono::steady_clock::now();
  KernelizeReport report;
  report.device = device;
  for (KernelMode m : options.modes)
    if (m != KernelMode::kEval && m != KernelMode::kTrain)
      throw Error(ErrorKind::kInvalidInput,
                  "kernelize: requested modes must be eval or train (fallback is a config entry)");

  std::vector<std::string> slots;
  for (uint32_t i = 0; i < runtime.num_slots(); ++i) slots.push_back(runtime.slot_name(i));

  bool disabled = options.disable ? *options.disable : env_flag("KERNEL_HUB_DISABLE");
  if (disabled) {
    log_line(kLogInfo, "kernelize: KERNEL_HUB_DISABLE is set: every slot keeps its fallback");
    for (KernelMode mode : options.modes)
      for (auto& s : slots) {
        KernelizeBinding b;
        b.layer = s;
        b.mode = mode;
        b.note = "KERNEL_HUB_DISABLE=1: kernel mapping disabled";
        b.resolution.layer = s;
        b.resolution.requested = mode;
        b.resolution.trace.push_back({TraceStage::kLayer, s, false, b.note});
        report.bindings.push_back(std::move(b));
      }
    report.total_ms = ms_since(t0);
    return report;
  }

  ResolveOptions ro;
  ro.abi_major = options.abi_major;
  ro.abi_minor = options.abi_minor;

  // Local overrides for the repos the config uses.
  std::map<std::string, stdfs::path> local_dirs;
  if (options.local) {
    local_dirs = *options.local;
  } else if (const char* env = std::getenv("KERNEL_HUB_LOCAL"); env && *env) {
    local_dirs = parse_local_overrides(env);
  }
  KernelizeIndexProvider provider(hub);
  std::vector<Ref> refs = config.refs();
  for (auto& ref : refs) {
    auto it = local_dirs.find(ref.repo);
    if (it != local_dirs.end() && !provider.local_dir(ref))
      provider.add_local(ref.repo, it->second, device, ro);
  }

  // A lock extended with the local packages (they are served as they are, never lock-checked).
  LockFile effective_lock;
  if (options.lock) {
    effective_lock = *options.lock;
    for (auto& ref : refs)
      if (auto e = provider.local_lock_entry(ref, device)) effective_lock.put(std::move(*e));
    ro.lock = &effective_lock;
    provider.set_lock(&effective_lock);
  }

  // Resolve everything, fetch what was chosen, and resolve again while fetches brought packages
  // whose kernel.json the previous resolution could not see.
  std::vector<Planned> plan;
  std::set<std::string> fetched_variants;
  for (int round = 0; round < 4; ++round) {
    plan.clear();
    MemoIndexProvider memo(provider);
    for (KernelMode mode : options.modes)
      for (auto& s : slots) {
        Planned p;
        p.resolution = resolve_layer(config, s, device, mode, memo, ro);
        plan.push_back(std::move(p));
      }
    bool pulled = false;
    for (auto& p : plan) {
      const LayerResolution& r = p.resolution;
      if (r.fallback) continue;
      if (auto* dir = provider.local_dir(r.kernel.ref)) {
        p.dir = *dir;
        p.source = BindingSource::kLocal;
        continue;
      }
      const oci::Descriptor& variant = r.variant->descriptor;
      bool fetched = false;
      try {
        p.dir = fetch_variant(hub, r.kernel.ref.repo, variant, r.package_layer, &fetched);
      } catch (const Error& e) {
        // The variant is fetched by digest: name the ref the config asked for too.
        throw Error(e.kind(), fmt::format("{}: {}", r.kernel.ref.str(), e.what()));
      }
      std::string key = r.kernel.ref.repo + "@" + variant.digest.str();
      if (fetched && fetched_variants.insert(key).second) {
        pulled = true;
        ++report.fetched;
      }
      p.source = fetched_variants.count(key) ? BindingSource::kHub : BindingSource::kCache;
    }
    if (!pulled) break;
  }

  // Strict: a mapped layer that fell back is an error (before anything is bound).
  if (options.strict) {
    for (auto& p : plan) {
      const LayerResolution& r = p.resolution;
      auto lit = config.layers.find(r.layer);
      if (r.fallback && lit != config.layers.end() && lit->second.devices.count(device.key))
        throw Error(
            ErrorKind::kRefused,
            fmt::format("kernelize (strict): layer {} is mapped for {} but no kernel "
                        "serves {} mode:\n{}",
                        r.layer, device.key, kernel_mode_name(r.requested), format_trace(r)));
    }
  }

  // Trust before anything is loaded, online or offline: each hub package's index must carry a
  // valid signature by a key trusted for its repo (hub/trust/trust_verify.h). Under a lock the digest
  // is the user's pin, so any statement for that digest counts and rollback is not checked.
  std::optional<trust::TrustStore> default_keys;
  const trust::TrustStore* keys = options.trust_keys;
  if (!keys) keys = &default_keys.emplace(default_trust_store());
  std::map<std::string, std::string> trust_of;  // ref + index -> summary
  for (auto& p : plan) {
    if (p.resolution.fallback || p.source == BindingSource::kLocal) continue;
    const LayerResolution& r = p.resolution;
    Ref ref = r.kernel.ref;
    if (options.lock) ref = Ref{ref.repo, "", r.index_digest};
    std::string key = ref.str() + "|" + r.index_digest.str();
    if (trust_of.count(key)) continue;
    trust::TrustDecision d = hub.check_trust(ref, r.index_digest, *keys);
    if (!d.warning.empty()) log_line(kLogWarn, "kernelize: " + d.warning);
    trust_of[key] = d.signed_ok ? fmt::format("signed by {} serial {}{}", d.key_id.substr(0, 16),
                                              d.serial, d.in_grace ? " (expired, grace)" : "")
                                : "UNSIGNED (allowed)";
  }

  // Verify every package's files against its kernel.json before anything is loaded.
  std::map<stdfs::path, std::string> identity;  // dir -> "name@version"
  for (auto& p : plan) {
    if (p.resolution.fallback || identity.count(p.dir)) continue;
    if (p.source == BindingSource::kLocal) {
      const Ref& ref = p.resolution.kernel.ref;
      if (auto m = provider.local_manifest(ref)) {
        verify_package_files(p.dir, *m);
      } else {
        log_line(kLogInfo,
                 fmt::format("kernelize: local package {} has no \"files\" digests in kernel.json; "
                             "not file-verified",
                             p.dir.string()));
      }
      identity[p.dir] = provider.local_identity(ref);
      continue;
    }
    PackageManifest m;
    try {
      m = read_package_manifest(p.dir);
    } catch (const Error& e) {
      throw Error(ErrorKind::kIntegrity,
                  fmt::format("{}: the package from {} has no valid kernel.json ({}); repack it "
                              "with kernel-hub pack",
                              p.resolution.kernel.ref.str(), hub.address().text, e.what()));
    }
    try {
      verify_package_files(p.dir, m);
    } catch (const Error& e) {
      // Name the ref, as every other refusal before a load does.
      throw Error(e.kind(), fmt::format("{}: {}", p.resolution.kernel.ref.str(), e.what()));
    }
    identity[p.dir] = m.name + "@" + m.version;
  }

  // Bind.
  const int device_index = device.is_cuda() ? options.cuda_ordinal : kCpuDevice;
  for (auto& p : plan) {
    KernelizeBinding b;
    b.layer = p.resolution.layer;
    b.mode = p.resolution.requested;
    if (p.resolution.fallback) {
      b.note = p.resolution.trace.empty() ? "runtime fallback" : p.resolution.trace.back().reason;
      log_line(kLogInfo, fmt::format("kernelize: {} {}: runtime fallback ({})", b.layer,
                                     kernel_mode_name(b.mode), b.note));
    } else {
      auto tb = std::chrono::steady_clock::now();
      b.kernel = p.resolution.kernel.str();
      b.index_digest = p.resolution.index_digest;
      b.variant_digest = p.resolution.variant->descriptor.digest;
      b.variant = fmt::format("variant {} {}", p.resolution.variant->position,
                              variant_code_name(p.resolution.variant->code));
      if (!p.resolution.variant->cubin_sm.empty())
        b.variant += " sm_" + p.resolution.variant->cubin_sm;
      b.package = identity[p.dir];
      b.package_dir = p.dir;
      if (p.source == BindingSource::kLocal) {
        b.trust = "local (not signature-checked)";
      } else {
        Ref ref = p.resolution.kernel.ref;
        if (options.lock) ref = Ref{ref.repo, "", p.resolution.index_digest};
        b.trust = trust_of[ref.str() + "|" + p.resolution.index_digest.str()];
      }
      BindOutcome outcome = runtime.bind(b.layer, p.dir, loader_mode(b.mode), device_index,
                                         p.resolution.kernel.layer, options.strict);
      b.load_ms = ms_since(tb);
      if (outcome == BindOutcome::kBound) {
        b.source = p.source;
        log_line(kLogInfo,
                 fmt::format("kernelize: {} {}: {} ({}, {})", b.layer, kernel_mode_name(b.mode),
                             b.kernel, b.package, binding_source_name(b.source)));
      } else {
        b.source = BindingSource::kFallback;
        b.note = fmt::format("{} has no backward op: train keeps the runtime fallback",
                             p.resolution.kernel.str());
      }
    }
    b.resolution = std::move(p.resolution);
    report.bindings.push_back(std::move(b));
  }
  report.total_ms = ms_since(t0);
  return report;
}

const KernelizeBinding* KernelizeReport::find(std::string_view layer, KernelMode mode) const {
  for (auto& b : bindings)
    if (b.layer == layer && b.mode == mode) return &b;
  return nullptr;
}

std::string KernelizeReport::str() const {
  std::string out;
  for (auto& b : bindings) {
    if (b.source == BindingSource::kFallback) {
      out += fmt::format("{} {}: fallback ({})\n", b.layer, kernel_mode_name(b.mode), b.note);
    } else {
      out += fmt::format("{} {}: {} {} index {} {} [{}] {} {:.3f} ms\n", b.layer,
                         kernel_mode_name(b.mode), b.kernel, b.package, b.index_digest.str(),
                         b.variant, binding_source_name(b.source), b.trust, b.load_ms);
    }
  }
  return out;
}

nlohmann::json KernelizeReport::to_json() const {
  nlohmann::json out;
  out["device"] = device.str();
  out["fetched"] = fetched;
  out["total_ms"] = total_ms;
  nlohmann::json list = nlohmann::json::array();
  for (auto& b : bindings) {
    nlohmann::json trace = nlohmann::json::array();
    for (auto& s : b.resolution.trace)
      trace.push_back({{"stage", trace_stage_name(s.stage)},
                       {"candidate", s.candidate},
                       {"accepted", s.accepted},
                       {"reason", s.reason}});
    nlohmann::json j = {{"layer", b.layer},
                        {"mode", kernel_mode_name(b.mode)},
                        {"source", binding_source_name(b.source)},
                        {"load_ms", b.load_ms},
                        {"trace", trace}};
    if (b.source == BindingSource::kFallback) {
      j["note"] = b.note;
    }
    if (!b.kernel.empty()) {
      j["kernel"] = b.kernel;
      j["package"] = b.package;
      j["index_digest"] = b.index_digest.str();
      j["variant_digest"] = b.variant_digest ? b.variant_digest->str() : "";
      j["variant"] = b.variant;
      j["package_dir"] = b.package_dir.string();
      j["trust"] = b.trust;
    }
    list.push_back(std::move(j));
  }
  out["bindings"] = std::move(list);
  return out;
}

}  // namespace kh
