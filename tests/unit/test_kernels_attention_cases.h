// Test cases of the attention package shared by the cpu tests (tests/unit/test_kernels_attention.cpp)
// and the GPU tests (tests/gpu/test_kernels_gpu_attention.cpp): float64 references and functions
// that run attention_forward (padded and packed varlen batches, GQA/MQA, causal, sliding window,
// cross-attention lengths, the log-sum-exp) and paged_kv_append + paged_attention_decode (a
// scrambled block table, a few query tokens, a window) for a dtype and shape on an Executor.
// Inputs are fresh normal samples; outputs are poisoned before each call.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <numeric>
#include <random>
#include <vector>

#include "tests/unit/test_kernels_util.h"

namespace kh::kernels_test::attention_cases {

using V = std::vector<double>;

// An N-d view (shape, strides, dtype) of the storage of a tensor an Executor handed out.
struct NdView {
  int64_t shape[4], strides[4];
  DLTensor t;
  // row_stride > 0: the axes before the last two (a [.., tokens, heads, head_dim] view's tokens)
  // step row_stride elements, rows padded past heads * head_dim.
  NdView(const DLTensor* base, std::vector<int64_t> dims, DLDataType dtype = {0, 0, 0},
         int64_t row_stride = 0) {
    t = *base;
    t.ndim = static_cast<int32_t>(dims.size());
    int64_t s = 1;
    for (int i = t.ndim - 1; i >= 0; --i) {
      shape[i] = dims[i];
      strides[i] = s;
      s *= dims[i];
      if (row_stride > 0 && i == t.ndim - 2) s = row_stride;
    }
    t.shape = shape;
    t.strides = strides;
    if (dtype.bits) t.dtype = dtype;
  }
};

// Int32 values kept in the bits of an fp32 HostTensor (the test tensors are float types); the
// op sees them through an NdView with dtype int32.
inline HostTensor int32_tensor(const std::vector<int32_t>& values) {
  HostTensor t(kFP32, 1, static_cast<int64_t>(std::max<size_t>(values.size(), 1)));
  for (size_t i = 0; i < values.size(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &values[i], 4);
    t.set_bits(static_cast<int64_t>(i), bits);
  }
  return t;
}
constexpr DLDataType kInt32{kDLInt, 32, 1};
constexpr DLDataType kFloat32{kDLFloat, 32, 1};

inline HostTensor random_tensor(int dtype, int64_t rows, int64_t cols, std::mt19937_64& rng) {
  HostTensor t(dtype, rows, cols);
  std::normal_distribution<double> n(0.0, 1.0);
  t.fill([&](int64_t, int64_t) { return n(rng); });
  return t;
}

// float64 attention of one query row against keys [0, len_k) with a visibility rule; out gets
// head_dim values; returns the log-sum-exp (-inf when nothing is visible, out then zeros).
template <typename Visible, typename KeyAt, typename ValAt>
double attend(const V& q, int64_t len_k, int64_t head_dim, double scale, Visible visible, KeyAt key,
              ValAt val, double* out) {
  V s(static_cast<size_t>(len_k), -INFINITY);
  double m = -INFINITY;
  for (int64_t j = 0; j < len_k; ++j) {
    if (!visible(j)) continue;
    double d = 0;
    for (int64_t e = 0; e < head_dim; ++e) d += q[e] * key(j, e);
    s[j] = d * scale;
    m = std::max(m, s[j]);
  }
  std::fill(out, out + head_dim, 0.0);
  if (m == -INFINITY) return -INFINITY;
  double sum = 0;
  for (int64_t j = 0; j < len_k; ++j) {
    if (s[j] == -INFINITY) continue;
    const double w = std::exp(s[j] - m);
    sum += w;
    for (int64_t e = 0; e < head_dim; ++e) out[e] += w * val(j, e);
  }
  for (int64_t e = 0; e < head_dim; ++e) out[e] /= sum;
  return m + std::log(sum);
}

inline bool visible(int64_t i, int64_t j, int64_t offset, bool causal, int64_t window) {
  if (causal && j > i + offset) return false;
  if (window >= 0 && j < i + offset - window) return false;
  return true;
}

struct ForwardCase {
  int64_t q_heads, kv_heads, head_dim;
  std::vector<int32_t> lens_q, lens_k;  // per sequence; varlen when `packed`
  bool packed;                          // cu_seqlens (else padded: every length equal)
  bool causal;
  int64_t window;  // -1: none
  bool with_lse;
  // Elements after each token row of the outputs (out, dq, dk, dv): the ops must write by the
  // outputs' own token stride (on cuda a multiple of 8 elements; the cpu takes any).
  int64_t out_pad = 0;
};

// Runs attention_forward for `c` and checks out (and lse) against float64.
inline void run_forward(Executor& ex, const Package& pkg, int dtype, const ForwardCase& c,
                        std::mt19937_64& rng) {
  const int64_t B = static_cast<int64_t>(c.lens_q.size()), H = c.q_heads, HK = c.kv_heads,
                D = c.head_dim;
  std::vector<int32_t> cu_q{0}, cu_k{0};
  for (int64_t b = 0; b < B; ++b) {
    cu_q.push_back(cu_q.back() + c.lens_q[b]);
    cu_k.push_back(cu_k.back() + c.lens_k[b]);
  }
  const int64_t tq = cu_q.back(), tk = cu_k.back();
  SCOPED_TRACE(testing::Message() << dtype_name(dtype) << " H " << H << "/" << HK << " D " << D
                                  << " B " << B << " tokens " << tq << "/" << tk
                                  << (c.packed ? " packed" : " padded")
                                  << (c.causal ? " causal" : "") << " window " << c.window);
  HostTensor q = random_tensor(dtype, tq, H * D, rng), k = random_tensor(dtype, tk, HK * D, rng),
             v = random_tensor(dtype, tk, HK * D, rng), out(dtype, tq, H * D + c.out_pad),
             lse(kFP32, H, std::max<int64_t>(tq, 1));
  HostTensor cuq = int32_tensor(cu_q), cuk = int32_tensor(cu_k);
  auto shape = [&](int64_t tokens, int64_t heads, int64_t seqlen) {
    return c.packed ? std::vector<int64_t>{tokens, heads, D}
                    : std::vector<int64_t>{B, seqlen, heads, D};
  };
  NdView qv(ex.arg(q), shape(tq, H, c.lens_q[0])), kv(ex.arg(k), shape(tk, HK, c.lens_k[0])),
      vv(ex.arg(v), shape(tk, HK, c.lens_k[0])),
      ov(ex.arg(out), shape(tq, H, c.lens_q[0]), {0, 0, 0}, H * D + c.out_pad),
      lv(ex.arg(lse), {H, tq}), cqv(ex.arg(cuq), {B + 1}, kInt32),
      ckv(ex.arg(cuk), {B + 1}, kInt32);
  const int32_t max_q = *std::max_element(c.lens_q.begin(), c.lens_q.end());
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  std::string err;
  std::vector<kh_arg_t> args = {targ(&qv.t),
                                targ(&kv.t),
                                targ(&vv.t),
                                targ(c.packed ? &cqv.t : nullptr),
                                targ(c.packed ? &ckv.t : nullptr),
                                iarg(c.packed ? max_q : 0),
                                iarg(c.causal),
                                iarg(c.window),
                                farg(scale),
                                targ(&ov.t),
                                targ(c.with_lse ? &lv.t : nullptr)};
  KH_EXPECT_OK(ex.call(pkg, "attention_forward", args, &err), err);

  V got, want, got_lse, want_lse;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t lq = c.lens_q[b], lk = c.lens_k[b], off = lk - lq;
    for (int64_t h = 0; h < H; ++h) {
      const int64_t hk = h / (H / HK);
      for (int64_t i = 0; i < lq; ++i) {
        V qrow(D);
        for (int64_t e = 0; e < D; ++e) qrow[e] = q.get(cu_q[b] + i, h * D + e);
        V o(D);
        const double l = attend(
            qrow, lk, D, scale, [&](int64_t j) { return visible(i, j, off, c.causal, c.window); },
            [&](int64_t j, int64_t e) { return k.get(cu_k[b] + j, hk * D + e); },
            [&](int64_t j, int64_t e) { return v.get(cu_k[b] + j, hk * D + e); }, o.data());
        for (int64_t e = 0; e < D; ++e) {
          want.push_back(o[e]);
          got.push_back(out.get(cu_q[b] + i, h * D + e));
        }
        if (c.with_lse && std::isfinite(l)) {
          want_lse.push_back(l);
          got_lse.push_back(lse.get(h, cu_q[b] + i));
        } else if (c.with_lse) {
          EXPECT_EQ(lse.get(h, cu_q[b] + i), -INFINITY) << "row with no visible key";
        }
      }
    }
  }
  KH_EXPECT_CLOSE(got, want, tolerance(dtype), "attention_forward out");
  if (c.with_lse) KH_EXPECT_CLOSE(got_lse, want_lse, 1e-5, "attention_forward lse");
}

