// The GPU-resident runtime's own decode kernels (device_decode.h): the paged KV cache's append
// and single-token attention that serve when no package is bound to PagedKVAppend /
// PagedAttention (or the activations are fp32, which the attention package refuses on cuda), and
// the greedy step's argmax that feeds the next token back on the device, so that a captured
// decode step replays with no host round trip. Compiled at run time through the device API like
// device_kernels.cu; the build inlines the prelude.
//
// The cache has the attention package's layout: [pages, page_size, kv_heads, head_dim] per layer
// for K and for V, int32 block_table [batch, table_stride] (token t of sequence b is row
// t % page_size of page block_table[b][t / page_size]) and int32 seq_lens [batch], which count
// the tokens being written or attended (the new ones are the last of seq_lens[b]).
// Element types: T is float (suffix _f32) or kh_bf16 (_bf16); arithmetic in fp32. Every kernel
// reads its lengths from device memory only: graph replays see new seq_lens and tokens.
#include "kh_prelude.cuh"

#include "device_reduce.cuh"  // after the prelude: it uses KH_DEV
#include "greedy_argmax.cuh"

#define KH_GLOBAL extern "C" __global__

namespace {

template <typename T>
KH_DEV T from_f(float f) {
  return kh_convert<T>::from_float(f);
}

KH_DEV long long kv_offset(const int* block_table, int table_stride, int page_size, int kv_heads,
                           int head_dim, int b, int t, int h) {
  const long long page = block_table[(long long)b * table_stride + t / page_size];
  return ((page * page_size + t % page_size) * kv_heads + h) * (long long)head_dim;
}

// k_new/v_new [batch, n_new, kv_heads, head_dim] into the cache at the last n_new tokens of each
// sequence. grid (batch * n_new, kv_heads).
template <typename T>
KH_DEV void paged_append(const T* k_new, const T* v_new, const int* block_table,
                         const int* seq_lens, T* k_cache, T* v_cache, int n_new, int kv_heads,
                         int head_dim, int table_stride, int page_size) {
  const int i = blockIdx.x, h = blockIdx.y;
  const int b = i / n_new, j = i % n_new;
  const int t = seq_lens[b] - n_new + j;
  if (t < 0) return;
  const long long dst =
      kv_offset(block_table, table_stride, page_size, kv_heads, head_dim, b, t, h);
  const long long src = ((long long)i * kv_heads + h) * head_dim;
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    k_cache[dst + d] = k_new[src + d];
    v_cache[dst + d] = v_new[src + d];
  }
}

// One query token per sequence (the last of seq_lens[b]) against its cached keys and values:
// q/out [batch, q_heads, head_dim]; GQA (q_heads a multiple of kv_heads). grid (q_heads, batch);
// dynamic shared memory: (head_dim + 32 + max_context) floats, the scores of the whole context
// (a plain, exact softmax: the fallback, not the fast path).
template <typename T>
KH_DEV void paged_decode(const T* q, const T* k_cache, const T* v_cache, const int* block_table,
                         const int* seq_lens, T* out, int q_heads, int kv_heads, int head_dim,
                         int table_stride, int page_size, float scale) {
  extern __shared__ float sh[];
  float* qs = sh;
  float* red = sh + head_dim;
  float* p = red + 32;
  const int h = blockIdx.x, b = blockIdx.y, hk = h / (q_heads / kv_heads);
  const int len = seq_lens[b];
  const long long qo = ((long long)b * q_heads + h) * head_dim;
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) qs[d] = kh_to_float(q[qo + d]);
  __syncthreads();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, warps = blockDim.x >> 5;
  for (int t = warp; t < len; t += warps) {
    const long long ko =
        kv_offset(block_table, table_stride, page_size, kv_heads, head_dim, b, t, hk);
    float acc = 0.f;
    for (int d = lane; d < head_dim; d += 32) acc += qs[d] * kh_to_float(k_cache[ko + d]);
    for (int off = 16; off > 0; off >>= 1) acc += __shfl_xor_sync(0xFFFFFFFFu, acc, off);
    if (lane == 0) p[t] = acc * scale;
  }
  __syncthreads();
  float m = -3.402823466e38f;
  for (int t = threadIdx.x; t < len; t += blockDim.x) m = fmaxf(m, p[t]);
  m = block_max(m, red);
  float sum = 0.f;
  for (int t = threadIdx.x; t < len; t += blockDim.x) {
    const float e = expf(p[t] - m);
    p[t] = e;
    sum += e;
  }
  sum = block_sum(sum, red);  // synchronizes: every p[t] is written
  const float inv = 1.f / sum;
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float acc = 0.f;
    for (int t = 0; t < len; ++t) {
      const long long vo =
          kv_offset(block_table, table_stride, page_size, kv_heads, head_dim, b, t, hk);
      acc += p[t] * kh_to_float(v_cache[vo + d]);
    }
    out[qo + d] = from_f<T>(acc * inv);
  }
}

