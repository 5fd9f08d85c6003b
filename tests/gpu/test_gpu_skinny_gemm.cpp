// GPU tests of the runtime's skinny GEMM (tools/demo/skinny_gemm.*; CTest label `gpu`, every
// test skips cleanly without a driver or a device): y = x . W^T (+ bias) against a float64
// reference of the same bf16 inputs, fresh random values for every case, the output poisoned
// with NaN first and a guard row after it that must stay poisoned; every compiled variant, split
// K from 1 to many and the default plan, rows 1 to 64, shapes that end inside a tile; repeated
// calls and CUDA-graph replays on new inputs (the split workspace is left at zero by each call);
// two streams at once; and the tensors it refuses.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernel_hub/kernel_hub.hpp"
#include "kernels/common/kh_prelude.cuh"
#include "tests/gpu/gpu_device.h"
#include "tools/demo/device_tensor.h"
#include "tools/demo/skinny_gemm.h"

namespace kh::demo {
namespace {

std::vector<uint16_t> random_bf16(size_t n, std::mt19937& rng, float scale = 1.f) {
  std::normal_distribution<float> dist(0.f, scale);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = kh_float_to_bf16_bits(dist(rng));
  return v;
}

float f(uint16_t b) {
  return kh_bf16_bits_to_float(b);
}

struct Problem {
  int64_t M, N, K;
  bool bias;
};

class GpuSkinnyGemm : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    skip_ = gpu_test::no_cuda_device();
    if (skip_) return;
    pool_ = new DevicePool(0);
    stream_ = new DeviceStream(0);
    gemm_ = new SkinnyGemm(0, *pool_);
  }
  void SetUp() override {
    if (skip_) GTEST_SKIP() << "no usable CUDA device: " << *skip_;
  }

  // Host operands of one problem and the device tensors they go to; y has a guard row after
  // its M rows.
  struct Operands {
    std::vector<uint16_t> x, w, bias;
    DeviceTensor dx, dw, dbias, dy_all, dy;
  };
  Operands make(const Problem& p, std::mt19937& rng) {
    Operands o;
    o.x = random_bf16(static_cast<size_t>(p.M * p.K), rng);
    o.w = random_bf16(static_cast<size_t>(p.N * p.K), rng, 0.05f);
    o.dx = DeviceTensor(*pool_, {p.M, p.K}, kBF16);
    o.dw = DeviceTensor(*pool_, {p.N, p.K}, kBF16);
    o.dx.upload(*stream_, o.x.data(), o.x.size() * 2);
    o.dw.upload(*stream_, o.w.data(), o.w.size() * 2);
    if (p.bias) {
      o.bias = random_bf16(static_cast<size_t>(p.N), rng);
      o.dbias = DeviceTensor(*pool_, {p.N}, kBF16);
      o.dbias.upload(*stream_, o.bias.data(), o.bias.size() * 2);
    }
    o.dy_all = DeviceTensor(*pool_, {p.M + 1, p.N}, kBF16);
    o.dy = o.dy_all.rows(0, p.M);
    poison(o);
    return o;
  }
  void poison(Operands& o) { stream_->memset(o.dy_all.data(), 0xFF, o.dy_all.bytes()); }

  // y against the float64 reference: bf16 rounding of the result (2^-8 relative) plus fp32
  // accumulation; the guard row still NaN.
  void expect_matches(const Problem& p, Operands& o, DeviceStream& s, const std::string& what) {
    std::vector<uint16_t> y(static_cast<size_t>((p.M + 1) * p.N));
    o.dy_all.download(s, y.data(), y.size() * 2);
    s.synchronize();
    double err2 = 0, ref2 = 0;
    int bad = 0;
    for (int64_t m = 0; m < p.M; ++m)
      for (int64_t n = 0; n < p.N; ++n) {
        double ref = p.bias ? f(o.bias[n]) : 0.0;
        for (int64_t k = 0; k < p.K; ++k)
          ref += static_cast<double>(f(o.x[m * p.K + k])) * f(o.w[n * p.K + k]);
        const double got = f(y[m * p.N + n]);
        err2 += (got - ref) * (got - ref);
        ref2 += ref * ref;
        if (!(std::fabs(got - ref) <= 1e-3 + 8e-3 * std::fabs(ref)) && ++bad <= 3)
          ADD_FAILURE() << what << ": y[" << m << "][" << n << "] = " << got << ", reference "
                        << ref;
      }
    EXPECT_EQ(bad, 0) << what;
    EXPECT_LT(std::sqrt(err2 / std::max(ref2, 1e-30)), 4e-3) << what;
    for (int64_t n = 0; n < p.N; ++n)
      if (!std::isnan(f(y[p.M * p.N + n]))) {
        ADD_FAILURE() << what << ": the guard row was written at column " << n;
        break;
      }
  }

  static std::string* skip_;
  static DevicePool* pool_;
  static DeviceStream* stream_;
  static SkinnyGemm* gemm_;
};
std::string* GpuSkinnyGemm::skip_ = nullptr;
DevicePool* GpuSkinnyGemm::pool_ = nullptr;
DeviceStream* GpuSkinnyGemm::stream_ = nullptr;
SkinnyGemm* GpuSkinnyGemm::gemm_ = nullptr;

TEST_F(GpuSkinnyGemm, MatchesAFloat64ReferenceForEveryVariantAndSplit) {
  std::mt19937 rng(20261201);
  const Problem problems[] = {{1, 8, 64, false},       {5, 72, 128, true},
                              {16, 1000, 448, false},  {33, 136, 1024, true},
                              {64, 1024, 3072, false}, {64, 4096, 1024, true}};
  for (const Problem& p : problems) {
    Operands o = make(p, rng);
    const std::string shape = std::to_string(p.M) + "x" + std::to_string(p.N) + "x" +
                              std::to_string(p.K) + (p.bias ? " + bias" : "");
    gemm_->run(*stream_, o.dx, o.dw, p.bias ? &o.dbias : nullptr, o.dy);  // the default plan
    expect_matches(p, o, *stream_, shape + ", default plan");
    std::vector<int> splits_list = {1};
    for (int64_t s : {int64_t{2}, std::min<int64_t>(p.K / 64, 7)})
      if (s <= p.K / 64 && s != splits_list.back()) splits_list.push_back(static_cast<int>(s));
    for (SkinnyPlan plan : skinny_variants())
      for (int splits : splits_list) {
        if (plan.wgmma && !gemm_->has_wgmma()) continue;  // sm_90a code only
        poison(o);
        plan.splits = splits;
        gemm_->run(*stream_, o.dx, o.dw, p.bias ? &o.dbias : nullptr, o.dy, plan);
        expect_matches(p, o, *stream_,
                       shape + ", " + plan.kernel() + ", " + std::to_string(splits) + " splits");
        if (HasFailure()) return;
      }
  }
}

