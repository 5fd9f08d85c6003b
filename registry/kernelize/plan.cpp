#include <fmt/format.h>

#include "hub/base/error.h"
#include "registry/kernelize/stages.h"

namespace kh::kernelize_stage {

std::vector<Planned> plan(const PlanInput& in, IndexProvider& provider) {
  MemoIndexProvider memo(provider);
  std::vector<Planned> out;
  for (Mode mode : in.modes)
    for (auto& slot : in.slots) {
      Planned p;
      p.resolution = resolve_layer(in.config, slot, in.device, mode, memo, in.resolve);
      out.push_back(std::move(p));
    }
  return out;
}

std::vector<KernelizeBinding> keep_fallbacks(const std::vector<std::string>& slots,
                                             const std::vector<Mode>& modes,
                                             const std::string& note) {
  std::vector<KernelizeBinding> out;
  for (Mode mode : modes)
    for (auto& s : slots) {
      KernelizeBinding b;
      b.layer = s;
      b.mode = mode;
      b.note = note;
      b.resolution.layer = s;
      b.resolution.requested = mode;
      b.resolution.trace.push_back({TraceStage::kLayer, s, false, note});
      out.push_back(std::move(b));
    }
  return out;
}

void require_mapped_served(const std::vector<Planned>& plan, const KernelConfig& config,
                           const Device& device) {
  for (auto& p : plan) {
    const LayerResolution& r = p.resolution;
    auto lit = config.layers.find(r.layer);
    if (r.fallback && lit != config.layers.end() && lit->second.devices.count(device.key))
      throw Error(ErrorKind::kRefused,
                  fmt::format("kernelize (strict): layer {} is mapped for {} but no kernel "
                              "serves {} mode:\n{}",
                              r.layer, device.key, mode_name(r.requested), format_trace(r)));
  }
}

}  // namespace kh::kernelize_stage
