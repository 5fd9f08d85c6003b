// Kernel parameters of the attention package, shared by the host library (host.cpp, cpu.cpp)
// and the device source (attention.cu): one struct passed by value, so the layout is the one
// the host compiler and NVRTC both give a struct of 8-byte then 4-byte members.
#ifndef KH_ATTENTION_PARAMS_H_
#define KH_ATTENTION_PARAMS_H_

#include "kh_prelude.cuh"

// A TMA descriptor (the driver's CUtensorMap: 128 opaque bytes, 64-byte aligned) of one of
// q, k, v viewed as 4-d {64 columns of a panel, token, panel (head_dim / 64), head}: one box of
// {64, rows, head_dim / 64, 1} with the 128-byte swizzle lands in shared memory exactly as
// kh_load_panels lays a panel tile out (wgmma.cuh).
struct alignas(64) kh_tma_desc {
  unsigned long long w[16];
};

// Attention over packed variable-length sequences. Sequence b's queries are tokens
// [q_start(b), q_start(b) + len_q(b)) of q and o, its keys/values tokens of k and v likewise:
// from cu_seqlens_q/k (int32 [batch + 1]) when given, else b * seqlen_q/k with length
// seqlen_q/k (a padded [batch, seqlen, heads, head_dim] tensor viewed as tokens).
// Causal and window masks are bottom-right aligned as FlashAttention's: query i of a sequence
// sees key j when j <= i + (len_k - len_q) and, with window_left >= 0,
// j >= i + (len_k - len_q) - window_left.
struct kh_attn_params {
  const void* q;  // [tokens_q, q_heads, head_dim]
  const void* k;  // [tokens_k, kv_heads, head_dim]
  const void* v;
  void* o;     // [tokens_q, q_heads, head_dim]
  float* lse;  // [q_heads, tokens_q] natural-log sum of exp(scale * s) per row, or NULL
  const int* cu_seqlens_q;
  const int* cu_seqlens_k;
  kh_i64 q_row, q_head, k_row, k_head, v_row, v_head, o_row, o_head;  // strides, elements
  kh_i64 lse_head;                                                    // lse[h * lse_head + t]
  int batch, q_heads, kv_heads;
  int seqlen_q, seqlen_k;  // padded batches: every sequence's length (cu_seqlens NULL)
  int max_seqlen_q;        // grid size over query blocks
  int causal;
  int window_left;   // < 0: no window
  float scale;       // softmax scale (1 / sqrt(head_dim) usually)
  float scale_log2;  // scale * log2(e)
  // Hopper forward: nonzero when the host encoded q_map, k_map and v_map (the loader's
  // tensor-map service; kh_attn_head_map in host.cpp), so the producer loads whole tiles with
  // TMA instead of cp.async from every producer thread.
  int tma;
  // Backward: the last tail_ctas CTAs of the grid take their key blocks longest first
  // (kh_attn_tile). The forward's grid does not read it.
  int tail_ctas;
  kh_tma_desc q_map, k_map, v_map;
};

// The tile CTA `lin` (launch order) of a backward grid of nb key blocks x `groups` (KV head +
// kv_heads * sequence) works on: key block `blk` (0 the longest under a causal mask: it sees
// every query) of group `group`. CTAs start in launch order, so in group order a group's blocks
// run side by side and share its Q, dO and dQ through L2. But causal blocks differ in work up to
// 16x, and in that order the grid's last wave holds some group's longest block started late while
// the SMs around it run dry. The last tail_ctas CTAs (rounded up to whole groups) therefore take
// their groups' blocks longest first across the groups (list scheduling's longest-processing-time
// rule), so that short blocks fill the end.
struct kh_attn_tile_t {
  int blk, group;
};
KH_HD kh_attn_tile_t kh_attn_tile_of(int lin, int nb, int groups, int tail_ctas) {
  int tail = tail_ctas > 0 ? (tail_ctas + nb - 1) / nb : 0;
  if (tail > groups) tail = groups;
  const int head = (groups - tail) * nb;
  if (lin < head) return {lin % nb, lin / nb};
  return {(lin - head) / tail, groups - tail + (lin - head) % tail};
}
#ifdef __CUDACC__
// This CTA's key block, KV head and sequence: grid (blocks, kv_heads, sequences).
struct kh_attn_cta_t {
  int blk, head, seq;
};
KH_DEV kh_attn_cta_t kh_attn_tile(int tail_ctas) {
  const kh_attn_tile_t t =
      kh_attn_tile_of(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z), gridDim.x,
                      gridDim.y * gridDim.z, tail_ctas);
  return {t.blk, t.group % (int)gridDim.y, t.group / (int)gridDim.y};
}
#endif

