// GPU tests of the device API (kernel_hub.h "Device API"; CTest label `gpu`, every test skips
// cleanly without a driver or a device): pool memory with copies both ways and memset, the
// pool's refusals on real device memory (copy past an allocation, use after free, double free,
// another pool's pointer, use after the pool is destroyed), events, a runtime module compiled
// from source and launched (and its refusals: a source that does not compile, a missing kernel,
// a cfg of another device, a stream of another device when there are two), and a CUDA graph
// captured once and replayed.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <filesystem>
#include <numeric>
#include <string>
#include <vector>

#include "hub/base/error.h"
#include "kernel_hub/kernel_hub.h"
#include "kernel_hub/kernel_hub.hpp"
#include "loader/device_backend.h"

namespace kh {
namespace {

namespace stdfs = std::filesystem;

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

const char kScaleSource[] = R"(
extern "C" __global__ void scale_add(float* x, float a, float b, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] = a * x[i] + b;
}
)";

class GpuDeviceApi : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    int32_t n = 0;
    if (kh_device_count(&n) != KH_OK || n < 1) {
      skip_ = new std::string(kh_last_error());
      return;
    }
    devices_ = n;
    std::string tmpl = (stdfs::temp_directory_path() / "kh-gpu-device-api-XXXXXX").string();
    if (mkdtemp(tmpl.data())) {
      jit_ = new stdfs::path(tmpl);
      CudaDeviceBackend::instance().set_jit_cache_dir(*jit_);
    }
  }
  static void TearDownTestSuite() {
    if (jit_) {
      std::error_code ec;
      stdfs::remove_all(*jit_, ec);
    }
  }
  void SetUp() override {
    if (skip_) GTEST_SKIP() << "no usable CUDA device: " << *skip_;
  }
  static std::string* skip_;
  static stdfs::path* jit_;
  static int devices_;
};
std::string* GpuDeviceApi::skip_ = nullptr;
stdfs::path* GpuDeviceApi::jit_ = nullptr;
int GpuDeviceApi::devices_ = 0;

TEST_F(GpuDeviceApi, PoolCopiesMemsetAndStatistics) {
  DevicePool pool(0);
  DeviceStream stream(0);
  const size_t n = 1000;
  std::vector<float> host(n), back(n, -1.f);
  std::iota(host.begin(), host.end(), 1.f);
  {
    DeviceBuffer a = pool.allocate(n * sizeof(float));
    DeviceBuffer b = pool.allocate(n * sizeof(float));
    stream.copy(a.data(), host.data(), a.size(), KH_COPY_H2D);
    stream.copy(b.data(), a.data(), a.size(), KH_COPY_D2D);
    stream.copy(back.data(), b.data(), b.size(), KH_COPY_D2H);
    stream.synchronize();
    EXPECT_EQ(back, host);
    stream.memset(b.data(), 0, b.size());
    stream.copy(back.data(), b.data(), b.size(), KH_COPY_D2H);
    stream.synchronize();
    EXPECT_EQ(back, std::vector<float>(n, 0.f));
    kh_device_pool_stats_t s = pool.stats();
    EXPECT_EQ(s.current_bytes, 2 * 4096u);  // 4000 bytes round to 4096
    EXPECT_EQ(s.driver_allocations, 2u);
  }
  kh_device_pool_stats_t s = pool.stats();
  EXPECT_EQ(s.current_bytes, 0u);
  EXPECT_EQ(s.peak_bytes, 2 * 4096u);
  EXPECT_EQ(s.cached_bytes, 2 * 4096u);
  DeviceBuffer again = pool.allocate(4000);
  EXPECT_EQ(pool.stats().reuses, 1u);
  EXPECT_EQ(pool.stats().driver_allocations, 2u);
  uint64_t free_bytes = 0, total = 0;
  ASSERT_EQ(kh_device_mem_info(0, &free_bytes, &total), KH_OK) << kh_last_error();
  EXPECT_GT(total, 0u);
  EXPECT_LE(free_bytes, total);
}

