// Decode on tensor cores (sm_80+, head_dim 64 and 128): attention.cu's attn_decode with its dot
// products on mma.sync. The (query head, query token) rows one KV head serves (the GQA group,
// up to 16 per CTA, padded with rows that see nothing) are the M dimension of m16n8k16, so K and
// V are read once per KV head and each 16-token chunk costs 32 tensor-core instructions per warp
// instead of 16 * D multiply-adds per row on the CUDA cores.
//
// One CTA of NW warps per (context split, KV head x group of 16 rows, sequence). Q (16 x D) is
// loaded once into shared memory; each warp walks its own 16-token chunks of the split (warp w
// takes chunks w, w + NW, ...), loading each chunk's K and V rows from their pages with cp.async
// into its own ring of ST shared-memory stages (the next ST - 1 chunks in flight while one is
// computed), and keeps its own online softmax; the warps' states are merged through shared
// memory at the end and written like attn_decode's (the output, or a split's partial state for
// attn_decode_combine). NW = 4, ST = 2 (3 CTAs per SM) measured best on an H200 at batch 64,
// 16/8 heads, 1920 tokens: 3.95-4.0 TB/s, 88% of a plain 16-byte read; deeper rings (fewer CTAs
// per SM), 2 or 3 warps, 8 warps, a head-major page layout, unmasked full chunks, skipping the
// rescale when no maximum grew and persistent CTAs walking several units each were all as fast
// or slower (tools/bench/RESULTS.md). The merge is a fixed cost of every CTA: it writes only the
// real rows, conflict-free, which took a decode step from 5.01 to 4.90 ms.
//
// With nw.n > 0 (paged_attention_decode_append) the last tokens come from the step's own K and
// V, and the CTA that reads one also writes it into its page, so the append costs no launch of
// its own.
#ifndef KH_ATTENTION_DECODE_TC_CUH_
#define KH_ATTENTION_DECODE_TC_CUH_

