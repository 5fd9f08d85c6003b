// The GPU-resident runtime's GEMM for a few rows (skinny_gemm.h): y[M, N] = x[M, K] . W[N, K]^T
// (+ bias[N]) in bfloat16 with fp32 accumulation, for M <= 64: a decode step's projections and LM
// head, which read a weight matrix once for a handful of tokens and so are bound by how fast the
// weights stream in, not by arithmetic. Compiled at run time through the device API like
// device_kernels.cu; the build inlines the prelude, mma.cuh, pdl.cuh, wgmma.cuh and cluster.cuh.
//
// A CTA owns BN = 32 * NT output columns (W rows) and all M rows, for its share of K (blockIdx.y
// of gridDim.y splits). Four warps each own 8 * NT columns; the x and W tiles of 64 k-values
// stream through STAGES shared-memory stages (cp.async, swizzled), fragments come by ldmatrix
// and the products by mma.sync m16n8k16.
//
// Launched with programmatic dependent launch: the weights (which no earlier kernel of the step
// writes) of the first stages are requested before griddepcontrol.wait, so their latency hides
// under the previous kernel's tail; x, the workspace and y only after it.
//
// Split K (gridDim.y > 1): every split adds its fp32 tile into the tile's [64, BN] slab of
// `acc` with vector reductions; the split that arrives last (a counter per tile) adds the bias,
// writes y in bf16 and leaves the slab at zero and the counter at 0 for the next call, so the
// workspace needs zeroing once, when it is allocated.
//
// On Hopper (sm_90a) the kh_skinny_wgmma_* kernels do the same with wgmma: one warpgroup a CTA
// multiplies the x tile (64 rows, the wgmma M) by BN = 64 or 128 W rows (the wgmma N) straight
// from the swizzled stages, so x is read from shared memory once per stage by the tensor cores
// instead of once per warp by ldmatrix. Their splits of K form one thread block cluster
// (gridDim.y <= 8) and are summed through distributed shared memory: no workspace, no counters.
//
// Their epilogues fold the decode step's small layers into them (skinny_gemm.h):
// SiluAndMul, Qwen3's q/k norms + RoPE, and the residual add + RMSNorm between two projections,
// split in two: the o and down projections add into the residual stream and leave its rows'
// sums of squares a tile (kEpiResidual), and the next GEMM multiplies that raw residual by
// weights with the norm's weight folded in and scales each row of its sums by the row's rstd
// (PRENORM): RMSNorm(h) . W^T = rstd * (h . (W diag(w))^T).
#include "kh_prelude.cuh"
#include "mma.cuh"
#include "pdl.cuh"
#include "skinny_epilogue.h"

#if !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define KH_SKINNY_WGMMA 1
#include "cluster.cuh"
#include "greedy_argmax.cuh"
#include "wgmma.cuh"
#endif

#define KH_GLOBAL extern "C" __global__

namespace {

constexpr int kBM = 64;           // rows of x a CTA covers (M <= kBM)
constexpr int kBK = 64;           // k-values per stage
constexpr int kThreads = 128;     // four warps
constexpr int kChunks = kBK / 8;  // 16-byte chunks per tile row

KH_DEV void red_add2(float* p, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(p), "f"(a), "f"(b) : "memory");
#else
  atomicAdd(p, a);
  atomicAdd(p + 1, b);
#endif
}

// Four floats from L2 (the slab's reductions happen there; this CTA never cached it in L1).
KH_DEV void load4_cg(const float* p, float (&v)[4]) {
  asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v[0]), "=f"(v[1]), "=f"(v[2]), "=f"(v[3])
               : "l"(p));
}

KH_DEV float bias_at(const kh_bf16* bias, int n) {
  return bias ? kh_to_float(bias[n]) : 0.f;
}

// A thread's share of [ROWS, 64 k] tiles of a row-major bf16 matrix that differ only in their k
// offset (the stages of one output tile), in kh_load_tile's layout and chunk order: thread t
// loads 16-byte chunk t % 8 of rows t / 8 + 16 j, so its shared-memory offsets are one constant
// plus 2048 j bytes (the swizzle's row term, row & 7, is the same for every j) and its sources
// one pointer plus j strides of 16 rows. kh_load_tile recomputes each chunk's 64-bit row product
// and its validity select every stage: about 12 instructions a chunk of a stage, against 3 here
// (a stage of the LM head's 128 x 64 weights took 116 instructions a thread for 8 chunks; four
// warps an SM issue every one of them on the critical path). Rows at or past `rows` read as zero.
template <int ROWS>
struct TileRows {
  static_assert(ROWS % 16 == 0, "16 rows a pass of 128 threads");
  const kh_bf16* row;  // this thread's first row and chunk, at k offset 0
  const kh_bf16* src;  // the tile's row 0 (a readable address for the zero-filled chunks)
  long long step;      // 16 rows, in elements
  kh_u32 smem;         // this thread's first chunk in a tile
  int passes;          // passes j with row t / 8 + 16 j inside the matrix
  KH_DEV TileRows(const kh_bf16* src_, long long stride, int rows, int tid) {
    const int r0 = tid / kChunks, c = tid % kChunks;
    src = src_;
    row = src_ + r0 * stride + c * 8;
    step = 16 * stride;
    smem = kh_swz<kChunks>(r0, c);
    passes = rows > r0 ? (rows - r0 + 15) / 16 : 0;
  }
  // The tile at k offset `k` (elements) into the shared-memory tile at `tile`.
  KH_DEV void load(kh_u32 tile, int k) const {
    const kh_bf16* g = row + k;
    if (passes >= ROWS / 16) {  // every row inside (all but a matrix's last tile): no selects
#pragma unroll
      for (int j = 0; j < ROWS / 16; ++j, g += step)
        kh_cp_async16(tile + smem + j * 16 * kChunks * 16, g, true);
      return;
    }
#pragma unroll
    for (int j = 0; j < ROWS / 16; ++j, g += step) {
      const bool valid = j < passes;
      kh_cp_async16(tile + smem + j * 16 * kChunks * 16, valid ? g : src, valid);
    }
  }
};

