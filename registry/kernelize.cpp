#include "registry/kernelize.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>

#include "hub/base/clock.h"
#include "hub/base/env.h"
#include "hub/base/error.h"
#include "hub/base/log.h"
#include "registry/kernelize/stages.h"

namespace kh {

namespace stdfs = std::filesystem;

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

KernelizeIndexProvider::KernelizeIndexProvider(Hub& hub, const LockFile* lock)
    : hub_(hub), pinned_(hub_, hub.options().offline), local_(pinned_, hub.address().id()) {
  pinned_.set_lock(lock);
}

namespace {

// Plan, trust and fetch rounds: one when every index carries kernelhub.layers; an older index is
// planned again once its package's kernel.json is unpacked (each round can only learn more
// packages).
constexpr int kMaxPlanRounds = 4;

}  // namespace

KernelizeReport kernelize(Runtime& runtime, const KernelConfig& config, Hub& hub,
                          const Device& device, const KernelizeOptions& options) {
  namespace stage = kernelize_stage;
  auto t0 = std::chrono::steady_clock::now();
  KernelizeReport report;
  report.device = device;

  std::vector<std::string> slots;
  for (uint32_t i = 0; i < runtime.num_slots(); ++i) slots.push_back(runtime.slot_name(i));

  bool disabled = options.disable ? *options.disable : env_flag("KERNEL_HUB_DISABLE");
  if (disabled) {
    log_line(kLogInfo, "kernelize: KERNEL_HUB_DISABLE is set: every slot keeps its fallback");
    report.bindings = stage::keep_fallbacks(slots, options.modes,
                                            "KERNEL_HUB_DISABLE=1: kernel mapping disabled");
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
  // Local paths in the config (Transformers' use_local_kernel form); KERNEL_HUB_LOCAL and
  // options.local name the same repos' directories first.
  for (auto& [repo, dir] : config.local_packages) local_dirs.emplace(repo, dir);
  for (auto& n : config.notes) log_line(kLogInfo, "kernelize: config: " + n);
  KernelizeIndexProvider provider(hub);
  std::vector<Ref> refs = config.refs();
  for (auto& ref : refs) {
    auto it = local_dirs.find(ref.repo);
    if (it != local_dirs.end() && !provider.local().find(ref))
      provider.local().add(ref.repo, it->second, device, ro);
  }

  // A lock extended with the local packages (they are served as they are, never lock-checked).
  LockFile effective_lock;
  if (options.lock) {
    effective_lock = *options.lock;
    for (auto& ref : refs)
      if (auto e = provider.local().lock_entry(ref, device)) effective_lock.put(std::move(*e));
    ro.lock = &effective_lock;
    provider.set_lock(&effective_lock);
  }

  std::optional<trust::TrustStore> default_keys;
  const trust::TrustStore* keys = options.trust_keys;
  if (!keys) keys = &default_keys.emplace(default_trust_store());

  // Trust before fetch: the index digest is known after plan, and nothing of a package is
  // fetched or unpacked before its index is trusted.
  const stage::PlanInput plan_input{config, slots, options.modes, device, ro};
  std::vector<stage::Planned> plan;
  stage::TrustChecked trust(options.lock != nullptr);
  stage::FetchLog fetch_log;
  for (int round = 0; round < kMaxPlanRounds; ++round) {
    plan = stage::plan(plan_input, provider);
    stage::check_trust(plan, hub, *keys, provider.local(), trust);
    if (!stage::fetch(plan, hub, provider.local(), trust, fetch_log)) break;
  }
  report.fetched = fetch_log.downloaded.size();

  if (options.strict) stage::require_mapped_served(plan, config, device);

  stage::Verified verified = stage::verify(plan, provider.local(), hub);

  const int device_index = device.is_cuda() ? options.cuda_ordinal : kCpuDevice;
  report.bindings = stage::bind(std::move(plan), runtime,
                                stage::BindInput{device_index, options.strict, trust, verified});
  report.total_ms = ms_since(t0);
  return report;
}

}  // namespace kh
