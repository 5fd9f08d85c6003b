// Device code of the softmax package: Softmax over the last dimension (forward and backward)
// and CrossEntropy over large vocabularies (forward: fp32 loss per token; train: the loss fused
// with the gradient softmax - onehot, times grad_scale; backward: the gradient times the incoming
// per-token loss gradient). bf16/fp16/fp32 storage, fp32 math.
//
// FusedLinearCrossEntropy's elementwise part (linear_ce.cpp runs its GEMMs through the loader's
// GEMM service): lce_count (1 / the number of tokens not ignored, on the device so that no sync
// is needed), lce_grad (ce_train with that scale read from device memory: per-token loss and
// dlogits in place, chunk by chunk), lce_loss (the mean, one CTA, a fixed summation order) and
// lce_scale (backward: d_hidden, d_weight times the upstream scalar; zero fill for no tokens).
//
// Header-free for NVRTC: the build inlines softmax_math.h and kh_prelude.cuh. Kernels are
// extern "C", named <softmax_fwd|softmax_bwd|ce_fwd|ce_train|ce_bwd>_<bf16|fp16|fp32>_<vec|scalar>.
// Geometry (host.cpp, launch_config.h): blockDim = (threads_per_row, rows_per_block), gridDim.x
// covers the rows; a row's threads stride over its 16-byte vectors (vec) or elements (scalar).
// The forward statistics are an online softmax: one pass keeps a running max and the sum of
// exp(x - max) per thread, merged across the row; a second pass (softmax, CE train) re-reads the
// row (from L2 for the long rows) to write the output.
#include "softmax_math.h"

namespace {

// exp(x - m) as 2^(x * log2(e) - m * log2(e)): one FFMA and one MUFU.EX2 per element instead
// of expf's ~9 instructions (the stats loop was issue-bound next to its loads). The FFMA keeps
// x * log2(e) unrounded; the rounding of m * log2(e) is one factor common to every term of a
// row, which cancels in softmax and moves a log-sum-exp by about 1e-7 |m|. ex2.approx is within
// 2 ulp; -inf gives 0.
constexpr float kLog2e = 1.4426950408889634f;
__device__ __forceinline__ float ex2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ float exp_shifted(float x, float m_log2e) {
  return ex2_approx(fmaf(x, kLog2e, -m_log2e));
}

// kh_sm_accumulate with exp_shifted: adds VEC values to this thread's partial (m, s).
template <int VEC>
__device__ __forceinline__ void sm_accumulate(float& m, float& s, const float (&a)[VEC]) {
  float lm = a[0];
#pragma unroll
  for (int i = 1; i < VEC; ++i) lm = lm > a[i] ? lm : a[i];
  if (lm > m) {
    s = m == KH_SM_NEG_INF ? 0.f : s * ex2_approx((m - lm) * kLog2e);
    m = lm;
  }
  if (m != KH_SM_NEG_INF) {
    const float ml = m * kLog2e;
#pragma unroll
    for (int i = 0; i < VEC; ++i) s += exp_shifted(a[i], ml);
  }
}

// Merges every thread's (m, s) of one row; every thread of the row gets the same bits. All
// threads of the CTA must call it. red: __shared__ float[64].
__device__ __forceinline__ void row_merge(float& m, float& s, float* red) {
  const int tpr = blockDim.x;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    const float m2 = __shfl_xor_sync(0xFFFFFFFFu, m, off);
    const float s2 = __shfl_xor_sync(0xFFFFFFFFu, s, off);
    kh_sm_merge(m, s, m2, s2);
  }
  if (tpr > 32) {
    const int wpr = tpr >> 5;
    const int base = threadIdx.y * wpr;
    if ((threadIdx.x & 31) == 0) {
      red[base + (threadIdx.x >> 5)] = m;
      red[32 + base + (threadIdx.x >> 5)] = s;
    }
    __syncthreads();
    m = KH_SM_NEG_INF;
    s = 0.f;
    for (int i = 0; i < wpr; ++i) kh_sm_merge(m, s, red[base + i], red[32 + base + i]);
    __syncthreads();
  }
}

