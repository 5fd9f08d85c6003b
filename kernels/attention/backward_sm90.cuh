// Hopper backward (sm_90a): attention.cu's attn_bwd (FlashAttention-2's algorithm) with its five
// products on wgmma, warp specialized as FlashAttention-3's backward.
//
// Geometry: one CTA of three warpgroups per (block of BN = 128 keys, KV head, sequence). K and V
// stay in shared memory. Warpgroup 0 is the producer: it loads Q, dO, LSE and delta of each step
// (query block of BM = 64 rows of one query head of the KV head's group) into STAGES stages with
// TMA (cp.async where a tile runs past the sequence) and signals each stage's `full` mbarrier once
// it has landed; and it adds each step's dQ tile, which the consumers leave in shared memory, to
// the fp32 dq_accum with one bulk reduction (cp.reduce.async.bulk by one thread: dq_accum is laid
// out [q_heads, tokens_q, head_dim] for it), so the consumers never wait on global memory.
// Warpgroups 1 and 2 are consumers of 64 keys each, accumulating their dK and dV in registers;
// per step, each product overlapping the register work after it (wgmma commit groups):
//   S^T = K Q^T, then dP^T = V dO^T (wgmma, both operands in shared memory);
//   P^T = exp2(S^T * scale - LSE) while dP^T runs; dV += P^T dO (A from registers, dO MN-major);
//   dS^T = P^T (dP^T - delta) while dV runs; dK += dS^T Q;
//   dS^T -> shared memory (two buffers) while dK runs; after a named barrier of the consumers,
//   dQ = dS K split by columns between them (both operands MN-major); the stage is released
//   (`empty`) and dQ goes to the staging tile (`dq_empty` / `dq_full` mbarriers with the
//   producer). setmaxnreg moves registers from the producer to the consumers. At the end dK and
//   dV leave through the Q/dO stages as whole rows (tile_store.cuh).
// dq_accum's rows keep the staging tile's swizzle (row t's 16-byte chunk c at chunk c ^ (t & 7),
// t the token): attn_bwd_post reads them back in order.
#ifndef KH_ATTENTION_BACKWARD_SM90_CUH_
#define KH_ATTENTION_BACKWARD_SM90_CUH_

#include "sm90_sync.cuh"
#include "tile_store.cuh"
#include "wgmma.cuh"

namespace {

// 4 bytes global -> shared, asynchronously; `valid` false zero-fills.
KH_DEV void kh_cp_async4(kh_u32 smem, const void* gmem, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem), "l"(gmem),
               "r"(valid ? 4 : 0));
}

