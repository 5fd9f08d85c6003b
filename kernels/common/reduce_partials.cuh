// The deterministic second pass of a backward's weight gradient (the norm package's RMSNorm and
// LayerNorm, the rotary package's QKNormRotaryEmbedding): the first pass leaves one fp32 partial
// row per CTA in a workspace [walkers, k * cols] instead of atomics; this sums the rows, in
// row order, into k output vectors of `cols` elements (out0, and out1 for k = 2), rounded to T.
// Header-free for NVRTC (the build inlines it after kh_prelude.cuh). Not installed with the SDK.
//
// blockDim (32, S <= kh_kReduceMaxSlices; the packages launch 32): 32 columns per CTA, S slices
// of the rows combined in a fixed order. 32 slices with 8 loads in flight each: with 8 slices each
// thread's chain of loads through a few thousand partial rows took 27-38 us on an H200 (Qwen3's
// 2048 x 1024 norm partials), a latency chain on 32 SMs rather than a read.
#ifndef KH_REDUCE_PARTIALS_CUH_
#define KH_REDUCE_PARTIALS_CUH_

#define KH_REDUCE_MAX_SLICES 32

template <typename T>
__device__ __forceinline__ void kh_reduce_partials(const float* ws, kh_i64 sws, int walkers,
                                                   int cols, int k, T* out0, T* out1) {
  __shared__ float part[KH_REDUCE_MAX_SLICES][33];
  const int tx = threadIdx.x, ty = threadIdx.y, slices = blockDim.y;
  const int c = blockIdx.x * 32 + tx;
  const int total = k * cols;
  float s = 0.f;
  if (c < total) {
#pragma unroll 8
    for (int wk = ty; wk < walkers; wk += slices) s += ws[(kh_i64)wk * sws + c];
  }
  part[ty][tx] = s;
  __syncthreads();
  if (ty == 0 && c < total) {
    float t = 0.f;
    for (int j = 0; j < slices; ++j) t += part[j][tx];
    if (c < cols)
      out0[c] = kh_convert<T>::from_float(t);
    else
      out1[c - cols] = kh_convert<T>::from_float(t);
  }
}

// The extern "C" kernel NAME(ws, sws, walkers, cols, k, out0, out1) for dtype T, launched with
// PDL (pdl.cuh first) and blockDim (32, up to KH_REDUCE_MAX_SLICES).
#define KH_REDUCE_PARTIALS_KERNEL(NAME, T)                                                \
  extern "C" __global__ void __launch_bounds__(1024)                                      \
      NAME(const float* ws, kh_i64 sws, int walkers, int cols, int k, T* out0, T* out1) { \
    kh_pdl_enter();                                                                       \
    kh_reduce_partials<T>(ws, sws, walkers, cols, k, out0, out1);                         \
  }

#endif  // KH_REDUCE_PARTIALS_CUH_
