// The demo runtime's own device kernels: what the GPU-resident runtime runs itself (embedding,
// residual add, casts, AdamW) and the device fallbacks of its layer slots (RMSNorm, SiluAndMul,
// RotaryEmbedding, Attention, CrossEntropy), with the host fallbacks' formulas
// (tools/demo/fallback_ops.cpp, layers.cpp) in fp32 arithmetic. Compiled at run time through the
// device API (kh_device_module_from_source: the loader's NVRTC and JIT cache); the build inlines
// the prelude (kernels/common/kh_prelude.cuh) so that the source is header-free.
//
// Layouts are row-major and contiguous. Element types: T is float (suffix _f32) or kh_bf16
// (_bf16); statistics (rstd, lse, loss) and gradients of weights are fp32. Plain, simple kernels:
// correctness references and fallbacks, not the fast path (the packages are).
#include "kh_prelude.cuh"

#include "device_reduce.cuh"  // after the prelude: it uses KH_DEV

#include "adamw_table.h"

#define KH_GLOBAL extern "C" __global__

namespace {

template <typename T>
KH_DEV T from_f(float f) {
  return kh_convert<T>::from_float(f);
}

KH_DEV long long global_index() {
  return (long long)blockIdx.x * blockDim.x + threadIdx.x;
}
KH_DEV long long global_stride() {
  return (long long)gridDim.x * blockDim.x;
}

// ---- embedding ----------------------------------------------------------------------------
// out[r] = table[tokens[r]] (a row of zeros for a token outside [0, vocab)); grid: rows.
template <typename T>
KH_DEV void embedding_fwd(const T* table, const long long* tokens, T* out, long long vocab,
                          long long dim) {
  const long long r = blockIdx.x;
  const long long t = tokens[r];
  const bool ok = t >= 0 && t < vocab;
  for (long long c = threadIdx.x; c < dim; c += blockDim.x)
    out[r * dim + c] = ok ? table[t * dim + c] : from_f<T>(0.f);
}

// dtable[tokens[r]] += dh[r] (fp32 atomics: rows sharing a token add in any order); grid: rows.
template <typename T>
KH_DEV void embedding_bwd(const long long* tokens, const T* dh, float* dtable, long long vocab,
                          long long dim) {
  const long long r = blockIdx.x;
  const long long t = tokens[r];
  if (t < 0 || t >= vocab) return;
  for (long long c = threadIdx.x; c < dim; c += blockDim.x)
    atomicAdd(dtable + t * dim + c, kh_to_float(dh[r * dim + c]));
}

// ---- elementwise --------------------------------------------------------------------------
// out = a + b (out may be a or b): the residual add.
template <typename T>
KH_DEV void add(const T* a, const T* b, T* out, long long n) {
  for (long long i = global_index(); i < n; i += global_stride())
    out[i] = from_f<T>(kh_to_float(a[i]) + kh_to_float(b[i]));
}

// y[r, c] += bias[c] (the linear layers' bias).
template <typename T>
KH_DEV void bias_add(T* y, const T* bias, long long rows, long long cols) {
  for (long long i = global_index(); i < rows * cols; i += global_stride())
    y[i] = from_f<T>(kh_to_float(y[i]) + kh_to_float(bias[i % cols]));
}

// dst[r, c] = src[r, c] for a block of rows x cols of two matrices with their own row strides
// (ld_src, ld_dst elements): a column block moved between the fused q/k/v projection and its
// parts.
template <typename T>
KH_DEV void copy_columns(const T* src, long long ld_src, T* dst, long long ld_dst, long long rows,
                         long long cols) {
  for (long long i = global_index(); i < rows * cols; i += global_stride())
    dst[i / cols * ld_dst + i % cols] = src[i / cols * ld_src + i % cols];
}

// out[r, c] = x[r, c] * scale[c], rounded once (a norm's weight folded into the weight after it).
template <typename T>
KH_DEV void scale_columns(const T* x, const T* scale, T* out, long long rows, long long cols) {
  for (long long i = global_index(); i < rows * cols; i += global_stride())
    out[i] = from_f<T>(kh_to_float(x[i]) * kh_to_float(scale[i % cols]));
}

// db[c] += sum over rows of dy[r, c] (the bias gradient), rows in order; one thread per column.
template <typename T>
KH_DEV void column_sum_add(const T* dy, float* db, long long rows, long long cols) {
  for (long long c = global_index(); c < cols; c += global_stride()) {
    float acc = 0.f;
    for (long long r = 0; r < rows; ++r) acc += kh_to_float(dy[r * cols + c]);
    db[c] += acc;
  }
}

template <typename From, typename To>
KH_DEV void cast(const From* in, To* out, long long n) {
  for (long long i = global_index(); i < n; i += global_stride())
    out[i] = from_f<To>(kh_to_float(in[i]));
}

// ---- RMSNorm: y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps); grid: rows ---------------
template <typename T>
KH_DEV void rms_norm(const T* x, const T* w, float eps, T* y, float* rstd, long long cols) {
  __shared__ float red[32];
  const long long r = blockIdx.x;
  const T* xr = x + r * cols;
  float ss = 0.f;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) {
    const float v = kh_to_float(xr[c]);
    ss += v * v;
  }
  ss = kh_row_sum(ss, red);
  const float rs = 1.0f / sqrtf(ss / (float)cols + eps);
  if (rstd && threadIdx.x == 0) rstd[r] = rs;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x)
    y[r * cols + c] = from_f<T>(kh_to_float(xr[c]) * rs * kh_to_float(w[c]));
}

