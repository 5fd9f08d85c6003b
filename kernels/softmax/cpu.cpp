#include "kernels/softmax/cpu.h"

#include <math.h>  // expf, logf for softmax_math.h

#include "kernels/common/kh_prelude.cuh"
#include "kernels/common/tensor_args.h"
#include "kernels/softmax/softmax_math.h"

namespace khk::softmax_cpu {

namespace {

// Partials of kChunk elements merged in order: a serial fp32 sum over a 128K row would lose
// ~1e-4 relative; chunks keep the error near the device's tree reduction.
constexpr int64_t kChunk = 256;

template <typename T>
void stats(const T* x, int64_t cols, float* m, float* s) {
  float mm = KH_SM_NEG_INF, ss = 0.f;
  for (int64_t c0 = 0; c0 < cols; c0 += kChunk) {
    float cm = KH_SM_NEG_INF, cs = 0.f;
    for (int64_t c = c0; c < cols && c < c0 + kChunk; ++c) {
      const float a[1] = {kh_to_float(x[c])};
      kh_sm_accumulate<1>(cm, cs, a);
    }
    kh_sm_merge(mm, ss, cm, cs);
  }
  *m = mm;
  *s = ss;
}

template <typename T>
void forward_t(const void* xv, int64_t sx, void* yv, int64_t sy, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* x = static_cast<const T*>(xv) + r * sx;
    T* y = static_cast<T*>(yv) + r * sy;
    float m, s;
    stats(x, cols, &m, &s);
    const float inv = 1.f / s;
    for (int64_t c = 0; c < cols; ++c)
      y[c] = kh_convert<T>::from_float(expf(kh_to_float(x[c]) - m) * inv);
  }
}

template <typename T>
void backward_t(const void* dyv, int64_t sdy, const void* yv, int64_t sy, void* dxv, int64_t sdx,
                int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* dy = static_cast<const T*>(dyv) + r * sdy;
    const T* y = static_cast<const T*>(yv) + r * sy;
    T* dx = static_cast<T*>(dxv) + r * sdx;
    float dot = 0.f;
    for (int64_t c0 = 0; c0 < cols; c0 += kChunk) {
      float part = 0.f;
      for (int64_t c = c0; c < cols && c < c0 + kChunk; ++c)
        part += kh_to_float(dy[c]) * kh_to_float(y[c]);
      dot += part;
    }
    for (int64_t c = 0; c < cols; ++c)
      dx[c] = kh_convert<T>::from_float(kh_to_float(y[c]) * (kh_to_float(dy[c]) - dot));
  }
}

template <typename T>
void ce_forward_t(const void* xv, int64_t sx, const int64_t* targets, int64_t ignore_index,
                  float* loss, void* dxv, int64_t sdx, float scale, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    const T* x = static_cast<const T*>(xv) + r * sx;
    T* dx = dxv ? static_cast<T*>(dxv) + r * sdx : nullptr;
    const int64_t t = targets[r];
    if (t == ignore_index) {
      loss[r] = 0.f;
      if (dx)
        for (int64_t c = 0; c < cols; ++c) dx[c] = kh_convert<T>::from_float(0.f);
      continue;
    }
    float m, s;
    stats(x, cols, &m, &s);
    const bool in_range = t >= 0 && t < cols;
    loss[r] = in_range ? (m + logf(s)) - kh_to_float(x[t]) : __builtin_nanf("");
    if (!dx) continue;
    const float inv = 1.f / s;
    for (int64_t c = 0; c < cols; ++c) {
      const float p = expf(kh_to_float(x[c]) - m) * inv;
      dx[c] = kh_convert<T>::from_float((p - (c == t ? 1.f : 0.f)) * scale);
    }
  }
}

template <typename T>
void ce_backward_t(const float* dloss, void* dxv, int64_t sdx, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    T* dx = static_cast<T*>(dxv) + r * sdx;
    for (int64_t c = 0; c < cols; ++c)
      dx[c] = kh_convert<T>::from_float(kh_to_float(dx[c]) * dloss[r]);
  }
}

}  // namespace

void forward(int dtype, const void* x, int64_t sx, void* y, int64_t sy, int64_t rows,
             int64_t cols) {
  switch (dtype) {
    case kBF16:
      return forward_t<kh_bf16>(x, sx, y, sy, rows, cols);
    case kFP16:
      return forward_t<kh_fp16>(x, sx, y, sy, rows, cols);
    default:
      return forward_t<float>(x, sx, y, sy, rows, cols);
  }
}

void backward(int dtype, const void* dy, int64_t sdy, const void* y, int64_t sy, void* dx,
              int64_t sdx, int64_t rows, int64_t cols) {
  switch (dtype) {
    case kBF16:
      return backward_t<kh_bf16>(dy, sdy, y, sy, dx, sdx, rows, cols);
    case kFP16:
      return backward_t<kh_fp16>(dy, sdy, y, sy, dx, sdx, rows, cols);
    default:
      return backward_t<float>(dy, sdy, y, sy, dx, sdx, rows, cols);
  }
}

void ce_forward(int dtype, const void* x, int64_t sx, const int64_t* targets, int64_t ignore_index,
                float* loss, void* dx, int64_t sdx, float scale, int64_t rows, int64_t cols) {
  switch (dtype) {
    case kBF16:
      return ce_forward_t<kh_bf16>(x, sx, targets, ignore_index, loss, dx, sdx, scale, rows, cols);
    case kFP16:
      return ce_forward_t<kh_fp16>(x, sx, targets, ignore_index, loss, dx, sdx, scale, rows, cols);
    default:
      return ce_forward_t<float>(x, sx, targets, ignore_index, loss, dx, sdx, scale, rows, cols);
  }
}

void ce_backward(int dtype, const float* dloss, void* dx, int64_t sdx, int64_t rows, int64_t cols) {
  switch (dtype) {
    case kBF16:
      return ce_backward_t<kh_bf16>(dloss, dx, sdx, rows, cols);
    case kFP16:
      return ce_backward_t<kh_fp16>(dloss, dx, sdx, rows, cols);
    default:
      return ce_backward_t<float>(dloss, dx, sdx, rows, cols);
  }
}

namespace {
template <typename T>
void scale_rows_t(void* xv, int64_t sx, int64_t rows, int64_t cols, float factor, bool zero) {
  for (int64_t r = 0; r < rows; ++r) {
    T* x = static_cast<T*>(xv) + r * sx;
    for (int64_t c = 0; c < cols; ++c)
      x[c] = kh_convert<T>::from_float(zero ? 0.f : kh_to_float(x[c]) * factor);
  }
}
}  // namespace

void scale_rows(int dtype, void* x, int64_t sx, int64_t rows, int64_t cols, float factor,
                bool zero) {
  if (dtype == kBF16)
    scale_rows_t<kh_bf16>(x, sx, rows, cols, factor, zero);
  else if (dtype == kFP16)
    scale_rows_t<kh_fp16>(x, sx, rows, cols, factor, zero);
  else
    scale_rows_t<float>(x, sx, rows, cols, factor, zero);
}

}  // namespace khk::softmax_cpu