template <typename T, int D>
__device__ __forceinline__ void attn_bwd_wg(const kh_attn_bwd_params& p) {
  constexpr int BN = kh_attn_bwd90_block_n(), BM = kh_attn_bwd90_block_m();
  constexpr int STAGES = kh_attn_bwd90_stages();
  constexpr kh_u32 TILE_KV = BN * D * 2, TILE_Q = BM * D * 2, TILE_S = BN * BM * 2;
  const kh_attn_params& f = p.f;
  extern __shared__ __align__(128) unsigned char smem[];
  const kh_u32 base = kh_smem_addr(smem);
  const kh_u32 sK = (base + 1023u) & ~1023u;
  const kh_u32 sV = sK + TILE_KV;
  const kh_u32 sQ0 = sV + TILE_KV;              // stage s: Q at sQ0 + 2 s TILE_Q, dO right after
  const kh_u32 sS = sQ0 + 2 * STAGES * TILE_Q;  // dS^T buffer j & 1: BN keys x BM queries
  const kh_u32 sDQ = sS + 2 * TILE_S;           // dQ staging: BM rows x D fp32, swizzled
  const kh_u32 sStats = sDQ + BM * D * 4;       // [stage][lse | delta][BM] fp32, raw
  const kh_u32 bars = sStats + STAGES * 2 * BM * 4;  // full[S], empty[S], dq_full, dq_empty
  const kh_u32 dq_full = bars + 16 * STAGES, dq_empty = dq_full + 8;
  const float* s_stats = (const float*)(smem + (sStats - base));

  const kh_attn_cta_t tile = kh_attn_tile(f.tail_ctas);
  const int b = tile.seq, hk = tile.head, n0 = tile.blk * BN;
  int q0, len_q, k0, len_k;
  kh_attn_seq(f, b, &q0, &len_q, &k0, &len_k);
  if (n0 >= len_k) return;
  const int offset = len_k - len_q;
  int m_lo, m_hi;
  kh_attn_query_range(f, n0, BN, BM, len_q, len_k, &m_lo, &m_hi);
  const int nm = m_hi > m_lo ? (m_hi - m_lo + BM - 1) / BM : 0;
  const int group = f.q_heads / f.kv_heads;
  const int steps = group * nm;

  const int tid = threadIdx.x;
  if (tid < STAGES) {
    kh_mbar_init(bars + 8 * tid, 128);             // full: every producer thread arrives
    kh_mbar_init(bars + 8 * (STAGES + tid), 256);  // empty: every consumer thread arrives
  } else if (tid == STAGES) {
    kh_mbar_init(dq_full, 256);
    kh_mbar_init(dq_empty, 1);  // the producer thread that issues the reduction
  }
  kh_fence_mbar_init();
  __syncthreads();

  // dQ staging tile: row r (token t)'s 16-byte chunk c (columns 4c .. 4c + 3) at r * 4D +
  // ((c ^ (t & 7)) * 16): the consumers' 8-byte stores of 8 rows at once fall in distinct banks,
  // and the tile is dq_accum's rows as they lie in global memory.
  auto dq_off = [](int r, int t, int col) -> kh_u32 {
    return (kh_u32)(r * D * 4 + (((col >> 2) ^ (t & 7)) << 4) + (col & 3) * 4);
  };

  if (tid < 128) {
    // Producer: step j's loads (Q and dO of query block j % nm of head hk * group + j / nm, and
    // its raw LSE and delta; K and V with step 0) once stage j % STAGES is free; step j - 1 is
    // signalled when it has landed (one group stays in flight); then step j - 2's dQ tile is
    // added to dq_accum.
    kh_regs_dec<40>();
    // Per-head bases, advanced when the step's head changes (steps walk the query blocks of one
    // head, then the next head of the group): Q, dO, this thread's LSE (threads < BM) or delta
    // row, and dq_accum at the sequence's first token.
    const int hq0 = hk * group;
    const T* qh = (const T*)f.q + (kh_i64)q0 * f.q_row + (kh_i64)hq0 * f.q_head;
    const T* oh = (const T*)p.dout + (kh_i64)q0 * p.do_row + (kh_i64)hq0 * p.do_head;
    const bool lse_thread = tid < BM;
    const float* sh = lse_thread ? f.lse + (kh_i64)hq0 * f.lse_head + q0
                                 : p.delta + (kh_i64)hq0 * p.tokens_q + q0;
    const kh_i64 s_head = lse_thread ? f.lse_head : p.tokens_q;
    float* dqh = p.dq_accum + ((kh_i64)hq0 * p.tokens_q + q0) * D;
    int mi = 0, rmi = 0;  // query block (of nm) of the step being loaded / reduced
    // Step i's tile (its rows inside the sequence) added to dq_accum by the copy engine, issued
    // by thread 0, which releases the staging tile once the engine has read it. (The consumers
    // fenced their stores for the async proxy before they arrived at dq_full.) Every producer
    // thread waits and walks the bases: thread 0 alone in this branch spilled twice the bytes.
    auto reduce_dq = [&](int i) {
      const int m0 = m_lo + rmi * BM;
      const int rows = len_q - m0 < BM ? len_q - m0 : BM;
      kh_mbar_wait(dq_full, i & 1);
      if (tid == 0) {
        kh_bulk_reduce_add_f32(dqh + (kh_i64)m0 * D, sDQ, (kh_u32)(rows * D * 4));
        kh_bulk_commit();
        kh_bulk_wait_read<0>();
        kh_mbar_arrive(dq_empty);
      }
      if (++rmi == nm) {
        rmi = 0;
        dqh += p.tokens_q * D;
      }
    };
    for (int j = 0; j <= steps; ++j) {
      if (j < steps) {
        const int st = j % STAGES, m0 = m_lo + mi * BM;
        if (j >= STAGES) kh_mbar_wait(bars + 8 * (STAGES + st), (j / STAGES - 1) & 1);
        // With f.tma, whole tiles come by TMA (thread 0 adds their bytes to the stage's `full`
        // barrier, which the cp.async arrivals below still gate); tiles that run past the
        // sequence come by cp.async, which zero-fills: their rows must be zeros, not the next
        // tokens of the tensor (0 * a non-finite value would be NaN in dS, dV, dK or dQ).
        const bool kv_tma = f.tma && n0 + BN <= len_k, q_tma = f.tma && m0 + BM <= len_q;
        const kh_u32 full_st = bars + 8 * st;
        if (tid == 0 && (q_tma || (j == 0 && kv_tma))) {
          kh_mbar_expect_tx(full_st,
                            (q_tma ? 2 * TILE_Q : 0) + (j == 0 && kv_tma ? 2 * TILE_KV : 0));
          if (j == 0 && kv_tma) {
            kh_tma_load4(sK, &f.k_map, 0, k0 + n0, 0, hk, full_st);
            kh_tma_load4(sV, &f.v_map, 0, k0 + n0, 0, hk, full_st);
          }
        }
        if (j == 0 && !kv_tma) {
          kh_load_panels<BN, D, 128>(sK,
                                     (const T*)f.k + (kh_i64)k0 * f.k_row + (kh_i64)hk * f.k_head,
                                     f.k_row, n0, len_k, tid);
          kh_load_panels<BN, D, 128>(sV,
                                     (const T*)f.v + (kh_i64)k0 * f.v_row + (kh_i64)hk * f.v_head,
                                     f.v_row, n0, len_k, tid);
        }
        const kh_u32 q_tile = sQ0 + st * 2 * TILE_Q;
        if (q_tma) {
          if (tid == 0) {
            const int hq = hq0 + j / nm;
            kh_tma_load4(q_tile, &f.q_map, 0, q0 + m0, 0, hq, full_st);
            kh_tma_load4(q_tile + TILE_Q, &p.do_map, 0, q0 + m0, 0, hq, full_st);
          }
        } else {
          kh_load_panels<BM, D, 128>(q_tile, qh, f.q_row, m0, len_q, tid);
          kh_load_panels<BM, D, 128>(q_tile + TILE_Q, oh, p.do_row, m0, len_q, tid);
        }
        const int i = m0 + (tid & (BM - 1));
        kh_cp_async4(sStats + (st * 2 * BM + tid) * 4, sh + (i < len_q ? i : 0), i < len_q);
        if (++mi == nm) {
          mi = 0;
          qh += f.q_head;
          oh += p.do_head;
          sh += s_head;
        }
      }
      kh_cp_async_commit();
      if (j >= 1) {
        kh_cp_async_wait<1>();
        kh_fence_proxy_async();
        kh_mbar_arrive(bars + 8 * ((j - 1) % STAGES));
      }
      if (j >= 2) reduce_dq(j - 2);
    }
    if (steps >= 1) reduce_dq(steps - 1);
    kh_cp_async_wait<0>();
    if (tid == 0) kh_bulk_wait<0>();
    return;
  }

  // Consumers.
  kh_regs_inc<232>();
  const int ct = tid - 128, wg = ct >> 7, warp = (ct >> 5) & 3, lane = tid & 31;
  const float sl2 = f.scale_log2;
  float dk[D / 2], dv[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dk[i] = dv[i] = 0.f;
  const int kr0 = n0 + wg * 64 + warp * 16 + (lane >> 2);  // this thread's keys: kr0, kr0 + 8
  const kh_u32 k_rows = sK + wg * 64 * 128, v_rows = sV + wg * 64 * 128;

  // Step j's stage (j % STAGES), its phase ((j / STAGES) & 1) and query block (j % nm) as
  // counters: the divisions took about 40 instructions at the head of every step.
  int st = 0, phase = 0, mi = 0;
  for (int j = 0; j < steps; ++j) {
    const int m0 = m_lo + mi * BM;
    // K's and V's panel addresses, re-read every step: otherwise the compiler keeps the 24
    // descriptors of their k16 slices (S^T, dP^T, dQ) live across the loop and spills them (64
    // bytes, reloaded from local memory before the products every step).
    const kh_u32 k_step = kh_opaque_u32(k_rows), v_step = kh_opaque_u32(v_rows);
    const kh_u32 k_panel = kh_opaque_u32(sK + (D == 64 ? 0 : wg) * BN * 128);
    kh_mbar_wait(bars + 8 * st, phase);
    const kh_u32 sQ = sQ0 + st * 2 * TILE_Q, sO = sQ + TILE_Q, sDS = sS + (j & 1) * TILE_S;
    const float* s_lse = s_stats + st * 2 * BM;
    const float* s_delta = s_lse + BM;
    // The LSE of the thread's 16 query columns (kq * 16 + h * 8 + 2 (lane & 3), + 1) as 8 pairs,
    // in the log2 domain (raw, it is the natural log, -inf for a row that sees no key, whose P
    // must be 0, not exp2(+inf)); read before the products are issued: behind them, the reads
    // wait for the wgmma operand traffic in shared memory.
    const int c0 = 2 * (lane & 3);
    float l2[BM / 16][2][2];
#pragma unroll
    for (int kq = 0; kq < BM / 16; ++kq)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float2 l = *reinterpret_cast<const float2*>(s_lse + kq * 16 + h * 8 + c0);
        l2[kq][h][0] = l.x == KH_NEG_INF ? -KH_NEG_INF : l.x * 1.4426950408889634f;
        l2[kq][h][1] = l.y == KH_NEG_INF ? -KH_NEG_INF : l.y * 1.4426950408889634f;
      }

    // S^T = K Q^T and dP^T = V dO^T for this warpgroup's 64 keys and the step's BM queries, in
    // two commit groups: P^T is computed from S^T while the tensor cores still run dP^T.
    float s[BM / 2], dp[BM / 2];
    kh_wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const kh_u32 ka = (kh_u32)(kk >> 2) * BN * 128 + (kk & 3) * 32;
      const kh_u32 qa = (kh_u32)(kk >> 2) * BM * 128 + (kk & 3) * 32;
      kh_wgmma_ss<T, BM>(s, kh_wgmma_desc(k_step + ka, 16, 1024), kh_wgmma_desc(sQ + qa, 16, 1024),
                         kk > 0);
    }
    kh_wgmma_commit();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const kh_u32 ka = (kh_u32)(kk >> 2) * BN * 128 + (kk & 3) * 32;
      const kh_u32 qa = (kh_u32)(kk >> 2) * BM * 128 + (kk & 3) * 32;
      kh_wgmma_ss<T, BM>(dp, kh_wgmma_desc(v_step + ka, 16, 1024), kh_wgmma_desc(sO + qa, 16, 1024),
                         kk > 0);
    }
    kh_wgmma_commit();
    kh_wgmma_wait<1>();

    // P^T = exp2(S^T * scale - LSE), without a branch between its elements (per-element
    // branches, the mask's, kept ptxas from overlapping one element's work with the others');
    // masks only where the block crosses an edge, as selects.
    const bool full = m0 + BM <= len_q && n0 + BN <= len_k &&
                      (!f.causal || m0 + offset >= n0 + BN - 1) &&
                      (f.window_left < 0 || m0 + BM - 1 + offset - f.window_left <= n0);
