// cpu implementation of the attention package: plain loops over the same parameter structs the
// device kernels take (attention_params.h, host pointers), fp32 math, results rounded to the
// storage dtype. Correct, not fast: it serves the cpu variant and is the tests' second opinion.
#pragma once

#include "kernels/attention/attention_params.h"

namespace khk::attention_cpu {

// dtype: khk::kBF16, kFP16 or kFP32 (tensor_args.h).
void forward(int dtype, int head_dim, const kh_attn_params& p);
// dq, dk, dv from dout, the forward's inputs, output and lse (no workspace on cpu).
void backward(int dtype, int head_dim, const kh_attn_bwd_params& p);
void decode(int dtype, int head_dim, const kh_decode_params& p);
void append(int dtype, const kh_append_params& p);

}  // namespace khk::attention_cpu