// dx = rstd * (g - xhat * mean(g * xhat)), g = dy * w; grid: rows.
template <typename T>
KH_DEV void rms_norm_bwd_dx(const T* dy, const T* x, const T* w, const float* rstd, T* dx,
                            long long cols) {
  __shared__ float red[32];
  const long long r = blockIdx.x;
  const float rs = rstd[r];
  float sum_gx = 0.f;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x)
    sum_gx +=
        kh_to_float(dy[r * cols + c]) * kh_to_float(w[c]) * (kh_to_float(x[r * cols + c]) * rs);
  const float c1 = kh_row_sum(sum_gx, red) / (float)cols;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) {
    const float xhat = kh_to_float(x[r * cols + c]) * rs;
    dx[r * cols + c] =
        from_f<T>(rs * (kh_to_float(dy[r * cols + c]) * kh_to_float(w[c]) - xhat * c1));
  }
}

// dweight[c] = sum over rows of dy * xhat (overwritten), rows in order as the host does; one
// thread per column (adjacent threads read adjacent columns).
template <typename T>
KH_DEV void rms_norm_bwd_dw(const T* dy, const T* x, const float* rstd, float* dw, long long rows,
                            long long cols) {
  for (long long c = global_index(); c < cols; c += global_stride()) {
    float acc = 0.f;
    for (long long r = 0; r < rows; ++r)
      acc += kh_to_float(dy[r * cols + c]) * (kh_to_float(x[r * cols + c]) * rstd[r]);
    dw[c] = acc;
  }
}

// ---- SiluAndMul: y = silu(gate) * up, x = [gate | up] -----------------------------------------
KH_DEV float silu(float g) {
  return g / (1.0f + expf(-g));
}
KH_DEV float dsilu(float g) {
  const float s = 1.0f / (1.0f + expf(-g));
  return s * (1.0f + g * (1.0f - s));
}

template <typename T>
KH_DEV void silu_and_mul(const T* x, T* y, long long rows, long long d) {
  for (long long i = global_index(); i < rows * d; i += global_stride()) {
    const long long r = i / d, c = i % d;
    y[i] = from_f<T>(silu(kh_to_float(x[r * 2 * d + c])) * kh_to_float(x[r * 2 * d + d + c]));
  }
}

template <typename T>
KH_DEV void silu_and_mul_bwd(const T* dy, const T* x, T* dx, long long rows, long long d) {
  for (long long i = global_index(); i < rows * d; i += global_stride()) {
    const long long r = i / d, c = i % d;
    const float gate = kh_to_float(x[r * 2 * d + c]), up = kh_to_float(x[r * 2 * d + d + c]);
    const float g = kh_to_float(dy[i]);
    dx[r * 2 * d + c] = from_f<T>(g * up * dsilu(gate));
    dx[r * 2 * d + d + c] = from_f<T>(g * silu(gate));
  }
}

