// Checks of RoPE's arguments, shared by the rotary package's ops and the attention package's fused
// decode (paged_attention_decode_rotary_append), which take them alike: is_neox, the cos/sin
// caches and the q/k norms' weights and eps. Messages name the op and the argument.
#pragma once

#include <stdint.h>

#include "kernels/common/tensor_args.h"

namespace khk {

// is_neox: 1 (NeoX, rotate halves) or 0 (GPT-J, interleaved).
int32_t rope_layout_arg(const char* op, int64_t is_neox);

// cos and sin: [max_pos, rot_dim / 2] with a row stride, both float32 or both `dtype` (the rows'),
// the same shape, on `device`. *cos_out and *sin_out: their views (cols = rot_dim / 2).
int32_t rope_cache_args(const TensorArg& cos, const TensorArg& sin, int dtype, DLDevice device,
                        const char* rows_name, RowsView* cos_out, RowsView* sin_out);

// The rotation fits rows of head_dim: rot_dim = 2 * cos.cols <= head_dim.
int32_t rope_fits_arg(const TensorArg& cos, const RowsView& c, const char* rows_name,
                      int64_t head_dim);

// A q/k norm's weight: head_dim elements of `dtype` on `device`; `required_by` names what needs it
// when it is missing.
int32_t norm_weight_arg(const TensorArg& w, const char* required_by, int64_t head_dim, int dtype,
                        DLDevice device, VectorView* out);

// The norms' eps: positive and at most 1.
int32_t norm_eps_arg(const char* op, double eps);

}  // namespace khk
