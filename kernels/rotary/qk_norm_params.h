// Kernel parameters of QKNormRotaryEmbedding's training ops (rotary.cu's qknr_fwd_* and
// qknr_bwd_* kernels), shared by the host library (host.cpp) and the device source: one struct
// passed by value, 8-byte members first, so the host compiler and NVRTC lay it out alike.
#ifndef KH_ROTARY_QK_NORM_PARAMS_H_
#define KH_ROTARY_QK_NORM_PARAMS_H_

#include "kh_prelude.cuh"

// One of query (0) and key (1): [tokens, heads, head_dim] tensors with token and head strides
// (elements). Forward: out = rotate(norm(in) * w). Backward: out = d(loss)/d(in) from d, the
// gradient of the forward's out.
struct kh_qknr_tensor {
  const void* in;
  const void* d;  // backward only
  void* out;
  const void* w;  // head_dim weights, the tensors' dtype
  kh_i64 in_t, in_h, d_t, d_h, out_t, out_h;
  kh_i64 heads;  // 0: absent (no key)
};

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
