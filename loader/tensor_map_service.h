// The tensor-map service (kernel_hub_abi.h, kh_tensor_map_t; ABI 1.3): encodes a TMA descriptor
// for a package (kh_host_v1_t.tensor_map), whose host code links no CUDA library and so cannot
// call cuTensorMapEncodeTiled itself. A request is read as far as its struct_size reaches,
// checked against the driver's documented rules (read_tensor_map: no device needed, so every
// rule is testable anywhere), then encoded through the driver (loader/cuda_driver.h).
#pragma once

#include <cstdint>
#include <string>

#include "kernel_hub/kernel_hub_abi.h"

namespace kh {

// struct_size of the first kh_tensor_map_t (ABI 1.3, through box): the smallest the loader takes.
constexpr uint32_t kTensorMapV1_3Size = 136;

// Copies *in into `out` as far as in->h.struct_size reaches (the rest of `out` is 0), then checks
// every field cuTensorMapEncodeTiled constrains: the ABI major (KH_ERR_ABI), struct_size,
// device_id, dtype, rank, swizzle, base (non-NULL, 16-byte aligned), dims, strides and box.
// KH_ERR_INVALID_ARGUMENT with `error` naming the field otherwise.
int32_t read_tensor_map(const kh_tensor_map_t* in, kh_tensor_map_t& out, std::string& error);

// Checks `map` (non-NULL, 64-byte aligned) and the request, then encodes the descriptor into the
// KH_TENSOR_MAP_BYTES at `map` on success (untouched otherwise). KH_ERR_NO_DEVICE without a
// driver or without device req->device_id, KH_ERR_LAUNCH when the driver refuses. Never throws:
// `error` receives the message.
int32_t encode_tensor_map(const kh_tensor_map_t* req, void* map, std::string& error) noexcept;

}  // namespace kh
