// Helpers shared by the GPU tests of the kernel packages (test_kernels_gpu.cpp,
// test_kernels_gpu_rotary_softmax.cpp): the few CUDA driver calls they need, through dlopen of
// libcuda.so.1 (no CUDA runtime is linked, like the packages), an Executor that mirrors host
// tensors in device memory, cubin package copies, and the fixture that skips without a device.
#pragma once

#include <dlfcn.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "hub/base/fs.h"
#include "loader/device_backend.h"
#include "tests/fixtures/process.h"
#include "tests/unit/test_kernels_nvrtc.h"
#include "tests/unit/test_kernels_util.h"

namespace kh::kernels_test {

// ---- the driver calls the test needs ------------------------------------------------------
struct Cuda {
  typedef int Res;
  typedef unsigned long long Ptr;
  Res (*init)(unsigned) = nullptr;
  Res (*device_count)(int*) = nullptr;
  Res (*device_get)(int*, int) = nullptr;
  Res (*attribute)(int*, int, int) = nullptr;
  Res (*ctx_retain)(void**, int) = nullptr;
  Res (*ctx_set_current)(void*) = nullptr;
  Res (*ctx_synchronize)() = nullptr;
  Res (*mem_alloc)(Ptr*, size_t) = nullptr;
  Res (*mem_free)(Ptr) = nullptr;
  Res (*htod)(Ptr, const void*, size_t) = nullptr;
  Res (*dtoh)(void*, Ptr, size_t) = nullptr;
  // Streams and graph capture (the graph-safety tests).
  Res (*stream_create)(void**, unsigned) = nullptr;
  Res (*stream_sync)(void*) = nullptr;
  Res (*stream_destroy)(void*) = nullptr;
  Res (*begin_capture)(void*, int) = nullptr;
  Res (*end_capture)(void*, void**) = nullptr;
  Res (*graph_instantiate)(void**, void*, unsigned long long) = nullptr;
  Res (*graph_launch)(void*, void*) = nullptr;
  Res (*graph_exec_destroy)(void*) = nullptr;
  Res (*graph_destroy)(void*) = nullptr;
  std::string skip;  // why the GPU tests cannot run here
  int sm_major = 0, sm_minor = 0;

  static Cuda& get() {
    static Cuda c = load();
    return c;
  }

 private:
  static Cuda load() {
    Cuda c;
    void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      c.skip = "no libcuda.so.1 (no NVIDIA driver)";
      return c;
    }
    auto sym = [&](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, name));
      if (!fn) c.skip += std::string(name) + " missing from libcuda.so.1; ";
    };
    sym(c.init, "cuInit");
    sym(c.device_count, "cuDeviceGetCount");
    sym(c.device_get, "cuDeviceGet");
    sym(c.attribute, "cuDeviceGetAttribute");
    sym(c.ctx_retain, "cuDevicePrimaryCtxRetain");
    sym(c.ctx_set_current, "cuCtxSetCurrent");
    sym(c.ctx_synchronize, "cuCtxSynchronize");
    sym(c.mem_alloc, "cuMemAlloc_v2");
    sym(c.mem_free, "cuMemFree_v2");
    sym(c.htod, "cuMemcpyHtoD_v2");
    sym(c.dtoh, "cuMemcpyDtoH_v2");
    sym(c.stream_create, "cuStreamCreate");
    sym(c.stream_sync, "cuStreamSynchronize");
    sym(c.stream_destroy, "cuStreamDestroy_v2");
    sym(c.begin_capture, "cuStreamBeginCapture_v2");
    sym(c.end_capture, "cuStreamEndCapture");
    sym(c.graph_instantiate, "cuGraphInstantiateWithFlags");
    sym(c.graph_launch, "cuGraphLaunch");
    sym(c.graph_exec_destroy, "cuGraphExecDestroy");
    sym(c.graph_destroy, "cuGraphDestroy");
    if (!c.skip.empty()) return c;
    int n = 0, dev = 0;
    if (c.init(0) != 0 || c.device_count(&n) != 0 || n == 0) {
      c.skip = "no CUDA device";
      return c;
    }
    void* ctx = nullptr;
    if (c.device_get(&dev, 0) != 0 || c.ctx_retain(&ctx, dev) != 0 || c.ctx_set_current(ctx) != 0) {
      c.skip = "cannot make device 0's primary context current";
      return c;
    }
    c.attribute(&c.sm_major, 75, dev);  // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR
    c.attribute(&c.sm_minor, 76, dev);
    return c;
  }
};

