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

}  // namespace khk::rope_cpu
