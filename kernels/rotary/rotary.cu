// Device code of the rotary package: RotaryEmbedding applied in place to query and key, NeoX
// (rotate halves) and GPT-J (interleaved) layouts, forward and backward (the inverse rotation),
// and QKNormRotaryEmbedding (per-head RMSNorm of q and k, then the rotation; eval only),
// bf16/fp16/fp32 storage with fp32 math (rope_math.h, the expression the cpu code uses).
//
// Header-free for NVRTC: the build inlines rope_math.h and kh_prelude.cuh. Kernels are
// extern "C", named
//   rope_<neox|gptj>_<bf16|fp16|fp32>_<cache: f32|same>_<vec|scalar>
//   qk_norm_rope_<neox|gptj>_<bf16|fp16|fp32>_<cache: f32|same>.
// Tensors: query [tokens, q_heads, head_dim] and key [tokens, k_heads, head_dim] (key may be
// NULL), each with its own token and head strides (elements) and a contiguous last dimension;
// positions int64 [tokens]; cos and sin [max_pos, half] (half = rot_dim / 2) with a row stride,
// fp32 or the tensor's dtype. A token whose position is outside [0, max_pos) is left unchanged.
// Geometry (host.cpp, launch_config.h): one CTA per token; its threads walk the token's work
// units (q heads, then k heads), consecutive threads on consecutive units of one head so that
// the accesses are coalesced and cos/sin are re-read from L1 for every head. vec: 16-byte
// accesses when every head start is 16-byte aligned and half divides into whole vectors.
#include "pdl.cuh"
#include "rope_math.h"

