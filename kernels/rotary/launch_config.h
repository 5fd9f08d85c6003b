// Launch geometry of the rotary kernels, shared by host.cpp and the tests. Header-only; no CUDA.
// One CTA per token (gridDim.x = tokens); its threads walk the token's work units of every query
// head, then every key head (a unit is one (x1, x2) pair of one head, or a 16-byte vector of
// pairs). Threads: a power of two from 32 to kRotaryMaxThreads, about one unit per thread for
// short tokens.
#pragma once

#include <stdint.h>

namespace khk {

inline constexpr uint32_t kRotaryMaxThreads = 256;  // __launch_bounds__ in rotary.cu

// `units`: work units (a pair, or a 16-byte vector of pairs) of one token over the query and key
// heads together.
inline uint32_t rotary_threads(int64_t units) {
  uint32_t t = 32;
  while (t < units && t < kRotaryMaxThreads) t <<= 1;
  return t;
}

}  // namespace khk

// Recommended workspace rows W of QKNormRotaryEmbedding's backward (host.cpp): one partial row
// per walker CTA, as many walkers as are resident at once (rotary.cu's qknr_bwd kernels: 2 CTAs
// of 256 threads a multiprocessor for bf16/fp16, at 128 registers a thread), so that they run
// in one wave. Any W >= 1 is correct; this is only about speed.
inline int64_t kh_qknr_workspace_rows(int sm_count) {
  return 2 * int64_t{sm_count > 0 ? sm_count : 1};
}
