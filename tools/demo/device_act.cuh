// device_act.cuh: the runtime's SiLU in fp32, shared by its SiluAndMul fallback
// (device_kernels.cu) and the skinny GEMM's gated x (skinny_gemm.cu), so both round alike; the
// activation package's act_math.h computes the same expression. Header-free (NVRTC): the build
// inlines it after the prelude.
#ifndef KH_DEMO_DEVICE_ACT_CUH_
#define KH_DEMO_DEVICE_ACT_CUH_

// silu(g) = g * sigmoid(g); for g -> -inf expf overflows to inf and the quotient is -0.
KH_DEV float silu(float g) {
  return g / (1.0f + expf(-g));
}
KH_DEV float dsilu(float g) {
  const float s = 1.0f / (1.0f + expf(-g));
  return s * (1.0f + g * (1.0f - s));
}

#endif  // KH_DEMO_DEVICE_ACT_CUH_
