// Device code of the attention package: FlashAttention-2-style forward (mma.sync, sm_80+),
// bf16/fp16 in, fp32 accumulation, optional fp32 log-sum-exp for training; packed varlen or
// padded batches, MHA/GQA/MQA, causal and sliding-window masks (attention_params.h).
//
// Header-free for NVRTC: the build inlines kh_prelude.cuh, attention_params.h and mma.cuh.
// Kernels are extern "C", named attn_fwd_<bf16|fp16>_d<64|128|256>.
//
// Geometry: one CTA per (query block of BM = 16 * NW rows, query head, sequence); each of the NW
// warps owns 16 query rows. Q is loaded once (cp.async -> shared -> ldmatrix into registers);
// the CTA walks its visible key blocks of BN keys: K and V tiles are loaded asynchronously, V of
// block j and K of block j + 1 while the scores of block j are computed and used (FA2's
// schedule), scores S = Q K^T and the output O += P V on tensor cores, softmax online in
// registers (running max and sum per row, exp2 with the scale folded in). Causal: key blocks
// past the diagonal are skipped; only blocks that cross a mask edge are masked. The longest
// query blocks (causal) are scheduled first.
#include "attention_params.h"
#include "kh_prelude.cuh"
#include "mma.cuh"
#include "pdl.cuh"

// The Hopper forward exists only where the device code targets sm_90a (and in nvcc's host pass):
// elsewhere its kernels are absent and the host library falls back to attn_fwd_*.
#if !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KH_ATTN_SM90 1
#endif

