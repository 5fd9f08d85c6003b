#include "registry/resolver.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <set>
#include <tuple>

#include "hub/base/error.h"

namespace kh {

const char* trace_stage_name(TraceStage stage) {
  switch (stage) {
    case TraceStage::kLayer:
      return "layer";
    case TraceStage::kCapability:
      return "capability";
    case TraceStage::kMode:
      return "mode";
    case TraceStage::kIndex:
      return "index";
    case TraceStage::kVariant:
      return "variant";
    case TraceStage::kPackage:
      return "package";
    case TraceStage::kLock:
      return "lock";
  }
  return "?";
}

const char* variant_code_name(VariantCode code) {
  switch (code) {
    case VariantCode::kHost:
      return "host code";
    case VariantCode::kCubinExact:
      return "exact cubin";
    case VariantCode::kCubinCompatible:
      return "lower-minor cubin";
    case VariantCode::kNvrtcSource:
      return "NVRTC from source";
  }
  return "?";
}

namespace {

std::string short_digest(const Digest& d) {
  return "sha256:" + d.hex.substr(0, 12);
}

std::optional<std::pair<int, int>> parse_major_minor(std::string_view text) {
  auto small = [](std::string_view s) -> std::optional<int> {
    if (s.empty() || s.size() > 4) return std::nullopt;
    int v = 0;
    for (char c : s) {
      if (c < '0' || c > '9') return std::nullopt;
      v = v * 10 + (c - '0');
    }
    return v;
  };
  auto dot = text.find('.');
  auto major = small(text.substr(0, dot));
  if (!major) return std::nullopt;
  if (dot == std::string_view::npos) return std::make_pair(*major, 0);
  auto minor = small(text.substr(dot + 1));
  if (!minor) return std::nullopt;
  return std::make_pair(*major, *minor);
}

struct SmEntry {
  std::string text;  // "90a"
  int value = 0;     // 90
  char suffix = 0;   // 'a', 'f' or 0
};

std::optional<std::vector<SmEntry>> parse_sm_list(std::string_view text) {
  std::vector<SmEntry> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string_view::npos) comma = text.size();
    std::string_view item = text.substr(start, comma - start);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    if (item.starts_with("sm_")) item.remove_prefix(3);
    SmEntry e;
    e.text = std::string(item);
    if (!item.empty() && (item.back() == 'a' || item.back() == 'f')) {
      e.suffix = item.back();
      item.remove_suffix(1);
    }
    if (item.size() < 2 || item.size() > 4 || item.front() == '0') return std::nullopt;
    for (char c : item) {
      if (c < '0' || c > '9') return std::nullopt;
      e.value = e.value * 10 + (c - '0');
    }
    out.push_back(std::move(e));
    start = comma + 1;
  }
  return out;
}

std::string annotation(const oci::Descriptor& d, std::string_view key) {
  auto it = d.annotations.find(std::string(key));
  return it == d.annotations.end() ? std::string() : it->second;
}

std::string describe_variant(const oci::Descriptor& d, size_t pos) {
  std::string platform =
      d.platform ? d.platform->os + "/" + d.platform->architecture : std::string("no platform");
  std::string dev = annotation(d, kAnnotationDevice);
  std::string s = fmt::format("variant {} {} ({} {}", pos, short_digest(d.digest), platform,
                              dev.empty() ? "?" : dev);
  if (dev == "cuda") {
    s += fmt::format(" cuda {} sm {}", annotation(d, kAnnotationCudaVersion),
                     annotation(d, kAnnotationCudaSm));
    if (annotation(d, kAnnotationSource) == "true") s += " +source";
  }
  return s + ")";
}

struct Fit {
  std::string reason;  // why it fits, or why not
  bool ok = false;
  VariantChoice choice;
  int tier = 0;   // 0 exact/host, 1 lower-minor cubin, 2 NVRTC
  int cubin = 0;  // sm of the cubin that runs (for tier 1 ordering)
  int cuda_major = 0, cuda_minor = 0;
};

