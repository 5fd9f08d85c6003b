// Hopper forward (sm_90a): the forward of attention.cu with its products on wgmma, warp
// specialized (FlashAttention-3's schedule), persistent.
//
// Geometry: one CTA of three warpgroups per multiprocessor, walking a static list of tiles (a
// query block of BM = 128 rows of one query head of one sequence): the units of
// kh_attn_fwd90_tile_of (attention_params.h), pairs of blocks whose causal work adds up the same,
// so the walk is balanced without a counter to reset between launches (the forward has no
// workspace), and the CTAs at work at any time span a few heads, whose K and V stay in L2.
// Warpgroup 0 is the producer: per tile it loads Q and K and V blocks of BN keys into STAGES
// shared-memory stages (128-byte-swizzled panel tiles, wgmma.cuh) with TMA (cp.async where a
// block runs past the sequence, or without tensor maps), and signals each stage's `full`
// mbarrier once it has landed (after a proxy fence: wgmma reads through the async proxy). It
// runs ahead into the next tile: its first K and V blocks land while the consumers finish and
// store a tile, its Q as soon as they have (`qfree` mbarrier: O leaves through Q's bytes).
// Warpgroups 1 and 2 are consumers of 64 query rows each: per key block j they issue
// O += P(j-1) V(j-1) and S = Q K(j)^T together (wgmma; P from registers, V read MN-major), then
// release stage j - 1 (`empty` mbarrier) and compute block j's online softmax in
// registers while the other consumer's products run: a pair of named barriers hands the tensor
// cores from one consumer to the other (ping-pong, continued from tile to tile), so softmax and
// matrix work overlap. setmaxnreg moves registers from the producer to the consumers. Masks,
// varlen, GQA and the LSE as in attention.cu's attn_fwd; O leaves through each consumer's own
// rows of the Q tile as whole rows (tile_store.cuh).
#ifndef KH_ATTENTION_FORWARD_SM90_CUH_
#define KH_ATTENTION_FORWARD_SM90_CUH_

#include "sm90_sync.cuh"
#include "tile_store.cuh"
#include "wgmma.cuh"

