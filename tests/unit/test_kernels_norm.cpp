// The norm package's cpu ops, called through the real loader (preflight, dlopen, module table),
// against float64 references on fresh random inputs: RMSNorm, FusedAddRMSNorm and LayerNorm,
// forward, forward_train (statistics) and backward (dx, dweight, dbias), bf16/fp16/fp32, odd and
// long rows, one row, strided rows; outputs poisoned before each call. The float64 backward
// references are themselves checked against finite differences.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "tests/unit/test_kernels_norm_cases.h"
#include "tests/unit/test_kernels_util.h"

namespace kh::kernels_test {
namespace {

using namespace norm_cases;

double loss(const V& y, const V& dy) {
  double s = 0;
  for (size_t i = 0; i < y.size(); ++i) s += y[i] * dy[i];
  return s;
}

// Central differences of L = sum(forward(x, w, b) * dy) at a few coordinates.
TEST(KernelsNorm, Float64ReferenceMatchesFiniteDifferences) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> n01(0.0, 1.0);
  const int64_t rows = 3, cols = 7;
  const double eps = 1e-5, h = 1e-6;
  for (bool ln : {false, true}) {
    SCOPED_TRACE(ln ? "LayerNorm" : "RMSNorm");
    V x(rows * cols), dy(rows * cols), w(cols), b(cols);
    for (auto& v : x) v = n01(rng) + (ln ? 2.0 : 0.0);
    for (auto& v : dy) v = n01(rng);
    for (auto& v : w) v = 1.0 + 0.3 * n01(rng);
    for (auto& v : b) v = 0.3 * n01(rng);
    auto L = [&](const V& xx, const V& ww, const V& bb) {
      return loss(forward_ref(xx, ww, ln ? &bb : nullptr, eps, rows, cols, ln).y, dy);
    };
    BwdRef g = backward_ref(dy, x, w, eps, rows, cols, ln);
    for (int64_t i : {int64_t{0}, int64_t{5}, int64_t{11}, int64_t{20}}) {
      V xp = x, xm = x;
      xp[i] += h;
      xm[i] -= h;
      double fd = (L(xp, w, b) - L(xm, w, b)) / (2 * h);
      EXPECT_NEAR(g.dx[i], fd, 1e-6 * (1 + std::fabs(fd))) << "dx[" << i << "]";
    }
    for (int64_t c : {int64_t{0}, int64_t{3}, int64_t{6}}) {
      V wp = w, wm = w;
      wp[c] += h;
      wm[c] -= h;
      double fd = (L(x, wp, b) - L(x, wm, b)) / (2 * h);
      EXPECT_NEAR(g.dw[c], fd, 1e-6 * (1 + std::fabs(fd))) << "dw[" << c << "]";
      if (ln) {
        V bp = b, bm = b;
        bp[c] += h;
        bm[c] -= h;
        double fdb = (L(x, w, bp) - L(x, w, bm)) / (2 * h);
        EXPECT_NEAR(g.db[c], fdb, 1e-6 * (1 + std::fabs(fdb))) << "db[" << c << "]";
      }
    }
  }
}

class NormCpu : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { pkg_ = new Package("norm"); }
  static Package* pkg_;
};
Package* NormCpu::pkg_ = nullptr;

TEST_F(NormCpu, EveryLayerDtypeAndShapeMatchesFloat64) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  CpuExecutor cpu;
  for (int kind = 0; kind < 3; ++kind)
    for (int dtype : {kBF16, kFP16, kFP32})
      for (const Case& k : kCases) {
        run_case(cpu, *pkg_, kind, dtype, k, rng);
        if (HasFatalFailure()) return;
      }
}

// y may be x itself and residual_out residual itself.
TEST_F(NormCpu, InPlaceAliasing) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> n01(0.0, 1.0);
  for (int dtype : {kBF16, kFP32}) {
    const int64_t R = 4, C = 1000;
    HostTensor x(dtype, R, C, C + 8), res(dtype, R, C), w = vector_tensor(dtype, C);
    x.fill([&](int64_t, int64_t) { return n01(rng); });
    res.fill([&](int64_t, int64_t) { return n01(rng); });
    w.fill([&](int64_t, int64_t) { return 1.0 + 0.2 * n01(rng); });
    V sv = x.values();
    const V rv = res.values();
    for (size_t i = 0; i < sv.size(); ++i) sv[i] += rv[i];
    const FwdRef ref = forward_ref(sv, w.values(), nullptr, 1e-6, R, C, false);
    std::string err;
    ASSERT_EQ(pkg_->call("fused_add_rms_norm",
                         {targ(x.dl()), targ(res.dl()), targ(w.dl()), farg(1e-6), targ(x.dl()),
                          targ(res.dl())},
                         &err),
              KH_OK)
        << err;
    KH_EXPECT_CLOSE(x.values(), ref.y, tolerance(dtype), "y in x");
    KH_EXPECT_CLOSE(res.values(), sv, tolerance(dtype), "residual_out in residual");
  }
}