// This CTA's share of K's 64-value chunks: [c0, c0 + nc) of split blockIdx.y of gridDim.y.
struct KShare {
  int c0, nc;
};
KH_DEV KShare k_share(int K) {
  const int chunks = K / kBK, split = blockIdx.y, splits = gridDim.y;
  const int c0 = (int)((long long)chunks * split / splits);
  return {c0, (int)((long long)chunks * (split + 1) / splits) - c0};
}

// The first STAGES - 1 stages: their weights (which no earlier kernel of the step writes)
// requested before griddepcontrol.wait, so their latency hides under the previous kernel's tail,
// x after it; one commit group per stage (stage 0's also holds the weights).
template <int STAGES, typename LoadW, typename LoadX>
KH_DEV void load_first_stages(int nc, LoadW&& load_w, LoadX&& load_x) {
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s)
    if (s < nc) load_w(s, s);
  kh_pdl_wait();
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < nc) load_x(s, s);
    kh_cp_async_commit();
  }
}

template <int NT, int STAGES>
KH_DEV void skinny_gemm(const kh_bf16* __restrict__ x, long long ldx, const kh_bf16* __restrict__ w,
                        const kh_bf16* __restrict__ bias, kh_bf16* __restrict__ y, long long ldy,
                        int M, int N, int K, float* __restrict__ acc_ws,
                        int* __restrict__ counters) {
  constexpr int BN = 4 * 8 * NT;
  constexpr kh_u32 kATile = kBM * kBK * 2, kBTile = BN * kBK * 2;
  // Dynamic shared memory only: a static variable beside it would push a 48 KiB plan past the
  // default limit that the loader opts out of only above 48 KiB of dynamic memory.
  extern __shared__ __align__(128) unsigned char smem[];
  const kh_u32 a_base = kh_smem_addr(smem), b_base = a_base + STAGES * kATile;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int tile = blockIdx.x, splits = gridDim.y;
  const int n0 = tile * BN;
  const KShare share = k_share(K);
  const int c0 = share.c0, nc = share.nc;
  const kh_bf16* wt = w + (long long)n0 * K + (long long)c0 * kBK;
  const kh_bf16* xt = x + (long long)c0 * kBK;
  const int m_tiles = (M + 15) / 16;
  auto load_w = [&](int s, int c) {
    kh_load_tile<BN, kBK, kThreads>(b_base + s * kBTile, wt + c * kBK, K, 0, N - n0, tid);
  };
  auto load_x = [&](int s, int c) {
    kh_load_tile<kBM, kBK, kThreads>(a_base + s * kATile, xt + c * kBK, ldx, 0, M, tid);
  };
  load_first_stages<STAGES>(nc, load_w, load_x);

  float acc[4][NT][4];
#pragma unroll
  for (int mt = 0; mt < 4; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[mt][nt][i] = 0.f;

  for (int c = 0; c < nc; ++c) {
    kh_cp_async_wait<STAGES - 2>();
    __syncthreads();  // stage c landed for every thread; every warp is done with stage c - 1
    const int next = c + STAGES - 1;
    if (next < nc) {
      load_w(next % STAGES, next);
      load_x(next % STAGES, next);
    }
    kh_cp_async_commit();
    const int slot = c % STAGES;
    const kh_u32 a_tile = a_base + slot * kATile, b_tile = b_base + slot * kBTile;
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) {
      // W rows [warp * 8 * NT, +8 * NT) of the tile: b[2 nt] and b[2 nt + 1] are n-tile nt's
      // k 0-7 and 8-15.
      kh_u32 b[2 * NT];
      if constexpr (NT == 2) {
        const int mi = lane >> 3;
        kh_u32 r[4];
        kh_ldsm_x4(
            b_tile + kh_swz<kChunks>(warp * 16 + (mi >> 1) * 8 + (lane & 7), kk * 2 + (mi & 1)), r);
        b[0] = r[0];
        b[1] = r[1];
        b[2] = r[2];
        b[3] = r[3];
      } else {
        kh_u32 r[2];
        kh_ldsm_x2(b_tile + kh_swz<kChunks>(warp * 8 + (lane & 7), kk * 2 + ((lane >> 3) & 1)), r);
        b[0] = r[0];
        b[1] = r[1];
      }
#pragma unroll
      for (int mt = 0; mt < 4; ++mt) {
        if (mt >= m_tiles) break;  // rows past M: zeros, skipped
        kh_u32 a[4];
        kh_ldsm_x4(a_tile + kh_swz<kChunks>(mt * 16 + (lane & 15), kk * 2 + (lane >> 4)), a);
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
          kh_mma16816<kh_bf16>(acc[mt][nt], a, b[2 * nt], b[2 * nt + 1]);
      }
    }
  }
  kh_cp_async_wait<0>();
  // The next kernel may start its own weight loads now; its wait still covers this grid.
  kh_pdl_launch_dependents();

  // acc[mt][nt]: rows mt * 16 + lane / 4 (+ 8 for [2], [3]), columns n-tile nt's (lane % 4) * 2
  // and + 1 of this warp's; each pair once, with its row and tile column, for rows below M.
  const int col = warp * 8 * NT + (lane & 3) * 2;
  auto for_each_pair = [&](auto&& f) {
#pragma unroll
    for (int mt = 0; mt < 4; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int m = mt * 16 + (lane >> 2) + half * 8;
          if (m < M) f(m, col + nt * 8, acc[mt][nt][2 * half], acc[mt][nt][2 * half + 1]);
        }
  };
  if (splits == 1) {
    for_each_pair([&](int m, int nl, float v0, float v1) {
      const int n = n0 + nl;
      if (n < N)
        *reinterpret_cast<kh_u32*>(y + (long long)m * ldy + n) =
            kh_pack2<kh_bf16>(v0 + bias_at(bias, n), v1 + bias_at(bias, n + 1));
    });
    return;
  }
  float* slab = acc_ws + (long long)tile * kBM * BN;
  for_each_pair([&](int m, int nl, float v0, float v1) { red_add2(slab + m * BN + nl, v0, v1); });
  __threadfence();  // this thread's reductions before the counter (the CUDA guide's pattern)
  __syncthreads();  // every warp is past its last ldmatrix: the stages' memory is free
  int* last_split = reinterpret_cast<int*>(smem);
  if (tid == 0) *last_split = atomicAdd(counters + tile, 1) == splits - 1;
  __syncthreads();
  if (!*last_split) return;
  __threadfence();
  for (int i = tid; i < M * (BN / 4); i += kThreads) {
    const int m = i / (BN / 4), nl = (i % (BN / 4)) * 4, n = n0 + nl;
    float* p = slab + m * BN + nl;
    float v[4];
    load4_cg(p, v);
    p[0] = p[1] = p[2] = p[3] = 0.f;
    if (n >= N) continue;
    kh_u32* out = reinterpret_cast<kh_u32*>(y + (long long)m * ldy + n);
    out[0] = kh_pack2<kh_bf16>(v[0] + bias_at(bias, n), v[1] + bias_at(bias, n + 1));
    out[1] = kh_pack2<kh_bf16>(v[2] + bias_at(bias, n + 2), v[3] + bias_at(bias, n + 3));
  }
  if (tid == 0) counters[tile] = 0;
}

