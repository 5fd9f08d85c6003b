#include "kernels/rotary/cpu.h"

#include <math.h>

#include <vector>

#include "kernels/common/kh_prelude.cuh"
#include "kernels/common/tensor_args.h"
#include "kernels/rotary/rope_math.h"

namespace khk::rope_cpu {

namespace {

template <typename T, typename C>
void heads_t(const Heads& x, int64_t t, bool neox, const C* cr, const C* sr, int half, float sign) {
  for (int64_t h = 0; h < x.heads; ++h) {
    T* xh = static_cast<T*>(x.data) + t * x.token_stride + h * x.head_stride;
    for (int j = 0; j < half; ++j) {
      const int a = kh_rope_first(neox, j), b = kh_rope_second(neox, j, half);
      float o1, o2;
      kh_rope_rotate(kh_to_float(xh[a]), kh_to_float(xh[b]), kh_to_float(cr[j]),
                     sign * kh_to_float(sr[j]), &o1, &o2);
      xh[a] = kh_convert<T>::from_float(o1);
      xh[b] = kh_convert<T>::from_float(o2);
    }
  }
}

template <typename T, typename C>
void apply_t(bool neox, const int64_t* positions, int64_t tokens, const Heads& q, const Heads& k,
             const Cache& cos, const Cache& sin, int64_t max_pos, int half, float sign) {
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t pos = positions[t];
    if (pos < 0 || pos >= max_pos) continue;
    const C* cr = static_cast<const C*>(cos.data) + pos * cos.stride;
    const C* sr = static_cast<const C*>(sin.data) + pos * sin.stride;
    heads_t<T, C>(q, t, neox, cr, sr, half, sign);
    if (k.data) heads_t<T, C>(k, t, neox, cr, sr, half, sign);
  }
}

// A head row's 1 / sqrt(mean(x^2) + eps).
template <typename T>
float row_rstd(const T* xh, int64_t head_dim, float eps) {
  float ss = 0.f;
  for (int64_t e = 0; e < head_dim; ++e) ss += kh_to_float(xh[e]) * kh_to_float(xh[e]);
  return 1.0f / sqrtf(ss / static_cast<float>(head_dim) + eps);
}

template <typename T>
void norm_heads(const Heads& x, int64_t tokens, int64_t head_dim, const T* w, float eps) {
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t h = 0; h < x.heads; ++h) {
      T* xh = static_cast<T*>(x.data) + t * x.token_stride + h * x.head_stride;
      const float rstd = row_rstd(xh, head_dim, eps);
      for (int64_t e = 0; e < head_dim; ++e)
        xh[e] = kh_convert<T>::from_float(kh_to_float(xh[e]) * rstd * kh_to_float(w[e]));
    }
}

template <typename T>
void rstd_heads(const Heads& x, int64_t tokens, int64_t head_dim, float eps, float* rstd) {
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t h = 0; h < x.heads; ++h)
      rstd[t * x.heads + h] = row_rstd(
          static_cast<const T*>(x.data) + t * x.token_stride + h * x.head_stride, head_dim, eps);
}

template <typename T>
void qk_norm_t(int64_t tokens, int64_t head_dim, const Heads& q, const void* qw, const Heads& k,
               const void* kw, float eps) {
  norm_heads<T>(q, tokens, head_dim, static_cast<const T*>(qw), eps);
  if (k.data) norm_heads<T>(k, tokens, head_dim, static_cast<const T*>(kw), eps);
}

