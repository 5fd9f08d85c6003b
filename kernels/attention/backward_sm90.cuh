// Hopper backward (sm_90a): attention.cu's attn_bwd (FlashAttention-2's algorithm) with its five
// products on wgmma.
//
// Geometry: one CTA of two warpgroups per (block of BN = 128 keys, KV head, sequence); warpgroup
// w owns keys 64w .. 64w + 63 and accumulates their dK and dV in registers over every query head
// of the KV head's group and every query block of BM = 64 that sees them. K and V stay in shared
// memory; Q, dO and the block's LSE and delta are loaded one step ahead into two stages (every
// thread loads; 128-byte-swizzled panel tiles, wgmma.cuh). Per step:
//   S^T = K Q^T and dP^T = V dO^T (wgmma, both operands in shared memory),
//   P^T = exp2(S^T * scale - LSE), dS^T = P^T (dP^T - delta)        (registers),
//   dV += P^T dO, dK += dS^T Q (wgmma, A from registers, dO and Q read MN-major),
//   dS^T -> shared memory, then dQ = dS K split by columns between the warpgroups (wgmma, both
//   operands read MN-major), added to the fp32 dq_accum with vector reductions (red.v2).
#ifndef KH_ATTENTION_BACKWARD_SM90_CUH_
#define KH_ATTENTION_BACKWARD_SM90_CUH_

#include "wgmma.cuh"

namespace {

KH_DEV void kh_red_add2(float* addr, float a, float b) {
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(addr), "f"(a), "f"(b) : "memory");
}

