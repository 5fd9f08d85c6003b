// The demo runtime's layer slots and their built-in implementations (the fallback of each slot).
//
// Each fallback takes exactly the argument list of the shipped package op it stands in for
// (kernels/*/host.cpp), so the model calls a slot the same way whether a package or the
// fallback serves it:
//
//   RMSNorm          rms_norm(x, weight, eps, y)                      [kernel-hub/norm]
//                    rms_norm_train(x, weight, eps, y, rstd)
//                    rms_norm_backward(dy, x, weight, rstd, dx, dweight, workspace)
//   RotaryEmbedding  rotary_embedding(positions, query, key?, cos, sin, is_neox)   (in place)
//                    rotary_embedding_backward(positions, dquery, dkey?, cos, sin, is_neox)
//   SiluAndMul       silu_and_mul(x, y), x = [gate | up]               [kernel-hub/activation]
//                    silu_and_mul_backward(dy, x, dx)
//   CrossEntropy     cross_entropy(logits, targets, ignore_index, loss)  [kernel-hub/softmax]
//                    cross_entropy_train(logits, targets, ignore_index, grad_scale, loss,
//                                        dlogits)
//                    cross_entropy_backward(dloss, dlogits)              (scales in place)
//   Attention        attention_forward(q, k, v, cu_seqlens_q?, cu_seqlens_k?, max_seqlen_q,
//                                      causal, window_left, scale, out, lse?)
//                                                                     [kernel-hub/attention]
//                    (forward_train: the same op with lse, fp32 [heads, tokens])
//                    attention_backward(dout, q, k, v, out, lse, cu_seqlens_q?, cu_seqlens_k?,
//                                       max_seqlen_q, max_seqlen_k, causal, window_left, scale,
//                                       dq, dk, dv, workspace?)
//
// They are plain fp32 loops on host tensors (contiguous, kDLCPU) with the packages' formulas;
// anything else is refused with KH_ERR_UNSUPPORTED and a message in kh::last_op_error().
// Attention's fallback is the runtime's own causal attention (layers.h) and takes padded
// [batch, len, heads, head_dim] batches only: causal = 1, window_left = -1, no cu_seqlens, k and
// v of q's length (GQA: fewer key/value heads, dividing q's).
#pragma once

#include <cstdint>

#include "kernel_hub/kernel_hub.hpp"

namespace kh::demo {

// Layer names exactly as the packages export them: the slot name is what kernelize resolves.
inline constexpr const char* kRMSNorm = "RMSNorm";
inline constexpr const char* kRotaryEmbedding = "RotaryEmbedding";
inline constexpr const char* kSiluAndMul = "SiluAndMul";
inline constexpr const char* kCrossEntropy = "CrossEntropy";
inline constexpr const char* kAttention = "Attention";
// The LM head and cross-entropy fused, chunk by chunk (kernel-hub/softmax >= 1.1): the device
// model's train loss, never materialising the [tokens, vocab] logits.
inline constexpr const char* kFusedLinearCrossEntropy = "FusedLinearCrossEntropy";
// The residual add and the RMSNorm after it in one pass (kernel-hub/norm): the device model's
// pre-norms, which also keep the new residual for backward without a copy.
inline constexpr const char* kFusedAddRMSNorm = "FusedAddRMSNorm";
// Qwen3's q/k norms and RoPE in one pass (kernel-hub/rotary >= 1.1, eval only): the device
// model's decode step; without it, the RMSNorm slot on q and k, then RotaryEmbedding.
inline constexpr const char* kQKNormRotaryEmbedding = "QKNormRotaryEmbedding";
// SiluAndMul for a caller that drops its output after the forward (kernel-hub/activation >=
// 1.1): backward returns it with dx in one pass, silu_and_mul_backward_recompute(dy, x, dx, y).
// The device model's MLP backward; without it, SiluAndMul's forward again, then its backward.
inline constexpr const char* kSiluAndMulRecompute = "SiluAndMulRecompute";
// FusedAddRMSNorm and QKNormRotaryEmbedding whose backwards take the forward's outputs (and, for
// the q/k norms, its rstd) instead of its inputs (kernel-hub/norm >= 1.1, kernel-hub/rotary >=
// 1.3): the device model's keep_normed training, which then keeps the normed tensors in place of
// the residual stream and the q/k projections. Without them it keeps both.
inline constexpr const char* kFusedAddRMSNormFromOutput = "FusedAddRMSNormFromOutput";
inline constexpr const char* kQKNormRotaryEmbeddingFromOutput = "QKNormRotaryEmbeddingFromOutput";
// What the device model's train forward keeps of each layer's normed tensors (its attention's
// and MLP's normed inputs, Qwen3's q and k after their norms and RoPE) for the backward, which
// otherwise recomputes them (DeviceModelOptions::keep_normed, `demo --keep-normed`). kAuto: keeps
// a pair of them where a FromOutput slot lets it hold them instead of what they were computed
// from (the residual stream, the q/k projections): no more memory. kOn: keeps them all, the
// inputs too where no FromOutput slot serves. kOff: keeps none.
enum class KeepNormed : uint8_t { kAuto, kOn, kOff };

// A slot the runtime did not declare (slot() of a table never reaches it).
inline constexpr uint32_t kNoSlot = UINT32_MAX;

struct DemoSlots {
  uint32_t rms_norm = 0;
  uint32_t rotary = 0;
  uint32_t silu_and_mul = 0;
  uint32_t cross_entropy = 0;
  uint32_t attention = 0;
  uint32_t linear_cross_entropy = kNoSlot;            // add_device_demo_slots only
  uint32_t fused_add_rms_norm = kNoSlot;              // add_device_demo_slots only
  uint32_t qk_norm_rotary = kNoSlot;                  // add_device_demo_slots only
  uint32_t silu_and_mul_recompute = kNoSlot;          // add_device_demo_slots only
  uint32_t fused_add_rms_norm_from_output = kNoSlot;  // add_device_demo_slots only
  uint32_t qk_norm_rotary_from_output = kNoSlot;      // add_device_demo_slots only
};

// Adds the five slots, each with its fallback (forward, forward_train, backward).
DemoSlots add_demo_slots(Runtime& runtime);
// The five, FusedLinearCrossEntropy, FusedAddRMSNorm, QKNormRotaryEmbedding,
// SiluAndMulRecompute and the two FromOutput slots, for the GPU-resident model (device_model.h):
// their fallbacks are the model's own (its chunked loss; its add, then the RMSNorm slot; the
// RMSNorm slot on q and k, then RotaryEmbedding; the SiluAndMul slot forward, then backward; the
// backwards from the inputs, kept), so these slots' own ops only refuse (never called).
DemoSlots add_device_demo_slots(Runtime& runtime);

}  // namespace kh::demo
