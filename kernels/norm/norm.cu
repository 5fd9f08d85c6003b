// Device code of the norm package: RMSNorm, FusedAddRMSNorm and LayerNorm, forward and backward,
// for bf16, fp16 and fp32 storage with fp32 math.
//
// Header-free for NVRTC: the build inlines kh_prelude.cuh into the shipped norm.cu, so the
// package compiles with no -I path and no CUDA header. Every kernel is extern "C" and named
//   norm_fwd_<rms|add_rms|ln>_<bf16|fp16|fp32>_<vec|scalar>_<reg|loop>
//   norm_bwd_<rms|rmsy|ln>_<bf16|fp16|fp32>_<vec|scalar>_<reg|loop>
//   norm_reduce_partials_<bf16|fp16|fp32>
// and host.cpp computes each launch's geometry (REFERENCE §6.3):
//  - vec: 16-byte loads/stores (8 bf16/fp16 or 4 fp32) when every row start is 16-byte aligned
//    and cols % 8 (or 4) == 0; scalar: one element per access otherwise.
//  - reg: blockDim = (threads per row, rows per CTA); each thread keeps up to 8 (forward) or 4
//    (backward) vectors of its row in registers between the reduction and the scaling pass.
//  - loop: one CTA of 512 threads per row (forward) or per walker (backward) for rows too long
//    for registers; the row is re-read from L2.
//  - Backward weight gradients: no atomics. `walkers` groups of threads each walk rows
//    w, w + walkers, ... and keep one fp32 partial row in registers (reg) or in their own
//    workspace row (loop); a reg CTA of several walkers (short rows) sums theirs in shared
//    memory into one workspace row per CTA; norm_reduce_partials (reduce_partials.cuh) then sums
//    the workspace rows in a fixed order, so results are deterministic.
//  - rmsy: RMSNorm's backward from the forward's output y = xhat * w (rounded to T) instead of its
//    input, xhat = y / w (as Apex's memory-efficient norms): a caller that keeps y for the next
//    GEMM's weight gradient then holds no copy of x. A zero weight gives xhat 0 (y) in its column.
// Aliasing: y may be x and residual_out may be residual (same pointer and stride); every
// element is read by the thread that later writes it.
#include "kh_prelude.cuh"
#include "pdl.cuh"
#include "reduce_partials.cuh"

namespace {

enum NormKind { kRms = 0, kAddRms = 1, kLayer = 2 };

constexpr int kFwdMaxVec = 8;  // vectors per thread kept in registers (forward)
// Tuning switch (for sweeps that compile this source with -D): 1 loads weight and bias after
// the row reduction, 0 together with the row.
#ifndef KH_NORM_PARAMS_LATE
#define KH_NORM_PARAMS_LATE 1
#endif
constexpr int kBwdMaxVec = 4;  // (backward: x, dy, weight and partials are live together)
constexpr int kLoopUnroll = 4;
constexpr int kBwdLoopUnroll = 2;
constexpr int kLoopThreads = 512;  // threads per row (forward) or walker (backward), loop path

// The backward's xhat of an element: from the input ((x - mean) * rstd; mean 0 for RMSNorm) or,
// FROM_Y, from the forward's output y = xhat * w: y / w, and y itself (0) where w is 0 (or
// subnormal, where the approximate division's reciprocal overflows), whose y tells nothing of
// xhat. That division (2 ulp) is far below the rounding of y to T (and the select on the
// divisor, unlike one on the quotient, spills no register: ptxas 13.0).
template <bool FROM_Y>
__device__ __forceinline__ float bwd_xhat(float f, float w, float mu, float rs) {
  if constexpr (FROM_Y) return __fdividef(f, fabsf(w) < KH_FLT_MIN ? 1.f : w);
  return (f - mu) * rs;
}

template <typename T, int VEC>
struct Io {
  typedef kh_raw<T, VEC> Raw;
};

// Loads this thread's weight (and bias) vectors of a register-resident row.
template <typename T, int VEC, int KIND>
__device__ __forceinline__ void load_params(kh_raw<T, VEC> (&ws)[kFwdMaxVec],
                                            kh_raw<T, VEC> (&bs)[kFwdMaxVec], const T* w,
                                            const T* b, int tx, int tpr, int nvec, bool valid) {
#pragma unroll
  for (int k = 0; k < kFwdMaxVec; ++k) {
    const int v = tx + k * tpr;
    if (valid && v < nvec) {
      ws[k] = kh_load_raw<T, VEC, KH_LOAD_READONLY>(w + v * VEC);
      if constexpr (KIND == kLayer) bs[k] = kh_load_raw<T, VEC, KH_LOAD_READONLY>(b + v * VEC);
    }
  }
}

// Sum over the lanes of one warp that hold this row (all 32, or the row's tpr < 32).
__device__ __forceinline__ float warp_row_sum(float v, int tpr) {
  const int lanes = tpr < 32 ? tpr : 32;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1)
    if (off < lanes) v += __shfl_xor_sync(0xFFFFFFFFu, v, off);
  return v;
}

