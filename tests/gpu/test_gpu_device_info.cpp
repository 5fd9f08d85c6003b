// GPU test of the device-info service (ABI 1.4; CTest label `gpu`, skips cleanly without a
// driver or device): the CUDA backend reports what the driver says of device 0, plausibly for
// any GPU the loader supports (sm_70+), and on a Hopper H100/H200 exactly what the attention
// package's decode plan assumed before it could ask; a device that does not exist is
// KH_ERR_NO_DEVICE. The embedder's kh_device_get_info gives the same answer, without a runtime.
// CPU-side checks: tests/unit/test_loader_device_info.cpp, tests/unit/test_device_api.cpp.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "hub/base/error.h"
#include "kernel_hub/kernel_hub.h"
#include "loader/cuda_driver.h"
#include "loader/device_backend.h"
#include "loader/device_info_service.h"
#include "loader/host_services.h"

namespace kh {
namespace {

class GpuDeviceInfo : public ::testing::Test {
 protected:
  void SetUp() override {
    try {
      if (cuda::device_count() < 1) GTEST_SKIP() << "no CUDA device";
    } catch (const Error& e) {
      GTEST_SKIP() << "no usable CUDA driver: " << e.what();
    }
    set_device_backend(&CudaDeviceBackend::instance());
  }
  void TearDown() override { set_device_backend(nullptr); }
};

TEST_F(GpuDeviceInfo, ReportsWhatTheDriverSaysOfDeviceZero) {
  kh_device_info_t info{};
  info.h = KH_HEADER_INIT(kh_device_info_t);
  std::string error;
  ASSERT_EQ(query_device_info(0, &info, error), KH_OK) << error;
  const cuda::DeviceInfo& d = cuda::device(0);
  EXPECT_EQ(info.sm_major, d.sm_major);
  EXPECT_EQ(info.sm_minor, d.sm_minor);
  EXPECT_EQ(info.multiprocessors, d.multiprocessors);
  EXPECT_EQ(info.total_memory, static_cast<int64_t>(d.total_memory));
  EXPECT_GE(info.sm_major, 7);
  EXPECT_GE(info.multiprocessors, 1);
  EXPECT_GE(info.max_threads_per_multiprocessor, 1024);
  EXPECT_GE(info.registers_per_multiprocessor, 65536);
  EXPECT_GE(info.shared_memory_per_multiprocessor, 64 * 1024);
  EXPECT_GE(info.shared_memory_per_block_optin, 48 * 1024);
  EXPECT_LE(info.shared_memory_per_block_optin, info.shared_memory_per_multiprocessor);
  EXPECT_GE(info.shared_memory_reserved_per_block, 0);
  if (d.name.find("H100") != std::string::npos || d.name.find("H200") != std::string::npos) {
    EXPECT_EQ(info.sm_major, 9);
    EXPECT_EQ(info.shared_memory_per_multiprocessor, 228 * 1024);
    EXPECT_EQ(info.shared_memory_per_block_optin, 227 * 1024);
    EXPECT_EQ(info.shared_memory_reserved_per_block, 1024);
    EXPECT_EQ(info.max_threads_per_multiprocessor, 2048);
    if (d.name.find("SXM") != std::string::npos || d.name.find("H200") != std::string::npos) {
      EXPECT_EQ(info.multiprocessors, 132) << d.name;
    }
  }
}

TEST_F(GpuDeviceInfo, ADeviceThatDoesNotExistIsNoDevice) {
  kh_device_info_t info{};
  info.h = KH_HEADER_INIT(kh_device_info_t);
  std::string error;
  const int missing = cuda::device_count();
  EXPECT_EQ(query_device_info(missing, &info, error), KH_ERR_NO_DEVICE);
  EXPECT_NE(error.find("does not exist"), std::string::npos) << error;
  EXPECT_EQ(info.multiprocessors, 0);
}

TEST_F(GpuDeviceInfo, TheEmbeddersCallGivesThePackagesAnswer) {
  kh_device_info_t service{}, embedder{};
  service.h = embedder.h = KH_HEADER_INIT(kh_device_info_t);
  std::string error;
  ASSERT_EQ(query_device_info(0, &service, error), KH_OK) << error;
  set_device_backend(nullptr);  // the C API asks the CUDA backend itself
  ASSERT_EQ(kh_device_get_info(0, &embedder), KH_OK) << kh_last_error();
  EXPECT_EQ(std::memcmp(&service, &embedder, sizeof service), 0);
  EXPECT_EQ(kh_device_get_info(cuda::device_count(), &embedder), KH_ERR_NOT_FOUND);
  EXPECT_NE(std::string(kh_last_error()).find("does not exist"), std::string::npos)
      << kh_last_error();
}

}  // namespace
}  // namespace kh
