#include "kernels/activation/cpu.h"

#include <math.h>  // expf, erfcf for act_math.h

#include "kernels/activation/act_math.h"
#include "kernels/common/tensor_args.h"

namespace khk::act_cpu {

namespace {

template <typename T>
void forward_t(int op, const void* xv, int64_t sx, void* yv, int64_t sy, int64_t rows, int64_t d) {
  const bool glu = kh_act_is_glu(op);
  for (int64_t r = 0; r < rows; ++r) {
    const T* x = static_cast<const T*>(xv) + r * sx;
    T* y = static_cast<T*>(yv) + r * sy;
    for (int64_t c = 0; c < d; ++c) {
      float v = kh_act(op, kh_to_float(x[c]));
      if (glu) v *= kh_to_float(x[d + c]);
      y[c] = kh_convert<T>::from_float(v);
    }
  }
}

template <typename T>
void backward_t(int op, const void* dyv, int64_t sdy, const void* xv, int64_t sx, void* dxv,
                int64_t sdx, int64_t rows, int64_t d, void* yv, int64_t sy) {
  const bool glu = kh_act_is_glu(op);
  for (int64_t r = 0; r < rows; ++r) {
    const T* dy = static_cast<const T*>(dyv) + r * sdy;
    const T* x = static_cast<const T*>(xv) + r * sx;
    T* dx = static_cast<T*>(dxv) + r * sdx;
    T* y = yv ? static_cast<T*>(yv) + r * sy : nullptr;
    for (int64_t c = 0; c < d; ++c) {
      const float g = kh_to_float(x[c]);
      const float e = kh_to_float(dy[c]);
      if (glu) {
        const float up = kh_to_float(x[d + c]);
        const float dgate = e * up * kh_dact(op, g);
        const float act = kh_act(op, g);
        dx[c] = kh_convert<T>::from_float(dgate);
        dx[d + c] = kh_convert<T>::from_float(e * act);
        if (y) y[c] = kh_convert<T>::from_float(act * up);
      } else {
        dx[c] = kh_convert<T>::from_float(e * kh_dact(op, g));
      }
    }
  }
}

}  // namespace

void forward(int op, int dtype, const void* x, int64_t sx, void* y, int64_t sy, int64_t rows,
             int64_t d) {
  switch (dtype) {
    case kBF16:
      return forward_t<kh_bf16>(op, x, sx, y, sy, rows, d);
    case kFP16:
      return forward_t<kh_fp16>(op, x, sx, y, sy, rows, d);
    default:
      return forward_t<float>(op, x, sx, y, sy, rows, d);
  }
}

void backward(int op, int dtype, const void* dy, int64_t sdy, const void* x, int64_t sx, void* dx,
              int64_t sdx, int64_t rows, int64_t d, void* y, int64_t sy) {
  switch (dtype) {
    case kBF16:
      return backward_t<kh_bf16>(op, dy, sdy, x, sx, dx, sdx, rows, d, y, sy);
    case kFP16:
      return backward_t<kh_fp16>(op, dy, sdy, x, sx, dx, sdx, rows, d, y, sy);
    default:
      return backward_t<float>(op, dy, sdy, x, sx, dx, sdx, rows, d, y, sy);
  }
}

}  // namespace khk::act_cpu