// The plans of both kernel families: the default (wgmma on Hopper: splits summed in a cluster)
// and the mma.sync one (splits summed in a per-stream workspace), which is also what other GPUs'
// default is.
std::vector<std::pair<std::string, std::function<SkinnyPlan(const Problem&)>>> plan_families(
    const SkinnyGemm& gemm) {
  return {{"default plan", [&gemm](const Problem& p) { return gemm.default_plan(p.M, p.N, p.K); }},
          {"mma.sync plan", [](const Problem& p) { return skinny_plan(p.M, p.N, p.K); }}};
}

// A split call leaves the mma.sync workspace's slabs at zero and its counters at 0 (a wgmma
// split keeps nothing between calls): three calls on new inputs each give their own product,
// eagerly and as replays of one captured graph of two split GEMMs, with either family's plan.
TEST_F(GpuSkinnyGemm, RepeatedCallsAndGraphReplaysStartFromAZeroWorkspace) {
  std::mt19937 rng(7);
  const Problem a{64, 1024, 2048, false}, b{9, 4096, 1024, true};
  for (const auto& [family, plan_of] : plan_families(*gemm_)) {
    SCOPED_TRACE(family);
    Operands oa = make(a, rng), ob = make(b, rng);
    const SkinnyPlan pa = plan_of(a), pb = plan_of(b);
    ASSERT_GT(pa.splits, 1);
    ASSERT_GT(pb.splits, 1);
    for (int i = 0; i < 3; ++i) {
      oa.x = random_bf16(oa.x.size(), rng);
      oa.dx.upload(*stream_, oa.x.data(), oa.x.size() * 2);
      poison(oa);
      gemm_->run(*stream_, oa.dx, oa.dw, nullptr, oa.dy, pa);
      expect_matches(a, oa, *stream_, "eager call " + std::to_string(i));
    }
    gemm_->run(*stream_, ob.dx, ob.dw, &ob.dbias, ob.dy, pb);  // sizes the workspace first
    expect_matches(b, ob, *stream_, "eager call of the second shape");
    stream_->begin_capture();
    gemm_->run(*stream_, oa.dx, oa.dw, nullptr, oa.dy, pa);
    gemm_->run(*stream_, ob.dx, ob.dw, &ob.dbias, ob.dy, pb);
    DeviceGraph graph = DeviceGraph::end_capture(*stream_);
    for (int i = 0; i < 3; ++i) {
      oa.x = random_bf16(oa.x.size(), rng);
      ob.x = random_bf16(ob.x.size(), rng);
      oa.dx.upload(*stream_, oa.x.data(), oa.x.size() * 2);
      ob.dx.upload(*stream_, ob.x.data(), ob.x.size() * 2);
      poison(oa);
      poison(ob);
      graph.launch(*stream_);
      expect_matches(a, oa, *stream_, "graph replay " + std::to_string(i) + ", first GEMM");
      expect_matches(b, ob, *stream_, "graph replay " + std::to_string(i) + ", second GEMM");
    }
  }
}

// Split GEMMs on two streams at once: each stream has its own mma.sync workspace (and a wgmma
// split's partial tiles never leave its cluster).
TEST_F(GpuSkinnyGemm, TwoStreamsAtOnceKeepTheirPartialTilesApart) {
  std::mt19937 rng(11);
  const Problem p{64, 1024, 3072, false};
  DeviceStream other(0);
  for (const auto& [family, plan_of] : plan_families(*gemm_)) {
    SCOPED_TRACE(family);
    Operands o1 = make(p, rng), o2 = make(p, rng);
    const SkinnyPlan plan = plan_of(p);
    ASSERT_GT(plan.splits, 1);
    stream_->synchronize();
    for (int i = 0; i < 4; ++i) {
      gemm_->run(*stream_, o1.dx, o1.dw, nullptr, o1.dy, plan);
      gemm_->run(other, o2.dx, o2.dw, nullptr, o2.dy, plan);
    }
    expect_matches(p, o1, *stream_, "stream 1");
    expect_matches(p, o2, other, "stream 2");
  }
}

