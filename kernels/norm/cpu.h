// cpu implementation of the norm package: reference quality (fp32 math and accumulation,
// blocked sums for long rows), the same algorithm and rounding points as norm.cu, one thread.
// Pointers are element pointers of the tensor's dtype; strides are in elements.
#pragma once

#include <stdint.h>

namespace khk::norm_cpu {

// Rows of one tensor: base pointer and row stride (elements).
struct Rows {
  void* p = nullptr;
  int64_t stride = 0;
};
struct ConstRows {
  const void* p = nullptr;
  int64_t stride = 0;
};

// RMSNorm forward; with `residual` non-null, FusedAddRMSNorm: s = round(x + residual) is
// written to residual_out and normalized. rstd (fp32 per row) is written when non-null.
void rms_forward(int dtype, ConstRows x, ConstRows residual, const void* weight, Rows y,
                 Rows residual_out, float* rstd, int64_t rows, int64_t cols, float eps);

// LayerNorm forward; mean and rstd (fp32 per row) are written when non-null.
void layer_forward(int dtype, ConstRows x, const void* weight, const void* bias, Rows y,
                   float* mean, float* rstd, int64_t rows, int64_t cols, float eps);

// Weight-gradient partial sums: `walkers` rows of `ws_stride` floats (walker w owns rows
// w, w + walkers, ...), then reduced in walker order into dweight (and dbias).
struct Partials {
  float* ws = nullptr;
  int64_t ws_stride = 0;
  int64_t walkers = 0;  // >= 1 when rows > 0
};

// RMSNorm backward (x is the normalized input: for FusedAddRMSNorm the new residual; from_y: the
// forward's output instead, xhat = y / weight); with `dresidual` non-null its gradient is added
// to dx.
void rms_backward(int dtype, ConstRows dy, ConstRows x, const void* weight, const float* rstd,
                  ConstRows dresidual, Rows dx, void* dweight, Partials partials, int64_t rows,
                  int64_t cols, bool from_y = false);

void layer_backward(int dtype, ConstRows dy, ConstRows x, const void* weight, const float* mean,
                    const float* rstd, Rows dx, void* dweight, void* dbias, Partials partials,
                    int64_t rows, int64_t cols);

}  // namespace khk::norm_cpu
