// The online-softmax merge shared by the device code (softmax.cu) and the cpu implementation
// (cpu.cpp). Header-only, language only (the build inlines it into the shipped softmax.cu).
// A partial row is (m, s): its maximum and the sum of exp(x - m) over its elements; an empty
// partial is (-inf, 0).
#pragma once

#include "kh_prelude.cuh"

#if defined(__CUDACC__)
#define KH_SM_EXPF expf
#define KH_SM_NEG_INF (-__int_as_float(0x7f800000))
#else
#define KH_SM_EXPF expf
#define KH_SM_NEG_INF (-__builtin_inff())
#endif

// (m, s) <- (m, s) merged with (m2, s2). Commutative bit for bit (every lane of a butterfly
// reduction ends with the same value).
KH_HD void kh_sm_merge(float& m, float& s, float m2, float s2) {
  const float mm = m > m2 ? m : m2;
  if (mm == KH_SM_NEG_INF) {
    s = 0.f;
    m = mm;
    return;
  }
  s = s * KH_SM_EXPF(m - mm) + s2 * KH_SM_EXPF(m2 - mm);
  m = mm;
}

// Adds VEC values to the partial (m, s): one rescale per vector, then one exp per element.
template <int VEC>
KH_HD void kh_sm_accumulate(float& m, float& s, const float (&a)[VEC]) {
  float lm = a[0];
  for (int i = 1; i < VEC; ++i) lm = lm > a[i] ? lm : a[i];
  if (lm > m) {
    s = m == KH_SM_NEG_INF ? 0.f : s * KH_SM_EXPF(m - lm);
    m = lm;
  }
  if (m != KH_SM_NEG_INF)
    for (int i = 0; i < VEC; ++i) s += KH_SM_EXPF(a[i] - m);
}
