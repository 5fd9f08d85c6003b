// Device code of the rotary package: RotaryEmbedding applied in place to query and key, NeoX
// (rotate halves) and GPT-J (interleaved) layouts, forward and backward (the inverse rotation),
// and QKNormRotaryEmbedding (per-head RMSNorm of q and k, then the rotation: in place for eval,
// out of place with its backward for training), bf16/fp16/fp32 storage with fp32 math
// (rope_math.h, the expression the cpu code uses).
//
// Header-free for NVRTC: the build inlines rope_math.h, qk_norm_params.h, reduce_partials.cuh
// and kh_prelude.cuh. Kernels are extern "C", named
//   rope_<neox|gptj>_<bf16|fp16|fp32>_<cache: f32|same>_<vec|scalar>
//   qk_norm_rope_<neox|gptj>_<bf16|fp16|fp32>_<cache: f32|same>            (eval)
//   qknr_<fwd|bwd|bwdo>_neox_<bf16|fp16|fp32>_<cache: f32|same>, qknr_reduce_partials_<dtype>
//                                      (training; bwdo: the backward from the output and rstd).
// Tensors: query [tokens, q_heads, head_dim] and key [tokens, k_heads, head_dim] (key may be
// NULL), each with its own token and head strides (elements) and a contiguous last dimension;
// positions int64 [tokens]; cos and sin [max_pos, half] (half = rot_dim / 2) with a row stride,
// fp32 or the tensor's dtype. A token whose position is outside [0, max_pos) is left unchanged.
// Geometry (host.cpp, launch_config.h): one CTA per token; its threads walk the token's work
// units (q heads, then k heads), consecutive threads on consecutive units of one head so that
// the accesses are coalesced and cos/sin are re-read from L1 for every head. vec: 16-byte
// accesses when every head start is 16-byte aligned and half divides into whole vectors.
#include "pdl.cuh"
#include "qk_norm_params.h"
#include "reduce_partials.cuh"
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

// ---------------------------------------------------------------------------------------------
// QKNormRotaryEmbedding for training (qk_norm_params.h): the forward out of place (the backward
// needs the input), and the backward from that input; or (QKNormRotaryEmbeddingFromOutput) the
// forward in place saving each row's rstd, and the backward from its output and rstd. NeoX
// with full rotary (2 * half == head_dim) and 16-byte vectors only (host.cpp refuses the rest;
// the runtime then runs RMSNorm and RotaryEmbedding). A row (one head of one token) is G = head_dim / (2 * VEC) lanes: lane l
// holds vector l (pairs [l * VEC, +VEC): their first elements) and vector l + G (their second
// elements, half further), so every NeoX pair is in one thread and the row's sums are a
// shuffle over G lanes (G a power of two, at most 32: groups never straddle a warp).
template <typename T>
struct kh_qknr_row {
  float a[kh_vec16<T>::n], b[kh_vec16<T>::n];
};
// A row's two vectors as loaded (unpacked only when used, so that the next rows' loads can be
// in flight in few registers).
template <typename T>
struct kh_qknr_raw {
  kh_raw<T, kh_vec16<T>::n> a, b;
};

template <typename T, int KIND>
__device__ __forceinline__ kh_qknr_raw<T> kh_qknr_load(const T* p, int l, int G) {
  constexpr int VEC = kh_vec16<T>::n;
  return {kh_load_raw<T, VEC, KIND>(p + l * VEC), kh_load_raw<T, VEC, KIND>(p + (l + G) * VEC)};
}

template <typename T>
__device__ __forceinline__ kh_qknr_row<T> kh_qknr_unpack(const kh_qknr_raw<T>& r) {
  constexpr int VEC = kh_vec16<T>::n;
  kh_qknr_row<T> f;
  kh_unpack<T, VEC>(r.a, f.a);
  kh_unpack<T, VEC>(r.b, f.b);
  return f;
}

// The lanes of this thread's row: G consecutive lanes (G a power of two, at most 32), so the
// shuffles below never wait for a lane of another row, which may have left its loop or exited.
__device__ __forceinline__ unsigned kh_qknr_mask(int G) {
  return G == 32 ? 0xFFFFFFFFu : ((1u << G) - 1u) << ((threadIdx.x & 31) & ~(G - 1));
}

// Sum over the G lanes of a row.
__device__ __forceinline__ float kh_qknr_sum(float v, int G, unsigned mask) {
  for (int off = G >> 1; off > 0; off >>= 1) v += __shfl_xor_sync(mask, v, off);
  return v;
}