// The gate/up GEMM with SiluAndMul as its epilogue (Hopper): y [M, N] = silu(x . W[:N]^T) *
// (x . W[N:]^T) against float64 for every SiluAndMul variant and splits of K from 1 to a cluster,
// shapes that end inside a tile, then as a graph replay on new inputs; refused elsewhere.
TEST_F(GpuSkinnyGemm, SiluAndMulEpilogueMatchesAFloat64Reference) {
  if (!gemm_->has_wgmma()) {
    DeviceTensor x(*pool_, {4, 128}, kBF16), w(*pool_, {128, 128}, kBF16),
        y(*pool_, {4, 64}, kBF16);
    EXPECT_NE(gemm_->silu_refusal(x, w, y).find("Hopper"), std::string::npos);
    EXPECT_THROW(gemm_->run_silu_and_mul(*stream_, x, w, y), Error);
    return;
  }
  std::mt19937 rng(20261202);
  struct Shape {
    int64_t M, N, K;  // y [M, N], w [2 N, K]
  };
  for (const Shape& sh :
       {Shape{1, 8, 64}, Shape{5, 40, 128}, Shape{33, 136, 448}, Shape{64, 3072, 1024}}) {
    const Problem gu{sh.M, 2 * sh.N, sh.K, false};  // the plain GEMM's operands: w [2 N, K]
    Operands o = make(gu, rng);
    DeviceTensor y_all(*pool_, {sh.M + 1, sh.N}, kBF16);
    DeviceTensor y = y_all.rows(0, sh.M);
    const std::string shape =
        std::to_string(sh.M) + "x" + std::to_string(sh.N) + "x" + std::to_string(sh.K);
    auto check = [&](const std::string& what) {
      std::vector<uint16_t> got((sh.M + 1) * sh.N);
      y_all.download(*stream_, got.data(), got.size() * 2);
      stream_->synchronize();
      double err2 = 0, ref2 = 0;
      int bad = 0;
      for (int64_t m = 0; m < sh.M; ++m)
        for (int64_t n = 0; n < sh.N; ++n) {
          double g = 0, u = 0;
          for (int64_t k = 0; k < sh.K; ++k) {
            const double xv = f(o.x[m * sh.K + k]);
            g += xv * f(o.w[n * sh.K + k]);
            u += xv * f(o.w[(sh.N + n) * sh.K + k]);
          }
          const double ref = g / (1.0 + std::exp(-g)) * u, v = f(got[m * sh.N + n]);
          err2 += (v - ref) * (v - ref);
          ref2 += ref * ref;
          if (!(std::fabs(v - ref) <= 1e-3 + 8e-3 * std::fabs(ref)) && ++bad <= 3)
            ADD_FAILURE() << what << ": y[" << m << "][" << n << "] = " << v << ", reference "
                          << ref;
        }
      EXPECT_EQ(bad, 0) << what;
      EXPECT_LT(std::sqrt(err2 / std::max(ref2, 1e-30)), 4e-3) << what;
      for (int64_t n = 0; n < sh.N; ++n)
        if (!std::isnan(f(got[sh.M * sh.N + n]))) {
          ADD_FAILURE() << what << ": the guard row was written at column " << n;
          break;
        }
    };
    auto poison_y = [&] { stream_->memset(y_all.data(), 0xFF, y_all.bytes()); };
    ASSERT_EQ(gemm_->silu_refusal(o.dx, o.dw, y), "");
    poison_y();
    gemm_->run_silu_and_mul(*stream_, o.dx, o.dw, y);
    check(shape + ", default plan");
    for (SkinnyPlan plan : skinny_epilogue_variants(SkinnyEpilogue::kSiluAndMul))
      for (int splits : {1, 2, 4, 8}) {
        if (splits > sh.K / 64) continue;
        plan.splits = splits;
        poison_y();
        gemm_->run_silu_and_mul(*stream_, o.dx, o.dw, y, plan);
        check(shape + ", " + plan.kernel() + ", " + std::to_string(splits) + " splits");
        if (HasFailure()) return;
      }
    stream_->begin_capture();
    gemm_->run_silu_and_mul(*stream_, o.dx, o.dw, y);
    DeviceGraph graph = DeviceGraph::end_capture(*stream_);
    o.x = random_bf16(o.x.size(), rng);
    o.dx.upload(*stream_, o.x.data(), o.x.size() * 2);
    poison_y();
    graph.launch(*stream_);
    check(shape + ", graph replay on new inputs");
  }
  // Odd weights (no gate/up halves), y of another width, a plain plan.
  DeviceTensor x(*pool_, {4, 128}, kBF16), w_odd(*pool_, {129, 128}, kBF16),
      w(*pool_, {128, 128}, kBF16), y(*pool_, {4, 64}, kBF16), y_wide(*pool_, {4, 128}, kBF16);
  EXPECT_NE(gemm_->silu_refusal(x, w_odd, y).find("[2 N, K]"), std::string::npos);
  EXPECT_NE(gemm_->silu_refusal(x, w, y_wide), "");
  EXPECT_THROW(gemm_->run_silu_and_mul(*stream_, x, w, y, SkinnyPlan{64, 4, 1, true}), Error);
  EXPECT_THROW(gemm_->run(*stream_, x, w.rows(0, 64), nullptr, y,
                          skinny_epilogue_variants(SkinnyEpilogue::kSiluAndMul)[0]),
               Error);
}

