// Tensor checks shared by the kernel packages' host libraries: DLPack tensor arguments (read by
// name through kernels/common/op_schema.h) viewed as rows (last dimension contiguous, leading
// dimensions collapsed into a row index with one row stride), per-row statistics and per-column
// parameter vectors. Every check reports a message naming the op, the argument and what to pass
// instead.
#pragma once

#include <stdint.h>

#include "kernel_hub/kernel_hub_abi.h"

namespace khk {

enum DType : int { kBF16 = 0, kFP16 = 1, kFP32 = 2 };

const char* dtype_name(int dtype);
inline int dtype_bytes(int dtype) {
  return dtype == kFP32 ? 4 : 2;
}
// Elements of `dtype` in one 16-byte vector.
inline int dtype_vec16(int dtype) {
  return 16 / dtype_bytes(dtype);
}

// A tensor argument of an op call and the names its messages use: the op's and the argument's,
// both from the op's schema (Args::tensor). t is NULL only for an optional argument not passed.
struct TensorArg {
  const char* op;
  const char* name;
  const DLTensor* t;
};

// A tensor as `rows` rows of `cols` contiguous elements, `stride` elements apart.
struct RowsView {
  char* data = nullptr;  // data + byte_offset
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t stride = 0;  // elements between row starts; == cols when there is at most one row
  int dtype = -1;
  DLDevice device{};
};

// A contiguous 1-D run of elements (weights, biases, per-row statistics).
struct VectorView {
  char* data = nullptr;
  int64_t n = 0;
  int dtype = -1;
  DLDevice device{};
};

// Views `t` as rows. Refuses unsupported dtypes/devices, a non-contiguous last dimension,
// leading dimensions that cannot be collapsed into one row stride, rows that overlap
// (stride < cols), and sizes beyond what the kernels index (cols >= 2^31).
int32_t rows_view(const TensorArg& a, RowsView* out);

// Views `t` as a contiguous vector of `n` elements (any shape with n elements in total).
int32_t vector_view(const TensorArg& a, int64_t n, VectorView* out);

// Checks that `v`, the view of `a`, has the rows and cols given (the message names `like`).
int32_t expect_shape(const TensorArg& a, const RowsView& v, int64_t rows, int64_t cols,
                     const char* like);
int32_t expect_dtype(const TensorArg& a, int dtype, int want, const char* like);
int32_t expect_device(const TensorArg& a, DLDevice got, DLDevice want);

// An int64 contiguous tensor holding one index per `per_what` of the op's main tensor
// (rotary positions per token, cross-entropy targets per row): `expected_count` elements on
// `device`. Sets *out to its first element.
int32_t index_vector_arg(const TensorArg& a, int64_t expected_count, const char* per_what,
                         DLDevice device, const int64_t** out);

// A [tokens, heads, head_dim] tensor with token and head strides (elements), the last dimension
// contiguous. From a 4-D [batch, seqlen, heads, head_dim] tensor (heads_view's allow_batch) when
// its batch and sequence dimensions collapse into one token stride; batch and seqlen say how.
struct HeadsView {
  char* data = nullptr;
  int64_t tokens = 0, heads = 0, head_dim = 0;
  int64_t token_stride = 0, head_stride = 0;
  int64_t batch = 1, seqlen = 0;  // 4-D input: its first two extents; 3-D: 1 and tokens
  int dtype = -1;
  DLDevice device{};
};

// Views `a` as HeadsView: dtype, device and extent checks, a contiguous last dimension, heads
// that do not overlap, sizes the kernels index (tokens < 2^31, heads * head_dim < 2^31).
int32_t heads_view(const TensorArg& a, HeadsView* out, bool allow_batch = false);

// `v` (the view of `a`) agrees with `like` (named like_name in the message): dtype, device and
// head_dim (same_kind), and tokens and heads too (same_shape).
int32_t same_kind(const TensorArg& a, const HeadsView& v, const HeadsView& like,
                  const char* like_name);
int32_t same_shape(const TensorArg& a, const HeadsView& v, const HeadsView& like,
                   const char* like_name);

// An int32 contiguous tensor of `expected_count` elements (sequence boundaries, lengths, block
// tables) on `device`. Sets *out to its first element.
int32_t int32_tensor_arg(const TensorArg& a, int64_t expected_count, const char* per_what,
                         DLDevice device, const int32_t** out);

inline bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

// Whether the 16-byte vector path can read/write `v` in vectors of `vec` elements: 16-byte
// aligned start, row stride a multiple of 16 bytes, and cols divisible by `vec`.
bool vectorizable(const RowsView& v, int64_t vec_cols);
bool vectorizable(const VectorView& v);

inline bool is_cuda(DLDevice d) {
  return d.device_type == kDLCUDA;
}
inline bool is_cpu(DLDevice d) {
  return d.device_type == kDLCPU;
}

}  // namespace khk
