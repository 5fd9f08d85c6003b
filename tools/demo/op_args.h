// Op arguments as the demo model builds them: host buffers described by shape, plus ints and
// floats, in a layer op's schema order. The slot caller (staging.h) turns them into kh_arg_t /
// DLTensor lists, on the host or staged to a CUDA device. Tensors are contiguous row-major; each
// has a role that tells staging which copies a call needs (in: to the device; out: back;
// in-out: both, for ops that work in place; scratch: neither).
#pragma once

#include <dlpack/dlpack.h>

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "kernel_hub/kernel_hub_abi.h"

namespace kh::demo {

enum class Role : uint8_t { kIn, kOut, kInOut, kScratch };

struct HostTensor {
  void* data = nullptr;
  DLDataType dtype{kDLFloat, 32, 1};
  int32_t ndim = 0;
  int64_t shape[4] = {0, 0, 0, 0};  // up to 4-D (attention's [batch, len, heads, head_dim])
  Role role = Role::kIn;

  int64_t numel() const {
    int64_t n = 1;
    for (int32_t d = 0; d < ndim; ++d) n *= shape[d];
    return n;
  }
  size_t bytes() const { return static_cast<size_t>(numel()) * (dtype.bits / 8); }
};

struct OpArg {
  int32_t kind = KH_ARG_TENSOR;
  HostTensor t;  // KH_ARG_TENSOR; data == nullptr passes a NULL tensor (optional arguments)
  int64_t i = 0;
  double f = 0;
};

using OpArgs = std::vector<OpArg>;

inline HostTensor make_tensor(const void* data, std::initializer_list<int64_t> shape,
                              DLDataType dtype, Role role) {
  HostTensor t;
  t.data = const_cast<void*>(data);
  t.dtype = dtype;
  for (int64_t s : shape) t.shape[t.ndim++] = s;
  t.role = role;
  return t;
}

// fp32 tensors by role, int64 index vectors (positions, targets), scalars.
inline OpArg f32(const float* p, std::initializer_list<int64_t> shape, Role role) {
  return {KH_ARG_TENSOR, make_tensor(p, shape, {kDLFloat, 32, 1}, role)};
}
inline OpArg in(const float* p, std::initializer_list<int64_t> shape) {
  return f32(p, shape, Role::kIn);
}
inline OpArg out(float* p, std::initializer_list<int64_t> shape) {
  return f32(p, shape, Role::kOut);
}
inline OpArg inout(float* p, std::initializer_list<int64_t> shape) {
  return f32(p, shape, Role::kInOut);
}
inline OpArg scratch(float* p, std::initializer_list<int64_t> shape) {
  return f32(p, shape, Role::kScratch);
}
inline OpArg in_i64(const int64_t* p, int64_t n) {
  return {KH_ARG_TENSOR, make_tensor(p, {n}, {kDLInt, 64, 1}, Role::kIn)};
}
// A NULL tensor: an optional argument left out (attention's cu_seqlens in a padded batch).
inline OpArg none() {
  return {KH_ARG_TENSOR, HostTensor{}};
}
inline OpArg integer(int64_t v) {
  OpArg a;
  a.kind = KH_ARG_INT;
  a.i = v;
  return a;
}
inline OpArg real(double v) {
  OpArg a;
  a.kind = KH_ARG_FLOAT;
  a.f = v;
  return a;
}

}  // namespace kh::demo