// The q/k/v GEMM with Qwen3's q/k norms and RoPE as its epilogue (Hopper): every query and key
// head of y normed (bf16 row, then bf16(x rstd w)) and rotated by NeoX pairs at its row's
// position, the value heads as projected, against a float64 reference of the same steps; a
// position outside the table leaves the normed head unrotated. Every variant and split, then a
// graph replay on new inputs and positions; refused elsewhere and for what it cannot take.
TEST_F(GpuSkinnyGemm, QkNormRopeEpilogueMatchesAFloat64Reference) {
  constexpr int64_t D = kQkHeadDim, P = 40;  // head width, rotary table rows
  std::mt19937 rng(20261203);
  std::uniform_real_distribution<float> angle(-3.f, 3.f);
  std::vector<float> cos_h(P * D / 2), sin_h(cos_h.size());
  for (size_t i = 0; i < cos_h.size(); ++i) {
    const float a = angle(rng);
    cos_h[i] = std::cos(a);
    sin_h[i] = std::sin(a);
  }
  DeviceTensor cos_t(*pool_, {P, D / 2}, kF32), sin_t(*pool_, {P, D / 2}, kF32);
  cos_t.upload(*stream_, cos_h.data(), cos_h.size() * 4);
  sin_t.upload(*stream_, sin_h.data(), sin_h.size() * 4);
  const std::vector<uint16_t> qw = random_bf16(D, rng), kw = random_bf16(D, rng);
  DeviceTensor qw_t(*pool_, {D}, kBF16), kw_t(*pool_, {D}, kBF16);
  qw_t.upload(*stream_, qw.data(), D * 2);
  kw_t.upload(*stream_, kw.data(), D * 2);
  const float eps = 1e-6f;
  auto bf = [](double v) { return static_cast<double>(f(kh_float_to_bf16_bits((float)v))); };
  struct Shape {
    int64_t M, K;
    int q_heads, k_heads, v_heads;
  };
  for (const Shape& sh :
       {Shape{1, 128, 2, 1, 1}, Shape{5, 256, 4, 2, 2}, Shape{64, 1024, 16, 8, 8}}) {
    const int64_t heads = sh.q_heads + sh.k_heads + sh.v_heads, N = heads * D;
    const Problem p{sh.M, N, sh.K, false};
    Operands o = make(p, rng);
    std::vector<int64_t> pos(static_cast<size_t>(sh.M));
    DeviceTensor pos_t(*pool_, {sh.M}, kI64);
    auto new_positions = [&] {
      std::uniform_int_distribution<int64_t> at(0, P - 1);
      for (auto& v : pos) v = at(rng);
      if (sh.M > 2) pos[1] = P;  // outside the table: normed, not rotated
      pos_t.upload(*stream_, pos.data(), pos.size() * 8);
    };
    new_positions();
    const SkinnyQkNormRope e{&pos_t, &qw_t, &kw_t, eps, &cos_t, &sin_t, sh.q_heads, sh.k_heads};
    auto check = [&](const std::string& what) {
      std::vector<uint16_t> got(static_cast<size_t>((sh.M + 1) * N));
      o.dy_all.download(*stream_, got.data(), got.size() * 2);
      stream_->synchronize();
      int bad = 0;
      for (int64_t m = 0; m < sh.M; ++m)
        for (int64_t h = 0; h < heads; ++h) {
          std::vector<double> v(D), ref(D);
          for (int64_t d = 0; d < D; ++d) {
            double acc = 0;
            for (int64_t k = 0; k < sh.K; ++k)
              acc += static_cast<double>(f(o.x[m * sh.K + k])) * f(o.w[(h * D + d) * sh.K + k]);
            v[d] = bf(acc);
          }
          ref = v;
          if (h < sh.q_heads + sh.k_heads) {
            const std::vector<uint16_t>& wn = h < sh.q_heads ? qw : kw;
            double ss = 0;
            for (double x : v) ss += x * x;
            const double rstd = 1.0 / std::sqrt(ss / D + eps);
            for (int64_t d = 0; d < D; ++d) v[d] = bf(v[d] * rstd * f(wn[d]));
            ref = v;
            const int64_t at = pos[m];
            if (at >= 0 && at < P)
              for (int64_t j = 0; j < D / 2; ++j) {
                const double c = cos_h[at * D / 2 + j], sn = sin_h[at * D / 2 + j];
                ref[j] = v[j] * c - v[j + D / 2] * sn;
                ref[j + D / 2] = v[j + D / 2] * c + v[j] * sn;
              }
          }
          for (int64_t d = 0; d < D; ++d) {
            const double g = f(got[m * N + h * D + d]);
            if (!(std::fabs(g - ref[d]) <= 2e-2 + 1e-2 * std::fabs(ref[d])) && ++bad <= 3)
              ADD_FAILURE() << what << ": row " << m << " head " << h << " column " << d << " = "
                            << g << ", reference " << ref[d];
          }
        }
      EXPECT_EQ(bad, 0) << what;
      for (int64_t n = 0; n < N; ++n)
        if (!std::isnan(f(got[sh.M * N + n]))) {
          ADD_FAILURE() << what << ": the guard row was written at column " << n;
          break;
        }
    };
    const std::string shape = std::to_string(sh.M) + " rows, " + std::to_string(heads) +
                              " heads, K = " + std::to_string(sh.K);
    if (!gemm_->has_wgmma()) {
      EXPECT_NE(gemm_->qk_norm_rope_refusal(o.dx, o.dw, nullptr, o.dy, e).find("Hopper"),
                std::string::npos);
      return;
    }
    ASSERT_EQ(gemm_->qk_norm_rope_refusal(o.dx, o.dw, nullptr, o.dy, e), "");
    gemm_->run_qk_norm_rope(*stream_, o.dx, o.dw, nullptr, o.dy, e);
    check(shape + ", default plan");
    for (SkinnyPlan plan : skinny_epilogue_variants(SkinnyEpilogue::kQkNormRope))
      for (int splits : {1, 2, 4, 8}) {
        if (splits > sh.K / 64) continue;
        plan.splits = splits;
        poison(o);
        gemm_->run_qk_norm_rope(*stream_, o.dx, o.dw, nullptr, o.dy, e, plan);
        check(shape + ", " + plan.kernel() + ", " + std::to_string(splits) + " splits");
        if (HasFailure()) return;
      }
    stream_->begin_capture();
    gemm_->run_qk_norm_rope(*stream_, o.dx, o.dw, nullptr, o.dy, e);
    DeviceGraph graph = DeviceGraph::end_capture(*stream_);
    o.x = random_bf16(o.x.size(), rng);
    o.dx.upload(*stream_, o.x.data(), o.x.size() * 2);
    new_positions();
    poison(o);
    graph.launch(*stream_);
    check(shape + ", graph replay on new inputs and positions");
  }
  // What it refuses: heads that are not 128 wide, more q/k heads than the row holds, a short
  // positions tensor, partial rotary tables.
  DeviceTensor x(*pool_, {4, 128}, kBF16), w(*pool_, {384, 128}, kBF16), y(*pool_, {4, 384}, kBF16),
      pos4(*pool_, {4}, kI64), pos3(*pool_, {3}, kI64), cos32(*pool_, {P, 32}, kF32);
  SkinnyQkNormRope e{&pos4, &qw_t, &kw_t, eps, &cos_t, &sin_t, 2, 1};
  EXPECT_EQ(gemm_->qk_norm_rope_refusal(x, w, nullptr, y, e), "");
  e.q_heads = 3;
  EXPECT_NE(gemm_->qk_norm_rope_refusal(x, w, nullptr, y, e).find("3 query and 1 key heads"),
            std::string::npos);
  e.q_heads = 2;
  e.positions = &pos3;
  EXPECT_NE(gemm_->qk_norm_rope_refusal(x, w, nullptr, y, e).find("positions: int64 [4]"),
            std::string::npos);
  e.positions = &pos4;
  e.cos = &cos32;
  EXPECT_NE(gemm_->qk_norm_rope_refusal(x, w, nullptr, y, e).find("cos and sin"),
            std::string::npos);
  e.cos = &cos_t;
  EXPECT_THROW(gemm_->run_qk_norm_rope(*stream_, x, w, nullptr, y, e,
                                       skinny_epilogue_variants(SkinnyEpilogue::kSiluAndMul)[0]),
               Error);
}

// Two bf16 device results of the same math, rounded at different steps (the folded norm rounds
// W diag(w) where the norm written out rounds its output; SiluAndMul's product and the q/k norm's
// random weights and RoPE then stack a few output ulps): each element within 5e-2 of its
// magnitude plus the reference's RMS, and the whole within 8e-3 relative RMS. Measured on the
// H200: up to 2.7e-2 and 4.8e-3; a float64 model of the 64 x 1024 SiluAndMul case with these
// distributions reaches 2.45e-2 and 4.1e-3. An unfolded weight is off by its factor everywhere,
// a wrong row factor by the whole RMS.
void expect_close(const std::vector<uint16_t>& got, const std::vector<uint16_t>& ref,
                  const std::string& what) {
  ASSERT_EQ(got.size(), ref.size()) << what;
  double err2 = 0, ref2 = 0;
  for (uint16_t r : ref) ref2 += static_cast<double>(f(r)) * f(r);
  const double rms = std::sqrt(ref2 / std::max<size_t>(ref.size(), 1));
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double g = f(got[i]), r = f(ref[i]);
    err2 += (g - r) * (g - r);
    if (!(std::fabs(g - r) <= 5e-2 * (std::fabs(r) + rms)) && ++bad <= 3)
      ADD_FAILURE() << what << ": element " << i << " = " << g << ", the unfused kernel's " << r;
  }
  EXPECT_EQ(bad, 0) << what;
  EXPECT_LT(std::sqrt(err2 / std::max(ref2, 1e-30)), 8e-3) << what;
}

std::vector<uint16_t> download_bf16(const DeviceTensor& t, DeviceStream& s) {
  std::vector<uint16_t> v(static_cast<size_t>(t.numel()));
  t.download(s, v.data(), v.size() * 2);
  s.synchronize();
  return v;
}

