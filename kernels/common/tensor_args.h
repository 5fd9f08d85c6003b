// Argument checking shared by the kernel packages' host libraries: kh_arg_t unpacking and
// DLPack tensors viewed as rows (last dimension contiguous, leading dimensions collapsed into a
// row index with one row stride), per-row statistics and per-column parameter vectors.
// Every check reports a message naming the op, the argument and what to pass instead.
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

// Cursor over one op call's arguments; every error names `op`.
struct OpArgs {
  const char* op;
  const kh_arg_t* args;
  int32_t nargs;

  // KH_OK when there are exactly `n` arguments; else an error quoting `schema`.
  int32_t expect(int32_t n, const char* schema) const;
  // A tensor argument; with `optional`, a NULL tensor pointer is allowed (*out = nullptr).
  int32_t tensor(int32_t i, const char* name, const DLTensor** out, bool optional = false) const;
  int32_t real(int32_t i, const char* name, double* out) const;
  int32_t integer(int32_t i, const char* name, int64_t* out) const;
};

// Views `t` as rows. Refuses unsupported dtypes/devices, a non-contiguous last dimension,
// leading dimensions that cannot be collapsed into one row stride, rows that overlap
// (stride < cols), and sizes beyond what the kernels index (cols >= 2^31).
int32_t rows_view(const char* op, const char* name, const DLTensor* t, RowsView* out);

// Views `t` as a contiguous vector of `n` elements (any shape with n elements in total).
int32_t vector_view(const char* op, const char* name, const DLTensor* t, int64_t n,
                    VectorView* out);

// Checks that `v` has the rows and cols given (the message names `name` and `like`).
int32_t expect_shape(const char* op, const char* name, const RowsView& v, int64_t rows,
                     int64_t cols, const char* like);
int32_t expect_dtype(const char* op, const char* name, int dtype, int want, const char* like);
int32_t expect_device(const char* op, const char* name, DLDevice got, DLDevice want);

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
