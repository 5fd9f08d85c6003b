// Test cases of the rotary package shared by the cpu tests (tests/unit/test_kernels_rotary_softmax.cpp)
// and the GPU tests (tests/gpu/test_kernels_gpu_rotary_softmax.cpp): a float64 reference of the rotation
// and one function that runs the forward and the backward for a dtype, layout and shape on an
// Executor. query and key are [tokens, heads, head_dim] views with gaps between heads and between
// tokens; cos and sin are the two halves of one [max_pos, rot_dim] cache (row stride rot_dim +
// cache_pad).
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
  // Elements after each cache row (1: rows off 16 bytes apart, a cache no vector load fits).
  int64_t cache_pad = 0;
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
  HostTensor cache(dtype, k.max_pos, k.rot_dim, k.rot_dim + k.cache_pad);
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

// Whether the cuda kernels of QKNormRotaryEmbedding's training ops take a case (host.cpp): NeoX,
// full rotary, head_dim 2 x (elements a 16-byte vector) x a power of two up to 32, 16-byte
// aligned heads and tokens. Elsewhere they refuse with KH_ERR_UNSUPPORTED.
inline bool qk_norm_train_cuda_takes(int dtype, bool neox, const Case& k) {
  const int64_t vec = 16 / dtype_bytes(dtype), g = k.head_dim / (2 * vec);
  const int64_t hs = k.head_dim + k.head_pad, b = dtype_bytes(dtype);
  const bool aligned = (hs * b) % 16 == 0 && ((k.q_heads * hs + k.token_pad) * b) % 16 == 0 &&
                       (k.k_heads == 0 || ((k.k_heads * hs + k.token_pad) * b) % 16 == 0);
  return neox && k.rot_dim == k.head_dim && k.head_dim % (2 * vec) == 0 && g >= 1 && g <= 32 &&
         (g & (g - 1)) == 0 && aligned;
}