// The residual add + RMSNorm folded into the GEMMs around it (Hopper). run_residual: h += bf16(x .
// W^T) in place, against float64 (h's bf16 sum of the bf16 product), and each 64-column tile's
// row sums of squares of the new h; the SiluAndMul and q/k norm + RoPE GEMMs with the folded norm,
// reading that h with the norm's weight folded into theirs (bf16(W w), on the host), against the
// same GEMMs without it on the norm written out on the host (bf16(h rsqrt(mean h^2 + eps) w) in
// float64 from the device's h) and the plain weights. Every variant and split, then the pair
// captured in a graph and replayed on new inputs; what the fold refuses.
TEST_F(GpuSkinnyGemm, FoldedNormMatchesTheNormWrittenOut) {
  DeviceTensor ss_small(*pool_, {64}, kF32), x4(*pool_, {4, 128}, kBF16),
      w4(*pool_, {128, 128}, kBF16), h4(*pool_, {4, 128}, kBF16);
  if (!gemm_->has_wgmma()) {
    EXPECT_NE(gemm_->residual_refusal(x4, w4, nullptr, h4, ss_small).find("Hopper"),
              std::string::npos);
    return;
  }
  EXPECT_NE(gemm_->residual_refusal(x4, w4, nullptr, h4, ss_small).find("at least 2 tiles"),
            std::string::npos);
  std::mt19937 rng(20261204);
  const float eps = 1e-6f;
  auto bf = [](double v) { return static_cast<double>(f(kh_float_to_bf16_bits((float)v))); };
  struct Shape {
    int64_t M, H, Kp, F;  // rows, the residual's width, the producer's K, the MLP's width
  };
  for (const Shape& sh :
       {Shape{1, 128, 128, 40}, Shape{5, 320, 448, 136}, Shape{64, 1024, 2048, 3072}}) {
    const int64_t M = sh.M, H = sh.H, tiles = (H + 63) / 64;
    const std::string shape =
        std::to_string(M) + "x" + std::to_string(H) + "x" + std::to_string(sh.Kp);
    Operands o = make(Problem{M, H, sh.Kp, false}, rng);  // x [M, Kp], W [H, Kp], h in y
    std::vector<uint16_t> h0 = random_bf16(static_cast<size_t>(M * H), rng);
    DeviceTensor ss(*pool_, {tiles, 64}, kF32);
    const std::vector<uint16_t> nw = random_bf16(static_cast<size_t>(H), rng);
    auto reset_h = [&] {
      poison(o);
      o.dy.upload(*stream_, h0.data(), h0.size() * 2);
      stream_->memset(ss.data(), 0xFF, ss.bytes());
    };
    // The new h against float64 and the guard row; the tiles' sums of squares against the new h;
    // returns the new h.
    auto check_residual = [&](const std::string& what) {
      std::vector<uint16_t> h((M + 1) * H);
      std::vector<float> sums(static_cast<size_t>(tiles * 64));
      o.dy_all.download(*stream_, h.data(), h.size() * 2);
      ss.download(*stream_, sums.data(), sums.size() * 4);
      stream_->synchronize();
      int bad = 0;
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < H; ++n) {
          double dot = 0;
          for (int64_t k = 0; k < sh.Kp; ++k)
            dot += static_cast<double>(f(o.x[m * sh.Kp + k])) * f(o.w[n * sh.Kp + k]);
          const double ref = bf(f(h0[m * H + n]) + bf(dot)), got = f(h[m * H + n]);
          if (!(std::fabs(got - ref) <= 1e-3 + 8e-3 * (std::fabs(dot) + std::fabs(ref))) &&
              ++bad <= 3)
            ADD_FAILURE() << what << ": h[" << m << "][" << n << "] = " << got << ", reference "
                          << ref;
        }
      EXPECT_EQ(bad, 0) << what;
      for (int64_t t = 0; t < tiles; ++t)
        for (int64_t m = 0; m < M; ++m) {
          double want = 0;
          for (int64_t n = t * 64; n < std::min(H, t * 64 + 64); ++n)
            want += static_cast<double>(f(h[m * H + n])) * f(h[m * H + n]);
          const double got = sums[t * 64 + m];
          if (!(std::fabs(got - want) <= 1e-6 + 1e-5 * want) && ++bad <= 6)
            ADD_FAILURE() << what << ": tile " << t << " row " << m << " sum of squares " << got
                          << ", reference " << want;
        }
      for (int64_t n = 0; n < H; ++n)
        if (!std::isnan(f(h[M * H + n]))) {
          ADD_FAILURE() << what << ": the guard row was written at column " << n;
          break;
        }
      h.resize(M * H);
      return h;
    };
    ASSERT_EQ(gemm_->residual_refusal(o.dx, o.dw, nullptr, o.dy, ss), "");
    for (SkinnyPlan plan : skinny_epilogue_variants(SkinnyEpilogue::kResidual))
      for (int splits : {1, 2, 4, 8}) {
        if (splits > sh.Kp / 64) continue;
        plan.splits = splits;
        reset_h();
        gemm_->run_residual(*stream_, o.dx, o.dw, nullptr, o.dy, ss, plan);
        check_residual(shape + ", " + plan.kernel() + ", " + std::to_string(splits) + " splits");
        if (HasFailure()) return;
      }
    reset_h();
    EXPECT_EQ(gemm_->run_residual(*stream_, o.dx, o.dw, nullptr, o.dy, ss), tiles);
    const std::vector<uint16_t> h = check_residual(shape + ", default plan");
    if (HasFailure()) return;
    // The norm written out: xn = bf16(h rstd w).
    auto norm_of = [&](const std::vector<uint16_t>& hv) {
      std::vector<uint16_t> xn(hv.size());
      for (int64_t m = 0; m < M; ++m) {
        double s2 = 0;
        for (int64_t n = 0; n < H; ++n)
          s2 += static_cast<double>(f(hv[m * H + n])) * f(hv[m * H + n]);
        const double rstd = 1.0 / std::sqrt(s2 / static_cast<double>(H) + eps);
        for (int64_t n = 0; n < H; ++n)
          xn[m * H + n] =
              kh_float_to_bf16_bits(static_cast<float>(f(hv[m * H + n]) * rstd * f(nw[n])));
      }
      DeviceTensor t(*pool_, {M, H}, kBF16);
      t.upload(*stream_, xn.data(), xn.size() * 2);
      return t;
    };
    const DeviceTensor xn = norm_of(h);
    const SkinnyPrenorm pre{&ss, static_cast<int>(tiles), eps};
    // W diag(w), rounded once: what DeviceKernels::scale_columns folds.
    auto folded = [&](const std::vector<uint16_t>& w, int64_t rows) {
      std::vector<uint16_t> wf(w.size());
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t k = 0; k < H; ++k)
          wf[r * H + k] = kh_float_to_bf16_bits(f(w[r * H + k]) * f(nw[k]));
      DeviceTensor t(*pool_, {rows, H}, kBF16);
      t.upload(*stream_, wf.data(), wf.size() * 2);
      return t;
    };
    // SiluAndMul: gate/up [2 F, H].
    const std::vector<uint16_t> wgu = random_bf16(static_cast<size_t>(2 * sh.F * H), rng, 0.05f);
    DeviceTensor wgu_t(*pool_, {2 * sh.F, H}, kBF16), y_ref(*pool_, {M, sh.F}, kBF16),
        y(*pool_, {M, sh.F}, kBF16);
    wgu_t.upload(*stream_, wgu.data(), wgu.size() * 2);
    const DeviceTensor wgu_f = folded(wgu, 2 * sh.F);
    ASSERT_EQ(gemm_->silu_refusal(o.dy, wgu_f, y, &pre), "");
    gemm_->run_silu_and_mul(*stream_, xn, wgu_t, y_ref);
    const std::vector<uint16_t> silu_ref = download_bf16(y_ref, *stream_);
    gemm_->run_silu_and_mul(*stream_, o.dy, wgu_f, y, &pre);
    expect_close(download_bf16(y, *stream_), silu_ref, shape + ", SiluAndMul, default plan");
    for (SkinnyPlan plan : skinny_epilogue_variants(SkinnyEpilogue::kSiluAndMul, true))
      for (int splits : {1, 2, 4, 8}) {
        if (splits > H / 64) continue;
        plan.splits = splits;
        stream_->memset(y.data(), 0xFF, y.bytes());
        gemm_->run_silu_and_mul(*stream_, o.dy, wgu_f, y, plan, &pre);
        expect_close(download_bf16(y, *stream_), silu_ref,
                     shape + ", " + plan.kernel() + ", " + std::to_string(splits) + " splits");
        if (HasFailure()) return;
      }
    // q/k norm + RoPE: 2 query, 1 key and 1 value heads of 128.
    constexpr int64_t D = kQkHeadDim, P = 16;
    std::vector<float> cs(P * D / 2), sn(cs.size());
    std::uniform_real_distribution<float> angle(-3.f, 3.f);
    for (size_t i = 0; i < cs.size(); ++i) {
      const float a = angle(rng);
      cs[i] = std::cos(a);
      sn[i] = std::sin(a);
    }
    std::vector<int64_t> pos(static_cast<size_t>(M));
    for (auto& p : pos) p = static_cast<int64_t>(rng() % P);
    const std::vector<uint16_t> qw = random_bf16(D, rng), kw = random_bf16(D, rng),
                                wq = random_bf16(static_cast<size_t>(4 * D * H), rng, 0.05f);
    DeviceTensor cos_t(*pool_, {P, D / 2}, kF32), sin_t(*pool_, {P, D / 2}, kF32),
        pos_t(*pool_, {M}, kI64), qw_t(*pool_, {D}, kBF16), kw_t(*pool_, {D}, kBF16),
        wq_t(*pool_, {4 * D, H}, kBF16), q_ref(*pool_, {M, 4 * D}, kBF16),
        q(*pool_, {M, 4 * D}, kBF16);
    cos_t.upload(*stream_, cs.data(), cs.size() * 4);
    sin_t.upload(*stream_, sn.data(), sn.size() * 4);
    pos_t.upload(*stream_, pos.data(), pos.size() * 8);
    qw_t.upload(*stream_, qw.data(), D * 2);
    kw_t.upload(*stream_, kw.data(), D * 2);
    wq_t.upload(*stream_, wq.data(), wq.size() * 2);
    const DeviceTensor wq_f = folded(wq, 4 * D);
    const SkinnyQkNormRope e{&pos_t, &qw_t, &kw_t, eps, &cos_t, &sin_t, 2, 1};
    ASSERT_EQ(gemm_->qk_norm_rope_refusal(o.dy, wq_f, nullptr, q, e, &pre), "");
    gemm_->run_qk_norm_rope(*stream_, xn, wq_t, nullptr, q_ref, e);
    const std::vector<uint16_t> qknr_ref = download_bf16(q_ref, *stream_);
    gemm_->run_qk_norm_rope(*stream_, o.dy, wq_f, nullptr, q, e, &pre);
    expect_close(download_bf16(q, *stream_), qknr_ref, shape + ", q/k norm, default plan");
    for (SkinnyPlan plan : skinny_epilogue_variants(SkinnyEpilogue::kQkNormRope, true))
      for (int splits : {1, 2, 4, 8}) {
        if (splits > H / 64) continue;
        plan.splits = splits;
        stream_->memset(q.data(), 0xFF, q.bytes());
        gemm_->run_qk_norm_rope(*stream_, o.dy, wq_f, nullptr, q, e, plan, &pre);
        expect_close(download_bf16(q, *stream_), qknr_ref,
                     shape + ", " + plan.kernel() + ", " + std::to_string(splits) + " splits");
        if (HasFailure()) return;
      }
    // The producer and consumer captured together, replayed on new x and h.
    reset_h();
    stream_->begin_capture();
    gemm_->run_residual(*stream_, o.dx, o.dw, nullptr, o.dy, ss);
    gemm_->run_silu_and_mul(*stream_, o.dy, wgu_f, y, &pre);
    DeviceGraph graph = DeviceGraph::end_capture(*stream_);
    o.x = random_bf16(o.x.size(), rng);
    o.dx.upload(*stream_, o.x.data(), o.x.size() * 2);
    h0 = random_bf16(h0.size(), rng);
    reset_h();
    graph.launch(*stream_);
    const std::vector<uint16_t> h2 = check_residual(shape + ", graph replay");
    const DeviceTensor xn2 = norm_of(h2);
    gemm_->run_silu_and_mul(*stream_, xn2, wgu_t, y_ref);
    expect_close(download_bf16(y, *stream_), download_bf16(y_ref, *stream_),
                 shape + ", graph replay, SiluAndMul");
  }
  // What the fold refuses: too few partials, partials of another width, a plan without its
  // operands.
  DeviceTensor yw(*pool_, {4, 64}, kBF16), ss2(*pool_, {2, 64}, kF32), ss4(*pool_, {4, 64}, kF32),
      wg(*pool_, {128, 128}, kBF16);
  const SkinnyPrenorm fits{&ss2, 2, eps}, few{&ss2, 3, eps}, other{&ss4, 3, eps};
  EXPECT_NE(gemm_->silu_refusal(x4, wg, yw, &few).find("at least 3 tiles"), std::string::npos);
  EXPECT_NE(gemm_->silu_refusal(x4, wg, yw, &other).find("cover 3 tiles of 64 columns"),
            std::string::npos);
  EXPECT_EQ(gemm_->silu_refusal(x4, wg, yw, &fits), "");
  EXPECT_THROW(
      gemm_->run_silu_and_mul(*stream_, x4, wg, yw,
                              skinny_epilogue_variants(SkinnyEpilogue::kSiluAndMul)[0], &fits),
      Error)
      << "a plan without the folded norm, given its operands";
  EXPECT_THROW(
      gemm_->run_silu_and_mul(*stream_, x4, wg, yw,
                              skinny_epilogue_variants(SkinnyEpilogue::kSiluAndMul, true)[0]),
      Error)
      << "a folded-norm plan without its operands";
}

