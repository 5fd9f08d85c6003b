// GPU correctness of the rotary and softmax packages (CTest label gpu; skipped without
// libcuda.so.1 or a device), the companion of test_kernels_gpu.cpp: the cuda ops through the
// real loader and its CUDA device backend (NVRTC from the package's .cu, or a packaged cubin) on
// device copies of the same cases the cpu tests use, plus GPU-sized ones: every op, dtype and
// layout against float64 references, forward and backward, odd sizes, one row, vocab 128256,
// rows of 65536+, strided and misaligned rows (scalar path), outputs poisoned before each run.
// The cubin path and the NVRTC path must give bit-identical results.
//
// Device memory comes from the driver API (dlopen of libcuda.so.1); the driver shim, the executor
// and the fixture are shared with test_kernels_gpu.cpp in kernels_gpu_util.h.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "hub/base/fs.h"
#include "loader/device_backend.h"
#include "tests/fixtures/process.h"
#include "tests/gpu/kernels_gpu_util.h"
#include "tests/unit/test_kernels_nvrtc.h"
#include "tests/unit/test_kernels_rotary_cases.h"
#include "tests/unit/test_kernels_softmax_cases.h"
#include "tests/unit/test_kernels_util.h"

namespace kh::kernels_test {
namespace {

class KernelsGpuRotarySoftmax : public GpuKernelsTest<KernelsGpuRotarySoftmax> {
 public:
  static constexpr const char* kJitDirName = "kh-kernels-more-jit";
};

const rope_cases::Case kGpuRopeCases[] = {
    {4096, 32, 8, 128, 128, 0, 0, 8192, true},     // Llama-style q and GQA k
    {1000, 32, 8, 128, 128, 0, 128, 4096, false},  // q and k slices of a fused qkv row
    {257, 16, 16, 64, 32, 0, 0, 1024, true},       // partial rotary
    {3, 2, 1, 130, 130, 3, 1, 8, true},            // odd head stride (misaligned heads)
};

TEST_F(KernelsGpuRotarySoftmax, RotaryEveryLayoutDtypeAndShapeMatchesFloat64) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  Package pkg("rotary");
  GpuExecutor gpu;
  for (bool neox : {true, false})
    for (int dtype : {kBF16, kFP16, kFP32}) {
      for (const auto& k : rope_cases::kCases) {
        rope_cases::run_case(gpu, pkg, dtype, neox, k, rng);
        if (HasFatalFailure()) return;
      }
      for (const auto& k : kGpuRopeCases) {
        rope_cases::run_case(gpu, pkg, dtype, neox, k, rng);
        if (HasFatalFailure()) return;
      }
    }
}

// QKNormRotaryEmbedding on the device: the cpu cases and Qwen3's decode shape (64 tokens, 16/8
// heads of 128) against float64.
TEST_F(KernelsGpuRotarySoftmax, QkNormRotaryEveryLayoutDtypeAndShapeMatchesFloat64) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  Package pkg("rotary");
  GpuExecutor gpu;
  const rope_cases::Case decode{64, 16, 8, 128, 128, 0, 0, 2048, true};
  for (bool neox : {true, false})
    for (int dtype : {kBF16, kFP16, kFP32}) {
      for (const auto& k : rope_cases::kCases) {
        rope_cases::run_qk_norm_case(gpu, pkg, dtype, neox, k, rng);
        if (HasFatalFailure()) return;
      }
      rope_cases::run_qk_norm_case(gpu, pkg, dtype, neox, decode, rng);
      if (HasFatalFailure()) return;
    }
}

