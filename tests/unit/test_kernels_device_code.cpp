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
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <mutex>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "hub/fs.h"
#include "loader/host_services.h"
#include "registry/package_manifest.h"
#include "tests/fixtures/process.h"
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
  const std::string src = shipped_source(package);
  // Header-free: nothing left for NVRTC to look up.
  EXPECT_EQ(src.find("#include"), std::string::npos) << package << ".cu still has an #include";
  Nvrtc::Output out = compile_for(package, sm, /*verbose=*/true);
  ASSERT_TRUE(out.ok) << package << ".cu for " << sm << ":\n" << out.log;
  EXPECT_FALSE(out.cubin.empty());
  EXPECT_EQ(out.log.find("warning"), std::string::npos) << out.log;
  // ptxas -v: "N bytes stack frame, N bytes spill stores, N bytes spill loads" per kernel.
  std::regex spill(R"((\d+) bytes spill stores, (\d+) bytes spill loads)");
  int kernels = 0;
  for (auto it = std::sregex_iterator(out.log.begin(), out.log.end(), spill);
       it != std::sregex_iterator(); ++it) {
    ++kernels;
    EXPECT_EQ((*it)[1].str(), "0") << package << " " << sm << " spills: " << (*it)[0].str();
    EXPECT_EQ((*it)[2].str(), "0") << package << " " << sm << " spills: " << (*it)[0].str();
  }
  EXPECT_GT(kernels, 0) << "no ptxas report in the log:\n" << out.log;
}

INSTANTIATE_TEST_SUITE_P(Kernels, DeviceSourceCompiles,
                         ::testing::Combine(::testing::Values("norm", "activation"),
                                            ::testing::Values("sm_80", "sm_86", "sm_89", "sm_90",
                                                              "sm_90a")),
                         [](const auto& info) {
                           return std::string(std::get<0>(info.param)) + "_" +
                                  std::get<1>(info.param);
                         });

// ---- dispatch on kDLCUDA tensors with a recording backend -----------------------------------
struct Launch {
  std::string kernel;
  kh_launch_cfg_t cfg;
  std::vector<int64_t> ints;  // 8-byte parameters decoded by the test when it knows the layout
};

class RecordingBackend : public DeviceBackend {
 public:
  int32_t get_function(const PackageIdentity&, int32_t, const char* kernel_name, void** fn,
                       std::string&) override {
    std::lock_guard<std::mutex> lock(mu_);
    names_.push_back(kernel_name);
    *fn = reinterpret_cast<void*>(names_.size());  // 1-based index into names_
    return KH_OK;
  }
  int32_t launch(const PackageIdentity&, void* fn, const kh_launch_cfg_t& cfg, void**, void*,
                 std::string&) override {
    std::lock_guard<std::mutex> lock(mu_);
    launches_.push_back({names_[reinterpret_cast<size_t>(fn) - 1], cfg, {}});
    return KH_OK;
  }
  std::vector<Launch> take() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<Launch> out;
    out.swap(launches_);
    names_.clear();
    return out;
  }

 private:
  std::mutex mu_;
  std::vector<std::string> names_;
  std::vector<Launch> launches_;
};

// Kernel names in a cubin: its symbol strings.
std::set<std::string> cubin_strings(const std::string& cubin) {
  std::set<std::string> out;
  size_t start = 0;
  for (size_t i = 0; i < cubin.size(); ++i)
    if (cubin[i] == '\0') {
      if (i > start) out.insert(cubin.substr(start, i - start));
      start = i + 1;
    }
  return out;
}

class CudaDispatch : public ::testing::Test {
 protected:
  void SetUp() override {
    set_device_backend(&backend_);
    norm_ = std::make_unique<Package>("norm");
    act_ = std::make_unique<Package>("activation");
  }
  void TearDown() override { set_device_backend(nullptr); }

  // Launch bounds: reg/loop norm kernels 512, reduce and activation kernels 256.
  static uint32_t bound_of(const std::string& kernel) {
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
    EXPECT_EQ(c.shared_mem_bytes, 0u);
    EXPECT_EQ(c.h.abi_major, KH_ABI_MAJOR);
    // Threads per row are a power of two (the row reductions assume it).
    EXPECT_EQ(c.block[0] & (c.block[0] - 1), 0u);
  }

