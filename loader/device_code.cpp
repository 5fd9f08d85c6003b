#include "loader/device_code.h"

#include <fmt/format.h>

namespace kh {

const char* device_code_kind_name(DeviceCodeKind kind) {
  switch (kind) {
    case DeviceCodeKind::kCubin:
      return "cubin";
    case DeviceCodeKind::kSource:
      return "cuda-source";
    case DeviceCodeKind::kNone:
      return "none";
  }
  return "?";
}

std::map<CudaArch, std::filesystem::path> packaged_cubins(const PackageDir& package) {
  std::map<CudaArch, std::filesystem::path> out;
  for (const auto& [target, file] : package.cubins)
    if (auto arch = CudaArch::parse(target)) out[*arch] = file;
  return out;
}

CudaArch nvrtc_target(const CudaArch& gpu) {
  return {gpu.major, gpu.minor, gpu.major >= 9 ? 'a' : '\0'};
}

DeviceCodeChoice choose_device_code(const std::map<CudaArch, std::filesystem::path>& cubins,
                                    const std::filesystem::path& cuda_source, const CudaArch& gpu,
                                    const std::string& package_label,
                                    const std::string& gpu_label) {
  const CudaArch plain{gpu.major, gpu.minor, 0};
  // 1. Exact: arch-specific first, then plain.
  for (char suffix : {'a', '\0'}) {
    auto it = cubins.find(CudaArch{gpu.major, gpu.minor, suffix});
    if (it != cubins.end())
      return {DeviceCodeKind::kCubin, it->first, it->second,
              fmt::format("packaged cubin for {}, the GPU's exact architecture", it->first.sm())};
  }
  // 2. Same major, highest lower minor, plain targets only.
  const DeviceCodeChoice* best = nullptr;
  DeviceCodeChoice candidate;
  for (const auto& [arch, file] : cubins) {
    if (arch.suffix || !cubin_runs_on(arch, plain) || arch.minor >= gpu.minor) continue;
    if (!best || arch.minor > candidate.arch.minor) {
      candidate = {DeviceCodeKind::kCubin, arch, file,
                   fmt::format("packaged cubin for {}, compatible with the GPU's {} (same major, "
                               "lower minor)",
                               arch.sm(), plain.sm())};
      best = &candidate;
    }
  }
  if (best) return candidate;
  // 3. NVRTC from source (nvrtc_target).
  if (!cuda_source.empty()) {
    const CudaArch target = nvrtc_target(gpu);
    return {DeviceCodeKind::kSource, target, cuda_source,
            fmt::format("no packaged cubin runs on {}: compiling {} with NVRTC for {}", plain.sm(),
                        cuda_source.filename().string(), target.sm())};
  }
  // 4. Nothing.
  std::string have;
  for (const auto& [arch, file] : cubins) have += (have.empty() ? "" : ", ") + arch.sm();
  DeviceCodeChoice none;
  none.kind = DeviceCodeKind::kNone;
  none.arch = plain;
  none.reason = fmt::format(
      "package {} has no device code for {} ({}): it has {} and no CUDA source; ask the "
      "publisher for a build with a cubin for {} (or a lower {}.x) or with cuda_source, or bind "
      "the cpu device",
      package_label, gpu_label, plain.sm(), have.empty() ? "no cubins" : "cubins for " + have,
      plain.sm(), gpu.major);
  return none;
}

}  // namespace kh