// QKNormRotaryEmbedding's training ops on the device: the cpu cases (the kernels refuse the
// ones they do not take, which the test checks) and Qwen3-0.6B's training shape (16 x 2048 tokens
// would be the step's; 4096 tokens, 16/8 heads of 128 keep the float64 reference quick).
TEST_F(KernelsGpuRotarySoftmax, QkNormRotaryTrainingOpsMatchFloat64) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  Package pkg("rotary");
  GpuExecutor gpu;
  const rope_cases::Case train{4096, 16, 8, 128, 128, 0, 0, 4096, true};
  const rope_cases::Case fused_row{777, 16, 8, 128, 128, 0, 1024, 2048, false};
  const rope_cases::Case odd_cache{300, 4, 2, 128, 128, 0, 0, 512, true, 1};  // rows 516 B apart
  for (bool neox : {true, false})
    for (int dtype : {kBF16, kFP16, kFP32}) {
      for (bool from_output : {false, true}) {  // QKNormRotaryEmbedding(FromOutput)'s ops
        for (const auto& k : rope_cases::kCases) {
          rope_cases::run_qk_norm_train_case(gpu, pkg, dtype, neox, k, rng, /*cuda=*/true,
                                             from_output);
          if (HasFatalFailure()) return;
        }
        for (const auto& k : {train, fused_row, odd_cache}) {
          rope_cases::run_qk_norm_train_case(gpu, pkg, dtype, neox, k, rng, /*cuda=*/true,
                                             from_output);
          if (HasFatalFailure()) return;
        }
        // Weights 100x apart (trained q/k norms are uneven), at the training shape.
        rope_cases::run_qk_norm_train_case(gpu, pkg, dtype, neox, train, rng, /*cuda=*/true,
                                           from_output, /*weight_spread=*/10);
        if (HasFatalFailure()) return;
      }
    }
}

const softmax_cases::Case kGpuSoftmaxCases[] = {
    {512, 8192, 0}, {1000, 4096, 0}, {3, 2048, 1}, {2, 300000, 0}, {70000, 16, 0}, {64, 32768, 8},
};
const softmax_cases::Case kGpuCeCases[] = {
    {64, 128256, 0}, {17, 152064, 0}, {5, 128256, 3}, {1000, 1024, 0}, {3, 4097, 1},
};

TEST_F(KernelsGpuRotarySoftmax, SoftmaxEveryDtypeAndShapeMatchesFloat64) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  Package pkg("softmax");
  GpuExecutor gpu;
  for (int dtype : {kBF16, kFP16, kFP32}) {
    for (const auto& k : softmax_cases::kSoftmaxCases) {
      softmax_cases::run_softmax_case(gpu, pkg, dtype, k, rng);
      if (HasFatalFailure()) return;
    }
    for (const auto& k : kGpuSoftmaxCases) {
      softmax_cases::run_softmax_case(gpu, pkg, dtype, k, rng);
      if (HasFatalFailure()) return;
    }
  }
}

TEST_F(KernelsGpuRotarySoftmax, CrossEntropyEveryDtypeAndShapeMatchesFloat64) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  Package pkg("softmax");
  GpuExecutor gpu;
  for (int dtype : {kBF16, kFP16, kFP32}) {
    for (const auto& k : softmax_cases::kCeCases) {
      softmax_cases::run_ce_case(gpu, pkg, dtype, k, rng);
      if (HasFatalFailure()) return;
    }
    for (const auto& k : kGpuCeCases) {
      softmax_cases::run_ce_case(gpu, pkg, dtype, k, rng);
      if (HasFatalFailure()) return;
    }
  }
}

bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (!(a[i] == b[i] || (std::isnan(a[i]) && std::isnan(b[i])))) return false;
  return true;
}

