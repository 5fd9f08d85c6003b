// Test cases of the activation package shared by the cpu tests
// (tests/unit/test_kernels_activation.cpp) and the GPU tests (tests/gpu/test_kernels_gpu.cpp):
// float64 activations and derivatives, and one function that runs an op's forward and backward
// (for SiluAndMul also SiluAndMulRecompute's backward) for a dtype and shape on an Executor.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "tests/unit/test_kernels_util.h"

namespace kh::kernels_test::act_cases {

using V = std::vector<double>;

enum Op { kSiluAndMul, kGeluAndMulErf, kGeluAndMulTanh, kSilu, kGeluTanh };
inline const char* op_name(int op) {
  const char* n[] = {"SiluAndMul", "GeluAndMul(erf)", "GeluAndMul(tanh)", "Silu", "GeluTanh"};
  return n[op];
}
inline bool is_glu(int op) {
  return op <= kGeluAndMulTanh;
}

// float64 activations and derivatives.
inline double silu(double g) {
  return g / (1.0 + std::exp(-g));
}
inline double gelu_erf(double g) {
  return 0.5 * g * (1.0 + std::erf(g / std::sqrt(2.0)));
}
inline double gelu_tanh(double g) {
  const double k = std::sqrt(2.0 / M_PI);
  return 0.5 * g * (1.0 + std::tanh(k * (g + 0.044715 * g * g * g)));
}
inline double act(int op, double g) {
  return op == kSiluAndMul || op == kSilu ? silu(g)
         : op == kGeluAndMulErf           ? gelu_erf(g)
                                          : gelu_tanh(g);
}
inline double dact(int op, double g) {
  if (op == kSiluAndMul || op == kSilu) {
    const double s = 1.0 / (1.0 + std::exp(-g));
    return s * (1.0 + g * (1.0 - s));
  }
  if (op == kGeluAndMulErf)
    return 0.5 * (1.0 + std::erf(g / std::sqrt(2.0))) +
           g * std::exp(-0.5 * g * g) / std::sqrt(2 * M_PI);
  const double k = std::sqrt(2.0 / M_PI), u = k * (g + 0.044715 * g * g * g), t = std::tanh(u);
  return 0.5 * (1.0 + t) + 0.5 * g * (1.0 - t * t) * k * (1.0 + 3.0 * 0.044715 * g * g);
}

struct Case {
  int64_t rows, d, pad;
};
// d = output columns. Odd sizes, one row, 65536+ columns, strided rows.
inline const Case kCases[] = {{1, 1, 0},    {3, 7, 5},    {17, 64, 0},   {5, 4095, 3},
                              {4, 4097, 0}, {6, 4096, 8}, {1, 65544, 0}, {2, 65537, 1},
                              {33, 256, 0}, {300, 8, 0}};

// Op names and the leading attribute of the gelu_and_mul ops.
struct OpCall {
  const char* fwd;
  const char* bwd;
  int approximate;  // -1: no attribute
};
inline OpCall op_call(int op) {
  switch (op) {
    case kSiluAndMul:
      return {"silu_and_mul", "silu_and_mul_backward", -1};
    case kGeluAndMulErf:
      return {"gelu_and_mul", "gelu_and_mul_backward", 0};
    case kGeluAndMulTanh:
      return {"gelu_and_mul", "gelu_and_mul_backward", 1};
    case kSilu:
      return {"silu", "silu_backward", -1};
    default:
      return {"gelu_tanh", "gelu_tanh_backward", -1};
  }
}

inline void run_case(Executor& ex, const Package& pkg, int op, int dtype, const Case& k,
                     std::mt19937_64& rng) {
  SCOPED_TRACE(testing::Message() << op_name(op) << " " << dtype_name(dtype) << " rows " << k.rows
                                  << " d " << k.d << " pad " << k.pad);
  const bool glu = is_glu(op);
  const int64_t R = k.rows, d = k.d, in_cols = glu ? 2 * d : d;
  const double tol = tolerance(dtype);
  std::normal_distribution<double> n(0.0, 2.0);
  // Fixed extremes first in each row (silu/gelu tails, exp overflow), then random values.
  const double extremes[] = {-30.0, 30.0, -8.0, 8.0, 0.0, -1e-3};
  HostTensor x(dtype, R, in_cols, in_cols + k.pad);
  x.fill([&](int64_t, int64_t c) { return c < 6 && d >= 64 ? extremes[c] : n(rng); });
  const V xv = x.values();
  // Errors are measured against max(|ref|, |terms|): in the left tails act(g) is far smaller
  // than g, and fp16 stores such values only to its subnormal spacing.
  V yref(R * d), yterms(R * d);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < d; ++c) {
      const double g = xv[r * in_cols + c], up = glu ? xv[r * in_cols + d + c] : 1.0;
      yref[r * d + c] = act(op, g) * up;
      yterms[r * d + c] = g * up;
    }
  const OpCall call = op_call(op);
  std::string err;
  HostTensor y(dtype, R, d, d + k.pad + 2);
  y.poison();
  std::vector<kh_arg_t> a = {targ(ex.arg(x))};
  if (call.approximate >= 0) a.push_back(iarg(call.approximate));
  a.push_back(targ(ex.arg(y)));
  KH_EXPECT_OK(ex.call(pkg, call.fwd, a, &err), err);
  KH_EXPECT_CLOSE_SCALED(y.values(), yref, l2_norm(yterms), tol, "y");
  EXPECT_TRUE(y.gaps_untouched()) << "y: elements between rows were written";