// ---- RotaryEmbedding, in place: NeoX pairs (j, j + half), GPT-J (2j, 2j + 1) ----------------
// q [tokens, q_heads, head_dim], k [tokens, k_heads, head_dim] or NULL, cos/sin [max_pos, half];
// sign -1 is the backward (the inverse rotation). A position outside [0, max_pos) leaves the
// token unchanged, as the package does. grid: tokens.
template <typename T>
KH_DEV void rotary(const long long* pos, T* q, T* k, const float* cosv, const float* sinv,
                   int q_heads, int k_heads, int head_dim, int half, long long max_pos, int neox,
                   float sign) {
  const long long t = blockIdx.x;
  const long long p = pos[t];
  if (p < 0 || p >= max_pos) return;
  const float* c = cosv + p * half;
  const float* s = sinv + p * half;
  const int pairs = (q_heads + (k ? k_heads : 0)) * half;
  for (int i = threadIdx.x; i < pairs; i += blockDim.x) {
    const int h = i / half, j = i % half;
    T* v = h < q_heads ? q + (t * q_heads + h) * (long long)head_dim
                       : k + (t * k_heads + (h - q_heads)) * (long long)head_dim;
    const int i1 = neox ? j : 2 * j, i2 = neox ? j + half : 2 * j + 1;
    const float x1 = kh_to_float(v[i1]), x2 = kh_to_float(v[i2]), sn = sign * s[j];
    v[i1] = from_f<T>(x1 * c[j] - x2 * sn);
    v[i2] = from_f<T>(x2 * c[j] + x1 * sn);
  }
}

// ---- Attention: causal, padded [batch, len, heads, head_dim], GQA --------------------------
// One block per (query token, head, batch): grid (len, heads, batch). Scores of keys 0..i in
// dynamic shared memory (len floats forward, 2 * len backward). lse [heads, batch * len].
struct AttnShape {
  long long len;
  int heads, kv_heads, head_dim;
};

template <typename T>
KH_DEV float dot_row(const T* a, const T* b, int n) {
  float acc = 0.f;
  for (int d = 0; d < n; ++d) acc += kh_to_float(a[d]) * kh_to_float(b[d]);
  return acc;
}

template <typename T>
KH_DEV void attention_fwd(const T* q, const T* k, const T* v, T* out, float* lse, AttnShape s,
                          float scale) {
  extern __shared__ float p[];
  __shared__ float red[32];
  const long long i = blockIdx.x;
  const int h = blockIdx.y;
  const long long b = blockIdx.z;
  const int hk = h / (s.heads / s.kv_heads);
  const T* qi = q + ((b * s.len + i) * s.heads + h) * (long long)s.head_dim;
  float m = -__int_as_float(0x7f800000);
  for (long long j = threadIdx.x; j <= i; j += blockDim.x) {
    p[j] =
        dot_row(qi, k + ((b * s.len + j) * s.kv_heads + hk) * (long long)s.head_dim, s.head_dim) *
        scale;
    m = fmaxf(m, p[j]);
  }
  m = block_max(m, red);
  float sum = 0.f;
  for (long long j = threadIdx.x; j <= i; j += blockDim.x) sum += (p[j] = expf(p[j] - m));
  sum = kh_row_sum(sum, red);  // synchronizes: p is complete
  T* oi = out + ((b * s.len + i) * s.heads + h) * (long long)s.head_dim;
  const float inv = 1.0f / sum;
  for (int d = threadIdx.x; d < s.head_dim; d += blockDim.x) {
    float acc = 0.f;
    for (long long j = 0; j <= i; ++j)
      acc += p[j] * kh_to_float(v[((b * s.len + j) * s.kv_heads + hk) * (long long)s.head_dim + d]);
    oi[d] = from_f<T>(acc * inv);
  }
  if (lse && threadIdx.x == 0)
    lse[(long long)h * gridDim.z * s.len + b * s.len + i] = m + logf(sum);
}

