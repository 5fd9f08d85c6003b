// An A100's answer to the device-info service (ABI 1.4), for tests that stand a backend in for a
// GPU whose SMs differ from the H100/H200 that packages assume without the service.
#pragma once

#include <cstdint>

#include "kernel_hub/kernel_hub_abi.h"

namespace kh::test {

inline kh_device_info_t a100_device_info() {
  kh_device_info_t info{};
  info.h = KH_HEADER_INIT(kh_device_info_t);
  info.sm_major = 8;
  info.sm_minor = 0;
  info.multiprocessors = 108;
  info.max_threads_per_multiprocessor = 2048;
  info.registers_per_multiprocessor = 65536;
  info.shared_memory_per_multiprocessor = 164 * 1024;
  info.shared_memory_per_block_optin = 163 * 1024;
  info.shared_memory_reserved_per_block = 1024;
  info.total_memory = int64_t{80} << 30;
  return info;
}

}  // namespace kh::test
