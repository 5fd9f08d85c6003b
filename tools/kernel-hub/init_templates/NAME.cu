// Device code of @KH_PACKAGE@. Header-free: NVRTC compiles it with no include path, to a cubin
// per sm at `kernel-hub pack` time and at load time for GPUs no cubin fits. Kernels are
// extern "C" so that the host library finds them by name (host->get_function). Put shared
// device code in headers beside this file: the build inlines `#include "x.cuh"` lines.

// y[i] = alpha * x[i] for i < n; one thread per element.
extern "C" __global__ void scale_fp32(const float* x, float alpha, float* y, long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = alpha * x[i];
}
