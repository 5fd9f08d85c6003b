// A tensor in device memory for the GPU-resident runtime: a block of a kh::DevicePool (freed
// to the pool when the tensor goes), a row-major shape and a dtype, and the DLTensor view that
// slot calls take (kDLCUDA on the pool's device, contiguous: strides NULL).
#pragma once

#include <dlpack/dlpack.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernel_hub/kernel_hub.hpp"

namespace kh::demo {

inline constexpr DLDataType kF32{kDLFloat, 32, 1};
inline constexpr DLDataType kBF16{kDLBfloat, 16, 1};
inline constexpr DLDataType kI64{kDLInt, 64, 1};
inline constexpr DLDataType kI32{kDLInt, 32, 1};
inline constexpr DLDataType kU8{kDLUInt, 8, 1};

// "float32", "bfloat16", "int64", or "code/bits/lanes".
std::string dtype_name(DLDataType dtype);
bool same_dtype(DLDataType a, DLDataType b);

class DeviceTensor {
 public:
  DeviceTensor() = default;
  // Uninitialized memory from `pool` (none for zero elements). Throws kh::Error: kInvalidInput
  // for a negative dimension or a dtype that is not whole bytes, the pool's errors otherwise.
  DeviceTensor(DevicePool& pool, std::vector<int64_t> shape, DLDataType dtype);
  DeviceTensor(DeviceTensor&& other) noexcept = default;
  DeviceTensor& operator=(DeviceTensor&& other) noexcept = default;

  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_.at(static_cast<size_t>(i)); }
  int ndim() const { return static_cast<int>(shape_.size()); }
  DLDataType dtype() const { return dtype_; }
  int device() const { return device_; }
  int64_t numel() const;
  size_t bytes() const;
  void* data() const { return data_; }
  template <typename T>
  T* data_as() const {
    return static_cast<T*>(data_);
  }
  // The same memory seen with another shape of the same element count (no copy).
  DeviceTensor view(std::vector<int64_t> shape) const;
  // Rows [begin, begin + count) of the first dimension (no copy; still contiguous).
  DeviceTensor rows(int64_t begin, int64_t count) const;

  // The DLTensor of this tensor, valid while it lives and is not moved or reshaped.
  const DLTensor* dl() const;

  // Host <-> device, ordered on `stream` (the host memory must stay valid until the stream
  // reaches the copy). `bytes` must equal bytes().
  void upload(DeviceStream& stream, const void* host, size_t bytes);
  void download(DeviceStream& stream, void* host, size_t bytes) const;
  void zero(DeviceStream& stream);
  // "bfloat16[4, 64]", for messages.
  std::string describe() const;

 private:
  std::shared_ptr<DeviceBuffer> buffer_;  // shared with views; freed to the pool by the last
  void* data_ = nullptr;
  std::vector<int64_t> shape_;
  DLDataType dtype_{kDLFloat, 32, 1};
  int device_ = -1;
  mutable DLTensor dl_{};
};

// A strided view of a device tensor's memory, for slot calls only (packages take token and head
// strides; the runtime's own kernels take contiguous tensors): `shape` and `strides` (elements)
// from element `offset` of `base`, which it keeps alive. Throws kh::Error kInvalidInput when an
// element it spans lies outside `base`.
class StridedArg {
 public:
  StridedArg(const DeviceTensor& base, int64_t offset, std::vector<int64_t> shape,
             std::vector<int64_t> strides);
  // Valid while this lives and is not moved.
  const DLTensor* dl() const;

 private:
  DeviceTensor base_;
  void* data_ = nullptr;
  std::vector<int64_t> shape_, strides_;
  mutable DLTensor dl_{};
};

// Slot-call arguments: a device tensor's DLTensor view (null passes a NULL tensor), a strided
// view, an int, a float.
inline kh_arg_t tensor_arg(const DeviceTensor* t) {
  kh_arg_t a{};
  a.kind = KH_ARG_TENSOR;
  a.v.t = t ? t->dl() : nullptr;
  return a;
}
inline kh_arg_t tensor_arg(std::nullptr_t) {
  return tensor_arg(static_cast<const DeviceTensor*>(nullptr));
}
inline kh_arg_t tensor_arg(const StridedArg* t) {
  kh_arg_t a{};
  a.kind = KH_ARG_TENSOR;
  a.v.t = t->dl();
  return a;
}
inline kh_arg_t int_arg(int64_t i) {
  kh_arg_t a{};
  a.kind = KH_ARG_INT;
  a.v.i = i;
  return a;
}
inline kh_arg_t float_arg(double f) {
  kh_arg_t a{};
  a.kind = KH_ARG_FLOAT;
  a.v.f = f;
  return a;
}

}  // namespace kh::demo