// Keys [n_lo, n_hi) the query rows [m0, m0 + bm) of a sequence can see (n_lo rounded down to a
// block of bn keys): the causal diagonal and the window cut the range.
KH_HD void kh_attn_key_range(const kh_attn_params& p, int m0, int bm, int bn, int len_q, int len_k,
                             int* n_lo, int* n_hi) {
  const int offset = len_k - len_q;
  int lo = 0, hi = len_k;
  if (p.causal) hi = hi < m0 + bm + offset ? hi : m0 + bm + offset;
  if (p.window_left >= 0) lo = m0 + offset - p.window_left > 0 ? m0 + offset - p.window_left : 0;
  *n_lo = lo / bn * bn;
  *n_hi = hi;
}

// Queries [m_lo, m_hi) that see any key of [n0, n0 + bn) (m_lo rounded down to a block of bm).
KH_HD void kh_attn_query_range(const kh_attn_params& p, int n0, int bn, int bm, int len_q,
                               int len_k, int* m_lo, int* m_hi) {
  const int offset = len_k - len_q;
  int lo = 0, hi = len_q;
  if (p.causal) lo = n0 - offset > 0 ? n0 - offset : 0;
  if (p.window_left >= 0)
    hi = hi < n0 + bn - offset + p.window_left ? hi : n0 + bn - offset + p.window_left;
  *m_lo = lo / bm * bm;
  *m_hi = hi;
}

// Whether key block [n0, n0 + bn) crosses a mask edge for query rows [m0, m0 + bm): the
// sequence's end, the causal diagonal or the window's start (else every score is visible).
KH_HD bool kh_attn_block_edge(const kh_attn_params& p, int m0, int bm, int n0, int bn, int len_q,
                              int len_k) {
  const int offset = len_k - len_q;
  return n0 + bn > len_k || (p.causal && n0 + bn - 1 > m0 + offset) ||
         (p.window_left >= 0 && n0 < m0 + bm - 1 + offset - p.window_left);
}

// Forward geometry per head_dim, for the host's launch and the kernel's template: warps per CTA
// (16 query rows each), keys per block, dynamic shared memory (Q tile, K tile, V tile).
KH_HD constexpr int kh_attn_fwd_warps(int head_dim) {
  return head_dim == 256 ? 4 : 8;
}
KH_HD constexpr int kh_attn_fwd_block_n(int head_dim) {
  return head_dim == 256 ? 32 : 64;
}
KH_HD constexpr int kh_attn_fwd_smem_bytes(int head_dim) {
  return (16 * kh_attn_fwd_warps(head_dim) + 2 * kh_attn_fwd_block_n(head_dim)) * head_dim * 2;
}