Fit evaluate(const oci::Descriptor& d, size_t pos, const Device& device, const ResolveOptions& o) {
  Fit f;
  auto reject = [&](std::string why) {
    f.reason = std::move(why);
    return f;
  };
  if (d.media_type != oci::kMediaTypeManifest)
    return reject(fmt::format("media type {} is not a variant manifest", d.media_type));
  if (!d.platform)
    return reject(
        "no platform (os/architecture) in the index entry, nor a kernelhub.platform annotation "
        "on the manifest (a variant manifest copied alone from an older pack: copy the whole "
        "index, e.g. skopeo copy --all, or repack)");
  if (d.platform->os != device.os)
    return reject(fmt::format("os {} != device os {}", d.platform->os, device.os));
  if (d.platform->architecture != device.arch)
    return reject(fmt::format("architecture {} != device architecture {}", d.platform->architecture,
                              device.arch));
  std::string abi_text = annotation(d, kAnnotationAbi);
  if (abi_text.empty()) return reject("no kernelhub.abi annotation (repack with kernel-hub pack)");
  auto abi = parse_major_minor(abi_text);
  if (!abi) return reject(fmt::format("kernelhub.abi '{}' is not MAJOR.MINOR", abi_text));
  if (abi->first != o.abi_major)
    return reject(
        fmt::format("ABI {}: major {} != host ABI major {}", abi_text, abi->first, o.abi_major));
  if (abi->second > o.abi_minor)
    return reject(fmt::format("ABI {}: needs minor {} > host ABI {}.{}", abi_text, abi->second,
                              o.abi_major, o.abi_minor));
  std::string dev = annotation(d, kAnnotationDevice);
  if (dev.empty()) return reject("no kernelhub.device annotation");
  if (dev != device.key) return reject(fmt::format("device {} != {}", dev, device.key));
  f.choice.position = pos;
  f.choice.descriptor = d;
  f.choice.abi_major = abi->first;
  f.choice.abi_minor = abi->second;
  if (!device.is_cuda()) {
    f.ok = true;
    f.choice.code = VariantCode::kHost;
    f.reason = device.key + " host code";
    return f;
  }
  std::string cv_text = annotation(d, kAnnotationCudaVersion);
  if (cv_text.empty()) return reject("no kernelhub.cuda.version annotation");
  auto cv = parse_major_minor(cv_text);
  if (!cv) return reject(fmt::format("kernelhub.cuda.version '{}' is not MAJOR.MINOR", cv_text));
  if (cv->first != device.cuda_major)
    return reject(fmt::format("needs CUDA {}: major {} != driver CUDA {}.{}", cv_text, cv->first,
                              device.cuda_major, device.cuda_minor));
  if (cv->second > device.cuda_minor)
    return reject(fmt::format("needs CUDA {} > driver CUDA {}.{}", cv_text, device.cuda_major,
                              device.cuda_minor));
  f.cuda_major = cv->first;
  f.cuda_minor = cv->second;
  f.choice.cuda_version = cv_text;
  std::string sm_text = annotation(d, kAnnotationCudaSm);
  std::vector<SmEntry> sms;
  if (!sm_text.empty()) {
    auto parsed = parse_sm_list(sm_text);
    if (!parsed)
      return reject(fmt::format("kernelhub.cuda.sm '{}' is not a list like 90,90a,100", sm_text));
    sms = std::move(*parsed);
  }
  const SmEntry* exact = nullptr;
  const SmEntry* compatible = nullptr;
  for (auto& s : sms) {
    if (s.value == device.sm) {
      // Prefer the arch-specific cubin (sm_90a on sm_90): it may use features plain 90 lacks.
      if (!exact || s.suffix == 'a') exact = &s;
    } else if (s.suffix != 'a' && s.value / 10 == device.sm / 10 && s.value < device.sm) {
      if (!compatible || s.value > compatible->value) compatible = &s;
    }
  }
  bool source = annotation(d, kAnnotationSource) == "true";
  f.ok = true;
  if (exact) {
    f.choice.code = VariantCode::kCubinExact;
    f.choice.cubin_sm = exact->text;
    f.cubin = exact->value;
    f.reason = fmt::format("cubin sm_{} for sm_{}", exact->text, device.sm);
  } else if (compatible) {
    f.tier = 1;
    f.choice.code = VariantCode::kCubinCompatible;
    f.choice.cubin_sm = compatible->text;
    f.cubin = compatible->value;
    f.reason = fmt::format("cubin sm_{} runs on sm_{} (same major, lower minor)", compatible->text,
                           device.sm);
  } else if (source) {
    f.tier = 2;
    f.choice.code = VariantCode::kNvrtcSource;
    f.reason = fmt::format(
        "no cubin for sm_{} (has: {}), NVRTC compiles the packaged "
        "source",
        device.sm, sm_text.empty() ? "none" : sm_text);
  } else {
    f.ok = false;
    std::string why;
    for (auto& s : sms)
      if (s.suffix == 'a' && s.value / 10 == device.sm / 10)
        why = "; 'a' cubins run on their sm only";
    return reject(
        fmt::format("no cubin for sm_{} (has: {}){} and no source for NVRTC "
                    "(kernelhub.source)",
                    device.sm, sm_text.empty() ? "none" : sm_text, why));
  }
  return f;
}

