// NVRTC, loaded lazily with dlopen (libnvrtc.so.13, then .12; also /usr/local/cuda/lib64 and the
// KERNEL_HUB_NVRTC path), so the build needs no CUDA toolkit and a machine without NVRTC still
// runs cpu kernels and packaged cubins. NVRTC needs no GPU: compiling works on any machine.
//
// KERNEL_HUB_NVRTC: a libnvrtc .so file, or a directory holding libnvrtc.so.13 / .so.12 (for
// example the nvidia-cuda-nvrtc wheel's lib folder), tried first.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "loader/cuda_arch.h"

namespace kh {

struct NvrtcVersion {
  int major = 0;
  int minor = 0;
  std::string str() const { return std::to_string(major) + "." + std::to_string(minor); }
  bool at_least(int maj, int min) const { return major > maj || (major == maj && minor >= min); }
};

struct NvrtcInfo {
  NvrtcVersion version;
  std::string library;     // what was dlopen'ed
  std::vector<int> archs;  // supported sm numbers (e.g. 75, 80, 90), empty when unknown
};

// Loads NVRTC on first use (std::call_once; a failure is remembered). Throws kh::Error
// (kNotFound) listing every place tried and what to install.
const NvrtcInfo& nvrtc();

// The options the loader compiles with for `arch`: --gpu-architecture=sm_XY[a], --std=c++17,
// -default-device, --modify-stack-limit=false (long-lived processes) and --no-cache where
// NVRTC >= 12.9 has its own cache (ours must be the only one). Sorted, as the cache key wants.
std::vector<std::string> nvrtc_options(const CudaArch& arch, const NvrtcVersion& version);

// Compiles `source` (named `file_name` in diagnostics, e.g. "toy.cu") into a cubin with
// `options`. On failure throws kh::Error(kInvalidInput) whose message holds `display_path`,
// the target and NVRTC's log (with file(line) positions). At most 8 compiles run at once in a
// process (each holds hundreds of MB).
std::string nvrtc_compile_cubin(std::string_view source, const std::string& file_name,
                                const std::vector<std::string>& options,
                                const std::string& display_path);

}  // namespace kh