// The greedy step: token = argmax of row b of logits (the first index on ties, as the host's
// std::max_element), written as the next step's input and to out_tokens[b][*step] (when
// *step < out_cols); the sequence advances by one (positions and seq_lens), and after the last
// row *step does. grid (splits, batch), up to 1024 threads: a row of 150k-260k logits is read by
// `splits` CTAs (one CTA a row left most SMs idle: 20 us of a 4.7 ms step on an H200), each a
// contiguous range of 16-byte vectors, four in flight a thread. The CTAs of a row meet in
// scratch: an atomicMax of (the value's bits ordered as unsigned, the complement of the index)
// per row, then a counter whose last arrival writes the token, and a counter of rows whose last
// arrival advances *step; the last arrivals reset what they used, so the next launch (a graph
// replay) finds zeros. scratch: batch keys, batch row counters, one row-done counter (zeroed
// once by the caller).
template <typename T>
KH_DEV void argmax_advance(const T* logits, long long row_stride, long long vocab,
                           long long* tokens, long long* positions, int* seq_lens,
                           long long* out_tokens, int* step, int out_cols,
                           unsigned long long* scratch) {
  constexpr int VEC = kh_vec16<T>::n, BATCH = 4;
  __shared__ float best_v[32];
  __shared__ long long best_i[32];
  const int b = blockIdx.y, split = blockIdx.x, splits = gridDim.x;
  const T* row = logits + (long long)b * row_stride;
  float v = -3.402823466e38f;
  long long idx = vocab;
  // Elements before the first 16-byte boundary (split 0), then whole vectors (each split its
  // share), then the rest (the last split).
  const long long mis = (long long)(((unsigned long long)row / sizeof(T)) % VEC);
  long long head = mis ? VEC - mis : 0;
  if (head > vocab) head = vocab;
  const long long nvec = (vocab - head) / VEC, tail = head + nvec * VEC;
  const long long per = (nvec + splits - 1) / splits, v0 = split * per,
                  v1 = v0 + per < nvec ? v0 + per : nvec;
  if (split == 0 && threadIdx.x < head)
    argmax_take(kh_to_float(row[threadIdx.x]), threadIdx.x, vocab, v, idx);
  const T* vrow = row + head;
  for (long long i0 = v0 + threadIdx.x; i0 < v1; i0 += (long long)BATCH * blockDim.x) {
    kh_raw<T, VEC> r[BATCH];
#pragma unroll
    for (int j = 0; j < BATCH; ++j) {
      const long long i = i0 + (long long)j * blockDim.x;
      if (i < v1) r[j] = kh_load_raw<T, VEC, KH_LOAD_PLAIN>(vrow + i * VEC);
    }
#pragma unroll
    for (int j = 0; j < BATCH; ++j) {
      const long long i = i0 + (long long)j * blockDim.x;
      if (i >= v1) break;
      float f[VEC];
      kh_unpack<T, VEC>(r[j], f);
#pragma unroll
      for (int k = 0; k < VEC; ++k) argmax_take(f[k], head + i * VEC + k, vocab, v, idx);
    }
  }
  if (split == splits - 1)
    for (long long c = tail + threadIdx.x; c < vocab; c += blockDim.x)
      argmax_take(kh_to_float(row[c]), c, vocab, v, idx);
  for (int off = 16; off > 0; off >>= 1) {
    const float ov = __shfl_xor_sync(0xFFFFFFFFu, v, off);
    const long long oi = __shfl_xor_sync(0xFFFFFFFFu, idx, off);
    if (argmax_better(ov, oi, v, idx, vocab)) {
      v = ov;
      idx = oi;
    }
  }
  if ((threadIdx.x & 31) == 0) {
    best_v[threadIdx.x >> 5] = v;
    best_i[threadIdx.x >> 5] = idx;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  for (int w = 1; w < (int)(blockDim.x >> 5); ++w)
    if (argmax_better(best_v[w], best_i[w], v, idx, vocab)) {
      v = best_v[w];
      idx = best_i[w];
    }
  unsigned long long* key = scratch + b;
  unsigned int* row_count = reinterpret_cast<unsigned int*>(scratch + gridDim.y) + b;
  unsigned int* rows_done = reinterpret_cast<unsigned int*>(scratch + 2 * gridDim.y);
  if (splits > 1) {
    if (idx != vocab) atomicMax(key, argmax_key(v, idx));
    __threadfence();  // the key before the count: the last arrival sees every split's
    if (atomicAdd(row_count, 1u) != (unsigned int)splits - 1) return;
    __threadfence();
    const unsigned long long k = atomicExch(key, 0ull);
    *row_count = 0;
    idx = argmax_key_index(k);  // some split saw one: vocab >= 1
  }
  const int s = *step;
  greedy_advance(b, idx, s, tokens, positions, seq_lens, out_tokens, out_cols);
  __threadfence();  // this row's read of *step before the count that lets the last row advance it
  if (atomicAdd(rows_done, 1u) != gridDim.y - 1) return;
  *rows_done = 0;
  *step = s + 1;
}

}  // namespace

