// The demo runtime's own layers, which are not slots: linear, causal attention and embedding,
// forward and manual backward, fp32 on the host. Plain loops written so that the compiler can
// vectorize the inner ones (contiguous axpy over the output dimension); that keeps a few hundred
// training steps of the tiny model within seconds on one core.
#pragma once

#include <cstdint>

namespace kh::demo {

// y[rows, out] = x[rows, in] . w[in, out]   (w stored input-major)
void linear_forward(const float* x, const float* w, float* y, int64_t rows, int64_t in,
                    int64_t out);
// dw[in, out] += x^T . dy;  dx[rows, in] = dy . w^T (added to dx when accumulate_dx).
void linear_backward(const float* x, const float* w, const float* dy, float* dx, float* dw,
                     int64_t rows, int64_t in, int64_t out, bool accumulate_dx);

// Causal multi-head attention over `batch` sequences of `len` tokens. q, k, v, out are
// [batch * len, heads * head_dim]; probs [batch, heads, len, len] keeps the softmax for backward.
struct AttentionShape {
  int64_t batch = 0, len = 0, heads = 0, head_dim = 0;
};
void attention_forward(const AttentionShape& s, const float* q, const float* k, const float* v,
                       float* probs, float* out);
// dq, dk, dv are overwritten.
void attention_backward(const AttentionShape& s, const float* q, const float* k, const float* v,
                        const float* probs, const float* dout, float* dq, float* dk, float* dv);

// h[t] = table[tokens[t]];  dtable[tokens[t]] += dh[t].
void embedding_forward(const float* table, const int64_t* tokens, float* h, int64_t rows,
                       int64_t dim);
void embedding_backward(const int64_t* tokens, const float* dh, float* dtable, int64_t rows,
                        int64_t dim);

}  // namespace kh::demo