  HostTensor dy(dtype, R, d, d + k.pad + 1), dx(dtype, R, in_cols, in_cols + k.pad + 3);
  dy.fill([&](int64_t, int64_t) { return n(rng) * 0.5; });
  const V dyv = dy.values();
  V dxref(R * in_cols), dxterms(R * in_cols);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t c = 0; c < d; ++c) {
      const double g = xv[r * in_cols + c], e = dyv[r * d + c];
      if (glu) {
        const double up = xv[r * in_cols + d + c];
        dxref[r * in_cols + c] = e * up * dact(op, g);
        dxref[r * in_cols + d + c] = e * act(op, g);
        dxterms[r * in_cols + c] = e * up;
        dxterms[r * in_cols + d + c] = e * g;
      } else {
        dxref[r * in_cols + c] = e * dact(op, g);
        dxterms[r * in_cols + c] = e;
      }
    }
  dx.poison();
  std::vector<kh_arg_t> b = {targ(ex.arg(dy)), targ(ex.arg(x))};
  if (call.approximate >= 0) b.push_back(iarg(call.approximate));
  b.push_back(targ(ex.arg(dx)));
  KH_EXPECT_OK(ex.call(pkg, call.bwd, b, &err), err);
  KH_EXPECT_CLOSE_SCALED(dx.values(), dxref, l2_norm(dxterms), tol, "dx");
  EXPECT_TRUE(dx.gaps_untouched()) << "dx: elements between rows were written";
  if (op != kSiluAndMul) return;

  // SiluAndMulRecompute's backward: the same dx and the forward's y, bit for bit (the same
  // formulas in one pass), into tensors of their own strides.
  HostTensor dx2(dtype, R, in_cols, in_cols + k.pad + 1), y2(dtype, R, d, d + 3);
  dx2.poison();
  y2.poison();
  KH_EXPECT_OK(
      ex.call(pkg, "silu_and_mul_backward_recompute",
              {targ(ex.arg(dy)), targ(ex.arg(x)), targ(ex.arg(dx2)), targ(ex.arg(y2))}, &err),
      err);
  EXPECT_EQ(dx2.values(), dx.values()) << "dx differs from silu_and_mul_backward's";
  EXPECT_EQ(y2.values(), y.values()) << "y differs from silu_and_mul's";
  EXPECT_TRUE(dx2.gaps_untouched()) << "dx: elements between rows were written";
  EXPECT_TRUE(y2.gaps_untouched()) << "y: elements between rows were written";
}

}  // namespace kh::kernels_test::act_cases