namespace {

// -inf (NVRTC has no __builtin_huge_valf, so not a constexpr).
#define KH_NEG_INF __int_as_float(0xff800000)

template <typename T, int D, int NW, int BN>
__device__ __forceinline__ void attn_fwd(const kh_attn_params& p) {
  constexpr int BM = 16 * NW, NT = 32 * NW, CH = D / 8;
  extern __shared__ __align__(128) unsigned char smem[];
  const kh_u32 sQ = kh_smem_addr(smem);
  const kh_u32 sK = sQ + BM * D * 2;
  const kh_u32 sV = sK + BN * D * 2;

  const int b = blockIdx.z, h = blockIdx.y;
  const int mblk = gridDim.x - 1 - blockIdx.x;  // longest (causal) blocks first
  int q0, len_q, k0, len_k;
  kh_attn_seq(p, b, &q0, &len_q, &k0, &len_k);
  const int m0 = mblk * BM;
  if (m0 >= len_q) return;
  const int hk = h / (p.q_heads / p.kv_heads);
  const int offset = len_k - len_q;

  int n_lo, n_hi;  // visible keys of the block's rows [m0, m0 + BM)
  kh_attn_key_range(p, m0, BM, BN, len_q, len_k, &n_lo, &n_hi);

  const T* qb = (const T*)p.q + (kh_i64)q0 * p.q_row + (kh_i64)h * p.q_head;
  const T* kb = (const T*)p.k + (kh_i64)k0 * p.k_row + (kh_i64)hk * p.k_head;
  const T* vb = (const T*)p.v + (kh_i64)k0 * p.v_row + (kh_i64)hk * p.v_head;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;

  kh_load_tile<BM, D, NT>(sQ, qb, p.q_row, m0, len_q, tid);
  kh_cp_async_commit();
  if (n_lo < n_hi) kh_load_tile<BN, D, NT>(sK, kb, p.k_row, n_lo, len_k, tid);
  kh_cp_async_commit();
  kh_cp_async_wait<1>();
  __syncthreads();

  // This warp's 16 query rows as A fragments, for every 16 columns of D.
  kh_u32 qf[D / 16][4];
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
    kh_ldsm_x4(sQ + kh_swz<CH>(warp * 16 + (lane & 15), kk * 2 + (lane >> 4)), qf[kk]);

  float o[D / 8][4];
#pragma unroll
  for (int t = 0; t < D / 8; ++t) o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.f;
  float row_max[2] = {KH_NEG_INF, KH_NEG_INF}, row_sum[2] = {0.f, 0.f};
  const int r0 = m0 + warp * 16 + (lane >> 2);  // this thread's rows: r0 and r0 + 8
  // ldmatrix addresses: 16-row step n and 16-column step k of a swizzled tile are
  // row_base + n * 16 rows + ((k * 32 bytes) ^ x), x this lane's swizzled chunk (both chunk bits
  // below bit 1 and the row's low 3 bits are the same for every step), so the unrolled steps
  // cost an XOR with a constant and no register each.
  const kh_u32 k_row = sK + ((lane & 7) + ((lane >> 4) << 3)) * CH * 16;
  const kh_u32 k_x = (((lane >> 3) & 1) ^ (lane & 7)) << 4;
  const kh_u32 v_row = sV + ((lane & 7) + (((lane >> 3) & 1) << 3)) * CH * 16;
  const kh_u32 v_x = ((lane >> 4) ^ (lane & 7)) << 4;
  const float sl2 = p.scale_log2;

  for (int n0 = n_lo; n0 < n_hi; n0 += BN) {
    kh_load_tile<BN, D, NT>(sV, vb, p.v_row, n0, len_k, tid);
    kh_cp_async_commit();
    kh_cp_async_wait<1>();  // K of this block
    __syncthreads();

    float s[BN / 8][4];
#pragma unroll
    for (int t = 0; t < BN / 8; ++t) s[t][0] = s[t][1] = s[t][2] = s[t][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
      for (int nn = 0; nn < BN / 16; ++nn) {
        kh_u32 bk[4];
        kh_ldsm_x4(k_row + nn * 16 * CH * 16 + ((kk * 32) ^ k_x), bk);
        kh_mma16816<T>(s[2 * nn], qf[kk], bk[0], bk[1]);
        kh_mma16816<T>(s[2 * nn + 1], qf[kk], bk[2], bk[3]);
      }
    }
    __syncthreads();  // every warp is done with this K tile
    if (n0 + BN < n_hi) kh_load_tile<BN, D, NT>(sK, kb, p.k_row, n0 + BN, len_k, tid);
    kh_cp_async_commit();

    // Masks, only where the block crosses an edge: the sequence's end, the diagonal, the window.
    if (kh_attn_block_edge(p, m0, BM, n0, BN, len_q, len_k)) {
#pragma unroll
      for (int t = 0; t < BN / 8; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int col = n0 + t * 8 + 2 * (lane & 3) + (e & 1);
          const int row = r0 + (e >> 1) * 8;
          if (col >= len_k || !kh_attn_visible(row, col, offset, p.causal, p.window_left))
            s[t][e] = KH_NEG_INF;
        }
    }

    // Online softmax for rows r0 (e = 0, 1) and r0 + 8 (e = 2, 3).
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float mx = KH_NEG_INF;
#pragma unroll
      for (int t = 0; t < BN / 8; ++t) mx = fmaxf(mx, fmaxf(s[t][2 * i], s[t][2 * i + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(row_max[i], mx * sl2);
      const float m_use = m_new == KH_NEG_INF ? 0.f : m_new;  // a row with nothing visible yet
      const float alpha = kh_exp2(row_max[i] - m_use);
      row_max[i] = m_new;
      row_sum[i] *= alpha;
#pragma unroll
      for (int t = 0; t < D / 8; ++t) {
        o[t][2 * i] *= alpha;
        o[t][2 * i + 1] *= alpha;
      }
#pragma unroll
      for (int t = 0; t < BN / 8; ++t) {
        s[t][2 * i] = kh_exp2(s[t][2 * i] * sl2 - m_use);
        s[t][2 * i + 1] = kh_exp2(s[t][2 * i + 1] * sl2 - m_use);
        row_sum[i] += s[t][2 * i] + s[t][2 * i + 1];
      }
    }

    kh_cp_async_wait<1>();  // V of this block
    __syncthreads();
    kh_mma_acc_b<T, BN / 16, D / 16>(o, s, v_row, v_x, 16 * CH * 16);
    __syncthreads();  // every warp is done with this V tile
  }

  // Epilogue: normalise, store O (rows past the sequence are not stored) and the LSE.
  T* ob = (T*)p.o + (kh_i64)q0 * p.o_row + (kh_i64)h * p.o_head;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float sum = row_sum[i];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    const int row = r0 + 8 * i;
    if (row >= len_q) continue;
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    T* orow = ob + (kh_i64)row * p.o_row;
#pragma unroll
    for (int t = 0; t < D / 8; ++t)
      *(kh_u32*)(orow + t * 8 + 2 * (lane & 3)) =
          kh_pack2<T>(o[t][2 * i] * inv, o[t][2 * i + 1] * inv);
    if (p.lse && (lane & 3) == 0)
      p.lse[(kh_i64)h * p.lse_head + q0 + row] =
          sum > 0.f ? row_max[i] * 0.6931471805599453f + logf(sum) : KH_NEG_INF;
  }
}

}  // namespace

// ---- Backward (FlashAttention-2's algorithm) ----
//
// attn_bwd_pre: delta = rowsum(dout * out) per (token, head), and dq_accum zeroed.
// attn_bwd: one CTA per (block of 64 keys, KV head, sequence); each of its 4 warps owns 16 keys
// and accumulates their dK and dV in registers over every query head of the KV head's group and
// every query block that sees them. Per query block of 64: S^T = K Q^T, P^T = exp(S^T * scale -
// LSE), dV += P^T dO, dP^T = V dO^T, dS^T = P^T (dP^T - delta), dK += dS^T Q, all on tensor cores
// with P^T and dS^T fed from registers; dS^T goes through shared memory so that each warp then
// computes 16 query rows of dQ = dS K, added to the fp32 dq_accum with atomics (the order of those
// additions varies: dQ is not bit-reproducible).
// attn_bwd_post: dq = dq_accum in the tensor dtype.
namespace {

// 8 consecutive elements of a row as floats: one 16-byte load where `src` is 16-byte aligned
// (always, for out and dout on cuda: host.cpp's cuda_layout_ok; the scalar path is defensive. The
// fp32 workspace only promises 4 bytes, so its paths below are both live).
template <typename T>
KH_DEV void kh_load8_f32(const T* src, float (&f)[8]) {
  if (((unsigned long long)src & 15) == 0) {
    kh_unpack<T, 8>(kh_load_raw<T, 8, KH_LOAD_STREAM>(src), f);
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) f[e] = kh_to_float(src[e]);
  }
}

// D / 8 lanes a (token, head) row, 8 columns each (16-byte loads of out and dout, two 16-byte
// stores of zeros): a lane per column needed 2-byte loads and a CTA per 4 rows.
template <typename T, int D>
__device__ __forceinline__ void attn_bwd_pre(const kh_attn_bwd_params& p) {
  constexpr int LPR = D / kh_attn_bwd_vec();                                 // lanes a row: 8 or 16
  const kh_i64 row = ((kh_i64)blockIdx.x * blockDim.x + threadIdx.x) / LPR;  // token * q_heads + h
  const int c = (threadIdx.x % LPR) * kh_attn_bwd_vec();
  // Whole rows a warp (LPR divides 32), so a row's lanes leave or stay together.
  if (row >= p.tokens_q * p.f.q_heads) return;
  const kh_i64 t = row / p.f.q_heads;
  const int h = (int)(row % p.f.q_heads);
  float o[8], g[8];
  kh_load8_f32((const T*)p.f.o + t * p.f.o_row + (kh_i64)h * p.f.o_head + c, o);
  kh_load8_f32((const T*)p.dout + t * p.do_row + (kh_i64)h * p.do_head + c, g);
  float s = 0.f;
#pragma unroll
  for (int e = 0; e < 8; ++e) s += o[e] * g[e];
  const unsigned mask =
      LPR == 32 ? 0xffffffffu : ((1u << LPR) - 1u) << (threadIdx.x % 32 / LPR * LPR);
#pragma unroll
  for (int off = LPR / 2; off > 0; off >>= 1) s += __shfl_xor_sync(mask, s, off);
  if (c == 0) p.delta[(kh_i64)h * p.tokens_q + t] = s;
  float* acc = p.dq_accum + row * D + c;
  if (((unsigned long long)acc & 15) == 0) {
    reinterpret_cast<float4*>(acc)[0] = make_float4(0.f, 0.f, 0.f, 0.f);
    reinterpret_cast<float4*>(acc)[1] = make_float4(0.f, 0.f, 0.f, 0.f);
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[e] = 0.f;
  }
}

// One thread per 8 columns of a (token, head) row: two 16-byte loads and one 16-byte store where
// both sides are 16-byte aligned (a CTA per row of 128 threads, one column each, was bound by how
// fast CTAs launch: 0.3 ms a layer at Qwen3-0.6B's 8 x 2048 tokens on an H200, about 6x its bytes).
template <typename T, int D>
__device__ __forceinline__ void attn_bwd_post(const kh_attn_bwd_params& p) {
  constexpr int V = kh_attn_bwd_vec();
  static_assert(D % V == 0, "whole vectors a row");
  const kh_i64 i = (kh_i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= p.tokens_q * p.f.q_heads * (D / V)) return;
  const kh_i64 row = i / (D / V);  // token * q_heads + head
  const int d0 = (int)(i % (D / V)) * V;
  const kh_i64 t = row / p.f.q_heads;
  const int h = (int)(row % p.f.q_heads);
  const float* src = p.dq_accum + row * D + d0;
  T* dq = (T*)p.dq + t * p.dq_row + (kh_i64)h * p.dq_head + d0;
  float f[V];
  static_assert(V == 8, "two 16-byte chunks a thread");
  if (p.dq_heads_major) {
    // The Hopper backward's rows (attention_params.h): chunks d0 / 4 and d0 / 4 + 1 of row t.
    const float* r = p.dq_accum + ((kh_i64)h * p.tokens_q + t) * D;
    const int c = (d0 >> 2) ^ (int)(t & 7);
    const float4 a = *reinterpret_cast<const float4*>(r + 4 * c);
    const float4 b = *reinterpret_cast<const float4*>(r + 4 * (c ^ 1));
    f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
  } else if (((unsigned long long)src & 15) == 0) {
    const float4 a = *reinterpret_cast<const float4*>(src);
    const float4 b = *reinterpret_cast<const float4*>(src + 4);
    f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
  } else {
#pragma unroll
    for (int e = 0; e < V; ++e) f[e] = src[e];
  }
  if (((unsigned long long)dq & 15) == 0) {
    kh_store_raw<T, V>(dq, kh_pack<T, V>(f));
  } else {
#pragma unroll
    for (int e = 0; e < V; ++e) dq[e] = kh_convert<T>::from_float(f[e]);
  }
}

template <typename T, int D>
__device__ __forceinline__ void attn_bwd(const kh_attn_bwd_params& p) {
  constexpr int BN = 64, BM = 64, NT = 128, CH = D / 8, CHM = BM / 8;
  const kh_attn_params& f = p.f;
  extern __shared__ __align__(128) unsigned char smem[];
  const kh_u32 sK = kh_smem_addr(smem);
  const kh_u32 sV = sK + BN * D * 2, sQ = sV + BN * D * 2, sO = sQ + BM * D * 2;
  const kh_u32 sS = sO + BM * D * 2;  // dS^T [BN][BM]
  float* s_lse = (float*)(smem + 4 * 64 * D * 2 + BN * BM * 2);
  float* s_delta = s_lse + BM;

  const kh_attn_cta_t tile = kh_attn_tile(f.tail_ctas);
  const int b = tile.seq, hk = tile.head, n0 = tile.blk * BN;
  int q0, len_q, k0, len_k;
  kh_attn_seq(f, b, &q0, &len_q, &k0, &len_k);
  if (n0 >= len_k) return;
  const int offset = len_k - len_q;
  int m_lo, m_hi;  // the queries that see any key of [n0, n0 + BN)
  kh_attn_query_range(f, n0, BN, BM, len_q, len_k, &m_lo, &m_hi);
  const int group = f.q_heads / f.kv_heads;
  const T* kb = (const T*)f.k + (kh_i64)k0 * f.k_row + (kh_i64)hk * f.k_head;
  const T* vb = (const T*)f.v + (kh_i64)k0 * f.v_row + (kh_i64)hk * f.v_head;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const float sl2 = f.scale_log2;

  kh_load_tile<BN, D, NT>(sK, kb, f.k_row, n0, len_k, tid);
  kh_load_tile<BN, D, NT>(sV, vb, f.v_row, n0, len_k, tid);
  kh_cp_async_commit();

  // ldmatrix addresses (see attn_fwd): A fragments of this warp's 16 key rows (K, V); B
  // fragments from query-row tiles (Q, dO) plain (n = queries) and transposed (k = queries), and
  // transposed from K (k = keys, for dQ); A fragments of dS from the dS^T tile, transposed.
  const kh_u32 a_off = (warp * 16 + (lane & 15)) * CH * 16, a_x = ((lane >> 4) ^ (lane & 7)) << 4;
  const kh_u32 b_off = ((lane & 7) + ((lane >> 4) << 3)) * CH * 16;
  const kh_u32 b_x = (((lane >> 3) & 1) ^ (lane & 7)) << 4;
  const kh_u32 t_off = ((lane & 7) + (((lane >> 3) & 1) << 3)) * CH * 16;
  const kh_u32 t_x = ((lane >> 4) ^ (lane & 7)) << 4;
  const kh_u32 s_a = sS + ((lane & 7) + ((lane >> 4) << 3)) * CHM * 16 +
                     (((warp * 2 + ((lane >> 3) & 1)) ^ (lane & 7)) << 4);

  float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
  for (int t = 0; t < D / 8; ++t)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[t][e] = dv[t][e] = 0.f;
  const int kr0 = n0 + warp * 16 + (lane >> 2);  // this thread's keys: kr0 and kr0 + 8

  for (int hq = hk * group; hq < (hk + 1) * group; ++hq) {
    const T* qb = (const T*)f.q + (kh_i64)q0 * f.q_row + (kh_i64)hq * f.q_head;
    const T* gb = (const T*)p.dout + (kh_i64)q0 * p.do_row + (kh_i64)hq * p.do_head;
    for (int m0 = m_lo; m0 < m_hi; m0 += BM) {
      __syncthreads();  // the previous step's readers of sQ, sO, sS and the row stats are done
      kh_load_tile<BM, D, NT>(sQ, qb, f.q_row, m0, len_q, tid);
      kh_load_tile<BM, D, NT>(sO, gb, p.do_row, m0, len_q, tid);
      kh_cp_async_commit();
      if (tid < BM) {
        const int i = m0 + tid;
        const float l = i < len_q ? f.lse[(kh_i64)hq * f.lse_head + q0 + i] : KH_NEG_INF;
        // A row past the sequence, or one that saw no key (LSE -inf), contributes nothing.
        s_lse[tid] = l == KH_NEG_INF ? (-KH_NEG_INF) : l * 1.4426950408889634f;
        s_delta[tid] = i < len_q ? p.delta[(kh_i64)hq * p.tokens_q + q0 + i] : 0.f;
      }
      kh_cp_async_wait<0>();
      __syncthreads();

      // S^T = K Q^T for this warp's 16 keys and the block's BM queries.
      float s[BM / 8][4];
#pragma unroll
      for (int t = 0; t < BM / 8; ++t) s[t][0] = s[t][1] = s[t][2] = s[t][3] = 0.f;
      kh_mma_tile_abt<T, D / 16, BM / 16>(s, sK + a_off, a_x, sQ + b_off, b_x, 16 * CH * 16);
      // P^T, zero where a query does not see a key.
#pragma unroll
      for (int t = 0; t < BM / 8; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int col = t * 8 + 2 * (lane & 3) + (e & 1), qi = m0 + col;
          const int key = kr0 + (e >> 1) * 8;
          const bool vis = key < len_k && qi < len_q &&
                           kh_attn_visible(qi, key, offset, f.causal, f.window_left);
          s[t][e] = vis ? kh_exp2(s[t][e] * sl2 - s_lse[col]) : 0.f;
        }
      // dV += P^T dO.
      kh_mma_acc_b<T, BM / 16, D / 16>(dv, s, sO + t_off, t_x, 16 * CH * 16);
      // dP^T = V dO^T, then dS^T = P^T (dP^T - delta) in place of P^T.
      {
        float dp[BM / 8][4];
#pragma unroll
        for (int t = 0; t < BM / 8; ++t) dp[t][0] = dp[t][1] = dp[t][2] = dp[t][3] = 0.f;
        kh_mma_tile_abt<T, D / 16, BM / 16>(dp, sV + a_off, a_x, sO + b_off, b_x, 16 * CH * 16);
#pragma unroll
        for (int t = 0; t < BM / 8; ++t)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            s[t][e] = s[t][e] * (dp[t][e] - s_delta[t * 8 + 2 * (lane & 3) + (e & 1)]);
      }
      // dK += dS^T Q, and dS^T into shared memory for dQ.
      kh_mma_acc_b<T, BM / 16, D / 16>(dk, s, sQ + t_off, t_x, 16 * CH * 16);
#pragma unroll
      for (int kq = 0; kq < BM / 16; ++kq) {
        kh_u32 da[4];
        kh_acc_to_a<T>(s, kq, da);
        // Rows r (keys) and r + 8, columns c, c + 1 of 16-column step kq: two 4-byte stores.
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int r = warp * 16 + (lane >> 2) + 8 * half;
#pragma unroll
          for (int tt = 0; tt < 2; ++tt) {
            const int c = (2 * kq + tt) * 8 + 2 * (lane & 3);
            const kh_u32 addr = sS + (kh_u32)(r * CHM + ((c >> 3) ^ (r & 7))) * 16 + (c & 7) * 2;
            asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(da[2 * tt + half]));
          }
        }
      }
      __syncthreads();
      // dQ rows [m0 + warp * 16, + 16) = dS K over the block's keys, added into dq_accum.
      {
        float dq[D / 8][4];
#pragma unroll
        for (int t = 0; t < D / 8; ++t) dq[t][0] = dq[t][1] = dq[t][2] = dq[t][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk) {
          kh_u32 sa[4];
          kh_ldsm_x4_trans(s_a + kk * 16 * CHM * 16, sa);
#pragma unroll
          for (int dd = 0; dd < D / 16; ++dd) {
            kh_u32 bk[4];
            kh_ldsm_x4_trans(sK + t_off + kk * 16 * CH * 16 + ((dd * 32) ^ t_x), bk);
            kh_mma16816<T>(dq[2 * dd], sa, bk[0], bk[1]);
            kh_mma16816<T>(dq[2 * dd + 1], sa, bk[2], bk[3]);
          }
        }
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int qi = m0 + warp * 16 + (lane >> 2) + 8 * half;
          if (qi >= len_q) continue;
          float* acc = p.dq_accum + ((kh_i64)(q0 + qi) * f.q_heads + hq) * D + 2 * (lane & 3);
#pragma unroll
          for (int t = 0; t < D / 8; ++t) {
            atomicAdd(acc + t * 8, dq[t][2 * half] * f.scale);
            atomicAdd(acc + t * 8 + 1, dq[t][2 * half + 1] * f.scale);
          }
        }
      }
    }
  }

  // dK (scaled) and dV of this warp's keys.
  T* dkb = (T*)p.dk + (kh_i64)k0 * p.dk_row + (kh_i64)hk * p.dk_head;
  T* dvb = (T*)p.dv + (kh_i64)k0 * p.dv_row + (kh_i64)hk * p.dv_head;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int key = kr0 + 8 * half;
    if (key >= len_k) continue;