// This thread's (max, sum of exp(x - max)) over the row's vectors first + threadIdx.x,
// first + threadIdx.x + blockDim.x, ... < n. kStatsUnroll loads are issued before their math so
// that each thread keeps several 16-byte loads in flight (REFERENCE 6.3 item 9). On the H200
// (4096 x 128256 bf16 cross-entropy) 4 was 12% slower than 2: it took the 1024-thread kernels
// past 32 registers, so one CTA per SM instead of two; 2 matched the plain loop there and
// gained 2-5% on softmax.
constexpr int kStatsUnroll = 2;
template <typename T, int VEC>
__device__ __forceinline__ void thread_stats(const T* xr, int first, int n, float& m, float& s) {
  typedef kh_raw<T, VEC> Raw;
  m = KH_SM_NEG_INF;
  s = 0.f;
  for (int v0 = first + threadIdx.x; v0 < n; v0 += kStatsUnroll * blockDim.x) {
    Raw r[kStatsUnroll];
#pragma unroll
    for (int u = 0; u < kStatsUnroll; ++u) {
      const int v = v0 + u * blockDim.x;
      if (v < n) r[u] = kh_load_raw<T, VEC, KH_LOAD_PLAIN>(xr + (kh_i64)v * VEC);
    }
#pragma unroll
    for (int u = 0; u < kStatsUnroll; ++u) {
      const int v = v0 + u * blockDim.x;
      if (v < n) {
        float a[VEC];
        kh_unpack<T, VEC>(r[u], a);
        sm_accumulate<VEC>(m, s, a);
      }
    }
  }
}

// The row's (max, sum of exp(x - max)) over n vectors, in every thread of the row.
template <typename T, int VEC>
__device__ __forceinline__ void row_stats(const T* xr, int n, float& m, float& s, float* red) {
  thread_stats<T, VEC>(xr, 0, n, m, s);
  row_merge(m, s, red);
}

template <typename T, int VEC>
__device__ __forceinline__ void softmax_fwd(const T* x, kh_i64 sx, T* y, kh_i64 sy, kh_i64 rows,
                                            int cols) {
  __shared__ float red[64];
  const kh_i64 row = (kh_i64)blockIdx.x * blockDim.y + threadIdx.y;
  const bool valid = row < rows;
  const int nvec = valid ? cols / VEC : 0;  // threads of a missing row still synchronize
  const T* xr = x + (valid ? row : 0) * sx;
  float m, s;
  row_stats<T, VEC>(xr, nvec, m, s, red);
  const float inv = 1.f / s, ml = m * kLog2e;
  T* yr = y + (valid ? row : 0) * sy;
  for (int v = threadIdx.x; v < nvec; v += blockDim.x) {
    float a[VEC];
    kh_unpack<T, VEC>(kh_load_raw<T, VEC, KH_LOAD_PLAIN>(xr + (kh_i64)v * VEC), a);
#pragma unroll
    for (int i = 0; i < VEC; ++i) a[i] = exp_shifted(a[i], ml) * inv;
    kh_store_raw<T, VEC>(yr + (kh_i64)v * VEC, kh_pack<T, VEC>(a));
  }
}

