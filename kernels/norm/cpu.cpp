#include "kernels/norm/cpu.h"

#include <math.h>

#include "kernels/common/kh_prelude.cuh"
#include "kernels/common/tensor_args.h"

namespace khk::norm_cpu {

namespace {

// fp32 sum in blocks of 256 terms: the error grows with the block count, not the row length,
// so rows of 65536+ keep fp32 results within a few ulp.
struct BlockedSum {
  float total = 0.f, block = 0.f;
  int count = 0;
  void add(float v) {
    block += v;
    if (++count == 256) {
      total += block;
      block = 0.f;
      count = 0;
    }
  }
  float get() const { return total + block; }
};

template <typename T>
const T* row_of(ConstRows r, int64_t i) {
  return static_cast<const T*>(r.p) + i * r.stride;
}
template <typename T>
T* row_of(Rows r, int64_t i) {
  return static_cast<T*>(r.p) + i * r.stride;
}
template <typename T>
T from_float(float f) {
  return kh_convert<T>::from_float(f);
}

template <typename T>
void rms_forward_t(ConstRows x, ConstRows residual, const void* weight, Rows y, Rows residual_out,
                   float* rstd_out, int64_t rows, int64_t cols, float eps) {
  const T* w = static_cast<const T*>(weight);
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = row_of<T>(x, r);
    BlockedSum ss;
    if (residual.p) {
      const T* rr = row_of<T>(residual, r);
      T* so = row_of<T>(residual_out, r);
      for (int64_t c = 0; c < cols; ++c) {
        // The stored residual is rounded to T; the norm is taken of what was stored.
        T s = from_float<T>(kh_to_float(xr[c]) + kh_to_float(rr[c]));
        so[c] = s;
        float v = kh_to_float(s);
        ss.add(v * v);
      }
      xr = so;
    } else {
      for (int64_t c = 0; c < cols; ++c) {
        float v = kh_to_float(xr[c]);
        ss.add(v * v);
      }
    }
    const float rstd = 1.0f / sqrtf(ss.get() / static_cast<float>(cols) + eps);
    if (rstd_out) rstd_out[r] = rstd;
    T* yr = row_of<T>(y, r);
    for (int64_t c = 0; c < cols; ++c)
      yr[c] = from_float<T>(kh_to_float(xr[c]) * rstd * kh_to_float(w[c]));
  }
}

template <typename T>
void layer_forward_t(ConstRows x, const void* weight, const void* bias, Rows y, float* mean_out,
                     float* rstd_out, int64_t rows, int64_t cols, float eps) {
  const T* w = static_cast<const T*>(weight);
  const T* b = static_cast<const T*>(bias);
  const float inv_n = 1.0f / static_cast<float>(cols);
  for (int64_t r = 0; r < rows; ++r) {
    const T* xr = row_of<T>(x, r);
    BlockedSum s1;
    for (int64_t c = 0; c < cols; ++c) s1.add(kh_to_float(xr[c]));
    const float mean = s1.get() * inv_n;
    // Two passes (mean, then squared deviations): no cancellation for rows with a large mean.
    BlockedSum s2;
    for (int64_t c = 0; c < cols; ++c) {
      float d = kh_to_float(xr[c]) - mean;
      s2.add(d * d);
    }
    const float rstd = 1.0f / sqrtf(s2.get() * inv_n + eps);
    if (mean_out) mean_out[r] = mean;
    if (rstd_out) rstd_out[r] = rstd;
    T* yr = row_of<T>(y, r);
    for (int64_t c = 0; c < cols; ++c)
      yr[c] =
          from_float<T>((kh_to_float(xr[c]) - mean) * rstd * kh_to_float(w[c]) + kh_to_float(b[c]));
  }
}

// Shared backward: mean == nullptr for RMSNorm. K = 1 (dweight) or 2 (dweight, dbias). from_y
// (RMSNorm): x holds the forward's output y = xhat * w, and xhat = y / w (y, 0, where w is 0).
template <typename T>
void backward_t(ConstRows dy, ConstRows x, const void* weight, const float* mean, const float* rstd,
                ConstRows dresidual, Rows dx, void* dweight, void* dbias, Partials pt, int64_t rows,
                int64_t cols, bool from_y) {
  const T* w = static_cast<const T*>(weight);
  const bool ln = mean != nullptr;
  const float inv_n = 1.0f / static_cast<float>(cols);
  const int64_t walkers = rows < pt.walkers ? rows : pt.walkers;
  for (int64_t k = 0; k < walkers; ++k) {
    float* part = pt.ws + k * pt.ws_stride;
    for (int64_t c = 0; c < (ln ? 2 : 1) * cols; ++c) part[c] = 0.f;
    for (int64_t r = k; r < rows; r += walkers) {
      const T* dyr = row_of<T>(dy, r);
      const T* xr = row_of<T>(x, r);
      const float mu = ln ? mean[r] : 0.f;
      const float rs = rstd[r];
      auto xhat_of = [&](int64_t c) {
        const float f = kh_to_float(xr[c]), wc = kh_to_float(w[c]);
        if (from_y) return f / (fabsf(wc) < KH_FLT_MIN ? 1.f : wc);  // y = 0 where w is 0
        return (f - mu) * rs;
      };
      BlockedSum sum_gx, sum_g;
      for (int64_t c = 0; c < cols; ++c) {
        float xhat = xhat_of(c);
        float g = kh_to_float(dyr[c]) * kh_to_float(w[c]);
        sum_gx.add(g * xhat);
        if (ln) sum_g.add(g);
      }
      const float c1 = sum_gx.get() * inv_n;
      const float c2 = ln ? sum_g.get() * inv_n : 0.f;
      T* dxr = row_of<T>(dx, r);
      const T* dres = dresidual.p ? row_of<T>(dresidual, r) : nullptr;
      for (int64_t c = 0; c < cols; ++c) {
        float d = kh_to_float(dyr[c]);
        float xhat = xhat_of(c);
        float g = d * kh_to_float(w[c]);
        float v = rs * (g - xhat * c1 - c2);
        if (dres) v += kh_to_float(dres[c]);
        dxr[c] = from_float<T>(v);
        part[c] += d * xhat;
        if (ln) part[cols + c] += d;
      }
    }
  }
  T* dw = static_cast<T*>(dweight);
  T* db = static_cast<T*>(dbias);
  for (int64_t c = 0; c < cols; ++c) {
    float sw = 0.f, sb = 0.f;
    for (int64_t k = 0; k < walkers; ++k) {
      sw += pt.ws[k * pt.ws_stride + c];
      if (ln) sb += pt.ws[k * pt.ws_stride + cols + c];
    }
    dw[c] = from_float<T>(sw);
    if (ln) db[c] = from_float<T>(sb);
  }
}

}  // namespace

