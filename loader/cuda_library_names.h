// Where the loader looks for a CUDA library it opens with dlopen (NVRTC, cuBLASLt): the library
// or folder an environment variable names, then the CUDA 13 and 12 sonames on the loader's path,
// then the toolkit's default folder.
#pragma once

#include <string>
#include <vector>

namespace kh {

// `env_var` (a library path, or a folder holding STEM.so.13 / .so.12), then STEM.so.13,
// STEM.so.12 and /usr/local/cuda/lib64/STEM.so.{13,12}; e.g. ("KERNEL_HUB_NVRTC", "libnvrtc").
std::vector<std::string> cuda_library_candidates(const char* env_var, const std::string& stem);

}  // namespace kh