template <typename T, int D>
__device__ __forceinline__ void attn_bwd_wg(const kh_attn_bwd_params& p) {
  constexpr int BN = kh_attn_bwd90_block_n(), BM = kh_attn_bwd90_block_m(), NT = 256;
  constexpr kh_u32 TILE_KV = BN * D * 2, TILE_Q = BM * D * 2;
  const kh_attn_params& f = p.f;
  extern __shared__ __align__(128) unsigned char smem[];
  const kh_u32 base = kh_smem_addr(smem);
  const kh_u32 sK = (base + 1023u) & ~1023u;
  const kh_u32 sV = sK + TILE_KV;
  const kh_u32 sQ0 = sV + TILE_KV;     // stage s: Q at sQ0 + 2 s TILE_Q, dO right after
  const kh_u32 sS = sQ0 + 4 * TILE_Q;  // dS^T: BN rows (keys) x BM (queries), one panel
  float* s_stats = (float*)(smem + (sS + BN * BM * 2 - base));  // [stage][lse | delta][BM]

  const int b = blockIdx.z, hk = blockIdx.y, n0 = blockIdx.x * BN;
  int q0, len_q, k0, len_k;
  kh_attn_seq(f, b, &q0, &len_q, &k0, &len_k);
  if (n0 >= len_k) return;
  const int offset = len_k - len_q;
  int m_lo, m_hi;
  kh_attn_query_range(f, n0, BN, BM, len_q, len_k, &m_lo, &m_hi);
  const int nm = m_hi > m_lo ? (m_hi - m_lo + BM - 1) / BM : 0;
  const int group = f.q_heads / f.kv_heads;
  const int steps = group * nm;

  const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
  const float sl2 = f.scale_log2;
  const T* kb = (const T*)f.k + (kh_i64)k0 * f.k_row + (kh_i64)hk * f.k_head;
  const T* vb = (const T*)f.v + (kh_i64)k0 * f.v_row + (kh_i64)hk * f.v_head;
  kh_load_panels<BN, D, NT>(sK, kb, f.k_row, n0, len_k, tid);
  kh_load_panels<BN, D, NT>(sV, vb, f.v_row, n0, len_k, tid);

  // Step j's loads: Q and dO of query block j % nm of head hk * group + j / nm (cp.async), and
  // its LSE (log2 units; +inf where a row contributes nothing) and delta (plain stores).
  auto load_step = [&](int j) {
    const int st = j & 1, hq = hk * group + j / nm, m0 = m_lo + (j % nm) * BM;
    const kh_u32 q_tile = sQ0 + st * 2 * TILE_Q;
    kh_load_panels<BM, D, NT>(q_tile, (const T*)f.q + (kh_i64)q0 * f.q_row + (kh_i64)hq * f.q_head,
                              f.q_row, m0, len_q, tid);
    kh_load_panels<BM, D, NT>(q_tile + TILE_Q,
                              (const T*)p.dout + (kh_i64)q0 * p.do_row + (kh_i64)hq * p.do_head,
                              p.do_row, m0, len_q, tid);
    if (tid < BM) {
      const int i = m0 + tid;
      const float l = i < len_q ? f.lse[(kh_i64)hq * f.lse_head + q0 + i] : KH_NEG_INF;
      s_stats[st * 2 * BM + tid] = l == KH_NEG_INF ? (-KH_NEG_INF) : l * 1.4426950408889634f;
      s_stats[st * 2 * BM + BM + tid] = i < len_q ? p.delta[(kh_i64)hq * p.tokens_q + q0 + i] : 0.f;
    }
  };
  if (steps > 0) load_step(0);
  kh_cp_async_commit();

  float dk[D / 2], dv[D / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) dk[i] = dv[i] = 0.f;
  const int kr0 = n0 + wg * 64 + warp * 16 + (lane >> 2);  // this thread's keys: kr0, kr0 + 8
  const kh_u32 k_rows = sK + wg * 64 * 128, v_rows = sV + wg * 64 * 128;

  for (int j = 0; j < steps; ++j) {
    const int st = j & 1, hq = hk * group + j / nm, m0 = m_lo + (j % nm) * BM;
    __syncthreads();  // step j - 1's readers of the other stage and of dS^T are done
    if (j + 1 < steps) load_step(j + 1);
    kh_cp_async_commit();
    kh_cp_async_wait<1>();
    kh_fence_proxy_async();
    __syncthreads();
    const kh_u32 sQ = sQ0 + st * 2 * TILE_Q, sO = sQ + TILE_Q;
    const float* s_lse = s_stats + st * 2 * BM;
    const float* s_delta = s_lse + BM;

    // S^T = K Q^T and dP^T = V dO^T for this warpgroup's 64 keys and the step's BM queries.
    float s[BM / 2], dp[BM / 2];
    kh_wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const kh_u32 ka = (kh_u32)(kk >> 2) * BN * 128 + (kk & 3) * 32;
      const kh_u32 qa = (kh_u32)(kk >> 2) * BM * 128 + (kk & 3) * 32;
      kh_wgmma_ss<T, BM>(s, kh_wgmma_desc(k_rows + ka, 16, 1024), kh_wgmma_desc(sQ + qa, 16, 1024),
                         kk > 0);
    }
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const kh_u32 ka = (kh_u32)(kk >> 2) * BN * 128 + (kk & 3) * 32;
      const kh_u32 qa = (kh_u32)(kk >> 2) * BM * 128 + (kk & 3) * 32;
      kh_wgmma_ss<T, BM>(dp, kh_wgmma_desc(v_rows + ka, 16, 1024), kh_wgmma_desc(sO + qa, 16, 1024),
                         kk > 0);
    }
    kh_wgmma_commit();
    kh_wgmma_wait<0>();

    // P^T and dS^T; masks only where the block crosses an edge.
    const bool full = m0 + BM <= len_q && n0 + BN <= len_k &&
                      (!f.causal || m0 + offset >= n0 + BN - 1) &&
                      (f.window_left < 0 || m0 + BM - 1 + offset - f.window_left <= n0);
    kh_u32 pa[BM / 16][4], da[BM / 16][4];
#pragma unroll
    for (int t = 0; t < BM / 8; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = t * 8 + 2 * (lane & 3) + (e & 1);
        float pe = kh_exp2(s[4 * t + e] * sl2 - s_lse[col]);
        if (!full) {
          const int qi = m0 + col, key = kr0 + (e >> 1) * 8;
          if (key >= len_k || qi >= len_q ||
              !kh_attn_visible(qi, key, offset, f.causal, f.window_left))
            pe = 0.f;
        }
        s[4 * t + e] = pe;
        dp[4 * t + e] = pe * (dp[4 * t + e] - s_delta[col]);
      }