namespace {

// One work unit: PV pairs of one head. NeoX vec: x1 = x[j .. j+VEC), x2 = x[j+half ..) (two
// 16-byte accesses, PV = VEC); GPT-J vec: one 16-byte access of VEC interleaved elements
// (PV = VEC / 2); scalar (VEC = 1): one pair.
template <typename T, typename C, int NEOX, int VEC>
__device__ __forceinline__ void rope_heads(T* x, kh_i64 st, kh_i64 sh, int heads, int half,
                                           const C* cr, const C* sr, float sign) {
  constexpr int PV = VEC == 1 ? 1 : (NEOX ? VEC : VEC / 2);
  const int per_head = half / PV;
  const int units = heads * per_head;
  T* xt = x + (kh_i64)blockIdx.x * st;
  for (int i = threadIdx.x; i < units; i += blockDim.x) {
    const int h = i / per_head, j = (i - h * per_head) * PV;
    T* xh = xt + (kh_i64)h * sh;
    if constexpr (VEC == 1) {
      const int a = kh_rope_first(NEOX, j), b = kh_rope_second(NEOX, j, half);
      const float x1 = kh_to_float(xh[a]), x2 = kh_to_float(xh[b]);
      const float c = kh_to_float(cr[j]), s = sign * kh_to_float(sr[j]);
      float o1, o2;
      kh_rope_rotate(x1, x2, c, s, &o1, &o2);
      xh[a] = kh_convert<T>::from_float(o1);
      xh[b] = kh_convert<T>::from_float(o2);
    } else if constexpr (NEOX) {
      float a[VEC], b[VEC];
      kh_unpack<T, VEC>(kh_load_raw<T, VEC, KH_LOAD_PLAIN>(xh + j), a);
      kh_unpack<T, VEC>(kh_load_raw<T, VEC, KH_LOAD_PLAIN>(xh + j + half), b);
#pragma unroll
      for (int k = 0; k < VEC; ++k) {
        float o1, o2;
        kh_rope_rotate(a[k], b[k], kh_to_float(cr[j + k]), sign * kh_to_float(sr[j + k]), &o1, &o2);
        a[k] = o1;
        b[k] = o2;
      }
      kh_store_raw<T, VEC>(xh + j, kh_pack<T, VEC>(a));
      kh_store_raw<T, VEC>(xh + j + half, kh_pack<T, VEC>(b));
    } else {
      float a[VEC];
      kh_unpack<T, VEC>(kh_load_raw<T, VEC, KH_LOAD_PLAIN>(xh + 2 * j), a);
#pragma unroll
      for (int k = 0; k < PV; ++k) {
        float o1, o2;
        kh_rope_rotate(a[2 * k], a[2 * k + 1], kh_to_float(cr[j + k]),
                       sign * kh_to_float(sr[j + k]), &o1, &o2);
        a[2 * k] = o1;
        a[2 * k + 1] = o2;
      }
      kh_store_raw<T, VEC>(xh + 2 * j, kh_pack<T, VEC>(a));
    }
  }
}

template <typename T, typename C, int NEOX, int VEC>
__device__ __forceinline__ void rope_kernel(const kh_i64* positions, T* q, kh_i64 sqt, kh_i64 sqh,
                                            int q_heads, T* k, kh_i64 skt, kh_i64 skh, int k_heads,
                                            const C* cos, const C* sin, kh_i64 scos, kh_i64 ssin,
                                            kh_i64 max_pos, int half, float sign) {
  const kh_i64 pos = positions[blockIdx.x];
  if (pos < 0 || pos >= max_pos) return;  // no barriers in this kernel
  const C* cr = cos + pos * scos;
  const C* sr = sin + pos * ssin;
  rope_heads<T, C, NEOX, VEC>(q, sqt, sqh, q_heads, half, cr, sr, sign);
  if (k) rope_heads<T, C, NEOX, VEC>(k, skt, skh, k_heads, half, cr, sr, sign);
}

// QKNormRotaryEmbedding (Qwen3's q/k norms, then RoPE, in place): each head's row is RMS-normed
// over head_dim with its weight (qw for query heads, kw for key heads; y = x * rsqrt(mean(x^2) +
// eps) * w, rounded to T as the norm package stores it), then its first 2 * half elements are
// rotated. Grid (tokens, head groups); warp w of group g takes head g * warps + w (query heads,
// then key heads: one head per warp, so the heads' latency chains run side by side) and stages
// the normed row in its own shared memory, so that either pair layout reads it. A token whose
// position is outside [0, max_pos) is normed but not rotated.
template <typename T, typename C, int NEOX>
__device__ __forceinline__ void qk_norm_rope_kernel(const kh_i64* positions, T* q, kh_i64 sqt,
                                                    kh_i64 sqh, int q_heads, T* k, kh_i64 skt,
                                                    kh_i64 skh, int k_heads, const T* qw,
                                                    const T* kw, float eps, int head_dim,
                                                    const C* cos, const C* sin, kh_i64 scos,
                                                    kh_i64 ssin, kh_i64 max_pos, int half) {
  extern __shared__ float kh_qk_rows[];  // [warps][head_dim]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  float* y = kh_qk_rows + warp * head_dim;
  const kh_i64 pos = positions[blockIdx.x];
  const bool rotate = pos >= 0 && pos < max_pos;
  const C* cr = cos + (rotate ? pos : 0) * scos;
  const C* sr = sin + (rotate ? pos : 0) * ssin;
  const float inv_n = 1.f / (float)head_dim;
  const int h = blockIdx.y * warps + warp;
  if (h < q_heads + k_heads) {  // the warp's head (no barrier below spans warps)
    const bool is_q = h < q_heads;
    T* x = is_q ? q + (kh_i64)blockIdx.x * sqt + (kh_i64)h * sqh
                : k + (kh_i64)blockIdx.x * skt + (kh_i64)(h - q_heads) * skh;
    const T* w = is_q ? qw : kw;
    float ss = 0.f;
    for (int e = lane; e < head_dim; e += 32) {
      const float v = kh_to_float(x[e]);
      y[e] = v;
      ss += v * v;
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xFFFFFFFFu, ss, off);
    const float rstd = rsqrtf(ss * inv_n + eps);
    for (int e = lane; e < head_dim; e += 32)
      y[e] = kh_to_float(kh_convert<T>::from_float(y[e] * rstd * kh_to_float(w[e])));
    __syncwarp();  // the pairs below read other lanes' elements
    for (int e = 2 * half + lane; e < head_dim; e += 32) x[e] = kh_convert<T>::from_float(y[e]);
    for (int j = lane; j < half; j += 32) {
      const int a = kh_rope_first(NEOX, j), b = kh_rope_second(NEOX, j, half);
      float o1 = y[a], o2 = y[b];
      if (rotate) kh_rope_rotate(y[a], y[b], kh_to_float(cr[j]), kh_to_float(sr[j]), &o1, &o2);
      x[a] = kh_convert<T>::from_float(o1);
      x[b] = kh_convert<T>::from_float(o2);
    }
  }
}

}  // namespace