#pragma unroll
    for (int t = 0; t < D / 8; ++t) {
      const int d = t * 8 + 2 * (lane & 3);
      *(kh_u32*)(dkb + (kh_i64)key * p.dk_row + d) =
          kh_pack2<T>(dk[t][2 * half] * f.scale, dk[t][2 * half + 1] * f.scale);
      *(kh_u32*)(dvb + (kh_i64)key * p.dv_row + d) =
          kh_pack2<T>(dv[t][2 * half], dv[t][2 * half + 1]);
    }
  }
}

}  // namespace

#define KH_ATTN_BWD(TNAME, T, D)                                 \
  extern "C" __global__ void __launch_bounds__(128)              \
      attn_bwd_pre_##TNAME##_d##D(const kh_attn_bwd_params p) {  \
    kh_pdl_enter();                                              \
    attn_bwd_pre<T, D>(p);                                       \
  }                                                              \
  extern "C" __global__ void __launch_bounds__(128, 1)           \
      attn_bwd_##TNAME##_d##D(const kh_attn_bwd_params p) {      \
    kh_pdl_enter();                                              \
    attn_bwd<T, D>(p);                                           \
  }                                                              \
  extern "C" __global__ void __launch_bounds__(256)              \
      attn_bwd_post_##TNAME##_d##D(const kh_attn_bwd_params p) { \
    kh_pdl_enter();                                              \
    attn_bwd_post<T, D>(p);                                      \
  }

