#include "tools/demo/device_tensor.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <utility>

#include "kernel_hub/kernel_hub.hpp"

namespace kh::demo {

std::string dtype_name(DLDataType dtype) {
  if (same_dtype(dtype, kF32)) return "float32";
  if (same_dtype(dtype, kBF16)) return "bfloat16";
  if (same_dtype(dtype, kI64)) return "int64";
  return fmt::format("{}/{}/{}", dtype.code, dtype.bits, dtype.lanes);
}

bool same_dtype(DLDataType a, DLDataType b) {
  return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}

namespace {

int64_t count(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0)
      throw Error(ErrorKind::kInvalidInput,
                  fmt::format("tensor shape has a negative dimension ({})", d));
    n *= d;
  }
  return n;
}

}  // namespace

DeviceTensor::DeviceTensor(DevicePool& pool, std::vector<int64_t> shape, DLDataType dtype)
    : shape_(std::move(shape)), dtype_(dtype), device_(pool.device()) {
  if (dtype.bits % 8 != 0 || dtype.lanes != 1)
    throw Error(
        ErrorKind::kInvalidInput,
        fmt::format("device tensor of dtype {}: whole-byte scalar dtypes only", dtype_name(dtype)));
  const size_t n = static_cast<size_t>(count(shape_)) * (dtype.bits / 8);
  if (n == 0) return;
  buffer_ = std::make_shared<DeviceBuffer>(pool.allocate(n));
  data_ = buffer_->data();
}

int64_t DeviceTensor::numel() const {
  return count(shape_);
}

size_t DeviceTensor::bytes() const {
  return static_cast<size_t>(numel()) * (dtype_.bits / 8);
}

DeviceTensor DeviceTensor::view(std::vector<int64_t> shape) const {
  if (count(shape) != numel())
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("view of {} as {} elements", describe(), count(shape)));
  DeviceTensor v;
  v.buffer_ = buffer_;
  v.data_ = data_;
  v.shape_ = std::move(shape);
  v.dtype_ = dtype_;
  v.device_ = device_;
  return v;
}

DeviceTensor DeviceTensor::rows(int64_t begin, int64_t count) const {
  if (shape_.empty() || begin < 0 || count < 0 || begin + count > shape_[0])
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("rows [{}, {}) of {}", begin, begin + count, describe()));
  const int64_t row = shape_[0] ? numel() / shape_[0] : 0;
  DeviceTensor v = view(shape_);
  v.shape_[0] = count;
  v.data_ = static_cast<char*>(data_) + begin * row * (dtype_.bits / 8);
  return v;
}

const DLTensor* DeviceTensor::dl() const {
  dl_ = DLTensor{};
  dl_.data = data_;
  dl_.device = {kDLCUDA, device_};
  dl_.ndim = static_cast<int32_t>(shape_.size());
  dl_.dtype = dtype_;
  dl_.shape = const_cast<int64_t*>(shape_.data());
  dl_.strides = nullptr;
  dl_.byte_offset = 0;
  return &dl_;
}

StridedArg::StridedArg(const DeviceTensor& base, int64_t offset, std::vector<int64_t> shape,
                       std::vector<int64_t> strides)
    : base_(base.view(base.shape())), shape_(std::move(shape)), strides_(std::move(strides)) {
  int64_t last = offset;  // the element of the largest offset the view spans
  bool empty = false;
  for (size_t i = 0; i < shape_.size(); ++i) {
    if (shape_[i] == 0) empty = true;
    if (i < strides_.size() && shape_[i] > 0) last += (shape_[i] - 1) * strides_[i];
  }
  if (strides_.size() != shape_.size() || offset < 0 ||
      std::any_of(strides_.begin(), strides_.end(), [](int64_t st) { return st < 0; }) ||
      (!empty && last >= base.numel()))
    throw Error(
        ErrorKind::kInvalidInput,
        fmt::format("strided view [{}] with strides [{}] from element {} of {}",
                    fmt::join(shape_, ", "), fmt::join(strides_, ", "), offset, base.describe()));
  data_ = static_cast<char*>(base.data()) + offset * (base.dtype().bits / 8);
}

const DLTensor* StridedArg::dl() const {
  dl_ = *base_.dl();
  dl_.data = data_;
  dl_.ndim = static_cast<int32_t>(shape_.size());
  dl_.shape = const_cast<int64_t*>(shape_.data());
  dl_.strides = const_cast<int64_t*>(strides_.data());
  return &dl_;
}

void DeviceTensor::upload(DeviceStream& stream, const void* host, size_t bytes) {
  if (bytes != this->bytes())
    throw Error(ErrorKind::kInvalidInput, fmt::format("upload of {} bytes into {} ({} bytes)",
                                                      bytes, describe(), this->bytes()));
  if (bytes) stream.copy(data_, host, bytes, KH_COPY_H2D);
}

void DeviceTensor::download(DeviceStream& stream, void* host, size_t bytes) const {
  if (bytes != this->bytes())
    throw Error(ErrorKind::kInvalidInput, fmt::format("download of {} ({} bytes) into {} bytes",
                                                      describe(), this->bytes(), bytes));
  if (bytes) stream.copy(host, data_, bytes, KH_COPY_D2H);
}

void DeviceTensor::zero(DeviceStream& stream) {
  if (bytes()) stream.memset(data_, 0, bytes());
}

std::string DeviceTensor::describe() const {
  return fmt::format("{}[{}]", dtype_name(dtype_), fmt::join(shape_, ", "));
}

}  // namespace kh::demo