// dq is written; dk and dv are accumulated with fp32 atomics, so they must be zero before the
// launch and fp32 (the op wrapper zeroes them).
template <typename T>
KH_DEV void attention_bwd(const T* dout, const T* q, const T* k, const T* v, const T* out,
                          const float* lse, T* dq, float* dk, float* dv, AttnShape s, float scale) {
  extern __shared__ float sh[];
  __shared__ float red[32];
  const long long i = blockIdx.x;
  const int h = blockIdx.y;
  const long long b = blockIdx.z;
  const int hk = h / (s.heads / s.kv_heads);
  const long long D = s.head_dim;
  float* pj = sh;
  float* dsj = sh + s.len;
  const long long row_i = ((b * s.len + i) * s.heads + h) * D;
  const T* qi = q + row_i;
  const T* doi = dout + row_i;
  const float l = lse[(long long)h * gridDim.z * s.len + b * s.len + i];
  float delta = 0.f;
  for (int d = threadIdx.x; d < s.head_dim; d += blockDim.x)
    delta += kh_to_float(doi[d]) * kh_to_float(out[row_i + d]);
  delta = kh_row_sum(delta, red);
  for (long long j = threadIdx.x; j <= i; j += blockDim.x) {
    const long long row_j = ((b * s.len + j) * s.kv_heads + hk) * D;
    const float p = expf(dot_row(qi, k + row_j, s.head_dim) * scale - l);
    pj[j] = p;
    dsj[j] = p * (dot_row(doi, v + row_j, s.head_dim) - delta) * scale;
  }
  __syncthreads();
  for (int d = threadIdx.x; d < s.head_dim; d += blockDim.x) {
    float acc = 0.f;
    for (long long j = 0; j <= i; ++j)
      acc += dsj[j] * kh_to_float(k[((b * s.len + j) * s.kv_heads + hk) * D + d]);
    dq[row_i + d] = from_f<T>(acc);
  }
  for (long long e = threadIdx.x; e < (i + 1) * D; e += blockDim.x) {
    const long long j = e / D, d = e % D;
    const long long at = ((b * s.len + j) * s.kv_heads + hk) * D + d;
    atomicAdd(dv + at, pj[j] * kh_to_float(doi[d]));
    atomicAdd(dk + at, dsj[j] * kh_to_float(qi[d]));
  }
}

// ---- CrossEntropy: loss = logsumexp(x) - x[target]; dlogits = (softmax - onehot) * scale -----
// grid: rows; dlogits may be logits (in place). A row whose target is ignore_index has loss 0 and zero gradients; a target outside
// [0, cols) gives a NaN loss, as the host fallback does.
template <typename T>
KH_DEV void cross_entropy(const T* logits, const long long* targets, long long ignore,
                          float grad_scale, float* loss, T* dlogits, long long cols) {
  __shared__ float red[32];
  const long long r = blockIdx.x;
  const T* xr = logits + r * cols;
  T* dxr = dlogits ? dlogits + r * cols : nullptr;
  const long long t = targets[r];
  if (t == ignore) {
    if (threadIdx.x == 0) loss[r] = 0.f;
    if (dxr)
      for (long long c = threadIdx.x; c < cols; c += blockDim.x) dxr[c] = from_f<T>(0.f);
    return;
  }
  float m = -__int_as_float(0x7f800000);
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, kh_to_float(xr[c]));
  m = block_max(m, red);
  // The target's logit is read before the reduction below synchronizes the block, so dlogits
  // may be logits itself (in place): no thread overwrites a logit before every read of it.
  const bool in_range = t >= 0 && t < cols;
  const float x_t = in_range && threadIdx.x == 0 ? kh_to_float(xr[t]) : 0.f;
  float sum = 0.f;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x) sum += expf(kh_to_float(xr[c]) - m);
  sum = kh_row_sum(sum, red);
  if (threadIdx.x == 0) loss[r] = in_range ? (m + logf(sum)) - x_t : __int_as_float(0x7fc00000);
  if (!dxr) return;
  const float inv = 1.f / sum;
  for (long long c = threadIdx.x; c < cols; c += blockDim.x)
    dxr[c] = from_f<T>((expf(kh_to_float(xr[c]) - m) * inv - (c == t ? 1.f : 0.f)) * grad_scale);
}

// dlogits[r] *= dloss[r], in place.
template <typename T>
KH_DEV void cross_entropy_bwd(const float* dloss, T* dlogits, long long rows, long long cols) {
  for (long long i = global_index(); i < rows * cols; i += global_stride())
    dlogits[i] = from_f<T>(kh_to_float(dlogits[i]) * dloss[i / cols]);
}

}  // namespace

