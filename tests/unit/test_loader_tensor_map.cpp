// The tensor-map service (kh_tensor_map_t, ABI 1.3) without a GPU: one refusal per rule of
// cuTensorMapEncodeTiled the loader checks first (each naming its field), requests of a newer
// minor read by their prefix, entries past the rank ignored, the host table's entry and size, and
// KH_ERR_NO_DEVICE where there is no driver. The encode on a GPU: tests/gpu/test_gpu_tensor_map.cpp.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kernel_hub/kernel_hub_abi.h"
#include "loader/host_services.h"
#include "loader/tensor_map_service.h"
#include "tests/unit/tensor_map_request.h"

namespace kh {
namespace {

// Every test here runs without a driver, GPU machine or not: the loader reads
// KERNEL_HUB_LIBCUDA once, at its first driver use, which no test has reached before this runs.
const bool kNoDriver = setenv("KERNEL_HUB_LIBCUDA", "/nonexistent/libcuda.so.1", 1) == 0;

// A fake 256-byte aligned device address: validation never dereferences it.
const void* const kBase = reinterpret_cast<const void*>(uintptr_t{0x7f0000000000});

// A valid request (the attention kernels' shape) at kBase.
kh_tensor_map_t request(uint64_t rows = 4096) {
  return test::bf16_tensor_map_request(kBase, rows);
}

struct Result {
  int32_t status;
  std::string error;
};
Result check(const kh_tensor_map_t& t) {
  kh_tensor_map_t out;
  Result r;
  r.status = read_tensor_map(&t, out, r.error);
  return r;
}

// Expects `t` refused as KH_ERR_INVALID_ARGUMENT with a message containing `field`.
void expect_refused(const kh_tensor_map_t& t, const std::string& field) {
  Result r = check(t);
  EXPECT_EQ(r.status, KH_ERR_INVALID_ARGUMENT) << field;
  EXPECT_NE(r.error.find(field), std::string::npos) << "wanted '" << field << "' in: " << r.error;
}

struct alignas(64) MapBytes {
  unsigned char bytes[KH_TENSOR_MAP_BYTES + 64];
};

TEST(TensorMapRequest, AcceptsTheAttentionShapeAndEveryDtypeAndSwizzle) {
  ASSERT_TRUE(kNoDriver);
  EXPECT_EQ(check(request()).status, KH_OK) << check(request()).error;
  for (uint32_t dtype : {KH_DTYPE_BF16, KH_DTYPE_FP16, KH_DTYPE_FP32})
    for (uint32_t swizzle : {0u, 32u, 64u, 128u}) {
      kh_tensor_map_t t = request();
      t.dtype = dtype;
      t.swizzle_bytes = swizzle;
      t.box[0] = 16 / (dtype == KH_DTYPE_FP32 ? 4 : 2);  // 16 bytes: fits every swizzle
      EXPECT_EQ(check(t).status, KH_OK) << dtype << " " << swizzle << ": " << check(t).error;
    }
  kh_tensor_map_t t = request();
  t.rank = 5;
  for (int i = 2; i < 5; ++i) {
    t.dims[i] = 3;
    t.strides[i] = t.strides[i - 1] * t.dims[i - 1];
    t.box[i] = 1;
  }
  EXPECT_EQ(check(t).status, KH_OK) << check(t).error;
  t = request();
  t.rank = 1;
  t.dims[0] = uint64_t{1} << 32;  // the driver's largest dimension
  t.box[0] = 8;
  EXPECT_EQ(check(t).status, KH_OK) << check(t).error;
}

TEST(TensorMapRequest, IgnoresStrideZeroAndEntriesPastTheRank) {
  kh_tensor_map_t t = request();
  t.strides[0] = 12345;  // dimension 0 is contiguous: its stride is never read
  for (int i = 2; i < 5; ++i) {
    t.dims[i] = 0;
    t.strides[i] = 7;
    t.box[i] = 999;
  }
  EXPECT_EQ(check(t).status, KH_OK) << check(t).error;
}

TEST(TensorMapRequest, ReadsALargerStructOfANewerMinorByItsPrefix) {
  struct {
    kh_tensor_map_t t;
    uint64_t appended;
  } newer{};
  newer.t = request();
  newer.t.h.struct_size = sizeof(newer);
  newer.t.h.abi_minor = KH_ABI_MINOR + 1;
  newer.appended = ~uint64_t{0};
  kh_tensor_map_t out;
  std::string error;
  ASSERT_EQ(read_tensor_map(&newer.t, out, error), KH_OK) << error;
  EXPECT_EQ(out.h.struct_size, sizeof(kh_tensor_map_t));
  EXPECT_EQ(out.dims[1], 4096u);
}

TEST(TensorMapRequest, RefusesNullTooSmallStructsAndOtherMajors) {
  kh_tensor_map_t out;
  std::string error;
  EXPECT_EQ(read_tensor_map(nullptr, out, error), KH_ERR_INVALID_ARGUMENT);
  EXPECT_NE(error.find("the request is NULL"), std::string::npos) << error;
  kh_tensor_map_t t = request();
  t.h.struct_size = kTensorMapV1_3Size - 8;
  expect_refused(t, "kh_tensor_map_t.h.struct_size is 128");
  t = request();
  t.h.abi_major = KH_ABI_MAJOR + 1;
  Result r = check(t);
  EXPECT_EQ(r.status, KH_ERR_ABI);
  EXPECT_NE(r.error.find("ABI major 2"), std::string::npos) << r.error;
}

TEST(TensorMapRequest, RefusesANegativeDevice) {
  kh_tensor_map_t t = request();
  t.device_id = -1;
  expect_refused(t, "device_id is -1");
}

TEST(TensorMapRequest, RefusesDtypesThatAreNotOneKnownBit) {
  for (uint32_t dtype : {0u, KH_DTYPE_BF16 | KH_DTYPE_FP16, 8u}) {
    kh_tensor_map_t t = request();
    t.dtype = dtype;
    expect_refused(t, "dtype is " + std::to_string(dtype));
  }
}

TEST(TensorMapRequest, RefusesRanksOutside1To5) {
  for (uint32_t rank : {0u, 6u}) {
    kh_tensor_map_t t = request();
    t.rank = rank;
    expect_refused(t, "rank is " + std::to_string(rank));
  }
}

TEST(TensorMapRequest, RefusesSwizzlesOtherThan0_32_64_128) {
  for (uint32_t swizzle : {16u, 96u, 256u}) {
    kh_tensor_map_t t = request();
    t.swizzle_bytes = swizzle;
    expect_refused(t, "swizzle_bytes is " + std::to_string(swizzle));
  }
}

TEST(TensorMapRequest, RefusesANullOrMisalignedBase) {
  kh_tensor_map_t t = request();
  t.base = nullptr;
  expect_refused(t, "base is NULL");
  t.base = static_cast<const char*>(kBase) + 8;
  expect_refused(t, "not 16-byte aligned");
}

TEST(TensorMapRequest, RefusesDimsOf0OrAbove2To32) {
  kh_tensor_map_t t = request();
  t.dims[1] = 0;
  expect_refused(t, "dims[1] is 0");
  t = request();
  t.dims[0] = (uint64_t{1} << 32) + 1;
  expect_refused(t, "dims[0] is 4294967297");
}

TEST(TensorMapRequest, RefusesStridesNotMultiplesOf16) {
  kh_tensor_map_t t = request();
  t.strides[1] = 200;
  expect_refused(t, "strides[1] is 200 bytes");
}

TEST(TensorMapRequest, RefusesStridesOf2To40OrMore) {
  kh_tensor_map_t t = request();
  t.strides[1] = uint64_t{1} << 40;
  expect_refused(t, "strides[1] is 1099511627776 bytes");
  t.strides[1] = (uint64_t{1} << 40) - 16;
  EXPECT_EQ(check(t).status, KH_OK) << check(t).error;
}

TEST(TensorMapRequest, RefusesBoxesOf0OrAbove256) {
  kh_tensor_map_t t = request();
  t.box[1] = 0;
  expect_refused(t, "box[1] is 0");
  t.box[1] = 257;
  expect_refused(t, "box[1] is 257");
  t.box[1] = 256;
  EXPECT_EQ(check(t).status, KH_OK) << check(t).error;
}

TEST(TensorMapRequest, RefusesAnInnerBoxNotAMultipleOf16Bytes) {
  kh_tensor_map_t t = request();
  t.swizzle_bytes = 0;
  t.box[0] = 12;  // 24 bytes of bf16
  expect_refused(t, "box[0] is 12 bf16 elements = 24 bytes");
}

TEST(TensorMapRequest, RefusesAnInnerBoxWiderThanTheSwizzleSpan) {
  kh_tensor_map_t t = request();
  t.box[0] = 128;  // 256 bytes of bf16 > 128
  expect_refused(t, "wider than the 128-byte swizzle span");
  t.swizzle_bytes = 0;  // without a swizzle the box may be as wide as 256 elements
  EXPECT_EQ(check(t).status, KH_OK) << check(t).error;
  t.dtype = KH_DTYPE_FP32;
  t.swizzle_bytes = 32;
  t.box[0] = 16;  // 64 bytes > 32
  expect_refused(t, "16 fp32 elements = 64 bytes, wider than the 32-byte swizzle span");
}

TEST(TensorMapEncode, RefusesANullOrMisalignedMapBeforeTheRequest) {
  MapBytes buf{};
  kh_tensor_map_t t = request();
  std::string error;
  EXPECT_EQ(encode_tensor_map(&t, nullptr, error), KH_ERR_INVALID_ARGUMENT);
  EXPECT_NE(error.find("map is NULL"), std::string::npos) << error;
  EXPECT_EQ(encode_tensor_map(&t, buf.bytes + 32, error), KH_ERR_INVALID_ARGUMENT);
  EXPECT_NE(error.find("not 64-byte aligned"), std::string::npos) << error;
  t.rank = 0;
  EXPECT_EQ(encode_tensor_map(&t, buf.bytes, error), KH_ERR_INVALID_ARGUMENT);
  EXPECT_NE(error.find("rank is 0"), std::string::npos) << error;
}

TEST(TensorMapEncode, WithoutADriverSaysSoAndLeavesTheMapAlone) {
  MapBytes buf;
  std::memset(buf.bytes, 0xab, sizeof(buf.bytes));
  kh_tensor_map_t t = request();
  std::string error;
  EXPECT_EQ(encode_tensor_map(&t, buf.bytes, error), KH_ERR_NO_DEVICE);
  EXPECT_NE(error.find("cannot encode a tensor map for CUDA device 0"), std::string::npos) << error;
  EXPECT_NE(error.find("/nonexistent/libcuda.so.1 not found"), std::string::npos) << error;
  for (unsigned char b : buf.bytes) ASSERT_EQ(b, 0xab);
}

TEST(TensorMapEntries, HostTableOffersTheServiceAndLabelsErrorsWithThePackage) {
  static_assert(KH_HOST_V1_3_SIZE == KH_HOST_V1_2_SIZE + sizeof(void*));
  static_assert(sizeof(kh_host_v1_t) >= KH_HOST_V1_3_SIZE);
  PackageIdentity id;
  id.name = "pkg";
  id.version = "1.2.3";
  HostContext* c = make_host_context(id);
  const kh_host_v1_t& host = c->table;
  EXPECT_GE(host.h.abi_minor, 3);
  ASSERT_GE(host.h.struct_size, KH_HOST_V1_3_SIZE);
  ASSERT_NE(host.tensor_map, nullptr);
  MapBytes buf{};
  kh_tensor_map_t t = request();
  t.swizzle_bytes = 48;
  EXPECT_EQ(host.tensor_map(host.ctx, &t, buf.bytes), KH_ERR_INVALID_ARGUMENT);
  EXPECT_NE(last_op_error().find("pkg 1.2.3: tensor_map: swizzle_bytes is 48"), std::string::npos)
      << last_op_error();
  t = request();
  EXPECT_EQ(host.tensor_map(host.ctx, &t, buf.bytes), KH_ERR_NO_DEVICE);
  EXPECT_NE(last_op_error().find("pkg 1.2.3: tensor_map: cannot encode"), std::string::npos)
      << last_op_error();
}

}  // namespace
}  // namespace kh
