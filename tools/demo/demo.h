// The demo run: train the model (a preset at random init or a checkpoint) in train mode, switch
// the runtime to eval (one atomic store), measure the eval loss on held-out batches and continue
// a prompt greedily. The runtime must already hold the demo slots (add_demo_slots, or
// add_device_demo_slots for run_device_demo) and be kernelized, or not (fallbacks only): the runs
// do not care which implementation serves a slot.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "kernel_hub/kernel_hub.hpp"
#include "tools/demo/device_decode.h"
#include "tools/demo/fallback_ops.h"
#include "tools/demo/model.h"
#include "tools/demo/staging.h"

namespace kh::demo {

struct DemoOptions {
  ModelConfig model;
  // A checkpoint's weights (checkpoint.h) by Transformers name; empty: random init from `seed`.
  std::map<std::string, std::vector<float>> weights;
  AdamConfig adam;
  int batch = 8;
  int steps = 200;
  uint64_t seed = 1;       // model initialization and the training stream
  uint64_t data_seed = 7;  // the successor table: the "language" the model learns
  double follow = 0.8;     // how often the next token is the successor
  int eval_batches = 4;
  int prompt_tokens = 4;
  int generate_tokens = 16;
  // run_demo: < 0 the cpu; else slots bound for this CUDA device are staged to it (SlotCaller).
  // run_device_demo: the device the model lives on.
  int cuda_ordinal = -1;
  // run_device_demo only: bf16 (fp32 master weights) or fp32; prefill passes timed after one
  // warm-up; a profiled train step and prefill after the timed ones.
  bool bf16 = true;
  int prefill_reps = 3;
  bool profile = false;
  // run_device_demo only: greedy decode after the measurements, with the paged KV cache and the
  // decode step replayed as a CUDA graph: decode_batch sequences of decode_context tokens
  // (prompt + generated; 0: the defaults of resolve_decode).
  int decode_batch = 0;
  int decode_context = 0;
  // Whether the decode step runs the batch as two overlapped halves (DecodeOverlap).
  DecodeOverlap decode_overlap = DecodeOverlap::kOff;
  // The decode step's GEMMs (DecodeGemm): auto, cuBLASLt, or the runtime's skinny GEMM.
  DecodeGemm decode_gemm = DecodeGemm::kAuto;
  // Whether the decode step folds SiluAndMul into the gate/up GEMM (DecodeFuse).
  DecodeFuse decode_fuse = DecodeFuse::kOn;
  // run_device_demo only: tokens a chunk of the train loss (DeviceModelOptions::loss_chunk_rows).
  int64_t loss_chunk_rows = 0;  // 0: the model's default
  // run_device_demo only: DeviceModelOptions::keep_normed.
  KeepNormed keep_normed = KeepNormed::kAuto;
  // The device's peak memory bandwidth (bytes/s) for the decode roofline and where it came from
  // ("driver: ..." or the H200 figure the CLI assumes when the driver cannot be asked).
  double peak_bandwidth = 0;
  std::string peak_bandwidth_source;
  // Called after every training step (progress display); step counts from 1.
  std::function<void(int step, int steps, float loss)> on_step;
};

struct DemoRun {
  size_t parameters = 0;
  std::vector<float> train_loss;  // per step
  float eval_loss = 0;            // mean over eval_batches held-out batches, eval mode
  int64_t eval_tokens = 0;
  float floor_loss = 0;  // the generator's entropy: the best any model can reach
  std::vector<int64_t> prompt, generated;
  double pattern_match = 0;  // share of generated tokens that are the successor of the previous
  double train_ms = 0, eval_ms = 0, generate_ms = 0;
  double mode_switch_us = 0;  // set_mode(eval)
  StagingStats staging;
  std::vector<std::string> staged_slots;  // slots whose calls ran on the CUDA device

  // run_device_demo: throughput from CUDA events (train: the steps after the first, which
  // compiles and plans; prefill: last-token logits, after a warm-up pass), the pool's peak.
  bool on_device = false;
  std::string dtype;
  double train_tokens_per_s = 0, prefill_tokens_per_s = 0, prefill_ms = 0;
  std::vector<double> train_step_ms;  // each timed step's device time (steps 2 .. steps)
  // The model pool's peak of handed-out bytes (as torch.cuda.max_memory_allocated), and the bytes
  // it holds from the device (handed out + cached for reuse) after training, eval and prefill.
  uint64_t peak_bytes = 0, reserved_bytes = 0;
  std::vector<std::string> package_slots, runtime_slots;  // what served each slot's calls
  std::map<std::string, std::string> refused_slots;       // bound, but refused this model: why
  struct Breakdown {
    double total_ms = 0, gemm_ms = 0, attention_ms = 0, hub_ms = 0, other_ms = 0;
    std::map<std::string, double> hub_ms_by_slot;  // hub_ms by slot name
  };
  bool profiled = false;
  Breakdown train_profile, prefill_profile;