// dx = y * (dy - sum(dy * y)).
template <typename T, int VEC>
__device__ __forceinline__ void softmax_bwd(const T* dy, kh_i64 sdy, const T* y, kh_i64 sy, T* dx,
                                            kh_i64 sdx, kh_i64 rows, int cols) {
  __shared__ float red[32];
  const kh_i64 row = (kh_i64)blockIdx.x * blockDim.y + threadIdx.y;
  const bool valid = row < rows;
  const int nvec = valid ? cols / VEC : 0;
  const T* dyr = dy + (valid ? row : 0) * sdy;
  const T* yr = y + (valid ? row : 0) * sy;
  float dot = 0.f;
  for (int v = threadIdx.x; v < nvec; v += blockDim.x) {
    float a[VEC], b[VEC];
    kh_unpack<T, VEC>(kh_load_raw<T, VEC, KH_LOAD_PLAIN>(dyr + (kh_i64)v * VEC), a);
    kh_unpack<T, VEC>(kh_load_raw<T, VEC, KH_LOAD_PLAIN>(yr + (kh_i64)v * VEC), b);
#pragma unroll
    for (int i = 0; i < VEC; ++i) dot += a[i] * b[i];
  }
  dot = kh_row_sum(dot, red);
  T* dxr = dx + (valid ? row : 0) * sdx;
  for (int v = threadIdx.x; v < nvec; v += blockDim.x) {
    float a[VEC], b[VEC];
    kh_unpack<T, VEC>(kh_load_raw<T, VEC, KH_LOAD_PLAIN>(dyr + (kh_i64)v * VEC), a);
    kh_unpack<T, VEC>(kh_load_raw<T, VEC, KH_LOAD_PLAIN>(yr + (kh_i64)v * VEC), b);
#pragma unroll
    for (int i = 0; i < VEC; ++i) a[i] = b[i] * (a[i] - dot);
    kh_store_raw<T, VEC>(dxr + (kh_i64)v * VEC, kh_pack<T, VEC>(a));
  }
}

// Vectors per thread of a cross-entropy row kept in registers from the statistics to the
// gradient pass (RES; -D switches for tuning sweeps). The resident part is read from memory once
// and takes one exp per element (its maximum first, no rescaling); the rest of the row is
// streamed (and re-read by the gradient pass). Measured on the H200 at 4096 x 128256 bf16, one
// 1024-thread CTA per row: eval 409.7 us with 0, 467.6 with 4; train 826.2 us with 0, 890.6 with
// 4, 866.7 with 6. Resident vectors take the kernels past 32 registers, so one CTA per SM instead
// of two, and the second CTA hides more than the saved L2 re-reads (7 and 8 also spill under the
// 64-register bound). So none by default; the scalar (misaligned) kernels never keep any.
#ifndef KH_CE_FWD_RES
#define KH_CE_FWD_RES 0
#endif
#ifndef KH_CE_TRAIN_RES
#define KH_CE_TRAIN_RES 0
#endif
template <int VEC>
struct CeRes {
  static constexpr int fwd = VEC == 1 ? 0 : KH_CE_FWD_RES;
  static constexpr int train = VEC == 1 ? 0 : KH_CE_TRAIN_RES;
};

// Adds the resident vectors (v = threadIdx.x + k * blockDim.x < n) to this thread's (m, s).
template <typename T, int VEC, int RES>
__device__ __forceinline__ void resident_stats(const kh_raw<T, VEC> (&keep)[RES], int n, float& m,
                                               float& s) {
  float lm = KH_SM_NEG_INF;
#pragma unroll
  for (int k = 0; k < RES; ++k) {
    if ((int)threadIdx.x + k * (int)blockDim.x < n) {
      float a[VEC];
      kh_unpack<T, VEC>(keep[k], a);
#pragma unroll
      for (int i = 0; i < VEC; ++i) lm = lm > a[i] ? lm : a[i];
    }
  }
  if (!(lm <= m)) {  // lm > m, or a NaN (which then reaches s below)
    s = m == KH_SM_NEG_INF ? 0.f : s * ex2_approx((m - lm) * kLog2e);
    m = lm;
  }
  if (m == KH_SM_NEG_INF) return;
  const float ml = m * kLog2e;
#pragma unroll
  for (int k = 0; k < RES; ++k) {
    if ((int)threadIdx.x + k * (int)blockDim.x < n) {
      float a[VEC];
      kh_unpack<T, VEC>(keep[k], a);
#pragma unroll
      for (int i = 0; i < VEC; ++i) s += exp_shifted(a[i], ml);
    }
  }
}