namespace {

// One tile of the persistent forward: query block m0 of head h of sequence b, its keys' blocks.
struct kh_attn_fwd_tile {
  int b, h, m0, q0, len_q, k0, len_k, n_lo, nblk;
};

// Tile `second` of unit u (kh_attn_fwd90_tile_of); false when it has no query rows (the middle
// pair of an odd nm has one block; varlen sequences shorter than the longest end early).
template <int BM, int BN>
__device__ __forceinline__ bool kh_attn_fwd_tile_at(const kh_attn_params& p, int nm, int u,
                                                    int second, kh_attn_fwd_tile& t) {
  kh_attn_fwd90_tile_t w;
  if (!kh_attn_fwd90_tile_of(nm, p.q_heads, u, second, &w)) return false;
  t.b = w.seq;
  t.h = w.head;
  kh_attn_seq(p, t.b, &t.q0, &t.len_q, &t.k0, &t.len_k);
  t.m0 = w.mblk * BM;
  if (t.m0 >= t.len_q) return false;
  int n_hi;
  kh_attn_key_range(p, t.m0, BM, BN, t.len_q, t.len_k, &t.n_lo, &n_hi);
  t.nblk = n_hi > t.n_lo ? (n_hi - t.n_lo + BN - 1) / BN : 0;
  return true;
}

template <typename T, int D>
__device__ __forceinline__ void attn_fwd_wg(const kh_attn_params& p) {
  constexpr int BM = kh_attn_fwd90_block_m(), BN = kh_attn_fwd90_block_n(D);
  constexpr int STAGES = kh_attn_fwd90_stages(D);
  constexpr kh_u32 TILE_Q = BM * D * 2, TILE_KV = BN * D * 2;
  extern __shared__ __align__(128) unsigned char smem[];
  // Swizzle atoms are 1024 bytes: the host adds 1024 bytes of slack for this rounding.
  const kh_u32 base = kh_smem_addr(smem);
  const kh_u32 sQ = (base + 1023u) & ~1023u;
  const kh_u32 sKV = sQ + TILE_Q;                  // stage s: K at sKV + 2 s TILE_KV, V right after
  const kh_u32 bars = sKV + 2 * STAGES * TILE_KV;  // full[STAGES], empty[STAGES], qfree
  const kh_u32 qfree = bars + 16 * STAGES;
  const int nm = kh_attn_fwd90_query_blocks(p);
  const int units = (int)kh_attn_fwd90_units(p);

  const int tid = threadIdx.x;
  if (tid < STAGES) {
    kh_mbar_init(bars + 8 * tid, 128);             // full: every producer thread arrives
    kh_mbar_init(bars + 8 * (STAGES + tid), 256);  // empty: every consumer thread arrives
  }
  if (tid == 0) kh_mbar_init(qfree, 256);  // the Q buffer's tile is stored
  kh_fence_mbar_init();
  __syncthreads();

  // Each role is one branch of this if/else: setmaxnreg needs it so. Both walk the same tiles;
  // `it` counts the tiles with key blocks (tile it's store completes qfree's phase it), `g0`
  // the key blocks before this tile (block j of the tile is in stage (g0 + j) % STAGES, its
  // phase (g0 + j) / STAGES). A tile whose rows see no key is the consumers' alone: they write
  // its zeros straight to global memory, outside the Q buffer and its phases (were they to
  // complete a phase the producer has no part in, they could run two phases ahead of its wait).
  if (tid < 128) {
    // Producer. 56 registers (the consumers 224: 128 x 56 + 256 x 224 fit the 64K): at 40 its
    // walk over the tiles spilled.
    kh_regs_dec<56>();
    if (p.tma && tid == 0) {
      kh_tma_prefetch_desc(&p.q_map);
      kh_tma_prefetch_desc(&p.k_map);
      kh_tma_prefetch_desc(&p.v_map);
    }
    int it = 0, g0 = 0;
    for (int u = blockIdx.x; u < units; u += gridDim.x)
      for (int second = 0; second < 2; ++second) {
        kh_attn_fwd_tile t;
        if (!kh_attn_fwd_tile_at<BM, BN>(p, nm, u, second, t) || t.nblk == 0) continue;
        // Q may be loaded once the previous tile is stored (the consumers stage O in its rows).
        // The consumers cannot complete a phase ahead of this wait (tile it needs this Q), so
        // the parity is never a lap behind.
        auto wait_q = [&] {
          if (it >= 1) kh_mbar_wait(qfree, (it - 1) & 1);
        };
        const int hk = t.h / (p.q_heads / p.kv_heads);
        const T* kb = (const T*)p.k + (kh_i64)t.k0 * p.k_row + (kh_i64)hk * p.k_head;
        const T* vb = (const T*)p.v + (kh_i64)t.k0 * p.v_row + (kh_i64)hk * p.v_head;
        if (p.tma) {
          // One thread issues each block's copies (K and V, and Q with block 0) and arms the
          // stage's `full` barrier with their bytes; the others arrive at once. A block that
          // runs past the sequence's keys is loaded with cp.async instead, which zero-fills: TMA
          // would read the next tokens of the tensor there, and V rows that are not finite would
          // turn P = 0 into NaN. Q needs no such care (rows past the sequence are never stored).
          for (int j = 0; j < t.nblk; ++j) {
            const int g = g0 + j, s = g % STAGES, n0 = t.n_lo + j * BN;
            if (g >= STAGES) kh_mbar_wait(bars + 8 * (STAGES + s), (g / STAGES - 1) & 1);
            const kh_u32 sK = sKV + s * 2 * TILE_KV;
            if (n0 + BN <= t.len_k) {
              // Block 0's K and V go out before the wait for the Q buffer: they land while the
              // consumers store the previous tile.
              if (tid == 0) {
                kh_mbar_arrive_tx(bars + 8 * s, 2 * TILE_KV + (j == 0 ? TILE_Q : 0));
                kh_tma_load4(sK, &p.k_map, 0, t.k0 + n0, 0, hk, bars + 8 * s);
                kh_tma_load4(sK + TILE_KV, &p.v_map, 0, t.k0 + n0, 0, hk, bars + 8 * s);
                if (j == 0) {
                  wait_q();
                  kh_tma_load4(sQ, &p.q_map, 0, t.q0 + t.m0, 0, t.h, bars + 8 * s);
                }
              } else {
                // Every producer thread passes each tile's wait: one that skipped it could later
                // wait on a parity two phases ahead and pass it at once.
                if (j == 0) wait_q();
                kh_mbar_arrive(bars + 8 * s);
              }
            } else {
              if (j == 0) {
                wait_q();
                kh_load_panels<BM, D, 128>(
                    sQ, (const T*)p.q + (kh_i64)t.q0 * p.q_row + (kh_i64)t.h * p.q_head, p.q_row,
                    t.m0, t.len_q, tid);
              }
              kh_load_panels<BN, D, 128>(sK, kb, p.k_row, n0, t.len_k, tid);
              kh_load_panels<BN, D, 128>(sK + TILE_KV, vb, p.v_row, n0, t.len_k, tid);
              kh_cp_async_commit();
              kh_cp_async_wait<0>();
              kh_fence_proxy_async();
              kh_mbar_arrive(bars + 8 * s);
            }
          }
        } else {
          wait_q();
          kh_load_panels<BM, D, 128>(
              sQ, (const T*)p.q + (kh_i64)t.q0 * p.q_row + (kh_i64)t.h * p.q_head, p.q_row, t.m0,
              t.len_q, tid);
          // Up to STAGES - 2 blocks stay in flight past the one signalled: block j's loads are
          // issued (once its stage is free), then block j - (STAGES - 2) is signalled when it
          // has landed. A stage is freed by the consumers only after they got the next block,
          // so with two stages the producer must signal each block before it waits for a free
          // stage. Every block of the tile is signalled before the next tile's.
          for (int j = 0; j < t.nblk; ++j) {
            const int g = g0 + j, s = g % STAGES;
            if (g >= STAGES) kh_mbar_wait(bars + 8 * (STAGES + s), (g / STAGES - 1) & 1);
            const kh_u32 sK = sKV + s * 2 * TILE_KV;
            kh_load_panels<BN, D, 128>(sK, kb, p.k_row, t.n_lo + j * BN, t.len_k, tid);
            kh_load_panels<BN, D, 128>(sK + TILE_KV, vb, p.v_row, t.n_lo + j * BN, t.len_k, tid);
            kh_cp_async_commit();
            if (j >= STAGES - 2) {
              kh_cp_async_wait<STAGES - 2>();
              kh_fence_proxy_async();
              kh_mbar_arrive(bars + 8 * ((g - (STAGES - 2)) % STAGES));
            }
          }
          kh_cp_async_commit();
          kh_cp_async_wait<0>();
          kh_fence_proxy_async();
          for (int j = max(0, t.nblk - (STAGES - 2)); j < t.nblk; ++j)
            kh_mbar_arrive(bars + 8 * ((g0 + j) % STAGES));
        }
        g0 += t.nblk;
        ++it;
      }
  } else {
    // Consumers.
    kh_regs_inc<224>();
    const int ct = tid - 128, wg = ct >> 7, warp = (ct >> 5) & 3, lane = tid & 31;
    const float sl2 = p.scale_log2;
    // Named barrier 1 + w: consumer w's turn on the tensor cores. Consumer 0 goes first; the
    // turns alternate across tiles (both consumers take nblk + 1 turns a tile with keys, none in
    // one without).
    if (wg == 1) kh_named_arrive(1, 256);
    int it = 0, g0 = 0;
    for (int u = blockIdx.x; u < units; u += gridDim.x)
      for (int second = 0; second < 2; ++second) {
        kh_attn_fwd_tile t;
        if (!kh_attn_fwd_tile_at<BM, BN>(p, nm, u, second, t)) continue;
        if (t.nblk == 0) {           // rows that see no key: zeros, and an LSE of -inf
          constexpr int CH = D / 8;  // 16-byte chunks a row
          const int row0 = t.m0 + wg * 64, wtid = ct & 127;
          T* ob = (T*)p.o + (kh_i64)t.q0 * p.o_row + (kh_i64)t.h * p.o_head;
          for (int i = wtid; i < 64 * CH; i += 128)
            if (row0 + i / CH < t.len_q)
              kh_st(ob + (kh_i64)(row0 + i / CH) * p.o_row + (i % CH) * 8, kh_u32x4{0, 0, 0, 0});
          if (p.lse && wtid < 64 && row0 + wtid < t.len_q)
            p.lse[(kh_i64)t.h * p.lse_head + t.q0 + row0 + wtid] = KH_NEG_INF;
          continue;
        }
        const int m0 = t.m0, len_q = t.len_q, len_k = t.len_k, n_lo = t.n_lo, nblk = t.nblk;
        const int offset = len_k - len_q;
        float o[D / 2];
#pragma unroll
        for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
        float row_max[2] = {KH_NEG_INF, KH_NEG_INF}, row_sum[2] = {0.f, 0.f};
        const int r0 = m0 + wg * 64 + warp * 16 + (lane >> 2);  // this thread's rows: r0, r0 + 8
        const kh_u32 q_rows = sQ + wg * 64 * 128;               // this warpgroup's rows, panel 0
        kh_u32 pa[BN / 16][4];  // P of the previous block, as wgmma A fragments

        // Block j: S = Q K(j)^T is issued before O += P(j-1) V(j-1) in the same turn, and block
        // j's softmax runs while P(j-1) V(j-1) is still on the tensor cores (FlashAttention-3's
        // intra-warpgroup overlap, on top of the ping-pong between the consumers): it leaves O
        // and P(j-1)'s fragments alone until the product is done, then rescales O and packs
        // P(j). The first and last blocks are peeled so that every wait in the loop is
        // unconditional (ptxas serializes the wgmma pipeline when it cannot tell which group a
        // wait covers).
        float alpha[2];
        auto stage = [&](int j) { return sKV + ((g0 + j) % STAGES) * 2 * TILE_KV; };
        auto issue_s = [&](float(&sacc)[BN / 2], int j) {
          const kh_u32 sK = stage(j);
#pragma unroll
          for (int kk = 0; kk < D / 16; ++kk) {
            const kh_u32 koff = (kh_u32)(kk >> 2) * BM * 128 + (kk & 3) * 32;
            const kh_u32 kkoff = (kh_u32)(kk >> 2) * BN * 128 + (kk & 3) * 32;
            kh_wgmma_ss<T, BN>(sacc, kh_wgmma_desc(q_rows + koff, 16, 1024),
                               kh_wgmma_desc(sK + kkoff, 16, 1024), kk > 0);
          }
          kh_wgmma_commit();
        };
        auto issue_pv = [&](int j) {  // O += P(j) V(j)
          const kh_u32 sV = stage(j) + TILE_KV;
#pragma unroll
          for (int kk = 0; kk < BN / 16; ++kk)
            kh_wgmma_rs_tb<T, D>(o, pa[kk], kh_wgmma_desc(sV + kk * 16 * 128, BN * 128, 1024));
          kh_wgmma_commit();
        };
        auto full = [&](int j) { return bars + 8 * ((g0 + j) % STAGES); };
        auto full_parity = [&](int j) { return ((g0 + j) / STAGES) & 1; };
        auto release = [&](int j) { kh_mbar_arrive(bars + 8 * (STAGES + (g0 + j) % STAGES)); };
        // Block j's scores -> unnormalized probabilities (in place), the row statistics and the
        // factor O must be rescaled by.
        auto softmax = [&](float(&sacc)[BN / 2], int j) {
          const int n0 = n_lo + j * BN;
          if (kh_attn_block_edge(p, m0, BM, n0, BN, len_q, len_k)) {
            // Selects, not a branch an element (which kept ptxas from interleaving elements).
            const kh_attn_span keys[2] = {
                kh_attn_keys_of(r0, len_k, offset, p.causal, p.window_left),
                kh_attn_keys_of(r0 + 8, len_k, offset, p.causal, p.window_left)};
#pragma unroll
            for (int tt = 0; tt < BN / 8; ++tt)
#pragma unroll
              for (int e = 0; e < 4; ++e) {
                const int col = n0 + tt * 8 + 2 * (lane & 3) + (e & 1);
                const kh_attn_span& k = keys[e >> 1];
                sacc[4 * tt + e] = col >= k.lo && col < k.hi ? sacc[4 * tt + e] : KH_NEG_INF;
              }
          }
#pragma unroll
          for (int i = 0; i < 2; ++i) {
            float mx = KH_NEG_INF;
#pragma unroll
            for (int tt = 0; tt < BN / 8; ++tt)
              mx = fmaxf(mx, fmaxf(sacc[4 * tt + 2 * i], sacc[4 * tt + 2 * i + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float m_new = fmaxf(row_max[i], mx * sl2);
            const float m_use = m_new == KH_NEG_INF ? 0.f : m_new;  // nothing visible yet
            alpha[i] = kh_exp2(row_max[i] - m_use);
            row_max[i] = m_new;
            float sum = 0.f;
#pragma unroll
            for (int tt = 0; tt < BN / 8; ++tt) {
              sacc[4 * tt + 2 * i] = kh_exp2(sacc[4 * tt + 2 * i] * sl2 - m_use);
              sacc[4 * tt + 2 * i + 1] = kh_exp2(sacc[4 * tt + 2 * i + 1] * sl2 - m_use);
              sum += sacc[4 * tt + 2 * i] + sacc[4 * tt + 2 * i + 1];
            }
            row_sum[i] = row_sum[i] * alpha[i] + sum;
          }
        };
        auto rescale_and_pack = [&](const float(&sacc)[BN / 2]) {
#pragma unroll
          for (int tt = 0; tt < D / 8; ++tt)
#pragma unroll
            for (int e = 0; e < 4; ++e) o[4 * tt + e] *= alpha[e >> 1];
#pragma unroll
          for (int kk = 0; kk < BN / 16; ++kk) {
            pa[kk][0] = kh_pack2<T>(sacc[8 * kk + 0], sacc[8 * kk + 1]);
            pa[kk][1] = kh_pack2<T>(sacc[8 * kk + 2], sacc[8 * kk + 3]);
            pa[kk][2] = kh_pack2<T>(sacc[8 * kk + 4], sacc[8 * kk + 5]);
            pa[kk][3] = kh_pack2<T>(sacc[8 * kk + 6], sacc[8 * kk + 7]);
          }
        };

        {
          float sacc[BN / 2];
          kh_mbar_wait(full(0), full_parity(0));
          kh_named_sync(1 + wg, 256);
          kh_wgmma_fence();
          issue_s(sacc, 0);
          kh_named_arrive(2 - wg, 256);
          kh_wgmma_wait<0>();
          softmax(sacc, 0);
          rescale_and_pack(sacc);
        }
        for (int j = 1; j < nblk; ++j) {
          float sacc[BN / 2];
          kh_mbar_wait(full(j), full_parity(j));
          kh_named_sync(1 + wg, 256);
          kh_wgmma_fence();
          issue_s(sacc, j);
          issue_pv(j - 1);
          kh_named_arrive(2 - wg, 256);  // the other consumer's turn
          kh_wgmma_wait<1>();            // S(j) is done; P(j-1) V(j-1) may still run
          softmax(sacc, j);
          kh_wgmma_wait<0>();
          release(j - 1);  // stage j - 1 is free
          rescale_and_pack(sacc);
        }
        kh_named_sync(1 + wg, 256);
        kh_wgmma_fence();
        issue_pv(nblk - 1);
        kh_named_arrive(2 - wg, 256);
        kh_wgmma_wait<0>();
        release(nblk - 1);

        T* ob = (T*)p.o + (kh_i64)t.q0 * p.o_row + (kh_i64)t.h * p.o_head;
        float inv[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          float sum = row_sum[i];
          sum += __shfl_xor_sync(0xffffffffu, sum, 1);
          sum += __shfl_xor_sync(0xffffffffu, sum, 2);
          inv[i] = sum > 0.f ? 1.f / sum : 0.f;
          const int row = r0 + 8 * i;
          if (p.lse && (lane & 3) == 0 && row < len_q)
            p.lse[(kh_i64)t.h * p.lse_head + t.q0 + row] =
                sum > 0.f ? row_max[i] * 0.6931471805599453f + logf(sum) : KH_NEG_INF;
        }
        // Through the warpgroup's own rows of the Q buffer (its products are done); the host
        // takes only an output on a 16-byte boundary with rows a multiple of 16 bytes apart
        // (cuda_layout_ok). Then the buffer goes back to the producer for the next tile's Q,
        // whose loads (async proxy) must come after these generic-proxy accesses.
        const int row0 = m0 + wg * 64;  // this warpgroup's first row
        kh_wg_store_tile<T, D>(o, inv, q_rows, BM * 128, 3 + wg, ct & 127,
                               ob + (kh_i64)row0 * p.o_row, p.o_row, len_q - row0);
        kh_fence_proxy_async();
        kh_mbar_arrive(qfree);
        g0 += nblk;
        ++it;
      }
    if (wg == 0) kh_named_sync(1, 256);  // consumer 1's last hand-over
  }
}

}  // namespace

#endif  // KH_ATTENTION_FORWARD_SM90_CUH_