TEST_F(GpuDeviceApi, PoolRefusesMisuseOnDeviceMemory) {
  kh_device_pool_t* pool = nullptr;
  kh_device_pool_t* other = nullptr;
  ASSERT_EQ(kh_device_pool_create(0, &pool), KH_OK) << kh_last_error();
  ASSERT_EQ(kh_device_pool_create(0, &other), KH_OK) << kh_last_error();
  DeviceStream stream(0);
  void* a = nullptr;
  void* b = nullptr;
  ASSERT_EQ(kh_device_alloc(pool, 100, &a), KH_OK);
  ASSERT_EQ(kh_device_alloc(other, 100, &b), KH_OK);
  std::vector<char> host(200);
  // A copy past the end of its allocation (inside the rounded block) is refused.
  EXPECT_EQ(kh_device_copy_async(a, host.data(), 101, KH_COPY_H2D, stream.get()),
            KH_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(kh_last_error(), "runs past the end of its allocation")) << kh_last_error();
  EXPECT_EQ(kh_device_copy_async(a, host.data(), 0, KH_COPY_H2D, stream.get()),
            KH_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(kh_device_copy_async(a, host.data(), 100, 7, stream.get()), KH_ERR_INVALID_ARGUMENT);
  // Another pool's pointer.
  EXPECT_EQ(kh_device_free(pool, b), KH_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(kh_last_error(), "never handed out")) << kh_last_error();
  // Double free, use after free.
  ASSERT_EQ(kh_device_free(pool, a), KH_OK) << kh_last_error();
  EXPECT_EQ(kh_device_free(pool, a), KH_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(kh_last_error(), "double free")) << kh_last_error();
  EXPECT_EQ(kh_device_memset_async(a, 0, 4, stream.get()), KH_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(kh_last_error(), "use after free")) << kh_last_error();
  // Use after the pool is destroyed: the handle is refused, nothing crashes.
  ASSERT_EQ(kh_device_pool_destroy(other), KH_OK) << kh_last_error();
  EXPECT_EQ(kh_device_free(other, b), KH_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(kh_last_error(), "not a live handle")) << kh_last_error();
  void* c = nullptr;
  EXPECT_EQ(kh_device_alloc(other, 16, &c), KH_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(kh_device_pool_destroy(other), KH_ERR_INVALID_ARGUMENT);
  ASSERT_EQ(kh_device_pool_destroy(pool), KH_OK);
  // The C++ wrapper of a block whose pool is gone: the destructor's free is refused quietly.
  {
    auto p = std::make_unique<DevicePool>(0);
    DeviceBuffer orphan = p->allocate(64);
    p.reset();
  }
  // An unknown device.
  kh_device_pool_t* none = nullptr;
  EXPECT_EQ(kh_device_pool_create(devices_ + 7, &none), KH_ERR_NOT_FOUND);
  EXPECT_TRUE(contains(kh_last_error(), "does not exist")) << kh_last_error();
}

TEST_F(GpuDeviceApi, ModuleFromSourceLaunchesAndRefusesMisuse) {
  DevicePool pool(0);
  DeviceStream stream(0);
  DeviceModule module(0, "scale_add", kScaleSource, {"-DUNUSED=1"});
  kh_device_function_t* fn = module.function("scale_add");
  EXPECT_EQ(module.function("scale_add"), fn) << "looked up once";
  int n = 777;
  std::vector<float> host(n), back(n);
  std::iota(host.begin(), host.end(), 0.f);
  DeviceBuffer x = pool.allocate(n * sizeof(float));
  stream.copy(x.data(), host.data(), x.size(), KH_COPY_H2D);
  float a = 2.f, b = 1.f;
  void* px = x.data();
  void* args[] = {&px, &a, &b, &n};
  DeviceEvent start(0), end(0);
  start.record(stream);
  launch(fn, launch_cfg(0, {(uint32_t(n) + 127) / 128, 1, 1}, {128, 1, 1}), args, stream);
  end.record(stream);
  stream.copy(back.data(), x.data(), x.size(), KH_COPY_D2H);
  stream.synchronize();
  for (int i = 0; i < n; ++i) ASSERT_EQ(back[i], 2.f * i + 1.f) << i;
  EXPECT_GE(end.elapsed_ms_since(start), 0.f);

  // cfg.device_id of another device.
  kh_launch_cfg_t wrong = launch_cfg(devices_, {1, 1, 1}, {1, 1, 1});
  EXPECT_EQ(kh_device_launch(fn, &wrong, args, stream.get()), KH_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(kh_last_error(), "was looked up for CUDA device 0")) << kh_last_error();
  // No such kernel.
  kh_device_function_t* missing = nullptr;
  kh_device_module_t* m = nullptr;
  ASSERT_EQ(kh_device_module_from_source(0, "scale_add", kScaleSource, nullptr, 0, &m), KH_OK)
      << kh_last_error();
  EXPECT_EQ(kh_device_module_get_function(m, "nope", &missing), KH_ERR_NOT_FOUND);
  EXPECT_TRUE(contains(kh_last_error(), "no kernel named nope")) << kh_last_error();
  kh_device_function_t* f2 = nullptr;
  ASSERT_EQ(kh_device_module_get_function(m, "scale_add", &f2), KH_OK);
  // A function of a destroyed module.
  ASSERT_EQ(kh_device_module_destroy(m), KH_OK);
  kh_launch_cfg_t cfg = launch_cfg(0, {1, 1, 1}, {1, 1, 1});
  EXPECT_EQ(kh_device_launch(f2, &cfg, args, stream.get()), KH_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(kh_last_error(), "not a live handle")) << kh_last_error();
  // A source that does not compile: NVRTC's log in the message.
  EXPECT_EQ(kh_device_module_from_source(0, "broken", "extern \"C\" __global__ void k() { oops; }",
                                         nullptr, 0, &m),
            KH_ERR_INVALID_ARGUMENT);
  EXPECT_TRUE(contains(kh_last_error(), "broken.cu(1)")) << kh_last_error();
  EXPECT_TRUE(contains(kh_last_error(), "oops")) << kh_last_error();
  // A stream of another device.
  if (devices_ >= 2) {
    DeviceStream other(1);
    EXPECT_EQ(kh_device_launch(fn, &cfg, args, other.get()), KH_ERR_INVALID_ARGUMENT);
    EXPECT_TRUE(contains(kh_last_error(), "on a stream of CUDA device 1")) << kh_last_error();
  }
}

TEST_F(GpuDeviceApi, GraphCapturedOnceReplaysTheWork) {
  DevicePool pool(0);
  DeviceStream stream(0);
  DeviceModule module(0, "scale_add", kScaleSource);
  kh_device_function_t* fn = module.function("scale_add");
  int n = 256;
  DeviceBuffer x = pool.allocate(n * sizeof(float));
  std::vector<float> host(n, 1.f), back(n);
  stream.copy(x.data(), host.data(), x.size(), KH_COPY_H2D);
  stream.synchronize();
  float a = 3.f, b = 1.f;
  void* px = x.data();
  void* args[] = {&px, &a, &b, &n};
  stream.begin_capture();
  launch(fn, launch_cfg(0, {2, 1, 1}, {128, 1, 1}), args, stream);
  DeviceGraph graph = DeviceGraph::end_capture(stream);
  // Capturing ran nothing: x is still 1.
  stream.copy(back.data(), x.data(), x.size(), KH_COPY_D2H);
  stream.synchronize();
  EXPECT_EQ(back[0], 1.f);
  graph.launch(stream);
  graph.launch(stream);
  stream.copy(back.data(), x.data(), x.size(), KH_COPY_D2H);
  stream.synchronize();
  for (int i = 0; i < n; ++i) ASSERT_EQ(back[i], 13.f) << i;  // 3 * (3 * 1 + 1) + 1
  // End without a capture: a clear error.
  kh_device_graph_t* g = nullptr;
  EXPECT_NE(kh_device_graph_end_capture(stream.get(), &g), KH_OK);
  EXPECT_TRUE(contains(kh_last_error(), "cuStreamEndCapture")) << kh_last_error();
}

}  // namespace
}  // namespace kh