// ---- entry points, one per element type ------------------------------------------------------
#define KH_FOR_TYPES(X) X(f32, float) X(bf16, kh_bf16)

#define KH_ENTRIES(sfx, T)                                                                         \
  KH_GLOBAL void kh_embedding_fwd_##sfx(const T* table, const long long* tokens, T* out,           \
                                        long long vocab, long long dim) {                          \
    embedding_fwd(table, tokens, out, vocab, dim);                                                 \
  }                                                                                                \
  KH_GLOBAL void kh_embedding_bwd_##sfx(const long long* tokens, const T* dh, float* dtable,       \
                                        long long vocab, long long dim) {                          \
    embedding_bwd(tokens, dh, dtable, vocab, dim);                                                 \
  }                                                                                                \
  KH_GLOBAL void kh_add_##sfx(const T* a, const T* b, T* out, long long n) {                       \
    add(a, b, out, n);                                                                             \
  }                                                                                                \
  KH_GLOBAL void kh_bias_add_##sfx(T* y, const T* bias, long long rows, long long cols) {          \
    bias_add(y, bias, rows, cols);                                                                 \
  }                                                                                                \
  KH_GLOBAL void kh_copy_columns_##sfx(const T* src, long long ld_src, T* dst, long long ld_dst,   \
                                       long long rows, long long cols) {                           \
    copy_columns(src, ld_src, dst, ld_dst, rows, cols);                                            \
  }                                                                                                \
  KH_GLOBAL void kh_scale_columns_##sfx(const T* x, const T* scale, T* out, long long rows,        \
                                        long long cols) {                                          \
    scale_columns(x, scale, out, rows, cols);                                                      \
  }                                                                                                \
  KH_GLOBAL void kh_column_sum_add_##sfx(const T* dy, float* db, long long rows, long long cols) { \
    column_sum_add(dy, db, rows, cols);                                                            \
  }                                                                                                \
  KH_GLOBAL void kh_rms_norm_##sfx(const T* x, const T* w, float eps, T* y, float* rstd,           \
                                   long long cols) {                                               \
    rms_norm(x, w, eps, y, rstd, cols);                                                            \
  }                                                                                                \
  KH_GLOBAL void kh_rms_norm_bwd_dx_##sfx(const T* dy, const T* x, const T* w, const float* rstd,  \
                                          T* dx, long long cols) {                                 \
    rms_norm_bwd_dx(dy, x, w, rstd, dx, cols);                                                     \
  }                                                                                                \
  KH_GLOBAL void kh_rms_norm_bwd_dw_##sfx(const T* dy, const T* x, const float* rstd, float* dw,   \
                                          long long rows, long long cols) {                        \
    rms_norm_bwd_dw(dy, x, rstd, dw, rows, cols);                                                  \
  }                                                                                                \
  KH_GLOBAL void kh_silu_and_mul_##sfx(const T* x, T* y, long long rows, long long d) {            \
    silu_and_mul(x, y, rows, d);                                                                   \
  }                                                                                                \
  KH_GLOBAL void kh_silu_and_mul_bwd_##sfx(const T* dy, const T* x, T* dx, long long rows,         \
                                           long long d) {                                          \
    silu_and_mul_bwd(dy, x, dx, rows, d);                                                          \
  }                                                                                                \
  KH_GLOBAL void kh_rotary_##sfx(const long long* pos, T* q, T* k, const float* cosv,              \
                                 const float* sinv, int q_heads, int k_heads, int head_dim,        \
                                 int half, long long max_pos, int neox, float sign) {              \
    rotary(pos, q, k, cosv, sinv, q_heads, k_heads, head_dim, half, max_pos, neox, sign);          \
  }                                                                                                \
  KH_GLOBAL void kh_attention_fwd_##sfx(const T* q, const T* k, const T* v, T* out, float* lse,    \
                                        AttnShape s, float scale) {                                \
    attention_fwd(q, k, v, out, lse, s, scale);                                                    \
  }                                                                                                \
  KH_GLOBAL void kh_attention_bwd_##sfx(const T* dout, const T* q, const T* k, const T* v,         \
                                        const T* out, const float* lse, T* dq, float* dk,          \
                                        float* dv, AttnShape s, float scale) {                     \
    attention_bwd(dout, q, k, v, out, lse, dq, dk, dv, s, scale);                                  \
  }                                                                                                \
  KH_GLOBAL void kh_cross_entropy_##sfx(const T* logits, const long long* targets,                 \
                                        long long ignore, float grad_scale, float* loss,           \
                                        T* dlogits, long long cols) {                              \
    cross_entropy(logits, targets, ignore, grad_scale, loss, dlogits, cols);                       \
  }                                                                                                \
  KH_GLOBAL void kh_cross_entropy_bwd_##sfx(const float* dloss, T* dlogits, long long rows,        \
                                            long long cols) {                                      \
    cross_entropy_bwd(dloss, dlogits, rows, cols);                                                 \
  }

