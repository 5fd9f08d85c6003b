// Kernel parameters of QKNormRotaryEmbedding's training ops (rotary.cu's qknr_fwd_* and
// qknr_bwd_* kernels), shared by the host library (host.cpp) and the device source: one struct
// passed by value, 8-byte members first, so the host compiler and NVRTC lay it out alike.
#ifndef KH_ROTARY_QK_NORM_PARAMS_H_
#define KH_ROTARY_QK_NORM_PARAMS_H_

#include "kh_prelude.cuh"

// One of query (0) and key (1): [tokens, heads, head_dim] tensors with token and head strides
// (elements). Forward: out = rotate(norm(in) * w) (out may be in itself). Backward: out =
// d(loss)/d(in) from d, the gradient of the forward's out.
struct kh_qknr_tensor {
  const void* in;
  const void* d;  // backward only
  void* out;
  const void* w;  // head_dim weights, the tensors' dtype
  // fp32 [tokens * heads], row r's rstd at r (or NULL). Forward: written. Backward: given, and
  // `in` is then the forward's out (rotated back and divided by w for xhat), not its input.
  float* rstd;
  kh_i64 in_t, in_h, d_t, d_h, out_t, out_h;
  kh_i64 heads;  // 0: absent (no key)
  // Row r of the tensor is head r % heads of token r / heads: the quotient by kh_qknr_divide
  // (host: kh_qknr_divider(heads)), a multiply and a shift where a division by a runtime value
  // is a long subroutine in kernels bound by the instructions they issue.
  kh_u32 div_mul, div_shift;
};

// n / d for 0 <= n < 2^31 and 1 <= d <= 2^31, as (umulhi(n, mul) + n) >> shift with shift =
// ceil(log2 d) and mul = floor(2^32 (2^shift - d) / d) + 1 (the round-up method, Hacker's Delight
// 10-9; n < 2^31 keeps the sum in 32 bits). The host makes the pair (d = 0, a tensor with no
// heads, gets 0 and 0: nothing is divided by it); both sides divide alike.
KH_HD void kh_qknr_divider(kh_u32 d, kh_u32* mul, kh_u32* shift) {
  *mul = *shift = 0;
  if (d == 0) return;
  kh_u32 s = 0;
  while (s < 31 && (1u << s) < d) ++s;
  *shift = s;
  *mul = (kh_u32)(((1ull << 32) * ((1ull << s) - d)) / d + 1);
}

KH_HD kh_u32 kh_qknr_divide(kh_u32 n, kh_u32 mul, kh_u32 shift) {
#if defined(__CUDA_ARCH__)
  return (__umulhi(n, mul) + n) >> shift;
#else
  return ((kh_u32)(((unsigned long long)n * mul) >> 32) + n) >> shift;
#endif
}

struct kh_qknr_params {
  kh_qknr_tensor t[2];
  const kh_i64* positions;  // [tokens]
  const void* cos;          // [max_pos, head_dim / 2], fp32 or the tensors' dtype
  const void* sin;
  float* ws;  // backward: [gridDim.x, 2 * head_dim] fp32 partials of dweight (query, then key)
  kh_i64 tokens, scos, ssin, max_pos, sws;
  float eps;
  int head_dim;
  int cs_vec;  // cos, sin and their row strides 16-byte aligned: the kernels load 16 bytes at once
};

#endif  // KH_ROTARY_QK_NORM_PARAMS_H_