KH_ATTN_BWD(bf16, kh_bf16, 64)
KH_ATTN_BWD(bf16, kh_bf16, 128)
KH_ATTN_BWD(fp16, kh_fp16, 64)
KH_ATTN_BWD(fp16, kh_fp16, 128)

#define KH_ATTN_FWD(TNAME, T, D)                                             \
  extern "C" __global__ void __launch_bounds__(32 * kh_attn_fwd_warps(D), 1) \
      attn_fwd_##TNAME##_d##D(const kh_attn_params p) {                      \
    kh_pdl_enter();                                                          \
    attn_fwd<T, D, kh_attn_fwd_warps(D), kh_attn_fwd_block_n(D)>(p);         \
  }

#define KH_ATTN_FWD_DTYPE(TNAME, T) \
  KH_ATTN_FWD(TNAME, T, 64)         \
  KH_ATTN_FWD(TNAME, T, 128)        \
  KH_ATTN_FWD(TNAME, T, 256)

KH_ATTN_FWD_DTYPE(bf16, kh_bf16)
KH_ATTN_FWD_DTYPE(fp16, kh_fp16)

#ifdef KH_ATTN_SM90
#include "forward_sm90.cuh"
#define KH_ATTN_FWD90(TNAME, T, D)                                          \
  extern "C" __global__ void __launch_bounds__(384, 1)                      \
      attn_fwd90_##TNAME##_d##D(const __grid_constant__ kh_attn_params p) { \
    kh_pdl_enter();                                                         \
    attn_fwd_wg<T, D>(p);                                                   \
  }