#pragma unroll
    for (int kq = 0; kq < BM / 16; ++kq)
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          s[8 * kq + 2 * i + e] = kh_exp2(s[8 * kq + 2 * i + e] * sl2 - l2[kq][i >> 1][e]);
    if (!full) {
      const kh_attn_span qs[2] = {
          kh_attn_queries_of(kr0, len_q, len_k, offset, f.causal, f.window_left),
          kh_attn_queries_of(kr0 + 8, len_q, len_k, offset, f.causal, f.window_left)};
#pragma unroll
      for (int kq = 0; kq < BM / 16; ++kq)
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int qi = m0 + kq * 16 + (i >> 1) * 8 + c0 + e;
            const kh_attn_span& q = qs[i & 1];
            s[8 * kq + 2 * i + e] = qi >= q.lo && qi < q.hi ? s[8 * kq + 2 * i + e] : 0.f;
          }
    }
    // P^T straight into its 16-bit A fragments.
    kh_u32 pa[BM / 16][4], da[BM / 16][4];
#pragma unroll
    for (int kq = 0; kq < BM / 16; ++kq)
#pragma unroll
      for (int i = 0; i < 4; ++i) pa[kq][i] = kh_pack2<T>(s[8 * kq + 2 * i], s[8 * kq + 2 * i + 1]);
    // dV += P^T dO (k16 step kq: queries 16kq .. 16kq + 15, rows of dO), running while dS^T is
    // computed.
    kh_wgmma_fence();
