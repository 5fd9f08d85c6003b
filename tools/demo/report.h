// How a demo run is shown: the binding table (which kernel serves each slot in each mode, from
// where) as text, and the whole run as JSON for `kernel-hub demo --json`.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "registry/kernelize.h"
#include "tools/demo/demo.h"

namespace kh::demo {

// "cache", "hub", "local", "fallback"; for a CUDA binding with how its device code comes, e.g.
// "hub, cubin sm_90" or "cache, NVRTC".
std::string binding_source_text(const KernelizeBinding& binding);

// Columns: layer, mode, package@version, digest (short), variant, source, load time.
std::string binding_table(const KernelizeReport& report);

struct DemoSummary {
  std::string device;  // as asked: "cpu", "cuda:0"
  bool fallback_only = false;
  double kernelize_ms = 0;
  double total_ms = 0;
};

nlohmann::json demo_json(const DemoSummary& summary, const DemoOptions& options,
                         const KernelizeReport& report, const DemoRun& run);

}  // namespace kh::demo
