// Shared by the GEMM service's tests (tests/unit/test_loader_gemm.cpp on the cpu,
// tests/gpu/test_gpu_gemm.cpp on a GPU): matrices stored in a dtype with the values the GEMM
// reads, a float64 reference, the tolerance, and random cases over every flag combination.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernel_hub/kernel_hub_abi.h"
#include "loader/gemm_cpu.h"
#include "loader/gemm_service.h"

namespace kh::gemm_test {

// Storage of one matrix in a dtype, with its values as the GEMM reads them (rounded).
struct Matrix {
  uint32_t dtype;
  std::vector<uint16_t> half;
  std::vector<float> full;
  std::vector<double> value;  // what the stored element is
  void fill(size_t n, std::mt19937& rng, uint32_t dt) {
    dtype = dt;
    std::uniform_real_distribution<float> dist(-1.f, 1.f);
    value.resize(n);
    if (dt == KH_DTYPE_FP32)
      full.resize(n);
    else
      half.resize(n);
    for (size_t i = 0; i < n; ++i) {
      float v = dist(rng);
      if (dt == KH_DTYPE_FP32) {
        full[i] = v;
        value[i] = v;
      } else if (dt == KH_DTYPE_BF16) {
        half[i] = float_to_bf16_bits(v);
        value[i] = bf16_bits_to_float(half[i]);
      } else {
        half[i] = float_to_fp16_bits(v);
        value[i] = fp16_bits_to_float(half[i]);
      }
    }
  }
  size_t bytes() const { return dtype == KH_DTYPE_FP32 ? full.size() * 4 : half.size() * 2; }
  void* data() { return dtype == KH_DTYPE_FP32 ? static_cast<void*>(full.data()) : half.data(); }
  double at(size_t i) const {
    if (dtype == KH_DTYPE_FP32) return full[i];
    return dtype == KH_DTYPE_BF16 ? bf16_bits_to_float(half[i]) : fp16_bits_to_float(half[i]);
  }
};

// D = alpha * op(A) op(B) (+ beta * D0) in float64, on the stored values.
inline std::vector<double> reference(const kh_gemm_t& g, const Matrix& a, const Matrix& b,
                                     const Matrix& d0) {
  const bool ta = g.flags & KH_GEMM_TRANS_A, tb = g.flags & KH_GEMM_TRANS_B;
  const int64_t batch = g.batch ? g.batch : 1;
  std::vector<double> out(d0.value.size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = d0.value[i];
  for (int64_t p = 0; p < batch; ++p)
    for (int64_t i = 0; i < g.m; ++i)
      for (int64_t j = 0; j < g.n; ++j) {
        double s = 0;
        for (int64_t q = 0; q < g.k; ++q) {
          const double x = a.value[p * g.stride_a + (ta ? q * g.lda + i : i * g.lda + q)];
          const double y = b.value[p * g.stride_b + (tb ? j * g.ldb + q : q * g.ldb + j)];
          s += x * y;
        }
        double& o = out[p * g.stride_d + i * g.ldd + j];
        o = g.alpha * s + ((g.flags & KH_GEMM_ACCUMULATE) ? g.beta * o : 0.0);
      }
  return out;
}

inline void expect_close(const kh_gemm_t& g, const Matrix& d, const std::vector<double>& want,
                         const std::string& what) {
  // fp32 accumulation of k products of values in [-1, 1], then rounding to the result dtype.
  const double eps = g.dtype_d == KH_DTYPE_FP32 ? 1e-6 : (g.dtype_d == KH_DTYPE_BF16 ? 8e-3 : 1e-3);
  const int64_t batch = g.batch ? g.batch : 1;
  for (int64_t p = 0; p < batch; ++p)
    for (int64_t i = 0; i < g.m; ++i)
      for (int64_t j = 0; j < g.n; ++j) {
        const size_t at = static_cast<size_t>(p * g.stride_d + i * g.ldd + j);
        const double tol = 4 * eps * (std::fabs(want[at]) + 1) + 2e-6 * std::sqrt(double(g.k));
        ASSERT_NEAR(d.at(at), want[at], tol)
            << what << " at batch " << p << " [" << i << ", " << j << "]";
      }
}

struct Case {
  int64_t m, n, k, batch;
  uint32_t dtype_ab, dtype_d, flags;
  int64_t pad;  // extra elements per row (ld = row + pad)
};

// The plain request D [m, n] = A [m, k] @ B [k, n]: no flags, alpha 1, dense rows, on the cpu
// (device -1), no buffers yet.
inline kh_gemm_t plain_request(int64_t m, int64_t n, int64_t k, uint32_t dtype_ab,
                               uint32_t dtype_d) {
  kh_gemm_t g{};
  g.h = KH_HEADER_INIT(kh_gemm_t);
  g.device_id = -1;
  g.m = m;
  g.n = n;
  g.k = k;
  g.dtype_ab = dtype_ab;
  g.dtype_d = dtype_d;
  g.lda = k;
  g.ldb = n;
  g.ldd = n;
  g.alpha = 1.f;
  return g;
}

// Runs a request on host buffers; a GPU test copies them to the device and back.
using Runner = std::function<int32_t(kh_gemm_t& g, std::vector<void*> host,
                                     std::vector<size_t> bytes, std::string& error)>;

inline int32_t run_on_host(kh_gemm_t& g, std::vector<void*> host, std::vector<size_t>,
                           std::string& error) {
  g.a = host[0];
  g.b = host[1];
  g.d = host[2];
  return run_gemm(&g, nullptr, error);
}

inline void run_case(const Case& c, std::mt19937& rng, const Runner& run = run_on_host,
                     int32_t device_id = -1) {
  const bool ta = c.flags & KH_GEMM_TRANS_A, tb = c.flags & KH_GEMM_TRANS_B;
  kh_gemm_t g{};
  g.h = KH_HEADER_INIT(kh_gemm_t);
  g.device_id = device_id;
  g.flags = c.flags;
  g.m = c.m;
  g.n = c.n;
  g.k = c.k;
  g.dtype_ab = c.dtype_ab;
  g.dtype_d = c.dtype_d;
  g.lda = (ta ? c.m : c.k) + c.pad;
  g.ldb = (tb ? c.k : c.n) + c.pad;
  g.ldd = c.n + c.pad;
  g.batch = c.batch;
  g.stride_a = (ta ? c.k : c.m) * g.lda;
  g.stride_b = (tb ? c.n : c.k) * g.ldb;
  g.stride_d = c.m * g.ldd;
  g.alpha = 0.75f;
  g.beta = (c.flags & KH_GEMM_ACCUMULATE) ? -0.5f : 0.f;
  const int64_t batch = c.batch ? c.batch : 1;
  Matrix a, b, d;
  a.fill(static_cast<size_t>(batch * g.stride_a), rng, c.dtype_ab);
  b.fill(static_cast<size_t>(batch * g.stride_b), rng, c.dtype_ab);
  d.fill(static_cast<size_t>(batch * g.stride_d), rng, c.dtype_d);
  if (!(c.flags & KH_GEMM_ACCUMULATE))  // D is only written: NaN there must not leak through
    for (size_t i = 0; i < d.value.size(); ++i) {
      if (c.dtype_d == KH_DTYPE_FP32)
        d.full[i] = NAN;
      else
        d.half[i] = 0x7fc0;
    }
  const std::vector<double> want = reference(g, a, b, d);
  std::string error;
  ASSERT_EQ(run(g, {a.data(), b.data(), d.data()}, {a.bytes(), b.bytes(), d.bytes()}, error), KH_OK)
      << error;
  expect_close(g, d, want,
               "m " + std::to_string(c.m) + " n " + std::to_string(c.n) + " k " +
                   std::to_string(c.k) + " flags " + std::to_string(c.flags) + " dtypes " +
                   gemm_dtype_name(c.dtype_ab) + "/" + gemm_dtype_name(c.dtype_d));
}

}  // namespace kh::gemm_test
