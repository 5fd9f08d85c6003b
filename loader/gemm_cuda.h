// The GEMM service on a CUDA device, through cuBLASLt (loader/cublaslt.h).
//
// Row-major onto column-major. cuBLASLt reads matrices column-major; a row-major [r, c] matrix
// with leading dimension ld is, read column-major, its transpose [c, r] with the same ld. So the
// row-major request D = op(A) @ op(B) is run as the column-major product
//     D^T [n, m] = op(B)^T [n, k] @ op(A)^T [k, m]
// with the operands swapped: cuBLASLt's A is our B (transa = N when B is not transposed, T when
// KH_GEMM_TRANS_B), its B is our A (transb = N, or T with KH_GEMM_TRANS_A), its C and D are our
// D read as [n, m] with ldd. No data moves; the leading dimensions and batch strides pass
// through unchanged.
//
// Per device, created on first use under the device's primary context and kept for the rest of
// the process: one cuBLASLt handle, and a 32 MiB workspace (cuMemAlloc) per stream the device is
// used from, so that products on two streams never share scratch memory (a stream first seen
// while it captures a CUDA graph, where cuMemAlloc is not allowed, gets plans that need no
// workspace; the handle must exist by then: call once on the device before capturing). Per
// request shape
// (sizes, leading dimensions, strides, dtypes, flags and the pointers' alignments) the
// descriptors and the chosen algorithm are cached: a repeated shape costs one lookup and
// cublasLtMatmul. The choice: the first call of a shape (batch 1, its stream not capturing) times
// up to KERNEL_HUB_GEMM_AUTOTUNE (default kGemmAutotuneCandidates) of cuBLASLt's heuristic
// candidates on the caller's stream, writing D into scratch memory of D's size that is freed
// afterwards (an accumulating product must add into the caller's output once), and keeps the
// fastest; 0 or 1, a batched product or a capture keep the heuristic's first choice untimed.
#pragma once

#include <cstdint>
#include <string>

#include "kernel_hub/kernel_hub_abi.h"

namespace kh {

// Workspace per device and stream offered to cuBLASLt.
constexpr uint64_t kGemmWorkspaceBytes = 32ull << 20;
// cuBLASLt candidates a new plan times by default (KERNEL_HUB_GEMM_AUTOTUNE overrides).
constexpr int kGemmAutotuneCandidates = 8;

// KERNEL_HUB_GEMM_AUTOTUNE's count of candidates to time (unset or empty: the default; 0 and 1
// time none); throws kh::Error(kInvalidInput) naming the variable for anything but a
// non-negative integer up to 64.
int gemm_autotune_candidates(const char* env_value);

// Runs a request read_gemm accepted (device_id >= 0, m and n >= 1) on `stream`. KH_ERR_NO_DEVICE
// without a driver, the device or cuBLASLt; KH_ERR_UNSUPPORTED for sizes above cuBLASLt's int32
// limits or no algorithm for the shape; KH_ERR_LAUNCH when cuBLASLt or an allocation fails.
// `error` says which and what to do.
int32_t gemm_cuda(const kh_gemm_t& g, void* stream, std::string& error);

// The largest power of two (at most 256) dividing `address`: the alignment cuBLASLt is told.
uint32_t pointer_alignment(const void* address);

}  // namespace kh
