// A CUDA target architecture as packages name it: "90" (sm_90), "90a" (sm_90a, arch-specific),
// "100f" (family-specific). Used for the cubin list in kernel.json, NVRTC's
// --gpu-architecture and the choice of device code for a GPU.
#pragma once

#include <compare>
#include <optional>
#include <string>
#include <string_view>

namespace kh {

struct CudaArch {
  int major = 0;
  int minor = 0;
  // 'a' (arch-specific: runs only on exactly major.minor), 'f' (family-specific; treated like
  // 'a' by this loader, i.e. exact match only), or 0 for a plain target.
  char suffix = 0;

  // Parses "90", "90a", "sm_90", "sm_100f": two or three digits (the last one is the minor),
  // an optional suffix, an optional "sm_" prefix. nullopt when malformed.
  static std::optional<CudaArch> parse(std::string_view text);

  std::string number() const;                          // "90", "90a"
  std::string sm() const { return "sm_" + number(); }  // "sm_90a"
  auto operator<=>(const CudaArch&) const = default;
};

// True when SASS built for `code` runs on a GPU of compute capability `gpu` (plain major.minor):
// the same major and a minor not above the GPU's; arch- and family-specific code only on its
// exact major.minor.
bool cubin_runs_on(const CudaArch& code, const CudaArch& gpu);

}  // namespace kh
