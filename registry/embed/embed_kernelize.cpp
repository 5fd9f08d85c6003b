// The embedding's one-call kernelize (kernel_hub.hpp): the composition of store, hub and the
// registry's kernelize that an embedder would otherwise write by hand. kh_runtime_kernelize (the
// C API) calls it too, so that both APIs pick the hub and the device the same way.
#include <optional>

#include "hub/base/error.h"
#include "hub/hub.h"
#include "hub/store/store.h"
#include "kernel_hub/kernel_hub.hpp"
#include "registry/device.h"
#include "registry/kernel_config.h"
#include "registry/kernelize.h"
#include "registry/lock_file.h"

namespace kh {

namespace {

EmbedReport embed_report(const KernelizeReport& r) {
  EmbedReport out;
  out.device = r.device.str();
  out.fetched = r.fetched;
  out.total_ms = r.total_ms;
  out.text = r.str();
  out.json = r.to_json().dump();
  for (const KernelizeBinding& b : r.bindings) {
    EmbedReport::Binding e;
    e.layer = b.layer;
    e.mode = b.mode;
    e.bound = b.source != BindingSource::kFallback;
    e.source = binding_source_name(b.source);
    e.kernel = b.kernel;
    e.package = b.package;
    if (!b.kernel.empty()) e.index_digest = b.index_digest.str();
    if (b.variant_digest) e.variant_digest = b.variant_digest->str();
    e.variant = b.variant;
    e.package_dir = b.package_dir;
    e.trust = b.trust;
    e.note = b.note;
    e.load_ms = b.load_ms;
    out.bindings.push_back(std::move(e));
  }
  return out;
}

}  // namespace

EmbedReport kernelize(Runtime& runtime, const std::string& config_json,
                      const EmbedOptions& options) {
  return kernelize(runtime, KernelConfig::parse(config_json, "config_json"), options);
}

EmbedReport kernelize(Runtime& runtime, const KernelConfig& config, const EmbedOptions& options) {
  if (options.modes.empty())
    throw Error(ErrorKind::kInvalidInput,
                "kernelize: no mode requested; set EmbedOptions::modes to eval, train or both");
  KernelizeOptions ko;
  ko.modes = options.modes;
  ko.strict = options.strict;
  ko.cuda_ordinal = options.cuda_ordinal;
  const Device device = parse_device_target(options.device.empty() ? "cpu" : options.device);
  std::optional<LockFile> lock;
  if (!options.lock.empty()) lock = LockFile::load(options.lock);
  ko.lock = lock ? &*lock : nullptr;

  Store store(Store::default_root());
  HubOptions hub_options = HubOptions::from_env();
  hub_options.progress = options.progress;
  const bool plain_http = hub_options.source.http.allow_plain_http;
  HubAddress address = options.hub.empty() ? default_hub_address(store, plain_http)
                                           : HubAddress::parse(options.hub, plain_http);
  Hub hub(address, store, hub_options);
  return embed_report(kernelize(runtime, config, hub, device, ko));
}

const EmbedReport::Binding* EmbedReport::find(std::string_view layer, Mode mode) const {
  for (const Binding& b : bindings)
    if (b.layer == layer && b.mode == mode) return &b;
  return nullptr;
}

}  // namespace kh