#pragma unroll
    for (int kq = 0; kq < BM / 16; ++kq)
      kh_wgmma_rs_tb<T, D>(dv, pa[kq], kh_wgmma_desc(sO + kq * 16 * 128, BM * 128, 1024));
    kh_wgmma_commit();
    // delta of the same 16 columns, read while dP^T finishes.
    float2 dl[BM / 16][2];
#pragma unroll
    for (int kq = 0; kq < BM / 16; ++kq)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        dl[kq][h] = *reinterpret_cast<const float2*>(s_delta + kq * 16 + h * 8 + c0);
    kh_wgmma_wait<1>();  // dP^T is done (dV may still run)

    // dS^T = P^T (dP^T - delta), P^T taken back from its 16-bit copy (fp32 P^T is not kept: its
    // registers are what lets dV run meanwhile without spills); dK += dS^T Q.
#pragma unroll
    for (int kq = 0; kq < BM / 16; ++kq)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float p0, p1;
        kh_unpack2<T>(pa[kq][i], p0, p1);
        const float2 d = dl[kq][i >> 1];
        da[kq][i] =
            kh_pack2<T>(p0 * (dp[8 * kq + 2 * i] - d.x), p1 * (dp[8 * kq + 2 * i + 1] - d.y));
      }
    kh_wgmma_fence();