// LayerNorm mean and rstd of a register-resident row with one barrier (two reductions in series,
// the mean and then the squared deviations, cost 15% at 16384 x 8192 bf16). Each warp centres
// its values on its own mean (shuffles only), so the squared deviations it sums do not cancel
// when |mean| >> std; the block then merges the warps' (count, sum, M2) exactly (Chan et al.).
// A shift by one value of the row instead (E[(x-k)^2] - E[x-k]^2) missed the 1e-5 rstd tolerance
// on a 200000-column row. All threads of the CTA must call it; red: __shared__ float[96].
template <typename T, int VEC>
__device__ __forceinline__ void ln_reg_stats(const kh_raw<T, VEC> (&xs)[kFwdMaxVec], bool valid,
                                             int tx, int tpr, int nvec, float inv_n, float eps,
                                             float* red, float& mean, float& rstd) {
  float s = 0.f, c = 0.f;
#pragma unroll
  for (int k = 0; k < kFwdMaxVec; ++k) {
    if (valid && tx + k * tpr < nvec) {
      float f[VEC];
      kh_unpack<T, VEC>(xs[k], f);
#pragma unroll
      for (int i = 0; i < VEC; ++i) s += f[i];
      c += (float)VEC;
    }
  }
  s = warp_row_sum(s, tpr);
  c = warp_row_sum(c, tpr);
  const float wmean = c > 0.f ? s / c : 0.f;
  float q = 0.f;
#pragma unroll
  for (int k = 0; k < kFwdMaxVec; ++k) {
    if (valid && tx + k * tpr < nvec) {
      float f[VEC];
      kh_unpack<T, VEC>(xs[k], f);
#pragma unroll
      for (int i = 0; i < VEC; ++i) q += (f[i] - wmean) * (f[i] - wmean);
    }
  }
  q = warp_row_sum(q, tpr);
  if (tpr > 32) {
    const int wpr = tpr >> 5;
    const int base = threadIdx.y * wpr;
    if ((tx & 31) == 0) {
      red[base + (tx >> 5)] = s;
      red[32 + base + (tx >> 5)] = q;
      red[64 + base + (tx >> 5)] = c;
    }
    __syncthreads();  // red is not reused after this: no second barrier
    float total = 0.f;
    for (int i = 0; i < wpr; ++i) total += red[base + i];
    mean = total * inv_n;
    q = 0.f;
    for (int i = 0; i < wpr; ++i) {
      const float cw = red[64 + base + i];
      const float dm = cw > 0.f ? red[base + i] / cw - mean : 0.f;
      q += red[32 + base + i] + cw * dm * dm;
    }
  } else {
    mean = wmean;
  }
  rstd = rsqrtf(q * inv_n + eps);
}

