// Which device code serves a package on a GPU: a packaged cubin built for the GPU's exact sm,
// else a compatible cubin of the same major and a lower minor (plain targets only: an
// arch-specific sm_XYa cubin runs only on exactly X.Y), else the package's CUDA source compiled
// by NVRTC for the exact sm, else an error listing what the package has and what the GPU is.
#pragma once

#include <filesystem>
#include <map>
#include <string>

#include "loader/cuda_arch.h"
#include "loader/package_dir.h"

namespace kh {

enum class DeviceCodeKind { kCubin, kSource, kNone };
const char* device_code_kind_name(DeviceCodeKind kind);

struct DeviceCodeChoice {
  DeviceCodeKind kind = DeviceCodeKind::kNone;
  CudaArch arch;               // the cubin's target, or the NVRTC target (the GPU's sm)
  std::filesystem::path file;  // the cubin or the source
  std::string reason;          // why this one; for kNone, the full error text
};

// Packaged cubins by target, parsed (kernel.json keys were validated when it was read).
std::map<CudaArch, std::filesystem::path> packaged_cubins(const PackageDir& package);

// The target NVRTC compiles a package's source for on a GPU of compute capability `gpu`: the
// exact sm, arch-specific where the GPU has such a target (sm_90a and later). The code runs on
// this GPU only, so nothing is lost, and the source may use instructions only that target has
// (wgmma, setmaxnreg), guarded by __CUDA_ARCH_FEAT_SM<XY>_ALL.
CudaArch nvrtc_target(const CudaArch& gpu);

// Chooses for a GPU of compute capability `gpu` (plain major.minor). On an exact match an
// arch-specific cubin (90a) is preferred over the plain one (90): it may use instructions only
// that GPU has. `package_label` and `gpu_label` go into the kNone error text.
DeviceCodeChoice choose_device_code(const std::map<CudaArch, std::filesystem::path>& cubins,
                                    const std::filesystem::path& cuda_source, const CudaArch& gpu,
                                    const std::string& package_label, const std::string& gpu_label);

}  // namespace kh