#define KH_ROPE_KERNEL(LNAME, NEOX, TNAME, T, CNAME, C, VEC, VNAME)                               \
  extern "C" __global__ void __launch_bounds__(256) rope_##LNAME##_##TNAME##_##CNAME##_##VNAME(   \
      const kh_i64* positions, T* q, kh_i64 sqt, kh_i64 sqh, int q_heads, T* k, kh_i64 skt,       \
      kh_i64 skh, int k_heads, const C* cos, const C* sin, kh_i64 scos, kh_i64 ssin,              \
      kh_i64 max_pos, int half, float sign) {                                                     \
    kh_pdl_enter();                                                                               \
    rope_kernel<T, C, NEOX, VEC>(positions, q, sqt, sqh, q_heads, k, skt, skh, k_heads, cos, sin, \
                                 scos, ssin, max_pos, half, sign);                                \
  }

#define KH_ROPE_VARIANTS(LNAME, NEOX, TNAME, T, CNAME, C)              \
  KH_ROPE_KERNEL(LNAME, NEOX, TNAME, T, CNAME, C, kh_vec16<T>::n, vec) \
  KH_ROPE_KERNEL(LNAME, NEOX, TNAME, T, CNAME, C, 1, scalar)

#define KH_ROPE_LAYOUT(LNAME, NEOX)                           \
  KH_ROPE_VARIANTS(LNAME, NEOX, bf16, kh_bf16, f32, float)    \
  KH_ROPE_VARIANTS(LNAME, NEOX, bf16, kh_bf16, same, kh_bf16) \
  KH_ROPE_VARIANTS(LNAME, NEOX, fp16, kh_fp16, f32, float)    \
  KH_ROPE_VARIANTS(LNAME, NEOX, fp16, kh_fp16, same, kh_fp16) \
  KH_ROPE_VARIANTS(LNAME, NEOX, fp32, float, f32, float)

KH_ROPE_LAYOUT(neox, 1)
KH_ROPE_LAYOUT(gptj, 0)

#define KH_QK_NORM_ROPE_KERNEL(LNAME, NEOX, TNAME, T, CNAME, C)                                    \
  extern "C" __global__ void __launch_bounds__(256) qk_norm_rope_##LNAME##_##TNAME##_##CNAME(      \
      const kh_i64* positions, T* q, kh_i64 sqt, kh_i64 sqh, int q_heads, T* k, kh_i64 skt,        \
      kh_i64 skh, int k_heads, const T* qw, const T* kw, float eps, int head_dim, const C* cos,    \
      const C* sin, kh_i64 scos, kh_i64 ssin, kh_i64 max_pos, int half) {                          \
    kh_pdl_enter();                                                                                \
    qk_norm_rope_kernel<T, C, NEOX>(positions, q, sqt, sqh, q_heads, k, skt, skh, k_heads, qw, kw, \
                                    eps, head_dim, cos, sin, scos, ssin, max_pos, half);           \
  }

#define KH_QK_NORM_ROPE_LAYOUT(LNAME, NEOX)                         \
  KH_QK_NORM_ROPE_KERNEL(LNAME, NEOX, bf16, kh_bf16, f32, float)    \
  KH_QK_NORM_ROPE_KERNEL(LNAME, NEOX, bf16, kh_bf16, same, kh_bf16) \
  KH_QK_NORM_ROPE_KERNEL(LNAME, NEOX, fp16, kh_fp16, f32, float)    \
  KH_QK_NORM_ROPE_KERNEL(LNAME, NEOX, fp16, kh_fp16, same, kh_fp16) \
  KH_QK_NORM_ROPE_KERNEL(LNAME, NEOX, fp32, float, f32, float)

KH_QK_NORM_ROPE_LAYOUT(neox, 1)
KH_QK_NORM_ROPE_LAYOUT(gptj, 0)