// Ranking key: smaller is better.
auto rank_key(const Fit& f) {
  return std::make_tuple(f.tier, -f.cubin, -f.cuda_major, -f.cuda_minor, -f.choice.abi_minor,
                         f.choice.position);
}

std::string why_preferred(const Fit& best, const Fit& other) {
  if (best.tier != other.tier)
    return fmt::format("{} beats {}", variant_code_name(best.choice.code),
                       variant_code_name(other.choice.code));
  if (best.cubin != other.cubin)
    return fmt::format("cubin sm_{} is closer than sm_{}", best.choice.cubin_sm,
                       other.choice.cubin_sm);
  if (std::tie(best.cuda_major, best.cuda_minor) != std::tie(other.cuda_major, other.cuda_minor))
    return fmt::format("newer CUDA {} beats {}", best.choice.cuda_version,
                       other.choice.cuda_version);
  if (best.choice.abi_minor != other.choice.abi_minor)
    return fmt::format("higher ABI minor {} beats {}", best.choice.abi_minor,
                       other.choice.abi_minor);
  return "earlier in the index";
}

std::string mode_list(const std::map<ModeKey, ModeEntry>& modes) {
  std::string out;
  for (auto& [m, e] : modes) out += (out.empty() ? "" : ", ") + std::string(mode_key_name(m));
  return out;
}

}  // namespace

VariantSelection select_variant(const oci::Index& index, const Device& device,
                                const ResolveOptions& options, const std::optional<Digest>& only) {
  VariantSelection sel;
  std::vector<Fit> fits(index.manifests.size());
  std::optional<size_t> best;
  for (size_t i = 0; i < index.manifests.size(); ++i) {
    const auto& d = index.manifests[i];
    if (only && d.digest != *only) {
      fits[i].reason = fmt::format("not the locked variant {}", short_digest(*only));
    } else {
      fits[i] = evaluate(d, i, device, options);
      if (fits[i].ok && (!best || rank_key(fits[i]) < rank_key(fits[*best]))) best = i;
    }
  }
  for (size_t i = 0; i < index.manifests.size(); ++i) {
    TraceStep step{TraceStage::kVariant, describe_variant(index.manifests[i], i), false,
                   fits[i].reason};
    if (fits[i].ok) {
      if (best && *best == i) {
        step.accepted = true;
        step.reason = "chosen: " + fits[i].reason;
      } else {
        step.reason = fmt::format("fits ({}), but variant {} is preferred: {}", fits[i].reason,
                                  *best, why_preferred(fits[*best], fits[i]));
      }
    }
    sel.trace.push_back(std::move(step));
  }
  if (index.manifests.empty())
    sel.trace.push_back({TraceStage::kVariant, "index", false, "the index lists no manifests"});
  if (best) sel.chosen = fits[*best].choice;
  return sel;
}

// --- MemoIndexProvider ---

IndexRecord MemoIndexProvider::index(const Ref& ref) {
  std::string key = ref.str();
  if (auto it = indexes_.find(key); it != indexes_.end()) return *it->second;
  if (auto it = failures_.find(key); it != failures_.end())
    throw Error(it->second.first, it->second.second);
  try {
    auto rec = std::make_shared<IndexRecord>(inner_.index(ref));
    indexes_[key] = rec;
    return *rec;
  } catch (const Error& e) {
    failures_[key] = {e.kind(), e.what()};
    throw;
  }
}

