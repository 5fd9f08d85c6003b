#include "tools/demo/layers.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace kh::demo {

namespace {
// Dot product with 8 independent partial sums: vectorizable without reassociation flags.
float dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) acc[k] += a[i + k] * b[i + k];
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}
}  // namespace

void linear_forward(const float* x, const float* w, const float* bias, float* y, int64_t rows,
                    int64_t in, int64_t out) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * in;
    float* yr = y + r * out;
    for (int64_t o = 0; o < out; ++o) yr[o] = dot(xr, w + o * in, in) + (bias ? bias[o] : 0.f);
  }
}

void linear_backward(const float* x, const float* w, const float* dy, float* dx, float* dw,
                     float* dbias, int64_t rows, int64_t in, int64_t out, bool accumulate_dx) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * in;
    const float* dyr = dy + r * out;
    float* dxr = dx + r * in;
    if (!accumulate_dx) std::memset(dxr, 0, static_cast<size_t>(in) * sizeof(float));
    for (int64_t o = 0; o < out; ++o) {
      const float g = dyr[o];
      const float* wo = w + o * in;
      float* dwo = dw + o * in;
      for (int64_t i = 0; i < in; ++i) {  // two contiguous axpys over the input dimension
        dxr[i] += g * wo[i];
        dwo[i] += g * xr[i];
      }
      if (dbias) dbias[o] += g;
    }
  }
}

namespace {
// Offsets of token t's query head h in a [batch * len, heads * head_dim] tensor, of its key/value
// head (GQA: h / group) in a [batch * len, kv_heads * head_dim] one, and of its lse.
struct HeadRows {
  const AttentionShape& s;
  size_t row(int64_t b, int64_t t, int64_t h) const {
    return static_cast<size_t>(((b * s.len + t) * s.heads + h) * s.head_dim);
  }
  size_t kv_row(int64_t b, int64_t t, int64_t h) const {
    const int64_t group = s.heads / s.kv_heads;
    return static_cast<size_t>(((b * s.len + t) * s.kv_heads + h / group) * s.head_dim);
  }
  size_t lse(int64_t b, int64_t t, int64_t h) const {
    return static_cast<size_t>(h * s.batch * s.len + b * s.len + t);
  }
};
}  // namespace

void attention_forward(const AttentionShape& s, float scale, const float* q, const float* k,
                       const float* v, float* out, float* lse) {
  const HeadRows at{s};
  std::vector<float> p(static_cast<size_t>(s.len));
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h)
      for (int64_t i = 0; i < s.len; ++i) {
        const float* qi = q + at.row(b, i, h);
        float m = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j <= i; ++j) {  // causal: keys 0..i
          p[j] = dot(qi, k + at.kv_row(b, j, h), s.head_dim) * scale;
          m = std::fmax(m, p[j]);
        }
        float sum = 0.f;
        for (int64_t j = 0; j <= i; ++j) sum += (p[j] = std::exp(p[j] - m));
        float* oi = out + at.row(b, i, h);
        std::memset(oi, 0, static_cast<size_t>(s.head_dim) * sizeof(float));
        for (int64_t j = 0; j <= i; ++j) {
          const float* vj = v + at.kv_row(b, j, h);
          for (int64_t d = 0; d < s.head_dim; ++d) oi[d] += p[j] * vj[d];
        }
        const float inv = 1.0f / sum;
        for (int64_t d = 0; d < s.head_dim; ++d) oi[d] *= inv;
        if (lse) lse[at.lse(b, i, h)] = m + std::log(sum);
      }
}

void attention_backward(const AttentionShape& s, float scale, const float* q, const float* k,
                        const float* v, const float* out, const float* lse, const float* dout,
                        float* dq, float* dk, float* dv) {
  const HeadRows at{s};
  const size_t n = static_cast<size_t>(s.batch * s.len * s.heads * s.head_dim);
  const size_t n_kv = static_cast<size_t>(s.batch * s.len * s.kv_heads * s.head_dim);
  std::memset(dq, 0, n * sizeof(float));
  std::memset(dk, 0, n_kv * sizeof(float));
  std::memset(dv, 0, n_kv * sizeof(float));
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h)
      for (int64_t i = 0; i < s.len; ++i) {
        const size_t row_i = at.row(b, i, h);
        const float* qi = q + row_i;
        const float* doi = dout + row_i;
        const float l = lse[at.lse(b, i, h)];
        // delta = sum_j P dP = dout . out (the softmax's normalization gradient); then per key
        // P = exp(q.k * scale - lse), dP = dout . v, dS = P * (dP - delta); dv += P dout,
        // dq += dS k * scale, dk += dS q * scale.
        const float delta = dot(doi, out + row_i, s.head_dim);
        for (int64_t j = 0; j <= i; ++j) {
          const size_t row_j = at.kv_row(b, j, h);
          const float p = std::exp(dot(qi, k + row_j, s.head_dim) * scale - l);
          const float ds = p * (dot(doi, v + row_j, s.head_dim) - delta) * scale;
          for (int64_t d = 0; d < s.head_dim; ++d) {
            dv[row_j + d] += p * doi[d];
            dq[row_i + d] += ds * k[row_j + d];
            dk[row_j + d] += ds * qi[d];
          }
        }
      }
}

void embedding_forward(const float* table, const int64_t* tokens, float* h, int64_t rows,
                       int64_t dim) {
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(h + r * dim, table + tokens[r] * dim, static_cast<size_t>(dim) * sizeof(float));
}

void embedding_backward(const int64_t* tokens, const float* dh, float* dtable, int64_t rows,
                        int64_t dim) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t d = 0; d < dim; ++d) dtable[tokens[r] * dim + d] += dh[r * dim + d];
}

}  // namespace kh::demo
