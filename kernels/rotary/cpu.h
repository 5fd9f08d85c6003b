// cpu implementation of the rotary package: the rotation of rope_math.h in fp32, results
// rounded to the storage dtype. Strides in elements.
#pragma once

#include <stdint.h>

namespace khk::rope_cpu {

// One in-place tensor [tokens, heads, head_dim]: token and head strides.
struct Heads {
  void* data = nullptr;  // NULL: absent (key)
  int64_t token_stride = 0, head_stride = 0, heads = 0;
};

// A cos or sin cache [max_pos, half] of `cache_dtype` with a row stride.
struct Cache {
  const void* data = nullptr;
  int64_t stride = 0;
};

// Rotates q and k (when k.data) for every token by the angle of positions[token];
// sign = +1 forward, -1 backward (inverse rotation). Tokens with positions outside
// [0, max_pos) are left unchanged.
void apply(int dtype, int cache_dtype, bool neox, const int64_t* positions, int64_t tokens,
           const Heads& q, const Heads& k, const Cache& cos, const Cache& sin, int64_t max_pos,
           int half, float sign);

// RMS-normalizes every head row of q (weight qw) and k (when k.data; weight kw) over its
// head_dim elements in place: x * (1 / sqrt(mean(x^2) + eps)) * w in fp32, rounded to `dtype`
// (QKNormRotaryEmbedding's first step; apply() rotates after it). Weights: head_dim elements of
// `dtype`.
void qk_norm(int dtype, int64_t tokens, int64_t head_dim, const Heads& q, const void* qw,
             const Heads& k, const void* kw, float eps);

// Each row's 1 / sqrt(mean(x^2) + eps) of x [tokens, heads, head_dim] into rstd[token * heads +
// head] (fp32), as qk_norm computes it.
void qk_rstd(int dtype, int64_t tokens, int64_t head_dim, const Heads& x, float eps, float* rstd);

// QKNormRotaryEmbedding's backward for one of query and key: for every row (token, head) of
// `in` (the forward's input), d (the gradient of the forward's output) rotated back (sign -1,
// tokens with positions outside [0, max_pos) as they are), then RMSNorm's backward with rstd
// recomputed from `in`: out = rstd * (g - xhat * mean(g * xhat)), g = d' * w, xhat = in * rstd,
// in fp32; dw = the sum over rows of d' * xhat (accumulated in double), rounded to `dtype`.
struct NormGrad {
  const void* in = nullptr;
  int64_t in_t = 0, in_h = 0;
  const void* d = nullptr;
  int64_t d_t = 0, d_h = 0;
  void* out = nullptr;
  int64_t out_t = 0, out_h = 0;
  int64_t heads = 0;
  const void* w = nullptr;  // head_dim elements
  void* dw = nullptr;       // head_dim elements, written
  // Set: `in` is the forward's output (normed, weighted and rotated), rotated back and divided by
  // w for xhat (0 where w is 0), and rstd[token * heads + head] the forward's (eps unused).
  const float* rstd = nullptr;
};
void qk_norm_backward(int dtype, int cache_dtype, bool neox, const int64_t* positions,
                      int64_t tokens, int64_t head_dim, const Cache& cos, const Cache& sin,
                      int64_t max_pos, int half, float eps, const NormGrad& g);

}  // namespace khk::rope_cpu
