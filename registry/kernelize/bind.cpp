#include <fmt/format.h>

#include <chrono>

#include "hub/base/log.h"
#include "registry/kernelize/stages.h"

namespace kh::kernelize_stage {

namespace {
// kernel.json's digest from the signed index, for the loader to check again ("" for locals and
// indexes without it).
std::string signed_manifest_digest(const Verified& v, const std::filesystem::path& dir) {
  auto it = v.manifest_digest.find(dir);
  return it == v.manifest_digest.end() ? std::string() : it->second.str();
}
}  // namespace

std::vector<KernelizeBinding> bind(std::vector<Planned> plan, Runtime& runtime,
                                   const BindInput& in) {
  std::vector<KernelizeBinding> out;
  for (auto& p : plan) {
    const LayerResolution& r = p.resolution;
    KernelizeBinding b;
    b.layer = r.layer;
    b.mode = r.requested;
    if (r.fallback) {
      // A mapped layer no entry could serve says why (not served is never silent).
      b.note = !r.unserved.empty() ? "unserved: " + r.unserved
               : r.trace.empty()   ? "runtime fallback"
                                   : r.trace.back().reason;
      log_line(kLogInfo, fmt::format("kernelize: {} {}: runtime fallback ({})", b.layer,
                                     mode_name(b.mode), b.note));
    } else {
      auto t0 = std::chrono::steady_clock::now();
      b.kernel = r.kernel.str();
      b.index_digest = r.index_digest;
      b.variant_digest = r.variant->descriptor.digest;
      b.variant =
          fmt::format("variant {} {}", r.variant->position, variant_code_name(r.variant->code));
      if (!r.variant->cubin_sm.empty()) b.variant += " sm_" + r.variant->cubin_sm;
      b.package = in.verified.identity.at(p.dir);
      b.package_dir = p.dir;
      b.trust =
          p.source == BindingSource::kLocal ? "local (not signature-checked)" : in.trust.summary(r);
      BindOutcome outcome = runtime.bind(b.layer, p.dir, b.mode, in.device_index, r.kernel.layer,
                                         in.strict, signed_manifest_digest(in.verified, p.dir));
      b.load_ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (outcome == BindOutcome::kBound) {
        b.source = p.source;
        log_line(kLogInfo, fmt::format("kernelize: {} {}: {} ({}, {})", b.layer, mode_name(b.mode),
                                       b.kernel, b.package, binding_source_name(b.source)));
      } else {
        b.source = BindingSource::kFallback;
        b.note =
            fmt::format("{} has no backward op: train keeps the runtime fallback", r.kernel.str());
      }
    }
    b.resolution = std::move(p.resolution);
    out.push_back(std::move(b));
  }
  return out;
}

}  // namespace kh::kernelize_stage