KH_ATTN_FWD90(bf16, kh_bf16, 64)
KH_ATTN_FWD90(bf16, kh_bf16, 128)
KH_ATTN_FWD90(fp16, kh_fp16, 64)
KH_ATTN_FWD90(fp16, kh_fp16, 128)
#include "backward_sm90.cuh"
#define KH_ATTN_BWD90(TNAME, T, D)                                              \
  extern "C" __global__ void __launch_bounds__(384, 1)                          \
      attn_bwd90_##TNAME##_d##D(const __grid_constant__ kh_attn_bwd_params p) { \
    kh_pdl_enter();                                                             \
    attn_bwd_wg<T, D>(p);                                                       \
  }
KH_ATTN_BWD90(bf16, kh_bf16, 64)
KH_ATTN_BWD90(bf16, kh_bf16, 128)
KH_ATTN_BWD90(fp16, kh_fp16, 64)
KH_ATTN_BWD90(fp16, kh_fp16, 128)
#endif

// ---- Decode against a paged KV cache (flash-decoding) ----
//
// One CTA per (context split, KV head x group of R = 4 or 8 query rows, sequence): the
// rows are the (query head, query token) pairs that share the KV head, so K and V are read once
// for all of them (GQA). Each token's head_dim is D / 8 lanes of 16 bytes; a warp walks 32 / (D /
// 8) tokens per step, U steps in flight; every token group keeps its own online-softmax state,
// combined through shared memory at the end. One split writes the output; several write partial
// states that attn_decode_combine merges. Memory-bound: the K/V bytes of the context are read
// once per KV head.
#ifndef KH_DECODE_UNROLL
#define KH_DECODE_UNROLL 4  // token steps in flight per warp (a -D for tuning sweeps)
#endif

