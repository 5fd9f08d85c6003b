#include "registry/kernel_mapping.h"

#include <mutex>
#include <vector>

namespace kh {

namespace {

std::mutex& base_mutex() {
  static std::mutex m;
  return m;
}

std::shared_ptr<const KernelConfig>& base_mapping() {
  static std::shared_ptr<const KernelConfig> base = std::make_shared<const KernelConfig>();
  return base;
}

// This thread's overlays, innermost last. Each is a full snapshot, so lookups never merge.
thread_local std::vector<std::shared_ptr<const KernelConfig>> t_overlays;

std::shared_ptr<const KernelConfig> base_snapshot() {
  std::lock_guard lock(base_mutex());
  return base_mapping();
}

}  // namespace

void register_kernel_mapping(const KernelConfig& mapping, MappingMerge merge) {
  std::lock_guard lock(base_mutex());
  auto& base = base_mapping();
  base = std::make_shared<const KernelConfig>(
      merge == MappingMerge::kInherit ? merge_kernel_configs(*base, mapping) : mapping);
}

void clear_kernel_mapping() {
  std::lock_guard lock(base_mutex());
  base_mapping() = std::make_shared<const KernelConfig>();
}

std::shared_ptr<const KernelConfig> current_kernel_mapping() {
  if (!t_overlays.empty()) return t_overlays.back();
  return base_snapshot();
}

ScopedKernelMapping::ScopedKernelMapping(const KernelConfig& mapping, MappingMerge merge)
    : depth_(t_overlays.size()) {
  auto next = merge == MappingMerge::kInherit
                  ? std::make_shared<const KernelConfig>(
                        merge_kernel_configs(*current_kernel_mapping(), mapping))
                  : std::make_shared<const KernelConfig>(mapping);
  t_overlays.push_back(std::move(next));
}

ScopedKernelMapping::~ScopedKernelMapping() {
  if (t_overlays.size() > depth_) t_overlays.resize(depth_);
}

}  // namespace kh