// The backward from the output (FusedAddRMSNormFromOutput) cannot tell xhat where the weight is
// 0 (y is 0 there): it takes 0, which changes that column of dx and dweight only; every other
// element is as from the residual, and nothing is NaN.
TEST_F(NormCpu, BackwardFromOutputTakesXhatZeroWhereTheWeightIsZero) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> n01(0.0, 1.0);
  const int64_t R = 6, C = 64, zero = 17;
  HostTensor x(kFP32, R, C), res(kFP32, R, C), w = vector_tensor(kFP32, C), y(kFP32, R, C);
  HostTensor res_out(kFP32, R, C), rstd = vector_tensor(kFP32, R), dy(kFP32, R, C);
  x.fill([&](int64_t, int64_t) { return n01(rng); });
  res.fill([&](int64_t, int64_t) { return n01(rng); });
  w.fill([&](int64_t, int64_t c) { return c == zero ? 0.0 : 1.0 + 0.2 * n01(rng); });
  dy.fill([&](int64_t, int64_t) { return n01(rng); });
  std::string err;
  ASSERT_EQ(pkg_->call("fused_add_rms_norm_train",
                       {targ(x.dl()), targ(res.dl()), targ(w.dl()), farg(1e-6), targ(y.dl()),
                        targ(res_out.dl()), targ(rstd.dl())},
                       &err),
            KH_OK)
      << err;
  V dx[2], dw[2];
  for (int from_y = 0; from_y < 2; ++from_y) {
    HostTensor dxt(kFP32, R, C), dwt = vector_tensor(kFP32, C), ws(kFP32, 2, C);
    ASSERT_EQ(
        pkg_->call(
            from_y ? "fused_add_rms_norm_backward_from_output" : "fused_add_rms_norm_backward",
            {targ(dy.dl()), targ(nullptr), targ(from_y ? y.dl() : res_out.dl()), targ(w.dl()),
             targ(rstd.dl()), targ(dxt.dl()), targ(dwt.dl()), targ(ws.dl())},
            &err),
        KH_OK)
        << err;
    dx[from_y] = dxt.values();
    dw[from_y] = dwt.values();
  }
  for (int64_t c = 0; c < C; ++c) {
    if (c == zero) {
      EXPECT_EQ(dw[1][c], 0.0);
      EXPECT_NE(dw[0][c], 0.0);  // from the residual, xhat is known
      for (int64_t r = 0; r < R; ++r) EXPECT_EQ(dx[1][r * C + c], 0.0) << "row " << r;
      continue;
    }
    EXPECT_NEAR(dw[1][c], dw[0][c], 1e-4 * (1 + std::fabs(dw[0][c]))) << "column " << c;
    for (int64_t r = 0; r < R; ++r)
      EXPECT_NEAR(dx[1][r * C + c], dx[0][r * C + c], 1e-4 * (1 + std::fabs(dx[0][r * C + c])))
          << "row " << r << " column " << c;
  }
}

// Leading dimensions collapse into rows when their strides allow it.
TEST_F(NormCpu, ThreeDimensionalInputsCollapseIntoRows) {
  const int64_t B = 2, T = 3, C = 40, S = 48;
  HostTensor x(kFP32, B * T, C, S), y(kFP32, B * T, C, S), w = vector_tensor(kFP32, C);
  std::mt19937_64 rng(fresh_seed());
  std::normal_distribution<double> n01(0.0, 1.0);
  x.fill([&](int64_t, int64_t) { return n01(rng); });
  w.fill([&](int64_t, int64_t) { return 1.0; });
  const FwdRef ref = forward_ref(x.values(), w.values(), nullptr, 1e-5, B * T, C, false);
  int64_t shape[3] = {B, T, C}, strides[3] = {T * S, S, 1};
  DLTensor x3 = *x.dl(), y3 = *y.dl();
  x3.ndim = y3.ndim = 3;
  x3.shape = y3.shape = shape;
  x3.strides = y3.strides = strides;
  std::string err;
  ASSERT_EQ(pkg_->call("rms_norm", {targ(&x3), targ(w.dl()), farg(1e-5), targ(&y3)}, &err), KH_OK)
      << err;
  KH_EXPECT_CLOSE(y.values(), ref.y, 1e-5, "y");
  // A batch stride that does not continue the row stride cannot be one row index.
  int64_t bad_strides[3] = {T * S + 1, S, 1};
  x3.strides = bad_strides;
  EXPECT_EQ(pkg_->call("rms_norm", {targ(&x3), targ(w.dl()), farg(1e-5), targ(&y3)}, &err),
            KH_ERR_UNSUPPORTED);
  EXPECT_NE(err.find("collapse"), std::string::npos) << err;
}