// Mirrors HostTensors in device memory for one op call each (kernels/common rows semantics:
// the whole span, gaps between rows included, so untouched gaps can be checked afterwards).
class GpuExecutor : public Executor {
 public:
  const DLTensor* arg(HostTensor& t) override {
    auto it = mirrors_.find(&t);
    if (it != mirrors_.end()) return &it->second.dl;
    Cuda& cu = Cuda::get();
    Mirror m;
    m.offset = static_cast<size_t>(t.offset_elems() * dtype_bytes(t.dtype()));
    m.bytes = t.span_bytes();
    EXPECT_EQ(cu.mem_alloc(&m.ptr, m.offset + m.bytes), 0);
    EXPECT_EQ(cu.htod(m.ptr + m.offset, t.data(), m.bytes), 0);
    m.dl = *t.dl();
    m.dl.data = reinterpret_cast<void*>(m.ptr + m.offset);
    m.dl.device = DLDevice{kDLCUDA, 0};
    return &mirrors_.emplace(&t, m).first->second.dl;
  }
  int32_t call(const Package& p, const std::string& op, const std::vector<kh_arg_t>& args,
               std::string* error) override {
    Cuda& cu = Cuda::get();
    int32_t s = p.call(op, args, error, /*stream=*/nullptr);
    int sync = cu.ctx_synchronize();
    if (s == KH_OK && sync != 0) {
      s = KH_ERR_LAUNCH;
      if (error) *error = op + ": cuCtxSynchronize failed with " + std::to_string(sync);
    }
    for (auto& [t, m] : mirrors_) {
      EXPECT_EQ(cu.dtoh(t->data(), m.ptr + m.offset, m.bytes), 0);
      cu.mem_free(m.ptr);
    }
    mirrors_.clear();
    return s;
  }

 private:
  struct Mirror {
    Cuda::Ptr ptr = 0;
    size_t offset = 0, bytes = 0;
    DLTensor dl{};
  };
  std::map<HostTensor*, Mirror> mirrors_;
};

// A copy of the built package with a cubin for this GPU's sm listed in kernel.json: the loader
// loads the cubin instead of compiling the source.
inline std::filesystem::path make_cubin_package(const std::string& name, const std::string& sm,
                                                const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  const std::filesystem::path src = package_dir(name);
  std::filesystem::copy_file(src / ("lib" + name + ".so"), dir / ("lib" + name + ".so"));
  std::filesystem::copy_file(src / (name + ".cu"), dir / (name + ".cu"));
  Nvrtc::Output out = compile_for(name, "sm_" + sm, false);
  EXPECT_TRUE(out.ok) << out.log;
  const std::string cubin = name + ".sm_" + sm + ".cubin";
  fs::write_file_atomic(dir / cubin, out.cubin);
  nlohmann::json j = nlohmann::json::parse(fs::read_file(src / "kernel.json", 1 << 20));
  j["cubins"] = {{sm, cubin}};
  j.erase("files");  // the loader does not read it; the copy is not a published package
  fs::write_file_atomic(dir / "kernel.json", j.dump(2));
  return dir / ("lib" + name + ".so");
}

// The fixture of a GPU kernel suite: skips when Cuda::get() says why it cannot run, else
// installs the CUDA device backend with an NVRTC cache in a temp dir named Suite::kJitDirName.
template <typename Suite>
class GpuKernelsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!Cuda::get().skip.empty()) return;
    jit_dir_ = new test::TempDir(Suite::kJitDirName);
    install_cuda_device_backend();
    CudaDeviceBackend::instance().set_jit_cache_dir(jit_dir_->path());
  }
  void SetUp() override {
    if (!Cuda::get().skip.empty()) GTEST_SKIP() << Cuda::get().skip;
  }
  static std::string sm() {
    return std::to_string(Cuda::get().sm_major) + std::to_string(Cuda::get().sm_minor);
  }
  static inline test::TempDir* jit_dir_ = nullptr;
};

}  // namespace kh::kernels_test