// The LM head with the greedy argmax (Hopper): the bf16 logits against float64 (every column of
// the small shapes, every 37th of Qwen3's 151936 plus the planted ones), each row's token the first
// index of its largest written logit, with exact ties planted (row 0: two copies of one weight
// row far apart, in different CTAs; the last row: adjacent copies in one tile), the decode state
// advanced (tokens, positions, seq_lens, out_tokens at the step, the step) and the scratch left at
// zero: two launches and two replays of a captured launch, the last past out_tokens' columns.
// With the final RMSNorm folded in, the logits against the norm written out in float64. Then what
// it refuses.
TEST_F(GpuSkinnyGemm, HeadArgmaxWritesTheLogitsAndTheirFirstMaximum) {
  struct Shape {
    int64_t M, N, K;
  };
  DeviceTensor x4(*pool_, {4, 128}, kBF16), w4(*pool_, {64, 128}, kBF16),
      y4(*pool_, {4, 64}, kBF16);
  if (!gemm_->has_wgmma()) {
    EXPECT_NE(gemm_->head_argmax_refusal(x4, w4, y4, {}).find("Hopper"), std::string::npos);
    return;
  }
  std::mt19937 rng(20261205);
  const float eps = 1e-6f;
  for (const Shape& sh :
       {Shape{1, 8, 64}, Shape{7, 1032, 128}, Shape{33, 40000, 1024}, Shape{64, 151936, 1024}})
    for (bool norm : {false, true}) {
      const int64_t M = sh.M, N = sh.N, K = sh.K, cols = 5;
      const std::string what = std::to_string(M) + "x" + std::to_string(N) + "x" +
                               std::to_string(K) + (norm ? ", final norm folded" : "");
      SCOPED_TRACE(what);
      Operands o = make(Problem{M, N, K, false}, rng);
      // The planted maxima: bf16(x_row / 2) copied into two weight rows (logit ~ |x|^2 / 2,
      // far above the others' ~N(0, 0.05^2 K)); with the norm, of the normed row.
      const std::vector<uint16_t> nw = random_bf16(static_cast<size_t>(K), rng);
      std::vector<double> xn(static_cast<size_t>(M * K));  // the GEMM's x, as the kernel sees it
      std::vector<float> sums(static_cast<size_t>(((K + 63) / 64) * 64), 0.f);
      for (int64_t m = 0; m < M; ++m) {
        double ss = 0;
        for (int64_t k = 0; k < K; ++k)
          ss += static_cast<double>(f(o.x[m * K + k])) * f(o.x[m * K + k]);
        for (int64_t t = 0; t < K / 64; ++t) {
          float part = 0.f;
          for (int64_t k = t * 64; k < t * 64 + 64; ++k)
            part += f(o.x[m * K + k]) * f(o.x[m * K + k]);
          sums[t * 64 + m] = part;
        }
        const double rstd = 1.0 / std::sqrt(ss / K + eps);
        for (int64_t k = 0; k < K; ++k)
          xn[m * K + k] = norm ? f(kh_float_to_bf16_bits(
                                     static_cast<float>(f(o.x[m * K + k]) * rstd * f(nw[k]))))
                               : f(o.x[m * K + k]);
      }
      auto plant = [&](int64_t m, int64_t a, int64_t b) {
        for (int64_t k = 0; k < K; ++k)
          o.w[a * K + k] = o.w[b * K + k] =
              kh_float_to_bf16_bits(static_cast<float>(xn[m * K + k] / 2));
      };
      std::vector<int64_t> planted;
      if (N >= 16) {
        plant(0, 5, N - 3);
        planted = {5, N - 3};
        if (M > 1) {
          plant(M - 1, 10, 11);
          planted.insert(planted.end(), {10, 11});
        }
        o.dw.upload(*stream_, o.w.data(), o.w.size() * 2);
      }
      DeviceTensor ss(*pool_, {K / 64, 64}, kF32), dnw(*pool_, {K}, kBF16);
      ss.upload(*stream_, sums.data(), sums.size() * 4);
      dnw.upload(*stream_, nw.data(), nw.size() * 2);
      const SkinnyHeadNorm head_norm{{&ss, static_cast<int>(K / 64), eps}, &dnw};
      // The decode state.
      std::vector<int64_t> pos0(M), tok_none(M, -7), out0(static_cast<size_t>(M * cols), -1);
      std::vector<int32_t> lens0(M);
      for (int64_t m = 0; m < M; ++m) {
        pos0[m] = 100 + m;
        lens0[m] = static_cast<int32_t>(101 + m);
      }
      const int32_t step0 = 2;
      DeviceTensor tokens(*pool_, {M}, kI64), positions(*pool_, {M}, kI64),
          seq_lens(*pool_, {M}, kI32), out(*pool_, {M, cols}, kI64), step(*pool_, {1}, kI32),
          scratch(*pool_, {greedy_scratch_elems(M)}, kI64);
      tokens.upload(*stream_, tok_none.data(), M * 8);
      positions.upload(*stream_, pos0.data(), M * 8);
      seq_lens.upload(*stream_, lens0.data(), M * 4);
      out.upload(*stream_, out0.data(), out0.size() * 8);
      step.upload(*stream_, &step0, 4);
      scratch.zero(*stream_);
      const SkinnyGreedy g{&tokens, &positions, &seq_lens, &out, &step, &scratch};
      ASSERT_EQ(gemm_->head_argmax_refusal(o.dx, o.dw, o.dy, g, norm ? &head_norm : nullptr), "");
      auto run = [&] {
        gemm_->run_head_argmax(*stream_, o.dx, o.dw, o.dy, g, norm ? &head_norm : nullptr);
      };
      std::vector<int64_t> want_tokens(M);
      // Launch i (0-based; 2 and 3 replay a graph): the logits and the state after it.
      auto check = [&](int i) {
        const std::string call = what + ", call " + std::to_string(i);
        std::vector<uint16_t> y = download_bf16(o.dy_all, *stream_);
        std::vector<int64_t> got_tokens(M), got_pos(M), got_out(out0.size()),
            got_scratch(scratch.numel());
        std::vector<int32_t> got_lens(M);
        int32_t got_step = 0;
        tokens.download(*stream_, got_tokens.data(), M * 8);
        positions.download(*stream_, got_pos.data(), M * 8);
        seq_lens.download(*stream_, got_lens.data(), M * 4);
        out.download(*stream_, got_out.data(), got_out.size() * 8);
        step.download(*stream_, &got_step, 4);
        scratch.download(*stream_, got_scratch.data(), got_scratch.size() * 8);
        stream_->synchronize();
        if (i == 0) {  // the logits (the same every call)
          int bad = 0;
          for (int64_t m = 0; m < M; ++m)
            for (int64_t n = 0; n < N; ++n) {
              if (N > 50000 && n % 37 &&
                  std::find(planted.begin(), planted.end(), n) == planted.end())
                continue;
              double ref = 0;
              for (int64_t k = 0; k < K; ++k) ref += xn[m * K + k] * f(o.w[n * K + k]);
              const double got = f(y[m * N + n]);
              if (!(std::fabs(got - ref) <= 2e-3 + 8e-3 * std::fabs(ref)) && ++bad <= 3)
                ADD_FAILURE() << call << ": logit [" << m << "][" << n << "] = " << got
                              << ", reference " << ref;
            }
          EXPECT_EQ(bad, 0) << call;
          for (int64_t n = 0; n < N; ++n)
            if (!std::isnan(f(y[M * N + n]))) {
              ADD_FAILURE() << call << ": the guard row was written at column " << n;
              break;
            }
          for (int64_t m = 0; m < M; ++m) {
            const uint16_t* row = y.data() + m * N;
            int64_t best = 0;
            for (int64_t n = 1; n < N; ++n)
              if (f(row[n]) > f(row[best])) best = n;
            want_tokens[m] = best;
          }
          if (!planted.empty()) {
            EXPECT_EQ(want_tokens[0], 5) << call << ": the planted maximum of row 0";
            if (M > 1) {
              EXPECT_EQ(want_tokens[M - 1], 10) << call << ": the planted maximum";
            }
          }
        }
        EXPECT_EQ(got_tokens, want_tokens) << call;
        for (int64_t m = 0; m < M; ++m) {
          EXPECT_EQ(got_pos[m], pos0[m] + i + 1) << call;
          EXPECT_EQ(got_lens[m], lens0[m] + i + 1) << call;
          for (int64_t c = 0; c < cols; ++c) {
            const bool written = c >= step0 && c <= step0 + i;
            EXPECT_EQ(got_out[m * cols + c], written ? want_tokens[m] : -1)
                << call << ": out_tokens[" << m << "][" << c << "]";
          }
        }
        EXPECT_EQ(got_step, step0 + i + 1) << call;
        EXPECT_EQ(got_scratch, std::vector<int64_t>(got_scratch.size(), 0)) << call << ": scratch";
      };
      run();
      check(0);
      if (HasFailure()) return;
      run();
      check(1);
      stream_->begin_capture();
      run();
      DeviceGraph graph = DeviceGraph::end_capture(*stream_);
      for (int i = 2; i < 4; ++i) {
        graph.launch(*stream_);
        check(i);
      }
      if (HasFailure()) return;
    }
  // Refusals, naming what is taken.
  DeviceTensor t4(*pool_, {4}, kI64), p4(*pool_, {4}, kI64), l4(*pool_, {4}, kI32),
      o4(*pool_, {4, 3}, kI64), s1(*pool_, {1}, kI32), sc(*pool_, {greedy_scratch_elems(4)}, kI64),
      l4wrong(*pool_, {4}, kI64);
  const SkinnyGreedy g4{&t4, &p4, &l4, &o4, &s1, &sc};
  EXPECT_EQ(gemm_->head_argmax_refusal(x4, w4, y4, g4), "");
  DeviceTensor xk(*pool_, {4, 2048}, kBF16), wk(*pool_, {64, 2048}, kBF16);
  EXPECT_NE(gemm_->head_argmax_refusal(xk, wk, y4, g4).find("K <= 1024"), std::string::npos);
  const SkinnyGreedy bad{&t4, &p4, &l4wrong, &o4, &s1, &sc};
  EXPECT_NE(gemm_->head_argmax_refusal(x4, w4, y4, bad).find("int32 seq_lens [4]"),
            std::string::npos);
  DeviceTensor ss2(*pool_, {2, 64}, kF32), nw_short(*pool_, {64}, kBF16);
  const SkinnyHeadNorm short_norm{{&ss2, 2, 1e-6f}, &nw_short};
  EXPECT_NE(gemm_->head_argmax_refusal(x4, w4, y4, g4, &short_norm).find("bfloat16 [128]"),
            std::string::npos);
  EXPECT_THROW(gemm_->run_head_argmax(*stream_, xk, wk, y4, g4), Error);
}