// Runs attention_forward (with lse) then attention_backward for `c` and checks dq, dk and dv
// against float64 gradients of softmax(scale * q k^T) v.
inline void run_backward(Executor& ex, const Package& pkg, int dtype, const ForwardCase& c,
                         std::mt19937_64& rng) {
  const int64_t B = static_cast<int64_t>(c.lens_q.size()), H = c.q_heads, HK = c.kv_heads,
                D = c.head_dim, G = H / HK;
  std::vector<int32_t> cu_q{0}, cu_k{0};
  for (int64_t b = 0; b < B; ++b) {
    cu_q.push_back(cu_q.back() + c.lens_q[b]);
    cu_k.push_back(cu_k.back() + c.lens_k[b]);
  }
  const int64_t tq = cu_q.back(), tk = cu_k.back();
  SCOPED_TRACE(testing::Message() << dtype_name(dtype) << " backward H " << H << "/" << HK << " D "
                                  << D << " B " << B << " tokens " << tq << "/" << tk
                                  << (c.packed ? " packed" : " padded")
                                  << (c.causal ? " causal" : "") << " window " << c.window);
  HostTensor q = random_tensor(dtype, tq, H * D, rng), k = random_tensor(dtype, tk, HK * D, rng),
             v = random_tensor(dtype, tk, HK * D, rng), g = random_tensor(dtype, tq, H * D, rng),
             out(dtype, tq, H * D + c.out_pad), lse(kFP32, H, std::max<int64_t>(tq, 1)),
             dq(dtype, tq, H * D + c.out_pad), dk(dtype, tk, HK * D + c.out_pad),
             dv(dtype, tk, HK * D + c.out_pad),
             ws(kFP32, 1, std::max<int64_t>(tq * H * (D + 1), 1));
  HostTensor cuq = int32_tensor(cu_q), cuk = int32_tensor(cu_k);
  auto shape = [&](int64_t tokens, int64_t heads, int64_t seqlen) {
    return c.packed ? std::vector<int64_t>{tokens, heads, D}
                    : std::vector<int64_t>{B, seqlen, heads, D};
  };
  const int64_t sq = c.lens_q[0], sk = c.lens_k[0];
  const int64_t q_row = H * D + c.out_pad, k_row = HK * D + c.out_pad;  // the outputs' rows
  const int32_t max_q = *std::max_element(c.lens_q.begin(), c.lens_q.end());
  const int32_t max_k = *std::max_element(c.lens_k.begin(), c.lens_k.end());
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  std::string err;
  {  // Views are taken per call: an Executor's device copies last one call.
    NdView qv(ex.arg(q), shape(tq, H, sq)), kv(ex.arg(k), shape(tk, HK, sk)),
        vv(ex.arg(v), shape(tk, HK, sk)), ov(ex.arg(out), shape(tq, H, sq), {0, 0, 0}, q_row),
        lv(ex.arg(lse), {H, tq}), cqv(ex.arg(cuq), {B + 1}, kInt32),
        ckv(ex.arg(cuk), {B + 1}, kInt32);
    KH_EXPECT_OK(ex.call(pkg, "attention_forward",
                         {targ(&qv.t), targ(&kv.t), targ(&vv.t), targ(c.packed ? &cqv.t : nullptr),
                          targ(c.packed ? &ckv.t : nullptr), iarg(c.packed ? max_q : 0),
                          iarg(c.causal), iarg(c.window), farg(scale), targ(&ov.t), targ(&lv.t)},
                         &err),
                 err);
  }
  {
    NdView qv(ex.arg(q), shape(tq, H, sq)), kv(ex.arg(k), shape(tk, HK, sk)),
        vv(ex.arg(v), shape(tk, HK, sk)), gv(ex.arg(g), shape(tq, H, sq)),
        ov(ex.arg(out), shape(tq, H, sq), {0, 0, 0}, q_row), lv(ex.arg(lse), {H, tq}),
        dqv(ex.arg(dq), shape(tq, H, sq), {0, 0, 0}, q_row),
        dkv(ex.arg(dk), shape(tk, HK, sk), {0, 0, 0}, k_row),
        dvv(ex.arg(dv), shape(tk, HK, sk), {0, 0, 0}, k_row),
        wv(ex.arg(ws), {std::max<int64_t>(tq * H * (D + 1), 1)}), cqv(ex.arg(cuq), {B + 1}, kInt32),
        ckv(ex.arg(cuk), {B + 1}, kInt32);
    KH_EXPECT_OK(ex.call(pkg, "attention_backward",
                         {targ(&gv.t), targ(&qv.t), targ(&kv.t), targ(&vv.t), targ(&ov.t),
                          targ(&lv.t), targ(c.packed ? &cqv.t : nullptr),
                          targ(c.packed ? &ckv.t : nullptr), iarg(c.packed ? max_q : 0),
                          iarg(c.packed ? max_k : 0), iarg(c.causal), iarg(c.window), farg(scale),
                          targ(&dqv.t), targ(&dkv.t), targ(&dvv.t), targ(&wv.t)},
                         &err),
                 err);
  }
  V want_dq(static_cast<size_t>(tq * H * D), 0.0), want_dk(static_cast<size_t>(tk * HK * D), 0.0),
      want_dv(static_cast<size_t>(tk * HK * D), 0.0);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t lq = c.lens_q[b], lk = c.lens_k[b], off = lk - lq;
    for (int64_t h = 0; h < H; ++h) {
      const int64_t hk = h / G;
      for (int64_t i = 0; i < lq; ++i) {
        const int64_t qi = cu_q[b] + i;
        V qrow(D), orow(D);
        for (int64_t e = 0; e < D; ++e) qrow[e] = q.get(qi, h * D + e);
        auto vis = [&](int64_t j) { return visible(i, j, off, c.causal, c.window); };
        auto key = [&](int64_t j, int64_t e) { return k.get(cu_k[b] + j, hk * D + e); };
        auto val = [&](int64_t j, int64_t e) { return v.get(cu_k[b] + j, hk * D + e); };
        const double l = attend(qrow, lk, D, scale, vis, key, val, orow.data());
        if (!std::isfinite(l)) continue;
        double delta = 0;
        for (int64_t e = 0; e < D; ++e) delta += g.get(qi, h * D + e) * orow[e];
        for (int64_t j = 0; j < lk; ++j) {
          if (!vis(j)) continue;
          double s = 0, dp = 0;
          for (int64_t e = 0; e < D; ++e) {
            s += qrow[e] * key(j, e);
            dp += g.get(qi, h * D + e) * val(j, e);
          }
          const double prob = std::exp(s * scale - l), ds = prob * (dp - delta);
          const int64_t kj = cu_k[b] + j;
          for (int64_t e = 0; e < D; ++e) {
            want_dq[(qi * H + h) * D + e] += scale * ds * key(j, e);
            want_dk[(kj * HK + hk) * D + e] += scale * ds * qrow[e];
            want_dv[(kj * HK + hk) * D + e] += prob * g.get(qi, h * D + e);
          }
        }
      }
    }
  }
  V got_dq, got_dk, got_dv;
  for (int64_t t = 0; t < tq; ++t)
    for (int64_t x = 0; x < H * D; ++x) got_dq.push_back(dq.get(t, x));
  for (int64_t t = 0; t < tk; ++t)
    for (int64_t x = 0; x < HK * D; ++x) {
      got_dk.push_back(dk.get(t, x));
      got_dv.push_back(dv.get(t, x));
    }
  KH_EXPECT_CLOSE(got_dq, want_dq, 2 * tolerance(dtype), "attention_backward dq");
  KH_EXPECT_CLOSE(got_dk, want_dk, 2 * tolerance(dtype), "attention_backward dk");
  KH_EXPECT_CLOSE(got_dv, want_dv, 2 * tolerance(dtype), "attention_backward dv");
}

