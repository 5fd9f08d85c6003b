// Launch geometry of the activation kernels, shared by host.cpp and the tests. Header-only.
// 256-thread CTAs: tx threads along the row (a power of two, enough that each thread handles at
// most kActUnroll vectors of a row chunk), ty = 256 / tx rows per CTA for short rows, and
// gridDim.y column chunks of tx * kActUnroll vectors for long rows.
#pragma once

#include <stdint.h>

namespace khk {

inline constexpr int kActUnroll = 4;  // kUnroll in activation.cu
inline constexpr uint32_t kActThreads = 256;

struct ActLaunch {
  uint32_t tx = 1, ty = 1;
  int64_t grid_x = 0, grid_y = 0;
};

// `nvec`: vectors (or elements, scalar path) per output row.
inline ActLaunch act_launch(int64_t rows, int64_t nvec) {
  ActLaunch c;
  const int64_t per_thread = (nvec + kActUnroll - 1) / kActUnroll;
  uint32_t tx = 1;
  while (tx < per_thread && tx < kActThreads) tx <<= 1;
  c.tx = tx;
  c.ty = kActThreads / tx;
  c.grid_x = (rows + c.ty - 1) / c.ty;
  c.grid_y = (nvec + int64_t{tx} * kActUnroll - 1) / (int64_t{tx} * kActUnroll);
  return c;
}

}  // namespace khk
