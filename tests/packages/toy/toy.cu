// Device source of the toy package: header-free, extern "C" names, so the loader can compile it
// with NVRTC (no -I paths) or ship it as a cubin, and look kernels up by name.
extern "C" __global__ void toy_scale_f32(const float* x, float* y, float alpha, float offset,
                                         long long n) {
  long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] * alpha + offset;
}