std::optional<oci::Manifest> MemoIndexProvider::manifest(const Ref& ref,
                                                         const oci::Descriptor& variant) {
  std::string key = ref.repo + "@" + variant.digest.str();
  auto it = manifests_.find(key);
  if (it == manifests_.end()) it = manifests_.emplace(key, inner_.manifest(ref, variant)).first;
  return it->second;
}

std::optional<PackageManifest> MemoIndexProvider::package(const Ref& ref,
                                                          const oci::Descriptor& variant) {
  std::string key = ref.repo + "@" + variant.digest.str();
  auto it = packages_.find(key);
  if (it == packages_.end()) it = packages_.emplace(key, inner_.package(ref, variant)).first;
  return it->second;
}

// --- resolution ---

std::optional<oci::Descriptor> package_layer_of(const oci::Manifest& m) {
  for (auto& l : m.layers)
    if (l.media_type == oci::kMediaTypeLayerTarZstd) return l;
  if (m.layers.size() == 1) return m.layers[0];
  return std::nullopt;
}

namespace {

// What the resolver knows of a variant's layers before binding it.
struct KnownLayers {
  std::string package;  // "toy 1.0.0", for the trace
  std::map<std::string, PackageLayer> layers;
  LayersSource from = LayersSource::kUnknown;
};

// The variant's kernel.json when the provider has it at hand, else the index entry's
// kernelhub.layers annotation (with the index's title and version); nullopt when neither. An
// annotation that does not parse is ignored with a trace step: the fetched kernel.json decides.
std::optional<KnownLayers> known_layers(IndexProvider& provider, const IndexRecord& rec,
                                        const KernelRef& k, const oci::Descriptor& variant,
                                        std::vector<TraceStep>& trace) {
  if (auto pkg = provider.package(k.ref, variant))
    return KnownLayers{pkg->name + " " + pkg->version, pkg->layers, LayersSource::kPackage};
  auto ann = variant.annotations.find(std::string(kAnnotationLayers));
  if (ann == variant.annotations.end()) return std::nullopt;
  KnownLayers out;
  try {
    out.layers = parse_package_layers(
        ann->second, fmt::format("{} variant {} {}", k.ref.str(), short_digest(variant.digest),
                                 kAnnotationLayers));
  } catch (const Error& e) {
    trace.push_back({TraceStage::kPackage, k.str(), false,
                     fmt::format("annotation ignored ({}); the layer is checked once the variant "
                                 "is fetched",
                                 e.what())});
    return std::nullopt;
  }
  auto title = rec.index.annotations.find(std::string(oci::kAnnotationTitle));
  auto version = rec.index.annotations.find(std::string(oci::kAnnotationVersion));
  out.package = title != rec.index.annotations.end() && version != rec.index.annotations.end()
                    ? title->second + " " + version->second
                    : k.ref.str();
  out.from = LayersSource::kIndexAnnotation;
  return out;
}

// Tries one config entry; fills `out` and returns true when it serves, else sets `why`.
bool try_entry(const ModeEntry& entry, ModeKey entry_mode, const Device& device, Mode requested,
               IndexProvider& provider, const ResolveOptions& options, LayerResolution& out,
               std::string& why) {
  const KernelRef& k = entry.kernel;
  auto& trace = out.trace;
  std::string cand = fmt::format("{}: {} at {}", mode_key_name(entry_mode), k.str(), entry.path);

  IndexRecord rec;
  try {
    rec = provider.index(k.ref);
  } catch (const Error& e) {
    // Content that fails its digest is tampering or damage, not absence: refuse, naming the
    // ref, rather than quietly serve the fallback. Missing, offline or unreachable falls back.
    if (e.kind() == ErrorKind::kIntegrity)
      throw Error(e.kind(), fmt::format("{}: {}", k.ref.str(), e.what()));
    why = explain_index_failure(k.ref, e);
    trace.push_back({TraceStage::kIndex, k.ref.str(), false, why});
    trace.push_back({TraceStage::kMode, cand, false, "index unavailable"});
    return false;
  }
  trace.push_back(
      {TraceStage::kIndex, k.ref.str(), true,
       fmt::format("index {} ({} variants)", rec.digest.str(), rec.index.manifests.size())});

  std::optional<Digest> only;
  const LockTarget* locked = nullptr;
  const LockEntry* lock_entry = nullptr;
  if (options.lock) {
    lock_entry = &require_locked(*options.lock, k.ref);
    check_locked_index(*lock_entry, rec.hub_id, rec.digest);
    locked = &require_locked_target(*lock_entry, device.str());
    only = locked->manifest_digest;
    trace.push_back({TraceStage::kLock, k.ref.str(), true,
                     fmt::format("index {} and variant {} as locked", short_digest(rec.digest),
                                 short_digest(locked->manifest_digest))});
  }

  VariantSelection sel = select_variant(rec.index, device, options, only);
  trace.insert(trace.end(), sel.trace.begin(), sel.trace.end());
  if (!sel.chosen) {
    if (locked)
      throw Error(ErrorKind::kIntegrity,
                  fmt::format("lock: {}: the locked variant {} {} for {}; re-run kernel-hub lock",
                              k.ref.str(), locked->manifest_digest.str(),
                              std::any_of(rec.index.manifests.begin(), rec.index.manifests.end(),
                                          [&](auto& d) { return d.digest == *only; })
                                  ? "does not fit"
                                  : "is not in the index",
                              device.str()));
    trace.push_back(
        {TraceStage::kMode, cand, false, fmt::format("no variant fits {}", device.describe())});
    why = fmt::format("no variant of {} fits {} (kernel-hub why shows each variant's reason)",
                      k.ref.str(), device.describe());
    return false;
  }

  std::optional<oci::Descriptor> layer;
  if (auto m = provider.manifest(k.ref, sel.chosen->descriptor)) layer = package_layer_of(*m);
  if (locked) {
    if (!layer)
      throw Error(ErrorKind::kIntegrity,
                  fmt::format("lock: {}: variant {} has no package layer to check against the "
                              "lock",
                              k.ref.str(), locked->manifest_digest.str()));
    check_locked_digest(*lock_entry, "layer", locked->layer_digest, layer->digest);
    if (layer->size != locked->layer_size)
      throw Error(ErrorKind::kIntegrity,
                  fmt::format("lock: {}: layer size mismatch: expected {} (locked), found {}",
                              k.ref.str(), locked->layer_size, layer->size));
  }

  if (auto known = known_layers(provider, rec, k, sel.chosen->descriptor, trace)) {
    auto it = known->layers.find(k.layer);
    if (it == known->layers.end()) {
      std::string have;
      for (auto& [n, l] : known->layers) have += (have.empty() ? "" : ", ") + n;
      trace.push_back({TraceStage::kPackage, known->package, false,
                       fmt::format("has no layer {} (has: {})", k.layer, have)});
      trace.push_back({TraceStage::kMode, cand, false, "package lacks the layer"});
      why = fmt::format("package {} ({}) has no layer {} (has: {})", known->package, k.ref.str(),
                        k.layer, have);
      return false;
    }
    if (requested == Mode::kTrain && !it->second.has_backward) {
      trace.push_back({TraceStage::kPackage, known->package, false,
                       fmt::format("layer {} has no backward op; train needs one", k.layer)});
      trace.push_back({TraceStage::kMode, cand, false, "no backward for train"});
      why = fmt::format("layer {} of {} has no backward op; train needs one", k.layer, k.ref.str());
      return false;
    }
    trace.push_back({TraceStage::kPackage, known->package, true,
                     fmt::format("layer {} present{}", k.layer,
                                 requested == Mode::kTrain ? " with a backward op" : "")});
    out.layers_from = known->from;
  } else {
    trace.push_back({TraceStage::kPackage, k.str(), true,
                     "kernel.json not fetched yet: the loader checks the layer's ops at bind"});
  }

  trace.push_back({TraceStage::kMode, cand, true,
                   entry_mode.is(requested)
                       ? "serves"
                       : fmt::format("serves {} (no earlier entry served)", mode_name(requested))});
  out.fallback = false;
  out.entry_mode = entry_mode;
  out.entry_path = entry.path;
  out.kernel = k;
  out.hub_id = rec.hub_id;
  out.index_digest = rec.digest;
  out.variant = sel.chosen;
  out.package_layer = layer;
  return true;
}

// Step 2: the capability entry for the device, with a trace step per entry.
const CapabilityEntry* pick_capability(const DeviceMapping& dm, const Device& device,
                                       std::vector<TraceStep>& trace) {
  auto width = [](const CapabilityEntry& e) {
    return e.range ? e.range->width() : std::numeric_limits<int64_t>::max();
  };
  auto label = [](const CapabilityEntry& e) {
    return fmt::format("{} at {}", e.range ? e.range->str() : "any capability", e.path);
  };
  int cap = device.is_cuda() ? device.sm : 0;
  std::optional<size_t> best;
  for (size_t i = 0; i < dm.entries.size(); ++i) {
    const auto& e = dm.entries[i];
    if (e.range && !e.range->contains(cap)) continue;
    if (!best || width(e) <= width(dm.entries[*best])) best = i;
  }
  for (size_t i = 0; i < dm.entries.size(); ++i) {
    const auto& e = dm.entries[i];
    TraceStep step{TraceStage::kCapability, label(e), false, ""};
    if (e.range && !e.range->contains(cap)) {
      step.reason = fmt::format("does not contain sm {}", cap);
    } else if (best && *best == i) {
      step.accepted = true;
      step.reason = dm.entries.size() == 1 ? "the only entry"
                                           : fmt::format("narrowest range containing sm {}", cap);
    } else if (width(e) == width(dm.entries[*best])) {
      step.reason = fmt::format("same width as {}, registered later: the last registered wins",
                                label(dm.entries[*best]));
    } else {
      step.reason = fmt::format("{} is narrower", label(dm.entries[*best]));
    }
    trace.push_back(std::move(step));
  }
  return best ? &dm.entries[*best] : nullptr;
}

}  // namespace