#if defined(KH_SKINNY_WGMMA)

// silu(g) * u of the fp32 sums (kh_silu of kernels/activation/act_math.h: the same formula).
KH_DEV float silu_mul(float g, float u) {
  return g / (1.0f + expf(-g)) * u;
}

// The epilogues (skinny_gemm.h's SkinnyEpilogue, in its order).
constexpr int kEpiNone = 0, kEpiSilu = 1, kEpiQkNormRope = 2, kEpiResidual = 3;

// kEpiQkNormRope's operands, and kEpiResidual's and the folded norm's, filled by
// skinny_gemm.cpp.
typedef KhSkinnyQkNormRope QkNormRope;
typedef KhSkinnyNorm NormFold;

// The folded norm's row factors (PRENORM), in the 64 floats after the stages: rstd[m] =
// rsqrt(sum of the ss_tiles partials / K + eps), the partials summed in tile order (two threads a
// row, then their two sums: deterministic). After griddepcontrol.wait (the producer's partials).
KH_DEV void prenorm_rstd(const NormFold& nf, int M, int K, float* rstd) {
  const int r = threadIdx.x >> 1, half = threadIdx.x & 1;
  float s = 0.f;
  if (r < M) {
    // Eight loads in flight, then their sums in order: one L2 round trip a batch, not a partial.
    int t = half;
    for (; t + 14 < nf.ss_tiles; t += 16) {
      float v[8];
#pragma unroll
      for (int j = 0; j < 8; ++j) v[j] = nf.ss[(t + 2 * j) * kBM + r];
#pragma unroll
      for (int j = 0; j < 8; ++j) s += v[j];
    }
    for (; t < nf.ss_tiles; t += 2) s += nf.ss[t * kBM + r];
  }
  s += __shfl_xor_sync(0xFFFFFFFFu, s, 1);
  if (half == 0) rstd[r] = r < M ? rsqrtf(s * (1.0f / (float)K) + nf.eps) : 0.f;
}

// kEpiResidual: the residual pair h (bf16x2, loaded before) plus bf16(v0, v1), rounded to bf16
// as the residual add of FusedAddRMSNorm does; `ss` gains the pair's squares (as rounded), the
// row's share of its norm.
KH_DEV kh_u32 residual_add2(kh_u32 h, float v0, float v1, float& ss) {
  float h0, h1, a, b;
  kh_unpack2<kh_bf16>(h, h0, h1);
  const kh_u32 sum =
      kh_pack2<kh_bf16>(h0 + kh_round_to<kh_bf16>(v0), h1 + kh_round_to<kh_bf16>(v1));
  kh_unpack2<kh_bf16>(sum, a, b);
  ss += a * a + b * b;
  return sum;
}

// One row of a 128-wide query or key head, 4 columns a lane of one warp (lane l: columns 4 l ..
// 4 l + 3), in place: what QKNormRotaryEmbedding (kernels/rotary) does to the bf16 row the plain
// GEMM would have written. The sums round to bf16 first, then y = bf16(x * rsqrt(mean(x^2) +
// eps) * w), then pair (j, j + 64) rotates: o1 = x1 cos - x2 sin, o2 = x2 cos + x1 sin
// (kernels/rotary/rope_math.h), unless the position is outside the table.
KH_DEV void qk_norm_rope_row(float (&v)[4], const kh_bf16* wn, int nl, long long pos,
                             const QkNormRope& e) {
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    v[j] = kh_round_to<kh_bf16>(v[j]);
    ss += v[j] * v[j];
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) ss += __shfl_xor_sync(0xFFFFFFFFu, ss, off);
  const float rstd = rsqrtf(ss * (1.f / 128.f) + e.eps);
  float partner[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    v[j] = kh_round_to<kh_bf16>(v[j] * rstd * kh_to_float(wn[nl + j]));
    partner[j] = __shfl_xor_sync(0xFFFFFFFFu, v[j], 16);  // column nl + j -/+ 64
  }
  if (pos < 0 || pos >= e.max_pos) return;
  const float* cr = e.cos + pos * e.rot_stride + (nl & 63);
  const float* sr = e.sin + pos * e.rot_stride + (nl & 63);