TEST_F(GpuSkinnyGemm, RefusesWhatItCannotTake) {
  DeviceTensor x(*pool_, {65, 128}, kBF16), w(*pool_, {64, 128}, kBF16), y(*pool_, {65, 64}, kBF16);
  EXPECT_FALSE(gemm_->fits(x, w, y)) << "65 rows";
  try {
    gemm_->run(*stream_, x, w, nullptr, y);
    FAIL() << "65 rows ran";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
    EXPECT_NE(std::string(e.what()).find("65 rows (1..64 taken)"), std::string::npos) << e.what();
  }
  DeviceTensor x32(*pool_, {4, 128}, kF32), y4(*pool_, {4, 64}, kBF16);
  EXPECT_FALSE(gemm_->fits(x32, w, y4)) << "fp32 x";
  DeviceTensor xk(*pool_, {4, 100}, kBF16), wk(*pool_, {64, 100}, kBF16);
  EXPECT_FALSE(gemm_->fits(xk, wk, y4)) << "K = 100";
  DeviceTensor x4(*pool_, {4, 128}, kBF16), bias(*pool_, {63}, kBF16);
  EXPECT_TRUE(gemm_->fits(x4, w, y4));
  EXPECT_THROW(gemm_->run(*stream_, x4, w, &bias, y4), Error) << "a bias of 63 for N = 64";
  EXPECT_THROW(gemm_->run(*stream_, x4, w, nullptr, y4, SkinnyPlan{64, 4, 3}), Error)
      << "3 splits of K = 128";
  // The wgmma kernels: the default on Hopper (and no more than a cluster of splits), refused
  // elsewhere.
  DeviceTensor xl(*pool_, {4, 1024}, kBF16), wl(*pool_, {64, 1024}, kBF16);
  EXPECT_EQ(gemm_->default_plan(64, 4096, 1024).wgmma, gemm_->has_wgmma());
  EXPECT_THROW(gemm_->run(*stream_, xl, wl, nullptr, y4, SkinnyPlan{64, 4, 9, true}), Error)
      << "9 splits: more than a cluster";
  if (!gemm_->has_wgmma()) {
    EXPECT_THROW(gemm_->run(*stream_, xl, wl, nullptr, y4, SkinnyPlan{64, 4, 1, true}), Error)
        << "a wgmma plan without wgmma";
  }
}

}  // namespace
}  // namespace kh::demo