#define KH_DISPATCH(dtype, fn, ...) \
  switch (dtype) {                  \
    case kBF16:                     \
      fn<kh_bf16>(__VA_ARGS__);     \
      break;                        \
    case kFP16:                     \
      fn<kh_fp16>(__VA_ARGS__);     \
      break;                        \
    default:                        \
      fn<float>(__VA_ARGS__);       \
      break;                        \
  }

void rms_forward(int dtype, ConstRows x, ConstRows residual, const void* weight, Rows y,
                 Rows residual_out, float* rstd, int64_t rows, int64_t cols, float eps) {
  KH_DISPATCH(dtype, rms_forward_t, x, residual, weight, y, residual_out, rstd, rows, cols, eps);
}

void layer_forward(int dtype, ConstRows x, const void* weight, const void* bias, Rows y,
                   float* mean, float* rstd, int64_t rows, int64_t cols, float eps) {
  KH_DISPATCH(dtype, layer_forward_t, x, weight, bias, y, mean, rstd, rows, cols, eps);
}

void rms_backward(int dtype, ConstRows dy, ConstRows x, const void* weight, const float* rstd,
                  ConstRows dresidual, Rows dx, void* dweight, Partials partials, int64_t rows,
                  int64_t cols, bool from_y) {
  KH_DISPATCH(dtype, backward_t, dy, x, weight, nullptr, rstd, dresidual, dx, dweight, nullptr,
              partials, rows, cols, from_y);
}

void layer_backward(int dtype, ConstRows dy, ConstRows x, const void* weight, const float* mean,
                    const float* rstd, Rows dx, void* dweight, void* dbias, Partials partials,
                    int64_t rows, int64_t cols) {
  KH_DISPATCH(dtype, backward_t, dy, x, weight, mean, rstd, ConstRows{}, dx, dweight, dbias,
              partials, rows, cols, false);
}

}  // namespace khk::norm_cpu