// Hopper forward (forward_sm90.cuh; head_dim 64 and 128): a producer and two consumer
// warpgroups, BM = 128 query rows, BN keys per block, STAGES stages of K and V; shared memory:
// Q, the stages, their mbarriers and Q's (qfree), 1024 bytes of alignment slack.
KH_HD constexpr int kh_attn_fwd90_block_m() {
  return 128;
}
#ifndef KH_FWD90_BN128
#define KH_FWD90_BN128 128
#endif
KH_HD constexpr int kh_attn_fwd90_block_n(int head_dim) {
  return head_dim == 64 ? 128 : KH_FWD90_BN128;
}
#ifndef KH_FWD90_STAGES128
#define KH_FWD90_STAGES128 3
#endif
KH_HD constexpr int kh_attn_fwd90_stages(int head_dim) {
  return head_dim == 64 ? 3 : KH_FWD90_STAGES128;
}
KH_HD constexpr int kh_attn_fwd90_threads() {
  return 384;
}
KH_HD constexpr int kh_attn_fwd90_smem_bytes(int head_dim) {
  return (kh_attn_fwd90_block_m() +
          2 * kh_attn_fwd90_stages(head_dim) * kh_attn_fwd90_block_n(head_dim)) *
             head_dim * 2 +
         16 * kh_attn_fwd90_stages(head_dim) + 16 + 1024;
}
// The persistent forward's work (forward_sm90.cuh): nm query blocks over max_seqlen_q; unit u
// is the pair of blocks r and nm - 1 - r (the longer first) of head h of sequence b, units in
// (sequence, head, pair) order. Under a causal mask both blocks of a pair together see nm + 1
// key blocks, so units are equal work and a static walk of them is balanced. The host launches
// min(units, multiprocessors) CTAs; CTA c takes units c, c + gridDim.x, ...
KH_HD int kh_attn_fwd90_query_blocks(const kh_attn_params& p) {
  return (p.max_seqlen_q + kh_attn_fwd90_block_m() - 1) / kh_attn_fwd90_block_m();
}
KH_HD kh_i64 kh_attn_fwd90_units(const kh_attn_params& p) {
  return (kh_i64)((kh_attn_fwd90_query_blocks(p) + 1) / 2) * p.q_heads * p.batch;
}
struct kh_attn_fwd90_tile_t {
  int seq, head, mblk;
};
// Tile `second` (0 or 1) of unit u; false for the second of the middle pair of an odd nm (that
// unit has one block).
KH_HD bool kh_attn_fwd90_tile_of(int nm, int q_heads, int u, int second, kh_attn_fwd90_tile_t* t) {
  const int pairs = (nm + 1) / 2, r = u % pairs, hb = u / pairs;
  t->mblk = second ? r : nm - 1 - r;
  t->head = hb % q_heads;
  t->seq = hb / q_heads;
  return !second || r != nm - 1 - r;
}

// Hopper backward (backward_sm90.cuh; head_dim 64 and 128): a producer and two consumer
// warpgroups, BN = 128 keys per CTA, BM = 64 queries per step; shared memory: K, V, STAGES stages
// of Q and dO, two dS^T tiles, the fp32 dQ staging tile, STAGES stages of LSE and delta, the
// mbarriers, 1024 bytes of alignment slack.
KH_HD constexpr int kh_attn_bwd90_block_n() {
  return 128;
}
KH_HD constexpr int kh_attn_bwd90_block_m() {
  return 64;
}
KH_HD constexpr int kh_attn_bwd90_stages() {
  return 3;
}
KH_HD constexpr int kh_attn_bwd90_threads() {
  return 384;
}
KH_HD constexpr int kh_attn_bwd90_smem_bytes(int head_dim) {
  return (2 * kh_attn_bwd90_block_n() + 2 * kh_attn_bwd90_stages() * kh_attn_bwd90_block_m()) *
             head_dim * 2 +
         2 * kh_attn_bwd90_block_n() * kh_attn_bwd90_block_m() * 2 +
         kh_attn_bwd90_block_m() * head_dim * 4 +
         kh_attn_bwd90_stages() * 2 * kh_attn_bwd90_block_m() * 4 +
         8 * (2 * kh_attn_bwd90_stages() + 2) + 1024;
}

// Sequence b's token ranges.
KH_HD void kh_attn_seq(const kh_attn_params& p, int b, int* q0, int* len_q, int* k0, int* len_k) {
  if (p.cu_seqlens_q) {
    *q0 = p.cu_seqlens_q[b];
    *len_q = p.cu_seqlens_q[b + 1] - *q0;
  } else {
    *q0 = b * p.seqlen_q;
    *len_q = p.seqlen_q;
  }
  if (p.cu_seqlens_k) {
    *k0 = p.cu_seqlens_k[b];
    *len_k = p.cu_seqlens_k[b + 1] - *k0;
  } else {
    *k0 = b * p.seqlen_k;
    *len_k = p.seqlen_k;
  }
}

