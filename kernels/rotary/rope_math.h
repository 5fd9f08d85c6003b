// The rotation of one pair, shared by the device code (rotary.cu) and the cpu implementation
// (cpu.cpp) so that both compute the same fp32 expression. Header-only, language only (the build
// inlines it into the shipped rotary.cu).
//
// Forward (sign = +1):  o1 = x1 * cos - x2 * sin,  o2 = x2 * cos + x1 * sin.
// Backward (sign = -1) is the inverse (transposed) rotation: the same with sin negated.
// Pair j of a head (0 <= j < rot_dim / 2): NeoX (rotate halves) takes x1 = x[j],
// x2 = x[j + rot_dim / 2]; GPT-J (interleaved) takes x1 = x[2j], x2 = x[2j + 1]. Elements at
// rot_dim and past it are left as they are (partial rotary).
#pragma once

#include "kh_prelude.cuh"

KH_HD void kh_rope_rotate(float x1, float x2, float c, float s, float* o1, float* o2) {
  *o1 = x1 * c - x2 * s;
  *o2 = x2 * c + x1 * s;
}

// Offsets of pair j's two elements inside a head.
KH_HD int kh_rope_first(int neox, int j) {
  return neox ? j : 2 * j;
}
KH_HD int kh_rope_second(int neox, int j, int half) {
  return neox ? j + half : 2 * j + 1;
}