// Row `row` of the query rows then the key rows: its tensor, token and head.
struct kh_qknr_where {
  int which;
  kh_i64 tok, head;
};
// Row indices are 32-bit (host.cpp refuses 2^30 query and key rows or more, so that a walker's
// next row fits too): the kernels are bound by the instructions they issue (ncu on an H200: 2.6
// of 4 a cycle, 35% of cycles without an eligible warp), and a 64-bit division by a runtime
// value is a long subroutine; 32-bit ones made the forward 1.5% faster and the backward 2%.
// The same goes for a 32-bit division by the head count: a multiply and a shift instead
// (kh_qknr_divide).
__device__ __forceinline__ int kh_qknr_token(const kh_qknr_tensor& s, int r) {
  return (int)kh_qknr_divide((kh_u32)r, s.div_mul, s.div_shift);
}

__device__ __forceinline__ kh_qknr_where kh_qknr_locate(const kh_qknr_params& p, int row) {
  const int qrows = (int)(p.tokens * p.t[0].heads);
  const int which = row < qrows ? 0 : 1;
  const kh_qknr_tensor& s = p.t[which];
  const int r = which ? row - qrows : row, tok = kh_qknr_token(s, r);
  return {which, tok, r - tok * (int)s.heads};
}

// This lane's VEC cos (or sin) values from row `r` of the cache: 16-byte loads where the host
// found the cache and its row stride 16-byte aligned (p.cs_vec), else an element at a time.
template <typename C, int VEC>
__device__ __forceinline__ void kh_qknr_cache(const C* r, int vec, float (&out)[VEC]) {
  constexpr int CV = kh_vec16<C>::n;  // VEC is a multiple: 8 or 4 elements of T, 4 floats
  if (vec) {
#pragma unroll
    for (int i = 0; i < VEC / CV; ++i) {
      float f[CV];
      kh_unpack<C, CV>(kh_load_raw<C, CV, KH_LOAD_READONLY>(r + i * CV), f);
#pragma unroll
      for (int j = 0; j < CV; ++j) out[i * CV + j] = f[j];
    }
  } else {
#pragma unroll
    for (int e = 0; e < VEC; ++e) out[e] = kh_to_float(r[e]);
  }
}

// Forward: two rows per group of G lanes (2 * group and the row after it, both loaded before
// either is computed). rstd and the rounding as qk_norm_rope_kernel (the normed row rounded to T,
// then rotated), so training's q and k equal what eval computes.
template <typename T, typename C>
__device__ __forceinline__ void qknr_fwd(const kh_qknr_params& p) {
  constexpr int VEC = kh_vec16<T>::n;
  const int G = p.head_dim / (2 * VEC);
  const unsigned mask = kh_qknr_mask(G);
  const kh_i64 gid = (kh_i64)blockIdx.x * blockDim.x + threadIdx.x;
  const int lg = __ffs(G) - 1, row0 = (int)(gid >> lg) * 2, l = (int)gid & (G - 1);
  const int rows = (int)(p.tokens * (p.t[0].heads + p.t[1].heads));
  if (row0 >= rows) return;  // whole groups; the shuffles take this group's lanes only
  kh_qknr_where at[2];
  kh_qknr_raw<T> xr[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (row0 + i >= rows) break;
    at[i] = kh_qknr_locate(p, row0 + i);
    const kh_qknr_tensor& s = p.t[at[i].which];
    xr[i] = kh_qknr_load<T, KH_LOAD_STREAM>(
        (const T*)s.in + at[i].tok * s.in_t + at[i].head * s.in_h, l, G);
  }
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    if (row0 + i >= rows) break;
    const kh_qknr_tensor& s = p.t[at[i].which];
    const kh_qknr_row<T> w =
        kh_qknr_unpack<T>(kh_qknr_load<T, KH_LOAD_READONLY>((const T*)s.w, l, G));
    const kh_qknr_row<T> x = kh_qknr_unpack<T>(xr[i]);
    const kh_i64 pos = p.positions[at[i].tok];
    float ss = 0.f;
#pragma unroll
    for (int e = 0; e < VEC; ++e) ss += x.a[e] * x.a[e] + x.b[e] * x.b[e];
    const float rstd = rsqrtf(kh_qknr_sum(ss, G, mask) / (float)p.head_dim + p.eps);
    if (s.rstd && l == 0) s.rstd[at[i].tok * s.heads + at[i].head] = rstd;
    float o1[VEC], o2[VEC];
#pragma unroll
    for (int e = 0; e < VEC; ++e) {
      o1[e] = kh_to_float(kh_convert<T>::from_float(x.a[e] * rstd * w.a[e]));
      o2[e] = kh_to_float(kh_convert<T>::from_float(x.b[e] * rstd * w.b[e]));
    }
    if (pos >= 0 && pos < p.max_pos) {
      float c[VEC], sn[VEC];
      kh_qknr_cache<C, VEC>((const C*)p.cos + pos * p.scos + l * VEC, p.cs_vec, c);
      kh_qknr_cache<C, VEC>((const C*)p.sin + pos * p.ssin + l * VEC, p.cs_vec, sn);
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        const float y1 = o1[e], y2 = o2[e];
        kh_rope_rotate(y1, y2, c[e], sn[e], &o1[e], &o2[e]);
      }
    }
    T* out = (T*)s.out + at[i].tok * s.out_t + at[i].head * s.out_h;
    kh_store_raw<T, VEC>(out + l * VEC, kh_pack<T, VEC>(o1));
    kh_store_raw<T, VEC>(out + (l + G) * VEC, kh_pack<T, VEC>(o2));
  }
}

