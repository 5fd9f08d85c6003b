// GPU correctness of the kernel packages (CTest label gpu; skipped without libcuda.so.1 or a
// device). The cuda ops run through the real loader and its CUDA device backend (NVRTC from the
// package's .cu, or a packaged cubin) on device copies of the same cases the cpu tests use:
// every op and dtype against float64 references, forward and backward, odd hidden sizes, one row,
// rows of 65536+, strided rows, misaligned rows (scalar path), outputs poisoned before each run.
// The cubin path and the NVRTC path must give bit-identical results.
//
// Device memory comes from the driver API (dlopen of libcuda.so.1, a few prototypes declared
// here): the test links no CUDA runtime, like the packages.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hub/fs.h"
#include "loader/device_backend.h"
#include "tests/fixtures/process.h"
#include "tests/unit/test_kernels_activation_cases.h"
#include "tests/unit/test_kernels_norm_cases.h"
#include "tests/unit/test_kernels_nvrtc.h"
#include "tests/unit/test_kernels_util.h"

namespace kh::kernels_test {
namespace {

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

class KernelsGpu : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!Cuda::get().skip.empty()) return;
    jit_dir_ = new test::TempDir("kh-kernels-jit");
    install_cuda_device_backend();
    CudaDeviceBackend::instance().set_jit_cache_dir(jit_dir_->path());
  }
  void SetUp() override {
    if (!Cuda::get().skip.empty()) GTEST_SKIP() << Cuda::get().skip;
  }
  static std::string sm() {
    return std::to_string(Cuda::get().sm_major) + std::to_string(Cuda::get().sm_minor);
  }
  static test::TempDir* jit_dir_;
};
test::TempDir* KernelsGpu::jit_dir_ = nullptr;

// Cases beyond the cpu list: the vector path with many walkers, misaligned starts (scalar path),
// fp32 rows past the register limit.
const norm_cases::Case kGpuNormCases[] = {
    {256, 8192, 0, 132}, {1000, 4096, 0, 264}, {64, 16384, 0, 132}, {7, 32768, 0, 4},
    {3, 2048, 1, 3},     {40, 1024, 0, 1056},  {2, 200000, 0, 2},
};

TEST_F(KernelsGpu, NormEveryLayerDtypeAndShapeMatchesFloat64) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  Package pkg("norm");
  GpuExecutor gpu;
  for (int kind = 0; kind < 3; ++kind)
    for (int dtype : {kBF16, kFP16, kFP32}) {
      for (const auto& k : norm_cases::kCases) {
        norm_cases::run_case(gpu, pkg, kind, dtype, k, rng);
        if (HasFatalFailure()) return;
      }
      for (const auto& k : kGpuNormCases) {
        norm_cases::run_case(gpu, pkg, kind, dtype, k, rng);
        if (HasFatalFailure()) return;
      }
    }
}

const act_cases::Case kGpuActCases[] = {
    {512, 8192, 0}, {1024, 11008, 0}, {100, 14336, 8}, {3, 2048, 1}, {1, 300000, 0}, {70000, 16, 0},
};

TEST_F(KernelsGpu, ActivationEveryOpDtypeAndShapeMatchesFloat64) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  Package pkg("activation");
  GpuExecutor gpu;
  for (int op = 0; op < 5; ++op)
    for (int dtype : {kBF16, kFP16, kFP32}) {
      for (const auto& k : act_cases::kCases) {
        act_cases::run_case(gpu, pkg, op, dtype, k, rng);
        if (HasFatalFailure()) return;
      }
      for (const auto& k : kGpuActCases) {
        act_cases::run_case(gpu, pkg, op, dtype, k, rng);
        if (HasFatalFailure()) return;
      }
    }
}

