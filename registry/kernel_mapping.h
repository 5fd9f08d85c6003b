// Scoped kernel mappings for the C++ API, as HF's register_kernel_mapping / use_kernel_mapping:
// a process-wide base mapping plus, per thread, a stack of overlays. Each overlay either
// inherits the mapping in effect when it is pushed (merged with merge_kernel_configs) or replaces
// it; leaving the scope restores the previous mapping. Other threads never see a thread's
// overlays.
//
//   kh::register_kernel_mapping(base);                       // process-wide
//   {
//     kh::ScopedKernelMapping scope(extra);                  // inherit: base + extra
//     kh::kernelize(..., *kh::current_kernel_mapping(), ...);
//   }                                                        // back to base
#pragma once

#include <memory>

#include "registry/kernel_config.h"

namespace kh {

enum class MappingMerge { kInherit, kReplace };

// Changes the process-wide base. kInherit merges into it, kReplace starts from empty.
void register_kernel_mapping(const KernelConfig& mapping,
                             MappingMerge merge = MappingMerge::kInherit);
// Empties the process-wide base (tests, re-initialization).
void clear_kernel_mapping();

// The mapping in effect on this thread: the innermost overlay, else the base. The snapshot is
// immutable and stays valid after the scope that produced it ends.
std::shared_ptr<const KernelConfig> current_kernel_mapping();

// Pushes an overlay on this thread's stack for the guard's lifetime. Guards must be destroyed in
// reverse order of construction on the thread that made them (as scopes are); destroying an outer
// guard first also pops the guards above it.
class ScopedKernelMapping {
 public:
  explicit ScopedKernelMapping(const KernelConfig& mapping,
                               MappingMerge merge = MappingMerge::kInherit);
  ~ScopedKernelMapping();
  ScopedKernelMapping(const ScopedKernelMapping&) = delete;
  ScopedKernelMapping& operator=(const ScopedKernelMapping&) = delete;

 private:
  size_t depth_;  // stack size before this guard pushed
};

}  // namespace kh