// Backward: gridDim.x walkers (CTAs) each take rows blockIdx.x * groups + group, + gridDim.x *
// groups, ... of the query, then of the key, the next row's input and gradient loaded before
// the current one is computed. Per row: the inverse rotation of d (in fp32), then RMSNorm's
// backward with rstd recomputed from the input: dx = rstd * (g - xhat * mean(g * xhat)),
// g = dn * w, and dweight's partial += dn * xhat. The CTA's partials meet by shuffles across the
// groups of a warp, then across warps in shared memory, in a fixed order, into its workspace row
// (query columns, then key columns) for kh_reduce_partials.
template <typename T, typename C, bool FROM_OUT>
__device__ __forceinline__ void qknr_bwd(const kh_qknr_params& p) {
  constexpr int VEC = kh_vec16<T>::n;
  extern __shared__ float kh_qknr_part[];  // [warps][2 * head_dim]
  const int G = p.head_dim / (2 * VEC);
  const unsigned mask = kh_qknr_mask(G);
  const int groups = blockDim.x / G, group = threadIdx.x / G, l = threadIdx.x % G;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  const int cols = 2 * p.head_dim;
  const float inv_n = 1.f / (float)p.head_dim;
  const int step = (int)gridDim.x * groups;  // rows are 32-bit (kh_qknr_locate)
#pragma unroll 1
  for (int which = 0; which < 2; ++which) {  // one tensor's partials live at a time
    const kh_qknr_tensor& s = p.t[which];
    const int heads = (int)s.heads, rows = (int)(p.tokens * s.heads);
    float dw[2 * VEC];
#pragma unroll
    for (int e = 0; e < 2 * VEC; ++e) dw[e] = 0.f;
    int r = (int)blockIdx.x * groups + group;
    // A row's input, gradient and position (its cos/sin rows are read once the position is in).
    // (The forward's rstd too, when the input is its output.)
    auto load = [&](int row, kh_qknr_raw<T>& x, kh_qknr_raw<T>& d, kh_i64& pos, float& rs) {
      const int tok = kh_qknr_token(s, row), head = row - tok * heads;
      x = kh_qknr_load<T, KH_LOAD_STREAM>((const T*)s.in + tok * s.in_t + head * s.in_h, l, G);
      d = kh_qknr_load<T, KH_LOAD_STREAM>((const T*)s.d + tok * s.d_t + head * s.d_h, l, G);
      pos = p.positions[tok];
      if constexpr (FROM_OUT) rs = s.rstd[row];
    };
    kh_qknr_raw<T> xn, dn;
    kh_i64 pos_next = -1;
    float rs_next = 0.f;
    if (r < rows) load(r, xn, dn, pos_next, rs_next);
    kh_qknr_row<T> w;
    if (r < rows) w = kh_qknr_unpack<T>(kh_qknr_load<T, KH_LOAD_READONLY>((const T*)s.w, l, G));
    for (; r < rows; r += step) {
      // The row's position came with its loads, so its cos/sin rows are one L2 read away (after
      // the next row's loads go out), not two.
      const kh_i64 pos = pos_next;
      const float rs_given = rs_next;
      kh_qknr_row<T> x = kh_qknr_unpack<T>(xn), d = kh_qknr_unpack<T>(dn);
      if (r + step < rows) load(r + step, xn, dn, pos_next, rs_next);
      if (pos >= 0 && pos < p.max_pos) {
        float c[VEC], sn[VEC];
        kh_qknr_cache<C, VEC>((const C*)p.cos + pos * p.scos + l * VEC, p.cs_vec, c);
        kh_qknr_cache<C, VEC>((const C*)p.sin + pos * p.ssin + l * VEC, p.cs_vec, sn);
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          const float d1 = d.a[e], d2 = d.b[e];
          kh_rope_rotate(d1, d2, c[e], -sn[e], &d.a[e], &d.b[e]);
          if constexpr (FROM_OUT) {  // x is the forward's output: rotated back to xhat * w
            const float x1 = x.a[e], x2 = x.b[e];
            kh_rope_rotate(x1, x2, c[e], -sn[e], &x.a[e], &x.b[e]);
          }
        }
      }
      const int tok = kh_qknr_token(s, r), head = r - tok * heads;
      float rstd, sgx = 0.f;
      if constexpr (FROM_OUT) {  // xhat = (xhat * w) / w; where w is 0 (or subnormal), its output
        rstd = rs_given;
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          x.a[e] = __fdividef(x.a[e], fabsf(w.a[e]) < KH_FLT_MIN ? 1.f : w.a[e]);
          x.b[e] = __fdividef(x.b[e], fabsf(w.b[e]) < KH_FLT_MIN ? 1.f : w.b[e]);
        }
      } else {
        float ss = 0.f;
#pragma unroll
        for (int e = 0; e < VEC; ++e) ss += x.a[e] * x.a[e] + x.b[e] * x.b[e];
        rstd = rsqrtf(kh_qknr_sum(ss, G, mask) * inv_n + p.eps);
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          x.a[e] *= rstd;  // xhat from here on
          x.b[e] *= rstd;
        }
      }
