// GPU correctness of the kernel packages (CTest label gpu; skipped without libcuda.so.1 or a
// device). The cuda ops run through the real loader and its CUDA device backend (NVRTC from the
// package's .cu, or a packaged cubin) on device copies of the same cases the cpu tests use:
// every op and dtype against float64 references, forward and backward, odd hidden sizes, one row,
// rows of 65536+, strided rows, misaligned rows (scalar path), outputs poisoned before each run.
// The cubin path and the NVRTC path must give bit-identical results.
//
// Device memory comes from the driver API (dlopen of libcuda.so.1, a few prototypes declared
// in kernels_gpu_util.h): the test links no CUDA runtime, like the packages.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hub/base/fs.h"
#include "loader/device_backend.h"
#include "tests/fixtures/process.h"
#include "tests/gpu/kernels_gpu_util.h"
#include "tests/unit/test_kernels_activation_cases.h"
#include "tests/unit/test_kernels_norm_cases.h"
#include "tests/unit/test_kernels_nvrtc.h"
#include "tests/unit/test_kernels_util.h"

namespace kh::kernels_test {
namespace {

class KernelsGpu : public GpuKernelsTest<KernelsGpu> {
 public:
  static constexpr const char* kJitDirName = "kh-kernels-jit";
};

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