  RecordingBackend backend_;
  std::unique_ptr<Package> norm_, act_;
};

// A kDLCUDA view of a HostTensor (the device pointer is the host address; never dereferenced).
DLTensor on_cuda(HostTensor& t) {
  DLTensor d = *t.dl();
  d.device = DLDevice{kDLCUDA, 0};
  return d;
}

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
        "act_silu_and_mul_fwd_fp16_scalar", "act_gelu_tanh_and_mul_bwd_fp32_vec"})
    EXPECT_TRUE(seen.count(k)) << k << " was never chosen";
}

// The geometry of the headline shapes (REFERENCE §6.3 item 2).
TEST_F(CudaDispatch, HeadlineShapesGetTheIntendedGeometry) {
  std::string err;
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
    DLTensor X = on_cuda(x), W = on_cuda(w), S = on_cuda(st), WS = on_cuda(ws);
    ASSERT_EQ(
        norm_->call("rms_norm_backward",
                    {targ(&X), targ(&X), targ(&W), targ(&S), targ(&X), targ(&W), targ(&WS)}, &err),
        KH_OK)
        << err;
    std::vector<Launch> l = backend_.take();
    ASSERT_EQ(l.size(), 2u);
    EXPECT_EQ(l[0].kernel, "norm_bwd_rms_bf16_vec_reg");
    EXPECT_EQ(l[0].cfg.block[0], 256u);  // 1024 vectors, 4 per thread
    EXPECT_EQ(l[0].cfg.grid[0], 132u);
    EXPECT_EQ(l[1].kernel, "norm_reduce_partials_bf16");
    EXPECT_EQ(l[1].cfg.grid[0], 8192u / 32);
    EXPECT_EQ(l[1].cfg.block[0] * l[1].cfg.block[1], 256u);
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
  for (const char* p : kPackages) {
    test::ProcessResult r =
        test::run_process({test::cli_path(), "check", package_dir(p).string()}, {}, 60);
    EXPECT_EQ(r.exit_code, 0) << p << ":\n" << r.out << r.err;
    r = test::run_process({test::cli_path(), "check", "--json", package_dir(p).string()}, {}, 60);
    EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
    EXPECT_NE(r.out.find(std::string("kernel-hub/") + p), std::string::npos) << r.out;
  }
}

TEST(KernelsPackage, KernelJsonIsAValidPackageManifestMatchingTheModule) {
  for (const char* p : kPackages) {
    SCOPED_TRACE(p);
    PackageManifest m = read_package_manifest(package_dir(p));
    EXPECT_EQ(m.name, std::string("kernel-hub/") + p);
    EXPECT_EQ(m.version, "1.0.0");
    EXPECT_EQ(m.cuda_source, std::string(p) + ".cu");
    EXPECT_NO_THROW(verify_package_files(package_dir(p), m));
    // Every manifest layer is a module layer with the same ops, flags and dtypes.
    Package pkg(p);
    const ModuleView& view = pkg.module().view;
    EXPECT_EQ(m.layers.size(), view.layers.size());
    for (auto& [name, layer] : m.layers) {
      const kh_layer_v1_t* l = view.find_layer(name);
      ASSERT_NE(l, nullptr) << name;
      EXPECT_EQ(layer.forward, l->forward);
      EXPECT_EQ(layer.forward_train, l->forward_train ? l->forward_train : "");
      EXPECT_EQ(layer.backward, l->backward ? l->backward : "");
      EXPECT_EQ(layer.has_backward, (l->flags & KH_FLAG_HAS_BACKWARD) != 0);
      EXPECT_EQ(layer.graph_safe, (l->flags & KH_FLAG_GRAPH_SAFE) != 0);
      EXPECT_EQ(layer.deterministic, (l->flags & KH_FLAG_DETERMINISTIC) != 0);
      EXPECT_EQ(layer.dtypes.size(), 3u);
    }
  }
}

}  // namespace
}  // namespace kh::kernels_test