#pragma unroll
  for (int j = 0; j < 4; ++j)
    v[j] = nl < 64 ? v[j] * cr[j] - partner[j] * sr[j] : v[j] * cr[j] + partner[j] * sr[j];
}

// EPI kEpiSilu: the gate/up projection with SiluAndMul as its epilogue. W is [2 N, K], the
// gate's N rows then the up's; a tile's BN W rows are BN / 2 gate rows and the up rows of the
// same columns, so each output column's gate and up sums meet in one thread and y [M, N] =
// silu(x . W_gate^T) * (x . W_up^T) is written once, from fp32 (no bias: none of the family's
// MLPs has one).
// EPI kEpiQkNormRope (BN = 128 = head_dim): the q/k/v projection of Qwen3 with the q/k norms and
// RoPE as its epilogue; tile t is head t of [q heads | k heads | v heads]. Every split count,
// one too, sums through shared memory, where a warp holds a whole row of the tile.
// EPI kEpiResidual: y is the residual stream; it adds the bf16 output into y in place and writes
// the rows' sums of squares over the tile's columns to nf.ss (NormFold).
// PRENORM: x is the residual stream of a kEpiResidual kernel before it and w has the norm's weight
// folded in (w[n, k] * weight[k]); the sums' rows are scaled by their rstd (from nf's partials)
// before the epilogue: nothing is added to the main loop.
template <int BN, int STAGES, int EPI, bool PRENORM>
KH_DEV void skinny_wgmma(const kh_bf16* __restrict__ x, long long ldx,
                         const kh_bf16* __restrict__ w, const kh_bf16* __restrict__ bias,
                         kh_bf16* __restrict__ y, long long ldy, int M, int N, int K,
                         const QkNormRope& e, const NormFold& nf) {
  constexpr bool SILU = EPI == kEpiSilu, RES = EPI == kEpiResidual;
  static_assert(EPI != kEpiQkNormRope || BN == 128, "a tile is one 128-wide head");
  constexpr kh_u32 kXTile = kBM * kBK * 2, kStage = kXTile + BN * kBK * 2;
  constexpr int kCols = SILU ? BN / 2 : BN;  // output columns a tile writes
  // The swizzle's 1024-byte atoms (a name of its own: the mma.sync kernels declare 128).
  extern __shared__ __align__(1024) unsigned char wg_smem[];
  const kh_u32 base = kh_smem_addr(wg_smem);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int tile = blockIdx.x, splits = gridDim.y;
  const int n0 = tile * kCols;
  const KShare share = k_share(K);
  const int c0 = share.c0, nc = share.nc;
  const kh_bf16* wt = w + (long long)n0 * K + (long long)c0 * kBK;
  const kh_bf16* xt = x + (long long)c0 * kBK;
  // Stage s: the x tile [64 rows, 64 k], then the W tile [BN rows, 64 k] (one panel each; SILU:
  // the gate rows in its first half, the up rows in its second, 8-row swizzle atoms apart).
  const TileRows<SILU ? BN / 2 : BN> w_rows(wt, K, N - n0, tid);
  const TileRows<BN / 2> up_rows(wt + (long long)N * K, K, N - n0, tid);  // SILU only
  const TileRows<kBM> x_rows(xt, ldx, M, tid);
  auto load_w = [&](int s, int c) {
    const kh_u32 dst = base + s * kStage + kXTile;
    w_rows.load(dst, c * kBK);
    if constexpr (SILU) up_rows.load(dst + BN / 2 * kBK * 2, c * kBK);
  };
  auto load_x = [&](int s, int c) { x_rows.load(base + s * kStage, c * kBK); };
  load_first_stages<STAGES>(nc, load_w, load_x);
  // PRENORM: the rows' rstd while the first stages load (the loop's first barrier shows them).
  float* rstd = reinterpret_cast<float*>(wg_smem + STAGES * kStage);
  if constexpr (PRENORM) prenorm_rstd(nf, M, K, rstd);

  float acc[BN / 2];  // y[m, n0 + n]: the wgmma accumulator of the 64 x BN tile
#pragma unroll
  for (int i = 0; i < BN / 2; ++i) acc[i] = 0.f;
  for (int c = 0; c < nc; ++c) {
    kh_cp_async_wait<STAGES - 2>();
    kh_fence_proxy_async();  // this thread's cp.async writes, visible to wgmma's reads
    __syncthreads();         // ... every thread's; and every wgmma of stage c - 1 is done
    const int next = c + STAGES - 1;
    if (next < nc) {
      load_w(next % STAGES, next);
      load_x(next % STAGES, next);
    }
    kh_cp_async_commit();
    const kh_u32 xs = base + (c % STAGES) * kStage, ws = xs + kXTile;
    kh_wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk)
      kh_wgmma_ss<kh_bf16, BN>(acc, kh_wgmma_desc(xs + kk * 32, 16, 1024),
                               kh_wgmma_desc(ws + kk * 32, 16, 1024), 1);
    kh_wgmma_commit();
    kh_wgmma_wait<0>();  // the stage is rewritten after the next barrier
  }
  kh_cp_async_wait<0>();
  kh_pdl_launch_dependents();

  // acc[4 i + 2 h + j]: row warp * 16 + lane / 4 + 8 h, column 8 i + (lane % 4) * 2 + j (SILU:
  // the gate of output column 8 i + .. for i < BN / 16, its up BN / 2 columns on).
  const int row = warp * 16 + (lane >> 2), col = (lane & 3) * 2;
  if constexpr (PRENORM) {  // x was the raw residual: each row's rstd (the loop's barriers show it)
#pragma unroll
    for (int i = 0; i < BN / 8; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float f = rstd[row + 8 * h];
        acc[4 * i + 2 * h] *= f;
        acc[4 * i + 2 * h + 1] *= f;
      }
  }
  if (SILU && splits == 1) {
#pragma unroll
    for (int i = 0; i < BN / 16; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int m = row + 8 * h, n = n0 + 8 * i + col, g = 4 * i + 2 * h, u = g + BN / 4;
        if (m < M && n < N)
          *reinterpret_cast<kh_u32*>(y + (long long)m * ldy + n) =
              kh_pack2<kh_bf16>(silu_mul(acc[g], acc[u]), silu_mul(acc[g + 1], acc[u + 1]));
      }
    return;
  }
  if (EPI == kEpiNone && splits == 1) {
#pragma unroll
    for (int i = 0; i < BN / 8; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int m = row + 8 * h, n = n0 + 8 * i + col;
        if (m < M && n < N)
          *reinterpret_cast<kh_u32*>(y + (long long)m * ldy + n) = kh_pack2<kh_bf16>(
              acc[4 * i + 2 * h] + bias_at(bias, n), acc[4 * i + 2 * h + 1] + bias_at(bias, n + 1));
      }
    return;
  }
  if (RES && splits == 1) {
    // Every residual pair loaded first (one round trip, not one a pair). A row's columns are the
    // four lanes of a quad: their sums of squares meet by two shuffles.
    kh_u32 hv[BN / 8][2];
#pragma unroll
    for (int i = 0; i < BN / 8; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int m = row + 8 * h, n = n0 + 8 * i + col;
        hv[i][h] =
            m < M && n < N ? *reinterpret_cast<const kh_u32*>(y + (long long)m * ldy + n) : 0u;
      }
    float ss[2] = {0.f, 0.f};
#pragma unroll
    for (int i = 0; i < BN / 8; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int m = row + 8 * h, n = n0 + 8 * i + col;
        if (m < M && n < N)
          *reinterpret_cast<kh_u32*>(y + (long long)m * ldy + n) =
              residual_add2(hv[i][h], acc[4 * i + 2 * h] + bias_at(bias, n),
                            acc[4 * i + 2 * h + 1] + bias_at(bias, n + 1), ss[h]);
      }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      ss[h] += __shfl_xor_sync(0xFFFFFFFFu, ss[h], 1);
      ss[h] += __shfl_xor_sync(0xFFFFFFFFu, ss[h], 2);
      if ((lane & 3) == 0 && row + 8 * h < M) nf.ss[tile * kBM + row + 8 * h] = ss[h];
    }
    return;
  }
  // Split K: each CTA of the cluster leaves its fp32 tile in its shared memory (rows padded to
  // BN + 8 floats: a warp's 8-byte stores then fall in distinct banks), and CTA r sums rows
  // [M r / splits, M (r + 1) / splits) of all of them in rank order (deterministic).
  constexpr int kPitch = BN + 8;
  __syncthreads();  // every warp's wgmma reads are done: the stages' memory is free
  float* part = reinterpret_cast<float*>(wg_smem);
