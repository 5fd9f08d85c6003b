// The kernel packages' device code and packaging, without a GPU:
//  - every shipped <package>.cu compiles with NVRTC (libnvrtc.so.13 through dlopen, with no -I
//    path, as the loader compiles it) for sm_80, 86, 89, 90 and 90a, with no warnings, and
//    ptxas reports no register spills;
//  - every kernel a host library asks the loader for (host->get_function) exists in that
//    compiled code, and every launch geometry respects the kernels' launch bounds: the ops are
//    called on kDLCUDA tensors with a recording device backend (the pointers are never
//    dereferenced on the host);
//  - `kernel-hub check` accepts each built package directory, and its kernel.json is a valid
//    registry package manifest whose file digests match.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "hub/base/fs.h"
#include "loader/host_services.h"
#include "tests/fixtures/process.h"
#include "tests/unit/test_kernels_device_util.h"
#include "tests/unit/test_kernels_nvrtc.h"
#include "tests/unit/test_kernels_util.h"

namespace kh::kernels_test {
namespace {

const char* kPackages[] = {"norm", "activation"};

// One test per package and sm.
class DeviceSourceCompiles : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {
};

TEST_P(DeviceSourceCompiles, WithNvrtcAndNoSpills) {
  if (!Nvrtc::get().ok()) GTEST_SKIP() << Nvrtc::get().load_error;
  const std::string package = std::get<0>(GetParam()), sm = std::get<1>(GetParam());
  expect_compiles_without_spills(package, sm);
}

INSTANTIATE_TEST_SUITE_P(Kernels, DeviceSourceCompiles,
                         ::testing::Combine(::testing::Values("norm", "activation"),
                                            ::testing::Values("sm_80", "sm_86", "sm_89", "sm_90",
                                                              "sm_90a")),
                         package_sm_name);

TEST(PdlEntry, EveryKernelOfAPdlPackageWaitsForThePreviousGridFirst) {
  for (const std::string& package : pdl_packages()) expect_kernels_enter_with_pdl(package);
}

// ---- dispatch on kDLCUDA tensors with a recording backend -----------------------------------
class CudaDispatch : public ::testing::Test {
 protected:
  void SetUp() override {
    set_device_backend(&backend_);
    norm_ = std::make_unique<Package>("norm");
    act_ = std::make_unique<Package>("activation");
  }
  void TearDown() override { set_device_backend(nullptr); }

  // Launch bounds: reg/loop norm kernels 512, the partials' reduce 1024, activation kernels 256.
  static uint32_t bound_of(const std::string& kernel) {
    if (kernel.rfind("norm_reduce_partials", 0) == 0) return 1024;
    return kernel.rfind("norm_fwd", 0) == 0 || kernel.rfind("norm_bwd", 0) == 0 ? 512 : 256;
  }
  static void check_geometry(const Launch& l) {
    SCOPED_TRACE(l.kernel);
    const auto& c = l.cfg;
    const uint64_t threads = uint64_t{c.block[0]} * c.block[1] * c.block[2];
    EXPECT_GE(threads, 1u);
    EXPECT_LE(threads, bound_of(l.kernel));
    EXPECT_GE(c.grid[0], 1u);
    EXPECT_GE(c.grid[1], 1u);
    EXPECT_LE(c.grid[1], 65535u);
    EXPECT_GE(c.grid[2], 1u);
    // Dynamic shared memory only where a backward CTA holds several short-row walkers (their
    // partials, summed into one workspace row); within the 48 KiB every sm gives without opt-in.
    if (l.kernel.rfind("norm_bwd", 0) == 0 && c.block[1] > 1) {
      EXPECT_GT(c.shared_mem_bytes, 0u);
      EXPECT_LE(c.shared_mem_bytes, 48u * 1024);
    } else {
      EXPECT_EQ(c.shared_mem_bytes, 0u);
    }
    EXPECT_EQ(c.h.abi_major, KH_ABI_MAJOR);
    // Threads per row are a power of two (the row reductions assume it).
    EXPECT_EQ(c.block[0] & (c.block[0] - 1), 0u);
  }