// QKNormRotaryEmbedding's training ops on fresh random inputs against float64:
// qk_norm_rotary_embedding_train (query and key written from query_in and key_in, which stay as
// they were) and qk_norm_rotary_embedding_backward (the inputs' gradients and both weights', from
// random gradients of the outputs; rstd recomputed from the inputs). `cuda`: where the case is
// one the cuda kernels refuse, both ops must say KH_ERR_UNSUPPORTED and write nothing.
// `from_output`: QKNormRotaryEmbeddingFromOutput's ops instead, the forward in place (query and
// key written over query_in and key_in) with each row's rstd, the backward from those outputs and
// rstd: the same float64 references. `weight_spread` > 1: the norm weights log-uniform in
// [1 / spread, spread] (trained q/k norms are uneven; from the output, a pair's rounding then
// lands on xhat scaled by the pair's weight ratio), else 1 + 0.2 N(0, 1).
inline void run_qk_norm_train_case(Executor& ex, const Package& pkg, int dtype, bool neox,
                                   const Case& k, std::mt19937_64& rng, bool cuda,
                                   bool from_output = false, double weight_spread = 0) {
  SCOPED_TRACE(testing::Message() << (from_output ? "from the output, " : "") << "qk_norm train "
                                  << (neox ? "neox " : "gptj ") << dtype_name(dtype) << " tokens "
                                  << k.tokens << " heads " << k.q_heads << "/" << k.k_heads
                                  << " head_dim " << k.head_dim << " rot " << k.rot_dim);
  const int64_t half = k.rot_dim / 2, hs = k.head_dim + k.head_pad, HD = k.head_dim;
  const int cdt = k.cache_f32 ? kFP32 : dtype;
  const double eps = 1e-6;
  const bool key = k.k_heads > 0;
  const bool refused = cuda && !qk_norm_train_cuda_takes(dtype, neox, k);
  HostTensor cache = rope_cache(k, cdt);
  const std::vector<int64_t> pv = case_positions(k, rng);  // pv[1] out of range: normed only
  std::normal_distribution<double> n(0.0, 1.0);
  const int64_t qcols = k.q_heads * hs, kcols = key ? k.k_heads * hs : 1;
  auto heads_tensor = [&](int64_t cols) {
    return HostTensor(dtype, k.tokens, cols, cols + k.token_pad);
  };
  HostTensor qi = heads_tensor(qcols), ki = heads_tensor(kcols), qo = heads_tensor(qcols),
             ko = heads_tensor(kcols), dq = heads_tensor(qcols), dk = heads_tensor(kcols),
             dqi = heads_tensor(qcols), dki = heads_tensor(kcols);
  HostTensor qw(dtype, 1, HD), kw(dtype, 1, HD), dqw(dtype, 1, HD), dkw(dtype, 1, HD);
  HostTensor ws(kFP32, 3, 2 * HD);
  HostTensor rq(kFP32, 1, std::max<int64_t>(1, k.tokens * k.q_heads)),
      rk(kFP32, 1, std::max<int64_t>(1, k.tokens * k.k_heads));
  V rq_ref, rk_ref;  // rows' rstd in order (token, head)
  qi.fill([&](int64_t, int64_t) { return 3.0 * n(rng); });
  ki.fill([&](int64_t, int64_t) { return 0.5 * n(rng); });
  dq.fill([&](int64_t, int64_t) { return n(rng); });
  dk.fill([&](int64_t, int64_t) { return n(rng); });
  std::uniform_real_distribution<double> log_w(-std::log(std::max(weight_spread, 1.0)),
                                               std::log(std::max(weight_spread, 1.0)));
  auto weight = [&](int64_t, int64_t) {
    return weight_spread > 1 ? std::exp(log_w(rng)) : 1.0 + 0.2 * n(rng);
  };
  qw.fill(weight);
  kw.fill(weight);
  const V qin = qi.values(), kin = ki.values(), dqv = dq.values(), dkv = dk.values();
  const V cv = cache.values(), qwv = qw.values(), kwv = kw.values();

  // float64: forward rows and the backward's input and weight gradients.
  V qref(qin.size()), kref(kin.size()), dqref(qin.size()), dkref(kin.size());
  V dqw_ref(HD, 0.0), dkw_ref(HD, 0.0);
  // The input gradient's larger term, rstd * dn * w, of which it is a difference: short rows
  // (head_dim 2) can cancel to far less than the terms, so its error is measured against them.
  V dqterms(qin.size()), dkterms(kin.size());
  auto row = [&](const V& x, const V& d, const V& w, V& y, V& dx, V& dw, V& terms, int64_t off,
                 int64_t t, V& rstds) {
    double ss = 0;
    for (int64_t e = 0; e < HD; ++e) ss += x[off + e] * x[off + e];
    const double r = 1.0 / std::sqrt(ss / static_cast<double>(HD) + eps);
    rstds.push_back(r);
    const bool rot = pv[t] >= 0 && pv[t] < k.max_pos;
    const double* c = rot ? &cv[pv[t] * k.rot_dim] : nullptr;
    for (int64_t e = 0; e < HD; ++e) y[off + e] = x[off + e] * r * w[e];
    if (rot) rotate_ref(&y[off], c, c + half, half, neox, 1);
    V dn(d.begin() + off, d.begin() + off + HD);
    if (rot) rotate_ref(dn.data(), c, c + half, half, neox, -1);
    double mgx = 0;
    for (int64_t e = 0; e < HD; ++e) mgx += dn[e] * w[e] * x[off + e] * r;
    mgx /= static_cast<double>(HD);
    for (int64_t e = 0; e < HD; ++e) {
      const double xhat = x[off + e] * r;
      dx[off + e] = r * (dn[e] * w[e] - xhat * mgx);
      terms[off + e] = r * dn[e] * w[e];
      dw[e] += dn[e] * xhat;
    }
  };
  for (int64_t t = 0; t < k.tokens; ++t) {
    for (int64_t h = 0; h < k.q_heads; ++h)
      row(qin, dqv, qwv, qref, dqref, dqw_ref, dqterms, t * qcols + h * hs, t, rq_ref);
    for (int64_t h = 0; h < k.k_heads; ++h)
      row(kin, dkv, kwv, kref, dkref, dkw_ref, dkterms, t * kcols + h * hs, t, rk_ref);
  }

  Int64Tensor positions(pv);
  HeadsDl qid(ex.arg(qi), k.q_heads, HD, hs), kid(ex.arg(ki), k.k_heads, HD, hs);
  HeadsDl qod(ex.arg(qo), k.q_heads, HD, hs), kod(ex.arg(ko), k.k_heads, HD, hs);
  const DLTensor* cache_dl = ex.arg(cache);
  CacheDl cos(cache_dl, half, 0, cdt), sin(cache_dl, half, half, cdt);
  std::string err;
  std::vector<kh_arg_t> fwd = {targ(positions.view(ex)),
                               targ(&qid.t),
                               targ(key ? &kid.t : nullptr),
                               targ(ex.arg(qw)),
                               targ(key ? ex.arg(kw) : nullptr),
                               farg(eps),
                               targ(&cos.t),
                               targ(&sin.t),
                               iarg(neox ? 1 : 0),
                               targ(from_output ? &qid.t : &qod.t),  // in place
                               targ(key ? (from_output ? &kid.t : &kod.t) : nullptr)};
  if (from_output) {
    fwd.push_back(targ(ex.arg(rq)));
    fwd.push_back(targ(key ? ex.arg(rk) : nullptr));
  }
  const int32_t st = ex.call(
      pkg, from_output ? "qk_norm_rotary_embedding_train_rstd" : "qk_norm_rotary_embedding_train",
      fwd, &err);
  HostTensor& qout = from_output ? qi : qo;  // the forward's outputs
  HostTensor& kout = from_output ? ki : ko;
  // Rows of the heads only (gaps between heads and after each token are not part of them).
  auto heads_only = [&](const V& v, int64_t heads, int64_t cols) {
    V out;
    for (int64_t t = 0; t < k.tokens; ++t)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t e = 0; e < HD; ++e) out.push_back(v[t * cols + h * hs + e]);
    return out;
  };
  if (refused) {
    EXPECT_EQ(st, KH_ERR_UNSUPPORTED) << err;
    EXPECT_EQ(first_nonfinite(heads_only(qo.values(), k.q_heads, qcols)), 0)
        << "a refused call wrote query";
    if (from_output) {
      EXPECT_EQ(qi.values(), qin) << "a refused call wrote query in place";
    }
  } else {
    KH_EXPECT_OK(st, err);
    KH_EXPECT_CLOSE(heads_only(qout.values(), k.q_heads, qcols), heads_only(qref, k.q_heads, qcols),
                    tolerance(dtype), "query");
    if (key) {
      KH_EXPECT_CLOSE(heads_only(kout.values(), k.k_heads, kcols),
                      heads_only(kref, k.k_heads, kcols), tolerance(dtype), "key");
    }
    if (from_output) {
      // fp32 from the stored inputs (float64's from the same values).
      V got = rq.values();
      got.resize(rq_ref.size());
      KH_EXPECT_CLOSE(got, rq_ref, 1e-5, "rstd_query");
      if (key) {
        got = rk.values();
        got.resize(rk_ref.size());
        KH_EXPECT_CLOSE(got, rk_ref, 1e-5, "rstd_key");
      }
    } else {
      EXPECT_EQ(qi.values(), qin) << "query_in was written";
    }
    EXPECT_TRUE(qout.gaps_untouched());
    EXPECT_TRUE(kout.gaps_untouched());
  }

  // From the output, the backward's float64 reference is the op's definition on what it is given:
  // xhat = the stored output rotated back / w (w's 0 or subnormal: the output), the stored rstd.
  // (Against the input-based gradients, xhat carries two roundings more, y = xhat * w and the
  // rotated row, and the inverse rotation puts a pair's rounding on both elements: the small
  // element of a lopsided pair takes the large one's. In bf16 one row's weight gradient can be
  // 4% off; summed over 4096 rows about 0.3-0.8% (a float64 simulation, session 35); the model
  // test compares the trained gradients, test_gpu_demo_device.)
  if (from_output && !refused) {
    const V qo_v = qout.values(), ko_v = kout.values(), rq_v = rq.values(), rk_v = rk.values();
    dqw_ref.assign(HD, 0.0);
    dkw_ref.assign(HD, 0.0);
    auto row_out = [&](const V& out, const V& d, const V& w, V& dx, V& dw, V& terms, int64_t off,
                       int64_t t, double r) {
      const bool rot = pv[t] >= 0 && pv[t] < k.max_pos;
      const double* c = rot ? &cv[pv[t] * k.rot_dim] : nullptr;
      V xh(out.begin() + off, out.begin() + off + HD), dn(d.begin() + off, d.begin() + off + HD);
      if (rot) {
        rotate_ref(xh.data(), c, c + half, half, neox, -1);
        rotate_ref(dn.data(), c, c + half, half, neox, -1);
      }
      double mgx = 0;
      for (int64_t e = 0; e < HD; ++e) {
        xh[e] /= std::fabs(w[e]) < KH_FLT_MIN ? 1.0 : w[e];
        mgx += dn[e] * w[e] * xh[e];
      }
      mgx /= static_cast<double>(HD);
      for (int64_t e = 0; e < HD; ++e) {
        dx[off + e] = r * (dn[e] * w[e] - xh[e] * mgx);
        terms[off + e] = r * dn[e] * w[e];
        dw[e] += dn[e] * xh[e];
      }
    };
    for (int64_t t = 0; t < k.tokens; ++t) {
      for (int64_t h = 0; h < k.q_heads; ++h)
        row_out(qo_v, dqv, qwv, dqref, dqw_ref, dqterms, t * qcols + h * hs, t,
                rq_v[t * k.q_heads + h]);
      for (int64_t h = 0; h < k.k_heads; ++h)
        row_out(ko_v, dkv, kwv, dkref, dkw_ref, dkterms, t * kcols + h * hs, t,
                rk_v[t * k.k_heads + h]);
    }
  }

  // A device executor's mirrors last one call: every argument is mirrored again.
  HeadsDl dqd(ex.arg(dq), k.q_heads, HD, hs), dkd(ex.arg(dk), k.k_heads, HD, hs);
  HeadsDl dqid(ex.arg(dqi), k.q_heads, HD, hs), dkid(ex.arg(dki), k.k_heads, HD, hs);
  HeadsDl qib(ex.arg(qi), k.q_heads, HD, hs), kib(ex.arg(ki), k.k_heads, HD, hs);
  const DLTensor* cache_b = ex.arg(cache);
  CacheDl cos_b(cache_b, half, 0, cdt), sin_b(cache_b, half, half, cdt);
  // (From the output: qi and ki hold it, and the rows' rstd follow the inputs.)
  std::vector<kh_arg_t> bwd = {targ(positions.view(ex)), targ(&dqd.t), targ(key ? &dkd.t : nullptr),
                               targ(&qib.t), targ(key ? &kib.t : nullptr)};
  if (from_output) {
    bwd.push_back(targ(ex.arg(rq)));
    bwd.push_back(targ(key ? ex.arg(rk) : nullptr));
  }
  bwd.push_back(targ(ex.arg(qw)));
  bwd.push_back(targ(key ? ex.arg(kw) : nullptr));
  if (!from_output) bwd.push_back(farg(eps));
  for (kh_arg_t a : {targ(&cos_b.t), targ(&sin_b.t), iarg(neox ? 1 : 0), targ(&dqid.t),
                     targ(key ? &dkid.t : nullptr), targ(ex.arg(dqw)),
                     targ(key ? ex.arg(dkw) : nullptr), targ(ex.arg(ws))})
    bwd.push_back(a);
  const int32_t bst = ex.call(pkg,
                              from_output ? "qk_norm_rotary_embedding_backward_from_output"
                                          : "qk_norm_rotary_embedding_backward",
                              bwd, &err);
  if (refused) {
    EXPECT_EQ(bst, KH_ERR_UNSUPPORTED) << err;
    EXPECT_EQ(first_nonfinite(dqw.values()), 0) << "a refused call wrote dquery_weight";
    return;
  }
  KH_EXPECT_OK(bst, err);
  KH_EXPECT_CLOSE_SCALED(
      heads_only(dqi.values(), k.q_heads, qcols), heads_only(dqref, k.q_heads, qcols),
      l2_norm(heads_only(dqterms, k.q_heads, qcols)), tolerance(dtype), "dquery_in");
  KH_EXPECT_CLOSE(dqw.values(), dqw_ref, tolerance(dtype), "dquery_weight");
  if (key) {
    KH_EXPECT_CLOSE_SCALED(
        heads_only(dki.values(), k.k_heads, kcols), heads_only(dkref, k.k_heads, kcols),
        l2_norm(heads_only(dkterms, k.k_heads, kcols)), tolerance(dtype), "dkey_in");
    KH_EXPECT_CLOSE(dkw.values(), dkw_ref, tolerance(dtype), "dkey_weight");
  }
  EXPECT_TRUE(dqi.gaps_untouched());
  EXPECT_TRUE(dki.gaps_untouched());
}

}  // namespace kh::kernels_test::rope_cases
