#include "kernels/attention/cpu.h"

#include <math.h>

#include <vector>

#include "kernels/common/tensor_args.h"

namespace khk::attention_cpu {
namespace {

template <typename T>
float dot(const T* a, const T* b, int n) {
  float s = 0.f;
  for (int i = 0; i < n; ++i) s += kh_to_float(a[i]) * kh_to_float(b[i]);
  return s;
}

// Softmax-weighted sum of `keys` rows of v for one query; scores[j] = -inf for keys it does not
// see. Writes out (and *lse when lse is not NULL).
template <typename T>
void softmax_rows(const std::vector<float>& scores, int head_dim,
                  const std::vector<const T*>& vrows, T* out, float* lse) {
  float m = -INFINITY;
  for (float s : scores) m = fmaxf(m, s);
  std::vector<float> acc(head_dim, 0.f);
  float sum = 0.f;
  if (m != -INFINITY) {
    for (size_t j = 0; j < scores.size(); ++j) {
      if (scores[j] == -INFINITY) continue;
      const float e = expf(scores[j] - m);
      sum += e;
      for (int d = 0; d < head_dim; ++d) acc[d] += e * kh_to_float(vrows[j][d]);
    }
  }
  for (int d = 0; d < head_dim; ++d)
    out[d] = kh_convert<T>::from_float(sum > 0.f ? acc[d] / sum : 0.f);
  if (lse) *lse = sum > 0.f ? m + logf(sum) : -INFINITY;
}

template <typename T>
void forward_t(int head_dim, const kh_attn_params& p) {
  const int group = p.q_heads / p.kv_heads;
  for (int b = 0; b < p.batch; ++b) {
    int q0, len_q, k0, len_k;
    kh_attn_seq(p, b, &q0, &len_q, &k0, &len_k);
    const int offset = len_k - len_q;
    for (int h = 0; h < p.q_heads; ++h) {
      const int hk = h / group;
      std::vector<const T*> vrows(len_k);
      for (int j = 0; j < len_k; ++j)
        vrows[j] = (const T*)p.v + (kh_i64)(k0 + j) * p.v_row + (kh_i64)hk * p.v_head;
      for (int i = 0; i < len_q; ++i) {
        const T* q = (const T*)p.q + (kh_i64)(q0 + i) * p.q_row + (kh_i64)h * p.q_head;
        std::vector<float> scores(len_k, -INFINITY);
        for (int j = 0; j < len_k; ++j) {
          if (!kh_attn_visible(i, j, offset, p.causal, p.window_left)) continue;
          const T* k = (const T*)p.k + (kh_i64)(k0 + j) * p.k_row + (kh_i64)hk * p.k_head;
          scores[j] = dot(q, k, head_dim) * p.scale;
        }
        T* o = (T*)p.o + (kh_i64)(q0 + i) * p.o_row + (kh_i64)h * p.o_head;
        softmax_rows(scores, head_dim, vrows, o,
                     p.lse ? p.lse + (kh_i64)h * p.lse_head + q0 + i : nullptr);
      }
    }
  }
}

template <typename T>
void backward_t(int head_dim, const kh_attn_bwd_params& bp) {
  const kh_attn_params& p = bp.f;
  const int group = p.q_heads / p.kv_heads, D = head_dim;
  for (int b = 0; b < p.batch; ++b) {
    int q0, len_q, k0, len_k;
    kh_attn_seq(p, b, &q0, &len_q, &k0, &len_k);
    const int offset = len_k - len_q;
    for (int hk = 0; hk < p.kv_heads; ++hk) {
      std::vector<float> dk((size_t)len_k * D, 0.f), dv((size_t)len_k * D, 0.f);
      for (int h = hk * group; h < (hk + 1) * group; ++h) {
        for (int i = 0; i < len_q; ++i) {
          const T* q = (const T*)p.q + (kh_i64)(q0 + i) * p.q_row + (kh_i64)h * p.q_head;
          const T* o = (const T*)p.o + (kh_i64)(q0 + i) * p.o_row + (kh_i64)h * p.o_head;
          const T* g = (const T*)bp.dout + (kh_i64)(q0 + i) * bp.do_row + (kh_i64)h * bp.do_head;
          const float lse = p.lse[(kh_i64)h * p.lse_head + q0 + i];
          float delta = 0.f;
          for (int d = 0; d < D; ++d) delta += kh_to_float(g[d]) * kh_to_float(o[d]);
          std::vector<float> dq(D, 0.f);
          for (int j = 0; j < len_k && lse != -INFINITY; ++j) {
            if (!kh_attn_visible(i, j, offset, p.causal, p.window_left)) continue;
            const T* k = (const T*)p.k + (kh_i64)(k0 + j) * p.k_row + (kh_i64)hk * p.k_head;
            const T* v = (const T*)p.v + (kh_i64)(k0 + j) * p.v_row + (kh_i64)hk * p.v_head;
            const float prob = expf(dot(q, k, D) * p.scale - lse);
            const float ds = prob * (dot(g, v, D) - delta);
            for (int d = 0; d < D; ++d) {
              dq[d] += ds * kh_to_float(k[d]);
              dk[(size_t)j * D + d] += ds * kh_to_float(q[d]);
              dv[(size_t)j * D + d] += prob * kh_to_float(g[d]);
            }
          }
          T* dqr = (T*)bp.dq + (kh_i64)(q0 + i) * bp.dq_row + (kh_i64)h * bp.dq_head;
          for (int d = 0; d < D; ++d) dqr[d] = kh_convert<T>::from_float(dq[d] * p.scale);
        }
      }
      for (int j = 0; j < len_k; ++j) {
        T* dkr = (T*)bp.dk + (kh_i64)(k0 + j) * bp.dk_row + (kh_i64)hk * bp.dk_head;
        T* dvr = (T*)bp.dv + (kh_i64)(k0 + j) * bp.dv_row + (kh_i64)hk * bp.dv_head;
        for (int d = 0; d < D; ++d) {
          dkr[d] = kh_convert<T>::from_float(dk[(size_t)j * D + d] * p.scale);
          dvr[d] = kh_convert<T>::from_float(dv[(size_t)j * D + d]);
        }
      }
    }
  }
}

template <typename T>
void decode_t(int head_dim, const kh_decode_params& p) {
  const int group = p.q_heads / p.kv_heads;
  const float scale = p.scale_log2 / 1.4426950408889634f;
  for (int b = 0; b < p.batch; ++b) {
    const int len = p.kv.seq_lens[b];
    for (int qi = 0; qi < p.q_tokens; ++qi) {
      const int pos = len - p.q_tokens + qi;
      const kh_i64 tok = (kh_i64)b * p.q_tokens + qi;
      for (int h = 0; h < p.q_heads; ++h) {
        const int hk = h / group;
        const T* q = (const T*)p.q + tok * p.q_row + (kh_i64)h * p.q_head;
        std::vector<float> scores(len > 0 ? len : 0, -INFINITY);
        std::vector<const T*> vrows(scores.size());
        for (int t = 0; t < len; ++t) {
          kh_i64 ko, vo;
          kh_paged_offsets(p.kv, b, t, hk, &ko, &vo);
          vrows[t] = (const T*)p.kv.v + vo;
          if (t > pos || (p.window_left >= 0 && t < pos - p.window_left)) continue;
          scores[t] = dot(q, (const T*)p.kv.k + ko, head_dim) * scale;
        }
        softmax_rows(scores, head_dim, vrows, (T*)p.o + tok * p.o_row + (kh_i64)h * p.o_head,
                     nullptr);
      }
    }
  }
}

template <typename T>
void append_t(const kh_append_params& p) {
  for (int b = 0; b < p.batch; ++b)
    for (int j = 0; j < p.nw.n; ++j) {
      const int t = p.kv.seq_lens[b] - p.nw.n + j;
      if (t < 0) continue;
      const kh_i64 i = (kh_i64)b * p.nw.n + j;
      for (int hk = 0; hk < p.kv_heads; ++hk) {
        kh_i64 ko, vo;
        kh_paged_offsets(p.kv, b, t, hk, &ko, &vo);
        for (int d = 0; d < p.head_dim; ++d) {
          ((T*)p.kv.k)[ko + d] = ((const T*)p.nw.k)[i * p.nw.k_row + hk * p.nw.k_head + d];
          ((T*)p.kv.v)[vo + d] = ((const T*)p.nw.v)[i * p.nw.v_row + hk * p.nw.v_head + d];
        }
      }
    }
}

}  // namespace

void forward(int dtype, int head_dim, const kh_attn_params& p) {
  if (dtype == kBF16)
    forward_t<kh_bf16>(head_dim, p);
  else if (dtype == kFP16)
    forward_t<kh_fp16>(head_dim, p);
  else
    forward_t<float>(head_dim, p);
}

void backward(int dtype, int head_dim, const kh_attn_bwd_params& p) {
  if (dtype == kBF16)
    backward_t<kh_bf16>(head_dim, p);
  else if (dtype == kFP16)
    backward_t<kh_fp16>(head_dim, p);
  else
    backward_t<float>(head_dim, p);
}

void decode(int dtype, int head_dim, const kh_decode_params& p) {
  if (dtype == kBF16)
    decode_t<kh_bf16>(head_dim, p);
  else if (dtype == kFP16)
    decode_t<kh_fp16>(head_dim, p);
  else
    decode_t<float>(head_dim, p);
}

void append(int dtype, const kh_append_params& p) {
  if (dtype == kBF16)
    append_t<kh_bf16>(p);
  else if (dtype == kFP16)
    append_t<kh_fp16>(p);
  else
    append_t<float>(p);
}

}  // namespace khk::attention_cpu
