// The device-info service (kh_device_info_t, ABI 1.4) without a GPU: the struct checks (NULL,
// another major, too small a header), the answer written past the header and only as far as the
// caller's struct reaches, nothing written on failure, no backend and the CUDA backend without a
// driver (KH_ERR_NO_DEVICE saying why), and the host table's entry, size and error label. The
// driver's answers on a GPU: tests/gpu/test_gpu_device_info.cpp.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "kernel_hub/kernel_hub_abi.h"
#include "loader/device_backend.h"
#include "loader/device_info_service.h"
#include "loader/host_services.h"
#include "tests/unit/device_info_a100.h"

namespace kh {
namespace {

// No test here may find a driver, GPU machine or not (the loader reads KERNEL_HUB_LIBCUDA once).
const bool kNoDriver = setenv("KERNEL_HUB_LIBCUDA", "/nonexistent/libcuda.so.1", 1) == 0;

// A backend answering for device 3 only, with an A100's figures.
class FakeGpu : public DeviceBackend {
 public:
  int32_t get_function(const PackageIdentity&, int32_t, const char*, void**,
                       std::string&) override {
    return KH_ERR_NOT_FOUND;
  }
  int32_t launch(const PackageIdentity&, void*, const kh_launch_cfg_t&, void**, void*,
                 std::string&) override {
    return KH_ERR_LAUNCH;
  }
  int32_t device_info(int32_t device_id, kh_device_info_t& out, std::string& error) override {
    if (device_id != 3) {
      error = "CUDA device " + std::to_string(device_id) + " does not exist";
      return KH_ERR_NO_DEVICE;
    }
    const kh_header_t h = out.h;
    out = test::a100_device_info();
    out.h = h;
    return KH_OK;
  }
};

// Installs `backend` for one test and restores "no backend" after it.
class WithBackend {
 public:
  explicit WithBackend(DeviceBackend* backend) { set_device_backend(backend); }
  ~WithBackend() { set_device_backend(nullptr); }
};

kh_device_info_t fresh() {
  kh_device_info_t info;
  std::memset(&info, 0x5a, sizeof(info));  // poison: only the answer may overwrite it
  info.h = KH_HEADER_INIT(kh_device_info_t);
  return info;
}

TEST(DeviceInfo, TheBackendsAnswerIsWrittenPastTheHeader) {
  FakeGpu gpu;
  WithBackend with(&gpu);
  kh_device_info_t info = fresh();
  std::string error;
  ASSERT_EQ(query_device_info(3, &info, error), KH_OK) << error;
  EXPECT_EQ(info.h.struct_size, sizeof(kh_device_info_t));  // the header is the caller's
  EXPECT_EQ(info.h.abi_minor, KH_ABI_MINOR);
  EXPECT_EQ(info.sm_major, 8);
  EXPECT_EQ(info.sm_minor, 0);
  EXPECT_EQ(info.multiprocessors, 108);
  EXPECT_EQ(info.max_threads_per_multiprocessor, 2048);
  EXPECT_EQ(info.registers_per_multiprocessor, 65536);
  EXPECT_EQ(info.reserved0, 0);
  EXPECT_EQ(info.shared_memory_per_multiprocessor, 164 * 1024);
  EXPECT_EQ(info.shared_memory_per_block_optin, 163 * 1024);
  EXPECT_EQ(info.shared_memory_reserved_per_block, 1024);
  EXPECT_EQ(info.total_memory, int64_t{80} << 30);
}

TEST(DeviceInfo, AStructOfANewerMinorKeepsTheFieldsThisLoaderDoesNotKnow) {
  FakeGpu gpu;
  WithBackend with(&gpu);
  struct Newer {
    kh_device_info_t known;
    int64_t later_field;
  } newer;
  std::memset(&newer, 0x5a, sizeof(newer));
  newer.known.h = KH_HEADER_INIT(kh_device_info_t);
  newer.known.h.struct_size = sizeof(Newer);
  newer.known.h.abi_minor = KH_ABI_MINOR + 1;
  int64_t poison;
  std::memset(&poison, 0x5a, sizeof(poison));
  std::string error;
  ASSERT_EQ(query_device_info(3, &newer.known, error), KH_OK) << error;
  EXPECT_EQ(newer.known.multiprocessors, 108);
  EXPECT_EQ(newer.known.total_memory, int64_t{80} << 30);
  EXPECT_EQ(newer.later_field, poison);
  EXPECT_EQ(newer.known.h.abi_minor, KH_ABI_MINOR + 1);
}

TEST(DeviceInfo, BadStructsAreRefusedAndLeftAlone) {
  FakeGpu gpu;
  WithBackend with(&gpu);
  std::string error;
  EXPECT_EQ(query_device_info(3, nullptr, error), KH_ERR_INVALID_ARGUMENT);
  EXPECT_NE(error.find("the request is NULL; pass a kh_device_info_t"), std::string::npos) << error;

  kh_device_info_t info = fresh();
  info.h.abi_major = KH_ABI_MAJOR + 1;
  const kh_device_info_t before = info;
  EXPECT_EQ(query_device_info(3, &info, error), KH_ERR_ABI);
  EXPECT_NE(error.find("kh_device_info_t has ABI major 2"), std::string::npos) << error;
  EXPECT_EQ(std::memcmp(&info, &before, sizeof(info)), 0);

  info = fresh();
  info.h.struct_size = 32;  // half of ABI 1.4's
  const kh_device_info_t small = info;
  EXPECT_EQ(query_device_info(3, &info, error), KH_ERR_INVALID_ARGUMENT);
  EXPECT_NE(error.find("kh_device_info_t.h.struct_size is 32, smaller than ABI 1.4's"),
            std::string::npos)
      << error;
  EXPECT_EQ(std::memcmp(&info, &small, sizeof(info)), 0);
}

TEST(DeviceInfo, ADeviceTheBackendDoesNotKnowIsNoDeviceAndNothingIsWritten) {
  FakeGpu gpu;
  WithBackend with(&gpu);
  kh_device_info_t info = fresh();
  const kh_device_info_t before = info;
  std::string error;
  EXPECT_EQ(query_device_info(0, &info, error), KH_ERR_NO_DEVICE);
  EXPECT_EQ(error, "CUDA device 0 does not exist");
  EXPECT_EQ(std::memcmp(&info, &before, sizeof(info)), 0);
}

TEST(DeviceInfo, WithoutABackendOrADriverSaysWhy) {
  ASSERT_TRUE(kNoDriver);
  kh_device_info_t info = fresh();
  std::string error;
  EXPECT_EQ(query_device_info(0, &info, error), KH_ERR_NO_DEVICE);
  EXPECT_NE(error.find("no device backend yet"), std::string::npos) << error;

  WithBackend with(&CudaDeviceBackend::instance());
  EXPECT_EQ(query_device_info(0, &info, error), KH_ERR_NO_DEVICE);
  EXPECT_NE(error.find("CUDA device 0:"), std::string::npos) << error;
  EXPECT_NE(error.find("/nonexistent/libcuda.so.1"), std::string::npos) << error;
}

TEST(DeviceInfo, TheHostTableOffersItAndLabelsErrorsWithThePackage) {
  static_assert(KH_HOST_V1_4_SIZE == KH_HOST_V1_3_SIZE + sizeof(void*));
  static_assert(sizeof(kh_host_v1_t) == KH_HOST_V1_4_SIZE);
  static_assert(KH_ABI_MINOR == 4);
  PackageIdentity id;
  id.name = "pkg";
  id.version = "1.2.3";
  HostContext* c = make_host_context(id);
  const kh_host_v1_t& host = c->table;
  EXPECT_EQ(host.h.abi_minor, 4);
  ASSERT_GE(host.h.struct_size, KH_HOST_V1_4_SIZE);
  ASSERT_NE(host.device_info, nullptr);
  FakeGpu gpu;
  WithBackend with(&gpu);
  kh_device_info_t info = fresh();
  ASSERT_EQ(host.device_info(host.ctx, 3, &info), KH_OK);
  EXPECT_EQ(info.multiprocessors, 108);
  EXPECT_EQ(host.device_info(host.ctx, 1, &info), KH_ERR_NO_DEVICE);
  EXPECT_EQ(last_op_error(), "pkg 1.2.3: device_info: CUDA device 1 does not exist");
}

}  // namespace
}  // namespace kh
