// Test cases of the softmax package shared by the cpu tests (tests/unit/test_kernels_rotary_softmax.cpp)
// and the GPU tests (tests/gpu/test_kernels_gpu_rotary_softmax.cpp): float64 references of softmax, its
// backward and cross-entropy with its gradient, and functions that run them for a dtype and
// shape on an Executor (outputs poisoned before each call, strided rows).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "tests/unit/test_kernels_rotary_cases.h"  // Int64Tensor
#include "tests/unit/test_kernels_util.h"

namespace kh::kernels_test::softmax_cases {

using V = std::vector<double>;
using rope_cases::Int64Tensor;

struct Case {
  int64_t rows, cols, pad;  // pad: extra elements between rows of the input
};

inline const Case kSoftmaxCases[] = {{1, 1, 0},    {3, 7, 5},    {17, 64, 0},   {5, 4095, 3},
                                     {4, 4097, 0}, {6, 4096, 8}, {1, 65544, 0}, {2, 65537, 1},
                                     {33, 256, 0}, {300, 8, 0}};
inline const Case kCeCases[] = {{1, 1, 0},     {3, 7, 5},     {17, 64, 0},    {5, 4095, 3},
                                {6, 4096, 8},  {40, 1000, 0}, {3, 128256, 0}, {2, 128257, 1},
                                {1, 32000, 0}, {300, 8, 0}};

inline V softmax_ref(const V& x, int64_t rows, int64_t cols) {
  V y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double m = -INFINITY, s = 0;
    for (int64_t c = 0; c < cols; ++c) m = std::max(m, x[r * cols + c]);
    for (int64_t c = 0; c < cols; ++c) s += std::exp(x[r * cols + c] - m);
    for (int64_t c = 0; c < cols; ++c) y[r * cols + c] = std::exp(x[r * cols + c] - m) / s;
  }
  return y;
}

// Random logits with a shifted row (exp would overflow without the max) and a peaked row.
inline void fill_logits(HostTensor& x, std::mt19937_64& rng, double sigma) {
  std::normal_distribution<double> n(0.0, sigma);
  x.fill([&](int64_t r, int64_t c) {
    double v = n(rng);
    if (r == 1) v += 90.0;
    if (r == 2 && c == 0) v += 20.0;
    return v;
  });
}

inline void run_softmax_case(Executor& ex, const Package& pkg, int dtype, const Case& k,
                             std::mt19937_64& rng) {
  SCOPED_TRACE(testing::Message() << "softmax " << dtype_name(dtype) << " rows " << k.rows
                                  << " cols " << k.cols << " pad " << k.pad);
  const int64_t R = k.rows, C = k.cols;
  const double tol = tolerance(dtype);
  HostTensor x(dtype, R, C, C + k.pad);
  fill_logits(x, rng, 3.0);
  const V yref = softmax_ref(x.values(), R, C);
  HostTensor y(dtype, R, C, C + k.pad + 2);
  y.poison();
  std::string err;
  KH_EXPECT_OK(ex.call(pkg, "softmax", {targ(ex.arg(x)), targ(ex.arg(y))}, &err), err);
  KH_EXPECT_CLOSE(y.values(), yref, tol, "y");
  EXPECT_TRUE(y.gaps_untouched()) << "y: elements between rows were written";

  // Backward from the stored y (what the caller keeps) and a random dy.
  std::normal_distribution<double> n(0.0, 1.0);
  HostTensor ys(dtype, R, C, C + 1), dy(dtype, R, C, C + k.pad + 1), dx(dtype, R, C, C + 3);
  ys.fill([&](int64_t r, int64_t c) { return yref[r * C + c]; });
  dy.fill([&](int64_t, int64_t) { return n(rng); });
  const V yv = ys.values(), dyv = dy.values();
  V dxref(R * C), terms(R * C);
  for (int64_t r = 0; r < R; ++r) {
    double dot = 0;
    for (int64_t c = 0; c < C; ++c) dot += dyv[r * C + c] * yv[r * C + c];
    for (int64_t c = 0; c < C; ++c) {
      dxref[r * C + c] = yv[r * C + c] * (dyv[r * C + c] - dot);
      terms[r * C + c] = yv[r * C + c] * dyv[r * C + c];
    }
  }
  dx.poison();
  KH_EXPECT_OK(ex.call(pkg, "softmax_backward",
                       {targ(ex.arg(dy)), targ(ex.arg(ys)), targ(ex.arg(dx))}, &err),
               err);
  KH_EXPECT_CLOSE_SCALED(dx.values(), dxref, l2_norm(terms), tol, "dx");
  EXPECT_TRUE(dx.gaps_untouched()) << "dx: elements between rows were written";
}