// One gradient vector: (softmax(x) - onehot(target)) * scale, zeros for an ignored row.
template <typename T, int VEC>
__device__ __forceinline__ kh_raw<T, VEC> ce_grad(const kh_raw<T, VEC>& x, kh_i64 col0,
                                                  kh_i64 target, bool ignored, float ml, float inv,
                                                  float scale) {
  float a[VEC];
  if (ignored) {
#pragma unroll
    for (int i = 0; i < VEC; ++i) a[i] = 0.f;
  } else {
    kh_unpack<T, VEC>(x, a);
#pragma unroll
    for (int i = 0; i < VEC; ++i)
      a[i] = (exp_shifted(a[i], ml) * inv - (col0 + i == target ? 1.f : 0.f)) * scale;
  }
  return kh_pack<T, VEC>(a);
}

// loss = logsumexp(x) - x[target] (0 for ignored tokens, NaN for a target outside [0, cols));
// TRAIN also writes dx = (softmax(x) - onehot(target)) * scale (zero rows for ignored tokens).
template <typename T, int VEC, bool TRAIN, int RES>
__device__ __forceinline__ void ce_fwd(const T* x, kh_i64 sx, const kh_i64* targets,
                                       kh_i64 ignore_index, float* loss, T* dx, kh_i64 sdx,
                                       float scale, kh_i64 rows, int cols) {
  typedef kh_raw<T, VEC> Raw;
  __shared__ float red[64];
  const kh_i64 row = (kh_i64)blockIdx.x * blockDim.y + threadIdx.y;
  const bool valid = row < rows;
  const kh_i64 target = valid ? targets[row] : ignore_index;
  const bool ignored = target == ignore_index;
  const int nvec = valid && !ignored ? cols / VEC : 0;
  const T* xr = x + (valid ? row : 0) * sx;
  const bool in_range = target >= 0 && target < cols;
  // The target logit, read before any thread writes dx (dx may be x itself: the barrier below
  // orders this read before the gradient pass).
  const float xt =
      valid && !ignored && in_range && threadIdx.x == 0 ? kh_to_float(xr[target]) : 0.f;
  // The resident vectors' loads go out first, then the streamed rest's.
  Raw keep[RES > 0 ? RES : 1];
#pragma unroll
  for (int k = 0; k < RES; ++k) {
    const int v = threadIdx.x + k * blockDim.x;
    if (v < nvec) keep[k] = kh_load_raw<T, VEC, KH_LOAD_PLAIN>(xr + (kh_i64)v * VEC);
  }
  const int first = RES * blockDim.x;  // the first streamed vector
  float m, s;
  thread_stats<T, VEC>(xr, first, nvec, m, s);
  if constexpr (RES > 0) resident_stats<T, VEC, RES>(keep, nvec, m, s);
  row_merge(m, s, red);
  if (valid && threadIdx.x == 0)
    loss[row] = ignored ? 0.f : in_range ? (m + logf(s)) - xt : __int_as_float(0x7fc00000);
  if constexpr (TRAIN) {
    __syncthreads();
    if (!valid) return;  // no barriers below
    T* dxr = dx + row * sdx;
    const int n = cols / VEC;
    const float inv = 1.f / s, ml = m * kLog2e;
#pragma unroll
    for (int k = 0; k < RES; ++k) {
      const int v = threadIdx.x + k * blockDim.x;
      if (v < n)
        kh_store_raw<T, VEC>(
            dxr + (kh_i64)v * VEC,
            ce_grad<T, VEC>(keep[k], (kh_i64)v * VEC, target, ignored, ml, inv, scale));
    }
    for (int v = first + threadIdx.x; v < n; v += blockDim.x) {
      Raw r = {};
      if (!ignored) r = kh_load_raw<T, VEC, KH_LOAD_PLAIN>(xr + (kh_i64)v * VEC);
      kh_store_raw<T, VEC>(dxr + (kh_i64)v * VEC,
                           ce_grad<T, VEC>(r, (kh_i64)v * VEC, target, ignored, ml, inv, scale));
    }
  }
}

