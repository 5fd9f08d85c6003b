// The GEMM service (kh_gemm_t, ABI 1.2) without a GPU: request validation (struct size, ABI,
// flags, dtypes, sizes, leading dimensions, batch strides, null pointers, int64 overflow), the
// host implementation against a float64 reference for every flag combination and dtype, the
// 16-bit conversions, the host table's gemm entry, and the errors on a CUDA device where there
// is none. GPU results: tests/gpu/test_gpu_gemm.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernel_hub/kernel_hub.h"
#include "kernel_hub/kernel_hub.hpp"
#include "loader/cublaslt.h"
#include "loader/cuda_driver.h"
#include "loader/gemm_cpu.h"
#include "loader/gemm_cuda.h"
#include "loader/gemm_service.h"
#include "loader/host_services.h"
#include "tests/unit/test_gemm_util.h"

namespace kh {
namespace {

using gemm_test::run_case;

// A valid fp32 request for [m,k] @ [k,n] over the given buffers.
kh_gemm_t request(int64_t m, int64_t n, int64_t k, const void* a, const void* b, void* d) {
  kh_gemm_t g = gemm_test::plain_request(m, n, k, KH_DTYPE_FP32, KH_DTYPE_FP32);
  g.a = a;
  g.b = b;
  g.d = d;
  return g;
}

struct Rejected {
  int32_t status;
  std::string error;
};
Rejected check(const kh_gemm_t& g) {
  kh_gemm_t out;
  Rejected r;
  r.status = read_gemm(&g, out, r.error);
  return r;
}

float buf[64];

TEST(GemmRequest, AcceptsAValidRequestAndReadsBatchZeroAsOne) {
  kh_gemm_t g = request(2, 3, 4, buf, buf, buf);
  kh_gemm_t out;
  std::string error;
  ASSERT_EQ(read_gemm(&g, out, error), KH_OK) << error;
  EXPECT_EQ(out.batch, 1);
}

TEST(GemmRequest, RefusesNullAndTooSmallStructsAndOtherMajors) {
  kh_gemm_t out;
  std::string error;
  EXPECT_EQ(read_gemm(nullptr, out, error), KH_ERR_INVALID_ARGUMENT);
  kh_gemm_t g = request(2, 3, 4, buf, buf, buf);
  g.h.struct_size = kGemmV1_2Size - 8;
  Rejected r = check(g);
  EXPECT_EQ(r.status, KH_ERR_INVALID_ARGUMENT);
  EXPECT_NE(r.error.find("struct_size is 128"), std::string::npos) << r.error;
  EXPECT_NE(r.error.find("KH_HEADER_INIT(kh_gemm_t)"), std::string::npos) << r.error;
  g = request(2, 3, 4, buf, buf, buf);
  g.h.abi_major = KH_ABI_MAJOR + 1;
  EXPECT_EQ(check(g).status, KH_ERR_ABI);
}

TEST(GemmRequest, ReadsALargerStructOfANewerMinorByItsPrefix) {
  struct Newer {
    kh_gemm_t g;
    uint64_t future_field;
  } newer{request(2, 3, 4, buf, buf, buf), 0xdeadbeef};
  newer.g.h.struct_size = sizeof(Newer);
  newer.g.h.abi_minor = KH_ABI_MINOR + 1;
  kh_gemm_t out;
  std::string error;
  EXPECT_EQ(read_gemm(&newer.g, out, error), KH_OK) << error;
}

TEST(GemmRequest, RefusesUnknownFlagsAndDtypes) {
  kh_gemm_t g = request(2, 3, 4, buf, buf, buf);
  g.flags = 0x10;
  Rejected r = check(g);
  EXPECT_EQ(r.status, KH_ERR_INVALID_ARGUMENT);
  EXPECT_NE(r.error.find("unknown flags 0x10"), std::string::npos) << r.error;
  g = request(2, 3, 4, buf, buf, buf);
  g.dtype_ab = KH_DTYPE_BF16 | KH_DTYPE_FP16;
  EXPECT_EQ(check(g).status, KH_ERR_INVALID_ARGUMENT);
  g = request(2, 3, 4, buf, buf, buf);
  g.dtype_ab = KH_DTYPE_FP32;
  g.dtype_d = KH_DTYPE_BF16;  // fp32 products rounded to bf16: not offered
  r = check(g);
  EXPECT_EQ(r.status, KH_ERR_UNSUPPORTED);
  EXPECT_NE(r.error.find("D must be fp32"), std::string::npos) << r.error;
}

TEST(GemmRequest, RefusesBetaWithoutAccumulate) {
  kh_gemm_t g = request(2, 3, 4, buf, buf, buf);
  g.beta = 1.f;
  Rejected r = check(g);
  EXPECT_EQ(r.status, KH_ERR_INVALID_ARGUMENT);
  EXPECT_NE(r.error.find("KH_GEMM_ACCUMULATE"), std::string::npos) << r.error;
  g.flags = KH_GEMM_ACCUMULATE;
  EXPECT_EQ(check(g).status, KH_OK);
}

TEST(GemmRequest, RefusesNegativeSizesZeroDepthAndNullPointers) {
  kh_gemm_t g = request(-1, 3, 4, buf, buf, buf);
  EXPECT_EQ(check(g).status, KH_ERR_INVALID_ARGUMENT);
  g = request(2, 3, 0, buf, buf, buf);
  EXPECT_EQ(check(g).status, KH_ERR_INVALID_ARGUMENT);
  g = request(2, 3, 4, buf, nullptr, buf);
  Rejected r = check(g);
  EXPECT_EQ(r.status, KH_ERR_INVALID_ARGUMENT);
  EXPECT_NE(r.error.find("b NULL"), std::string::npos) << r.error;
  // An empty product reads and writes nothing: null pointers are fine.
  g = request(0, 3, 4, nullptr, nullptr, nullptr);
  EXPECT_EQ(check(g).status, KH_OK);
  std::string error;
  EXPECT_EQ(run_gemm(&g, nullptr, error), KH_OK) << error;
}

TEST(GemmRequest, RefusesPointersNotAlignedToTheirElements) {
  alignas(16) static char bytes[256];
  kh_gemm_t g = request(2, 3, 4, bytes, bytes, bytes);
  g.d = bytes + 2;  // fp32 D two bytes off
  Rejected r = check(g);
  EXPECT_EQ(r.status, KH_ERR_INVALID_ARGUMENT);
  EXPECT_NE(r.error.find("is not aligned to its 4-byte elements"), std::string::npos) << r.error;
  g.dtype_ab = KH_DTYPE_BF16;
  g.d = bytes;
  g.a = bytes + 2;  // bf16 elements: 2 bytes is enough
  EXPECT_EQ(check(g).status, KH_OK);
  g.b = bytes + 1;
  EXPECT_EQ(check(g).status, KH_ERR_INVALID_ARGUMENT);
}

TEST(GemmRequest, RefusesLeadingDimensionsShorterThanARow) {
  kh_gemm_t g = request(2, 3, 4, buf, buf, buf);
  g.lda = 3;
  Rejected r = check(g);
  EXPECT_EQ(r.status, KH_ERR_INVALID_ARGUMENT);
  EXPECT_NE(r.error.find("lda is 3"), std::string::npos) << r.error;
  EXPECT_NE(r.error.find("lda must be >= 4"), std::string::npos) << r.error;
  // Transposed, A is stored [k, m]: lda 2 (= m) is enough, 1 is not.
  g.flags = KH_GEMM_TRANS_A;
  g.lda = 2;
  EXPECT_EQ(check(g).status, KH_OK);
  g.lda = 1;
  r = check(g);
  EXPECT_NE(r.error.find("KH_GEMM_TRANS_A: stored [k, m]"), std::string::npos) << r.error;
  g = request(2, 3, 4, buf, buf, buf);
  g.flags = KH_GEMM_TRANS_B;  // B stored [n, k]: ldb >= k
  g.ldb = 3;
  EXPECT_EQ(check(g).status, KH_ERR_INVALID_ARGUMENT);
  g.ldb = 4;
  EXPECT_EQ(check(g).status, KH_OK);
  g.ldd = 2;
  r = check(g);
  EXPECT_NE(r.error.find("ldd is 2"), std::string::npos) << r.error;
}

TEST(GemmRequest, RefusesSizesWhoseProductsOverflowInt64) {
  const int64_t big = int64_t{1} << 40;
  kh_gemm_t g = request(big, big, big, buf, buf, buf);
  g.lda = big;
  g.ldb = big;
  g.ldd = big;
  Rejected r = check(g);
  EXPECT_EQ(r.status, KH_ERR_INVALID_ARGUMENT);
  EXPECT_NE(r.error.find("more than int64 can address"), std::string::npos) << r.error;
  // Fits in elements, but not in bytes.
  g = request(int64_t{1} << 31, 1, int64_t{1} << 31, buf, buf, buf);
  g.lda = int64_t{1} << 31;
  EXPECT_EQ(check(g).status, KH_ERR_INVALID_ARGUMENT);
  // A batch stride that overflows.
  g = request(2, 3, 4, buf, buf, buf);
  g.batch = 3;
  g.stride_a = std::numeric_limits<int64_t>::max() / 2;
  g.stride_d = 6;
  EXPECT_EQ(check(g).status, KH_ERR_INVALID_ARGUMENT);
}

TEST(GemmRequest, RefusesOverlappingOrNegativeBatchStrides) {
  kh_gemm_t g = request(2, 3, 4, buf, buf, buf);
  g.batch = 2;
  g.stride_d = 5;  // < m * ldd = 6
  Rejected r = check(g);
  EXPECT_EQ(r.status, KH_ERR_INVALID_ARGUMENT);
  EXPECT_NE(r.error.find("stride_d must be >= m * ldd = 6"), std::string::npos) << r.error;
  g.stride_d = 6;
  EXPECT_EQ(check(g).status, KH_OK);  // stride_a = stride_b = 0: one A and B for both
  g.stride_b = -1;
  EXPECT_EQ(check(g).status, KH_ERR_INVALID_ARGUMENT);
}

TEST(GemmRequest, CudaSizesAboveInt32AreRefusedBeforeAnyDriverCall) {
  kh_gemm_t g = request(int64_t{1} << 31, 1, 1, buf, buf, buf);
  g.device_id = 0;
  std::string error;
  EXPECT_EQ(gemm_cuda(g, nullptr, error), KH_ERR_UNSUPPORTED);
  EXPECT_NE(error.find("split the product"), std::string::npos) << error;
}

// --- the 16-bit conversions ---

TEST(GemmConvert, RoundsToNearestEvenAndKeepsSpecialValues) {
  EXPECT_EQ(float_to_bf16_bits(1.f), 0x3f80);
  EXPECT_EQ(bf16_bits_to_float(0x3f80), 1.f);
  // 1 + 2^-8 is halfway between two bf16 values: ties go to the even one (1.0).
  EXPECT_EQ(float_to_bf16_bits(1.f + 1.f / 256), 0x3f80);
  EXPECT_EQ(float_to_bf16_bits(1.f + 3.f / 256), 0x3f82);
  EXPECT_TRUE(std::isnan(bf16_bits_to_float(float_to_bf16_bits(NAN))));
  EXPECT_EQ(float_to_fp16_bits(1.f), 0x3c00);
  EXPECT_EQ(float_to_fp16_bits(-2.f), 0xc000);
  EXPECT_EQ(float_to_fp16_bits(65504.f), 0x7bff);
  EXPECT_EQ(float_to_fp16_bits(1e6f), 0x7c00);
  EXPECT_EQ(float_to_fp16_bits(5.960464477539063e-08f), 0x0001);  // smallest subnormal
  EXPECT_EQ(fp16_bits_to_float(0x0001), 5.960464477539063e-08f);
  EXPECT_EQ(float_to_fp16_bits(1.f + 1.f / 2048), 0x3c00);  // tie to even
  EXPECT_EQ(float_to_fp16_bits(1.f + 3.f / 2048), 0x3c02);
  EXPECT_TRUE(std::isnan(fp16_bits_to_float(float_to_fp16_bits(NAN))));
  for (uint32_t bits = 0; bits < 0x7c00; ++bits)  // every finite positive fp16 round-trips
    ASSERT_EQ(float_to_fp16_bits(fp16_bits_to_float(static_cast<uint16_t>(bits))), bits) << bits;
}

// --- the host implementation against float64 ---

TEST(GemmCpu, MatchesFloat64ForEveryFlagCombinationAndDtype) {
  std::mt19937 rng(7);
  const uint32_t pairs[][2] = {{KH_DTYPE_FP32, KH_DTYPE_FP32},
                               {KH_DTYPE_BF16, KH_DTYPE_BF16},
                               {KH_DTYPE_BF16, KH_DTYPE_FP32},
                               {KH_DTYPE_FP16, KH_DTYPE_FP16},
                               {KH_DTYPE_FP16, KH_DTYPE_FP32}};
  for (uint32_t flags = 0; flags <= KH_GEMM_FLAGS_KNOWN; ++flags)
    for (const auto& p : pairs) {
      run_case({5, 7, 3, 1, p[0], p[1], flags, 0}, rng);
      run_case({33, 17, 70, 3, p[0], p[1], flags, 5}, rng);
    }
}

TEST(GemmCpu, CrossesEveryBlockBoundary) {
  std::mt19937 rng(11);
  // Larger than one 64 x 256 x 256 block in every dimension, odd sizes.
  run_case({131, 517, 300, 1, KH_DTYPE_FP32, KH_DTYPE_FP32, KH_GEMM_TRANS_B, 3}, rng);
  run_case({65, 257, 513, 2, KH_DTYPE_BF16, KH_DTYPE_FP32, KH_GEMM_ACCUMULATE, 0}, rng);
}

TEST(GemmCpu, BroadcastsAZeroStrideOperand) {
  std::vector<float> a = {1, 2, 3, 4}, b = {1, 0, 0, 1}, d(8, -1.f);
  kh_gemm_t g = request(2, 2, 2, a.data(), b.data(), d.data());
  g.batch = 2;
  g.stride_d = 4;  // stride_a = stride_b = 0
  std::string error;
  ASSERT_EQ(run_gemm(&g, nullptr, error), KH_OK) << error;
  EXPECT_EQ(d, (std::vector<float>{1, 2, 3, 4, 1, 2, 3, 4}));
}

// --- the public entries and the package's table ---

TEST(GemmEntries, CAndCppApisRunAndReportErrors) {
  std::vector<float> a = {1, 2}, b = {3, 4}, d(1, 0.f);
  kh_gemm_t g = request(1, 1, 2, a.data(), b.data(), d.data());
  ASSERT_EQ(kh::gemm(g), KH_OK) << kh::last_op_error();
  EXPECT_EQ(d[0], 11.f);
  g.ldd = 0;
  EXPECT_EQ(kh::gemm(g), KH_ERR_INVALID_ARGUMENT);
  EXPECT_NE(kh::last_op_error().find("gemm: ldd is 0"), std::string::npos) << kh::last_op_error();
}

TEST(GemmEntries, HostTableOffersTheServiceAndLabelsErrorsWithThePackage) {
  PackageIdentity id;
  id.name = "pkg";
  id.version = "1.2.3";
  HostContext* c = make_host_context(id);
  const kh_host_v1_t& host = c->table;
  EXPECT_GE(host.h.abi_minor, 2);
  ASSERT_GE(host.h.struct_size, KH_HOST_V1_2_SIZE);
  ASSERT_NE(host.gemm, nullptr);
  std::vector<float> a = {1, 2}, b = {3, 4}, d(1, 0.f);
  kh_gemm_t g = request(1, 1, 2, a.data(), b.data(), d.data());
  ASSERT_EQ(host.gemm(host.ctx, &g, nullptr), KH_OK);
  EXPECT_EQ(d[0], 11.f);
  EXPECT_EQ(host.gemm(host.ctx, nullptr, nullptr), KH_ERR_INVALID_ARGUMENT);
  EXPECT_NE(last_op_error().find("pkg 1.2.3: gemm: the request is NULL"), std::string::npos)
      << last_op_error();
}

// --- a CUDA device where there may be none ---

TEST(GemmCuda, WithoutADeviceSaysSoInsteadOfCrashing) {
  bool have_device = false;
  try {
    have_device = cuda::device_count() > 0;
  } catch (const std::exception&) {
  }
  if (have_device) GTEST_SKIP() << "a CUDA device is present (tests/gpu/test_gpu_gemm.cpp)";
  kh_gemm_t g = request(2, 3, 4, buf, buf, buf);
  g.device_id = 0;
  std::string error;
  EXPECT_EQ(run_gemm(&g, nullptr, error), KH_ERR_NO_DEVICE);
  EXPECT_NE(error.find("cannot run fp32[2, 4] x [4, 3]"), std::string::npos) << error;
}

TEST(GemmCuda, CublasLtCandidatesStartWithTheOverrideAndNameBothMajors) {
  setenv("KERNEL_HUB_CUBLASLT", "/nonexistent/libcublasLt.so.13", 1);
  std::vector<std::string> c = cublaslt::candidates();
  unsetenv("KERNEL_HUB_CUBLASLT");
  ASSERT_GE(c.size(), 3u);
  EXPECT_EQ(c[0], "/nonexistent/libcublasLt.so.13");
  EXPECT_EQ(c[1], "libcublasLt.so.13");
  EXPECT_EQ(c[2], "libcublasLt.so.12");
}

TEST(GemmCuda, PointerAlignmentIsTheLargestPowerOfTwoUpTo256) {
  alignas(256) static char bytes[512];
  EXPECT_EQ(pointer_alignment(bytes), 256u);
  EXPECT_EQ(pointer_alignment(bytes + 2), 2u);
  EXPECT_EQ(pointer_alignment(bytes + 16), 16u);
  EXPECT_EQ(pointer_alignment(bytes + 1), 1u);
}

// KERNEL_HUB_GEMM_AUTOTUNE: how many of cuBLASLt's candidates a new shape times; anything but a
// count from 0 to 64 is refused naming the variable, not read as a default.
TEST(GemmCuda, AutotuneCountComesFromTheEnvironmentAndBadValuesAreRefused) {
  EXPECT_EQ(gemm_autotune_candidates(nullptr), kGemmAutotuneCandidates);
  EXPECT_EQ(gemm_autotune_candidates(""), kGemmAutotuneCandidates);
  EXPECT_EQ(gemm_autotune_candidates("0"), 0);
  EXPECT_EQ(gemm_autotune_candidates("1"), 1);
  EXPECT_EQ(gemm_autotune_candidates("16"), 16);
  for (const char* bad : {"-1", "65", "8x", "eight", " 8"}) {
    SCOPED_TRACE(bad);
    try {
      gemm_autotune_candidates(bad);
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
      EXPECT_NE(std::string(e.what()).find("KERNEL_HUB_GEMM_AUTOTUNE"), std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace kh