namespace {

// The new tokens of a fused append (kh_decode_params.nw.n > 0) for one (sequence, KV head):
// token t >= t_new is row t - t_new of k / v, not yet in the cache; `write`: this CTA stores it
// there too (one CTA per KV head does). No append: t_new is past every token.
template <typename T>
struct kh_new_rows {
  const T* k;
  const T* v;
  kh_i64 k_row, v_row;
  int t_new;
  bool write;
  // Whether the 16-row chunk at tok0 holds a new token.
  KH_DEV bool in_chunk(int tok0) const { return tok0 + 16 > t_new; }
};

template <typename T>
KH_DEV kh_new_rows<T> kh_decode_new_rows(const kh_decode_params& p, int b, int hk, int len,
                                         bool write) {
  kh_new_rows<T> n{nullptr, nullptr, p.nw.k_row, p.nw.v_row, 0x7FFFFFFF, false};
  if (p.nw.n <= 0) return n;
  n.k = (const T*)p.nw.k + (kh_i64)b * p.nw.n * p.nw.k_row + (kh_i64)hk * p.nw.k_head;
  n.v = (const T*)p.nw.v + (kh_i64)b * p.nw.n * p.nw.v_row + (kh_i64)hk * p.nw.v_head;
  n.t_new = len - p.nw.n;
  n.write = write;
  return n;
}

// Rows `tok0 ..` of a 16-row tile from the paged cache (token t of sequence b, KV head hk; rows
// at or past t_hi zero-filled; with NEW, new rows from `nw`): one warp, CH 16-byte chunks per
// row, swizzled as kh_load_tile. `page` >= 0: the 16 rows lie in that page (the caller looked it
// up), so no row needs the block table or a division by the page size; -1: each row looks its
// page up.
template <int D, typename T, bool NEW>
KH_DEV void kh_load_paged_rows(kh_u32 k_tile, kh_u32 v_tile, const kh_paged_kv& kv,
                               const kh_new_rows<T>& nw, int b, int hk, int tok0, int t_hi,
                               int lane, int page) {
  constexpr int CH = D / 8;
  kh_i64 k_base = 0, v_base = 0;
  if (page >= 0) {
    const kh_i64 row0 = tok0 % kv.page_size;
    k_base = page * kv.k_page + row0 * kv.k_row + (kh_i64)hk * kv.k_head;
    v_base = page * kv.v_page + row0 * kv.v_row + (kh_i64)hk * kv.v_head;
  }
#pragma unroll
  for (int j = 0; j < 16 * CH / 32; ++j) {
    const int i = lane + j * 32, r = i / CH, c = i % CH;
    const int t = tok0 + r;
    const bool valid = t < t_hi;
    kh_i64 ko = 0, vo = 0;
    if (valid) {
      if (page >= 0) {
        ko = k_base + r * kv.k_row;
        vo = v_base + r * kv.v_row;
      } else {
        kh_paged_offsets(kv, b, t, hk, &ko, &vo);
      }
    }
    const T* ks = (const T*)kv.k + ko + c * 8;
    const T* vs = (const T*)kv.v + vo + c * 8;
    if (NEW && valid && t >= nw.t_new) {  // a new token: from nw (kh_store_new_rows writes it)
      ks = nw.k + (kh_i64)(t - nw.t_new) * nw.k_row + c * 8;
      vs = nw.v + (kh_i64)(t - nw.t_new) * nw.v_row + c * 8;
    }
    kh_cp_async16(k_tile + kh_swz<CH>(r, c), ks, valid);
    kh_cp_async16(v_tile + kh_swz<CH>(r, c), vs, valid);
  }
}

// Where a 16-token chunk starts in the paged cache: its page (-1: each row looks its page up) and
// the page's row it starts at.
struct kh_chunk_page {
  int page, row0;
};

// The 16 rows of a chunk that lie in one page and hold no new token (every chunk of a sequence
// but its last, where pages hold whole chunks): k and v point at the chunk's first row of KV head
// hk. Each lane keeps one column chunk and walks rows 32 / CH apart from one pointer a tensor:
// no division, page lookup or branch per row. In the decode's SASS the general loader took about
// 40 instructions a row (64-bit offsets, its per-row page test) of the ~690 a chunk cost a warp,
// whose instruction issue, not DRAM, bounds the kernel (ncu: 2.9 warps a scheduler, 0.63
// eligible). Rows at or past `rows` are zero-filled (their source: the chunk's first row).
template <int D, typename T, bool FULL>
KH_DEV void kh_load_page_chunk(kh_u32 k_tile, kh_u32 v_tile, const T* k, const T* v, kh_i64 k_row,
                               kh_i64 v_row, int rows, int lane) {
  constexpr int CH = D / 8, RS = 32 / CH;  // 16-byte chunks a row; rows one warp step covers
  const int r0 = lane / CH, c = lane % CH;
  const T* ks = k + r0 * k_row + c * 8;
  const T* vs = v + r0 * v_row + c * 8;
#pragma unroll
  for (int j = 0; j < 16 / RS; ++j) {
    const int r = r0 + j * RS;
    const bool valid = FULL || r < rows;
    kh_cp_async16(k_tile + kh_swz<CH>(r, c), FULL || valid ? ks : k, valid);
    kh_cp_async16(v_tile + kh_swz<CH>(r, c), FULL || valid ? vs : v, valid);
    ks += RS * k_row;
    vs += RS * v_row;
  }
}

// A chunk's rows: NEW is a template argument so that the chunks without a new token (all but a
// sequence's last) run a loader without it (the per-row test in every chunk cost 3 us a layer);
// those in one page (at.page >= 0) the one above, whole chunks without a row test.
template <int D, typename T>
KH_DEV void kh_load_chunk(kh_u32 k_tile, kh_u32 v_tile, const kh_paged_kv& kv,
                          const kh_new_rows<T>& nw, int b, int hk, int tok0, int t_hi, int lane,
                          kh_chunk_page at) {
  if (nw.in_chunk(tok0)) {
    kh_load_paged_rows<D, T, true>(k_tile, v_tile, kv, nw, b, hk, tok0, t_hi, lane, at.page);
  } else if (at.page >= 0) {
    // A row offset inside a page fits 32 bits (kh_decode_tc_page_span_max); the page's does not.
    const T* k =
        (const T*)kv.k + (kh_i64)hk * kv.k_head + at.page * kv.k_page + at.row0 * (int)kv.k_row;
    const T* v =
        (const T*)kv.v + (kh_i64)hk * kv.v_head + at.page * kv.v_page + at.row0 * (int)kv.v_row;
    if (tok0 + 16 <= t_hi)
      kh_load_page_chunk<D, T, true>(k_tile, v_tile, k, v, kv.k_row, kv.v_row, 16, lane);
    else
      kh_load_page_chunk<D, T, false>(k_tile, v_tile, k, v, kv.k_row, kv.v_row, t_hi - tok0, lane);
  } else {
    kh_load_paged_rows<D, T, false>(k_tile, v_tile, kv, nw, b, hk, tok0, t_hi, lane, -1);
  }
}

// 16 bytes of shared memory at `addr` (16-byte aligned).
KH_DEV kh_u32x4 kh_ld_shared16(kh_u32 addr) {
  kh_u32x4 x;
  asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(x.x), "=r"(x.y), "=r"(x.z), "=r"(x.w)
               : "r"(addr));
  return x;
}