#pragma unroll
    for (int kq = 0; kq < BM / 16; ++kq)
      kh_wgmma_rs_tb<T, D>(dk, da[kq], kh_wgmma_desc(sQ + kq * 16 * 128, BM * 128, 1024));
    kh_wgmma_commit();

    // dS^T into shared memory (rows = keys, one 128-byte panel of BM queries): a[kq] holds rows
    // r, r + 8 and queries 16kq + 2c (.. + 1) and 16kq + 8 + 2c (.. + 1), c = lane & 3. Buffer
    // j & 1 was last read by step j - 2's dQ, which both consumers finished before step j - 1's
    // barrier.
#pragma unroll
    for (int kq = 0; kq < BM / 16; ++kq)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = wg * 64 + warp * 16 + (lane >> 2) + 8 * half;
#pragma unroll
        for (int tt = 0; tt < 2; ++tt) {
          const kh_u32 addr = sDS + r * 128 + (((2 * kq + tt) ^ (r & 7)) << 4) + (lane & 3) * 4;
          asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(da[kq][2 * tt + half]));
        }
      }
    kh_fence_proxy_async();
    kh_named_sync(1, 256);

    // dQ[:, 64 wg .. 64 wg + 63] = dS K: A = dS (queries x keys) read from dS^T transposed, B =
    // K's panel wg read MN-major; k16 step kk is keys 16kk .. 16kk + 15. Head_dim 64: one
    // warpgroup's columns are all of dQ (the other computes them too and drops them).
    float dq[32];
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk)
      kh_wgmma_ss_tt<T, 64>(dq, kh_wgmma_desc(sDS + kk * 16 * 128, BM * 128, 1024),
                            kh_wgmma_desc(k_panel + kk * 16 * 128, BN * 128, 1024), kk > 0);
    kh_wgmma_commit();
    kh_wgmma_wait<0>();
    kh_mbar_arrive(bars + 8 * (STAGES + st));  // every product reading the stage is done

    // dQ (scaled) -> the staging tile, once the producer has read step j - 1's.
    if (j >= 1) kh_mbar_wait(dq_empty, (j - 1) & 1);
    if (D != 64 || wg == 0) {
      // row & 7 is lane / 4 and m0 a multiple of 64: token q0 + m0 + row's swizzle is the lane's.
      const int dq_key = (q0 + (lane >> 2)) & 7;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int row = warp * 16 + (lane >> 2) + 8 * half;
#pragma unroll
        for (int t = 0; t < 8; ++t) {
          const int col = (D == 64 ? 0 : 64 * wg) + t * 8 + 2 * (lane & 3);
          asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(sDQ + dq_off(row, dq_key, col)),
                       "f"(dq[4 * t + 2 * half] * f.scale),
                       "f"(dq[4 * t + 2 * half + 1] * f.scale));
        }
      }
    }
    kh_fence_proxy_async();  // the stores, for the copy engine's reads
    kh_mbar_arrive(dq_full);
    if (++st == STAGES) {
      st = 0;
      phase ^= 1;
    }
    if (++mi == nm) mi = 0;
  }

  T* dkb = (T*)p.dk + (kh_i64)k0 * p.dk_row + (kh_i64)hk * p.dk_head;
  T* dvb = (T*)p.dv + (kh_i64)k0 * p.dv_row + (kh_i64)hk * p.dv_head;
  const int key0 = n0 + wg * 64;  // this warpgroup's first key
  // Through the Q/dO stages (dK's tile in stage 0's bytes, dV's after it), once both consumers
  // are past their last products (the other's dK of the last step may still read its stage). The
  // host takes only outputs on 16-byte boundaries with rows a multiple of 16 bytes apart
  // (host.cpp's cuda_layout_ok), as the whole-row stores need.
  kh_named_sync(1, 256);
  const float sk[2] = {f.scale, f.scale}, sv[2] = {1.f, 1.f};
  const kh_u32 stage = sQ0 + wg * 64 * 128;
  kh_wg_store_tile<T, D>(dk, sk, stage, BN * 128, 2 + wg, ct & 127, dkb + (kh_i64)key0 * p.dk_row,
                         p.dk_row, len_k - key0);
  kh_wg_store_tile<T, D>(dv, sv, stage + TILE_KV, BN * 128, 2 + wg, ct & 127,
                         dvb + (kh_i64)key0 * p.dv_row, p.dv_row, len_k - key0);
}

}  // namespace

#endif  // KH_ATTENTION_BACKWARD_SM90_CUH_
