// Test cases of the rotary package shared by the cpu tests (tests/unit/test_kernels_rotary_softmax.cpp)
// and the GPU tests (tests/gpu/test_kernels_gpu_rotary_softmax.cpp): a float64 reference of the rotation
// and one function that runs the forward and the backward for a dtype, layout and shape on an
// Executor. query and key are [tokens, heads, head_dim] views with gaps between heads and between
// tokens; cos and sin are the two halves of one [max_pos, rot_dim] cache (row stride rot_dim).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "tests/unit/test_kernels_util.h"

namespace kh::kernels_test::rope_cases {

using V = std::vector<double>;

struct Case {
  int64_t tokens, q_heads, k_heads;  // k_heads 0: no key
  int64_t head_dim, rot_dim;
  int64_t head_pad, token_pad;  // elements between heads / after each token's heads
  int64_t max_pos;
  bool cache_f32;  // cos/sin fp32 (else the tensor dtype)
};

inline const Case kCases[] = {
    {1, 1, 0, 2, 2, 0, 0, 4, true},         {5, 3, 1, 64, 64, 0, 0, 64, true},
    {7, 4, 2, 128, 64, 0, 0, 32, false},    {3, 2, 2, 80, 80, 5, 3, 20, true},
    {9, 5, 3, 96, 32, 0, 11, 100, false},   {2, 1, 1, 6, 4, 1, 1, 3, true},
    {33, 8, 2, 128, 128, 0, 0, 4096, true}, {4, 2, 0, 256, 200, 8, 0, 50, false},
};

// A [tokens, heads, head_dim] view of a HostTensor of rows [heads * head_stride].
struct HeadsDl {
  int64_t shape[3], strides[3];
  DLTensor t;
  HeadsDl(const DLTensor* rows, int64_t heads, int64_t head_dim, int64_t head_stride) {
    t = *rows;
    shape[0] = rows->shape[0];
    shape[1] = heads;
    shape[2] = head_dim;
    strides[0] = rows->strides ? rows->strides[0] : heads * head_stride;
    strides[1] = head_stride;
    strides[2] = 1;
    t.ndim = 3;
    t.shape = shape;
    t.strides = strides;
  }
};

// A [max_pos, half] view starting `col` columns into a [max_pos, rot_dim] cache.
struct CacheDl {
  int64_t shape[2], strides[2];
  DLTensor t;
  CacheDl(const DLTensor* cache, int64_t half, int64_t col, int dtype) {
    t = *cache;
    shape[0] = cache->shape[0];
    shape[1] = half;
    strides[0] = cache->strides ? cache->strides[0] : cache->shape[1];
    strides[1] = 1;
    t.shape = shape;
    t.strides = strides;
    t.data = static_cast<char*>(t.data) + col * dtype_bytes(dtype);
  }
};

// int64 values (positions, targets) carried by a HostTensor of twice as many fp32 words, so
// that every Executor mirrors them like any other tensor; dl() views them as int64 [n].
struct Int64Tensor {
  HostTensor words;
  int64_t shape[1];
  DLTensor t{};
  explicit Int64Tensor(const std::vector<int64_t>& v)
      : words(kFP32, 1, 2 * static_cast<int64_t>(v.size() > 0 ? v.size() : 1)) {
    std::memcpy(words.data(), v.data(), v.size() * sizeof(int64_t));
    shape[0] = static_cast<int64_t>(v.size());
  }
  const DLTensor* view(Executor& ex) {
    t = *ex.arg(words);
    t.dtype = DLDataType{kDLInt, 64, 1};
    t.ndim = 1;
    t.shape = shape;
    t.strides = nullptr;
    return &t;
  }
};

// float64 rotation of one head in place (sign +1 forward, -1 inverse).
inline void rotate_ref(double* x, const double* c, const double* s, int64_t half, bool neox,
                       double sign) {
  for (int64_t j = 0; j < half; ++j) {
    const int64_t a = neox ? j : 2 * j, b = neox ? j + half : 2 * j + 1;
    const double x1 = x[a], x2 = x[b], sn = sign * s[j];
    x[a] = x1 * c[j] - x2 * sn;
    x[b] = x2 * c[j] + x1 * sn;
  }
}

// The case's cos/sin cache [max_pos, rot_dim] (cos in the first half of each row, sin in the
// second) in `dtype`.
inline HostTensor rope_cache(const Case& k, int dtype) {
  const int64_t half = k.rot_dim / 2;
  HostTensor cache(dtype, k.max_pos, k.rot_dim);
  for (int64_t p = 0; p < k.max_pos; ++p)
    for (int64_t j = 0; j < half; ++j) {
      const double ang = p * std::pow(10000.0, -2.0 * j / k.rot_dim);
      cache.set(p, j, std::cos(ang));
      cache.set(p, half + j, std::sin(ang));
    }
  return cache;
}

// Random positions of the case's tokens; with 3 tokens or more, token 1's is out of range.
inline std::vector<int64_t> case_positions(const Case& k, std::mt19937_64& rng) {
  std::vector<int64_t> pv;
  std::uniform_int_distribution<int64_t> pd(0, k.max_pos - 1);
  for (int64_t t = 0; t < k.tokens; ++t) pv.push_back(pd(rng));
  if (k.tokens >= 3) pv[1] = k.max_pos;
  return pv;
}

// Rotates fresh random q and k forward, then fresh random gradients backward, against float64.
inline void run_case(Executor& ex, const Package& pkg, int dtype, bool neox, const Case& k,
                     std::mt19937_64& rng) {
  SCOPED_TRACE(testing::Message() << (neox ? "neox " : "gptj ") << dtype_name(dtype) << " tokens "
                                  << k.tokens << " heads " << k.q_heads << "/" << k.k_heads
                                  << " head_dim " << k.head_dim << " rot " << k.rot_dim << " cache "
                                  << (k.cache_f32 ? "fp32" : "same"));
  const int64_t half = k.rot_dim / 2, hs = k.head_dim + k.head_pad;
  const int cdt = k.cache_f32 ? kFP32 : dtype;
  HostTensor cache = rope_cache(k, cdt);
  const std::vector<int64_t> pv = case_positions(k, rng);  // pv[1] out of range: left as it is
  std::normal_distribution<double> n(0.0, 1.0);
  const double tol = tolerance(dtype);
  for (int dir = 0; dir < 2; ++dir) {  // 0 forward, 1 backward (inverse rotation)
    SCOPED_TRACE(dir == 0 ? "forward" : "backward");
    const int64_t qcols = k.q_heads * hs, kcols = k.k_heads * hs;
    HostTensor q(dtype, k.tokens, qcols, qcols + k.token_pad);
    HostTensor kk(dtype, k.tokens, kcols > 0 ? kcols : 1, (kcols > 0 ? kcols : 1) + k.token_pad);
    q.fill([&](int64_t, int64_t) { return n(rng); });
    kk.fill([&](int64_t, int64_t) { return n(rng); });
    V qref = q.values(), kref = kk.values();
    const V cv = cache.values();
    for (int64_t t = 0; t < k.tokens; ++t) {
      if (pv[t] < 0 || pv[t] >= k.max_pos) continue;
      const double* c = &cv[pv[t] * k.rot_dim];
      const double* s = c + half;
      for (int64_t h = 0; h < k.q_heads; ++h)
        rotate_ref(&qref[t * qcols + h * hs], c, s, half, neox, dir == 0 ? 1 : -1);
      for (int64_t h = 0; h < k.k_heads; ++h)
        rotate_ref(&kref[t * kcols + h * hs], c, s, half, neox, dir == 0 ? 1 : -1);
    }
    Int64Tensor positions(pv);
    HeadsDl qd(ex.arg(q), k.q_heads, k.head_dim, hs);
    HeadsDl kd(ex.arg(kk), k.k_heads, k.head_dim, hs);
    const DLTensor* cache_dl = ex.arg(cache);
    CacheDl cos(cache_dl, half, 0, cdt), sin(cache_dl, half, half, cdt);
    std::string err;
    const std::vector<kh_arg_t> a = {targ(positions.view(ex)),
                                     targ(&qd.t),
                                     targ(k.k_heads > 0 ? &kd.t : nullptr),
                                     targ(&cos.t),
                                     targ(&sin.t),
                                     iarg(neox ? 1 : 0)};
    KH_EXPECT_OK(ex.call(pkg, dir == 0 ? "rotary_embedding" : "rotary_embedding_backward", a, &err),
                 err);
    KH_EXPECT_CLOSE(q.values(), qref, tol, "query");
    if (k.k_heads > 0) {
      KH_EXPECT_CLOSE(kk.values(), kref, tol, "key");
    }
    if (k.k_heads == 0) {
      EXPECT_EQ(kk.values(), kref) << "key was absent but written";
    }
    // Non-rotated elements (past rot_dim, gaps between heads) are bit-identical to the input.
    const V qv = q.values();
    for (int64_t t = 0; t < k.tokens; ++t)
      for (int64_t h = 0; h < k.q_heads; ++h)
        for (int64_t c = 2 * half; c < hs; ++c) {
          const int64_t i = t * qcols + h * hs + c;
          ASSERT_EQ(qv[i], qref[i]) << "token " << t << " head " << h << " column " << c;
        }
    EXPECT_TRUE(q.gaps_untouched());
    EXPECT_TRUE(kk.gaps_untouched());
  }
}

// QKNormRotaryEmbedding on fresh random q, k and weights against float64: each head RMS-normed
// over head_dim (x / sqrt(mean(x^2) + eps) * w), then its first rot_dim elements rotated (a token
// whose position is out of range is normed only). Heads past rot_dim and gaps: as run_case.
inline void run_qk_norm_case(Executor& ex, const Package& pkg, int dtype, bool neox, const Case& k,
                             std::mt19937_64& rng) {
  SCOPED_TRACE(testing::Message() << "qk_norm " << (neox ? "neox " : "gptj ") << dtype_name(dtype)
                                  << " tokens " << k.tokens << " heads " << k.q_heads << "/"
                                  << k.k_heads << " head_dim " << k.head_dim << " rot "
                                  << k.rot_dim);
  const int64_t half = k.rot_dim / 2, hs = k.head_dim + k.head_pad;
  const int cdt = k.cache_f32 ? kFP32 : dtype;
  const double eps = 1e-6;
  HostTensor cache = rope_cache(k, cdt);
  const std::vector<int64_t> pv = case_positions(k, rng);  // pv[1] out of range: normed only
  std::normal_distribution<double> n(0.0, 1.0);
  const int64_t qcols = k.q_heads * hs, kcols = k.k_heads * hs;
  HostTensor q(dtype, k.tokens, qcols, qcols + k.token_pad);
  HostTensor kk(dtype, k.tokens, kcols > 0 ? kcols : 1, (kcols > 0 ? kcols : 1) + k.token_pad);
  HostTensor qw(dtype, 1, k.head_dim), kw(dtype, 1, k.head_dim);
  q.fill([&](int64_t, int64_t) { return 3.0 * n(rng); });
  kk.fill([&](int64_t, int64_t) { return 0.5 * n(rng); });
  qw.fill([&](int64_t, int64_t) { return 1.0 + 0.2 * n(rng); });
  kw.fill([&](int64_t, int64_t) { return 1.0 + 0.2 * n(rng); });
  V qref = q.values(), kref = kk.values();
  const V cv = cache.values(), qwv = qw.values(), kwv = kw.values();
  auto norm_rotate = [&](double* x, const V& w, int64_t t) {
    double ss = 0;
    for (int64_t e = 0; e < k.head_dim; ++e) ss += x[e] * x[e];
    const double r = 1.0 / std::sqrt(ss / static_cast<double>(k.head_dim) + eps);
    for (int64_t e = 0; e < k.head_dim; ++e) x[e] *= r * w[e];
    if (pv[t] < 0 || pv[t] >= k.max_pos) return;
    const double* c = &cv[pv[t] * k.rot_dim];
    rotate_ref(x, c, c + half, half, neox, 1);
  };
  for (int64_t t = 0; t < k.tokens; ++t) {
    for (int64_t h = 0; h < k.q_heads; ++h) norm_rotate(&qref[t * qcols + h * hs], qwv, t);
    for (int64_t h = 0; h < k.k_heads; ++h) norm_rotate(&kref[t * kcols + h * hs], kwv, t);
  }
  Int64Tensor positions(pv);
  HeadsDl qd(ex.arg(q), k.q_heads, k.head_dim, hs);
  HeadsDl kd(ex.arg(kk), k.k_heads, k.head_dim, hs);
  const DLTensor* cache_dl = ex.arg(cache);
  CacheDl cos(cache_dl, half, 0, cdt), sin(cache_dl, half, half, cdt);
  std::string err;
  const bool key = k.k_heads > 0;
  KH_EXPECT_OK(ex.call(pkg, "qk_norm_rotary_embedding",
                       {targ(positions.view(ex)), targ(&qd.t), targ(key ? &kd.t : nullptr),
                        targ(ex.arg(qw)), targ(key ? ex.arg(kw) : nullptr), farg(eps), targ(&cos.t),
                        targ(&sin.t), iarg(neox ? 1 : 0)},
                       &err),
               err);
  // Gaps between heads and tokens are not part of the rows: compare the heads' elements only.
  auto heads_only = [&](const V& v, int64_t heads, int64_t cols) {
    V out;
    for (int64_t t = 0; t < k.tokens; ++t)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t e = 0; e < k.head_dim; ++e) out.push_back(v[t * cols + h * hs + e]);
    return out;
  };
  KH_EXPECT_CLOSE(heads_only(q.values(), k.q_heads, qcols), heads_only(qref, k.q_heads, qcols),
                  tolerance(dtype), "query");
  if (key) {
    KH_EXPECT_CLOSE(heads_only(kk.values(), k.k_heads, kcols), heads_only(kref, k.k_heads, kcols),
                    tolerance(dtype), "key");
  } else {
    EXPECT_EQ(kk.values(), kref) << "key was absent but written";
  }
  EXPECT_TRUE(q.gaps_untouched());
  EXPECT_TRUE(kk.gaps_untouched());
}

}  // namespace kh::kernels_test::rope_cases
