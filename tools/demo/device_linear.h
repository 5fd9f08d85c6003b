// The GPU-resident runtime's Linear on the GEMM service (kh::gemm: cuBLASLt on a CUDA device,
// fp32 accumulation): W is [out, in] as nn.Linear and Transformers checkpoints store it.
//
//   forward   y[rows, out]  = x[rows, in] . W^T
//   backward  dx[rows, in]  = dy[rows, out] . W        (or += with accumulate_dx)
//             dW[out, in]  += dy^T . x                  (fp32 gradients of the master weights)
//
// The requests are built by plain functions (no device needed), so the row-major mapping is
// tested on the CPU through the same service with device_id -1 (host pointers).
#pragma once

#include <cstdint>

#include "kernel_hub/kernel_hub.hpp"
#include "tools/demo/device_tensor.h"

namespace kh::demo {

struct LinearShape {
  int64_t rows = 0, in = 0, out = 0;
};

// The GEMM requests (device < 0: host pointers). dtype_* are KH_DTYPE_* codes; activations and
// weights share dtype_ab; dW is always fp32.
kh_gemm_t linear_forward_gemm(int device, uint32_t dtype_ab, const LinearShape& s, const void* x,
                              const void* w, void* y);
kh_gemm_t linear_dx_gemm(int device, uint32_t dtype_ab, const LinearShape& s, const void* dy,
                         const void* w, void* dx, bool accumulate);
kh_gemm_t linear_dw_gemm(int device, uint32_t dtype_ab, const LinearShape& s, const void* dy,
                         const void* x, float* dw, bool accumulate = true);

// On device tensors, ordered on `stream`. Shapes and dtypes are checked (kh::Error
// kInvalidInput naming the tensor); a GEMM failure throws with the service's message.
void linear_forward(DeviceStream& stream, const DeviceTensor& x, const DeviceTensor& w,
                    DeviceTensor& y);
// dx and dw may each be null (not needed: the embedding input has no dx, frozen weights no dw).
// accumulate_dw false: dW = dy^T . x, overwritten (a gradient zero in value, not in memory).
void linear_backward(DeviceStream& stream, const DeviceTensor& x, const DeviceTensor& w,
                     const DeviceTensor& dy, DeviceTensor* dx, DeviceTensor* dw,
                     bool accumulate_dx = false, bool accumulate_dw = true);

}  // namespace kh::demo