// dx[row, :] *= dloss[row].
template <typename T, int VEC>
__device__ __forceinline__ void ce_bwd(const float* dloss, T* dx, kh_i64 sdx, kh_i64 rows,
                                       int cols) {
  const kh_i64 row = (kh_i64)blockIdx.x * blockDim.y + threadIdx.y;
  if (row >= rows) return;
  const float g = dloss[row];
  T* dxr = dx + row * sdx;
  const int n = cols / VEC;
  for (int v = threadIdx.x; v < n; v += blockDim.x) {
    float a[VEC];
    kh_unpack<T, VEC>(kh_load_raw<T, VEC, KH_LOAD_PLAIN>(dxr + (kh_i64)v * VEC), a);
#pragma unroll
    for (int i = 0; i < VEC; ++i) a[i] *= g;
    kh_store_raw<T, VEC>(dxr + (kh_i64)v * VEC, kh_pack<T, VEC>(a));
  }
}

}  // namespace

#define KH_SM_KERNELS(TNAME, T, VEC, VNAME)                                                       \
  extern "C" __global__ void __launch_bounds__(1024) softmax_fwd_##TNAME##_##VNAME(               \
      const T* x, kh_i64 sx, T* y, kh_i64 sy, kh_i64 rows, int cols) {                            \
    softmax_fwd<T, VEC>(x, sx, y, sy, rows, cols);                                                \
  }                                                                                               \
  extern "C" __global__ void __launch_bounds__(1024) softmax_bwd_##TNAME##_##VNAME(               \
      const T* dy, kh_i64 sdy, const T* y, kh_i64 sy, T* dx, kh_i64 sdx, kh_i64 rows, int cols) { \
    softmax_bwd<T, VEC>(dy, sdy, y, sy, dx, sdx, rows, cols);                                     \
  }                                                                                               \
  extern "C" __global__ void __launch_bounds__(1024) ce_fwd_##TNAME##_##VNAME(                    \
      const T* x, kh_i64 sx, const kh_i64* targets, kh_i64 ignore_index, float* loss, T* dx,      \
      kh_i64 sdx, float scale, kh_i64 rows, int cols) {                                           \
    ce_fwd<T, VEC, false, CeRes<VEC>::fwd>(x, sx, targets, ignore_index, loss, dx, sdx, scale,    \
                                           rows, cols);                                           \
  }                                                                                               \
  extern "C" __global__ void __launch_bounds__(1024) ce_train_##TNAME##_##VNAME(                  \
      const T* x, kh_i64 sx, const kh_i64* targets, kh_i64 ignore_index, float* loss, T* dx,      \
      kh_i64 sdx, float scale, kh_i64 rows, int cols) {                                           \
    ce_fwd<T, VEC, true, CeRes<VEC>::train>(x, sx, targets, ignore_index, loss, dx, sdx, scale,   \
                                            rows, cols);                                          \
  }                                                                                               \
  extern "C" __global__ void __launch_bounds__(1024)                                              \
      ce_bwd_##TNAME##_##VNAME(const float* dloss, T* dx, kh_i64 sdx, kh_i64 rows, int cols) {    \
    ce_bwd<T, VEC>(dloss, dx, sdx, rows, cols);                                                   \
  }

#define KH_SM_DTYPE(TNAME, T)                  \
  KH_SM_KERNELS(TNAME, T, kh_vec16<T>::n, vec) \
  KH_SM_KERNELS(TNAME, T, 1, scalar)

KH_SM_DTYPE(bf16, kh_bf16)
KH_SM_DTYPE(fp16, kh_fp16)
KH_SM_DTYPE(fp32, float)

// ---- FusedLinearCrossEntropy ----

namespace {

// Sum over a 1024-thread CTA, in a fixed order (deterministic).
__device__ __forceinline__ float cta_sum(float v, float* red) {
  red[threadIdx.x] = v;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) red[threadIdx.x] += red[threadIdx.x + half];
    __syncthreads();
  }
  return red[0];
}

