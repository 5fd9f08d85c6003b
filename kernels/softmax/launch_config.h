// Launch geometry of the softmax and cross-entropy kernels, shared by host.cpp and the tests.
// Header-only; no CUDA.
//
// Rows are walked by `threads_per_row` threads (a power of two from 32 to 1024: about
// kSoftmaxPerThread 16-byte vectors per thread, so a 128K-vocabulary row gets a whole
// 1024-thread CTA) and short rows share a CTA (256 threads: 256 / threads_per_row rows).
#pragma once

#include <stdint.h>

namespace khk {

inline constexpr int kSoftmaxPerThread = 8;
inline constexpr uint32_t kSoftmaxMaxThreads = 1024;  // __launch_bounds__ in softmax.cu
inline constexpr uint32_t kSoftmaxCtaThreads = 256;   // CTA size for rows shorter than that

struct SoftmaxLaunch {
  uint32_t threads_per_row = 32;  // blockDim.x
  uint32_t rows_per_block = 1;    // blockDim.y
  int64_t blocks = 0;             // gridDim.x
};

// `nvec`: vectors (or elements, scalar path) per row.
inline SoftmaxLaunch softmax_launch(int64_t rows, int64_t nvec) {
  SoftmaxLaunch c;
  const int64_t want = (nvec + kSoftmaxPerThread - 1) / kSoftmaxPerThread;
  uint32_t t = 32;
  while (t < want && t < kSoftmaxMaxThreads) t <<= 1;
  c.threads_per_row = t;
  c.rows_per_block = t >= kSoftmaxCtaThreads ? 1 : kSoftmaxCtaThreads / t;
  c.blocks = (rows + c.rows_per_block - 1) / c.rows_per_block;
  return c;
}

}  // namespace khk
