// The rotary and softmax packages' device code and packaging, without a GPU (the companion of
// test_kernels_device_code.cpp):
//  - rotary.cu and softmax.cu compile with NVRTC (no -I path, as the loader compiles them) for
//    sm_80, 86, 89, 90 and 90a with no warnings and no register spills;
//  - every kernel the host libraries ask for exists in the compiled code and every launch fits
//    the kernels' launch bounds (ops called on kDLCUDA tensors with a recording backend);
//  - `kernel-hub check` accepts both package directories and their kernel.json is a valid
//    registry package manifest matching the module table.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

#include "kernels/rotary/qk_norm_params.h"
#include "loader/host_services.h"
#include "tests/fixtures/process.h"
#include "tests/unit/test_kernels_device_util.h"
#include "tests/unit/test_kernels_nvrtc.h"
#include "tests/unit/test_kernels_rotary_cases.h"
#include "tests/unit/test_kernels_util.h"

namespace kh::kernels_test {
namespace {

const char* kPackages[] = {"rotary", "softmax"};

class RotarySoftmaxDeviceSourceCompiles
    : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(RotarySoftmaxDeviceSourceCompiles, WithNvrtcAndNoSpills) {
  if (!Nvrtc::get().ok()) GTEST_SKIP() << Nvrtc::get().load_error;
  const std::string package = std::get<0>(GetParam()), sm = std::get<1>(GetParam());
  expect_compiles_without_spills(package, sm);
}

INSTANTIATE_TEST_SUITE_P(Kernels, RotarySoftmaxDeviceSourceCompiles,
                         ::testing::Combine(::testing::Values("rotary", "softmax"),
                                            ::testing::Values("sm_80", "sm_86", "sm_89", "sm_90",
                                                              "sm_90a")),
                         package_sm_name);

class RotarySoftmaxCudaDispatch : public ::testing::Test {
 protected:
  void SetUp() override { set_device_backend(&backend_); }
  void TearDown() override { set_device_backend(nullptr); }
  RecordingBackend backend_;
};

TEST_F(RotarySoftmaxCudaDispatch, EveryRequestedKernelExistsAndEveryLaunchFitsItsBounds) {
  if (!Nvrtc::get().ok()) GTEST_SKIP() << Nvrtc::get().load_error;
  Package rotary("rotary"), softmax("softmax");
  std::map<std::string, std::set<std::string>> names;
  for (const char* p : kPackages) {
    Nvrtc::Output out = compile_for(p, "sm_90", false);
    ASSERT_TRUE(out.ok) << out.log;
    names[p] = cubin_strings(out.cubin);
  }
  std::set<std::string> seen;
  std::string err;
  CpuExecutor cpu;
  auto check = [&](const char* package, uint32_t bound) {
    for (auto& l : backend_.take()) {
      SCOPED_TRACE(l.kernel);
      EXPECT_TRUE(names[package].count(l.kernel)) << l.kernel << " is not in " << package;
      const auto& c = l.cfg;
      const uint64_t threads = uint64_t{c.block[0]} * c.block[1] * c.block[2];
      EXPECT_GE(threads, 32u);
      // The weight gradients' reduce (reduce_partials.cuh) runs 1024 threads.
      EXPECT_LE(threads, l.kernel.rfind("qknr_reduce_partials", 0) == 0 ? 1024u : bound);
      EXPECT_EQ(c.block[0] & (c.block[0] - 1), 0u);
      EXPECT_GE(c.block[0], 32u);  // the row reductions use whole warps
      EXPECT_GE(c.grid[0], 1u);
      if (l.kernel.rfind("qk_norm_rope_", 0) == 0 || l.kernel.rfind("qknr_bwd", 0) == 0) {
        // A normed head row (head_dim floats) per warp, or a warp's partial row of both weights'
        // gradients; within what every sm gives without opt-in.
        EXPECT_GT(c.shared_mem_bytes, 0u);
        EXPECT_EQ(c.shared_mem_bytes % (c.block[0] / 32), 0u);
        EXPECT_LE(c.shared_mem_bytes, 48u * 1024);
      } else {
        EXPECT_EQ(c.shared_mem_bytes, 0u);
      }
      seen.insert(l.kernel);
    }
  };
  for (int dtype : {kBF16, kFP16, kFP32})
    for (int64_t cols : {1, 7, 8, 64, 4095, 4096, 65536, 128256, 128257})
      for (int64_t offset : {0, 1}) {
        SCOPED_TRACE(testing::Message()
                     << dtype_name(dtype) << " cols " << cols << " offset " << offset);
        const int64_t R = 3;
        HostTensor x(dtype, R, cols, cols, offset), y(dtype, R, cols, cols, offset);
        HostTensor loss = vector_tensor(kFP32, R);
        rope_cases::Int64Tensor t({0, 1, 2});
        DLTensor X = on_cuda(x.dl()), Y = on_cuda(y.dl()), L = on_cuda(loss.dl()),
                 T = on_cuda(t.view(cpu));
        auto ok = [&](const char* op, std::vector<kh_arg_t> a) {
          EXPECT_EQ(softmax.call(op, a, &err), KH_OK) << op << ": " << err;
        };
        ok("softmax", {targ(&X), targ(&Y)});
        ok("softmax_backward", {targ(&X), targ(&Y), targ(&Y)});
        ok("cross_entropy", {targ(&X), targ(&T), iarg(-100), targ(&L)});
        ok("cross_entropy_train", {targ(&X), targ(&T), iarg(-100), farg(1.0), targ(&L), targ(&Y)});
        ok("cross_entropy_backward", {targ(&L), targ(&Y)});
        check("softmax", 1024);
      }
  for (int dtype : {kBF16, kFP16, kFP32})
    for (int64_t hd : {2, 64, 128, 256})
      for (bool f32 : {true, false}) {
        HostTensor q(dtype, 4, 32 * hd), k(dtype, 4, 8 * hd), cache(f32 ? kFP32 : dtype, 16, hd);
        rope_cases::Int64Tensor pos({0, 1, 2, 3});
        rope_cases::HeadsDl qd(q.dl(), 32, hd, hd), kd(k.dl(), 8, hd, hd);
        rope_cases::CacheDl cos(cache.dl(), hd / 2, 0, cache.dtype()),
            sin(cache.dl(), hd / 2, hd / 2, cache.dtype());
        DLTensor Q = on_cuda(&qd.t), K = on_cuda(&kd.t), C = on_cuda(&cos.t), S = on_cuda(&sin.t),
                 P = on_cuda(pos.view(cpu));
        for (int neox : {0, 1}) {
          EXPECT_EQ(
              rotary.call("rotary_embedding",
                          {targ(&P), targ(&Q), targ(&K), targ(&C), targ(&S), iarg(neox)}, &err),
              KH_OK)
              << err;
          EXPECT_EQ(rotary.call("rotary_embedding_backward",
                                {targ(&P), targ(&Q), targ(nullptr), targ(&C), targ(&S), iarg(neox)},
                                &err),
                    KH_OK)
              << err;
          HostTensor w(dtype, 1, hd);
          DLTensor W = on_cuda(w.dl());
          EXPECT_EQ(rotary.call("qk_norm_rotary_embedding",
                                {targ(&P), targ(&Q), targ(&K), targ(&W), targ(&W), farg(1e-6),
                                 targ(&C), targ(&S), iarg(neox)},
                                &err),
                    KH_OK)
              << err;
          // The training ops: NeoX with full rotary and head_dim 2 x (a 16-byte vector) x a power
          // of two up to 32 (not head_dim 2); refused on cuda otherwise.
          const int64_t vec = 16 / dtype_bytes(dtype);
          const int32_t want = neox && hd % (2 * vec) == 0 ? KH_OK : KH_ERR_UNSUPPORTED;
          HostTensor q2(dtype, 4, 32 * hd), k2(dtype, 4, 8 * hd), dw(dtype, 1, hd),
              ws(kFP32, 4, 2 * hd);
          rope_cases::HeadsDl q2d(q2.dl(), 32, hd, hd), k2d(k2.dl(), 8, hd, hd);
          DLTensor Q2 = on_cuda(&q2d.t), K2 = on_cuda(&k2d.t), DW = on_cuda(dw.dl()),
                   WS = on_cuda(ws.dl());
          EXPECT_EQ(rotary.call("qk_norm_rotary_embedding_train",
                                {targ(&P), targ(&Q), targ(&K), targ(&W), targ(&W), farg(1e-6),
                                 targ(&C), targ(&S), iarg(neox), targ(&Q2), targ(&K2)},
                                &err),
                    want)
              << err;
          EXPECT_EQ(rotary.call("qk_norm_rotary_embedding_backward",
                                {targ(&P), targ(&Q2), targ(&K2), targ(&Q), targ(&K), targ(&W),
                                 targ(&W), farg(1e-6), targ(&C), targ(&S), iarg(neox), targ(&Q2),
                                 targ(&K2), targ(&DW), targ(&DW), targ(&WS)},
                                &err),
                    want)
              << err;
          if (want != KH_OK) {
            EXPECT_NE(err.find("the cuda kernels take"), std::string::npos) << err;
          }
        }
        check("rotary", 256);
      }
  for (const char* k :
       {"softmax_fwd_bf16_vec", "softmax_fwd_fp16_scalar", "softmax_bwd_fp32_vec",
        "ce_fwd_bf16_vec", "ce_train_bf16_vec", "ce_train_fp32_scalar", "ce_bwd_fp16_vec",
        "rope_neox_bf16_f32_vec", "rope_gptj_fp16_same_vec", "rope_neox_bf16_f32_scalar",
        "rope_neox_fp32_f32_vec", "rope_gptj_fp32_f32_scalar", "qk_norm_rope_neox_bf16_f32",
        "qk_norm_rope_gptj_fp16_same", "qk_norm_rope_neox_fp32_f32", "qknr_fwd_neox_bf16_f32",
        "qknr_bwd_neox_fp16_same", "qknr_bwd_neox_fp32_f32", "qknr_reduce_partials_bf16"})
    EXPECT_TRUE(seen.count(k)) << k << " was never chosen";
}

TEST_F(RotarySoftmaxCudaDispatch, HeadlineShapesGetTheIntendedGeometry) {
  Package softmax("softmax");
  std::string err;
  CpuExecutor cpu;
  // Cross-entropy 4096 x 128256 bf16: one 1024-thread CTA per row.
  HostTensor x(kBF16, 4096, 128256), loss = vector_tensor(kFP32, 4096);
  std::vector<int64_t> tv(4096, 0);
  rope_cases::Int64Tensor t(tv);
  DLTensor X = on_cuda(x.dl()), L = on_cuda(loss.dl()), T = on_cuda(t.view(cpu));
  ASSERT_EQ(softmax.call("cross_entropy", {targ(&X), targ(&T), iarg(-100), targ(&L)}, &err), KH_OK)
      << err;
  std::vector<Launch> l = backend_.take();
  ASSERT_EQ(l.size(), 1u);
  EXPECT_EQ(l[0].kernel, "ce_fwd_bf16_vec");
  EXPECT_EQ(l[0].cfg.block[0], 1024u);
  EXPECT_EQ(l[0].cfg.block[1], 1u);
  EXPECT_EQ(l[0].cfg.grid[0], 4096u);
  // Short rows share a CTA.
  HostTensor s(kBF16, 1000, 64), sy(kBF16, 1000, 64);
  DLTensor S = on_cuda(s.dl()), SY = on_cuda(sy.dl());
  ASSERT_EQ(softmax.call("softmax", {targ(&S), targ(&SY)}, &err), KH_OK) << err;
  l = backend_.take();
  ASSERT_EQ(l.size(), 1u);
  EXPECT_EQ(l[0].cfg.block[0], 32u);
  EXPECT_EQ(l[0].cfg.block[1], 8u);
  EXPECT_EQ(l[0].cfg.grid[0], 125u);
}

// QKNormRotaryEmbedding's training ops at Qwen3-0.6B's step (8 x 2048 tokens, 16/8 heads of
// 128, bf16): the forward two rows a group of 8 lanes; the backward a walker CTA per workspace
// row, fewer when the rows run out (as for a key with more heads than the query), then the
// reduce.
TEST_F(RotarySoftmaxCudaDispatch, QkNormTrainingOpsGetTheIntendedGeometry) {
  Package rotary("rotary");
  std::string err;
  CpuExecutor cpu;
  const int64_t T = 16384, HD = 128;
  // Each qknr launch's cs_vec (the 16-byte cos/sin loads), from its parameters, and the rows'
  // token division by each tensor's heads checked at a few rows.
  std::vector<int> cs_vec;
  backend_.on_params = [&](const std::string& kernel, void** params) {
    if (kernel.rfind("qknr_fwd", 0) != 0 && kernel.rfind("qknr_bwd", 0) != 0) return;
    const kh_qknr_params& p = *static_cast<const kh_qknr_params*>(params[0]);
    cs_vec.push_back(p.cs_vec);
    for (const kh_qknr_tensor& t : p.t) {
      if (t.heads == 0) continue;
      for (kh_u32 r : {0u, 1u, 23u, 24u, 1000u, static_cast<kh_u32>(p.tokens * t.heads - 1)})
        EXPECT_EQ(kh_qknr_divide(r, t.div_mul, t.div_shift), r / t.heads)
            << kernel << ": row " << r << " of " << t.heads << " heads";
    }
  };
  // cache_pad: floats after each cache row (1: rows 516 bytes apart, no 16-byte load fits).
  auto run = [&](int64_t tokens, int64_t qh, int64_t kh, int64_t w, int64_t cache_pad = 0) {
    HostTensor q(kBF16, tokens, qh * HD), k(kBF16, tokens, kh * HD),
        cache(kFP32, 4096, HD, HD + cache_pad), wt(kBF16, 1, HD), ws(kFP32, w, 2 * HD);
    std::vector<int64_t> pv(static_cast<size_t>(tokens), 0);
    rope_cases::Int64Tensor pos(pv);
    rope_cases::HeadsDl qd(q.dl(), qh, HD, HD), kd(k.dl(), kh, HD, HD);
    rope_cases::CacheDl cos(cache.dl(), HD / 2, 0, kFP32), sin(cache.dl(), HD / 2, HD / 2, kFP32);
    DLTensor Q = on_cuda(&qd.t), K = on_cuda(&kd.t), C = on_cuda(&cos.t), S = on_cuda(&sin.t),
             P = on_cuda(pos.view(cpu)), W = on_cuda(wt.dl()), WS = on_cuda(ws.dl());
    EXPECT_EQ(rotary.call("qk_norm_rotary_embedding_train",
                          {targ(&P), targ(&Q), targ(&K), targ(&W), targ(&W), farg(1e-6), targ(&C),
                           targ(&S), iarg(1), targ(&Q), targ(&K)},
                          &err),
              KH_OK)
        << err;
    EXPECT_EQ(rotary.call(
                  "qk_norm_rotary_embedding_backward",
                  {targ(&P), targ(&Q), targ(&K), targ(&Q), targ(&K), targ(&W), targ(&W), farg(1e-6),
                   targ(&C), targ(&S), iarg(1), targ(&Q), targ(&K), targ(&W), targ(&W), targ(&WS)},
                  &err),
              KH_OK)
        << err;
    return backend_.take();
  };
  std::vector<Launch> l = run(T, 16, 8, 264);
  ASSERT_EQ(l.size(), 3u);
  EXPECT_EQ(l[0].kernel, "qknr_fwd_neox_bf16_f32");
  EXPECT_EQ(l[0].cfg.block[0], 256u);
  EXPECT_EQ(l[0].cfg.grid[0], T * 24 / 2 * 8 / 256);  // 6144
  EXPECT_EQ(l[1].kernel, "qknr_bwd_neox_bf16_f32");
  EXPECT_EQ(l[1].cfg.grid[0], 264u);
  EXPECT_EQ(l[1].cfg.shared_mem_bytes, 8u * 2 * HD * 4);
  EXPECT_EQ(l[2].kernel, "qknr_reduce_partials_bf16");
  EXPECT_EQ(l[2].cfg.grid[0], 2u * HD / 32);
  EXPECT_EQ(l[2].cfg.block[0] * l[2].cfg.block[1], 1024u);
  EXPECT_EQ(cs_vec, (std::vector<int>{1, 1}));
  cs_vec.clear();
  l = run(T, 16, 8, 264, 1);
  EXPECT_EQ(cs_vec, (std::vector<int>{0, 0}));
  // 10 tokens, 1 query head and 4 key heads: 40 key rows, 32 rows a CTA: 2 walkers of 264.
  l = run(10, 1, 4, 264);
  ASSERT_EQ(l.size(), 3u);
  EXPECT_EQ(l[1].cfg.grid[0], 2u);
  l = run(50, 28, 4, 264);  // head counts no power of two divides (Qwen2.5-7B's 28)
  ASSERT_EQ(l.size(), 3u);
  // 2^30 query and key rows or more: refused by name (the kernels index rows in 32 bits), with
  // no launch. Shapes only: the refusal reads no element.
  HostTensor q(kBF16, 1, 16 * HD), k(kBF16, 1, 8 * HD), cache(kFP32, 4096, HD), wt(kBF16, 1, HD);
  rope_cases::Int64Tensor pos(std::vector<int64_t>{0});
  rope_cases::HeadsDl qd(q.dl(), 16, HD, HD), kd(k.dl(), 8, HD, HD);
  rope_cases::CacheDl cos(cache.dl(), HD / 2, 0, kFP32), sin(cache.dl(), HD / 2, HD / 2, kFP32);
  DLTensor P = on_cuda(pos.view(cpu)), C = on_cuda(&cos.t), S = on_cuda(&sin.t),
           W = on_cuda(wt.dl());
  for (int64_t tokens : {(int64_t{1} << 30) / 24, (int64_t{1} << 30) / 24 + 1}) {
    qd.shape[0] = kd.shape[0] = pos.shape[0] = tokens;
    DLTensor Q = on_cuda(&qd.t), K = on_cuda(&kd.t);
    const int32_t rc = rotary.call("qk_norm_rotary_embedding_train",
                                   {targ(&P), targ(&Q), targ(&K), targ(&W), targ(&W), farg(1e-6),
                                    targ(&C), targ(&S), iarg(1), targ(&Q), targ(&K)},
                                   &err);
    if (tokens * 24 < (int64_t{1} << 30)) {
      EXPECT_EQ(rc, KH_OK) << err;
      EXPECT_EQ(backend_.take().size(), 1u);
    } else {
      EXPECT_EQ(rc, KH_ERR_UNSUPPORTED);
      EXPECT_NE(err.find("32 bits"), std::string::npos) << err;
      EXPECT_TRUE(backend_.take().empty());
    }
  }
}

// The q/k norm kernels' division of a row by the head count (kh_qknr_divide: a multiply and a
// shift from kh_qknr_divider), the same code on the host as on the device: every divisor up to
// 4096 and some beyond, at the quotients' edges (k d - 1, k d, k d + 1) across [0, 2^31), and at
// pseudo-random rows.
TEST(KernelsRotaryQkNormDivider, DividesEveryRowBelow2To31LikeADivision) {
  std::vector<kh_u32> divisors;
  for (kh_u32 d = 1; d <= 4096; ++d) divisors.push_back(d);
  for (kh_u32 d : {5000u, 65535u, 65536u, 65537u, 1000003u, (1u << 30) - 1, 1u << 30,
                   (1u << 30) + 1, (1u << 31) - 1, 1u << 31})
    divisors.push_back(d);
  uint64_t state = 0x9E3779B97F4A7C15ull;
  size_t bad = 0;
  for (kh_u32 d : divisors) {
    kh_u32 mul = 0, shift = 0;
    kh_qknr_divider(d, &mul, &shift);
    auto check = [&](uint64_t n) {
      if (n >= (1ull << 31)) return;
      const kh_u32 got = kh_qknr_divide(static_cast<kh_u32>(n), mul, shift);
      if (got != n / d && ++bad <= 5) ADD_FAILURE() << n << " / " << d << ": got " << got;
    };
    for (uint64_t k = 0; k * d < (1ull << 31); k += 1 + k / 8) {
      check(k * d);
      check(k * d + 1);
      if (k) check(k * d - 1);
    }
    check((1ull << 31) - 1);
    for (int i = 0; i < 64; ++i) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      check(state >> 33);  // 31 bits
    }
  }
  EXPECT_EQ(bad, 0u);
  kh_u32 mul = 7, shift = 7;
  kh_qknr_divider(0, &mul, &shift);  // no heads: nothing divides
  EXPECT_EQ(mul, 0u);
  EXPECT_EQ(shift, 0u);
}

TEST(KernelsRotarySoftmaxPackage, KernelHubCheckAcceptsEachPackageDirectory) {
  if (!std::filesystem::exists(test::cli_path()))
    GTEST_SKIP() << "kernel-hub CLI not built at " << test::cli_path();
  expect_kernel_hub_check_accepts(kPackages);
}

TEST(KernelsRotarySoftmaxPackage, KernelJsonIsAValidPackageManifestMatchingTheModule) {
  expect_manifest_matches_module(kPackages);
}

}  // namespace
}  // namespace kh::kernels_test