KH_FOR_TYPES(KH_ENTRIES)

// Random initialization on the device (a model at real size is never built on the host):
// element i of a tensor draws from a counter-based generator (splitmix64 of seed and i), so the
// values depend on the seed alone, not on the launch geometry. Box-Muller, as the host model's
// fill_normal (not the same stream: the device model's random init is its own).
KH_DEV unsigned long long splitmix64(unsigned long long x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

KH_GLOBAL void kh_init_normal_f32(float* w, long long n, unsigned long long seed, float stddev) {
  for (long long i = global_index(); i < n; i += global_stride()) {
    const unsigned long long a = splitmix64(seed ^ splitmix64((unsigned long long)i));
    const unsigned long long b = splitmix64(a);
    const double u1 = ((double)(a >> 11) + 1.0) * 0x1.0p-53;
    const double u2 = (double)(b >> 11) * 0x1.0p-53;
    w[i] = (float)(stddev * sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
  }
}

KH_GLOBAL void kh_fill_f32(float* w, long long n, float value) {
  for (long long i = global_index(); i < n; i += global_stride()) w[i] = value;
}

// Reads n 16-byte words (the prelude's kh_u32x4); the XOR of all of them is stored only if it equals a value it never
// takes for the zeroed buffer read_bandwidth passes, so the loads stay and nothing is written.
KH_GLOBAL void kh_read_u32x4(const kh_u32x4* p, long long n, unsigned* sink) {
  unsigned acc = 0;
  for (long long i = global_index(); i < n; i += global_stride()) {
    const kh_u32x4 v = p[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9E3779B9u) *sink = acc;
}

KH_GLOBAL void kh_cast_bf16_to_f32(const kh_bf16* in, float* out, long long n) {
  cast(in, out, n);
}
KH_GLOBAL void kh_cast_f32_to_bf16(const float* in, kh_bf16* out, long long n) {
  cast(in, out, n);
}

// The deferred gradient adds (KhGradAdd), one CTA an entry: dst += float(src) (or dst = float(src),
// for a gradient zero in value) for each, in one launch instead of one each.
KH_GLOBAL void kh_grad_add_multi(const KhGradAdd* table) {
  const KhGradAdd e = table[blockIdx.x];
  const kh_bf16* src = (const kh_bf16*)e.src;
  for (long long i = threadIdx.x; i < e.n; i += blockDim.x) {
    const float v = kh_to_float(src[i]);
    e.dst[i] = e.overwrite ? v : e.dst[i] + v;
  }
}

// AdamW on fp32 master weights, torch.optim.AdamW's arithmetic as CausalLM::adam_step computes
// it: w = w * decay - step * m / (sqrt(v) / c2_sqrt + eps), step = lr / (1 - beta1^t),
// c2_sqrt = sqrt(1 - beta2^t), decay = 1 - lr * weight_decay (the host computes the scalars).
// w_bf16 (may be NULL) receives the updated weights rounded to bf16: the copy the model runs on.
// The step reads and writes 30 bytes an element of every parameter (18 GB for Qwen3-0.6B):
// threads take four elements with 16-byte loads (8-byte bf16 stores) where every pointer allows
// it, one at a time otherwise. On an H200 that took the update from about 2.8 TB/s to 4.2 (the
// embedding) and 3.6-4.0 (a layer's matrices), one launch a tensor; kh_adamw_multi_f32 updates
// every tensor in one launch (a Qwen3 layer's eight include four of 128 or 1024 elements).
struct adamw_scalars {
  float beta1, beta2, step, c2_sqrt, decay, eps;
  KH_DEV void update(float& w, float g, float& m, float& v) const {
    m = beta1 * m + (1.0f - beta1) * g;
    v = beta2 * v + (1.0f - beta2) * g * g;
    w = w * decay - step * m / (sqrtf(v) / c2_sqrt + eps);
  }
};

// Elements [lo, hi) of one parameter; thread t of nt takes every nt-th group of four.
KH_DEV void adamw_range(const adamw_scalars& a, float* w, const float* g, float* m, float* v,
                        kh_bf16* w_bf16, long long lo, long long hi, long long t, long long nt) {
  auto aligned = [](const void* p, unsigned long long bytes) {
    return (unsigned long long)p % bytes == 0;
  };
  const bool vec = aligned(w, 16) && aligned(g, 16) && aligned(m, 16) && aligned(v, 16) &&
                   aligned(w_bf16, 8) && lo % 4 == 0;
  long long done = lo;
  if (vec && hi - lo >= 4) {
    const long long q1 = hi / 4;
    for (long long i = lo / 4 + t; i < q1; i += nt) {
      float4 wi = reinterpret_cast<const float4*>(w)[i];
      const float4 gi = reinterpret_cast<const float4*>(g)[i];
      float4 mi = reinterpret_cast<const float4*>(m)[i];
      float4 vi = reinterpret_cast<const float4*>(v)[i];
      a.update(wi.x, gi.x, mi.x, vi.x);
      a.update(wi.y, gi.y, mi.y, vi.y);
      a.update(wi.z, gi.z, mi.z, vi.z);
      a.update(wi.w, gi.w, mi.w, vi.w);
      reinterpret_cast<float4*>(m)[i] = mi;
      reinterpret_cast<float4*>(v)[i] = vi;
      reinterpret_cast<float4*>(w)[i] = wi;
      if (w_bf16) {
        auto bits = [](float x) { return (unsigned)from_f<kh_bf16>(x).bits; };
        reinterpret_cast<uint2*>(w_bf16)[i] =
            make_uint2(bits(wi.x) | bits(wi.y) << 16, bits(wi.z) | bits(wi.w) << 16);
      }
    }
    done = q1 * 4;
  }
  for (long long i = done + t; i < hi; i += nt) {
    float wi = w[i], mi = m[i], vi = v[i];
    a.update(wi, g[i], mi, vi);
    m[i] = mi;
    v[i] = vi;
    w[i] = wi;
    if (w_bf16) w_bf16[i] = from_f<kh_bf16>(wi);
  }
}

// One parameter; the host's grid covers n / 4 threads.
KH_GLOBAL void kh_adamw_f32(float* w, const float* g, float* m, float* v, kh_bf16* w_bf16,
                            long long n, float beta1, float beta2, float step, float c2_sqrt,
                            float decay, float eps) {
  const adamw_scalars a{beta1, beta2, step, c2_sqrt, decay, eps};
  adamw_range(a, w, g, m, v, w_bf16, 0, n, global_index(), global_stride());
}

// Every parameter of `table` (count entries, first_block ascending): CTA b updates
// KH_ADAMW_CHUNK elements of the last tensor whose first_block <= b.
KH_GLOBAL void kh_adamw_multi_f32(const KhAdamwTensor* table, int count, float beta1, float beta2,
                                  float step, float c2_sqrt, float decay, float eps) {
  const adamw_scalars a{beta1, beta2, step, c2_sqrt, decay, eps};
  const long long b = blockIdx.x;
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (table[mid].first_block <= b)
      lo = mid;
    else
      hi = mid - 1;
  }
  const KhAdamwTensor& p = table[lo];
  const long long e0 = (b - p.first_block) * KH_ADAMW_CHUNK;
  const long long e1 = p.n < e0 + KH_ADAMW_CHUNK ? p.n : e0 + KH_ADAMW_CHUNK;
  adamw_range(a, p.w, p.g, p.m, p.v, (kh_bf16*)p.w_bf16, e0, e1, threadIdx.x, blockDim.x);
}
