// GPU tests of the loader's device code (CTest label `gpu`; every test skips cleanly without a
// driver or a device): the packaged-cubin path and the NVRTC path each launch the toy kernel
// through a bound layer slot, on fresh random inputs, with the output poisoned before the run,
// checked against a float64 reference; two devices get their own code when the machine has two.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "hub/base/error.h"
#include "hub/base/fs.h"
#include "kernel_hub/kernel_hub.hpp"
#include "loader/cuda_driver.h"
#include "loader/device_backend.h"
#include "loader/jit_cache.h"
#include "loader/loaded_package.h"

namespace kh {
namespace {

namespace stdfs = std::filesystem;

// A temp directory removed at the end of the test. (This binary links no test fixtures, so that
// it needs few system libraries on GPU machines.)
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (stdfs::temp_directory_path() / "kh-gpu-test-XXXXXX").string();
    if (!mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    stdfs::remove_all(path_, ec);
  }
  stdfs::path operator/(const std::string& p) const { return path_ / p; }

 private:
  stdfs::path path_;
};

std::string pkg(const std::string& variant) {
  return std::string(KH_TOY_PACKAGES_DIR) + "/" + variant;
}

// Device count, or -1 with `why` set.
int gpus(std::string* why) {
  try {
    return cuda::device_count();
  } catch (const Error& e) {
    *why = e.what();
    return -1;
  }
}

#define REQUIRE_GPUS(n)                                                   \
  std::string no_gpu;                                                     \
  int gpu_count = gpus(&no_gpu);                                          \
  if (gpu_count < 0) GTEST_SKIP() << "no usable CUDA driver: " << no_gpu; \
  if (gpu_count < (n)) GTEST_SKIP() << "needs " << (n) << " GPUs, this machine has " << gpu_count

void ok(cuda::CUresult r, const char* what) {
  cuda::check(r, what);
}

// Runs the bound slot on `device` with n random floats and checks y = x * alpha + offset
// against a float64 reference. Every element of y is poisoned (NaN) first, so an element the
// kernel skipped fails the check.
void run_and_check(const Runtime& rt, uint32_t slot, int device, int64_t n, double offset) {
  const cuda::Driver& d = cuda::cuda_driver();
  ASSERT_TRUE(d.cuMemAlloc && d.cuMemcpyHtoD && d.cuMemcpyDtoH && d.cuMemsetD32 &&
              d.cuStreamCreate && d.cuStreamSynchronize);
  const cuda::DeviceInfo& dev = cuda::device(device);
  cuda::ScopedContext scope(dev.primary_context);

  std::random_device seed;
  std::mt19937_64 rng(seed());
  std::uniform_real_distribution<float> dist(-4.0f, 4.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = dist(rng);
  const double alpha = std::uniform_real_distribution<double>(0.5, 3.0)(rng);

  const size_t bytes = x.size() * sizeof(float);
  cuda::CUdeviceptr dx = 0, dy = 0;
  ok(d.cuMemAlloc(&dx, bytes), "cuMemAlloc(x)");
  ok(d.cuMemAlloc(&dy, bytes), "cuMemAlloc(y)");
  ok(d.cuMemcpyHtoD(dx, x.data(), bytes), "cuMemcpyHtoD");
  ok(d.cuMemsetD32(dy, 0x7fc00001u, x.size()), "cuMemsetD32(poison)");  // quiet NaN
  cuda::CUstream stream = nullptr;
  ok(d.cuStreamCreate(&stream, cuda::CU_STREAM_NON_BLOCKING), "cuStreamCreate");

  int64_t shape[1] = {n};
  DLTensor tx{}, ty{};
  tx.data = reinterpret_cast<void*>(static_cast<uintptr_t>(dx));
  ty.data = reinterpret_cast<void*>(static_cast<uintptr_t>(dy));
  tx.device = ty.device = {kDLCUDA, device};
  tx.ndim = ty.ndim = 1;
  tx.dtype = ty.dtype = {kDLFloat, 32, 1};
  tx.shape = ty.shape = shape;
  kh_arg_t args[3];
  args[0].kind = KH_ARG_TENSOR;
  args[0].v.t = &tx;
  args[1].kind = KH_ARG_FLOAT;
  args[1].v.f = alpha;
  args[2].kind = KH_ARG_TENSOR;
  args[2].v.t = &ty;
  ASSERT_EQ(rt.forward(slot, device, args, 3, stream), KH_OK) << last_op_error();
  ok(d.cuStreamSynchronize(stream), "cuStreamSynchronize");

  std::vector<float> y(x.size());
  ok(d.cuMemcpyDtoH(y.data(), dy, bytes), "cuMemcpyDtoH");
  double err2 = 0, ref2 = 0;
  int64_t unwritten = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double ref =
        static_cast<double>(x[i]) * static_cast<double>(static_cast<float>(alpha)) + offset;
    if (!std::isfinite(y[i])) ++unwritten;
    err2 += (y[i] - ref) * (y[i] - ref);
    ref2 += ref * ref;
  }
  EXPECT_EQ(unwritten, 0) << "elements left poisoned (or NaN) of " << n;
  const double rel = std::sqrt(err2 / ref2);
  EXPECT_LT(rel, 1e-6) << "relative L2 error vs float64 reference, n=" << n;
  ::testing::Test::RecordProperty("relative_error_device_" + std::to_string(device),
                                  std::to_string(rel));
  std::printf("device %d, n=%lld: relative L2 error %.3g\n", device, static_cast<long long>(n),
              rel);
  if (d.cuStreamDestroy) d.cuStreamDestroy(stream);
  if (d.cuMemFree) {
    d.cuMemFree(dx);
    d.cuMemFree(dy);
  }
}

const PackageIdentity& identity(const std::string& variant) {
  return load_package(pkg(variant)).module->host->package;
}

TEST(GpuDeviceCode, DeviceProperties) {
  REQUIRE_GPUS(1);
  const cuda::DeviceInfo& dev = cuda::device(0);
  EXPECT_FALSE(dev.name.empty());
  EXPECT_GE(dev.sm_major, 7);
  EXPECT_GT(dev.total_memory, size_t{1} << 30);
  EXPECT_GE(cuda::cuda_driver().driver_version, cuda::kMinDriverCudaVersion);
  std::printf("device 0: %s, sm_%d%d, %zu MiB, %d SMs, driver CUDA %d\n", dev.name.c_str(),
              dev.sm_major, dev.sm_minor, dev.total_memory >> 20, dev.multiprocessors,
              cuda::cuda_driver().driver_version);
  EXPECT_THROW(cuda::device(gpu_count), Error);
}

TEST(GpuDeviceCode, PackagedCubinPathLaunchesTheToyKernel) {
  REQUIRE_GPUS(1);
  if (std::string(KH_TOY_CUBIN_ARCHS).empty()) GTEST_SKIP() << "built without nvcc: no cubins";
  const cuda::DeviceInfo& dev = cuda::device(0);
  if (dev.sm_major != 9) GTEST_SKIP() << "the toy cubin is sm_90; this GPU is sm_" << dev.sm_major;
  TempDir jit;
  Runtime rt(RuntimeOptions{false, jit / "jit"});
  uint32_t slot = rt.add_slot("Scale");
  rt.bind("Scale", pkg("toy-cubin-only"), Mode::kEval, 0);  // no source: only the cubin can serve
  const DeviceCodeInfo& info =
      CudaDeviceBackend::instance().prepare_device_code(identity("toy-cubin-only"), 0);
  EXPECT_EQ(info.kind, DeviceCodeKind::kCubin) << info.description;
  EXPECT_EQ(info.arch.sm(), "sm_90");
  std::printf("cubin path: %s\n", info.description.c_str());
  rt.set_mode(Mode::kEval);
  for (int64_t n : {int64_t{1}, int64_t{255}, int64_t{1} << 20, (int64_t{1} << 22) + 7})
    run_and_check(rt, slot, 0, n, 0.0);
}

TEST(GpuDeviceCode, NvrtcPathLaunchesTheToyKernel) {
  REQUIRE_GPUS(1);
  TempDir jit;
  Runtime rt(RuntimeOptions{false, jit / "jit"});
  uint32_t slot = rt.add_slot("Scale");
  rt.bind("Scale", pkg("toy-source-only"), Mode::kEval, 0);
  const DeviceCodeInfo& info =
      CudaDeviceBackend::instance().prepare_device_code(identity("toy-source-only"), 0);
  EXPECT_EQ(info.kind, DeviceCodeKind::kSource) << info.description;
  EXPECT_TRUE(info.compiled) << "a fresh JIT cache must miss: " << info.description;
  std::printf("NVRTC path: %s\n", info.description.c_str());
  // The entry is on disk and verifies.
  JitCache cache(jit / "jit");
  auto entry = cache.lookup(Digest::from_hex(info.jit_key));
  ASSERT_TRUE(entry);
  EXPECT_EQ(entry->substr(0, 4),
            "\x7f"
            "ELF");
  rt.set_mode(Mode::kEval);
  for (int64_t n : {int64_t{3}, int64_t{1} << 20, (int64_t{1} << 22) + 129})
    run_and_check(rt, slot, 0, n, 0.0);
}

// Version 2.0.0 (offset 1, source only) through NVRTC next to 1.0.0 (cubin where available):
// two versions of one package on one GPU, each computing its own result.
TEST(GpuDeviceCode, TwoVersionsOnOneGpu) {
  REQUIRE_GPUS(1);
  TempDir jit;
  Runtime rt(RuntimeOptions{false, jit / "jit"});
  uint32_t v1 = rt.add_slot("Scale");
  uint32_t v2 = rt.add_slot("Scale2");
  rt.bind("Scale", pkg("toy-1.0.0"), Mode::kEval, 0);
  rt.bind("Scale2", pkg("toy-2.0.0"), Mode::kEval, 0, "Scale");
  rt.set_mode(Mode::kEval);
  run_and_check(rt, v1, 0, 100003, 0.0);
  run_and_check(rt, v2, 0, 100003, 1.0);
}

// A second lookup of the same kernel is the same handle; an unknown kernel is KH_ERR_NOT_FOUND.
TEST(GpuDeviceCode, KernelLookupByName) {
  REQUIRE_GPUS(1);
  TempDir jit;
  Runtime rt(RuntimeOptions{false, jit / "jit"});
  rt.add_slot("Scale");
  rt.bind("Scale", pkg("toy-source-only"), Mode::kEval, 0);
  const kh_host_v1_t& host = load_package(pkg("toy-source-only")).module->host->table;
  void* a = nullptr;
  void* b = nullptr;
  ASSERT_EQ(host.get_function(host.ctx, 0, "toy_scale_f32", &a), KH_OK) << last_op_error();
  ASSERT_EQ(host.get_function(host.ctx, 0, "toy_scale_f32", &b), KH_OK) << last_op_error();
  EXPECT_EQ(a, b);
  void* c = nullptr;
  EXPECT_EQ(host.get_function(host.ctx, 0, "no_such_kernel", &c), KH_ERR_NOT_FOUND);
  EXPECT_NE(last_op_error().find("no_such_kernel"), std::string::npos) << last_op_error();
}

TEST(GpuDeviceCode, BindFailsClearlyWithoutDeviceCodeOrDevice) {
  REQUIRE_GPUS(1);
  Runtime rt;
  rt.add_slot("Scale");
  try {
    rt.bind("Scale", pkg("toy-no-device-code"), Mode::kEval, 0);
    FAIL() << "bound a package without device code to a GPU";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("has no device code for CUDA device 0"), std::string::npos) << m;
    EXPECT_NE(m.find(cuda::device(0).name), std::string::npos) << m;
    EXPECT_NE(m.find("no cubins and no CUDA source"), std::string::npos) << m;
  }
  try {
    rt.bind("Scale", pkg("toy-1.0.0"), Mode::kEval, gpu_count);
    FAIL() << "bound to a device that does not exist";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not exist"), std::string::npos) << e.what();
  }
}

