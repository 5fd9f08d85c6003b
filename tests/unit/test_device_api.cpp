// The device API (kernel_hub.h "Device API") on a machine without a GPU: the pool's caching
// rules on a host backing (rounding, reuse by size class, statistics, the out-of-memory retry,
// and the refusals: double free, interior and foreign pointers, ranges past an allocation,
// use after free), the C functions refusing bad arguments and stale handles before any driver
// call, a clear error for every call that needs a GPU, and a runtime-module source that does not
// compile reported with NVRTC's log (NVRTC needs no GPU). tests/gpu/test_gpu_device_api.cpp runs
// the rest on a GPU.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "hub/base/error.h"
#include "kernel_hub/kernel_hub.h"
#include "kernel_hub/kernel_hub.hpp"
#include "loader/cuda_driver.h"
#include "loader/device_backend.h"
#include "loader/device_code.h"
#include "loader/device_pool.h"
#include "loader/nvrtc.h"
#include "tests/fixtures/process.h"

namespace kh {
namespace {

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// A backing that hands out fake addresses and records what is live.
struct FakeBacking {
  uint64_t next = 0x10000000;
  std::set<uint64_t> live;
  uint64_t limit = ~uint64_t{0};  // bytes held at once before "out of memory"
  uint64_t held = 0;
  std::vector<std::pair<uint64_t, size_t>> sizes;
  int calls = 0;

  CachingPool::Backing backing() {
    CachingPool::Backing b;
    b.allocate = [this](size_t bytes, bool& oom) -> uint64_t {
      ++calls;
      if (held + bytes > limit) {
        oom = true;
        throw Error(ErrorKind::kIo, "cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY");
      }
      uint64_t a = next;
      next += bytes + 4096;
      live.insert(a);
      sizes.push_back({a, bytes});
      held += bytes;
      return a;
    };
    b.release = [this](uint64_t a) {
      live.erase(a);
      for (auto& [addr, n] : sizes)
        if (addr == a) held -= n;
    };
    return b;
  }
};

TEST(CachingPoolRules, SizeClassesRoundUpByLessThanAQuarter) {
  EXPECT_EQ(CachingPool::size_class(1), 512u);
  EXPECT_EQ(CachingPool::size_class(512), 512u);
  EXPECT_EQ(CachingPool::size_class(513), 1024u);
  EXPECT_EQ(CachingPool::size_class(4096), 4096u);
  EXPECT_EQ(CachingPool::size_class(4097), 5120u);
  EXPECT_EQ(CachingPool::size_class(3u << 20), 3u << 20);
  EXPECT_EQ(CachingPool::size_class((3u << 20) + 1), (7u << 20) / 2);
  for (size_t n : {1ul, 100ul, 4000ul, 5000ul, 123457ul, 1ul << 20, 999999999ul}) {
    size_t c = CachingPool::size_class(n);
    EXPECT_GE(c, n);
    EXPECT_EQ(c % CachingPool::kMinBlock, 0u) << n;
    if (n > 4096) {
      EXPECT_LT(c - n, n / 4 + 1) << n;
    }
  }
}

TEST(CachingPoolRules, FreedBlocksAreReusedByClassAndCounted) {
  FakeBacking fake;
  {
    CachingPool pool("test pool", fake.backing());
    uint64_t a = pool.allocate(1000);  // class 1024
    uint64_t b = pool.allocate(5000);  // class 5120
    PoolStats s = pool.stats();
    EXPECT_EQ(s.current_bytes, 1024u + 5120u);
    EXPECT_EQ(s.peak_bytes, s.current_bytes);
    EXPECT_EQ(s.backing_allocations, 2u);
    pool.free(a);
    uint64_t c = pool.allocate(700);  // the same class: the cached block, no backing call
    EXPECT_EQ(c, a);
    EXPECT_EQ(fake.calls, 2);
    uint64_t d = pool.allocate(2000);  // another class: a new block
    EXPECT_NE(d, a);
    s = pool.stats();
    EXPECT_EQ(s.allocations, 4u);
    EXPECT_EQ(s.reuses, 1u);
    EXPECT_EQ(s.current_bytes, 1024u + 5120u + 2048u);
    pool.free(b);
    pool.free(c);
    s = pool.stats();
    EXPECT_EQ(s.current_bytes, 2048u);
    EXPECT_EQ(s.cached_bytes, 1024u + 5120u);
    EXPECT_EQ(s.reserved_bytes, 1024u + 5120u + 2048u);
    EXPECT_EQ(s.peak_bytes, 1024u + 5120u + 2048u);
    EXPECT_EQ(pool.trim(), 1024u + 5120u);
    EXPECT_EQ(fake.live.size(), 1u);
    EXPECT_EQ(pool.stats().reserved_bytes, 2048u);
    EXPECT_EQ(pool.live_blocks(), 1u);
  }
  EXPECT_TRUE(fake.live.empty()) << "the pool's destructor releases live blocks too";
}

TEST(CachingPoolRules, RefusesDoubleFreeInteriorAndForeignPointers) {
  FakeBacking fake;
  CachingPool pool("test pool", fake.backing());
  CachingPool other("other pool", FakeBacking{}.backing());
  uint64_t a = pool.allocate(100);
  auto refused = [&](CachingPool& p, uint64_t address, const std::string& expected) {
    try {
      p.free(address);
      ADD_FAILURE() << "free of 0x" << std::hex << address << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
      EXPECT_TRUE(contains(e.what(), expected)) << e.what();
    }
  };
  refused(pool, a + 16, "points 16 bytes into the block");
  refused(pool, 0xdead0000, "never handed out");
  refused(other, a, "never handed out");
  pool.free(a);
  refused(pool, a, "double free");
  EXPECT_EQ(pool.stats().current_bytes, 0u) << "a refused free changes nothing";
  try {
    pool.allocate(0);
    ADD_FAILURE() << "a zero-byte allocation was accepted";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "0 bytes")) << e.what();
  }
}

