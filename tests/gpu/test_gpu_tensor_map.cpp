// GPU tests of the tensor-map service (CTest label `gpu`; every test skips cleanly without a
// driver or device): the driver encodes a descriptor for a bf16 [rows, 128] tensor with the
// 128-byte swizzle (the attention kernels' shape) with no context current, and a device that does
// not exist is KH_ERR_NO_DEVICE. The attention GPU tests use the maps for real.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "hub/base/error.h"
#include "loader/cuda_driver.h"
#include "loader/tensor_map_service.h"
#include "tests/unit/tensor_map_request.h"

namespace kh {
namespace {

class GpuTensorMap : public ::testing::Test {
 protected:
  void SetUp() override {
    try {
      if (cuda::device_count() < 1) GTEST_SKIP() << "no CUDA device";
    } catch (const Error& e) {
      GTEST_SKIP() << "no usable CUDA driver: " << e.what();
    }
    d_ = &cuda::cuda_driver();
    if (!d_->cuMemAlloc || !d_->cuMemFree) GTEST_SKIP() << "the driver has no cuMemAlloc";
    cuda::ScopedContext scope(cuda::device(0).primary_context);
    cuda::check(d_->cuMemAlloc(&memory_, kRows * 128 * 2), "cuMemAlloc");
  }
  void TearDown() override {
    if (!memory_) return;
    cuda::ScopedContext scope(cuda::device(0).primary_context);
    d_->cuMemFree(memory_);
  }

  kh_tensor_map_t request() const {
    return test::bf16_tensor_map_request(reinterpret_cast<const void*>(memory_), kRows);
  }

  static constexpr uint64_t kRows = 1000;  // not a multiple of the box: the last box reads zeros
  const cuda::Driver* d_ = nullptr;
  cuda::CUdeviceptr memory_ = 0;
};

TEST_F(GpuTensorMap, EncodesABf16MapWith128ByteSwizzleWithoutACurrentContext) {
  cuda::CUcontext current = nullptr;
  cuda::check(d_->cuCtxGetCurrent(&current), "cuCtxGetCurrent");
  EXPECT_EQ(current, nullptr) << "the test means to call the service with no context current";
  struct alignas(64) {
    unsigned char bytes[KH_TENSOR_MAP_BYTES];
  } map{};
  kh_tensor_map_t t = request();
  std::string error;
  ASSERT_EQ(encode_tensor_map(&t, map.bytes, error), KH_OK) << error;
  bool any = false;
  for (unsigned char b : map.bytes) any = any || b != 0;
  EXPECT_TRUE(any) << "the driver wrote 128 zero bytes";
  cuda::check(d_->cuCtxGetCurrent(&current), "cuCtxGetCurrent");
  EXPECT_EQ(current, nullptr) << "the service left a context current";
}

TEST_F(GpuTensorMap, ADeviceThatDoesNotExistIsNoDevice) {
  alignas(64) unsigned char map[KH_TENSOR_MAP_BYTES] = {};
  kh_tensor_map_t t = request();
  t.device_id = cuda::device_count();
  std::string error;
  EXPECT_EQ(encode_tensor_map(&t, map, error), KH_ERR_NO_DEVICE);
  EXPECT_NE(error.find("does not exist"), std::string::npos) << error;
}

}  // namespace
}  // namespace kh
