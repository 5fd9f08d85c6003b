// The demo runtime's own layers: linear and embedding (not slots), and causal attention (the
// Attention slot's fallback), forward and manual backward, fp32 on the host. Plain loops written so that the compiler can
// vectorize the inner ones (contiguous axpy over the output dimension); that keeps a few hundred
// training steps of the tiny model within seconds on one core.
#pragma once

#include <cstdint>

namespace kh::demo {

// y[rows, out] = x[rows, in] . w^T (+ bias[out]): w is [out, in], as nn.Linear and Transformers
// checkpoints store it. bias may be NULL.
void linear_forward(const float* x, const float* w, const float* bias, float* y, int64_t rows,
                    int64_t in, int64_t out);
// dw[out, in] += dy^T . x;  dbias[out] += the column sums of dy (when not NULL);
// dx[rows, in] = dy . w (added to dx when accumulate_dx).
void linear_backward(const float* x, const float* w, const float* dy, float* dx, float* dw,
                     float* dbias, int64_t rows, int64_t in, int64_t out, bool accumulate_dx);

// Causal multi-head attention over `batch` padded sequences of `len` tokens, in the LSE
// formulation of FlashAttention: q and out are [batch, len, heads, head_dim] (the same memory
// as [batch * len, heads * head_dim]), k and v [batch, len, kv_heads, head_dim] (grouped-query
// attention: query head h reads key/value head h / (heads / kv_heads), as Transformers'
// repeat_kv); lse [heads, batch * len] is the fp32 log-sum-exp of each
// query's scaled scores, all backward needs besides q, k, v and out (P = exp(q.k * scale - lse)
// is recomputed, so nothing [len, len] is kept). These are the Attention slot's fallback
// (fallback_ops.cpp). lse may be NULL (eval).
struct AttentionShape {
  int64_t batch = 0, len = 0, heads = 0, head_dim = 0;
  int64_t kv_heads = 0;  // divides heads
};
void attention_forward(const AttentionShape& s, float scale, const float* q, const float* k,
                       const float* v, float* out, float* lse);
// dq, dk, dv are overwritten (dk and dv sum over the query heads of their group).
void attention_backward(const AttentionShape& s, float scale, const float* q, const float* k,
                        const float* v, const float* out, const float* lse, const float* dout,
                        float* dq, float* dk, float* dv);

// h[t] = table[tokens[t]];  dtable[tokens[t]] += dh[t].
void embedding_forward(const float* table, const int64_t* tokens, float* h, int64_t rows,
                       int64_t dim);
void embedding_backward(const int64_t* tokens, const float* dh, float* dtable, int64_t rows,
                        int64_t dim);

}  // namespace kh::demo
