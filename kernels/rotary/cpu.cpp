#include "kernels/rotary/cpu.h"

#include <math.h>

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

template <typename T>
void norm_heads(const Heads& x, int64_t tokens, int64_t head_dim, const T* w, float eps) {
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t h = 0; h < x.heads; ++h) {
      T* xh = static_cast<T*>(x.data) + t * x.token_stride + h * x.head_stride;
      float ss = 0.f;
      for (int64_t e = 0; e < head_dim; ++e) ss += kh_to_float(xh[e]) * kh_to_float(xh[e]);
      const float rstd = 1.0f / sqrtf(ss / static_cast<float>(head_dim) + eps);
      for (int64_t e = 0; e < head_dim; ++e)
        xh[e] = kh_convert<T>::from_float(kh_to_float(xh[e]) * rstd * kh_to_float(w[e]));
    }
}

template <typename T>
void qk_norm_t(int64_t tokens, int64_t head_dim, const Heads& q, const void* qw, const Heads& k,
               const void* kw, float eps) {
  norm_heads<T>(q, tokens, head_dim, static_cast<const T*>(qw), eps);
  if (k.data) norm_heads<T>(k, tokens, head_dim, static_cast<const T*>(kw), eps);
}

}  // namespace

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
  const bool f32 = cache_dtype == kFP32;
  switch (dtype) {
    case kBF16:
      if (f32)
        return apply_t<kh_bf16, float>(neox, positions, tokens, q, k, cos, sin, max_pos, half,
                                       sign);
      return apply_t<kh_bf16, kh_bf16>(neox, positions, tokens, q, k, cos, sin, max_pos, half,
                                       sign);
    case kFP16:
      if (f32)
        return apply_t<kh_fp16, float>(neox, positions, tokens, q, k, cos, sin, max_pos, half,
                                       sign);
      return apply_t<kh_fp16, kh_fp16>(neox, positions, tokens, q, k, cos, sin, max_pos, half,
                                       sign);
    default:
      return apply_t<float, float>(neox, positions, tokens, q, k, cos, sin, max_pos, half, sign);
  }
}

}  // namespace khk::rope_cpu