// ---------------------------------------------------------------------------------------------
// Forward, rows in registers. Only the row (and the residual) is loaded before the reduction:
// all of this thread's loads are issued before the first use; weight and bias are loaded after
// the reduction (L1/L2 hits shared by every row), which keeps 32-64 fewer registers live across
// it and so more rows in flight per SM.
template <typename T, int VEC, int KIND>
__device__ __forceinline__ void norm_fwd_reg(const T* x, kh_i64 sx, const T* res, kh_i64 sr,
                                             const T* w, const T* b, T* y, kh_i64 sy, T* res_out,
                                             kh_i64 sro, float* mean_out, float* rstd_out,
                                             kh_i64 rows, int cols, float eps) {
  typedef kh_raw<T, VEC> Raw;
  __shared__ float red[96];
  const int tpr = blockDim.x, tx = threadIdx.x;
  const kh_i64 row = (kh_i64)blockIdx.x * blockDim.y + threadIdx.y;
  const bool valid = row < rows;
  const int nvec = cols / VEC;
  const kh_i64 r = valid ? row : 0;
  const T* xrow = x + r * sx;

  Raw xs[kFwdMaxVec];
  Raw rs[kFwdMaxVec];
  Raw ws[kFwdMaxVec];
  Raw bs[kFwdMaxVec];
  // Issue every load of the row before the first use (bytes in flight).
#pragma unroll
  for (int k = 0; k < kFwdMaxVec; ++k) {
    const int v = tx + k * tpr;
    if (valid && v < nvec) {
      xs[k] = kh_load_raw<T, VEC, KH_LOAD_STREAM>(xrow + (kh_i64)v * VEC);
      if constexpr (KIND == kAddRms)
        rs[k] = kh_load_raw<T, VEC, KH_LOAD_STREAM>(res + r * sr + (kh_i64)v * VEC);
    }
  }
#if !KH_NORM_PARAMS_LATE
  load_params<T, VEC, KIND>(ws, bs, w, b, tx, tpr, nvec, valid);
#endif
  if constexpr (KIND == kAddRms) {
    // s = round(x + residual): the stored residual is what gets normalized.
#pragma unroll
    for (int k = 0; k < kFwdMaxVec; ++k) {
      const int v = tx + k * tpr;
      if (valid && v < nvec) {
        float a[VEC], c[VEC];
        kh_unpack<T, VEC>(xs[k], a);
        kh_unpack<T, VEC>(rs[k], c);
#pragma unroll
        for (int i = 0; i < VEC; ++i) a[i] += c[i];
        xs[k] = kh_pack<T, VEC>(a);
        kh_store_raw<T, VEC>(res_out + r * sro + (kh_i64)v * VEC, xs[k]);
      }
    }
  }
  const float inv_n = 1.0f / (float)cols;
  float mean = 0.f, rstd;
  if constexpr (KIND == kLayer) {
    ln_reg_stats<T, VEC>(xs, valid, tx, tpr, nvec, inv_n, eps, red, mean, rstd);
  } else {
    float acc = 0.f;
#pragma unroll
    for (int k = 0; k < kFwdMaxVec; ++k) {
      const int v = tx + k * tpr;
      if (valid && v < nvec) {
        float f[VEC];
        kh_unpack<T, VEC>(xs[k], f);
#pragma unroll
        for (int i = 0; i < VEC; ++i) acc += f[i] * f[i];
      }
    }
    rstd = rsqrtf(kh_row_sum(acc, red) * inv_n + eps);
  }
#if KH_NORM_PARAMS_LATE
  load_params<T, VEC, KIND>(ws, bs, w, b, tx, tpr, nvec, valid);
#endif
  if (valid && tx == 0) {
    if (rstd_out) rstd_out[row] = rstd;
    if (KIND == kLayer && mean_out) mean_out[row] = mean;
  }
  T* yrow = y + r * sy;
#pragma unroll
  for (int k = 0; k < kFwdMaxVec; ++k) {
    const int v = tx + k * tpr;
    if (valid && v < nvec) {
      float f[VEC], g[VEC], o[VEC];
      kh_unpack<T, VEC>(xs[k], f);
      kh_unpack<T, VEC>(ws[k], g);
      if constexpr (KIND == kLayer) {
        float h[VEC];
        kh_unpack<T, VEC>(bs[k], h);
#pragma unroll
        for (int i = 0; i < VEC; ++i) o[i] = (f[i] - mean) * rstd * g[i] + h[i];
      } else {
#pragma unroll
        for (int i = 0; i < VEC; ++i) o[i] = f[i] * rstd * g[i];
      }
      kh_store_raw<T, VEC>(yrow + (kh_i64)v * VEC, kh_pack<T, VEC>(o));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Forward, long rows: one CTA per row, the row streamed two (RMS) or three (LayerNorm) times.
template <typename T, int VEC, int KIND>
__device__ __forceinline__ void norm_fwd_loop(const T* x, kh_i64 sx, const T* res, kh_i64 sr,
                                              const T* w, const T* b, T* y, kh_i64 sy, T* res_out,
                                              kh_i64 sro, float* mean_out, float* rstd_out,
                                              kh_i64 rows, int cols, float eps) {
  typedef kh_raw<T, VEC> Raw;
  __shared__ float red[32];
  const int tpr = blockDim.x, tx = threadIdx.x;
  const kh_i64 row = blockIdx.x;
  if (row >= rows) return;  // uniform over the CTA
  const int nvec = cols / VEC;
  const T* xrow = x + row * sx;
  // The normalized source: x, or the new residual this thread wrote in pass 1.
  const T* src = KIND == kAddRms ? (const T*)(res_out + row * sro) : xrow;
  const float inv_n = 1.0f / (float)cols;

  float acc = 0.f;
  for (int base = tx; base < nvec; base += kLoopUnroll * tpr) {
    Raw a[kLoopUnroll], c[kLoopUnroll];
#pragma unroll
    for (int u = 0; u < kLoopUnroll; ++u) {
      const int v = base + u * tpr;
      if (v < nvec) {
        a[u] = kh_load_raw<T, VEC, KH_LOAD_STREAM>(xrow + (kh_i64)v * VEC);
        if constexpr (KIND == kAddRms)
          c[u] = kh_load_raw<T, VEC, KH_LOAD_STREAM>(res + row * sr + (kh_i64)v * VEC);
      }
    }
#pragma unroll
    for (int u = 0; u < kLoopUnroll; ++u) {
      const int v = base + u * tpr;
      if (v < nvec) {
        float f[VEC];
        kh_unpack<T, VEC>(a[u], f);
        if constexpr (KIND == kAddRms) {
          float g[VEC];
          kh_unpack<T, VEC>(c[u], g);
#pragma unroll
          for (int i = 0; i < VEC; ++i) f[i] += g[i];
          Raw s = kh_pack<T, VEC>(f);
          kh_store_raw<T, VEC>(res_out + row * sro + (kh_i64)v * VEC, s);
          kh_unpack<T, VEC>(s, f);
        }
#pragma unroll
        for (int i = 0; i < VEC; ++i) acc += KIND == kLayer ? f[i] : f[i] * f[i];
      }
    }
  }
  float mean = 0.f, rstd;
  if constexpr (KIND == kLayer) {
    mean = kh_row_sum(acc, red) * inv_n;
    float acc2 = 0.f;
    for (int base = tx; base < nvec; base += kLoopUnroll * tpr) {
      Raw a[kLoopUnroll];
#pragma unroll
      for (int u = 0; u < kLoopUnroll; ++u) {
        const int v = base + u * tpr;
        if (v < nvec) a[u] = kh_load_raw<T, VEC, KH_LOAD_PLAIN>(xrow + (kh_i64)v * VEC);
      }
#pragma unroll
      for (int u = 0; u < kLoopUnroll; ++u) {
        const int v = base + u * tpr;
        if (v < nvec) {
          float f[VEC];
          kh_unpack<T, VEC>(a[u], f);
#pragma unroll
          for (int i = 0; i < VEC; ++i) acc2 += (f[i] - mean) * (f[i] - mean);
        }
      }
    }
    rstd = rsqrtf(kh_row_sum(acc2, red) * inv_n + eps);
  } else {
    rstd = rsqrtf(kh_row_sum(acc, red) * inv_n + eps);
  }
  if (tx == 0) {
    if (rstd_out) rstd_out[row] = rstd;
    if (KIND == kLayer && mean_out) mean_out[row] = mean;
  }
  T* yrow = y + row * sy;
  for (int base = tx; base < nvec; base += kLoopUnroll * tpr) {
    Raw a[kLoopUnroll], g[kLoopUnroll], h[kLoopUnroll];
#pragma unroll
    for (int u = 0; u < kLoopUnroll; ++u) {
      const int v = base + u * tpr;
      if (v < nvec) {
        a[u] = kh_load_raw<T, VEC, KH_LOAD_PLAIN>(src + (kh_i64)v * VEC);
        g[u] = kh_load_raw<T, VEC, KH_LOAD_READONLY>(w + v * VEC);
        if constexpr (KIND == kLayer) h[u] = kh_load_raw<T, VEC, KH_LOAD_READONLY>(b + v * VEC);
      }
    }
#pragma unroll
    for (int u = 0; u < kLoopUnroll; ++u) {
      const int v = base + u * tpr;
      if (v < nvec) {
        float f[VEC], gw[VEC], o[VEC];
        kh_unpack<T, VEC>(a[u], f);
        kh_unpack<T, VEC>(g[u], gw);
        if constexpr (KIND == kLayer) {
          float hb[VEC];
          kh_unpack<T, VEC>(h[u], hb);
#pragma unroll
          for (int i = 0; i < VEC; ++i) o[i] = (f[i] - mean) * rstd * gw[i] + hb[i];
        } else {
#pragma unroll
          for (int i = 0; i < VEC; ++i) o[i] = f[i] * rstd * gw[i];
        }
        kh_store_raw<T, VEC>(yrow + (kh_i64)v * VEC, kh_pack<T, VEC>(o));
      }
    }
  }
}

// Stores VEC fp32 partials (16-byte stores when VEC is a multiple of 4).
template <int VEC>
__device__ __forceinline__ void store_partials(float* p, const float (&f)[VEC]) {
  if constexpr (VEC % 4 == 0) {
#pragma unroll
    for (int i = 0; i < VEC; i += 4) {
      kh_u32x4 q;
      q.x = kh_float_bits(f[i]);
      q.y = kh_float_bits(f[i + 1]);
      q.z = kh_float_bits(f[i + 2]);
      q.w = kh_float_bits(f[i + 3]);
      kh_st(p + i, q);
    }
  } else {
#pragma unroll
    for (int i = 0; i < VEC; ++i) p[i] = f[i];
  }
}

// ---------------------------------------------------------------------------------------------
// Backward, rows in registers. dx = rstd * (g - xhat * mean(g * xhat) - mean(g)) with g = dy * w
// (the mean(g) term for LayerNorm only), plus dresidual when given; partials of dy * xhat (and
// dy for the bias) per walker.
template <typename T, int VEC, bool LN, bool FROM_Y = false>
__device__ __forceinline__ void norm_bwd_reg(const T* dy, kh_i64 sdy, const T* x, kh_i64 sx,
                                             const T* w, const float* mean, const float* rstd,
                                             const T* dres, kh_i64 sdres, T* dx, kh_i64 sdx,
                                             float* ws, kh_i64 sws, kh_i64 walkers, kh_i64 rows,
                                             int cols) {
  typedef kh_raw<T, VEC> Raw;
  __shared__ float red[64];
  const int tpr = blockDim.x, tx = threadIdx.x;
  const kh_i64 walker = (kh_i64)blockIdx.x * blockDim.y + threadIdx.y;
  const bool active = walker < walkers;
  const int nvec = cols / VEC;
  const float inv_n = 1.0f / (float)cols;
  // The same trip count for every thread of the CTA: the row reductions synchronize.
  const kh_i64 iters = (rows + walkers - 1) / walkers;

  // Weights are re-read per row from L1 (read-only path) rather than held: registers go to the
  // row and the partials.
  float dw_acc[kBwdMaxVec][VEC];
  float db_acc[LN ? kBwdMaxVec : 1][VEC];
#pragma unroll
  for (int k = 0; k < kBwdMaxVec; ++k) {
#pragma unroll
    for (int i = 0; i < VEC; ++i) {
      dw_acc[k][i] = 0.f;
      if constexpr (LN) db_acc[k][i] = 0.f;
    }
  }

  for (kh_i64 it = 0; it < iters; ++it) {
    const kh_i64 row = walker + it * walkers;
    const bool valid = active && row < rows;
    const kh_i64 r = valid ? row : 0;
    // dresidual is loaded with the row (not at the store, where its latency stood exposed
    // behind the row reduction).
    Raw xs[kBwdMaxVec], ds[kBwdMaxVec], es[kBwdMaxVec];
#pragma unroll
    for (int k = 0; k < kBwdMaxVec; ++k) {
      const int v = tx + k * tpr;
      if (valid && v < nvec) {
        xs[k] = kh_load_raw<T, VEC, KH_LOAD_STREAM>(x + r * sx + (kh_i64)v * VEC);
        ds[k] = kh_load_raw<T, VEC, KH_LOAD_STREAM>(dy + r * sdy + (kh_i64)v * VEC);
        if (!LN && dres)
          es[k] = kh_load_raw<T, VEC, KH_LOAD_STREAM>(dres + r * sdres + (kh_i64)v * VEC);
      }
    }
    const float mu = (LN && valid) ? mean[r] : 0.f;
    const float rs = valid ? rstd[r] : 0.f;
    float s_gx = 0.f, s_g = 0.f;
#pragma unroll
    for (int k = 0; k < kBwdMaxVec; ++k) {
      const int v = tx + k * tpr;
      if (valid && v < nvec) {
        float f[VEC], d[VEC], g[VEC];
        kh_unpack<T, VEC>(xs[k], f);
        kh_unpack<T, VEC>(ds[k], d);
        kh_unpack<T, VEC>(kh_load_raw<T, VEC, KH_LOAD_READONLY>(w + v * VEC), g);
#pragma unroll
        for (int i = 0; i < VEC; ++i) {
          const float xhat = bwd_xhat<FROM_Y>(f[i], g[i], mu, rs);
          const float gi = d[i] * g[i];
          s_gx += gi * xhat;
          if constexpr (LN) s_g += gi;
        }
      }
    }
    if constexpr (LN) {
      kh_row_sum2(s_gx, s_g, red);
    } else {
      s_gx = kh_row_sum(s_gx, red);
    }
    const float c1 = s_gx * inv_n, c2 = s_g * inv_n;
#pragma unroll
    for (int k = 0; k < kBwdMaxVec; ++k) {
      const int v = tx + k * tpr;
      if (valid && v < nvec) {
        float f[VEC], d[VEC], g[VEC], o[VEC];
        kh_unpack<T, VEC>(xs[k], f);
        kh_unpack<T, VEC>(ds[k], d);
        kh_unpack<T, VEC>(kh_load_raw<T, VEC, KH_LOAD_READONLY>(w + v * VEC), g);
        if (!LN && dres) {
          kh_unpack<T, VEC>(es[k], o);
        } else {
#pragma unroll
          for (int i = 0; i < VEC; ++i) o[i] = 0.f;
        }
#pragma unroll
        for (int i = 0; i < VEC; ++i) {
          const float xhat = bwd_xhat<FROM_Y>(f[i], g[i], mu, rs);
          o[i] += rs * (d[i] * g[i] - xhat * c1 - c2);
          dw_acc[k][i] += d[i] * xhat;
          if constexpr (LN) db_acc[k][i] += d[i];
        }
        kh_store_raw<T, VEC>(dx + r * sdx + (kh_i64)v * VEC, kh_pack<T, VEC>(o));
      }
    }
  }
  if (blockDim.y == 1) {  // long rows: the walker's own workspace row
    if (!active) return;
    float* part = ws + walker * sws;
#pragma unroll
    for (int k = 0; k < kBwdMaxVec; ++k) {
      const int v = tx + k * tpr;
      if (v < nvec) {
        store_partials<VEC>(part + v * VEC, dw_acc[k]);
        if constexpr (LN) store_partials<VEC>(part + cols + v * VEC, db_acc[k]);
      }
    }
    return;
  }
  // Short rows, several walkers per CTA: they sum their partials in shared memory (walker order,
  // deterministic) into the CTA's one workspace row. Many walkers (the parallelism short rows
  // need) then cost no more partial rows for the reduce kernel than one walker per CTA would.
  extern __shared__ float cta_part[];  // [blockDim.y][(LN ? 2 : 1) * cols], launch-sized
  const int kc = (LN ? 2 : 1) * cols;
#pragma unroll
  for (int k = 0; k < kBwdMaxVec; ++k) {
    const int v = tx + k * tpr;
    if (v < nvec) {
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        cta_part[threadIdx.y * kc + v * VEC + i] = active ? dw_acc[k][i] : 0.f;
        if constexpr (LN)
          cta_part[threadIdx.y * kc + cols + v * VEC + i] = active ? db_acc[k][i] : 0.f;
      }
    }
  }
  __syncthreads();
  float* part = ws + (kh_i64)blockIdx.x * sws;
  for (int c = threadIdx.y * tpr + tx; c < kc; c += tpr * blockDim.y) {
    float t = 0.f;
    for (int j = 0; j < (int)blockDim.y; ++j) t += cta_part[j * kc + c];
    part[c] = t;
  }
}

// ---------------------------------------------------------------------------------------------
// Backward, long rows: one CTA of blockDim.x threads per walker; the walker's partial row lives
// in its workspace row (read-modify-write by the thread that owns each column).
template <typename T, int VEC, bool LN, bool FROM_Y = false>
__device__ __forceinline__ void norm_bwd_loop(const T* dy, kh_i64 sdy, const T* x, kh_i64 sx,
                                              const T* w, const float* mean, const float* rstd,
                                              const T* dres, kh_i64 sdres, T* dx, kh_i64 sdx,
                                              float* ws, kh_i64 sws, kh_i64 walkers, kh_i64 rows,
                                              int cols) {
  typedef kh_raw<T, VEC> Raw;
  __shared__ float red[64];
  const int tpr = blockDim.x, tx = threadIdx.x;
  const kh_i64 walker = blockIdx.x;
  if (walker >= walkers) return;  // uniform over the CTA
  const int nvec = cols / VEC;
  const float inv_n = 1.0f / (float)cols;
  float* part = ws + walker * sws;
  bool first = true;
  for (kh_i64 row = walker; row < rows; row += walkers) {
    const T* xrow = x + row * sx;
    const T* dyrow = dy + row * sdy;
    const float mu = LN ? mean[row] : 0.f;
    const float rs = rstd[row];
    float s_gx = 0.f, s_g = 0.f;
    for (int base = tx; base < nvec; base += kBwdLoopUnroll * tpr) {
      Raw a[kBwdLoopUnroll], d[kBwdLoopUnroll], g[kBwdLoopUnroll];
#pragma unroll
      for (int u = 0; u < kBwdLoopUnroll; ++u) {
        const int v = base + u * tpr;
        if (v < nvec) {
          a[u] = kh_load_raw<T, VEC, KH_LOAD_PLAIN>(xrow + (kh_i64)v * VEC);
          d[u] = kh_load_raw<T, VEC, KH_LOAD_PLAIN>(dyrow + (kh_i64)v * VEC);
          g[u] = kh_load_raw<T, VEC, KH_LOAD_READONLY>(w + v * VEC);
        }
      }
#pragma unroll
      for (int u = 0; u < kBwdLoopUnroll; ++u) {
        const int v = base + u * tpr;
        if (v < nvec) {
          float f[VEC], e[VEC], h[VEC];
          kh_unpack<T, VEC>(a[u], f);
          kh_unpack<T, VEC>(d[u], e);
          kh_unpack<T, VEC>(g[u], h);
#pragma unroll
          for (int i = 0; i < VEC; ++i) {
            const float gi = e[i] * h[i];
            s_gx += gi * bwd_xhat<FROM_Y>(f[i], h[i], mu, rs);
            if constexpr (LN) s_g += gi;
          }
        }
      }
    }
    if constexpr (LN) {
      kh_row_sum2(s_gx, s_g, red);
    } else {
      s_gx = kh_row_sum(s_gx, red);
    }
    const float c1 = s_gx * inv_n, c2 = s_g * inv_n;
    for (int base = tx; base < nvec; base += kBwdLoopUnroll * tpr) {
      Raw a[kBwdLoopUnroll], d[kBwdLoopUnroll], g[kBwdLoopUnroll];
#pragma unroll
      for (int u = 0; u < kBwdLoopUnroll; ++u) {
        const int v = base + u * tpr;
        if (v < nvec) {
          a[u] = kh_load_raw<T, VEC, KH_LOAD_STREAM>(xrow + (kh_i64)v * VEC);
          d[u] = kh_load_raw<T, VEC, KH_LOAD_STREAM>(dyrow + (kh_i64)v * VEC);
          g[u] = kh_load_raw<T, VEC, KH_LOAD_READONLY>(w + v * VEC);
        }
      }
#pragma unroll
      for (int u = 0; u < kBwdLoopUnroll; ++u) {
        const int v = base + u * tpr;
        if (v < nvec) {
          float f[VEC], e[VEC], h[VEC], o[VEC];
          kh_unpack<T, VEC>(a[u], f);
          kh_unpack<T, VEC>(d[u], e);
          kh_unpack<T, VEC>(g[u], h);
          if (!LN && dres) {
            kh_unpack<T, VEC>(
                kh_load_raw<T, VEC, KH_LOAD_STREAM>(dres + row * sdres + (kh_i64)v * VEC), o);
          } else {
#pragma unroll
            for (int i = 0; i < VEC; ++i) o[i] = 0.f;
          }
          float* pw = part + v * VEC;
          float* pb = part + cols + v * VEC;
#pragma unroll
          for (int i = 0; i < VEC; ++i) {
            const float xhat = bwd_xhat<FROM_Y>(f[i], h[i], mu, rs);
            o[i] += rs * (e[i] * h[i] - xhat * c1 - c2);
            pw[i] = (first ? 0.f : pw[i]) + e[i] * xhat;
            if constexpr (LN) pb[i] = (first ? 0.f : pb[i]) + e[i];
          }
          kh_store_raw<T, VEC>(dx + row * sdx + (kh_i64)v * VEC, kh_pack<T, VEC>(o));
        }
      }
    }
    first = false;
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Entry points. One parameter list per direction, so host.cpp builds one argument array.
#define KH_NORM_FWD_PARAMS(T)                                                              \
  const T *x, kh_i64 sx, const T *res, kh_i64 sr, const T *w, const T *b, T *y, kh_i64 sy, \
      T *res_out, kh_i64 sro, float *mean_out, float *rstd_out, kh_i64 rows, int cols, float eps
#define KH_NORM_FWD_ARGS \
  x, sx, res, sr, w, b, y, sy, res_out, sro, mean_out, rstd_out, rows, cols, eps

#define KH_NORM_BWD_PARAMS(T)                                                                   \
  const T *dy, kh_i64 sdy, const T *x, kh_i64 sx, const T *w, const float *mean,                \
      const float *rstd, const T *dres, kh_i64 sdres, T *dx, kh_i64 sdx, float *ws, kh_i64 sws, \
      kh_i64 walkers, kh_i64 rows, int cols
#define KH_NORM_BWD_ARGS \
  dy, sdy, x, sx, w, mean, rstd, dres, sdres, dx, sdx, ws, sws, walkers, rows, cols

#define KH_NORM_FWD_KERNEL(KNAME, TNAME, T, VEC, VNAME, KIND)              \
  extern "C" __global__ void __launch_bounds__(512)                        \
      norm_fwd_##KNAME##_##TNAME##_##VNAME##_reg(KH_NORM_FWD_PARAMS(T)) {  \
    kh_pdl_enter();                                                        \
    norm_fwd_reg<T, VEC, KIND>(KH_NORM_FWD_ARGS);                          \
  }                                                                        \
  extern "C" __global__ void __launch_bounds__(kLoopThreads)               \
      norm_fwd_##KNAME##_##TNAME##_##VNAME##_loop(KH_NORM_FWD_PARAMS(T)) { \
    kh_pdl_enter();                                                        \
    norm_fwd_loop<T, VEC, KIND>(KH_NORM_FWD_ARGS);                         \
  }

#define KH_NORM_BWD_KERNEL(KNAME, TNAME, T, VEC, VNAME, LN, FROM_Y)        \
  extern "C" __global__ void __launch_bounds__(512)                        \
      norm_bwd_##KNAME##_##TNAME##_##VNAME##_reg(KH_NORM_BWD_PARAMS(T)) {  \
    kh_pdl_enter();                                                        \
    norm_bwd_reg<T, VEC, LN, FROM_Y>(KH_NORM_BWD_ARGS);                    \
  }                                                                        \
  extern "C" __global__ void __launch_bounds__(kLoopThreads)               \
      norm_bwd_##KNAME##_##TNAME##_##VNAME##_loop(KH_NORM_BWD_PARAMS(T)) { \
    kh_pdl_enter();                                                        \
    norm_bwd_loop<T, VEC, LN, FROM_Y>(KH_NORM_BWD_ARGS);                   \
  }

