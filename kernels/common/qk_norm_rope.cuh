// qk_norm_rope.cuh: one head row of a query or key, RMS-normed over head_dim (optional) and then
// rotated (RoPE), by one warp. The rotary package's QKNormRotaryEmbedding kernel runs it on rows in
// global memory and the attention package's fused decode (paged_attention_decode_rotary_append) on
// rows in its shared-memory tiles, so both produce the same bits: the sum of squares is taken in
// the same lane order and the same shuffle tree, and every value is rounded where the separate ops
// round it (the normed row to T, as the norm package stores it; the rotated pair to T).
//
//   y = x * rsqrt(mean(x^2) + eps) * w   (rounded to T; no weight: y = x)
//   pair j of y rotated by (cos[j], sin[j]) as rope_math.cuh's kh_rope_rotate, NeoX or GPT-J
//
// Header-free (NVRTC): the build inlines it with rope_math.cuh and kh_prelude.cuh.
#ifndef KH_QK_NORM_ROPE_CUH_
#define KH_QK_NORM_ROPE_CUH_

#include "rope_math.cuh"

// The row: head_dim elements read through load(e) -> float and written through store(e, float)
// (which rounds to the row's type); `y` is this warp's scratch of head_dim floats in shared memory.
// w: the norm's weight (head_dim elements of T), or null for no norm. The first `half` pairs are
// rotated by cr[j], sr[j] when `rotate`; the elements past 2 * half are written back only when
// normed (otherwise they are unchanged). Every lane of the warp calls it (it shuffles and syncs).
template <typename T, typename C, typename Load, typename Store>
__device__ __forceinline__ void kh_warp_norm_rope(Load&& load, Store&& store, float* y, const T* w,
                                                  float eps, int head_dim, int neox, int half,
                                                  const C* cr, const C* sr, bool rotate, int lane) {
  if (w) {
    float ss = 0.f;
    for (int e = lane; e < head_dim; e += 32) {
      const float v = load(e);
      y[e] = v;
      ss += v * v;
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xFFFFFFFFu, ss, off);
    const float rstd = rsqrtf(ss * (1.f / (float)head_dim) + eps);
    for (int e = lane; e < head_dim; e += 32)
      y[e] = kh_to_float(kh_convert<T>::from_float(y[e] * rstd * kh_to_float(w[e])));
  } else {
    for (int e = lane; e < head_dim; e += 32) y[e] = load(e);
  }
  __syncwarp();  // the pairs below read other lanes' elements
  if (w)
    for (int e = 2 * half + lane; e < head_dim; e += 32) store(e, y[e]);
  for (int j = lane; j < half; j += 32) {
    const int a = kh_rope_first(neox, j), b = kh_rope_second(neox, j, half);
    float o1 = y[a], o2 = y[b];
    if (rotate) kh_rope_rotate(y[a], y[b], kh_to_float(cr[j]), kh_to_float(sr[j]), &o1, &o2);
    store(a, o1);
    store(b, o2);
  }
  __syncwarp();  // y is free again, and the row's stores are visible to the warp
}

#endif  // KH_QK_NORM_ROPE_CUH_