TEST(CachingPoolRules, RangeChecksCatchOverrunsAndUseAfterFree) {
  FakeBacking fake;
  CachingPool pool("test pool", fake.backing());
  uint64_t a = pool.allocate(1000);
  EXPECT_TRUE(pool.check_range(a, 1000, "copy to"));
  EXPECT_TRUE(pool.check_range(a + 999, 1, "copy to"));
  EXPECT_FALSE(pool.check_range(0x1000, 8, "copy to")) << "not this pool's: not checked";
  try {
    pool.check_range(a + 900, 101, "copy to");  // inside the size class, past the request
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "runs past the end of its allocation")) << e.what();
    EXPECT_TRUE(contains(e.what(), "by 1 bytes")) << e.what();
  }
  pool.free(a);
  try {
    pool.check_range(a, 4, "copy from");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "use after free")) << e.what();
  }
}

TEST(CachingPoolRules, OutOfMemoryReleasesTheCacheAndRetriesOnce) {
  FakeBacking fake;
  fake.limit = 8192;
  CachingPool pool("test pool", fake.backing());
  uint64_t a = pool.allocate(4096);
  uint64_t b = pool.allocate(4096);
  pool.free(a);
  pool.free(b);
  // 6144 does not fit beside the 8192 cached: the cache is released, the retry fits.
  uint64_t c = pool.allocate(6000);
  EXPECT_NE(c, 0u);
  EXPECT_EQ(pool.stats().cached_bytes, 0u);
  // Still too large with nothing cached: the error names the pool and the sizes.
  try {
    pool.allocate(4096);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "test pool: allocating 4096 bytes")) << e.what();
    EXPECT_TRUE(contains(e.what(), "CUDA_ERROR_OUT_OF_MEMORY")) << e.what();
  }
}

// ---- the C functions without a GPU ----

#define EXPECT_STATUS(call, status, text)                                                    \
  do {                                                                                       \
    int32_t s_ = (call);                                                                     \
    EXPECT_EQ(s_, status) << #call << ": " << kh_status_name(s_) << ": " << kh_last_error(); \
    EXPECT_TRUE(contains(kh_last_error(), text)) << #call << ": " << kh_last_error();        \
  } while (0)