LayerResolution resolve_layer(const KernelConfig& config, std::string_view layer,
                              const Device& device, Mode mode, IndexProvider& provider,
                              const ResolveOptions& options) {
  LayerResolution out;
  out.layer = std::string(layer);
  out.requested = mode;
  auto lit = config.layers.find(out.layer);
  if (lit == config.layers.end()) {
    out.trace.push_back({TraceStage::kLayer, out.layer, false,
                         "no mapping for this layer in the config: runtime fallback"});
    return out;
  }
  auto dit = lit->second.devices.find(device.key);
  if (dit == lit->second.devices.end()) {
    std::string have;
    for (auto& [k, v] : lit->second.devices) have += (have.empty() ? "" : ", ") + k;
    out.trace.push_back(
        {TraceStage::kLayer, out.layer, false,
         fmt::format("no {} entry (config has: {}): runtime fallback", device.key, have)});
    return out;
  }
  const CapabilityEntry* entry = pick_capability(dit->second, device, out.trace);
  if (!entry) {
    out.trace.push_back(
        {TraceStage::kLayer, out.layer, false,
         fmt::format("no capability range contains sm {}: runtime fallback", device.sm)});
    return out;
  }
  // Step 3: the mode chain, in HF's order.
  std::vector<ModeKey> chain =
      mode == Mode::kEval ? std::vector<ModeKey>{Mode::kEval, Mode::kTrain, ModeKey::fallback()}
                          : std::vector<ModeKey>{Mode::kTrain, ModeKey::fallback()};
  // Why each entry tried failed; entries of the same ref failing alike are said once
  // ("eval, train: org/n@v1:L: why"), as Transformers' forms map one ref for both modes.
  struct Failed {
    std::string modes, kernel, why;
  };
  std::vector<Failed> failed;
  for (ModeKey m : chain) {
    auto it = entry->modes.find(m);
    if (it == entry->modes.end()) {
      out.trace.push_back({TraceStage::kMode, mode_key_name(m), false,
                           fmt::format("no {} entry at {} (has: {})", mode_key_name(m), entry->path,
                                       mode_list(entry->modes))});
      continue;
    }
    std::string why;
    if (try_entry(it->second, m, device, mode, provider, options, out, why)) return out;
    std::string kernel = it->second.kernel.str();
    auto same = std::find_if(failed.begin(), failed.end(),
                             [&](auto& f) { return f.kernel == kernel && f.why == why; });
    if (same != failed.end())
      same->modes += std::string(", ") + mode_key_name(m);
    else
      failed.push_back({mode_key_name(m), kernel, why});
  }
  for (auto& f : failed)
    out.unserved +=
        fmt::format("{}{}: {}: {}", out.unserved.empty() ? "" : "; ", f.modes, f.kernel, f.why);
  if (mode == Mode::kTrain && entry->modes.count(Mode::kEval))
    out.trace.push_back({TraceStage::kMode, "eval", false,
                         "an eval kernel never serves train (it may lack a backward op)"});
  out.trace.push_back({TraceStage::kLayer, out.layer, true,
                       "no config entry served: the runtime's own implementation (fallback)"});
  return out;
}