#pragma unroll
  for (int i = 0; i < BN / 8; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h)
      *reinterpret_cast<float2*>(part + (row + 8 * h) * kPitch + 8 * i + col) =
          make_float2(acc[4 * i + 2 * h], acc[4 * i + 2 * h + 1]);
  // The splits must be one cluster (the host launches them so): else each CTA would sum only
  // its own partial tile.
  if (kh_cluster_size() != (kh_u32)splits) __trap();
  const int rank = (int)kh_cluster_rank();
  const int m_lo = M * rank / splits, m_hi = M * (rank + 1) / splits;
  constexpr int kLanesPerRow = kCols / 4;  // 16 or 32: a half or whole warp a row
  const int items = (m_hi - m_lo) * kLanesPerRow;
  // RES: this thread's residual quads, requested before the cluster barrier hides their latency
  // (at most kBM * kLanesPerRow / kThreads of them, with one split).
  constexpr int kMaxTurns = RES ? kBM * kLanesPerRow / kThreads : 1;
  uint2 hq[kMaxTurns];
  if constexpr (RES) {
#pragma unroll
    for (int t = 0; t < kMaxTurns; ++t) {
      const int i = t * kThreads + tid;
      const int m = m_lo + i / kLanesPerRow, n = n0 + (i % kLanesPerRow) * 4;
      hq[t] = i < items && n < N ? *reinterpret_cast<const uint2*>(y + (long long)m * ldy + n)
                                 : make_uint2(0u, 0u);
    }
  }
  kh_cluster_sync();
  // Item i: row m_lo + i / kLanesPerRow, columns nl .. nl + 3; `hin`: RES's residual quad.
  auto item = [&](int i, uint2 hin) {
    const int m = m_lo + i / kLanesPerRow, nl = (i % kLanesPerRow) * 4, n = n0 + nl;
    float ss = 0.f;  // RES: this lane's share of row m's sum of squares
    if (i < items) {
      const kh_u32 local = base + (kh_u32)(m * kPitch + nl) * 4u;
      float sum[4] = {0.f, 0.f, 0.f, 0.f}, up[4] = {0.f, 0.f, 0.f, 0.f};
      for (int r = 0; r < splits; ++r) {
        float v[4];
        kh_ld_cluster_f32x4(kh_cluster_map(local, (kh_u32)r), v);
#pragma unroll
        for (int j = 0; j < 4; ++j) sum[j] += v[j];
        if constexpr (SILU) {
          kh_ld_cluster_f32x4(kh_cluster_map(local + kCols * 4u, (kh_u32)r), v);
#pragma unroll
          for (int j = 0; j < 4; ++j) up[j] += v[j];
        }
      }
      const kh_bf16* b = bias;  // still to add
      if constexpr (EPI == kEpiQkNormRope) {
        // A warp's lanes hold one row's 128 columns (32 per row): the row's shuffles are whole.
        if (tile < e.q_heads + e.k_heads) {  // a query or key head (one per tile)
#pragma unroll
          for (int j = 0; j < 4; ++j) sum[j] += bias_at(b, n + j);
          b = nullptr;
          qk_norm_rope_row(sum, static_cast<const kh_bf16*>(tile < e.q_heads ? e.qw : e.kw), nl,
                           e.positions[m], e);
        }
      }
      if (n < N) {  // N is a multiple of 8: n < N covers n + 3
        kh_u32* out = reinterpret_cast<kh_u32*>(y + (long long)m * ldy + n);
        if constexpr (SILU) {
          out[0] = kh_pack2<kh_bf16>(silu_mul(sum[0], up[0]), silu_mul(sum[1], up[1]));
          out[1] = kh_pack2<kh_bf16>(silu_mul(sum[2], up[2]), silu_mul(sum[3], up[3]));
        } else if constexpr (RES) {
          out[0] = residual_add2(hin.x, sum[0] + bias_at(b, n), sum[1] + bias_at(b, n + 1), ss);
          out[1] = residual_add2(hin.y, sum[2] + bias_at(b, n + 2), sum[3] + bias_at(b, n + 3), ss);
        } else {
          out[0] = kh_pack2<kh_bf16>(sum[0] + bias_at(b, n), sum[1] + bias_at(b, n + 1));
          out[1] = kh_pack2<kh_bf16>(sum[2] + bias_at(b, n + 2), sum[3] + bias_at(b, n + 3));
        }
      }
    }
    if constexpr (RES) {  // whole warps take every turn: lanes past `items` add nothing
#pragma unroll
      for (int off = kLanesPerRow / 2; off > 0; off >>= 1)
        ss += __shfl_xor_sync(0xFFFFFFFFu, ss, off);
      if (i < items && i % kLanesPerRow == 0) nf.ss[tile * kBM + m] = ss;
    }
  };
  if constexpr (RES) {
#pragma unroll
    for (int t = 0; t < kMaxTurns; ++t)
      if (t * kThreads < items) item(t * kThreads + tid, hq[t]);  // uniform over the CTA
  } else {
    for (int i = tid; i < items; i += kThreads) item(i, make_uint2(0u, 0u));
  }
  __syncwarp();       // the .aligned barrier below: every lane of the warp together
  kh_cluster_sync();  // no CTA leaves while another still reads its shared memory
}