// A copy of the built package with a cubin for this GPU's sm listed in kernel.json: the loader
// loads the cubin instead of compiling the source.
std::filesystem::path make_cubin_package(const std::string& name, const std::string& sm,
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

TEST_F(KernelsGpu, CubinAndNvrtcPathsGiveIdenticalResults) {
  if (!Nvrtc::get().ok()) GTEST_SKIP() << Nvrtc::get().load_error;
  test::TempDir tmp("kh-kernels-cubin");
  Package norm_src("norm"), act_src("activation");
  Package norm_bin(make_cubin_package("norm", sm(), tmp / "norm"), 0);
  Package act_bin(make_cubin_package("activation", sm(), tmp / "activation"), 0);
  auto& backend = CudaDeviceBackend::instance();
  EXPECT_EQ(backend.prepare_device_code(norm_bin.module().host->package, 0).kind,
            DeviceCodeKind::kCubin);
  EXPECT_EQ(backend.prepare_device_code(norm_src.module().host->package, 0).kind,
            DeviceCodeKind::kSource);

  std::mt19937_64 rng(fresh_seed());
  std::normal_distribution<double> n01(0.0, 1.0);
  GpuExecutor gpu;
  std::string err;
  for (int dtype : {kBF16, kFP16, kFP32})
    for (int64_t cols : {4096, 4097, 65536}) {
      SCOPED_TRACE(testing::Message() << dtype_name(dtype) << " cols " << cols);
      const int64_t R = 33;
      HostTensor x(dtype, R, cols), w = vector_tensor(dtype, cols), b = vector_tensor(dtype, cols);
      HostTensor dy(dtype, R, cols), ws(kFP32, 8, 2 * cols);
      x.fill([&](int64_t, int64_t) { return n01(rng); });
      w.fill([&](int64_t, int64_t) { return 1 + 0.1 * n01(rng); });
      b.fill([&](int64_t, int64_t) { return n01(rng); });
      dy.fill([&](int64_t, int64_t) { return n01(rng); });
      std::vector<std::vector<double>> results[2];
      const Package* norms[2] = {&norm_src, &norm_bin};
      const Package* acts[2] = {&act_src, &act_bin};
      for (int path = 0; path < 2; ++path) {
        HostTensor y(dtype, R, cols), mean = vector_tensor(kFP32, R),
                                      rstd = vector_tensor(kFP32, R);
        HostTensor dx(dtype, R, cols), dw = vector_tensor(dtype, cols),
                                       db = vector_tensor(dtype, cols);
        ASSERT_EQ(gpu.call(*norms[path], "layer_norm_train",
                           {targ(gpu.arg(x)), targ(gpu.arg(w)), targ(gpu.arg(b)), farg(1e-5),
                            targ(gpu.arg(y)), targ(gpu.arg(mean)), targ(gpu.arg(rstd))},
                           &err),
                  KH_OK)
            << err;
        ASSERT_EQ(gpu.call(*norms[path], "layer_norm_backward",
                           {targ(gpu.arg(dy)), targ(gpu.arg(x)), targ(gpu.arg(w)),
                            targ(gpu.arg(mean)), targ(gpu.arg(rstd)), targ(gpu.arg(dx)),
                            targ(gpu.arg(dw)), targ(gpu.arg(db)), targ(gpu.arg(ws))},
                           &err),
                  KH_OK)
            << err;
        results[path] = {y.values(), rstd.values(), dx.values(), dw.values(), db.values()};
        if (cols % 2 == 0) {
          HostTensor h(dtype, R, cols / 2);
          ASSERT_EQ(gpu.call(*acts[path], "gelu_and_mul",
                             {targ(gpu.arg(x)), iarg(0), targ(gpu.arg(h))}, &err),
                    KH_OK)
              << err;
          results[path].push_back(h.values());
        }
      }
      for (size_t i = 0; i < results[0].size(); ++i) {
        ASSERT_EQ(results[0][i].size(), results[1][i].size());
        for (size_t j = 0; j < results[0][i].size(); ++j)
          ASSERT_TRUE(results[0][i][j] == results[1][i][j] ||
                      (std::isnan(results[0][i][j]) && std::isnan(results[1][i][j])))
              << "output " << i << " element " << j << ": NVRTC " << results[0][i][j] << " cubin "
              << results[1][i][j];
      }
    }
}

// Same inputs twice: the norm backward (partials, then a fixed-order reduce) is deterministic.
TEST_F(KernelsGpu, NormBackwardIsDeterministic) {
  Package pkg("norm");
  GpuExecutor gpu;
  std::mt19937_64 rng(fresh_seed());
  std::normal_distribution<double> n01(0.0, 1.0);
  const int64_t R = 4096, C = 4096;
  HostTensor x(kBF16, R, C), dy(kBF16, R, C), w = vector_tensor(kBF16, C), y(kBF16, R, C);
  HostTensor rstd = vector_tensor(kFP32, R), ws(kFP32, 264, C);
  x.fill([&](int64_t, int64_t) { return n01(rng); });
  dy.fill([&](int64_t, int64_t) { return n01(rng); });
  w.fill([&](int64_t, int64_t) { return 1 + 0.1 * n01(rng); });
  std::string err;
  ASSERT_EQ(gpu.call(pkg, "rms_norm_train",
                     {targ(gpu.arg(x)), targ(gpu.arg(w)), farg(1e-6), targ(gpu.arg(y)),
                      targ(gpu.arg(rstd))},
                     &err),
            KH_OK)
      << err;
  std::vector<double> first;
  for (int run = 0; run < 2; ++run) {
    HostTensor dx(kBF16, R, C), dw = vector_tensor(kBF16, C);
    ASSERT_EQ(gpu.call(pkg, "rms_norm_backward",
                       {targ(gpu.arg(dy)), targ(gpu.arg(x)), targ(gpu.arg(w)), targ(gpu.arg(rstd)),
                        targ(gpu.arg(dx)), targ(gpu.arg(dw)), targ(gpu.arg(ws))},
                       &err),
              KH_OK)
        << err;
    if (run == 0)
      first = dw.values();
    else
      EXPECT_EQ(dw.values(), first);
  }
}

}  // namespace
}  // namespace kh::kernels_test