#define KH_DECODE_TYPED(T, SUFFIX)                                                                \
  KH_GLOBAL void kh_paged_append_##SUFFIX(                                                        \
      const T* k_new, const T* v_new, const int* block_table, const int* seq_lens, T* k_cache,    \
      T* v_cache, int n_new, int kv_heads, int head_dim, int table_stride, int page_size) {       \
    paged_append<T>(k_new, v_new, block_table, seq_lens, k_cache, v_cache, n_new, kv_heads,       \
                    head_dim, table_stride, page_size);                                           \
  }                                                                                               \
  KH_GLOBAL void kh_paged_decode_##SUFFIX(const T* q, const T* k_cache, const T* v_cache,         \
                                          const int* block_table, const int* seq_lens, T* out,    \
                                          int q_heads, int kv_heads, int head_dim,                \
                                          int table_stride, int page_size, float scale) {         \
    paged_decode<T>(q, k_cache, v_cache, block_table, seq_lens, out, q_heads, kv_heads, head_dim, \
                    table_stride, page_size, scale);                                              \
  }                                                                                               \
  KH_GLOBAL void __launch_bounds__(1024) kh_argmax_advance_##SUFFIX(                              \
      const T* logits, long long row_stride, long long vocab, long long* tokens,                  \
      long long* positions, int* seq_lens, long long* out_tokens, int* step, int out_cols,        \
      unsigned long long* scratch) {                                                              \
    argmax_advance<T>(logits, row_stride, vocab, tokens, positions, seq_lens, out_tokens, step,   \
                      out_cols, scratch);                                                         \
  }

KH_DECODE_TYPED(float, f32)
KH_DECODE_TYPED(kh_bf16, bf16)
