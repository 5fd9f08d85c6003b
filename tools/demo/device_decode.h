// Eval decode for the GPU-resident runtime (DeviceCausalLM's decode members live in
// device_decode.cpp): a paged KV cache on the device, prefill that writes the prompt's K/V into
// it, and greedy decode of one token per sequence per step, captured once as a CUDA graph and
// replayed.
//
// The cache has the attention package's layout (README, the attention package): per layer, K and
// V of [pages, page_size, kv_heads, head_dim], an int32 block table [batch, pages per sequence]
// (sequence b owns pages b * pages_per_sequence ...) and int32 seq_lens [batch]. The slots
// PagedKVAppend (paged_kv_append) and PagedAttention (paged_attention_decode) serve when a
// package is bound to them on the device (and PagedAttentionWithKVAppend, both in one launch,
// where it is bound too) (the cache is then bfloat16: the package refuses fp32 on
// cuda, so fp32 activations are cast at that boundary); otherwise the runtime's own device
// kernels (device_decode.cu) serve, on a cache of the activations' dtype.
//
// The decode step reads its token ids, positions and seq_lens from device buffers and ends with
// a device argmax that writes the next step's tokens and advances positions and seq_lens, so the
// captured graph replays with no host round trip; decode_step(tokens) writes new token ids into
// the captured buffer first (teacher forcing).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kernel_hub/kernel_hub.hpp"
#include "tools/demo/device_tensor.h"
#include "tools/demo/model_config.h"
#include "tools/demo/skinny_gemm.h"  // greedy_scratch_elems: the LM head's argmax shares scratch

namespace kh::demo {

inline constexpr const char* kPagedAttention = "PagedAttention";
inline constexpr const char* kPagedKVAppend = "PagedKVAppend";
inline constexpr const char* kPagedAttentionWithKVAppend = "PagedAttentionWithKVAppend";

// The decode slots (no host fallback: the device model runs its own kernels when nothing is
// bound). add_decode_slots adds them to a runtime once (kernelize then binds them like the
// others); DeviceCausalLM finds them by name. The fused append + attention is optional (a
// runtime that added only the first two, or a package older than attention 1.3, still decodes
// with them).
struct DecodeSlots {
  uint32_t paged_attention = 0;
  uint32_t paged_kv_append = 0;
  std::optional<uint32_t> attention_with_append;
};
DecodeSlots add_decode_slots(Runtime& runtime);

// Two-batch overlap of a decode step: the batch's two halves run their layers on two streams,
// and one half's attention (bound by reading its K/V) alternates with the other half's
// projections, norms and MLP (bound by launch and weight-read latency), so the step's kernels
// overlap. Off by default: on the H200 a Qwen3-0.6B step of 64 x 2048 took 5.33 ms overlapped
// against 5.02 ms whole (tools/bench/RESULTS.md): each half pays the weight reads and launches
// of a whole step, which the overlap does not win back at that context.
enum class DecodeOverlap : uint8_t { kOff, kOn };

// The decode step's GEMMs: cuBLASLt; the runtime's skinny GEMM (skinny_gemm.h) wherever it takes
// the shapes (bf16, up to 64 sequences), cuBLASLt elsewhere; or (kAuto, the default) the skinny
// GEMM only where skinny_preferred() says it beats cuBLASLt (Hopper, weights wider than tall),
// cuBLASLt for the rest.
enum class DecodeGemm : uint8_t { kCublasLt, kSkinny, kAuto };

// Whether a decode step folds layers into the runtime's skinny GEMMs where it runs them on Hopper
// (kOn, the default): Qwen3's q/k norms and RoPE as the fused q/k/v GEMM's epilogue and the MLP's
// SiluAndMul as the gate/up GEMM's, so the step launches neither QKNormRotaryEmbedding nor
// SiluAndMul (the slots still serve training and prefill). kOff: the slots in every step.
enum class DecodeFuse : uint8_t { kOff, kOn };

struct DecodeConfig {
  int max_batch = 1;    // sequences decoded together (the graph is captured per batch)
  int max_context = 0;  // prompt + generated tokens per sequence; 0: the model's seq
  int page_size = 64;   // tokens per page
  DecodeOverlap overlap = DecodeOverlap::kOff;
  DecodeGemm gemm = DecodeGemm::kAuto;
  DecodeFuse fuse = DecodeFuse::kOn;
};

// The cache's shape for a model, checked (kh::Error kInvalidInput naming the field): batch and
// page size >= 1, max_context in 1..config.seq (the rotary table's length).
struct KvCacheShape {
  int64_t pages = 0;               // max_batch * pages_per_sequence
  int64_t pages_per_sequence = 0;  // ceil(max_context / page_size)
  int64_t page_size = 0, kv_heads = 0, head_dim = 0, layers = 0;
  int64_t max_context = 0;
  // K and V of every layer, in bytes, for elements of `element_bytes`.
  uint64_t bytes(int64_t element_bytes) const {
    return static_cast<uint64_t>(2 * layers * pages * page_size * kv_heads * head_dim *
                                 element_bytes);
  }
};
KvCacheShape kv_cache_shape(const ModelConfig& config, const DecodeConfig& decode);

// The runtime's own decode kernels (device_decode.cu), compiled for one device.
const char* device_decode_source();
// The extern "C" names of its entry points.
std::vector<std::string> decode_kernel_names();
// The greedy argmax's CTA (one a row of logits; its kernel is __launch_bounds__ for it).
inline constexpr uint32_t kArgmaxThreads = 1024;

class DecodeKernels {
 public:
  explicit DecodeKernels(int device);
  // k_new/v_new [batch, n_new, kv_heads, head_dim] to the last n_new tokens of seq_lens.
  void append(DeviceStream& s, const DeviceTensor& k_new, const DeviceTensor& v_new,
              const DeviceTensor& block_table, const DeviceTensor& seq_lens, DeviceTensor& k_cache,
              DeviceTensor& v_cache);
  // q/out [batch, 1, q_heads, head_dim] against the cache (the last token of seq_lens).
  void attend(DeviceStream& s, const DeviceTensor& q, const DeviceTensor& k_cache,
              const DeviceTensor& v_cache, const DeviceTensor& block_table,
              const DeviceTensor& seq_lens, float scale, DeviceTensor& out);
  // For each of `batch` rows of `logits` (row r at element r * row_stride, after `offset`
  // elements): tokens[r] = argmax, positions[r] += 1, seq_lens[r] += 1, out_tokens[r][*step] =
  // argmax; then ++*step. One launch, several CTAs a row that meet in `scratch` (int64, at least
  // argmax_scratch_elems(batch), zeroed once: each launch leaves it zeroed again).
  void argmax_advance(DeviceStream& s, const DeviceTensor& logits, int64_t offset,
                      int64_t row_stride, int64_t batch, int64_t vocab, DeviceTensor& tokens,
                      DeviceTensor& positions, DeviceTensor& seq_lens, DeviceTensor& out_tokens,
                      DeviceTensor& step, DeviceTensor& scratch);
  static int64_t argmax_scratch_elems(int64_t batch) { return greedy_scratch_elems(batch); }

 private:
  kh_device_function_t* typed(const std::string& base, const DeviceTensor& t);
  DeviceModule module_;
  int64_t multiprocessors_ = 1;
};

}  // namespace kh::demo