// Whether query i sees key j (positions inside their sequence; offset = len_k - len_q).
KH_HD bool kh_attn_visible(int i, int j, int offset, int causal, int window_left) {
  if (causal && j > i + offset) return false;
  if (window_left >= 0 && j < i + offset - window_left) return false;
  return true;
}

// kh_attn_visible as ranges, for masks without a branch an element: the keys j in [lo, hi) that
// query i sees (also j < len_k), and the queries i in [lo, hi) that see key j (also i < len_q;
// none for j >= len_k).
struct kh_attn_span {
  int lo, hi;
};
KH_HD kh_attn_span kh_attn_keys_of(int i, int len_k, int offset, int causal, int window_left) {
  const int hi = causal && i + offset + 1 < len_k ? i + offset + 1 : len_k;
  return {window_left >= 0 ? i + offset - window_left : 0, hi};
}
KH_HD kh_attn_span kh_attn_queries_of(int j, int len_q, int len_k, int offset, int causal,
                                      int window_left) {
  if (j >= len_k) return {0, 0};
  const int w = j - offset + window_left + 1;
  return {causal ? j - offset : 0, window_left >= 0 && w < len_q ? w : len_q};
}

// Backward of attention_forward (FlashAttention-2's algorithm): f holds the forward's inputs, its
// output (f.o) and log-sum-exp (f.lse); dq_accum and delta are the caller's fp32 workspace.
struct kh_attn_bwd_params {
  kh_attn_params f;
  const void* dout;  // [tokens_q, q_heads, head_dim]
  void* dq;
  void* dk;  // [tokens_k, kv_heads, head_dim]
  void* dv;
  // [tokens_q, q_heads, head_dim], contiguous; with dq_heads_major (the Hopper backward:
  // 16-byte aligned) [q_heads, tokens_q, head_dim], row t's 16-byte chunk c at chunk c ^ (t & 7).
  float* dq_accum;
  float* delta;  // [q_heads, tokens_q]: rowsum(dout * out)
  kh_i64 do_row, do_head, dq_row, dq_head, dk_row, dk_head, dv_row, dv_head;
  kh_i64 tokens_q;
  int max_seqlen_k;
  // Hopper backward with f.tma: dO's map (f.q_map and dO's boxes are BM rows, f.k_map and
  // f.v_map's BN rows).
  kh_tma_desc do_map;
  int dq_heads_major;
};

// Backward geometry: 4 warps, BN = 64 keys per CTA (16 per warp), BM = 64 queries per step.
KH_HD constexpr int kh_attn_bwd_warps() {
  return 4;
}
KH_HD constexpr int kh_attn_bwd_block() {
  return 64;
}
// K, V, Q, dO tiles, the dS tile and the step's LSE and delta.
KH_HD constexpr int kh_attn_bwd_smem_bytes(int head_dim) {
  return 4 * 64 * head_dim * 2 + 64 * 64 * 2 + 2 * 64 * 4;
}

// Columns a thread of attn_bwd_pre and attn_bwd_post (16-byte loads and stores of bf16/fp16):
// their grids have tokens * q_heads * head_dim / this threads.
KH_HD constexpr int kh_attn_bwd_vec() {
  return 8;
}

// A paged KV cache: K and V are [pages, page_size, kv_heads, head_dim] with strides; sequence
// b has seq_lens[b] tokens in it, its token t being row t % page_size of page
// block_table[b * table_stride + t / page_size].
struct kh_paged_kv {
  void* k;
  void* v;
  const int* block_table;
  const int* seq_lens;
  kh_i64 k_page, k_row, k_head, v_page, v_row, v_head;
  int table_stride, page_size;
};

// New tokens' K and V, n a sequence (the last n of seq_lens[b]): token j of sequence b, KV head
// hk at k + (b * n + j) * k_row + hk * k_head ([batch * n, kv_heads, head_dim] with these
// strides), and likewise in v.
struct kh_new_kv {
  const void* k;
  const void* v;
  kh_i64 k_row, k_head, v_row, v_head;
  int n;
};