inline constexpr int64_t kIgnore = -100;

// cross_entropy, cross_entropy_train (fused gradient) and cross_entropy_backward. Every third
// row is ignored; with 4+ rows, row 2 has a target outside the vocabulary (NaN loss).
inline void run_ce_case(Executor& ex, const Package& pkg, int dtype, const Case& k,
                        std::mt19937_64& rng) {
  SCOPED_TRACE(testing::Message() << "cross_entropy " << dtype_name(dtype) << " rows " << k.rows
                                  << " vocab " << k.cols << " pad " << k.pad);
  const int64_t R = k.rows, C = k.cols;
  HostTensor x(dtype, R, C, C + k.pad);
  fill_logits(x, rng, 2.0);
  std::uniform_int_distribution<int64_t> td(0, C - 1);
  std::vector<int64_t> tv;
  for (int64_t r = 0; r < R; ++r) tv.push_back(r % 3 == 2 && R > 1 ? kIgnore : td(rng));
  if (R >= 4) tv[3] = C;  // outside [0, vocab)
  const V xv = x.values();
  const V p = softmax_ref(xv, R, C);
  const double scale = 0.37;
  V lref(R, 0.0), gref(R * C, 0.0);
  for (int64_t r = 0; r < R; ++r) {
    if (tv[r] == kIgnore) continue;
    double m = -INFINITY, s = 0;
    for (int64_t c = 0; c < C; ++c) m = std::max(m, xv[r * C + c]);
    for (int64_t c = 0; c < C; ++c) s += std::exp(xv[r * C + c] - m);
    const bool in_range = tv[r] >= 0 && tv[r] < C;
    lref[r] = in_range ? m + std::log(s) - xv[r * C + tv[r]] : NAN;
    for (int64_t c = 0; c < C; ++c)
      gref[r * C + c] = (p[r * C + c] - (c == tv[r] ? 1.0 : 0.0)) * scale;
  }
  // Loss from exact stored logits: only fp32 arithmetic separates it from float64.
  auto check_loss = [&](HostTensor& loss) {
    V got = loss.values(), want = lref;
    for (int64_t r = 0; r < R; ++r) {
      if (tv[r] == kIgnore) {
        EXPECT_EQ(got[r], 0.0) << "ignored row " << r;
      }
      if (std::isnan(want[r])) {
        EXPECT_TRUE(std::isnan(got[r])) << "row " << r << " has an out-of-range target";
        got[r] = want[r] = 0;
      }
    }
    KH_EXPECT_CLOSE(got, want, 2e-5, "loss");
  };
  std::string err;
  for (int train = 0; train < 2; ++train) {
    Int64Tensor targets(tv);
    HostTensor loss = vector_tensor(kFP32, R);
    loss.poison();
    HostTensor dl(dtype, R, C, C + 2);
    dl.poison();
    std::vector<kh_arg_t> a = {targ(ex.arg(x)), targ(targets.view(ex)), iarg(kIgnore)};
    if (train) a.push_back(farg(scale));
    a.push_back(targ(ex.arg(loss)));
    if (train) a.push_back(targ(ex.arg(dl)));
    KH_EXPECT_OK(ex.call(pkg, train ? "cross_entropy_train" : "cross_entropy", a, &err), err);
    check_loss(loss);
    if (!train) continue;
    const V g = dl.values();
    KH_EXPECT_CLOSE(g, gref, tolerance(dtype), "dlogits");
    for (int64_t r = 0; r < R; ++r) {
      if (tv[r] != kIgnore) continue;
      for (int64_t c = 0; c < C; ++c) {
        ASSERT_EQ(g[r * C + c], 0.0) << "ignored row " << r;
      }
    }
    EXPECT_TRUE(dl.gaps_untouched());

    // Backward: dlogits (in place) times a per-token loss gradient.
    std::normal_distribution<double> n(0.0, 1.0);
    HostTensor dloss = vector_tensor(kFP32, R);
    dloss.fill([&](int64_t, int64_t) { return n(rng); });
    const V dlv = dloss.values();
    V bref(R * C);
    for (int64_t r = 0; r < R; ++r)
      for (int64_t c = 0; c < C; ++c) bref[r * C + c] = g[r * C + c] * dlv[r];
    KH_EXPECT_OK(
        ex.call(pkg, "cross_entropy_backward", {targ(ex.arg(dloss)), targ(ex.arg(dl))}, &err), err);
    KH_EXPECT_CLOSE(dl.values(), bref, tolerance(dtype), "dlogits after backward");
    EXPECT_TRUE(dl.gaps_untouched());
  }
}

}  // namespace kh::kernels_test::softmax_cases