#pragma unroll
      for (int e = 0; e < VEC; ++e) sgx += d.a[e] * w.a[e] * x.a[e] + d.b[e] * w.b[e] * x.b[e];
      const float c1 = kh_qknr_sum(sgx, G, mask) * inv_n;
      float o1[VEC], o2[VEC];
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        o1[e] = rstd * (d.a[e] * w.a[e] - x.a[e] * c1);
        o2[e] = rstd * (d.b[e] * w.b[e] - x.b[e] * c1);
        dw[e] += d.a[e] * x.a[e];
        dw[VEC + e] += d.b[e] * x.b[e];
      }
      T* out = (T*)s.out + tok * s.out_t + head * s.out_h;
      kh_store_raw<T, VEC>(out + l * VEC, kh_pack<T, VEC>(o1));
      kh_store_raw<T, VEC>(out + (l + G) * VEC, kh_pack<T, VEC>(o2));
    }
    // Every lane of the warp is here (no lane returned): the groups of a warp hold the same
    // columns, summed across the group bits of the lane, then left in this warp's shared row.
#pragma unroll
    for (int e = 0; e < 2 * VEC; ++e)
      for (int off = G; off < 32; off <<= 1) dw[e] += __shfl_xor_sync(0xFFFFFFFFu, dw[e], off);
    if (lane < G) {
      float* part = kh_qknr_part + warp * cols + which * p.head_dim;
#pragma unroll
      for (int e = 0; e < VEC; ++e) {
        part[l * VEC + e] = dw[e];
        part[(l + G) * VEC + e] = dw[VEC + e];
      }
    }
  }
  __syncthreads();
  float* ws = p.ws + (kh_i64)blockIdx.x * p.sws;
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    float t = 0.f;
    for (int j = 0; j < warps; ++j) t += kh_qknr_part[j * cols + c];
    ws[c] = t;
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

// The training ops' kernels (256 threads: host.cpp's kQknrThreads). The bf16 forward at 4 CTAs a
// multiprocessor (64 registers: its 16-byte cos/sin loads took it to 68 and 3 CTAs, 10% slower on
// an H200); fp16's and fp32's as the compiler likes (at 64, fp16's spilled).
#define KH_QKNR_KERNELS(TNAME, T, CNAME, C, FWD_CTAS)            \
  extern "C" __global__ void __launch_bounds__(256, FWD_CTAS)    \
      qknr_fwd_neox_##TNAME##_##CNAME(const kh_qknr_params p) {  \
    kh_pdl_enter();                                              \
    qknr_fwd<T, C>(p);                                           \
  }                                                              \
  extern "C" __global__ void __launch_bounds__(256)              \
      qknr_bwd_neox_##TNAME##_##CNAME(const kh_qknr_params p) {  \
    kh_pdl_enter();                                              \
    qknr_bwd<T, C, false>(p);                                    \
  }                                                              \
  extern "C" __global__ void __launch_bounds__(256)              \
      qknr_bwdo_neox_##TNAME##_##CNAME(const kh_qknr_params p) { \
    kh_pdl_enter();                                              \
    qknr_bwd<T, C, true>(p);                                     \
  }

KH_QKNR_KERNELS(bf16, kh_bf16, f32, float, 4)
KH_QKNR_KERNELS(bf16, kh_bf16, same, kh_bf16, 4)
KH_QKNR_KERNELS(fp16, kh_fp16, f32, float, 1)
KH_QKNR_KERNELS(fp16, kh_fp16, same, kh_fp16, 1)
KH_QKNR_KERNELS(fp32, float, f32, float, 1)

KH_REDUCE_PARTIALS_KERNEL(qknr_reduce_partials_bf16, kh_bf16)
KH_REDUCE_PARTIALS_KERNEL(qknr_reduce_partials_fp16, kh_fp16)
KH_REDUCE_PARTIALS_KERNEL(qknr_reduce_partials_fp32, float)
