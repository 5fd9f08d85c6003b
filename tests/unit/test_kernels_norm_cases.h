// Test cases of the norm package shared by the cpu tests (tests/unit/test_kernels_norm.cpp)
// and the GPU tests (tests/gpu/test_kernels_gpu.cpp): float64 references and one function that
// runs forward, forward_train and backward of a layer for a dtype and shape on an Executor.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "tests/unit/test_kernels_util.h"

namespace kh::kernels_test::norm_cases {

using V = std::vector<double>;

// ---- float64 references ------------------------------------------------------------------------
struct FwdRef {
  V y, mean, rstd;
};

// RMSNorm (ln = false) or LayerNorm over rows of x.
inline FwdRef forward_ref(const V& x, const V& w, const V* b, double eps, int64_t rows,
                          int64_t cols, bool ln) {
  FwdRef r;
  r.y.resize(x.size());
  r.mean.resize(rows);
  r.rstd.resize(rows);
  for (int64_t i = 0; i < rows; ++i) {
    const double* xr = &x[i * cols];
    double mu = 0, ss = 0;
    if (ln) {
      for (int64_t c = 0; c < cols; ++c) mu += xr[c];
      mu /= cols;
    }
    for (int64_t c = 0; c < cols; ++c) ss += (xr[c] - mu) * (xr[c] - mu);
    double rstd = 1.0 / std::sqrt(ss / cols + eps);
    r.mean[i] = mu;
    r.rstd[i] = rstd;
    for (int64_t c = 0; c < cols; ++c)
      r.y[i * cols + c] = (xr[c] - mu) * rstd * w[c] + (b ? (*b)[c] : 0.0);
  }
  return r;
}

struct BwdRef {
  V dx, dw, db;
  V dx_terms;  // rstd * dy * w: the size of the terms dx is computed from
};

// Analytic gradients of L = sum(y * dy) for y = forward_ref(x, w, b).
inline BwdRef backward_ref(const V& dy, const V& x, const V& w, double eps, int64_t rows,
                           int64_t cols, bool ln) {
  FwdRef f = forward_ref(x, w, nullptr, eps, rows, cols, ln);
  BwdRef r;
  r.dx.resize(x.size());
  r.dx_terms.resize(x.size());
  r.dw.assign(cols, 0.0);
  r.db.assign(cols, 0.0);
  for (int64_t i = 0; i < rows; ++i) {
    const double mu = f.mean[i], rs = f.rstd[i];
    double c1 = 0, c2 = 0;
    for (int64_t c = 0; c < cols; ++c) {
      const double xhat = (x[i * cols + c] - mu) * rs, g = dy[i * cols + c] * w[c];
      c1 += g * xhat;
      c2 += g;
    }
    c1 /= cols;
    c2 = ln ? c2 / cols : 0.0;
    for (int64_t c = 0; c < cols; ++c) {
      const double xhat = (x[i * cols + c] - mu) * rs, g = dy[i * cols + c] * w[c];
      r.dx[i * cols + c] = rs * (g - xhat * c1 - c2);
      r.dx_terms[i * cols + c] = rs * g;
      r.dw[c] += dy[i * cols + c] * xhat;
      r.db[c] += dy[i * cols + c];
    }
  }
  return r;
}

// ---- cases --------------------------------------------------------------------------------------
struct Case {
  int64_t rows, cols;
  int64_t pad;      // extra elements between rows (row stride = cols + pad)
  int64_t ws_rows;  // workspace rows (walkers) for the backward
};

// Odd sizes, one row, rows of 65536+, strided rows, more walkers than rows and fewer.
inline const Case kCases[] = {
    {1, 1, 0, 1},     {3, 7, 5, 2},     {17, 64, 0, 4},   {5, 4095, 3, 8}, {4, 4097, 0, 3},
    {6, 4096, 8, 64}, {1, 65544, 0, 1}, {2, 65537, 1, 2}, {33, 256, 0, 5}, {1, 8, 0, 132},
};

inline const char* kind_name(int k) {
  return k == 0 ? "RMSNorm" : k == 1 ? "FusedAddRMSNorm" : "LayerNorm";
}

// One layer, dtype and case: forward, forward_train, backward.
inline void run_case(Executor& ex, const Package& pkg, int kind, int dtype, const Case& k,
                     std::mt19937_64& rng) {
  SCOPED_TRACE(testing::Message() << kind_name(kind) << " " << dtype_name(dtype) << " rows "
                                  << k.rows << " cols " << k.cols << " pad " << k.pad << " walkers "
                                  << k.ws_rows);
  const bool ln = kind == 2, add = kind == 1;
  const double eps = 1e-5, tol = tolerance(dtype);
  std::normal_distribution<double> n01(0.0, 1.0);
  const int64_t R = k.rows, C = k.cols, S = C + k.pad;

  HostTensor x(dtype, R, C, S), res(dtype, R, C, S + 3), w = vector_tensor(dtype, C),
                                                         b = vector_tensor(dtype, C);
  x.fill([&](int64_t, int64_t) { return n01(rng) + (ln ? 3.0 : 0.0); });
  res.fill([&](int64_t, int64_t) { return n01(rng); });
  w.fill([&](int64_t, int64_t) { return 1.0 + 0.2 * n01(rng); });
  b.fill([&](int64_t, int64_t) { return 0.2 * n01(rng); });
  const V xv = x.values(), rv = res.values(), wv = w.values(), bv = b.values();

  // The normalized input: x, or x + residual for FusedAddRMSNorm.
  V sv = xv;
  if (add)
    for (size_t i = 0; i < sv.size(); ++i) sv[i] += rv[i];
  const FwdRef ref = forward_ref(sv, wv, ln ? &bv : nullptr, eps, R, C, ln);

  HostTensor y(dtype, R, C, S + 1), res_out(dtype, R, C, S + 2);
  HostTensor mean = vector_tensor(kFP32, R), rstd = vector_tensor(kFP32, R);
  std::string err;
  for (bool train : {false, true}) {
    SCOPED_TRACE(train ? "forward_train" : "forward");
    y.poison();
    res_out.poison();
    mean.poison();
    rstd.poison();
    int32_t s;
    if (kind == 0) {
      std::vector<kh_arg_t> a = {targ(ex.arg(x)), targ(ex.arg(w)), farg(eps), targ(ex.arg(y))};
      if (train) a.push_back(targ(ex.arg(rstd)));
      s = ex.call(pkg, train ? "rms_norm_train" : "rms_norm", a, &err);
    } else if (add) {
      std::vector<kh_arg_t> a = {targ(ex.arg(x)), targ(ex.arg(res)), targ(ex.arg(w)),
                                 farg(eps),       targ(ex.arg(y)),   targ(ex.arg(res_out))};
      if (train) a.push_back(targ(ex.arg(rstd)));
      s = ex.call(pkg, train ? "fused_add_rms_norm_train" : "fused_add_rms_norm", a, &err);
    } else {
      std::vector<kh_arg_t> a = {targ(ex.arg(x)), targ(ex.arg(w)), targ(ex.arg(b)), farg(eps),
                                 targ(ex.arg(y))};
      if (train) {
        a.push_back(targ(ex.arg(mean)));
        a.push_back(targ(ex.arg(rstd)));
      }
      s = ex.call(pkg, train ? "layer_norm_train" : "layer_norm", a, &err);
    }
    KH_EXPECT_OK(s, err);
    KH_EXPECT_CLOSE(y.values(), ref.y, tol, "y");
    EXPECT_TRUE(y.gaps_untouched()) << "y: elements between rows were written";
    if (add) {
      KH_EXPECT_CLOSE(res_out.values(), sv, tol, "residual_out");
      EXPECT_TRUE(res_out.gaps_untouched()) << "residual_out: elements between rows were written";
    }
    if (train) {
      // Statistics are fp32 from the stored inputs; FusedAdd normalizes the rounded sum.
      KH_EXPECT_CLOSE(rstd.values(), ref.rstd, add ? tol : 1e-5, "rstd");
      if (ln) KH_EXPECT_CLOSE(mean.values(), ref.mean, 1e-5, "mean");
    }
  }

  // Backward from the saved statistics. FusedAdd differentiates through the stored residual.
  HostTensor dy(dtype, R, C, S + 4), dres(dtype, R, C, S), dx(dtype, R, C, S + 5);
  HostTensor dw = vector_tensor(dtype, C), db = vector_tensor(dtype, C);
  HostTensor ws(kFP32, k.ws_rows, (ln ? 2 : 1) * C, (ln ? 2 : 1) * C + 4);
  dy.fill([&](int64_t, int64_t) { return n01(rng); });
  dres.fill([&](int64_t, int64_t) { return n01(rng); });
  const V dyv = dy.values(), dresv = dres.values();
  const V xin = add ? res_out.values() : xv;
  const BwdRef g = backward_ref(dyv, xin, wv, eps, R, C, ln);
  // FusedAdd also from its output (FusedAddRMSNormFromOutput): y, the train forward's (the last
  // one above), in place of residual_out, and xhat = y / w: the same gradients up to y's rounding.
  struct Variant {
    bool with_dres, from_y;
  };
  const std::vector<Variant> variants =
      add ? std::vector<Variant>{{true, false}, {false, false}, {true, true}, {false, true}}
          : std::vector<Variant>{{false, false}};
  for (const auto [with_dres, from_y] : variants) {
    SCOPED_TRACE(with_dres ? "backward with dresidual_out" : "backward");
    SCOPED_TRACE(from_y ? "from the output" : "from the residual");
    dx.poison();
    dw.poison();
    db.poison();
    ws.poison();
    int32_t s;
    if (kind == 0) {
      s = ex.call(pkg, "rms_norm_backward",
                  {targ(ex.arg(dy)), targ(ex.arg(x)), targ(ex.arg(w)), targ(ex.arg(rstd)),
                   targ(ex.arg(dx)), targ(ex.arg(dw)), targ(ex.arg(ws))},
                  &err);
    } else if (add) {
      s = ex.call(
          pkg, from_y ? "fused_add_rms_norm_backward_from_output" : "fused_add_rms_norm_backward",
          {targ(ex.arg(dy)), targ(with_dres ? ex.arg(dres) : nullptr),
           targ(ex.arg(from_y ? y : res_out)), targ(ex.arg(w)), targ(ex.arg(rstd)),
           targ(ex.arg(dx)), targ(ex.arg(dw)), targ(ex.arg(ws))},
          &err);
    } else {
      s = ex.call(pkg, "layer_norm_backward",
                  {targ(ex.arg(dy)), targ(ex.arg(x)), targ(ex.arg(w)), targ(ex.arg(mean)),
                   targ(ex.arg(rstd)), targ(ex.arg(dx)), targ(ex.arg(dw)), targ(ex.arg(db)),
                   targ(ex.arg(ws))},
                  &err);
    }
    KH_EXPECT_OK(s, err);
    V want_dx = g.dx;
    if (with_dres)
      for (size_t i = 0; i < want_dx.size(); ++i) want_dx[i] += dresv[i];
    KH_EXPECT_CLOSE_SCALED(dx.values(), want_dx, l2_norm(g.dx_terms), tol, "dx");
    EXPECT_TRUE(dx.gaps_untouched()) << "dx: elements between rows were written";
    KH_EXPECT_CLOSE(dw.values(), g.dw, tol, "dweight");
    if (ln) KH_EXPECT_CLOSE(db.values(), g.db, tol, "dbias");
  }
}

}  // namespace kh::kernels_test::norm_cases
