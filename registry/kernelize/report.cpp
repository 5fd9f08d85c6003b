#include <fmt/format.h>

#include "registry/kernelize.h"

namespace kh {

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

const KernelizeBinding* KernelizeReport::find(std::string_view layer, Mode mode) const {
  for (auto& b : bindings)
    if (b.layer == layer && b.mode == mode) return &b;
  return nullptr;
}

std::string KernelizeReport::str() const {
  std::string out;
  for (auto& b : bindings) {
    if (b.source == BindingSource::kFallback) {
      out += fmt::format("{} {}: fallback ({})\n", b.layer, mode_name(b.mode), b.note);
    } else {
      out += fmt::format("{} {}: {} {} index {} {} [{}] {} {:.3f} ms\n", b.layer, mode_name(b.mode),
                         b.kernel, b.package, b.index_digest.str(), b.variant,
                         binding_source_name(b.source), b.trust, b.load_ms);
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
                        {"mode", mode_name(b.mode)},
                        {"source", binding_source_name(b.source)},
                        {"load_ms", b.load_ms},
                        {"trace", trace}};
    if (b.source == BindingSource::kFallback) {
      j["note"] = b.note;
    }
    // The config mapped this layer here but no entry could serve it: why, per entry tried.
    if (!b.resolution.unserved.empty()) j["unserved"] = b.resolution.unserved;
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
  nlohmann::json unserved = nlohmann::json::array();
  for (auto& b : bindings)
    if (!b.resolution.unserved.empty())
      unserved.push_back(
          {{"layer", b.layer}, {"mode", mode_name(b.mode)}, {"reason", b.resolution.unserved}});
  out["unserved"] = std::move(unserved);
  return out;
}

}  // namespace kh