// The new tokens of the 16-row chunk at tok0 (rows below t_hi), now in this warp's K and V
// tiles, into their cache rows: the lanes' 16-byte pieces from shared memory to global stores,
// which nothing waits for (the chunk's loads had read them from nw, not the cache).
template <int D, typename T>
KH_DEV void kh_store_new_rows(kh_u32 k_tile, kh_u32 v_tile, const kh_paged_kv& kv,
                              const kh_new_rows<T>& nw, int b, int hk, int tok0, int t_hi,
                              int lane) {
  constexpr int CH = D / 8;
  for (int i = lane; i < 16 * CH; i += 32) {
    const int r = i / CH, c = i % CH, t = tok0 + r;
    if (t < nw.t_new || t >= t_hi) continue;
    kh_i64 ko, vo;
    kh_paged_offsets(kv, b, t, hk, &ko, &vo);
    kh_st((T*)kv.k + ko + c * 8, kh_ld_shared16(k_tile + kh_swz<CH>(r, c)));
    kh_st((T*)kv.v + vo + c * 8, kh_ld_shared16(v_tile + kh_swz<CH>(r, c)));
  }
}

// Two floats into shared memory at `addr` (8-byte aligned), one 8-byte store.
KH_DEV void kh_st_shared_f32x2(kh_u32 addr, float a, float b) {
  asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(a), "f"(b) : "memory");
}

