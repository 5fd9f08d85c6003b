// The tensor-map request both tensor-map tests start from (the CPU validation test and the GPU
// encode test): a bf16 [rows, 128] tensor at `base` with 64 x 64 boxes and the 128-byte swizzle
// (box[0] * 2 bytes = 128), the attention kernels' shape.
#pragma once

#include <cstdint>

#include "kernel_hub/kernel_hub_abi.h"

namespace kh::test {

inline kh_tensor_map_t bf16_tensor_map_request(const void* base, uint64_t rows) {
  kh_tensor_map_t t{};
  t.h = KH_HEADER_INIT(kh_tensor_map_t);
  t.device_id = 0;
  t.dtype = KH_DTYPE_BF16;
  t.rank = 2;
  t.swizzle_bytes = 128;
  t.base = base;
  t.dims[0] = 128;
  t.dims[1] = rows;
  t.strides[1] = 128 * 2;
  t.box[0] = 64;
  t.box[1] = 64;
  return t;
}

}  // namespace kh::test