TEST(DeviceApiC, RefusesNullZeroNegativeAndStaleHandlesBeforeTheDriver) {
  auto* stale_pool = reinterpret_cast<kh_device_pool_t*>(uintptr_t{0x1234});
  auto* stale_stream = reinterpret_cast<kh_device_stream_t*>(uintptr_t{0x5678});
  auto* stale_fn = reinterpret_cast<kh_device_function_t*>(uintptr_t{0x9abc});
  void* p = nullptr;
  int x = 0;
  EXPECT_STATUS(kh_device_pool_create(0, nullptr), KH_ERR_INVALID_ARGUMENT,
                "pool_out must not be NULL");
  EXPECT_STATUS(kh_device_pool_create(-1, reinterpret_cast<kh_device_pool_t**>(&p)),
                KH_ERR_INVALID_ARGUMENT, "a CUDA device ordinal is 0 or more");
  EXPECT_STATUS(kh_device_alloc(nullptr, 16, &p), KH_ERR_INVALID_ARGUMENT, "pool must not be NULL");
  EXPECT_STATUS(kh_device_get_info(0, nullptr), KH_ERR_INVALID_ARGUMENT, "info must not be NULL");
  kh_device_info_t info{};
  info.h = KH_HEADER_INIT(kh_device_info_t);
  EXPECT_STATUS(kh_device_get_info(-1, &info), KH_ERR_INVALID_ARGUMENT,
                "a CUDA device ordinal is 0 or more");
  // The struct before the driver: refused for what it is on a machine without a GPU too.
  kh_device_info_t small = info;
  small.h.struct_size = 40;
  EXPECT_STATUS(kh_device_get_info(0, &small), KH_ERR_INVALID_ARGUMENT, "kh_device_info_t");
  kh_device_info_t other_major = info;
  other_major.h.abi_major = KH_ABI_MAJOR + 1;
  EXPECT_STATUS(kh_device_get_info(0, &other_major), KH_ERR_UNSUPPORTED, "ABI major");
  EXPECT_EQ(small.multiprocessors, 0);
  EXPECT_STATUS(kh_device_alloc(stale_pool, 16, &p), KH_ERR_INVALID_ARGUMENT,
                "is not a live handle");
  EXPECT_STATUS(kh_device_free(stale_pool, &x), KH_ERR_INVALID_ARGUMENT, "is not a live handle");
  EXPECT_STATUS(kh_device_pool_destroy(stale_pool), KH_ERR_INVALID_ARGUMENT,
                "is not a live handle");
  EXPECT_STATUS(kh_device_copy_async(&x, &x, 4, KH_COPY_H2D, nullptr), KH_ERR_INVALID_ARGUMENT,
                "stream must not be NULL");
  EXPECT_STATUS(kh_device_copy_async(&x, &x, 4, KH_COPY_H2D, stale_stream), KH_ERR_INVALID_ARGUMENT,
                "is not a live handle");
  EXPECT_STATUS(kh_device_stream_synchronize(stale_stream), KH_ERR_INVALID_ARGUMENT,
                "is not a live handle");
  EXPECT_STATUS(kh_device_graph_begin_capture(stale_stream), KH_ERR_INVALID_ARGUMENT,
                "is not a live handle");
  kh_launch_cfg_t cfg = launch_cfg(0, {1, 1, 1}, {1, 1, 1});
  EXPECT_STATUS(kh_device_launch(nullptr, &cfg, nullptr, stale_stream), KH_ERR_INVALID_ARGUMENT,
                "function must not be NULL");
  EXPECT_STATUS(kh_device_launch(stale_fn, &cfg, nullptr, stale_stream), KH_ERR_INVALID_ARGUMENT,
                "is not a live handle");
  kh_device_module_t* m = nullptr;
  EXPECT_STATUS(kh_device_module_from_source(0, "m", nullptr, nullptr, 0, &m),
                KH_ERR_INVALID_ARGUMENT, "source must not be NULL");
  EXPECT_STATUS(kh_device_module_from_source(0, "m", "x", nullptr, 2, &m), KH_ERR_INVALID_ARGUMENT,
                "num_options is 2");
  EXPECT_STATUS(kh_device_module_from_source(0, "", "x", nullptr, 0, &m), KH_ERR_INVALID_ARGUMENT,
                "needs a name");
  kh_device_pool_stats_t stats{};
  EXPECT_STATUS(kh_device_pool_stats(stale_pool, &stats), KH_ERR_INVALID_ARGUMENT,
                "set it to sizeof");
  EXPECT_EQ(kh_device_stream_handle(nullptr), nullptr);
  // The C++ wrappers throw the same, with the kind of the status.
  try {
    DevicePool pool(-3);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
    EXPECT_TRUE(contains(e.what(), "device -3")) << e.what();
  }
}

