#include "loader/device_info_service.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "loader/abi_request.h"
#include "loader/host_services.h"

namespace kh {

static_assert(sizeof(kh_device_info_t) == kDeviceInfoV1_4Size,
              "kh_device_info_t of ABI 1.4 is 64 bytes");

int32_t query_device_info(DeviceBackend* backend, int32_t device_id, kh_device_info_t* info,
                          std::string& error) noexcept {
  try {
    kh_device_info_t checked;
    if (int32_t status =
            read_abi_request(info, checked, kDeviceInfoV1_4Size, "kh_device_info_t", "1.4", error);
        status != KH_OK)
      return status;
    if (!backend) {
      error = fmt::format(
          "no device backend yet: this loader build cannot see CUDA device {}; plan for cpu "
          "tensors instead",
          device_id);
      return KH_ERR_NO_DEVICE;
    }
    kh_device_info_t answer{};
    answer.h = KH_HEADER_INIT(kh_device_info_t);
    if (int32_t status = backend->device_info(device_id, answer, error); status != KH_OK)
      return status;
    // Past the header, as far as the caller's struct reaches.
    const size_t end = std::min<size_t>(info->h.struct_size, sizeof(kh_device_info_t));
    std::memcpy(reinterpret_cast<char*>(info) + sizeof(kh_header_t),
                reinterpret_cast<const char*>(&answer) + sizeof(kh_header_t),
                end - sizeof(kh_header_t));
    return KH_OK;
  } catch (const std::exception& e) {
    error = fmt::format("device_info(device {}): {}", device_id, e.what());
    return KH_ERR_INTERNAL;
  }
}

int32_t query_device_info(int32_t device_id, kh_device_info_t* info, std::string& error) noexcept {
  return query_device_info(device_backend(), device_id, info, error);
}

}  // namespace kh