// The LM head of a greedy decode step with the argmax as its epilogue: y [M, N] = x . W^T in bf16
// (the logits, as the plain kernels write them) and each row's first index of its largest bf16
// logit, which ends the step as kh_argmax_advance does (KhSkinnyGreedy). Persistent, one CTA an
// SM (its shared memory): the CTA keeps all of x [64 rows, K] in shared memory and walks output
// tiles blockIdx.x, + gridDim.x, ... of BN = 128 columns, the W tiles [128, 64 k] streaming
// through STAGES stages without a break between tiles. Only weight bytes stream: the tiled
// kernels reload x for every tile, as many bytes as the weights at 64 rows. Each thread keeps its
// two rows' best (value, index) across its tiles; at the end the CTA's rows meet in scratch by
// atomicMax of argmax_key, and the last CTA to finish writes every row's token and advances.
// NORM: x is the raw residual stream and the final RMSNorm is applied to it in shared memory,
// bf16(x * rstd * norm_w) as the norm package writes it, rstd from the residual epilogue's sums
// of squares (nf), so the step launches no norm kernel before its LM head.
template <int STAGES, bool NORM>
KH_DEV void skinny_head_argmax(const kh_bf16* __restrict__ x, const kh_bf16* __restrict__ w,
                               kh_bf16* __restrict__ y, int M, int N, int K, const NormFold& nf,
                               const KhSkinnyGreedy& g) {
  constexpr int BN = 128;
  constexpr kh_u32 kXTile = kBM * kBK * 2, kWTile = BN * kBK * 2;
  extern __shared__ __align__(1024) unsigned char wg_smem[];
  const kh_u32 base = kh_smem_addr(wg_smem);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int nc = K / kBK;  // x tiles, and W stages a tile
  const int tiles = (N + BN - 1) / BN;
  const int mine = (tiles - (int)blockIdx.x + (int)gridDim.x - 1) / (int)gridDim.x;
  const int total = mine * nc;  // the W stages this CTA streams
  const kh_u32 x_tiles = base, w_stages = base + nc * kXTile;
  float* rstd = reinterpret_cast<float*>(wg_smem + nc * kXTile + STAGES * kWTile);
  int* last_cta = reinterpret_cast<int*>(rstd + kBM);
  // Stage s of the walk: chunk s % nc of tile blockIdx.x + (s / nc) * gridDim.x, in slot
  // s % STAGES. Loads and the main loop each walk the stages in order, so each keeps its own
  // (chunk, slot, tile) counters instead of dividing by nc every stage.
  const int tile_step = (int)gridDim.x * BN;
  int load_c = 0, load_slot = 0, load_n0 = (int)blockIdx.x * BN;
  TileRows<BN> w_rows(w + (long long)load_n0 * K, K, N - load_n0, tid);
  auto load_next_w = [&]() {
    w_rows.load(w_stages + load_slot * kWTile, load_c * kBK);
    load_slot = load_slot + 1 == STAGES ? 0 : load_slot + 1;
    if (++load_c == nc) {
      load_c = 0;
      load_n0 += tile_step;
      w_rows = TileRows<BN>(w + (long long)load_n0 * K, K, N - load_n0, tid);
    }
  };
  // The first stages' weights before griddepcontrol.wait, x after it: all of it in the first
  // commit group, the other STAGES - 2 groups empty (the loop waits for STAGES - 2 pending).
  for (int s = 0; s < STAGES - 1; ++s)
    if (s < total) load_next_w();
  kh_pdl_wait();
  for (int c = 0; c < nc; ++c)
    kh_load_tile<kBM, kBK, kThreads>(x_tiles + c * kXTile, x + c * kBK, K, 0, M, tid);
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) kh_cp_async_commit();
  if constexpr (NORM) {
    prenorm_rstd(nf, M, K, rstd);
    kh_cp_async_wait<STAGES - 2>();  // x has landed
    __syncthreads();                 // ... for every thread; and rstd is written
    // Thread t takes 16-byte chunks t, t + 128, ... of a row (8 k-values) down every row.
    const kh_bf16* nw = static_cast<const kh_bf16*>(g.norm_w);
    for (int ck = tid; ck < K / 8; ck += kThreads) {
      float wf[8];
      kh_unpack<kh_bf16, 8>(kh_load_raw<kh_bf16, 8, KH_LOAD_PLAIN>(nw + ck * 8), wf);
      const kh_u32 tile_chunk = x_tiles + (ck / kChunks) * kXTile;
      for (int r = 0; r < M; ++r) {
        const kh_u32 a = tile_chunk + kh_swz<kChunks>(r, ck % kChunks);
        kh_u32 v[4];
        asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                     : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
                     : "r"(a));
        const float f = rstd[r];
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          float x0, x1;
          kh_unpack2<kh_bf16>(v[j], x0, x1);
          v[j] = kh_pack2<kh_bf16>(x0 * f * wf[2 * j], x1 * f * wf[2 * j + 1]);
        }
        asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(a), "r"(v[0]), "r"(v[1]),
                     "r"(v[2]), "r"(v[3]));
      }
    }
    kh_fence_proxy_async();  // the normed x, visible to wgmma's reads (after the loop's barrier)
  }

  const int row = warp * 16 + (lane >> 2), col = (lane & 3) * 2;
  float acc[BN / 2];
  float best_v[2] = {0.f, 0.f};
  long long best_i[2] = {N, N};  // N: no column seen
  // Stage s's chunk, slot and tile.
  int c = 0, slot = 0, n0 = (int)blockIdx.x * BN;
  for (int s = 0; s < total; ++s) {
    kh_cp_async_wait<STAGES - 2>();
    kh_fence_proxy_async();  // this thread's cp.async writes, visible to wgmma's reads
    __syncthreads();         // ... every thread's; and every wgmma of stage s - 1 is done
    if (s + STAGES - 1 < total) load_next_w();
    kh_cp_async_commit();
    const kh_u32 xs = x_tiles + c * kXTile, ws = w_stages + slot * kWTile;
    kh_wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk)
      kh_wgmma_ss<kh_bf16, BN>(acc, kh_wgmma_desc(xs + kk * 32, 16, 1024),
                               kh_wgmma_desc(ws + kk * 32, 16, 1024), c > 0 || kk > 0);
    kh_wgmma_commit();
    kh_wgmma_wait<0>();
    slot = slot + 1 == STAGES ? 0 : slot + 1;
    if (++c != nc) continue;
    c = 0;
    // The tile's logits, rounded to bf16 as written, and the rows' best of them (columns in
    // ascending order along the walk: the first maximum stays). acc[4 i + 2 h + j]: row row + 8 h,
    // column 8 i + col + j.