TEST(DeviceApiC, EveryGpuCallFailsClearlyWithoutADriver) {
  if (cuda::cuda_driver_attempted()) GTEST_SKIP() << "the driver was used in this process";
  // Hide the driver even on a GPU machine (read once, at the first GPU use).
  setenv("KERNEL_HUB_LIBCUDA", "libcuda-absent-for-this-test.so.1", 1);
  int32_t n = -1;
  EXPECT_STATUS(kh_device_count(&n), KH_ERR_NOT_FOUND, "no NVIDIA driver on this machine");
  kh_device_pool_t* pool = nullptr;
  EXPECT_STATUS(kh_device_pool_create(0, &pool), KH_ERR_NOT_FOUND,
                "libcuda-absent-for-this-test.so.1 not found");
  EXPECT_EQ(pool, nullptr);
  kh_device_stream_t* stream = nullptr;
  EXPECT_STATUS(kh_device_stream_create(0, &stream), KH_ERR_NOT_FOUND, "no NVIDIA driver");
  kh_device_event_t* event = nullptr;
  EXPECT_STATUS(kh_device_event_create(0, &event), KH_ERR_NOT_FOUND, "no NVIDIA driver");
  uint64_t f = 0, t = 0;
  EXPECT_STATUS(kh_device_mem_info(0, &f, &t), KH_ERR_NOT_FOUND, "no NVIDIA driver");
  kh_device_info_t info{};
  info.h = KH_HEADER_INIT(kh_device_info_t);
  EXPECT_STATUS(kh_device_get_info(0, &info), KH_ERR_NOT_FOUND, "no NVIDIA driver");
  EXPECT_EQ(info.multiprocessors, 0);  // nothing written on failure
  kh_device_module_t* m = nullptr;
  EXPECT_STATUS(
      kh_device_module_from_source(0, "m", "extern \"C\" __global__ void k() {}", nullptr, 0, &m),
      KH_ERR_NOT_FOUND, "no NVIDIA driver");
}

// A runtime module's source that does not compile: the error carries NVRTC's log with the
// module's file name and line. Through the one compile path (build_source), which compiles
// before it needs a driver, so this runs on the CPU.
TEST(DeviceApiNvrtc, ASourceThatDoesNotCompileReportsTheLog) {
  try {
    nvrtc();
  } catch (const Error& e) {
    GTEST_SKIP() << "no NVRTC: " << e.what();
  }
  test::TempDir jit("kh-device-api-jit");
  CudaDeviceBackend& backend = CudaDeviceBackend::instance();
  backend.set_jit_cache_dir(jit.path());
  const std::string source =
      "extern \"C\" __global__ void broken(float* x) {\n"
      "  x[threadIdx.x] = undeclared_name;\n"
      "}\n";
  try {
    backend.build_source(source, "broken.cu", "broken.cu (runtime module)",
                         *CudaArch::parse("sm_90a"), {"-DKH_TEST=1"});
    FAIL() << "a broken source compiled";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
    EXPECT_TRUE(contains(e.what(), "broken.cu (runtime module)")) << e.what();
    EXPECT_TRUE(contains(e.what(), "broken.cu(2)")) << e.what();
    EXPECT_TRUE(contains(e.what(), "undeclared_name")) << e.what();
  }
  backend.set_jit_cache_dir({});
}

}  // namespace
}  // namespace kh