namespace {

// Column d of row (token tok, query head h) of a decode CTA's merged state (max M, sum L,
// unnormalised output O): the output when the context has one split, else split `split`'s
// partial state for attn_decode_combine.
template <typename T, int D>
KH_DEV void kh_decode_store(const kh_decode_params& p, kh_i64 tok, int h, int split, int d, float M,
                            float L, float O) {
  if (p.splits == 1) {
    T* op = (T*)p.o + tok * p.o_row + (kh_i64)h * p.o_head;
    op[d] = kh_convert<T>::from_float(L > 0.f ? O / L : 0.f);
  } else {
    float* part = p.partial + ((tok * p.q_heads + h) * p.splits + split) * (D + 2);
    part[d] = O;
    if (d == 0) {
      part[D] = M;
      part[D + 1] = L;
    }
  }
}

template <typename T, int D, int R>
__device__ __forceinline__ void attn_decode(const kh_decode_params& p) {
  constexpr int NW = kh_decode_warps();
  constexpr int LPT = D / 8, TPW = 32 / LPT, SLOTS = NW * TPW, U = KH_DECODE_UNROLL;
  __shared__ float s_m[SLOTS][R], s_l[SLOTS][R];
  __shared__ float s_acc[SLOTS][R][D];

  const int split = blockIdx.x, b = blockIdx.z;
  const int G = p.q_heads / p.kv_heads, rows_total = G * p.q_tokens;
  const int groups = (rows_total + R - 1) / R;
  const int hk = blockIdx.y / groups, rg = blockIdx.y % groups;
  const int len = p.kv.seq_lens[b];
  const int t_lo = split * p.split_tokens;
  const int t_hi = min(len, t_lo + p.split_tokens);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int sub = lane / LPT, cl = lane % LPT, slot = warp * TPW + sub;

  float q[R][8];
  int pos[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int gr = rg * R + r;
    const int qi = gr / G, h = hk * G + gr % G;
    pos[r] = gr < rows_total ? len - p.q_tokens + qi : -1;  // -1: a padding row sees nothing
    if (gr < rows_total) {
      const T* qp = (const T*)p.q + (kh_i64)(b * p.q_tokens + qi) * p.q_row + (kh_i64)h * p.q_head;
      float f[8];
      kh_unpack<T, 8>(kh_load_raw<T, 8, KH_LOAD_READONLY>(qp + cl * 8), f);
#pragma unroll
      for (int e = 0; e < 8; ++e) q[r][e] = f[e] * p.scale_log2;
    } else {
#pragma unroll
      for (int e = 0; e < 8; ++e) q[r][e] = 0.f;
    }
  }
  float m[R], l[R], acc[R][8];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    m[r] = KH_NEG_INF;
    l[r] = 0.f;
#pragma unroll
    for (int e = 0; e < 8; ++e) acc[r][e] = 0.f;
  }

