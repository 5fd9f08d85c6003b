// Tensor-core building blocks (sm_80+) of the attention package's kernels and the runtime's
// skinny GEMM (tools/demo/skinny_gemm.cu): cp.async tile loads into swizzled shared memory,
// ldmatrix fragment loads and mma.sync m16n8k16 with fp32 accumulators. Header-free for NVRTC
// (inline PTX only); installed with the SDK beside kh_prelude.cuh, which it needs first.
//
// Shared-memory tiles hold ROWS rows of D 16-bit elements, D / 8 16-byte chunks per row; chunk c
// of row r is stored at chunk c ^ (r & 7), so the 8 rows one ldmatrix 8x8 matrix reads (same
// logical chunk, consecutive rows) fall into 8 different 16-byte bank groups. Needs D >= 64.
#ifndef KH_MMA_CUH_
#define KH_MMA_CUH_

KH_DEV kh_u32 kh_smem_addr(const void* p) {
  kh_u32 r;
  asm("{ .reg .u64 a; cvta.to.shared.u64 a, %1; cvt.u32.u64 %0, a; }" : "=r"(r) : "l"(p));
  return r;
}

// 16 bytes global -> shared, asynchronously; `valid` false zero-fills the destination (rows past
// a sequence's end: masked scores must meet zeros, not garbage that could be NaN).
KH_DEV void kh_cp_async16(kh_u32 smem, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem),
               "r"(valid ? 16 : 0));
}
KH_DEV void kh_cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int N>
KH_DEV void kh_cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// 2^x on the special-function unit alone (exp2f adds a denormal range fix-up of three
// instructions per call; softmax inputs are <= 0 and a flushed tiny result changes nothing).
KH_DEV float kh_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Byte offset of (row, chunk) in a swizzled tile with CH chunks per row.
template <int CH>
KH_DEV kh_u32 kh_swz(int row, int chunk) {
  return (kh_u32)(row * CH + (chunk ^ (row & 7))) * 16u;
}

// Loads rows [row0, row0 + ROWS) of one head (`src` points at row 0; `stride` elements between
// rows) into a swizzled tile; rows at or past `rows` are zero-filled. NT threads cooperate.
template <int ROWS, int D, int NT, typename T>
KH_DEV void kh_load_tile(kh_u32 tile, const T* src, kh_i64 stride, int row0, int rows, int tid) {
  constexpr int CH = D / 8;
  static_assert((ROWS * CH) % NT == 0, "whole chunks per thread");
#pragma unroll
  for (int j = 0; j < ROWS * CH / NT; ++j) {
    const int i = tid + j * NT, r = i / CH, c = i % CH;
    const bool valid = row0 + r < rows;
    const T* g = src + (valid ? (kh_i64)(row0 + r) * stride + c * 8 : 0);
    kh_cp_async16(tile + kh_swz<CH>(r, c), g, valid);
  }
}