#pragma unroll
    for (int i = 0; i < BN / 8; ++i)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int m = row + 8 * h, n = n0 + 8 * i + col;
        if (n >= N) continue;  // N is a multiple of 8: n < N covers n + 1
        const kh_u32 pair = kh_pack2<kh_bf16>(acc[4 * i + 2 * h], acc[4 * i + 2 * h + 1]);
        if (m < M) *reinterpret_cast<kh_u32*>(y + (long long)m * N + n) = pair;
        float v0, v1;
        kh_unpack2<kh_bf16>(pair, v0, v1);
        argmax_take(v0, n, N, best_v[h], best_i[h]);
        argmax_take(v1, n + 1, N, best_v[h], best_i[h]);
      }
    n0 += tile_step;
  }
  kh_cp_async_wait<0>();
  kh_pdl_launch_dependents();

  // A row's columns are the four lanes of a quad: their bests meet by two shuffles, then the
  // CTAs' in scratch.
  unsigned int* ctas_done = reinterpret_cast<unsigned int*>(g.scratch + 2 * M);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
#pragma unroll
    for (int off = 1; off <= 2; off <<= 1) {
      const float ov = __shfl_xor_sync(0xFFFFFFFFu, best_v[h], off);
      const long long oi = __shfl_xor_sync(0xFFFFFFFFu, best_i[h], off);
      if (argmax_better(ov, oi, best_v[h], best_i[h], N)) {
        best_v[h] = ov;
        best_i[h] = oi;
      }
    }
    const int m = row + 8 * h;
    if ((lane & 3) == 0 && m < M && best_i[h] != N)
      atomicMax(g.scratch + m, argmax_key(best_v[h], best_i[h]));
  }
  __threadfence();  // this thread's keys before the CTA's count
  __syncthreads();
  if (tid == 0) *last_cta = atomicAdd(ctas_done, 1u) == gridDim.x - 1;
  __syncthreads();
  if (!*last_cta) return;
  __threadfence();  // every CTA's keys, seen after their counts
  const int step = *g.step;
  if (tid < M)
    greedy_advance(tid, argmax_key_index(atomicExch(g.scratch + tid, 0ull)), step, g.tokens,
                   g.positions, g.seq_lens, g.out_tokens, g.out_cols);
  __syncthreads();  // every row has read *step
  if (tid == 0) {
    *ctas_done = 0;
    *g.step = step + 1;
  }
}

