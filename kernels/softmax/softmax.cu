// Device code of the softmax package: Softmax over the last dimension (forward and backward)
// and CrossEntropy over large vocabularies (forward: fp32 loss per token; train: the loss fused
// with the gradient softmax - onehot, times grad_scale; backward: the gradient times the incoming
// per-token loss gradient). bf16/fp16/fp32 storage, fp32 math.
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

// The row's (max, sum of exp(x - max)) over n vectors. kStatsUnroll loads are issued before
// their math so that each thread keeps several 16-byte loads in flight (REFERENCE 6.3 item 9);
// the accumulation order is still v, v + blockDim.x, ... On the H200 (4096 x 128256 bf16
// cross-entropy) 4 was 12% slower than 2: it took the 1024-thread kernels past 32 registers, so
// one CTA per SM instead of two; 2 matched the plain loop there and gained 2-5% on softmax.
constexpr int kStatsUnroll = 2;
template <typename T, int VEC>
__device__ __forceinline__ void row_stats(const T* xr, int n, float& m, float& s, float* red) {
  typedef kh_raw<T, VEC> Raw;
  m = KH_SM_NEG_INF;
  s = 0.f;
  for (int v0 = threadIdx.x; v0 < n; v0 += kStatsUnroll * blockDim.x) {
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
        kh_sm_accumulate<VEC>(m, s, a);
      }
    }
  }
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
  const float inv = 1.f / s;
  T* yr = y + (valid ? row : 0) * sy;
  for (int v = threadIdx.x; v < nvec; v += blockDim.x) {
    float a[VEC];
    kh_unpack<T, VEC>(kh_load_raw<T, VEC, KH_LOAD_PLAIN>(xr + (kh_i64)v * VEC), a);
#pragma unroll
    for (int i = 0; i < VEC; ++i) a[i] = expf(a[i] - m) * inv;
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

// loss = logsumexp(x) - x[target] (0 for ignored tokens, NaN for a target outside [0, cols));
// TRAIN also writes dx = (softmax(x) - onehot(target)) * scale (zero rows for ignored tokens).
template <typename T, int VEC, bool TRAIN>
__device__ __forceinline__ void ce_fwd(const T* x, kh_i64 sx, const kh_i64* targets,
                                       kh_i64 ignore_index, float* loss, T* dx, kh_i64 sdx,
                                       float scale, kh_i64 rows, int cols) {
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
  float m, s;
  row_stats<T, VEC>(xr, nvec, m, s, red);
  if (valid && threadIdx.x == 0)
    loss[row] = ignored ? 0.f : in_range ? (m + logf(s)) - xt : __int_as_float(0x7fc00000);
  if constexpr (TRAIN) {
    __syncthreads();
    if (!valid) return;  // no barriers below
    T* dxr = dx + row * sdx;
    const int n = cols / VEC;
    const float inv = 1.f / s;
    for (int v = threadIdx.x; v < n; v += blockDim.x) {
      float a[VEC];
      if (ignored) {
#pragma unroll
        for (int i = 0; i < VEC; ++i) a[i] = 0.f;
      } else {
        kh_unpack<T, VEC>(kh_load_raw<T, VEC, KH_LOAD_PLAIN>(xr + (kh_i64)v * VEC), a);
#pragma unroll
        for (int i = 0; i < VEC; ++i) {
          const float p = expf(a[i] - m) * inv;
          a[i] = (p - ((kh_i64)v * VEC + i == target ? 1.f : 0.f)) * scale;
        }
      }
      kh_store_raw<T, VEC>(dxr + (kh_i64)v * VEC, kh_pack<T, VEC>(a));
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
    ce_fwd<T, VEC, false>(x, sx, targets, ignore_index, loss, dx, sdx, scale, rows, cols);        \
  }                                                                                               \
  extern "C" __global__ void __launch_bounds__(1024) ce_train_##TNAME##_##VNAME(                  \
      const T* x, kh_i64 sx, const kh_i64* targets, kh_i64 ignore_index, float* loss, T* dx,      \
      kh_i64 sdx, float scale, kh_i64 rows, int cols) {                                           \
    ce_fwd<T, VEC, true>(x, sx, targets, ignore_index, loss, dx, sdx, scale, rows, cols);         \
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