template <typename T, typename C>
void qk_norm_backward_t(bool neox, const int64_t* positions, int64_t tokens, int64_t head_dim,
                        const Cache& cos, const Cache& sin, int64_t max_pos, int half, float eps,
                        const NormGrad& g) {
  const T* w = static_cast<const T*>(g.w);
  std::vector<double> dw(head_dim, 0.0);
  std::vector<float> x(head_dim), d(head_dim);
  const float inv_n = 1.0f / static_cast<float>(head_dim);
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t pos = positions[t];
    const bool rotate = pos >= 0 && pos < max_pos;
    const C* cr = static_cast<const C*>(cos.data) + (rotate ? pos : 0) * cos.stride;
    const C* sr = static_cast<const C*>(sin.data) + (rotate ? pos : 0) * sin.stride;
    for (int64_t h = 0; h < g.heads; ++h) {
      const T* xs = static_cast<const T*>(g.in) + t * g.in_t + h * g.in_h;
      const T* ds = static_cast<const T*>(g.d) + t * g.d_t + h * g.d_h;
      float ss = 0.f;
      for (int64_t e = 0; e < head_dim; ++e) {
        x[e] = kh_to_float(xs[e]);
        d[e] = kh_to_float(ds[e]);
        ss += x[e] * x[e];
      }
      for (int j = 0; rotate && j < half; ++j) {
        const int a = kh_rope_first(neox, j), b = kh_rope_second(neox, j, half);
        kh_rope_rotate(d[a], d[b], kh_to_float(cr[j]), -kh_to_float(sr[j]), &d[a], &d[b]);
        if (g.rstd)  // x is the forward's output: rotated back to xhat * w
          kh_rope_rotate(x[a], x[b], kh_to_float(cr[j]), -kh_to_float(sr[j]), &x[a], &x[b]);
      }
      float rstd = 1.0f / sqrtf(ss * inv_n + eps);
      if (g.rstd) {  // x from here on is the input scaled so that x * rstd = xhat
        rstd = g.rstd[t * g.heads + h];
        for (int64_t e = 0; e < head_dim; ++e) {
          const float we = kh_to_float(w[e]);
          x[e] = x[e] / (fabsf(we) < KH_FLT_MIN ? 1.f : we) / rstd;  // where w is 0, the output
        }
      }
      float sgx = 0.f;
      for (int64_t e = 0; e < head_dim; ++e) sgx += d[e] * kh_to_float(w[e]) * x[e] * rstd;
      const float c1 = sgx * inv_n;
      T* out = static_cast<T*>(g.out) + t * g.out_t + h * g.out_h;
      for (int64_t e = 0; e < head_dim; ++e) {
        const float xhat = x[e] * rstd;
        out[e] = kh_convert<T>::from_float(rstd * (d[e] * kh_to_float(w[e]) - xhat * c1));
        dw[e] += static_cast<double>(d[e]) * xhat;
      }
    }
  }
  for (int64_t e = 0; e < head_dim; ++e)
    static_cast<T*>(g.dw)[e] = kh_convert<T>::from_float(static_cast<float>(dw[e]));
}

// f(T{}, C{}) with T the storage type of `dtype` and C the cache's: float for an fp32 cache,
// else T (an fp32 tensor always has an fp32 cache).
template <typename F>
void with_types(int dtype, int cache_dtype, F&& f) {
  const bool f32 = cache_dtype == kFP32;
  switch (dtype) {
    case kBF16:
      return f32 ? f(kh_bf16{}, float{}) : f(kh_bf16{}, kh_bf16{});
    case kFP16:
      return f32 ? f(kh_fp16{}, float{}) : f(kh_fp16{}, kh_fp16{});
    default:
      return f(float{}, float{});
  }
}

}  // namespace

void qk_norm_backward(int dtype, int cache_dtype, bool neox, const int64_t* positions,
                      int64_t tokens, int64_t head_dim, const Cache& cos, const Cache& sin,
                      int64_t max_pos, int half, float eps, const NormGrad& g) {
  with_types(dtype, cache_dtype, [&](auto t, auto c) {
    qk_norm_backward_t<decltype(t), decltype(c)>(neox, positions, tokens, head_dim, cos, sin,
                                                 max_pos, half, eps, g);
  });
}

void qk_rstd(int dtype, int64_t tokens, int64_t head_dim, const Heads& x, float eps, float* rstd) {
  with_types(dtype, dtype,
             [&](auto t, auto) { rstd_heads<decltype(t)>(x, tokens, head_dim, eps, rstd); });
}

void qk_norm(int dtype, int64_t tokens, int64_t head_dim, const Heads& q, const void* qw,
             const Heads& k, const void* kw, float eps) {
  switch (dtype) {
    case kBF16:
      return qk_norm_t<kh_bf16>(tokens, head_dim, q, qw, k, kw, eps);
    case kFP16:
      return qk_norm_t<kh_fp16>(tokens, head_dim, q, qw, k, kw, eps);
    default:
      return qk_norm_t<float>(tokens, head_dim, q, qw, k, kw, eps);
  }
}

void apply(int dtype, int cache_dtype, bool neox, const int64_t* positions, int64_t tokens,
           const Heads& q, const Heads& k, const Cache& cos, const Cache& sin, int64_t max_pos,
           int half, float sign) {
  with_types(dtype, cache_dtype, [&](auto t, auto c) {
    apply_t<decltype(t), decltype(c)>(neox, positions, tokens, q, k, cos, sin, max_pos, half, sign);
  });
}

}  // namespace khk::rope_cpu
