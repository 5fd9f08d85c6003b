// A device kernel the loader hands out (host->get_function for packages,
// kh_device_module_get_function for embedders) and the one launch path both go through: the
// kh_launch_cfg_t rules of launch_config.h, then cuLaunchKernel or cuLaunchKernelEx in the
// function's primary context, with the function attributes a launch needs (dynamic shared memory
// above 48 KiB, non-portable cluster sizes) set on first use.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "kernel_hub/kernel_hub_abi.h"
#include "loader/cuda_driver.h"

namespace kh {

constexpr uint64_t kDeviceFunctionMagic = 0x6b682d636f646531ull;  // "kh-code1"

struct DeviceFunction {
  uint64_t magic = kDeviceFunctionMagic;
  cuda::CUfunction function = nullptr;
  cuda::CUkernel kernel = nullptr;
  cuda::CUcontext context = nullptr;
  int device = -1;
  int sm_major = 0;  // of the device: clusters and PDL need 9
  std::string name;
  // CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED set (the first launch with a cluster of
  // more than 8 blocks sets it).
  std::atomic<bool> non_portable_cluster{false};
  // The dynamic shared memory the function was allowed past the default 48 KiB
  // (CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES), raised on the first launch that asks.
  static constexpr uint32_t kDefaultDynamicSmem = 48 * 1024;
  std::atomic<uint32_t> max_dynamic_smem{kDefaultDynamicSmem};
};

// Looks up kernel `name` (its extern "C" __global__ name) in `library` for CUDA device `device`
// (whose primary context is `context`) into `out`. KH_ERR_NOT_FOUND when the library has no
// such kernel (`where` describes the library in the message), KH_ERR_INTERNAL on a driver
// failure.
int32_t find_device_function(cuda::CUlibrary library, cuda::CUcontext context, int device,
                             const std::string& name, const std::string& where, DeviceFunction& out,
                             std::string& error);

// Launches `f` with a cfg already read by read_launch_cfg (launch_config.h) on `stream`.
// KH_ERR_INVALID_ARGUMENT: not a DeviceFunction, or cfg.device_id is not the function's device;
// KH_ERR_LAUNCH: what the device or the driver refuses. Never synchronizes.
int32_t launch_device_function(void* f, const kh_launch_cfg_t& cfg, void** args, void* stream,
                               std::string& error);

}  // namespace kh