Resolution resolve(const KernelConfig& config, const Device& device, Mode mode,
                   IndexProvider& provider, const ResolveOptions& options) {
  Resolution r;
  r.device = device;
  r.mode = mode;
  MemoIndexProvider memo(provider);
  for (auto& [name, lm] : config.layers)
    r.layers.push_back(resolve_layer(config, name, device, mode, memo, options));
  return r;
}

const LayerResolution* Resolution::find(std::string_view layer) const {
  for (auto& l : layers)
    if (l.layer == layer) return &l;
  return nullptr;
}

std::string LayerResolution::summary() const {
  if (fallback) return fmt::format("{} {}: runtime fallback", layer, mode_name(requested));
  std::string s = fmt::format("{} {}: {}", layer, mode_name(requested), kernel.str());
  if (!entry_mode.is(requested)) s += fmt::format(" ({} entry)", mode_key_name(entry_mode));
  if (variant) {
    s += fmt::format(", variant {} {}", variant->position, variant_code_name(variant->code));
    if (!variant->cubin_sm.empty()) s += " sm_" + variant->cubin_sm;
  }
  return s;
}

oci::Descriptor describe_single_variant(const oci::Descriptor& descriptor,
                                        const oci::Manifest& manifest) {
  oci::Descriptor d = descriptor;
  for (auto& [k, v] : manifest.annotations) d.annotations.emplace(k, v);
  auto platform = d.annotations.find(std::string(kAnnotationPlatform));
  if (!d.platform && platform != d.annotations.end()) {
    auto slash = platform->second.find('/');
    if (slash != std::string::npos && slash > 0 && slash + 1 < platform->second.size())
      d.platform =
          oci::Platform{platform->second.substr(0, slash), platform->second.substr(slash + 1), ""};
  }
  return d;
}