#pragma unroll
    for (int kq = 0; kq < BM / 16; ++kq) {
      pa[kq][0] = kh_pack2<T>(s[8 * kq + 0], s[8 * kq + 1]);
      pa[kq][1] = kh_pack2<T>(s[8 * kq + 2], s[8 * kq + 3]);
      pa[kq][2] = kh_pack2<T>(s[8 * kq + 4], s[8 * kq + 5]);
      pa[kq][3] = kh_pack2<T>(s[8 * kq + 6], s[8 * kq + 7]);
      da[kq][0] = kh_pack2<T>(dp[8 * kq + 0], dp[8 * kq + 1]);
      da[kq][1] = kh_pack2<T>(dp[8 * kq + 2], dp[8 * kq + 3]);
      da[kq][2] = kh_pack2<T>(dp[8 * kq + 4], dp[8 * kq + 5]);
      da[kq][3] = kh_pack2<T>(dp[8 * kq + 6], dp[8 * kq + 7]);
    }
    // dV += P^T dO, dK += dS^T Q (k16 step kq: queries 16kq .. 16kq + 15, rows of dO and Q).
    kh_wgmma_fence();
#pragma unroll
    for (int kq = 0; kq < BM / 16; ++kq)
      kh_wgmma_rs_tb<T, D>(dv, pa[kq], kh_wgmma_desc(sO + kq * 16 * 128, BM * 128, 1024));
#pragma unroll
    for (int kq = 0; kq < BM / 16; ++kq)
      kh_wgmma_rs_tb<T, D>(dk, da[kq], kh_wgmma_desc(sQ + kq * 16 * 128, BM * 128, 1024));
    kh_wgmma_commit();

    // dS^T into shared memory (rows = keys, one 128-byte panel of BM queries): a[kq] holds rows
    // r, r + 8 and queries 16kq + 2c (.. + 1) and 16kq + 8 + 2c (.. + 1), c = lane & 3.
#pragma unroll
    for (int kq = 0; kq < BM / 16; ++kq)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r = wg * 64 + warp * 16 + (lane >> 2) + 8 * half;
#pragma unroll
        for (int tt = 0; tt < 2; ++tt) {
          const kh_u32 addr = sS + r * 128 + (((2 * kq + tt) ^ (r & 7)) << 4) + (lane & 3) * 4;
          asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(da[kq][2 * tt + half]));
        }
      }
    kh_fence_proxy_async();
    __syncthreads();

    // dQ[:, 64 wg .. 64 wg + 63] = dS K: A = dS (queries x keys) read from dS^T transposed, B =
    // K's panel wg read MN-major; k16 step kk is keys 16kk .. 16kk + 15.
    float dq[32];
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk)
      kh_wgmma_ss_tt<T, 64>(
          dq, kh_wgmma_desc(sS + kk * 16 * 128, BM * 128, 1024),
          kh_wgmma_desc(sK + (D == 64 ? 0 : wg) * BN * 128 + kk * 16 * 128, BN * 128, 1024),
          kk > 0);
    kh_wgmma_commit();
    kh_wgmma_wait<0>();
    if (D == 64 && wg == 1) continue;  // head_dim 64: one warpgroup's columns are all of dQ
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int qi = m0 + warp * 16 + (lane >> 2) + 8 * half;
      if (qi >= len_q) continue;
      float* acc = p.dq_accum + ((kh_i64)(q0 + qi) * f.q_heads + hq) * D + (D == 64 ? 0 : 64 * wg) +
                   2 * (lane & 3);
#pragma unroll
      for (int t = 0; t < 8; ++t)
        kh_red_add2(acc + t * 8, dq[4 * t + 2 * half] * f.scale,
                    dq[4 * t + 2 * half + 1] * f.scale);
    }
  }

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
          kh_pack2<T>(dk[4 * t + 2 * half] * f.scale, dk[4 * t + 2 * half + 1] * f.scale);
      *(kh_u32*)(dvb + (kh_i64)key * p.dv_row + d) =
          kh_pack2<T>(dv[4 * t + 2 * half], dv[4 * t + 2 * half + 1]);
    }
  }
}

}  // namespace

#endif  // KH_ATTENTION_BACKWARD_SM90_CUH_
