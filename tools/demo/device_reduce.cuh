// Block-wide reductions of the runtime's device kernels (device_kernels.cu, device_decode.cu;
// inlined into each at build time): blockDim.x a multiple of 32, at most 1024, blockDim.y == 1;
// `red` is __shared__ float[32]. Every thread gets the result.
#ifndef KH_DEMO_DEVICE_REDUCE_CUH_
#define KH_DEMO_DEVICE_REDUCE_CUH_

KH_DEV float block_max(float v, float* red) {
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, off));
  const int warps = blockDim.x >> 5;
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  float m = red[0];
  for (int i = 1; i < warps; ++i) m = fmaxf(m, red[i]);
  __syncthreads();
  return m;
}

KH_DEV float block_sum(float v, float* red) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xFFFFFFFFu, v, off);
  const int warps = blockDim.x >> 5;
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  float s = 0.f;
  for (int i = 0; i < warps; ++i) s += red[i];  // one order: deterministic
  __syncthreads();
  return s;
}

#endif  // KH_DEMO_DEVICE_REDUCE_CUH_