template <typename T>
__device__ __forceinline__ void lce_scale(T* x, kh_i64 sx, kh_i64 rows, int cols, const float* g) {
  const float f = g ? *g : 0.f;
  if (g && f == 1.f) return;  // loss.backward(): the gradients are already right, skip a pass
  const kh_i64 total = rows * cols;
  for (kh_i64 i = (kh_i64)blockIdx.x * blockDim.x + threadIdx.x; i < total;
       i += (kh_i64)gridDim.x * blockDim.x) {
    T* p = sx == cols ? x + i : x + (i / cols) * sx + i % cols;  // compact: no division
    *p = kh_convert<T>::from_float(g ? kh_to_float(*p) * f : 0.f);
  }
}

}  // namespace

// inv_count[0] = 1 / #(labels != ignore_index), 0 when every token is ignored; inv_count[1] = 1
// (the scale of fp16 dlogits, which are scaled later). One CTA of 1024.
extern "C" __global__ void __launch_bounds__(1024)
    lce_count(const kh_i64* labels, kh_i64 n, kh_i64 ignore_index, float* inv_count) {
  __shared__ float red[1024];
  float c = 0.f;
  for (kh_i64 i = threadIdx.x; i < n; i += blockDim.x) c += labels[i] != ignore_index ? 1.f : 0.f;
  const float count = cta_sum(c, red);
  if (threadIdx.x == 0) {
    inv_count[0] = count > 0.f ? 1.f / count : 0.f;
    inv_count[1] = 1.f;
  }
}

// loss[0] = sum(token_loss) * inv_count[0]. One CTA of 1024.
extern "C" __global__ void __launch_bounds__(1024)
    lce_loss(const float* token_loss, kh_i64 n, const float* inv_count, float* loss) {
  __shared__ float red[1024];
  float s = 0.f;
  for (kh_i64 i = threadIdx.x; i < n; i += blockDim.x) s += token_loss[i];
  const float total = cta_sum(s, red);
  if (threadIdx.x == 0) loss[0] = total * inv_count[0];
}

#define KH_LCE_KERNELS(TNAME, T, VEC, VNAME)                                                 \
  extern "C" __global__ void __launch_bounds__(1024) lce_grad_##TNAME##_##VNAME(             \
      const T* x, kh_i64 sx, const kh_i64* targets, kh_i64 ignore_index, float* loss, T* dx, \
      kh_i64 sdx, const float* inv_count, kh_i64 rows, int cols) {                           \
    ce_fwd<T, VEC, true, CeRes<VEC>::train>(x, sx, targets, ignore_index, loss, dx, sdx,     \
                                            inv_count[0], rows, cols);                       \
  }

KH_LCE_KERNELS(bf16, kh_bf16, kh_vec16<kh_bf16>::n, vec)
KH_LCE_KERNELS(bf16, kh_bf16, 1, scalar)
KH_LCE_KERNELS(fp16, kh_fp16, kh_vec16<kh_fp16>::n, vec)
KH_LCE_KERNELS(fp16, kh_fp16, 1, scalar)
KH_LCE_KERNELS(fp32, float, kh_vec16<float>::n, vec)
KH_LCE_KERNELS(fp32, float, 1, scalar)

// x[r, c] *= g[0] over [rows, cols] with row stride sx; g NULL: x = 0. Grid-stride, any grid.
#define KH_LCE_SCALE(TNAME, T)                                                         \
  extern "C" __global__ void lce_scale_##TNAME(T* x, kh_i64 sx, kh_i64 rows, int cols, \
                                               const float* g) {                       \
    lce_scale<T>(x, sx, rows, cols, g);                                                \
  }
KH_LCE_SCALE(bf16, kh_bf16)
KH_LCE_SCALE(fp16, kh_fp16)
KH_LCE_SCALE(fp32, float)
