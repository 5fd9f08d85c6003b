#include "loader/tensor_map_service.h"

#include <algorithm>
#include <cstring>
#include <exception>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "hub/base/error.h"
#include "loader/abi_request.h"
#include "loader/cuda_driver.h"
#include "loader/gemm_service.h"  // gemm_dtype_bytes, gemm_dtype_name: the same KH_DTYPE_* codes

namespace kh {

static_assert(sizeof(kh_tensor_map_t) == kTensorMapV1_3Size,
              "kh_tensor_map_t of ABI 1.3 is 136 bytes");
static_assert(KH_TENSOR_MAP_BYTES == sizeof(cuda::CUtensorMap));

namespace {

// The driver's limits (cuda.h, cuTensorMapEncodeTiled).
constexpr uint32_t kMaxRank = 5;
constexpr uint64_t kMaxDim = uint64_t{1} << 32;       // globalDim: non-zero, <= 2^32
constexpr uint64_t kStrideLimit = uint64_t{1} << 40;  // globalStrides: multiples of 16, < 2^40
constexpr uint32_t kMaxBox = 256;                     // boxDim: non-zero, <= 256
constexpr uintptr_t kBaseAlignment = 16;
constexpr uintptr_t kMapAlignment = 64;

int data_type(uint32_t dtype) {
  switch (dtype) {
    case KH_DTYPE_BF16:
      return cuda::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    case KH_DTYPE_FP16:
      return cuda::CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    default:
      return cuda::CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
  }
}

int swizzle_mode(uint32_t bytes) {
  switch (bytes) {
    case 32:
      return cuda::CU_TENSOR_MAP_SWIZZLE_32B;
    case 64:
      return cuda::CU_TENSOR_MAP_SWIZZLE_64B;
    case 128:
      return cuda::CU_TENSOR_MAP_SWIZZLE_128B;
    default:
      return cuda::CU_TENSOR_MAP_SWIZZLE_NONE;
  }
}

template <typename T>
std::string list(const T* values, uint32_t n) {
  return fmt::format("{{{}}}", fmt::join(values, values + n, ", "));
}

// "bf16 dims {128, 4096} box {64, 64}, swizzle 128 B on CUDA device 0": for driver errors.
std::string describe(const kh_tensor_map_t& t) {
  return fmt::format("{} dims {} strides {} box {}, swizzle {} B on CUDA device {}",
                     gemm_dtype_name(t.dtype), list(t.dims, t.rank),
                     list(t.strides + 1, t.rank - 1), list(t.box, t.rank), t.swizzle_bytes,
                     t.device_id);
}

}  // namespace

int32_t read_tensor_map(const kh_tensor_map_t* in, kh_tensor_map_t& out, std::string& error) {
  if (const int32_t status =
          read_abi_request(in, out, kTensorMapV1_3Size, "kh_tensor_map_t", "1.3", error);
      status != KH_OK)
    return status;
  const kh_tensor_map_t& t = out;
  if (t.device_id < 0) {
    error = fmt::format(
        "device_id is {}: a tensor map describes device memory; pass the CUDA ordinal (>= 0)",
        t.device_id);
    return KH_ERR_INVALID_ARGUMENT;
  }
  if (t.dtype != KH_DTYPE_BF16 && t.dtype != KH_DTYPE_FP16 && t.dtype != KH_DTYPE_FP32) {
    error = fmt::format(
        "dtype is {}: it must be one of KH_DTYPE_BF16 (1), KH_DTYPE_FP16 (2), KH_DTYPE_FP32 (4)",
        t.dtype);
    return KH_ERR_INVALID_ARGUMENT;
  }
  if (t.rank < 1 || t.rank > kMaxRank) {
    error = fmt::format("rank is {}: TMA takes 1 to {} dimensions", t.rank, kMaxRank);
    return KH_ERR_INVALID_ARGUMENT;
  }
  if (t.swizzle_bytes != 0 && t.swizzle_bytes != 32 && t.swizzle_bytes != 64 &&
      t.swizzle_bytes != 128) {
    error = fmt::format("swizzle_bytes is {}: it must be 0 (none), 32, 64 or 128", t.swizzle_bytes);
    return KH_ERR_INVALID_ARGUMENT;
  }
  if (!t.base) {
    error = "base is NULL: pass the device address of element (0, ..., 0)";
    return KH_ERR_INVALID_ARGUMENT;
  }
  if (reinterpret_cast<uintptr_t>(t.base) % kBaseAlignment != 0) {
    error = fmt::format("base ({}) is not 16-byte aligned, as TMA requires", t.base);
    return KH_ERR_INVALID_ARGUMENT;
  }
  const uint64_t element_bytes = static_cast<uint64_t>(gemm_dtype_bytes(t.dtype));
  for (uint32_t i = 0; i < t.rank; ++i) {
    if (t.dims[i] < 1 || t.dims[i] > kMaxDim) {
      error =
          fmt::format("dims[{}] is {}: each dimension must have 1 to 2^32 elements", i, t.dims[i]);
      return KH_ERR_INVALID_ARGUMENT;
    }
    if (i >= 1 && (t.strides[i] % 16 != 0 || t.strides[i] >= kStrideLimit)) {
      error = fmt::format(
          "strides[{}] is {} bytes: strides of dimensions 1 and up must be multiples of 16 "
          "below 2^40 (pad the rows of the tensor to 16 bytes)",
          i, t.strides[i]);
      return KH_ERR_INVALID_ARGUMENT;
    }
    if (t.box[i] < 1 || t.box[i] > kMaxBox) {
      error = fmt::format("box[{}] is {}: a copy spans 1 to {} elements along each dimension", i,
                          t.box[i], kMaxBox);
      return KH_ERR_INVALID_ARGUMENT;
    }
  }
  const uint64_t inner_bytes = t.box[0] * element_bytes;
  if (inner_bytes % 16 != 0) {
    error = fmt::format(
        "box[0] is {} {} elements = {} bytes: the inner box must span a multiple of 16 bytes",
        t.box[0], gemm_dtype_name(t.dtype), inner_bytes);
    return KH_ERR_INVALID_ARGUMENT;
  }
  if (t.swizzle_bytes != 0 && inner_bytes > t.swizzle_bytes) {
    error = fmt::format(
        "box[0] is {} {} elements = {} bytes, wider than the {}-byte swizzle span: with a "
        "swizzle, box[0] * element size must be <= swizzle_bytes",
        t.box[0], gemm_dtype_name(t.dtype), inner_bytes, t.swizzle_bytes);
    return KH_ERR_INVALID_ARGUMENT;
  }
  return KH_OK;
}

int32_t encode_tensor_map(const kh_tensor_map_t* req, void* map, std::string& error) noexcept {
  try {
    if (!map) {
      error =
          fmt::format("map is NULL: pass {} writable bytes, 64-byte aligned", KH_TENSOR_MAP_BYTES);
      return KH_ERR_INVALID_ARGUMENT;
    }
    if (reinterpret_cast<uintptr_t>(map) % kMapAlignment != 0) {
      error = fmt::format(
          "map ({}) is not 64-byte aligned, as the driver requires; declare it alignas(64)", map);
      return KH_ERR_INVALID_ARGUMENT;
    }
    kh_tensor_map_t t;
    if (int32_t status = read_tensor_map(req, t, error); status != KH_OK) return status;
    const cuda::Driver* d = nullptr;
    const cuda::DeviceInfo* device = nullptr;
    try {
      d = &cuda::cuda_driver();
      device = &cuda::device(t.device_id);  // names the ordinals there are when it does not exist
    } catch (const Error& e) {
      error =
          fmt::format("cannot encode a tensor map for CUDA device {}: {}", t.device_id, e.what());
      return KH_ERR_NO_DEVICE;
    }
    if (!d->cuTensorMapEncodeTiled) {
      error = fmt::format(
          "the NVIDIA driver (CUDA {}.{}) has no cuTensorMapEncodeTiled; update the driver",
          d->driver_version / 1000, (d->driver_version % 1000) / 10);
      return KH_ERR_NO_DEVICE;
    }
    const cuda::cuuint32_t element_strides[kMaxRank] = {1, 1, 1, 1, 1};
    cuda::CUtensorMap encoded{};
    // The encode reads no device state, but the driver lists CUDA_ERROR_INVALID_CONTEXT among its
    // results: with the device's primary context current (retained above anyway), the caller's
    // context state (none, or another device's) cannot matter.
    cuda::ScopedContext scope(device->primary_context);
    // globalStrides has rank - 1 entries, for dimensions 1 and up.
    cuda::CUresult r = d->cuTensorMapEncodeTiled(
        &encoded, data_type(t.dtype), t.rank, const_cast<void*>(t.base), t.dims, t.strides + 1,
        t.box, element_strides, cuda::CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle_mode(t.swizzle_bytes),
        cuda::CU_TENSOR_MAP_L2_PROMOTION_L2_256B, cuda::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != cuda::CUDA_SUCCESS) {
      error = fmt::format("cuTensorMapEncodeTiled refused {}: {} (CUresult {})", describe(t),
                          cuda::result_text(r), r);
      return KH_ERR_LAUNCH;
    }
    std::memcpy(map, &encoded, sizeof(encoded));
    return KH_OK;
  } catch (const std::exception& e) {
    error = e.what();
    return KH_ERR_INTERNAL;
  } catch (...) {
    error = "unknown exception";
    return KH_ERR_INTERNAL;
  }
}

}  // namespace kh