std::string explain_index_failure(const Ref& ref, const Error& error) {
  std::string out = error.what();
  if (error.kind() != ErrorKind::kNotFound) return out;
  auto is_hex = [](std::string_view s) {
    return std::all_of(s.begin(), s.end(),
                       [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
  };
  if (ref.repo.starts_with("kernels-community/"))
    out += fmt::format(
        "; {} is a Hugging Face Hub repository: this hub does not hold it (kernel-hub serves "
        "OCI hubs); publish or mirror it here (kernel-hub pack, then push) or map the layer to a "
        "package this hub has",
        ref.repo);
  if (ref.tag == "main" || ref.tag == "master")
    out += fmt::format(
        "; revision '{}' is a branch name: kernel-hub resolves tags and sha256 digests only; pin "
        "a tag (kernel-hub versions {} lists them)",
        ref.tag, ref.repo);
  else if (ref.tag.size() >= 7 && ref.tag.size() <= 40 && is_hex(ref.tag))
    out += fmt::format(
        "; revision '{}' looks like a git commit: kernel-hub resolves tags and sha256 digests "
        "only; pin a tag (kernel-hub versions {} lists them) or @sha256:<index digest>",
        ref.tag, ref.repo);
  return out;
}

std::string format_trace(const LayerResolution& r) {
  std::string out = r.summary() + "\n";
  if (!r.unserved.empty()) out += "  unserved: " + r.unserved + "\n";
  for (auto& s : r.trace)
    out += fmt::format("  [{}] {} {}: {}\n", trace_stage_name(s.stage),
                       s.accepted ? "accepted" : "rejected", s.candidate, s.reason);
  return out;
}

void LockBuild::require_complete(std::string_view what, std::string_view out,
                                 bool include_unserved) const {
  if (misses.empty() && (!include_unserved || unserved.empty())) return;
  std::string list;
  for (auto& m : misses) list += "\n  " + m;
  if (include_unserved)
    for (auto& u : unserved) list += "\n  " + u;
  size_t n = misses.size() + (include_unserved ? unserved.size() : 0);
  throw Error(ErrorKind::kNotFound,
              fmt::format("{}: {} of the config's entries cannot be served on the given targets "
                          "(nothing written to {}):{}\nfix the config, publish the missing "
                          "packages or variants, or pass fewer --target devices",
                          what, n, out, list));
}

LockBuild build_lock(const KernelConfig& config, const std::vector<Device>& devices,
                     IndexProvider& provider, const ResolveOptions& options) {
  LockBuild out;
  MemoIndexProvider memo(provider);
  ResolveOptions unlocked = options;
  unlocked.lock = nullptr;
  // Which refs each device key uses, and the entries (layer, mode, path) that use each.
  struct Use {
    std::string layer;
    ModeKey mode;
    KernelRef kernel;
  };
  std::map<std::string, std::map<std::string, Ref>> refs_by_key;
  std::map<std::string, std::map<std::string, std::vector<Use>>> uses_by_key;
  for (auto& [layer, lm] : config.layers)
    for (auto& [key, dm] : lm.devices)
      for (auto& e : dm.entries)
        for (auto& [m, me] : e.modes) {
          refs_by_key[key].emplace(me.kernel.ref.str(), me.kernel.ref);
          uses_by_key[key][me.kernel.ref.str()].push_back({layer, m, me.kernel});
        }
  std::map<std::string, LockEntry> entries;
  std::set<std::string> reported;  // each unserved line once across targets
  auto unserved = [&](std::string line) {
    if (reported.insert(line).second) out.unserved.push_back(std::move(line));
  };
  for (const Device& device : devices) {
    for (auto& [text, ref] : refs_by_key[device.key]) {
      const auto& uses = uses_by_key[device.key][text];
      IndexRecord rec;
      try {
        rec = memo.index(ref);
      } catch (const Error& e) {
        // Only absence is "unserved": an unreachable hub, refused credentials, offline without
        // the cache or damage would otherwise write (and commit, in CI) an empty lock.
        if (e.kind() == ErrorKind::kIntegrity) throw;
        if (e.kind() != ErrorKind::kNotFound)
          throw Error(e.kind(), fmt::format("{}: {}", text, e.what()));
        for (auto& u : uses)
          unserved(fmt::format("{} {} {}: {}: {}", u.layer, device.key, mode_key_name(u.mode),
                               u.kernel.str(), explain_index_failure(ref, e)));
        continue;
      }
      LockEntry& entry = entries[text];
      entry.ref = ref;
      entry.hub = rec.hub_id;
      entry.index_digest = rec.digest;
      VariantSelection sel = select_variant(rec.index, device, unlocked);
      if (!sel.chosen) {
        std::string why;
        for (auto& s : sel.trace) why += (why.empty() ? "" : "; ") + s.candidate + ": " + s.reason;
        out.misses.push_back(
            fmt::format("{} for {}: no variant fits ({})", text, device.str(), why));
        continue;
      }
      auto m = memo.manifest(ref, sel.chosen->descriptor);
      auto layer = m ? package_layer_of(*m) : std::nullopt;
      if (!layer) {
        out.misses.push_back(fmt::format("{} for {}: variant {} has no package layer", text,
                                         device.str(), sel.chosen->descriptor.digest.str()));
        continue;
      }
      entry.targets[device.str()] =
          LockTarget{sel.chosen->descriptor.digest, layer->digest, layer->size};
      std::vector<TraceStep> ignored;
      if (auto known =
              known_layers(memo, rec, KernelRef{ref, ""}, sel.chosen->descriptor, ignored)) {
        for (auto& u : uses) {
          if (known->layers.count(u.kernel.layer)) continue;
          std::string have;
          for (auto& [n, l] : known->layers) have += (have.empty() ? "" : ", ") + n;
          unserved(fmt::format("{} {} {}: {}: package {} has no layer {} (has: {})", u.layer,
                               device.key, mode_key_name(u.mode), u.kernel.str(), known->package,
                               u.kernel.layer, have));
        }
      }
    }
  }
  for (auto& [text, e] : entries)
    if (!e.targets.empty()) out.lock.entries.push_back(std::move(e));
  return out;
}

}  // namespace kh