#define KH_NORM_DTYPE(TNAME, T)                                        \
  KH_NORM_FWD_KERNEL(rms, TNAME, T, kh_vec16<T>::n, vec, kRms)         \
  KH_NORM_FWD_KERNEL(rms, TNAME, T, 1, scalar, kRms)                   \
  KH_NORM_FWD_KERNEL(add_rms, TNAME, T, kh_vec16<T>::n, vec, kAddRms)  \
  KH_NORM_FWD_KERNEL(add_rms, TNAME, T, 1, scalar, kAddRms)            \
  KH_NORM_FWD_KERNEL(ln, TNAME, T, kh_vec16<T>::n, vec, kLayer)        \
  KH_NORM_FWD_KERNEL(ln, TNAME, T, 1, scalar, kLayer)                  \
  KH_NORM_BWD_KERNEL(rms, TNAME, T, kh_vec16<T>::n, vec, false, false) \
  KH_NORM_BWD_KERNEL(rms, TNAME, T, 1, scalar, false, false)           \
  KH_NORM_BWD_KERNEL(rmsy, TNAME, T, kh_vec16<T>::n, vec, false, true) \
  KH_NORM_BWD_KERNEL(rmsy, TNAME, T, 1, scalar, false, true)           \
  KH_NORM_BWD_KERNEL(ln, TNAME, T, kh_vec16<T>::n, vec, true, false)   \
  KH_NORM_BWD_KERNEL(ln, TNAME, T, 1, scalar, true, false)             \
  KH_REDUCE_PARTIALS_KERNEL(norm_reduce_partials_##TNAME, T)

KH_NORM_DTYPE(bf16, kh_bf16)
KH_NORM_DTYPE(fp16, kh_fp16)
KH_NORM_DTYPE(fp32, float)
