// Launch geometry of the norm kernels (REFERENCE §6.3 items 1-5), shared by host.cpp and the
// tests. Header-only; no CUDA.
//
// Threads per row grow with the row so that each thread holds at most `max_vec` 16-byte vectors
// (8 in the forward, 4 in the backward) in registers, at least a warp per row for rows of more
// than 32 vectors (and up to 4 vectors per thread for shorter ones), several rows per CTA for
// short rows (128-thread CTAs), and a 512-thread loop kernel for rows longer than 512 * max_vec vectors.
#pragma once

#include <stdint.h>

namespace khk {

struct RowLaunch {
  bool reg = true;               // rows kept in registers (else the loop kernel)
  uint32_t threads_per_row = 1;  // blockDim.x, a power of two
  uint32_t rows_per_block = 1;   // blockDim.y (rows, or walkers in the backward)
  int64_t blocks = 0;            // gridDim.x
};

inline constexpr int kNormFwdMaxVec = 8;             // kFwdMaxVec in norm.cu
inline constexpr int kNormBwdMaxVec = 4;             // kBwdMaxVec in norm.cu
inline constexpr uint32_t kNormRegMaxThreads = 512;  // __launch_bounds__ of the reg kernels
inline constexpr uint32_t kNormLoopThreads = 512;    // kLoopThreads in norm.cu

inline uint32_t pow2_at_least(int64_t n) {
  uint32_t p = 1;
  while (p < n && p < 1024) p <<= 1;
  return p;
}

// `items`: rows (forward) or walkers (backward); `vec`: elements per access (1 or 16 bytes).
inline RowLaunch row_launch(int64_t items, int64_t cols, int vec, int max_vec) {
  const int64_t nvec = cols / vec;
  RowLaunch c;
  if (nvec <= int64_t{kNormRegMaxThreads} * max_vec) {
    uint32_t tpr = pow2_at_least((nvec + max_vec - 1) / max_vec);
    // Rows of up to a warp's worth of vectors (head_dim rows of the q/k norms: 16 vectors of
    // bf16) take 4 vectors per thread, not 1: more bytes in flight per thread and 4x fewer,
    // larger CTAs (1 vector per thread ran the Qwen3 q/k norms at about a third of HBM
    // bandwidth); longer rows spread over at least a warp.
    const uint32_t floor = nvec <= 32 ? pow2_at_least((nvec + 3) / 4) : 32;
    if (tpr < floor) tpr = floor;
    c.reg = true;
    c.threads_per_row = tpr;
    c.rows_per_block = tpr >= 128 ? 1 : 128 / tpr;
  } else {
    c.reg = false;
    c.threads_per_row = kNormLoopThreads;
    c.rows_per_block = 1;
  }
  c.blocks = (items + c.rows_per_block - 1) / c.rows_per_block;
  return c;
}

inline RowLaunch forward_launch(int64_t rows, int64_t cols, int vec) {
  return row_launch(rows, cols, vec, kNormFwdMaxVec);
}
inline RowLaunch backward_launch(int64_t walkers, int64_t cols, int vec) {
  return row_launch(walkers, cols, vec, kNormBwdMaxVec);
}

}  // namespace khk

// Recommended number of workspace rows W for the norm backward ops on a GPU with `sm_count`
// multiprocessors: one row per backward CTA (a walker, or for short rows a CTA of rows_per_block
// walkers that sum their partials in shared memory first), CTAs for about 512 threads per
// multiprocessor (16-byte bf16/fp16 vectors assumed), never more than the rows. A walker loads its
// row, reduces it and stores dx in series: with one walker CTA per multiprocessor nothing hides
// those phases; with two, one walker's loads overlap the other's reduction and stores. That is
// twice Quack's rmsnorm config (which pipelines rows inside a CTA instead). The partials the
// reduce kernel reads grow with W: 2 x 132 x 8192 fp32 is 8.7 MB, against 805 MB for dy, x and
// dx at 16384 x 8192 bf16. Short rows had 4x as many (the walkers of a CTA counted as rows of
// their own): Qwen3-0.6B's training step on an H200 ran 1 ms faster with the 4 rows a
// multiprocessor of this count than with 16 (tools/bench/RESULTS.md, session 19). Any W >= 1 is
// correct; this is only about speed.
inline int64_t kh_norm_workspace_rows(int64_t rows, int64_t cols, int sm_count) {
  const khk::RowLaunch c = khk::backward_launch(1, cols, 8);
  const int64_t threads = int64_t{c.threads_per_row} * c.rows_per_block;
  // A reg CTA has at least 128 threads: at most 4 rows a multiprocessor (bounded partials,
  // REFERENCE 6.3 item 5).
  const int64_t per_sm = c.reg && threads < 512 ? 512 / threads : 1;
  int64_t w = int64_t{sm_count > 0 ? sm_count : 1} * per_sm;
  if (w > rows) w = rows;
  return w < 1 ? 1 : w;
}