// Element offsets of sequence b's token t, KV head hk, in K and in V.
KH_HD void kh_paged_offsets(const kh_paged_kv& c, int b, int t, int hk, kh_i64* k_off,
                            kh_i64* v_off) {
  const kh_i64 page = c.block_table[(kh_i64)b * c.table_stride + t / c.page_size];
  const kh_i64 row = t % c.page_size;
  *k_off = page * c.k_page + row * c.k_row + (kh_i64)hk * c.k_head;
  *v_off = page * c.v_page + row * c.v_row + (kh_i64)hk * c.v_head;
}

// Decode against a paged KV cache (append the new tokens first). Sequence b's q_tokens queries
// are its last tokens: query i is at position seq_lens[b] - q_tokens + i and sees keys up to it
// (and back window_left). q and o: [batch * q_tokens, q_heads, head_dim] with token and head
// strides. The context is split into `splits` parts of split_tokens tokens (flash-decoding); with
// more than one, each part writes (unnormalised out, max, sum) to `partial` and a second kernel
// combines them: partial holds batch * q_tokens * q_heads * splits * (head_dim + 2) floats.
struct kh_decode_params {
  const void* q;
  void* o;
  kh_paged_kv kv;
  float* partial;
  kh_i64 q_row, q_head, o_row, o_head;
  int batch, q_tokens, q_heads, kv_heads;
  int splits, split_tokens;
  int window_left;
  float scale_log2;
  // paged_attention_decode_append (tensor-core kernels): each sequence's last nw.n tokens are
  // new, their K and V in nw: the CTA whose split holds a new token reads it from there instead
  // of the cache and (row group 0 of its KV head) writes it into its cache row. nw.n = 0: the
  // cache holds every token.
  kh_new_kv nw;
};

// Rows (query head, query token) one decode CTA serves, out of a KV head's
// q_heads / kv_heads * q_tokens: 4 (kernels _r4) when they are at most 4, else 8 (_r8).
KH_HD constexpr int kh_decode_rows(int rows_per_kv_head) {
  return rows_per_kv_head <= 4 ? 4 : 8;
}
KH_HD constexpr int kh_decode_warps() {
  return 4;
}

// Tensor-core decode (decode_tc.cuh; head_dim 64 and 128): KH_DECODE_TC_WARPS warps, 16 rows per
// CTA; shared memory: Q and KH_DECODE_TC_STAGES K/V stages per warp (16 rows each). The -D
// overrides are for sweeps only (the host library must agree with the device code).
#ifndef KH_DECODE_TC_WARPS
#define KH_DECODE_TC_WARPS 4
#endif
#ifndef KH_DECODE_TC_STAGES
#define KH_DECODE_TC_STAGES 2
#endif
KH_HD constexpr int kh_decode_tc_warps() {
  return KH_DECODE_TC_WARPS;
}
KH_HD constexpr int kh_decode_tc_stages() {
  return KH_DECODE_TC_STAGES;
}
// CTAs an SM keeps resident: the kernel's register cap (__launch_bounds__ minimum blocks) is set
// for 12 warps an SM at head_dim 128 (168 registers; shared memory allows 3 CTAs too) and 16 at
// head_dim 64 (128 registers; its accumulators are half the size), so that ptxas never takes
// more registers than that leaves and the host's plan counts the CTAs that run.
KH_HD constexpr int kh_decode_tc_ctas_per_sm(int head_dim) {
  return (head_dim <= 64 ? 16 : 12) / kh_decode_tc_warps();
}
static_assert(kh_decode_tc_ctas_per_sm(128) >= 1, "at most 12 decode warps a CTA");
KH_HD constexpr int kh_decode_tc_smem_bytes(int head_dim) {
  return (1 + 2 * kh_decode_tc_warps() * kh_decode_tc_stages()) * 16 * head_dim * 2;
}
// The most elements one page of the cache may span (page_size x the larger token stride): the
// tensor-core decode offsets the rows inside a page in 32 bits; the host refuses larger pages.
KH_HD constexpr kh_i64 kh_decode_tc_page_span_max() {
  return 0x7FFFFFFF;
}

// Appends new tokens' K and V (nw) into the pages.
struct kh_append_params {
  kh_paged_kv kv;
  kh_new_kv nw;
  int batch, kv_heads, head_dim;
};

#endif  // KH_ATTENTION_PARAMS_H_
