// Hopper (sm_90a) epilogue of the attention kernels: a warpgroup's 64-row wgmma accumulator tile
// to global memory through shared memory, so that each row goes out as whole 16-byte chunks from
// consecutive threads (the fragments' own 4-byte stores, eight rows a warp instruction, cost the
// backward about 7% of its consumers' time in ncu's samples, all of it after the last product).
#ifndef KH_ATTENTION_TILE_STORE_CUH_
#define KH_ATTENTION_TILE_STORE_CUH_

#include "kh_prelude.cuh"
#include "mma.cuh"
#include "sm90_sync.cuh"

// Four 8x8 16-bit matrices to shared memory (lanes 8i .. 8i + 7 give matrix i's row addresses;
// r[i] is this lane's pair of matrix i, in mma / wgmma fragment order).
KH_DEV void kh_stsm_x4(kh_u32 addr, kh_u32 r0, kh_u32 r1, kh_u32 r2, kh_u32 r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr),
               "r"(r0), "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}

// The shared-memory offset of 16-byte chunk c of row r in a tile of 64-column panels (128-byte
// rows, panel after panel `panel_bytes` apart), chunks swizzled by the row: the wgmma operand
// layout, so a warpgroup can reuse its own rows of an operand tile as the stage.
KH_DEV kh_u32 kh_panel_chunk(int r, int c, kh_u32 panel_bytes) {
  return (kh_u32)(c >> 3) * panel_bytes + (kh_u32)r * 128u + ((kh_u32)((c & 7) ^ (r & 7)) << 4);
}

// Stores a warpgroup's 64 x D tile of fp32 accumulators (warp w's rows 16w + lane / 4 and + 8;
// columns 8t + 2 (lane & 3), + 1 in acc[4t + 2 half + e], half 1 for the row + 8) as T, rows
// scaled by scale[half], to dst (row 0 of the tile, row_stride elements between rows; both a
// multiple of 16 bytes), rows >= rows_valid left out. `stage`: the warpgroup's 64 rows
// in a panel tile (kh_panel_chunk) that nothing else reads or writes until this returns; `bar`: a
// named barrier of the warpgroup's 128 threads alone; `wtid`: the thread's index in it. No barrier
// at the end: a second call into the same stage must first wait for this one's reads.
template <typename T, int D>
KH_DEV void kh_wg_store_tile(const float (&acc)[D / 2], const float (&scale)[2], kh_u32 stage,
                             kh_u32 panel_bytes, int bar, int wtid, T* dst, kh_i64 row_stride,
                             int rows_valid) {
  constexpr int CH = D / 8;  // 16-byte chunks a row
  const int lane = wtid & 31, warp = wtid >> 5, mat = lane >> 3;
  // Matrix mat of chunk pair t: rows 16 warp + 8 (mat & 1) .. + 7, chunk t + (mat >> 1).
  const int r = warp * 16 + (mat & 1) * 8 + (lane & 7);
#pragma unroll
  for (int t = 0; t < CH; t += 2) {
    const int c = t + (mat >> 1);
    kh_stsm_x4(stage + kh_panel_chunk(r, c, panel_bytes),
               kh_pack2<T>(acc[4 * t] * scale[0], acc[4 * t + 1] * scale[0]),
               kh_pack2<T>(acc[4 * t + 2] * scale[1], acc[4 * t + 3] * scale[1]),
               kh_pack2<T>(acc[4 * t + 4] * scale[0], acc[4 * t + 5] * scale[0]),
               kh_pack2<T>(acc[4 * t + 6] * scale[1], acc[4 * t + 7] * scale[1]));
  }
  kh_named_sync(bar, 128);
#pragma unroll
  for (int k = 0; k < CH / 2; ++k) {
    const int i = wtid + k * 128, row = i / CH, c = i % CH;
    if (row >= rows_valid) continue;
    kh_u32 v[4];
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v[0]), "=r"(v[1]), "=r"(v[2]), "=r"(v[3])
                 : "r"(stage + kh_panel_chunk(row, c, panel_bytes)));
    asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"l"(dst + row * row_stride + c * 8),
                 "r"(v[0]), "r"(v[1]), "r"(v[2]), "r"(v[3])
                 : "memory");
  }
}

#endif  // KH_ATTENTION_TILE_STORE_CUH_
