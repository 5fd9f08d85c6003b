// Fuzz target: KernelConfig JSON comes from users and model repos.
#include <cstddef>
#include <cstdint>
#include <string>

#include "hub/base/error.h"
#include "registry/kernel_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  kh::KernelConfig c;
  try {
    c = kh::KernelConfig::parse(text);
  } catch (const kh::Error&) {
    return 0;
  }
  for (auto& [layer, lm] : c.layers) {
    if (!kh::is_valid_layer_name(layer)) __builtin_trap();
    for (auto& [key, dm] : lm.devices) {
      if (!(kh::is_device_key(key) || kh::is_other_device_key(key)) || dm.entries.empty())
        __builtin_trap();
      for (auto& e : dm.entries) {
        if (e.range && e.range->min > e.range->max) __builtin_trap();
        if (e.range && key != "cuda") __builtin_trap();
        if (e.modes.empty()) __builtin_trap();
        for (auto& [mode, me] : e.modes) {
          // A parsed ref prints as a ref that parses back to itself.
          if (!(kh::KernelRef::parse(me.kernel.str(), "X") == me.kernel)) __builtin_trap();
          if (me.path.empty() || me.path[0] != '$') __builtin_trap();
        }
      }
    }
  }
  // Merging a config onto itself changes nothing in shape.
  kh::KernelConfig m = kh::merge_kernel_configs(c, c);
  if (m.layers.size() != c.layers.size()) __builtin_trap();
  for (auto& r : c.refs()) (void)r.str();
  return 0;
}