TEST_F(KernelsGpuRotarySoftmax, CubinAndNvrtcPathsGiveIdenticalResults) {
  if (!Nvrtc::get().ok()) GTEST_SKIP() << Nvrtc::get().load_error;
  test::TempDir tmp("kh-kernels-more-cubin");
  Package rope_src("rotary"), sm_src("softmax");
  Package rope_bin(make_cubin_package("rotary", sm(), tmp / "rotary"), 0);
  Package sm_bin(make_cubin_package("softmax", sm(), tmp / "softmax"), 0);
  auto& backend = CudaDeviceBackend::instance();
  EXPECT_EQ(backend.prepare_device_code(sm_bin.module().host->package, 0).kind,
            DeviceCodeKind::kCubin);
  EXPECT_EQ(backend.prepare_device_code(sm_src.module().host->package, 0).kind,
            DeviceCodeKind::kSource);
  std::mt19937_64 rng(fresh_seed());
  std::normal_distribution<double> n01(0.0, 1.0);
  GpuExecutor gpu;
  std::string err;
  for (int dtype : {kBF16, kFP16, kFP32}) {
    SCOPED_TRACE(dtype_name(dtype));
    const int64_t R = 9, V = 128256;
    HostTensor x(dtype, R, V);
    x.fill([&](int64_t, int64_t) { return 2 * n01(rng); });
    std::vector<int64_t> tv = {0, 5, -100, 128255, 7, 8, 9, 10, 11};
    HostTensor q(dtype, 64, 32 * 128), cache(kFP32, 4096, 128);
    q.fill([&](int64_t, int64_t) { return n01(rng); });
    cache.fill([&](int64_t, int64_t) { return n01(rng); });
    std::vector<int64_t> pv(64);
    for (auto& p : pv) p = static_cast<int64_t>(rng() % 4096);
    std::vector<std::vector<double>> results[2];
    const Package* sms[2] = {&sm_src, &sm_bin};
    const Package* ropes[2] = {&rope_src, &rope_bin};
    for (int path = 0; path < 2; ++path) {
      HostTensor y(dtype, R, V), loss = vector_tensor(kFP32, R), g(dtype, R, V);
      rope_cases::Int64Tensor targets(tv);
      ASSERT_EQ(gpu.call(*sms[path], "softmax", {targ(gpu.arg(x)), targ(gpu.arg(y))}, &err), KH_OK)
          << err;
      ASSERT_EQ(gpu.call(*sms[path], "cross_entropy_train",
                         {targ(gpu.arg(x)), targ(targets.view(gpu)), iarg(-100), farg(0.25),
                          targ(gpu.arg(loss)), targ(gpu.arg(g))},
                         &err),
                KH_OK)
          << err;
      HostTensor qc(dtype, 64, 32 * 128);
      qc.fill([&](int64_t r, int64_t c) { return q.get(r, c); });
      rope_cases::Int64Tensor positions(pv);
      rope_cases::HeadsDl qd(gpu.arg(qc), 32, 128, 128);
      const DLTensor* cd = gpu.arg(cache);
      rope_cases::CacheDl cos(cd, 64, 0, kFP32), sin(cd, 64, 64, kFP32);
      ASSERT_EQ(gpu.call(*ropes[path], "rotary_embedding",
                         {targ(positions.view(gpu)), targ(&qd.t), targ(nullptr), targ(&cos.t),
                          targ(&sin.t), iarg(1)},
                         &err),
                KH_OK)
          << err;
      results[path] = {y.values(), loss.values(), g.values(), qc.values()};
    }
    for (size_t i = 0; i < results[0].size(); ++i)
      EXPECT_TRUE(same_bits(results[0][i], results[1][i])) << "output " << i << " differs";
  }
}