// Zero rows: nothing to write, and the weight gradient is zero.
TEST_F(NormCpu, ZeroRowsGiveZeroWeightGradients) {
  HostTensor x(kFP32, 0, 16), dy(kFP32, 0, 16), dx(kFP32, 0, 16), rstd = vector_tensor(kFP32, 0);
  HostTensor w = vector_tensor(kFP32, 16), dw = vector_tensor(kFP32, 16), ws(kFP32, 1, 16);
  w.fill([](int64_t, int64_t) { return 1.0; });
  std::string err;
  ASSERT_EQ(pkg_->call("rms_norm_backward",
                       {targ(dy.dl()), targ(x.dl()), targ(w.dl()), targ(rstd.dl()), targ(dx.dl()),
                        targ(dw.dl()), targ(ws.dl())},
                       &err),
            KH_OK)
      << err;
  for (double v : dw.values()) EXPECT_EQ(v, 0.0);
}

// Bad arguments are refused with a message naming the op and the argument.
TEST_F(NormCpu, BadArgumentsAreRefusedWithAMessage) {
  HostTensor x(kBF16, 4, 32), y(kBF16, 4, 32), y_short(kBF16, 4, 31), yf(kFP32, 4, 32);
  HostTensor w = vector_tensor(kBF16, 32), wf = vector_tensor(kFP32, 32);
  x.fill([](int64_t r, int64_t c) { return 0.1 * (r + c); });
  w.fill([](int64_t, int64_t) { return 1.0; });
  std::string err;
  auto expect_refusal = [&](int32_t status, int32_t want, const char* needle) {
    EXPECT_EQ(status, want) << err;
    EXPECT_NE(err.find(needle), std::string::npos) << "message: " << err;
  };
  expect_refusal(pkg_->call("rms_norm", {targ(x.dl()), targ(w.dl()), farg(1e-5)}, &err),
                 KH_ERR_INVALID_ARGUMENT, "expected 4");
  expect_refusal(
      pkg_->call("rms_norm", {targ(x.dl()), targ(wf.dl()), farg(1e-5), targ(y.dl())}, &err),
      KH_ERR_UNSUPPORTED, "weight");
  expect_refusal(
      pkg_->call("rms_norm", {targ(x.dl()), targ(w.dl()), farg(1e-5), targ(y_short.dl())}, &err),
      KH_ERR_INVALID_ARGUMENT, "tensor y");
  expect_refusal(
      pkg_->call("rms_norm", {targ(x.dl()), targ(w.dl()), farg(1e-5), targ(yf.dl())}, &err),
      KH_ERR_UNSUPPORTED, "y is float32");
  expect_refusal(
      pkg_->call("rms_norm", {targ(x.dl()), targ(w.dl()), farg(-1.0), targ(y.dl())}, &err),
      KH_ERR_INVALID_ARGUMENT, "eps");
  expect_refusal(
      pkg_->call("rms_norm", {targ(x.dl()), targ(w.dl()), targ(y.dl()), targ(y.dl())}, &err),
      KH_ERR_INVALID_ARGUMENT, "eps");
  // A non-contiguous last dimension.
  DLTensor xs = *x.dl();
  int64_t shape[2] = {4, 16}, strides[2] = {32, 2};
  xs.shape = shape;
  xs.strides = strides;
  DLTensor ys = *y.dl();
  ys.shape = shape;
  expect_refusal(pkg_->call("rms_norm", {targ(&xs), targ(w.dl()), farg(1e-5), targ(&ys)}, &err),
                 KH_ERR_UNSUPPORTED, "contiguous");
  // Tensors on two devices.
  DLTensor yc = *y.dl();
  yc.device = DLDevice{kDLCUDA, 0};
  expect_refusal(pkg_->call("rms_norm", {targ(x.dl()), targ(w.dl()), farg(1e-5), targ(&yc)}, &err),
                 KH_ERR_INVALID_ARGUMENT, "one device");
  // A workspace of the wrong width.
  HostTensor dx(kBF16, 4, 32), dw = vector_tensor(kBF16, 32), rstd = vector_tensor(kFP32, 4);
  HostTensor ws(kFP32, 2, 31);
  expect_refusal(pkg_->call("rms_norm_backward",
                            {targ(x.dl()), targ(x.dl()), targ(w.dl()), targ(rstd.dl()),
                             targ(dx.dl()), targ(dw.dl()), targ(ws.dl())},
                            &err),
                 KH_ERR_INVALID_ARGUMENT, "workspace");
}

}  // namespace
}  // namespace kh::kernels_test
