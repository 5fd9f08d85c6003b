#include "tools/demo/layers.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

namespace kh::demo {

void linear_forward(const float* x, const float* w, float* y, int64_t rows, int64_t in,
                    int64_t out) {
  for (int64_t r = 0; r < rows; ++r) {
    float* yr = y + r * out;
    std::memset(yr, 0, static_cast<size_t>(out) * sizeof(float));
    for (int64_t i = 0; i < in; ++i) {
      const float xv = x[r * in + i];
      const float* wr = w + i * out;
      for (int64_t o = 0; o < out; ++o) yr[o] += xv * wr[o];
    }
  }
}

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

void linear_backward(const float* x, const float* w, const float* dy, float* dx, float* dw,
                     int64_t rows, int64_t in, int64_t out, bool accumulate_dx) {
  for (int64_t r = 0; r < rows; ++r) {
    const float* dyr = dy + r * out;
    for (int64_t i = 0; i < in; ++i) {
      const float xv = x[r * in + i];
      float* dwr = dw + i * out;
      for (int64_t o = 0; o < out; ++o) dwr[o] += xv * dyr[o];
      const float g = dot(dyr, w + i * out, out);
      dx[r * in + i] = accumulate_dx ? dx[r * in + i] + g : g;
    }
  }
}

void attention_forward(const AttentionShape& s, const float* q, const float* k, const float* v,
                       float* probs, float* out) {
  const int64_t width = s.heads * s.head_dim;
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h)
      for (int64_t i = 0; i < s.len; ++i) {
        float* p = probs + ((b * s.heads + h) * s.len + i) * s.len;
        const float* qi = q + (b * s.len + i) * width + h * s.head_dim;
        float m = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j <= i; ++j) {
          p[j] = dot(qi, k + (b * s.len + j) * width + h * s.head_dim, s.head_dim) * scale;
          m = std::fmax(m, p[j]);
        }
        float sum = 0.f;
        for (int64_t j = 0; j <= i; ++j) sum += (p[j] = std::exp(p[j] - m));
        for (int64_t j = 0; j <= i; ++j) p[j] /= sum;
        for (int64_t j = i + 1; j < s.len; ++j) p[j] = 0.f;  // causal mask
        float* oi = out + (b * s.len + i) * width + h * s.head_dim;
        std::memset(oi, 0, static_cast<size_t>(s.head_dim) * sizeof(float));
        for (int64_t j = 0; j <= i; ++j) {
          const float* vj = v + (b * s.len + j) * width + h * s.head_dim;
          for (int64_t d = 0; d < s.head_dim; ++d) oi[d] += p[j] * vj[d];
        }
      }
}

void attention_backward(const AttentionShape& s, const float* q, const float* k, const float* v,
                        const float* probs, const float* dout, float* dq, float* dk, float* dv) {
  const int64_t width = s.heads * s.head_dim;
  const size_t n = static_cast<size_t>(s.batch * s.len * width);
  std::memset(dq, 0, n * sizeof(float));
  std::memset(dk, 0, n * sizeof(float));
  std::memset(dv, 0, n * sizeof(float));
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
  std::vector<float> dp(static_cast<size_t>(s.len));
  for (int64_t b = 0; b < s.batch; ++b)
    for (int64_t h = 0; h < s.heads; ++h)
      for (int64_t i = 0; i < s.len; ++i) {
        const float* p = probs + ((b * s.heads + h) * s.len + i) * s.len;
        const size_t row_i = static_cast<size_t>((b * s.len + i) * width + h * s.head_dim);
        const float* doi = dout + row_i;
        // dP = dout . v^T; dv += P^T dout; dS = P * (dP - sum(P * dP)).
        float row = 0.f;
        for (int64_t j = 0; j <= i; ++j) {
          const size_t row_j = static_cast<size_t>((b * s.len + j) * width + h * s.head_dim);
          dp[j] = dot(doi, v + row_j, s.head_dim);
          row += p[j] * dp[j];
          for (int64_t d = 0; d < s.head_dim; ++d) dv[row_j + d] += p[j] * doi[d];
        }
        for (int64_t j = 0; j <= i; ++j) {
          const size_t row_j = static_cast<size_t>((b * s.len + j) * width + h * s.head_dim);
          const float ds = p[j] * (dp[j] - row) * scale;
          for (int64_t d = 0; d < s.head_dim; ++d) {
            dq[row_i + d] += ds * k[row_j + d];
            dk[row_j + d] += ds * q[row_i + d];
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