template <typename T, int D>
__device__ __forceinline__ void attn_decode_tc(const kh_decode_params& p) {
  constexpr int NW = kh_decode_tc_warps(), ST = kh_decode_tc_stages(), CH = D / 8;
  constexpr kh_u32 TILE = 16 * D * 2;
  extern __shared__ __align__(128) unsigned char smem[];
  const kh_u32 sQ = kh_smem_addr(smem);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const kh_u32 sW = sQ + TILE + warp * ST * 2 * TILE;  // this warp's stages: K, V, K, V, ...

  const int split = blockIdx.x, b = blockIdx.z;
  const int G = p.q_heads / p.kv_heads, rows_total = G * p.q_tokens;
  const int groups = (rows_total + 15) / 16;
  const int hk = blockIdx.y / groups, rg = blockIdx.y % groups;
  const int len = p.kv.seq_lens[b];
  const int t_lo = split * p.split_tokens;
  const int t_hi = min(len, t_lo + p.split_tokens);
  const int nchunks = t_hi > t_lo ? (t_hi - t_lo + 15) / 16 : 0;
  const kh_new_rows<T> nw = kh_decode_new_rows<T>(p, b, hk, len, rg == 0);

  // Q rows (zeros for padding rows), one 16-byte chunk per thread per step.
  for (int i = threadIdx.x; i < 16 * CH; i += NW * 32) {
    const int r = i / CH, c = i % CH, gr = rg * 16 + r;
    const bool valid = gr < rows_total;
    const T* src = (const T*)p.q;
    if (valid)
      src += (kh_i64)(b * p.q_tokens + gr / G) * p.q_row + (kh_i64)(hk * G + gr % G) * p.q_head +
             c * 8;
    kh_cp_async16(sQ + kh_swz<CH>(r, c), src, valid);
  }
  kh_cp_async_commit();
  // Where pages hold whole 16-token chunks (page_size a multiple of 16, the split starting on
  // one), a chunk's page is looked up once, one chunk ahead of its loads, so the block table's
  // latency hides behind a chunk's work instead of preceding every load.
  const bool whole_chunks = p.kv.page_size % 16 == 0 && t_lo % 16 == 0;
  // The warp's chunks in order (warp, warp + NW, ...), their pages found by walking 16 NW tokens
  // at a time from the first one's (one division a warp: the division a chunk, and the block
  // table's 64-bit row offset, had cost about 50 instructions of each chunk's ~440).
  const int ps = p.kv.page_size;
  int walk_page = 0, walk_row = 0;  // where the warp's next chunk starts
  if (whole_chunks) {
    walk_page = (t_lo + warp * 16) / ps;
    walk_row = t_lo + warp * 16 - walk_page * ps;
  }
  auto next_chunk_page = [&](int chunk) -> kh_chunk_page {  // chunk: the warp's next one
    if (!whole_chunks) return {-1, 0};
    kh_chunk_page at{-1, 0};
    if (chunk < nchunks)
      at = {p.kv.block_table[(kh_i64)b * p.kv.table_stride + walk_page], walk_row};
    for (walk_row += 16 * NW; walk_row >= ps; walk_row -= ps) ++walk_page;
    return at;
  };
  // The first ST - 1 chunks of this warp, one commit group each (empty past the split's end).
#pragma unroll
  for (int i = 0; i < ST - 1; ++i) {
    const int c = warp + i * NW;
    const kh_chunk_page at = next_chunk_page(c);
    if (c < nchunks)
      kh_load_chunk<D, T>(sW + i * 2 * TILE, sW + i * 2 * TILE + TILE, p.kv, nw, b, hk,
                          t_lo + c * 16, t_hi, lane, at);
    kh_cp_async_commit();
  }
  kh_chunk_page next_page = next_chunk_page(warp + (ST - 1) * NW);
  kh_cp_async_wait<ST - 1>();
  __syncthreads();  // Q, loaded by every thread, is in shared memory (warps part ways below)

  // This thread's rows (r0 and r0 + 8 of the 16) and their query positions (-1: padding).
  int pos[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int gr = rg * 16 + (lane >> 2) + 8 * i;
    pos[i] = gr < rows_total ? len - p.q_tokens + gr / G : -1;
  }
  float o[D / 8][4];
#pragma unroll
  for (int t = 0; t < D / 8; ++t) o[t][0] = o[t][1] = o[t][2] = o[t][3] = 0.f;
  float row_max[2] = {KH_NEG_INF, KH_NEG_INF}, row_sum[2] = {0.f, 0.f};
  const kh_u32 a_row = sQ + (lane & 15) * CH * 16, a_x = ((lane >> 4) ^ (lane & 7)) << 4;
  const kh_u32 k_off = ((lane & 7) + ((lane >> 4) << 3)) * CH * 16;
  const kh_u32 k_x = (((lane >> 3) & 1) ^ (lane & 7)) << 4;
  const kh_u32 v_off = ((lane & 7) + (((lane >> 3) & 1) << 3)) * CH * 16;
  const kh_u32 v_x = ((lane >> 4) ^ (lane & 7)) << 4;
  const float sl2 = p.scale_log2;

  int stage = 0;
  for (int c = warp; c < nchunks; c += NW, stage = stage + 1 == ST ? 0 : stage + 1) {
    // The chunk ST - 1 ahead goes into the stage computed last iteration (free: see the
    // __syncwarp at the end of the loop).
    const int ahead = c + (ST - 1) * NW;
    const int load_stage = stage == 0 ? ST - 1 : stage - 1;
    if (ahead < nchunks)
      kh_load_chunk<D, T>(sW + load_stage * 2 * TILE, sW + load_stage * 2 * TILE + TILE, p.kv, nw,
                          b, hk, t_lo + ahead * 16, t_hi, lane, next_page);
    kh_cp_async_commit();
    next_page = next_chunk_page(ahead + NW);
    kh_cp_async_wait<ST - 1>();
    __syncwarp();  // this warp's chunk, loaded by its lanes, is in shared memory
    const kh_u32 sK = sW + stage * 2 * TILE, sV = sK + TILE;
    if (nw.write && nw.in_chunk(t_lo + c * 16))
      kh_store_new_rows<D, T>(sK, sV, p.kv, nw, b, hk, t_lo + c * 16, t_hi, lane);

    float s[2][4];
#pragma unroll
    for (int t = 0; t < 2; ++t) s[t][0] = s[t][1] = s[t][2] = s[t][3] = 0.f;
    kh_mma_tile_abt<T, D / 16, 1>(s, a_row, a_x, sK + k_off, k_x, 16 * CH * 16);
    const int t0 = t_lo + c * 16;
#pragma unroll
    for (int t = 0; t < 2; ++t)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int tok = t0 + t * 8 + 2 * (lane & 3) + (e & 1), ps = pos[e >> 1];
        const bool vis =
            tok < t_hi && tok <= ps && (p.window_left < 0 || tok >= ps - p.window_left);
        s[t][e] = vis ? s[t][e] * sl2 : KH_NEG_INF;
      }
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      float mx = fmaxf(fmaxf(s[0][2 * i], s[0][2 * i + 1]), fmaxf(s[1][2 * i], s[1][2 * i + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(row_max[i], mx);
      const float m_use = m_new == KH_NEG_INF ? 0.f : m_new;
      const float alpha = kh_exp2(row_max[i] - m_use);
      row_max[i] = m_new;
      row_sum[i] *= alpha;
#pragma unroll
      for (int t = 0; t < D / 8; ++t) {
        o[t][2 * i] *= alpha;
        o[t][2 * i + 1] *= alpha;
      }
#pragma unroll
      for (int t = 0; t < 2; ++t) {
        s[t][2 * i] = kh_exp2(s[t][2 * i] - m_use);
        s[t][2 * i + 1] = kh_exp2(s[t][2 * i + 1] - m_use);
        row_sum[i] += s[t][2 * i] + s[t][2 * i + 1];
      }
    }
    kh_mma_acc_b<T, 1, D / 16>(o, s, sV + v_off, v_x, 16 * CH * 16);
    __syncwarp();  // this warp is done with the stage before it loads into it again
  }
  kh_cp_async_wait<0>();

  // Merge the warps' states: (max, sum) per row and the unnormalised output, via shared memory
  // that the stages used (every warp is past its loop).
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    row_sum[i] += __shfl_xor_sync(0xffffffffu, row_sum[i], 1);
    row_sum[i] += __shfl_xor_sync(0xffffffffu, row_sum[i], 2);
  }
  __syncthreads();
  // Rows of OS = D + 8 floats: each half-warp's 8-byte stores of (row r, columns c, c + 1) then
  // fall in 16 different bank pairs (unpadded, the 8 rows of a store hit one bank: 8-way
  // conflicts that made the merge about 2 us of every CTA's life).
  constexpr int OS = D + 8;
  float* s_o = reinterpret_cast<float*>(smem + TILE);  // [NW][16][OS]
  float* s_m = s_o + NW * 16 * OS;                     // [NW][16]
  float* s_l = s_m + NW * 16;
  static_assert(TILE + (NW * 16 * OS + 2 * NW * 16) * 4 <= (1 + 2 * NW * ST) * TILE,
                "the merge fits in the stages");
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int r = (lane >> 2) + 8 * i;
    if (rg * 16 + r >= rows_total) continue;  // a padding row: never read back
    if ((lane & 3) == 0) {
      s_m[warp * 16 + r] = row_max[i];
      s_l[warp * 16 + r] = row_sum[i];
    }
    const kh_u32 row = sQ + TILE + ((warp * 16 + r) * OS + 2 * (lane & 3)) * 4;
#pragma unroll
    for (int t = 0; t < D / 8; ++t) kh_st_shared_f32x2(row + t * 32, o[t][2 * i], o[t][2 * i + 1]);
  }
  __syncthreads();
  for (int i = threadIdx.x; i < 16 * D; i += NW * 32) {
    const int r = i / D, d = i % D, gr = rg * 16 + r;
    if (gr >= rows_total) continue;
    float M = KH_NEG_INF;
#pragma unroll
    for (int w = 0; w < NW; ++w) M = fmaxf(M, s_m[w * 16 + r]);
    const float M_use = M == KH_NEG_INF ? 0.f : M;
    float L = 0.f, O = 0.f;
#pragma unroll
    for (int w = 0; w < NW; ++w) {
      const float wt = kh_exp2(s_m[w * 16 + r] - M_use);
      L += s_l[w * 16 + r] * wt;
      O += s_o[(w * 16 + r) * OS + d] * wt;
    }
    kh_decode_store<T, D>(p, (kh_i64)b * p.q_tokens + gr / G, hk * G + gr % G, split, d, M, L, O);
  }
}

}  // namespace

#endif  // KH_ATTENTION_DECODE_TC_CUH_