  // run_device_demo's decode: decode_batch sequences, a prompt of decode_prompt tokens, then
  // decode_generated tokens each (the first from the prefill); the timed steps (all decode
  // steps but the first, which loads and captures the graph) from CUDA events; the bytes one
  // step must read at the timed steps' average context (decode_roofline.h) over the step time,
  // as a share of peak_bandwidth.
  bool decoded = false;
  int decode_batch = 0, decode_prompt = 0, decode_generated = 0, decode_steps = 0;
  double decode_ms = 0, decode_ms_per_step = 0, decode_tokens_per_s = 0;
  double decode_average_context = 0;  // tokens in each sequence's cache, timed steps' mean
  double decode_weight_bytes = 0, decode_kv_bytes = 0, decode_step_bytes = 0;
  double decode_bandwidth = 0;  // step bytes / step time
  double peak_bandwidth = 0, roofline_fraction = 0;
  // A plain read's bandwidth measured in this run (DeviceCausalLM::read_bandwidth) and the step's
  // share of it.
  double read_bandwidth = 0, read_roofline_fraction = 0;
  std::string peak_bandwidth_source;
  bool decode_graph = false;          // the timed steps replayed a captured CUDA graph
  bool decode_package = false;        // PagedKVAppend / PagedAttention bound to a package
  bool decode_overlapped = false;     // the steps ran the batch as two overlapped halves
  bool decode_fused_qkv = false;      // every layer projected q, k and v with one GEMM
  bool decode_fused_append = false;   // ... and appended K/V in its attention's launch
  bool decode_fused_silu = false;     // every MLP ran SiluAndMul in its gate/up GEMM
  bool decode_fused_qk_norm = false;  // every q/k/v GEMM normed and rotated q and k
  bool decode_fused_norm = false;     // every norm between projections folded into them
  bool decode_fused_head = false;     // the LM head's epilogue took the greedy argmax
  bool decode_head_norm = false;      // ... and the final norm was folded into it
  int decode_skinny_gemms = 0;        // the step's GEMMs on the runtime's skinny GEMM
  int decode_gemms = 0;               // the step's GEMMs
  std::string decode_cache_dtype;     // "bf16" or "fp32"
  double decode_pattern_match = 0;    // generated tokens that follow the learned pattern
  uint64_t decode_peak_bytes = 0;     // the pool's peak with the KV cache (peak_bytes: before)
  Breakdown decode_profile;           // one more decode step, eager (profiled: --profile)
};

DemoRun run_demo(Runtime& runtime, const DemoSlots& slots, const DemoOptions& options);
// Throws kInvalidInput unless steps, batch, eval batches >= 1 and the prompt fits the sequence.
void check_demo_options(const DemoOptions& options);
// run_device_demo's decode shape: decode_batch 0 -> 64 for models of hidden size 1024 and more
// (qwen3-0.6b and larger), 8 below (tiny: the quick start stays fast); decode_context 0 -> 2048
// capped by the model's seq (the rotary table's length), or no decode (context -1) when the
// seq is below kMinDecodeContext. Throws kInvalidInput (naming --decode-batch /
// --decode-context) unless the batch is 1..4096 and the context kMinDecodeContext..seq.
struct DecodeShape {
  int batch = 0;
  int context = 0;  // -1: no decode
};
DecodeShape resolve_decode(const DemoOptions& options);
inline constexpr int kMinDecodeContext = 8;
// How a decode context splits: the generated tokens (half the context, at most 256: enough
// steps to time, at a context near the full one), the rest is the prompt.
int decode_generated_tokens(int context);
// Entropy of the generator's next-token distribution (nats): the best loss any model reaches.
float generator_entropy(int vocab, double follow);
// Milliseconds of the host clock since t0.
double ms_since(std::chrono::steady_clock::time_point t0);

class BigramData;
// Both runs' greedy continuation of a held-out prompt of len tokens, one full forward per new
// token (no KV cache): run.prompt, generated, pattern_match and generate_ms. next_token(seq) is
// the model's argmax after seq.
void greedy_continuation(BigramData& held_out, const DemoOptions& options, int len, DemoRun& run,
                         const std::function<int64_t(const std::vector<int64_t>&)>& next_token);

// The same run with the model resident on CUDA device options.cuda_ordinal (device_model.h):
// random init on the device, or options.weights; slots from add_device_demo_slots.
DemoRun run_device_demo(Runtime& runtime, const DemoSlots& slots, const DemoOptions& options);

// Which list of a device run a reported slot goes to: kPackage when its package's ops ran
// (`called`), kRuntime when the runtime's own implementation served it (not called: nothing bound,
// the package refused, or the model runs its own, as the fp32 model does for Attention), kNeither
// for a decode slot that was bound, not refused and never called because another decode slot did
// its work (PagedAttention and PagedKVAppend under PagedAttentionWithKVAppend, or the fused one
// when the two ran apart): nothing of it ran.
enum class SlotServed : uint8_t { kPackage, kRuntime, kNeither };
SlotServed slot_served(const std::string& slot, bool called, bool refused, bool bound);

}  // namespace kh::demo
