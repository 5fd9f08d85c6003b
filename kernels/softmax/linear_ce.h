// FusedLinearCrossEntropy: cross-entropy of logits = hidden @ weight^T without materialising the
// [N, V] logits, as Liger's fused linear cross-entropy does: tokens go chunk by chunk, each
// chunk's logits [C, V] live in the caller's workspace, and the gradient is formed in place
// (softmax - onehot, over the valid-token count) and consumed by two GEMMs before the next chunk.
//
//   linear_cross_entropy(hidden [N, H], weight [V, H], labels [N] int64, ignore_index,
//                        workspace, loss [] fp32)
//       loss = mean over tokens whose label is not ignore_index of logsumexp(logits) -
//       logits[label]; 0 when every token is ignored (never NaN).
//   linear_cross_entropy_train(..., loss, d_hidden [N, H], d_weight [V, H])
//       also the gradients of that mean loss: d_hidden = dlogits @ weight (hidden's dtype or fp32),
//       d_weight = dlogits^T @ hidden summed over chunks, in weight's dtype or fp32. Weight's
//       dtype rounds the sum once per chunk, as Liger does by default, and needs no full-size
//       fp32 buffer (the PyTorch bridge's choice: 0.6 GB less at Qwen3's [151936, 1024] head);
//       fp32 rounds once at the end.
//   linear_cross_entropy_backward(grad_loss [] fp32, d_hidden, d_weight)
//       multiplies both in place by the upstream gradient of the loss (no pass over them when it
//       is exactly 1, as after loss.backward()).
//
// hidden and weight share one dtype (bf16, fp16, fp32) and device; their last dimension is
// contiguous (rows may be strided). Math: GEMMs through the loader's GEMM service (host->gemm,
// ABI 1.2: cuBLASLt on a GPU, the host implementation on the cpu), fp32 accumulation; the
// softmax part in fp32 (softmax.cu / cpu.cpp), logits and dlogits stored in the input dtype.
//
// Workspace: any contiguous tensor on the same device, used as bytes (its start rounded up to
// 256 bytes). Layout: 256 bytes of scalars, the per-token losses (N fp32, rounded up to 256
// bytes), then C rows of V logits. The chunk C is as many rows as fit, at most N; the minimum
// (C = 1) is lce_min_workspace_bytes. More rows mean fewer, larger GEMMs: C >= 1024 keeps the
// GEMMs efficient (Qwen3's V = 151936 in bf16: 297 MiB per 1024 rows).
#pragma once

#include <stdint.h>

#include "kernels/common/op_schema.h"

namespace khk {

struct LceLayout {
  int64_t token_loss = 0;  // byte offset of the N fp32 per-token losses
  int64_t logits = 0;      // byte offset of the [C, V] logits
  int64_t chunk = 0;       // C: rows per chunk (0: the workspace is too small)
};

inline int64_t lce_round256(int64_t b) {
  return (b + 255) / 256 * 256;
}
// The layout for `bytes` of workspace (already 256-byte aligned).
inline LceLayout lce_layout(int64_t n, int64_t v, int elem_bytes, int64_t bytes) {
  LceLayout l;
  l.token_loss = 256;
  l.logits = l.token_loss + lce_round256(n * 4);
  const int64_t row = v * elem_bytes;
  const int64_t rows = bytes > l.logits && row > 0 ? (bytes - l.logits) / row : 0;
  l.chunk = rows < n ? rows : n;
  return l;
}
// The smallest workspace (bytes, plus up to 255 for aligning its start) that holds one row.
inline int64_t lce_min_workspace_bytes(int64_t n, int64_t v, int elem_bytes) {
  return 256 + lce_round256(n * 4) + v * elem_bytes + 255;
}

inline constexpr OpSchema kLinearCe{
    "linear_cross_entropy(Tensor hidden, Tensor weight, Tensor labels, int ignore_index, "
    "Tensor(a!) workspace, Tensor(b!) loss) -> ()"};
inline constexpr OpSchema kLinearCeTrain{
    "linear_cross_entropy_train(Tensor hidden, Tensor weight, Tensor labels, int ignore_index, "
    "Tensor(a!) workspace, Tensor(b!) loss, Tensor(c!) d_hidden, Tensor(d!) d_weight) -> ()"};
inline constexpr OpSchema kLinearCeBackward{
    "linear_cross_entropy_backward(Tensor grad_loss, Tensor(a!) d_hidden, Tensor(b!) d_weight) "
    "-> ()"};

int32_t linear_ce(const Args<kLinearCe>& a, void* stream);
int32_t linear_ce_train(const Args<kLinearCeTrain>& a, void* stream);
int32_t linear_ce_backward(const Args<kLinearCeBackward>& a, void* stream);

}  // namespace khk
