// GPU tests of the loader's launch API (CTest label `gpu`; every test skips cleanly without a
// driver or a device), on the launch-probe test package (tests/packages/launch) compiled by
// NVRTC for the GPU at hand:
//  - a thread block cluster launch is real: each block reads %cluster_ctarank, %cluster_nctarank
//    and %cluster_nctaid and a peer block's shared memory (distributed shared memory, which only
//    a co-scheduled cluster has), for portable and non-portable (16) sizes; below sm_90 the
//    launch is refused with KH_ERR_LAUNCH;
//  - programmatic dependent launch: a consumer that waits (griddepcontrol.wait) reads what the
//    producer wrote, and one that does not wait reads the producer's input early, which shows
//    the launches overlapped (sm_90+);
//  - dynamic shared memory above 48 KiB up to the device's opt-in limit, and a clear error past it.
// ABI 1.0 cfgs (the toy package writes one) launch in test_gpu_device_code.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "hub/base/error.h"
#include "kernel_hub/kernel_hub.hpp"
#include "loader/cuda_driver.h"
#include "loader/device_backend.h"
#include "loader/loaded_package.h"

namespace kh {
namespace {

namespace stdfs = std::filesystem;

// CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN (cuda.h).
constexpr cuda::CUdevice_attribute kMaxSharedOptin = 97;

class GpuLaunch : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    try {
      if (cuda::device_count() < 1) return;
    } catch (const Error& e) {
      skip_ = new std::string(e.what());
      return;
    }
    std::string tmpl = (stdfs::temp_directory_path() / "kh-gpu-launch-XXXXXX").string();
    if (mkdtemp(tmpl.data())) jit_ = new stdfs::path(tmpl);
    install_cuda_device_backend();
    if (jit_) CudaDeviceBackend::instance().set_jit_cache_dir(*jit_);
  }
  static void TearDownTestSuite() {
    if (jit_) {
      std::error_code ec;
      stdfs::remove_all(*jit_, ec);
    }
  }
  void SetUp() override {
    if (skip_) GTEST_SKIP() << "no usable CUDA driver: " << *skip_;
    const cuda::DeviceInfo& dev = cuda::device(0);
    d_ = &cuda::cuda_driver();
    ASSERT_TRUE(d_->cuMemAlloc && d_->cuMemcpyDtoH && d_->cuMemsetD32 && d_->cuStreamCreate &&
                d_->cuStreamSynchronize);
    scope_ = std::make_unique<cuda::ScopedContext>(dev.primary_context);
    sm_major_ = dev.sm_major;
    cuda::check(d_->cuStreamCreate(&stream_, cuda::CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    package_ = load_package(std::string(KH_TOY_PACKAGES_DIR) + "/launch-probe");
  }
  void TearDown() override {
    for (auto p : allocations_) d_->cuMemFree(p);
    if (stream_ && d_->cuStreamDestroy) d_->cuStreamDestroy(stream_);
    scope_.reset();
  }

  // A device buffer of n uint32 words, every word set to `fill`, and its DLTensor.
  struct Buffer {
    cuda::CUdeviceptr ptr = 0;
    int64_t shape[1] = {0};
    DLTensor t{};
  };
  std::unique_ptr<Buffer> buffer(size_t n, uint32_t fill) {
    auto b = std::make_unique<Buffer>();
    cuda::check(d_->cuMemAlloc(&b->ptr, n * 4), "cuMemAlloc");
    allocations_.push_back(b->ptr);
    cuda::check(d_->cuMemsetD32(b->ptr, fill, n), "cuMemsetD32");
    // The memset runs on the legacy stream, which the test's non-blocking stream does not wait
    // for.
    cuda::check(d_->cuStreamSynchronize(nullptr), "cuStreamSynchronize(legacy stream)");
    b->shape[0] = static_cast<int64_t>(n);
    b->t.data = reinterpret_cast<void*>(static_cast<uintptr_t>(b->ptr));
    b->t.device = {kDLCUDA, 0};
    b->t.ndim = 1;
    b->t.dtype = {kDLUInt, 32, 1};
    b->t.shape = b->shape;
    return b;
  }
  std::vector<uint32_t> read(const Buffer& b) {
    std::vector<uint32_t> v(static_cast<size_t>(b.shape[0]));
    cuda::check(d_->cuStreamSynchronize(stream_), "cuStreamSynchronize");
    cuda::check(d_->cuMemcpyDtoH(v.data(), b.ptr, v.size() * 4), "cuMemcpyDtoH");
    return v;
  }
  // Calls op `name` with a tensor and ints (tensors first, as the probe's schemas have them).
  int32_t call(const char* name, std::vector<const DLTensor*> tensors, std::vector<int64_t> ints) {
    const kh_op_v1_t* op = package_.module->view.find_op(name);
    EXPECT_NE(op, nullptr) << name;
    if (!op) return KH_ERR_NOT_FOUND;
    std::vector<kh_arg_t> args;
    for (const DLTensor* t : tensors) {
      kh_arg_t a;
      a.kind = KH_ARG_TENSOR;
      a.v.t = t;
      args.push_back(a);
    }
    for (int64_t i : ints) {
      kh_arg_t a;
      a.kind = KH_ARG_INT;
      a.v.i = i;
      args.push_back(a);
    }
    clear_last_op_error();
    return op->call(args.data(), static_cast<int32_t>(args.size()), stream_);
  }

  static inline std::string* skip_ = nullptr;
  static inline stdfs::path* jit_ = nullptr;
  const cuda::Driver* d_ = nullptr;
  std::unique_ptr<cuda::ScopedContext> scope_;
  int sm_major_ = 0;
  cuda::CUstream stream_ = nullptr;
  LoadedPackage package_;
  std::vector<cuda::CUdeviceptr> allocations_;
};

struct ClusterCase {
  uint32_t grid[3];
  uint32_t cluster[3];
};

TEST_F(GpuLaunch, ClusterLaunchIsReal) {
  const ClusterCase cases[] = {
      {{8, 1, 1}, {2, 1, 1}},  {{8, 4, 1}, {2, 2, 1}},   {{16, 2, 2}, {4, 1, 2}},
      {{24, 1, 1}, {8, 1, 1}}, {{32, 2, 1}, {16, 1, 1}},  // 16: non-portable
      {{6, 1, 1}, {0, 0, 0}},                             // no cluster: each block alone
  };
  for (const ClusterCase& c : cases) {
    const uint32_t gx = c.grid[0], gy = c.grid[1], gz = c.grid[2];
    const uint32_t cx = c.cluster[0] ? c.cluster[0] : 1, cy = c.cluster[1] ? c.cluster[1] : 1,
                   cz = c.cluster[2] ? c.cluster[2] : 1;
    SCOPED_TRACE(testing::Message() << "grid " << gx << "x" << gy << "x" << gz << ", cluster "
                                    << c.cluster[0] << "x" << c.cluster[1] << "x" << c.cluster[2]);
    const size_t blocks = size_t{gx} * gy * gz;
    auto out = buffer(blocks * 6, 0xDEADBEEFu);
    const int32_t s =
        call("cluster_info", {&out->t}, {gx, gy, gz, c.cluster[0], c.cluster[1], c.cluster[2]});
    if (sm_major_ < 9) {
      if (c.cluster[0] > 1 || c.cluster[1] > 1 || c.cluster[2] > 1) {
        EXPECT_EQ(s, KH_ERR_LAUNCH);
        EXPECT_NE(last_op_error().find("needs compute capability 9.0"), std::string::npos)
            << last_op_error();
      }
      continue;
    }
    ASSERT_EQ(s, KH_OK) << last_op_error();
    const std::vector<uint32_t> v = read(*out);
    const uint32_t n = cx * cy * cz;
    for (uint32_t z = 0; z < gz; ++z)
      for (uint32_t y = 0; y < gy; ++y)
        for (uint32_t x = 0; x < gx; ++x) {
          const size_t b = x + size_t{y} * gx + size_t{z} * gx * gy;
          const uint32_t* row = &v[6 * b];
          const uint32_t rank = x % cx + (y % cy) * cx + (z % cz) * cx * cy;
          // The peer: rank + 1 of the same cluster.
          const uint32_t pr = (rank + 1) % n;
          const uint32_t px = x - x % cx + pr % cx, py = y - y % cy + (pr / cx) % cy,
                         pz = z - z % cz + pr / (cx * cy);
          const uint32_t peer = px + py * gx + pz * gx * gy;
          ASSERT_EQ(row[0], rank) << "block " << x << "," << y << "," << z;
          ASSERT_EQ(row[1], n) << "block " << b;
          ASSERT_EQ(row[2], cx) << "block " << b;
          ASSERT_EQ(row[3], cy) << "block " << b;
          ASSERT_EQ(row[4], cz) << "block " << b;
          ASSERT_EQ(row[5], peer) << "block " << b << ": a peer's shared memory";
        }
  }
}

// The producer lets the consumer start at once and writes only after spinning; the consumer
// reads its output. PDL with the wait: always right. PDL without the wait: reads poison, which
// is how the test knows the two kernels overlapped (the PDL attribute took effect).
TEST_F(GpuLaunch, ProgrammaticDependentLaunchWaitsForTheProducer) {
  const uint32_t n = 132 * 4 * 256;  // about 4 blocks per SM of an H200, room for the consumer
  const int64_t spin = 2'000'000;    // clock cycles: ~1 ms
  auto check = [&](int64_t pdl, int64_t wait, uint32_t* stale) {
    auto buf = buffer(n, 0xFFFFFFFFu);
    auto out = buffer(n, 0u);
    ASSERT_EQ(call("pdl_pair", {&buf->t, &out->t}, {spin, pdl, wait}), KH_OK) << last_op_error();
    const std::vector<uint32_t> v = read(*out);
    uint32_t bad = 0;
    for (uint32_t i = 0; i < n; ++i) bad += v[i] != 2u * i + 2u;
    *stale = bad;
  };
  for (int round = 0; round < 3; ++round) {
    uint32_t stale = 0;
    check(/*pdl=*/1, /*wait=*/1, &stale);
    EXPECT_EQ(stale, 0u) << "round " << round << ": the consumer read before the producer wrote";
    check(/*pdl=*/0, /*wait=*/0, &stale);
    EXPECT_EQ(stale, 0u) << "round " << round << ": plain stream order";
  }
  uint32_t early = 0;
  check(/*pdl=*/1, /*wait=*/0, &early);
  std::printf("PDL without griddepcontrol.wait: %u of %u elements read before they were written\n",
              early, n);
  if (sm_major_ >= 9)
    EXPECT_GT(early, 0u) << "the consumer never overlapped the producer: was PDL applied?";
  else
    EXPECT_EQ(early, 0u) << "below sm_90 the loader launches in stream order";
}

TEST_F(GpuLaunch, DynamicSharedMemoryAbove48KiB) {
  int optin = 0;
  cuda::check(d_->cuDeviceGetAttribute(&optin, kMaxSharedOptin, cuda::device(0).handle),
              "cuDeviceGetAttribute(MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)");
  if (optin <= 48 * 1024) GTEST_SKIP() << "this GPU allows no more than 48 KiB per block";
  const uint32_t blocks = 40;
  for (uint32_t bytes : {uint32_t{100} * 1024, static_cast<uint32_t>(optin) & ~3u, 48u * 1024}) {
    SCOPED_TRACE(testing::Message() << bytes << " B");
    auto out = buffer(blocks, 0u);
    ASSERT_EQ(call("big_smem", {&out->t}, {bytes}), KH_OK) << last_op_error();
    const std::vector<uint32_t> v = read(*out);
    for (uint32_t b = 0; b < blocks; ++b) {
      uint32_t sum = 0;
      for (uint32_t i = 0; i < bytes / 4; ++i) sum += i * 2654435761u + b;
      ASSERT_EQ(v[b], sum) << "block " << b;
    }
  }
  auto out = buffer(blocks, 0u);
  EXPECT_EQ(call("big_smem", {&out->t}, {static_cast<int64_t>(optin) + 1024}), KH_ERR_LAUNCH);
  EXPECT_NE(last_op_error().find("MAX_DYNAMIC_SHARED_SIZE_BYTES"), std::string::npos)
      << last_op_error();
  EXPECT_NE(last_op_error().find("probe_big_smem"), std::string::npos) << last_op_error();
}

}  // namespace
}  // namespace kh