KH_DEV void kh_ldsm_x4(kh_u32 addr, kh_u32 (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
// Two 8x8 matrices (lanes 0-15 give the row addresses): r[0] of matrix 0, r[1] of matrix 1.
KH_DEV void kh_ldsm_x2(kh_u32 addr, kh_u32 (&r)[2]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(addr));
}
KH_DEV void kh_ldsm_x4_trans(kh_u32 addr, kh_u32 (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// d += a * b for one m16n8k16 tile: a 16x16 (row), b 16x8 (col), d 16x8 fp32.
template <typename T>
KH_DEV void kh_mma16816(float (&d)[4], const kh_u32 (&a)[4], kh_u32 b0, kh_u32 b1) {
  if constexpr (kh_same<T, kh_bf16>::value) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two fp32 values as one 32-bit register of T (lo in the low half: the lower column).
template <typename T>
KH_DEV kh_u32 kh_pack2(float lo, float hi) {
  kh_u32 p;
  if constexpr (kh_same<T, kh_bf16>::value)
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(p) : "f"(hi), "f"(lo));
  else
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(p) : "f"(hi), "f"(lo));
  return p;
}

// The two values of a kh_pack2 register back as fp32.
template <typename T>
KH_DEV void kh_unpack2(kh_u32 p, float& lo, float& hi) {
  if constexpr (kh_same<T, kh_bf16>::value) {
    lo = __uint_as_float(p << 16);
    hi = __uint_as_float(p & 0xFFFF0000u);
  } else {
    asm("{\n.reg .f16 l, h;\nmov.b32 {l, h}, %2;\ncvt.f32.f16 %0, l;\ncvt.f32.f16 %1, h;\n}\n"
        : "=f"(lo), "=f"(hi)
        : "r"(p));
  }
}

// The A fragment of k16 step kk taken from an fp32 accumulator tile (16 rows x 8*N columns in
// mma's C layout): C's layout is A's, two n-tiles making one k16 step, so P (or dS) feeds the
// next product from registers (FlashAttention-2's reuse).
template <typename T, int N>
KH_DEV void kh_acc_to_a(const float (&c)[N][4], int kk, kh_u32 (&a)[4]) {
  a[0] = kh_pack2<T>(c[2 * kk][0], c[2 * kk][1]);
  a[1] = kh_pack2<T>(c[2 * kk][2], c[2 * kk][3]);
  a[2] = kh_pack2<T>(c[2 * kk + 1][0], c[2 * kk + 1][1]);
  a[3] = kh_pack2<T>(c[2 * kk + 1][2], c[2 * kk + 1][3]);
}

// acc (16 x 16*N16) += A B^T over 16*K16: A is 16 rows of a swizzled tile (ldmatrix address of
// k step kk: a_row + ((kk * 32) ^ a_x)), B is 16*N16 rows of another (n step nn, k step kk:
// b_row + nn * n_step + ((kk * 32) ^ b_x)); both row-major with k along the row.
template <typename T, int K16, int N16>
KH_DEV void kh_mma_tile_abt(float (&acc)[2 * N16][4], kh_u32 a_row, kh_u32 a_x, kh_u32 b_row,
                            kh_u32 b_x, kh_u32 n_step) {
#pragma unroll
  for (int kk = 0; kk < K16; ++kk) {
    kh_u32 a[4];
    kh_ldsm_x4(a_row + ((kk * 32) ^ a_x), a);
#pragma unroll
    for (int nn = 0; nn < N16; ++nn) {
      kh_u32 b[4];
      kh_ldsm_x4(b_row + nn * n_step + ((kk * 32) ^ b_x), b);
      kh_mma16816<T>(acc[2 * nn], a, b[0], b[1]);
      kh_mma16816<T>(acc[2 * nn + 1], a, b[2], b[3]);
    }
  }
}

// acc (16 x 16*N16) += P B over 16*K16: P an fp32 accumulator tile in registers (kh_acc_to_a), B
// 16*K16 rows of a swizzled tile with n along the row (transposed loads; k step kk, n step nn:
// b_row + kk * k_step + ((nn * 32) ^ b_x)).
template <typename T, int K16, int N16>
KH_DEV void kh_mma_acc_b(float (&acc)[2 * N16][4], const float (&p)[2 * K16][4], kh_u32 b_row,
                         kh_u32 b_x, kh_u32 k_step) {
#pragma unroll
  for (int kk = 0; kk < K16; ++kk) {
    kh_u32 a[4];
    kh_acc_to_a<T>(p, kk, a);
#pragma unroll
    for (int nn = 0; nn < N16; ++nn) {
      kh_u32 b[4];
      kh_ldsm_x4_trans(b_row + kk * k_step + ((nn * 32) ^ b_x), b);
      kh_mma16816<T>(acc[2 * nn], a, b[0], b[1]);
      kh_mma16816<T>(acc[2 * nn + 1], a, b[2], b[3]);
    }
  }
}

#endif  // KH_MMA_CUH_