// Several GPUs: a table row per device, each with its own entry and function handle (and its
// own code when the sm differs).
TEST(GpuDeviceCode, TwoDevicesEachGetTheirOwnCode) {
  REQUIRE_GPUS(2);
  TempDir jit;
  Runtime rt(RuntimeOptions{false, jit / "jit"});
  uint32_t slot = rt.add_slot("Scale");
  rt.bind("Scale", pkg("toy-1.0.0"), Mode::kEval, 0);
  rt.bind("Scale", pkg("toy-1.0.0"), Mode::kEval, 1);
  const PackageIdentity& id = identity("toy-1.0.0");
  const DeviceCodeInfo& c0 = CudaDeviceBackend::instance().prepare_device_code(id, 0);
  const DeviceCodeInfo& c1 = CudaDeviceBackend::instance().prepare_device_code(id, 1);
  std::printf("device 0: %s\ndevice 1: %s\n", c0.description.c_str(), c1.description.c_str());
  const cuda::DeviceInfo& d0 = cuda::device(0);
  const cuda::DeviceInfo& d1 = cuda::device(1);
  if (d0.sm_major != d1.sm_major || d0.sm_minor != d1.sm_minor) {
    EXPECT_NE(c0.arch, c1.arch);
  }
  const kh_host_v1_t& host = load_package(pkg("toy-1.0.0")).module->host->table;
  void* f0 = nullptr;
  void* f1 = nullptr;
  ASSERT_EQ(host.get_function(host.ctx, 0, "toy_scale_f32", &f0), KH_OK) << last_op_error();
  ASSERT_EQ(host.get_function(host.ctx, 1, "toy_scale_f32", &f1), KH_OK) << last_op_error();
  EXPECT_NE(f0, f1);
  rt.set_mode(Mode::kEval);
  run_and_check(rt, slot, 0, (1 << 20) + 1, 0.0);
  run_and_check(rt, slot, 1, (1 << 20) + 1, 0.0);
}

}  // namespace
}  // namespace kh