#endif  // KH_SKINNY_WGMMA

}  // namespace

// The variants (skinny_gemm.h names them): 32 * NT columns a CTA, STAGES stages.
#define KH_SKINNY(NT, STAGES)                                                             \
  KH_GLOBAL void __launch_bounds__(kThreads) kh_skinny_gemm_n##NT##_s##STAGES(            \
      const kh_bf16* x, long long ldx, const kh_bf16* w, const kh_bf16* bias, kh_bf16* y, \
      long long ldy, int M, int N, int K, float* acc, int* counters) {                    \
    skinny_gemm<NT, STAGES>(x, ldx, w, bias, y, ldy, M, N, K, acc, counters);             \
  }
KH_SKINNY(1, 4)
KH_SKINNY(1, 6)
KH_SKINNY(2, 3)
KH_SKINNY(2, 4)
KH_SKINNY(2, 6)

// The Hopper variants (skinny_gemm.cpp's kVariants and kEpilogueVariants name them the same way):
// BN columns a CTA, STAGES stages, an epilogue, the folded norm; only in sm_90a code. Every one
// takes both epilogue operand structs (zero where unused).
#if defined(KH_SKINNY_WGMMA)
#define KH_SKINNY_WGMMA_KERNEL(NAME, BN, STAGES, EPI, PRENORM)                                 \
  KH_GLOBAL void __launch_bounds__(kThreads, 1)                                                \
      NAME(const kh_bf16* x, long long ldx, const kh_bf16* w, const kh_bf16* bias, kh_bf16* y, \
           long long ldy, int M, int N, int K, const QkNormRope e, const NormFold nf) {        \
    skinny_wgmma<BN, STAGES, EPI, PRENORM>(x, ldx, w, bias, y, ldy, M, N, K, e, nf);           \
  }
KH_SKINNY_WGMMA_KERNEL(kh_skinny_wgmma_n1_s4, 64, 4, kEpiNone, false)
KH_SKINNY_WGMMA_KERNEL(kh_skinny_wgmma_n1_s6, 64, 6, kEpiNone, false)
KH_SKINNY_WGMMA_KERNEL(kh_skinny_wgmma_n2_s4, 128, 4, kEpiNone, false)
KH_SKINNY_WGMMA_KERNEL(kh_skinny_wgmma_n2_s6, 128, 6, kEpiNone, false)
// The gate/up projection with SiluAndMul (64-column tiles: 32 gate and 32 up rows).
KH_SKINNY_WGMMA_KERNEL(kh_skinny_wgmma_silu_n1_s4, 64, 4, kEpiSilu, false)
KH_SKINNY_WGMMA_KERNEL(kh_skinny_wgmma_silu_n1_s6, 64, 6, kEpiSilu, false)
KH_SKINNY_WGMMA_KERNEL(kh_skinny_wgmma_silu_pn_n1_s4, 64, 4, kEpiSilu, true)
KH_SKINNY_WGMMA_KERNEL(kh_skinny_wgmma_silu_pn_n1_s6, 64, 6, kEpiSilu, true)
// The q/k/v projection with Qwen3's q/k norms and RoPE: 128-column tiles (a head).
KH_SKINNY_WGMMA_KERNEL(kh_skinny_wgmma_qknr_n2_s3, 128, 3, kEpiQkNormRope, false)
KH_SKINNY_WGMMA_KERNEL(kh_skinny_wgmma_qknr_n2_s4, 128, 4, kEpiQkNormRope, false)
KH_SKINNY_WGMMA_KERNEL(kh_skinny_wgmma_qknr_pn_n2_s3, 128, 3, kEpiQkNormRope, true)
KH_SKINNY_WGMMA_KERNEL(kh_skinny_wgmma_qknr_pn_n2_s4, 128, 4, kEpiQkNormRope, true)
// The o and down projections adding into the residual stream (a norm's producer).
KH_SKINNY_WGMMA_KERNEL(kh_skinny_wgmma_res_n1_s4, 64, 4, kEpiResidual, false)
// The LM head with the greedy argmax (skinny_gemm.h's kSkinnyHeadStages; _norm: the final norm
// applied to x in shared memory).
#define KH_SKINNY_HEAD_KERNEL(NAME, STAGES, NORM)                                                  \
  KH_GLOBAL void __launch_bounds__(kThreads, 1)                                                    \
      NAME(const kh_bf16* x, const kh_bf16* w, kh_bf16* y, int M, int N, int K, const NormFold nf, \
           const KhSkinnyGreedy g) {                                                               \
    skinny_head_argmax<STAGES, NORM>(x, w, y, M, N, K, nf, g);                                     \
  }
KH_SKINNY_HEAD_KERNEL(kh_skinny_head_argmax_s6, 6, false)
KH_SKINNY_HEAD_KERNEL(kh_skinny_head_argmax_norm_s6, 6, true)
#endif
