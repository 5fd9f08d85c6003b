// The GPU suites' device check: null when a CUDA device is usable, else why not (the loader's
// message), for GTEST_SKIP. Kept for the suite's life (the suites keep it in a static).
#pragma once

#include <cstdint>
#include <string>

#include "kernel_hub/kernel_hub.hpp"

namespace kh::gpu_test {

inline std::string* no_cuda_device() {
  int32_t n = 0;
  if (kh_device_count(&n) == KH_OK && n >= 1) return nullptr;
  return new std::string(n < 1 && kh_last_error()[0] == '\0' ? "no CUDA device" : kh_last_error());
}

}  // namespace kh::gpu_test