struct DecodeCase {
  int64_t q_heads, kv_heads, head_dim;
  std::vector<int32_t> lens;  // context per sequence after the append
  int64_t q_tokens, new_tokens, page_size, window;
  bool workspace;
};

// Fills a paged cache (pages in a scrambled order) with the first len - new_tokens tokens,
// appends the last new_tokens with paged_kv_append, decodes q_tokens queries with
// paged_attention_decode, and checks the cache contents and the output against float64; then
// paged_attention_decode_append on the cache as it was before the append: the same cache and
// the same output, bit for bit (on cuda the tensor-core decode reads the new tokens from k_new /
// v_new and writes them itself; elsewhere the op appends first).
inline void run_decode(Executor& ex, const Package& pkg, int dtype, const DecodeCase& c,
                       std::mt19937_64& rng) {
  const int64_t B = static_cast<int64_t>(c.lens.size()), H = c.q_heads, HK = c.kv_heads,
                D = c.head_dim, P = c.page_size, NQ = c.q_tokens, NN = c.new_tokens;
  SCOPED_TRACE(testing::Message() << dtype_name(dtype) << " decode H " << H << "/" << HK << " D "
                                  << D << " B " << B << " page " << P << " q_tokens " << NQ
                                  << " new " << NN << " window " << c.window);
  const int64_t max_len = *std::max_element(c.lens.begin(), c.lens.end());
  const int64_t per_seq = (max_len + P - 1) / P, pages = B * per_seq + 3;  // spare pages
  std::vector<int32_t> order(static_cast<size_t>(pages));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<int32_t> table(static_cast<size_t>(B * per_seq));
  for (size_t i = 0; i < table.size(); ++i) table[i] = order[i];
  // The logical K/V of every sequence, [b][t][hk * D + e].
  std::vector<HostTensor> keys, vals;
  for (int64_t b = 0; b < B; ++b) {
    keys.push_back(random_tensor(dtype, c.lens[b], HK * D, rng));
    vals.push_back(random_tensor(dtype, c.lens[b], HK * D, rng));
  }
  HostTensor kc(dtype, pages * P, HK * D), vc(dtype, pages * P, HK * D);
  kc.fill([](int64_t, int64_t) { return 0.0; });
  vc.fill([](int64_t, int64_t) { return 0.0; });
  HostTensor kn(dtype, B * NN, HK * D), vn(dtype, B * NN, HK * D);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < c.lens[b]; ++t) {
      const int64_t row = table[b * per_seq + t / P] * P + t % P, n = t - (c.lens[b] - NN);
      for (int64_t x = 0; x < HK * D; ++x) {
        if (n >= 0) {  // appended by the op
          kn.set(b * NN + n, x, keys[b].get(t, x));
          vn.set(b * NN + n, x, vals[b].get(t, x));
        } else {
          kc.set(row, x, keys[b].get(t, x));
          vc.set(row, x, vals[b].get(t, x));
        }
      }
    }
  HostTensor tab = int32_tensor(table), lens = int32_tensor(c.lens);
  HostTensor q = random_tensor(dtype, B * NQ, H * D, rng), out(dtype, B * NQ, H * D);
  const int64_t ws_elems = B * NQ * H * 32 * (D + 2);
  HostTensor ws(kFP32, 1, ws_elems);
  std::string err;
  HostTensor kc_before = kc, vc_before = vc;
  {  // Views are taken per call: an Executor's device copies last one call.
    NdView kcv(ex.arg(kc), {pages, P, HK, D}), vcv(ex.arg(vc), {pages, P, HK, D}),
        knv(ex.arg(kn), {B, NN, HK, D}), vnv(ex.arg(vn), {B, NN, HK, D}),
        tv(ex.arg(tab), {B, per_seq}, kInt32), lv(ex.arg(lens), {B}, kInt32);
    KH_EXPECT_OK(
        ex.call(pkg, "paged_kv_append",
                {targ(&knv.t), targ(&vnv.t), targ(&tv.t), targ(&lv.t), targ(&kcv.t), targ(&vcv.t)},
                &err),
        err);
  }
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = c.lens[b] - NN; t < c.lens[b]; ++t) {
      const int64_t row = table[b * per_seq + t / P] * P + t % P;
      for (int64_t x = 0; x < HK * D; ++x) {
        ASSERT_EQ(kc.get(row, x), keys[b].get(t, x))
            << "appended key, sequence " << b << " token " << t;
        ASSERT_EQ(vc.get(row, x), vals[b].get(t, x)) << "appended value";
      }
    }
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  {
    NdView kcv(ex.arg(kc), {pages, P, HK, D}), vcv(ex.arg(vc), {pages, P, HK, D}),
        tv(ex.arg(tab), {B, per_seq}, kInt32), lv(ex.arg(lens), {B}, kInt32),
        qv(ex.arg(q), {B, NQ, H, D}), ov(ex.arg(out), {B, NQ, H, D}), wv(ex.arg(ws), {ws_elems});
    KH_EXPECT_OK(
        ex.call(pkg, "paged_attention_decode",
                {targ(&qv.t), targ(&kcv.t), targ(&vcv.t), targ(&tv.t), targ(&lv.t), iarg(c.window),
                 farg(scale), targ(&ov.t), targ(c.workspace ? &wv.t : nullptr)},
                &err),
        err);
  }
  V got, want;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < NQ; ++i) {
      const int64_t pos = c.lens[b] - NQ + i;
      for (int64_t h = 0; h < H; ++h) {
        const int64_t hk = h / (H / HK);
        V qrow(D), o(D);
        for (int64_t e = 0; e < D; ++e) qrow[e] = q.get(b * NQ + i, h * D + e);
        attend(
            qrow, c.lens[b], D, scale,
            [&](int64_t j) { return j <= pos && (c.window < 0 || j >= pos - c.window); },
            [&](int64_t j, int64_t e) { return keys[b].get(j, hk * D + e); },
            [&](int64_t j, int64_t e) { return vals[b].get(j, hk * D + e); }, o.data());
        for (int64_t e = 0; e < D; ++e) {
          want.push_back(o[e]);
          got.push_back(out.get(b * NQ + i, h * D + e));
        }
      }
    }
  KH_EXPECT_CLOSE(got, want, tolerance(dtype), "paged_attention_decode out");

  HostTensor& kf = kc_before;
  HostTensor& vf = vc_before;
  HostTensor out_fused(dtype, B * NQ, H * D);
  {
    NdView kcv(ex.arg(kf), {pages, P, HK, D}), vcv(ex.arg(vf), {pages, P, HK, D}),
        knv(ex.arg(kn), {B, NN, HK, D}), vnv(ex.arg(vn), {B, NN, HK, D}),
        tv(ex.arg(tab), {B, per_seq}, kInt32), lv(ex.arg(lens), {B}, kInt32),
        qv(ex.arg(q), {B, NQ, H, D}), ov(ex.arg(out_fused), {B, NQ, H, D}),
        wv(ex.arg(ws), {ws_elems});
    KH_EXPECT_OK(ex.call(pkg, "paged_attention_decode_append",
                         {targ(&qv.t), targ(&knv.t), targ(&vnv.t), targ(&kcv.t), targ(&vcv.t),
                          targ(&tv.t), targ(&lv.t), iarg(c.window), farg(scale), targ(&ov.t),
                          targ(c.workspace ? &wv.t : nullptr)},
                         &err),
                 err);
  }
  int64_t cache_diff = 0, out_diff = 0;
  for (int64_t i = 0; i < pages * P * HK * D; ++i)
    cache_diff += kf.bits_at(i) != kc.bits_at(i) || vf.bits_at(i) != vc.bits_at(i);
  for (int64_t i = 0; i < B * NQ * H * D; ++i) out_diff += out_fused.bits_at(i) != out.bits_at(i);
  EXPECT_EQ(cache_diff, 0) << "paged_attention_decode_append's cache != paged_kv_append's";
  EXPECT_EQ(out_diff, 0) << "paged_attention_decode_append's out != paged_attention_decode's";
}

// Runs run(ex, pkg, dtype, case, rng) for every dtype and case from one fresh seed (named by any
// failure), stopping at the first fatal failure. run is run_forward, run_backward or run_decode.
template <typename Case, size_t N, typename Run>
void run_cases(Executor& ex, const Package& pkg, std::initializer_list<int> dtypes,
               const Case (&cases)[N], Run run) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  for (int dtype : dtypes)
    for (const Case& c : cases) {
      run(ex, pkg, dtype, c, rng);
      if (::testing::Test::HasFatalFailure()) return;
    }
}

}  // namespace kh::kernels_test::attention_cases
