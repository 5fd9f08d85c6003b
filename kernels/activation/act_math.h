// The activation functions and their derivatives in fp32, shared verbatim by the cpu
// implementation and the device source (inlined into activation.cu at build time), so both
// compute the same formulas. Uses only expf and erfcf, which host libm and NVRTC both provide.
#ifndef KH_ACT_MATH_H_
#define KH_ACT_MATH_H_

#include "kh_prelude.cuh"

// Ops of the activation package (kernel names and host dispatch use the same numbering).
enum kh_act_op {
  KH_ACT_SILU_AND_MUL = 0,       // y = silu(gate) * up
  KH_ACT_GELU_AND_MUL = 1,       // y = gelu(gate) * up, exact (erf)
  KH_ACT_GELU_TANH_AND_MUL = 2,  // y = gelu_tanh(gate) * up
  KH_ACT_SILU = 3,               // y = silu(x)
  KH_ACT_GELU_TANH = 4           // y = gelu_tanh(x)
};

KH_HD bool kh_act_is_glu(int op) {
  return op <= KH_ACT_GELU_TANH_AND_MUL;
}

// silu(g) = g * sigmoid(g); for g -> -inf expf overflows to inf and the quotient is -0.
KH_HD float kh_silu(float g) {
  return g / (1.0f + expf(-g));
}
KH_HD float kh_dsilu(float g) {
  const float s = 1.0f / (1.0f + expf(-g));
  return s * (1.0f + g * (1.0f - s));
}

// gelu(g) = g * Phi(g), Phi(g) = 0.5 * erfc(-g / sqrt(2)): erfc keeps the left tail accurate
// where 1 + erf(.) would cancel.
KH_HD float kh_gelu_erf(float g) {
  return 0.5f * g * erfcf(-g * 0.70710678118654752f);
}
KH_HD float kh_dgelu_erf(float g) {
  const float cdf = 0.5f * erfcf(-g * 0.70710678118654752f);
  const float pdf = expf(-0.5f * g * g) * 0.39894228040143268f;  // 1/sqrt(2 pi)
  return cdf + g * pdf;
}

// gelu_tanh(g) = 0.5 g (1 + tanh(u)), u = sqrt(2/pi) (g + 0.044715 g^3), written as
// g * sigmoid(2u): the same function without the cancellation of 1 + tanh(u) for g < 0.
KH_HD float kh_gelu_tanh_u(float g) {
  return 0.79788456080286536f * (g + 0.044715f * g * g * g);
}
KH_HD float kh_gelu_tanh(float g) {
  return g / (1.0f + expf(-2.0f * kh_gelu_tanh_u(g)));
}
// d/dg = s + g * 2 s (1 - s) * du/dg with s = sigmoid(2u) (0.5 (1 - tanh^2) = 2 s (1 - s)).
KH_HD float kh_dgelu_tanh(float g) {
  const float s = 1.0f / (1.0f + expf(-2.0f * kh_gelu_tanh_u(g)));
  const float du = 0.79788456080286536f * (1.0f + 3.0f * 0.044715f * g * g);
  return s + 2.0f * g * s * (1.0f - s) * du;
}

// The activation of op (GLU ops: of the gate).
KH_HD float kh_act(int op, float g) {
  return op == KH_ACT_SILU_AND_MUL || op == KH_ACT_SILU ? kh_silu(g)
         : op == KH_ACT_GELU_AND_MUL                    ? kh_gelu_erf(g)
                                                        : kh_gelu_tanh(g);
}
KH_HD float kh_dact(int op, float g) {
  return op == KH_ACT_SILU_AND_MUL || op == KH_ACT_SILU ? kh_dsilu(g)
         : op == KH_ACT_GELU_AND_MUL                    ? kh_dgelu_erf(g)
                                                        : kh_dgelu_tanh(g);
}

#endif  // KH_ACT_MATH_H_