  // The loop bound is the warp's first token, so the whole warp iterates together (the score
  // reduction shuffles across the warp's token groups' lanes); tokens past t_hi are masked.
  for (int tw = t_lo + warp * TPW; tw < t_hi; tw += SLOTS * U) {
    const int t0 = tw + sub;
    kh_u32x4 kc[U], vc[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int t = t0 + u * SLOTS;
      if (t < t_hi) {
        kh_i64 ko, vo;
        kh_paged_offsets(p.kv, b, t, hk, &ko, &vo);
        kc[u] = kh_ld_stream((const T*)p.kv.k + ko + cl * 8);
        vc[u] = kh_ld_stream((const T*)p.kv.v + vo + cl * 8);
      } else {
        kc[u] = vc[u] = kh_u32x4{0, 0, 0, 0};
      }
    }
    float s[U][R];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float k[8];
      kh_raw<T, 8> raw;
      raw.v = kc[u];
      kh_unpack<T, 8>(raw, k);
      const int t = t0 + u * SLOTS;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float d = 0.f;
#pragma unroll
        for (int e = 0; e < 8; ++e) d += q[r][e] * k[e];
#pragma unroll
        for (int off = LPT / 2; off > 0; off >>= 1) d += __shfl_xor_sync(0xffffffffu, d, off);
        const bool vis =
            t < t_hi && t <= pos[r] && (p.window_left < 0 || t >= pos[r] - p.window_left);
        s[u][r] = vis ? d : KH_NEG_INF;
      }
    }
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float mx = m[r];
#pragma unroll
      for (int u = 0; u < U; ++u) mx = fmaxf(mx, s[u][r]);
      const float m_use = mx == KH_NEG_INF ? 0.f : mx;
      const float alpha = kh_exp2(m[r] - m_use);
      m[r] = mx;
      l[r] *= alpha;
#pragma unroll
      for (int e = 0; e < 8; ++e) acc[r][e] *= alpha;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const float pe = kh_exp2(s[u][r] - m_use);
        l[r] += pe;
        float v[8];
        kh_raw<T, 8> raw;
        raw.v = vc[u];
        kh_unpack<T, 8>(raw, v);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[r][e] += pe * v[e];
      }
    }
  }

  // Combine the token slots.
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (cl == 0) {
      s_m[slot][r] = m[r];
      s_l[slot][r] = l[r];
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) s_acc[slot][r][cl * 8 + e] = acc[r][e];
  }
  __syncthreads();
  for (int i = threadIdx.x; i < R * D; i += NW * 32) {
    const int r = i / D, d = i % D;
    const int gr = rg * R + r;
    if (gr >= rows_total) continue;
    float M = KH_NEG_INF;
    for (int s2 = 0; s2 < SLOTS; ++s2) M = fmaxf(M, s_m[s2][r]);
    const float M_use = M == KH_NEG_INF ? 0.f : M;
    float L = 0.f, O = 0.f;
    for (int s2 = 0; s2 < SLOTS; ++s2) {
      const float w = kh_exp2(s_m[s2][r] - M_use);
      L += s_l[s2][r] * w;
      O += s_acc[s2][r][d] * w;
    }
    kh_decode_store<T, D>(p, (kh_i64)b * p.q_tokens + gr / G, hk * G + gr % G, split, d, M, L, O);
  }
}

