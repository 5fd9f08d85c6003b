// FusedLinearCrossEntropy cases shared by the cpu test (test_kernels_linear_ce.cpp) and the GPU
// test (tests/gpu/test_kernels_gpu_linear_ce.cpp), run through an Executor: random hidden and
// weight in a dtype, labels with ignore_index rows, a workspace sized for a given chunk, outputs
// poisoned; the loss, d_hidden and d_weight against a float64 reference on the stored inputs,
// then backward by an upstream gradient.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernels/softmax/linear_ce.h"
#include "tests/unit/test_kernels_rotary_cases.h"  // Int64Tensor
#include "tests/unit/test_kernels_util.h"

namespace kh::kernels_test::linear_ce_cases {

struct Case {
  int64_t n, v, h;
  int64_t chunk;     // rows per chunk the workspace is sized for (>= n: one chunk)
  int ignore_every;  // every k-th label is ignore_index (0: none; 1: all)
  bool fp32_grads;   // d_hidden and d_weight in fp32 (else the input dtype)
  int64_t pad;       // extra elements per row of hidden and d_hidden (strided rows)
};

inline constexpr int64_t kIgnore = -100;

struct Reference {
  double loss = 0;
  std::vector<double> d_hidden, d_weight;
};

// float64 reference of the mean loss and its gradients.
inline Reference reference(const std::vector<double>& hidden, const std::vector<double>& weight,
                           const std::vector<int64_t>& labels, int64_t n, int64_t v, int64_t h) {
  Reference r;
  r.d_hidden.assign(static_cast<size_t>(n * h), 0.0);
  r.d_weight.assign(static_cast<size_t>(v * h), 0.0);
  int64_t valid = 0;
  for (int64_t i = 0; i < n; ++i) valid += labels[i] != kIgnore;
  if (valid == 0) return r;
  std::vector<double> logits(static_cast<size_t>(v));
  for (int64_t i = 0; i < n; ++i) {
    if (labels[i] == kIgnore) continue;
    double m = -INFINITY;
    for (int64_t j = 0; j < v; ++j) {
      double s = 0;
      for (int64_t q = 0; q < h; ++q) s += hidden[i * h + q] * weight[j * h + q];
      logits[j] = s;
      m = std::max(m, s);
    }
    double sum = 0;
    for (int64_t j = 0; j < v; ++j) sum += std::exp(logits[j] - m);
    r.loss += (m + std::log(sum) - logits[labels[i]]) / valid;
    for (int64_t j = 0; j < v; ++j) {
      const double g = (std::exp(logits[j] - m) / sum - (j == labels[i] ? 1.0 : 0.0)) / valid;
      for (int64_t q = 0; q < h; ++q) {
        r.d_hidden[i * h + q] += g * weight[j * h + q];
        r.d_weight[j * h + q] += g * hidden[i * h + q];
      }
    }
  }
  return r;
}

// A workspace for `chunk` rows: lce_layout's head plus the rows, plus 256 for alignment.
inline HostTensor workspace_for(int64_t n, int64_t v, int dtype, int64_t chunk) {
  const int64_t bytes = 256 + khk::lce_round256(n * 4) + chunk * v * dtype_bytes(dtype) + 256;
  return vector_tensor(kFP32, (bytes + 3) / 4);
}

// Tolerances (relative L2) by input dtype: logits and dlogits are stored in it.
inline double loss_tolerance(int dtype) {
  return dtype == kFP32 ? 1e-5 : dtype == kBF16 ? 2e-2 : 3e-3;
}
inline double grad_tolerance(int dtype) {
  return dtype == kFP32 ? 1e-4 : dtype == kBF16 ? 3e-2 : 5e-3;
}

inline void run_case(Executor& ex, const Package& pkg, int dtype, const Case& k,
                     std::mt19937_64& rng) {
  SCOPED_TRACE(testing::Message() << "linear_cross_entropy " << dtype_name(dtype) << " N " << k.n
                                  << " V " << k.v << " H " << k.h << " chunk " << k.chunk
                                  << " ignore_every " << k.ignore_every << " fp32 grads "
                                  << k.fp32_grads << " pad " << k.pad);
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  HostTensor hidden(dtype, k.n, k.h, k.h + k.pad), weight(dtype, k.v, k.h);
  hidden.fill([&](int64_t, int64_t) { return dist(rng); });
  weight.fill([&](int64_t, int64_t) { return dist(rng); });
  std::vector<int64_t> labels(static_cast<size_t>(k.n));
  std::uniform_int_distribution<int64_t> label(0, k.v - 1);
  for (int64_t i = 0; i < k.n; ++i)
    labels[i] = k.ignore_every && i % k.ignore_every == 0 ? kIgnore : label(rng);
  const Reference want = reference(hidden.values(), weight.values(), labels, k.n, k.v, k.h);
  const int gdt = k.fp32_grads ? kFP32 : dtype;
  HostTensor ws = workspace_for(k.n, k.v, dtype, k.chunk);
  HostTensor loss = vector_tensor(kFP32, 1), loss_eval = vector_tensor(kFP32, 1);
  HostTensor d_hidden(gdt, k.n, k.h, k.h + k.pad), d_weight(gdt, k.v, k.h);
  rope_cases::Int64Tensor lab(labels);
  std::string err;
  ASSERT_EQ(ex.call(pkg, "linear_cross_entropy_train",
                    {targ(ex.arg(hidden)), targ(ex.arg(weight)), targ(lab.view(ex)), iarg(kIgnore),
                     targ(ex.arg(ws)), targ(ex.arg(loss)), targ(ex.arg(d_hidden)),
                     targ(ex.arg(d_weight))},
                    &err),
            KH_OK)
      << err;
  KH_EXPECT_CLOSE(loss.values(), std::vector<double>{want.loss}, loss_tolerance(dtype), "loss");
  if (want.loss == 0) {
    EXPECT_EQ(loss.get(0, 0), 0.0) << "every token ignored: loss 0";
  }
  const double dtol = grad_tolerance(dtype);
  KH_EXPECT_CLOSE_SCALED(d_hidden.values(), want.d_hidden, 1e-3, dtol, "d_hidden");
  KH_EXPECT_CLOSE_SCALED(d_weight.values(), want.d_weight, 1e-3, dtol, "d_weight");
  EXPECT_TRUE(d_hidden.gaps_untouched()) << "d_hidden: the row padding was written";
  // Eval gives the same loss.
  ASSERT_EQ(ex.call(pkg, "linear_cross_entropy",
                    {targ(ex.arg(hidden)), targ(ex.arg(weight)), targ(lab.view(ex)), iarg(kIgnore),
                     targ(ex.arg(ws)), targ(ex.arg(loss_eval))},
                    &err),
            KH_OK)
      << err;
  EXPECT_NEAR(loss_eval.get(0, 0), loss.get(0, 0), 1e-6 * (1 + std::fabs(want.loss)));
  // Backward: both gradients times the upstream gradient.
  const std::vector<double> dh = d_hidden.values(), dw = d_weight.values();
  HostTensor grad = vector_tensor(kFP32, 1);
  grad.set(0, 0, -2.5);
  ASSERT_EQ(ex.call(pkg, "linear_cross_entropy_backward",
                    {targ(ex.arg(grad)), targ(ex.arg(d_hidden)), targ(ex.arg(d_weight))}, &err),
            KH_OK)
      << err;
  std::vector<double> dh2 = dh, dw2 = dw;
  for (double& x : dh2) x *= -2.5;
  for (double& x : dw2) x *= -2.5;
  KH_EXPECT_CLOSE_SCALED(d_hidden.values(), dh2, 1e-6, gdt == kFP32 ? 1e-6 : 1e-2, "backward");
  KH_EXPECT_CLOSE_SCALED(d_weight.values(), dw2, 1e-6, gdt == kFP32 ? 1e-6 : 1e-2, "backward");
}

// Small shapes: odd N and V, several chunks and one, ignored rows, strided hidden rows.
inline const Case kCases[] = {
    {37, 301, 24, 8, 3, true, 0},   // 5 chunks (the last of 5 rows), every 3rd token ignored
    {37, 301, 24, 64, 3, true, 5},  // one chunk, strided rows
    {16, 128, 32, 5, 0, false, 0},  // gradients in the input dtype
    {37, 301, 24, 8, 3, false, 0},  // input-dtype d_weight summed over 5 chunks (the bridge's)
    {9, 77, 16, 4, 1, true, 0},     // every token ignored: loss 0, zero gradients
    {1, 50, 8, 1, 0, true, 0},      // one token
};

}  // namespace kh::kernels_test::linear_ce_cases