  RecordingBackend backend_;
  std::unique_ptr<Package> norm_, act_;
};

TEST_F(CudaDispatch, EveryRequestedKernelExistsAndEveryLaunchFitsItsBounds) {
  if (!Nvrtc::get().ok()) GTEST_SKIP() << Nvrtc::get().load_error;
  std::map<std::string, std::set<std::string>> names;
  for (const char* p : kPackages) {
    Nvrtc::Output out = compile_for(p, "sm_90", false);
    ASSERT_TRUE(out.ok) << out.log;
    names[p] = cubin_strings(out.cubin);
  }
  std::set<std::string> seen;
  std::string err;
  for (int dtype : {kBF16, kFP16, kFP32})
    for (int64_t cols : {1, 7, 8, 64, 4095, 4096, 8192, 16384, 32768, 65536, 65537})
      for (int64_t offset : {0, 1}) {
        SCOPED_TRACE(testing::Message()
                     << dtype_name(dtype) << " cols " << cols << " offset " << offset);
        const int64_t R = 3;
        HostTensor x(dtype, R, cols, cols, offset), y(dtype, R, cols, cols, offset);
        HostTensor w = vector_tensor(dtype, cols), st = vector_tensor(kFP32, R);
        HostTensor ws(kFP32, 2, 2 * cols);
        HostTensor ws1(kFP32, 2, cols);
        DLTensor X = on_cuda(x), Y = on_cuda(y), W = on_cuda(w), S = on_cuda(st), WS = on_cuda(ws),
                 WS1 = on_cuda(ws1);
        auto ok = [&](const Package& p, const char* op, std::vector<kh_arg_t> a) {
          EXPECT_EQ(p.call(op, a, &err), KH_OK) << op << ": " << err;
        };
        ok(*norm_, "rms_norm", {targ(&X), targ(&W), farg(1e-6), targ(&Y)});
        ok(*norm_, "rms_norm_train", {targ(&X), targ(&W), farg(1e-6), targ(&Y), targ(&S)});
        ok(*norm_, "fused_add_rms_norm",
           {targ(&X), targ(&Y), targ(&W), farg(1e-6), targ(&X), targ(&Y)});
        ok(*norm_, "layer_norm_train",
           {targ(&X), targ(&W), targ(&W), farg(1e-6), targ(&Y), targ(&S), targ(&S)});
        ok(*norm_, "rms_norm_backward",
           {targ(&X), targ(&X), targ(&W), targ(&S), targ(&Y), targ(&W), targ(&WS1)});
        ok(*norm_, "fused_add_rms_norm_backward",
           {targ(&X), targ(&X), targ(&X), targ(&W), targ(&S), targ(&Y), targ(&W), targ(&WS1)});
        ok(*norm_, "layer_norm_backward",
           {targ(&X), targ(&X), targ(&W), targ(&S), targ(&S), targ(&Y), targ(&W), targ(&W),
            targ(&WS)});
        for (auto& l : backend_.take()) {
          EXPECT_TRUE(names["norm"].count(l.kernel)) << l.kernel << " is not in norm.cu";
          check_geometry(l);
          seen.insert(l.kernel);
        }
        if (cols % 2 == 0) {
          HostTensor h(dtype, R, cols / 2, cols / 2, offset);
          DLTensor H = on_cuda(h);
          ok(*act_, "silu_and_mul", {targ(&X), targ(&H)});
          ok(*act_, "silu_and_mul_backward", {targ(&H), targ(&X), targ(&Y)});
          ok(*act_, "silu_and_mul_backward_recompute", {targ(&H), targ(&X), targ(&Y), targ(&H)});
          ok(*act_, "gelu_and_mul", {targ(&X), iarg(0), targ(&H)});
          ok(*act_, "gelu_and_mul_backward", {targ(&H), targ(&X), iarg(1), targ(&Y)});
        }
        ok(*act_, "silu", {targ(&X), targ(&Y)});
        ok(*act_, "gelu_tanh_backward", {targ(&X), targ(&X), targ(&Y)});
        for (auto& l : backend_.take()) {
          EXPECT_TRUE(names["activation"].count(l.kernel))
              << l.kernel << " is not in activation.cu";
          check_geometry(l);
          seen.insert(l.kernel);
        }
      }
  // The sweep reached both paths of each kind.
  for (const char* k :
       {"norm_fwd_rms_bf16_vec_reg", "norm_fwd_rms_bf16_vec_loop", "norm_fwd_rms_fp16_scalar_reg",
        "norm_fwd_rms_fp32_scalar_loop", "norm_bwd_ln_fp32_vec_reg", "norm_bwd_rms_bf16_vec_loop",
        "norm_reduce_partials_bf16", "act_silu_and_mul_fwd_bf16_vec",
        "act_silu_and_mul_fwd_fp16_scalar", "act_gelu_tanh_and_mul_bwd_fp32_vec",
        "act_silu_and_mul_bwd_out_bf16_vec", "act_silu_and_mul_bwd_out_fp32_scalar"})
    EXPECT_TRUE(seen.count(k)) << k << " was never chosen";
}

// The geometry of the headline shapes (REFERENCE §6.3 item 2).
TEST_F(CudaDispatch, HeadlineShapesGetTheIntendedGeometry) {
  std::string err;
  // rms_norm_backward of rows x (dy = x, dx over x) with weight w, rstd st, workspace ws: the
  // launches it recorded.
  auto rms_backward_launches = [&](HostTensor& x, HostTensor& w, HostTensor& st, HostTensor& ws) {
    DLTensor X = on_cuda(x), W = on_cuda(w), S = on_cuda(st), WS = on_cuda(ws);
    EXPECT_EQ(
        norm_->call("rms_norm_backward",
                    {targ(&X), targ(&X), targ(&W), targ(&S), targ(&X), targ(&W), targ(&WS)}, &err),
        KH_OK)
        << err;
    return backend_.take();
  };
  auto one = [&](const char* what) {
    std::vector<Launch> l = backend_.take();
    EXPECT_FALSE(l.empty()) << what;
    return l.empty() ? Launch{} : l.front();
  };
  {
    HostTensor x(kBF16, 16, 8192), y(kBF16, 16, 8192), w = vector_tensor(kBF16, 8192);
    DLTensor X = on_cuda(x), Y = on_cuda(y), W = on_cuda(w);
    ASSERT_EQ(norm_->call("rms_norm", {targ(&X), targ(&W), farg(1e-6), targ(&Y)}, &err), KH_OK)
        << err;
    Launch l = one("rms_norm 8192");
    EXPECT_EQ(l.kernel, "norm_fwd_rms_bf16_vec_reg");
    EXPECT_EQ(l.cfg.block[0], 128u);  // 1024 vectors, 8 per thread
    EXPECT_EQ(l.cfg.block[1], 1u);
    EXPECT_EQ(l.cfg.grid[0], 16u);
  }
  {
    HostTensor x(kBF16, 16, 4096), y(kBF16, 16, 4096), w = vector_tensor(kBF16, 4096);
    DLTensor X = on_cuda(x), Y = on_cuda(y), W = on_cuda(w);
    ASSERT_EQ(norm_->call("rms_norm", {targ(&X), targ(&W), farg(1e-6), targ(&Y)}, &err), KH_OK);
    Launch l = one("rms_norm 4096");
    EXPECT_EQ(l.cfg.block[0], 64u);  // 64 threads per row, 2 rows per CTA
    EXPECT_EQ(l.cfg.block[1], 2u);
    EXPECT_EQ(l.cfg.grid[0], 8u);
  }
  {
    // A row stride that is not a multiple of 16 bytes takes the scalar path.
    HostTensor x(kBF16, 4, 4096, 4100), y(kBF16, 4, 4096), w = vector_tensor(kBF16, 4096);
    DLTensor X = on_cuda(x), Y = on_cuda(y), W = on_cuda(w);
    ASSERT_EQ(norm_->call("rms_norm", {targ(&X), targ(&W), farg(1e-6), targ(&Y)}, &err), KH_OK);
    EXPECT_EQ(one("strided").kernel, "norm_fwd_rms_bf16_scalar_reg");
  }
  {
    // Backward: one walker per workspace row, then the reduce over 32-column slices.
    HostTensor x(kBF16, 1000, 8192), w = vector_tensor(kBF16, 8192),
                                     st = vector_tensor(kFP32, 1000);
    HostTensor ws(kFP32, 132, 8192);
    std::vector<Launch> l = rms_backward_launches(x, w, st, ws);
    ASSERT_EQ(l.size(), 2u);
    EXPECT_EQ(l[0].kernel, "norm_bwd_rms_bf16_vec_reg");
    EXPECT_EQ(l[0].cfg.block[0], 256u);  // 1024 vectors, 4 per thread
    EXPECT_EQ(l[0].cfg.grid[0], 132u);
    EXPECT_EQ(l[1].kernel, "norm_reduce_partials_bf16");
    EXPECT_EQ(l[1].cfg.grid[0], 8192u / 32);
    EXPECT_EQ(l[1].cfg.block[0], 32u);  // 32 columns
    EXPECT_EQ(l[1].cfg.block[1], 32u);  // 32 slices of the walkers
  }
  {
    // Qwen3's q-norm rows (head_dim 128 = 16 vectors): 4 vectors per thread, 32 rows per CTA;
    // backward: a workspace row per CTA of 32 walkers (2048 rows: 65536 walkers), the partials
    // summed in 32 x 128 fp32 of shared memory, and the reduce over those 2048 rows.
    const int64_t R = 262144;
    HostTensor x(kBF16, R, 128), w = vector_tensor(kBF16, 128), st = vector_tensor(kFP32, R);
    HostTensor ws(kFP32, 2048, 128);
    DLTensor X = on_cuda(x), W = on_cuda(w);
    ASSERT_EQ(norm_->call("rms_norm", {targ(&X), targ(&W), farg(1e-6), targ(&X)}, &err), KH_OK)
        << err;
    Launch f = one("rms_norm 128");
    EXPECT_EQ(f.kernel, "norm_fwd_rms_bf16_vec_reg");
    EXPECT_EQ(f.cfg.block[0], 4u);
    EXPECT_EQ(f.cfg.block[1], 32u);
    EXPECT_EQ(f.cfg.grid[0], R / 32);
    std::vector<Launch> l = rms_backward_launches(x, w, st, ws);
    ASSERT_EQ(l.size(), 2u);
    EXPECT_EQ(l[0].kernel, "norm_bwd_rms_bf16_vec_reg");
    EXPECT_EQ(l[0].cfg.block[0], 4u);
    EXPECT_EQ(l[0].cfg.block[1], 32u);
    EXPECT_EQ(l[0].cfg.grid[0], 2048u);
    EXPECT_EQ(l[0].cfg.shared_mem_bytes, 32u * 128 * 4);
    EXPECT_EQ(l[1].kernel, "norm_reduce_partials_bf16");
  }
  {
    HostTensor x(kBF16, 16384, 2 * 8192), y(kBF16, 16384, 8192);
    DLTensor X = on_cuda(x), Y = on_cuda(y);
    ASSERT_EQ(act_->call("silu_and_mul", {targ(&X), targ(&Y)}, &err), KH_OK) << err;
    Launch l = one("silu_and_mul");
    EXPECT_EQ(l.kernel, "act_silu_and_mul_fwd_bf16_vec");
    EXPECT_EQ(l.cfg.block[0] * l.cfg.block[1], 256u);
    EXPECT_EQ(uint64_t{l.cfg.grid[0]} * l.cfg.block[1], 16384u);
  }
}

// ---- packaging -------------------------------------------------------------------------------
TEST(KernelsPackage, KernelHubCheckAcceptsEachPackageDirectory) {
  if (!std::filesystem::exists(test::cli_path()))
    GTEST_SKIP() << "kernel-hub CLI not built at " << test::cli_path();
  expect_kernel_hub_check_accepts(kPackages);
}

TEST(KernelsPackage, KernelJsonIsAValidPackageManifestMatchingTheModule) {
  expect_manifest_matches_module(kPackages);
}

}  // namespace
}  // namespace kh::kernels_test