// Merges the splits' partial states of one (token, head) per CTA; thread d owns column d. Up to
// kDecodeCombineRegs splits (every decode plan on an H100/H200) read their (max, sum, column) in
// one round of loads into registers, before any arithmetic, instead of the maxima first and the
// rest after them: the combine runs on the decode step's critical path, where a second round trip
// to L2 is most of its time (on the H200 its share of the step went from about 4.5 to 2.9 us a
// layer). The same arithmetic in the same order either way (the same bits).
constexpr int kDecodeCombineRegs = 8;
template <typename T, int D>
__device__ __forceinline__ void attn_decode_combine(const kh_decode_params& p) {
  const kh_i64 row = blockIdx.x;  // tok * q_heads + h
  const kh_i64 tok = row / p.q_heads;
  const int h = (int)(row % p.q_heads), d = threadIdx.x;
  const float* part = p.partial + row * p.splits * (D + 2);
  float M = KH_NEG_INF, L = 0.f, O = 0.f;
  if (p.splits <= kDecodeCombineRegs) {
    // Loads in asm volatile: the compiler keeps them in this order, ahead of the arithmetic
    // (plain loads it sank the first splits' sums and columns below the maxima: a second round
    // trip; a volatile pointer made them system-scope strong loads).
    auto ld = [](const float* a) {
      float v;
      asm volatile("ld.global.f32 %0, [%1];\n" : "=f"(v) : "l"(a));
      return v;
    };
    float m[kDecodeCombineRegs], l[kDecodeCombineRegs], o[kDecodeCombineRegs];
#pragma unroll
    for (int s = 0; s < kDecodeCombineRegs; ++s)
      if (s < p.splits) {
        m[s] = ld(part + s * (D + 2) + D);
        l[s] = ld(part + s * (D + 2) + D + 1);
        o[s] = ld(part + s * (D + 2) + d);
      }
#pragma unroll
    for (int s = 0; s < kDecodeCombineRegs; ++s)
      if (s < p.splits) M = fmaxf(M, m[s]);
    const float M_use = M == KH_NEG_INF ? 0.f : M;
#pragma unroll
    for (int s = 0; s < kDecodeCombineRegs; ++s)
      if (s < p.splits) {
        const float w = kh_exp2(m[s] - M_use);
        L += l[s] * w;
        O += o[s] * w;
      }
  } else {
    for (int s = 0; s < p.splits; ++s) M = fmaxf(M, part[s * (D + 2) + D]);
    const float M_use = M == KH_NEG_INF ? 0.f : M;
    for (int s = 0; s < p.splits; ++s) {
      const float w = kh_exp2(part[s * (D + 2) + D] - M_use);
      L += part[s * (D + 2) + D + 1] * w;
      O += part[s * (D + 2) + d] * w;
    }
  }
  T* op = (T*)p.o + tok * p.o_row + (kh_i64)h * p.o_head;
  op[d] = kh_convert<T>::from_float(L > 0.f ? O / L : 0.f);
}

// One CTA per (new token, KV head); thread c copies 16-byte chunk c of K and of V.
template <typename T>
__device__ __forceinline__ void paged_kv_append(const kh_append_params& p) {
  const int i = blockIdx.x, hk = blockIdx.y;
  const int b = i / p.nw.n, j = i % p.nw.n;
  const int t = p.kv.seq_lens[b] - p.nw.n + j;
  if (t < 0) return;
  kh_i64 ko, vo;
  kh_paged_offsets(p.kv, b, t, hk, &ko, &vo);
  for (int c = threadIdx.x; c < p.head_dim / 8; c += blockDim.x) {
    kh_st((T*)p.kv.k + ko + c * 8,
          kh_ld((const T*)p.nw.k + (kh_i64)i * p.nw.k_row + (kh_i64)hk * p.nw.k_head + c * 8));
    kh_st((T*)p.kv.v + vo + c * 8,
          kh_ld((const T*)p.nw.v + (kh_i64)i * p.nw.v_row + (kh_i64)hk * p.nw.v_head + c * 8));
  }
}

}  // namespace

#include "decode_tc.cuh"
// The register cap that keeps kh_decode_tc_ctas_per_sm(D) CTAs resident.
#define KH_ATTN_DECODE_TC(TNAME, T, D)                                      \
  extern "C" __global__ void __launch_bounds__(32 * kh_decode_tc_warps(),   \
                                               kh_decode_tc_ctas_per_sm(D)) \
      attn_decode_tc_##TNAME##_d##D(const kh_decode_params p) {             \
    kh_pdl_enter();                                                         \
    attn_decode_tc<T, D>(p);                                                \
  }
KH_ATTN_DECODE_TC(bf16, kh_bf16, 64)
KH_ATTN_DECODE_TC(bf16, kh_bf16, 128)
KH_ATTN_DECODE_TC(fp16, kh_fp16, 64)
KH_ATTN_DECODE_TC(fp16, kh_fp16, 128)

#define KH_ATTN_DECODE_ROWS(TNAME, T, D, R)                            \
  extern "C" __global__ void __launch_bounds__(32 * kh_decode_warps()) \
      attn_decode_##TNAME##_d##D##_r##R(const kh_decode_params p) {    \
    kh_pdl_enter();                                                    \
    attn_decode<T, D, R>(p);                                           \
  }

#define KH_ATTN_DECODE(TNAME, T, D)                                  \
  KH_ATTN_DECODE_ROWS(TNAME, T, D, 4)                                \
  KH_ATTN_DECODE_ROWS(TNAME, T, D, 8)                                \
  extern "C" __global__ void __launch_bounds__(D)                    \
      attn_decode_combine_##TNAME##_d##D(const kh_decode_params p) { \
    kh_pdl_enter();                                                  \
    attn_decode_combine<T, D>(p);                                    \
  }

#define KH_ATTN_DECODE_DTYPE(TNAME, T)                    \
  KH_ATTN_DECODE(TNAME, T, 64)                            \
  KH_ATTN_DECODE(TNAME, T, 128)                           \
  KH_ATTN_DECODE(TNAME, T, 256)                           \
  extern "C" __global__ void __launch_bounds__(32)        \
      paged_kv_append_##TNAME(const kh_append_params p) { \
    kh_pdl_enter();                                       \
    paged_kv_append<T>(p);                                \
  }

KH_ATTN_DECODE_DTYPE(bf16, kh_bf16)
KH_ATTN_DECODE_DTYPE(fp16, kh_fp16)