// Rough timings of the headline shapes (KH_GPU_TIMINGS=1; skipped otherwise): CUDA events around
// 20 back-to-back calls on the same buffers (no L2 flush; tools/bench is the real benchmark).
TEST_F(KernelsGpuRotarySoftmax, ReportsTimingsOfHeadlineShapes) {
  if (!getenv("KH_GPU_TIMINGS")) GTEST_SKIP() << "set KH_GPU_TIMINGS=1 to time the headline shapes";
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(h, nullptr);
  typedef int (*EvCreate)(void**, unsigned);
  typedef int (*EvRecord)(void*, void*);
  typedef int (*EvSync)(void*);
  typedef int (*EvElapsed)(float*, void*, void*);
  auto ev_create = reinterpret_cast<EvCreate>(dlsym(h, "cuEventCreate"));
  auto ev_record = reinterpret_cast<EvRecord>(dlsym(h, "cuEventRecord"));
  auto ev_sync = reinterpret_cast<EvSync>(dlsym(h, "cuEventSynchronize"));
  auto ev_elapsed = reinterpret_cast<EvElapsed>(dlsym(h, "cuEventElapsedTime"));
  ASSERT_TRUE(ev_create && ev_record && ev_sync && ev_elapsed);
  Cuda& cu = Cuda::get();
  auto alloc = [&](size_t bytes) {
    Cuda::Ptr p = 0;
    EXPECT_EQ(cu.mem_alloc(&p, bytes), 0);
    return p;
  };
  auto dl = [](Cuda::Ptr p, DLDataType t, int ndim, int64_t* shape) {
    DLTensor d{};
    d.data = reinterpret_cast<void*>(p);
    d.device = DLDevice{kDLCUDA, 0};
    d.ndim = ndim;
    d.dtype = t;
    d.shape = shape;
    return d;
  };
  const DLDataType bf16{kDLBfloat, 16, 1}, f32{kDLFloat, 32, 1}, i64{kDLInt, 64, 1};
  auto time_it = [&](const char* what, double bytes, const std::function<void()>& call) {
    void *a = nullptr, *b = nullptr;
    ev_create(&a, 0);
    ev_create(&b, 0);
    call();
    cu.ctx_synchronize();
    ev_record(a, nullptr);
    for (int i = 0; i < 20; ++i) call();
    ev_record(b, nullptr);
    ev_sync(b);
    float ms = 0;
    ev_elapsed(&ms, a, b);
    const double us = ms * 1000 / 20;
    printf("%-40s %9.1f us  %6.2f TB/s\n", what, us, bytes / (us * 1e-6) / 1e12);
  };
  std::string err;
  {
    Package pkg("softmax");
    int64_t T = 4096, V = 128256;
    int64_t xs[2] = {T, V}, ts[1] = {T};
    Cuda::Ptr x = alloc(T * V * 2), g = alloc(T * V * 2), t = alloc(T * 8), l = alloc(T * 4);
    std::vector<int64_t> tv(T, 17);
    cu.htod(t, tv.data(), T * 8);
    std::vector<uint16_t> zeros(V, 0x3f80);
    for (int64_t r = 0; r < T; ++r) cu.htod(x + r * V * 2, zeros.data(), V * 2);
    DLTensor X = dl(x, bf16, 2, xs), G = dl(g, bf16, 2, xs), Tt = dl(t, i64, 1, ts),
             L = dl(l, f32, 1, ts);
    time_it("cross_entropy 4096x128256 bf16", double(T) * V * 2, [&] {
      EXPECT_EQ(pkg.call("cross_entropy", {targ(&X), targ(&Tt), iarg(-100), targ(&L)}, &err),
                KH_OK);
    });
    time_it("cross_entropy_train 4096x128256 bf16", 2.0 * T * V * 2, [&] {
      EXPECT_EQ(pkg.call("cross_entropy_train",
                         {targ(&X), targ(&Tt), iarg(-100), farg(1.0), targ(&L), targ(&G)}, &err),
                KH_OK);
    });
    int64_t ss[2] = {16384, 8192};
    Cuda::Ptr sx = alloc(16384LL * 8192 * 2), sy = alloc(16384LL * 8192 * 2);
    DLTensor SX = dl(sx, bf16, 2, ss), SY = dl(sy, bf16, 2, ss);
    time_it("softmax 16384x8192 bf16", 2.0 * 16384 * 8192 * 2, [&] {
      EXPECT_EQ(pkg.call("softmax", {targ(&SX), targ(&SY)}, &err), KH_OK);
    });
    time_it("softmax_backward 16384x8192 bf16", 3.0 * 16384 * 8192 * 2, [&] {
      EXPECT_EQ(pkg.call("softmax_backward", {targ(&SX), targ(&SY), targ(&SY)}, &err), KH_OK);
    });
    for (Cuda::Ptr p : {x, g, t, l, sx, sy}) cu.mem_free(p);
  }
  {
    Package pkg("rotary");
    const int64_t T = 16384;
    int64_t qs[3] = {T, 32, 128}, ks[3] = {T, 8, 128}, cs[2] = {8192, 64}, ps[1] = {T};
    Cuda::Ptr q = alloc(T * 32 * 128 * 2), k = alloc(T * 8 * 128 * 2), c = alloc(8192 * 64 * 4),
              s = alloc(8192 * 64 * 4), p = alloc(T * 8);
    std::vector<int64_t> pv(T);
    for (int64_t i = 0; i < T; ++i) pv[i] = i % 8192;
    cu.htod(p, pv.data(), T * 8);
    DLTensor Q = dl(q, bf16, 3, qs), K = dl(k, bf16, 3, ks), C = dl(c, f32, 2, cs),
             S = dl(s, f32, 2, cs), P = dl(p, i64, 1, ps);
    for (int neox : {1, 0})
      time_it(neox ? "rope neox q+k 16384x(32+8)x128 bf16" : "rope gptj q+k 16384x(32+8)x128 bf16",
              2.0 * T * 40 * 128 * 2, [&] {
                EXPECT_EQ(
                    pkg.call("rotary_embedding",
                             {targ(&P), targ(&Q), targ(&K), targ(&C), targ(&S), iarg(neox)}, &err),
                    KH_OK);
              });
    for (Cuda::Ptr ptr : {q, k, c, s, p}) cu.mem_free(ptr);
  }
}

}  // namespace
}  // namespace kh::kernels_test
