// The device-info service (kernel_hub_abi.h, kh_device_info_t; ABI 1.4): what a package's host
// code plans launches by (multiprocessors, what one holds), which it cannot ask the driver for
// because it links no CUDA library. The answer comes from the installed device backend
// (loader/host_services.h), so a test backend can stand in for a GPU.
#pragma once

#include <cstdint>
#include <string>

#include "kernel_hub/kernel_hub_abi.h"

namespace kh {

// struct_size of the first kh_device_info_t (ABI 1.4, through total_memory): the smallest the
// loader takes.
constexpr uint32_t kDeviceInfoV1_4Size = 64;

// Checks `info` (non-NULL, ABI major, struct_size), asks the installed backend for device
// `device_id` and writes the fields this loader knows into *info, up to its struct_size; the
// header and any later fields stay as the caller left them, and nothing is written on failure.
// KH_ERR_INVALID_ARGUMENT / KH_ERR_ABI for a bad struct, KH_ERR_NO_DEVICE without a backend or
// without that device. Never throws: `error` receives the message.
int32_t query_device_info(int32_t device_id, kh_device_info_t* info, std::string& error) noexcept;

// The same from `backend` (nullptr: none; the embedder's kh_device_get_info asks the CUDA
// backend itself, which needs no runtime first).
class DeviceBackend;
int32_t query_device_info(DeviceBackend* backend, int32_t device_id, kh_device_info_t* info,
                          std::string& error) noexcept;

}  // namespace kh
