// The GPU-resident runtime's model: the demo's Llama / Qwen2 / Qwen3 decoder (model.h) with its
// parameters, their gradients and AdamW moments and every activation on one CUDA device, every
// op ordered on one stream, nothing staged through the host.
//
// Two precisions, chosen at construction: fp32 (everything fp32: logits, losses and training
// steps match the host model's) and bf16 as Transformers trains: fp32 master weights, gradients
// and AdamW moments, a bf16 copy of every parameter (written by the AdamW kernel) that the GEMMs
// (bf16 in, fp32 accumulation) and the slots take, and bf16 activations between ops, the
// residual stream included, with fp32 math inside the kernels. Per-row statistics (rstd, lse,
// per-token losses) stay fp32.
//
// The train loss never materialises the [tokens, vocab] logits: a train forward with targets
// runs the FusedLinearCrossEntropy slot when a package serves it, else the runtime's own chunked
// LM head + cross-entropy (loss_chunk_rows tokens at a time through kh_gemm); either way it
// computes the gradients of the mean loss for the final hidden states and the LM head right
// away (as Liger's fused linear cross-entropy does), and backward() goes on from there.
//
// Each slot (RMSNorm, RotaryEmbedding, SiluAndMul, Attention, CrossEntropy,
// FusedLinearCrossEntropy) runs what the runtime's table holds for the device in the runtime's
// mode: a package kernel bound there gets device DLTensors and the stream (the host model's
// argument lists; train mode: forward_train, and backward), the runtime's fallback runs as its
// device kernel (device_kernels.h). Attention binds the package only in bf16 (its cuda kernels
// take bf16/fp16; in fp32 the runtime's own attention runs). The embedding, the linear layers
// (kh_gemm), biases and residual adds are the runtime's own.
// gate_proj and up_proj are stored as one [2 * ffn, hidden] parameter, so one GEMM writes the
// [gate | up] rows SiluAndMul takes (AdamW is elementwise: the same update).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernel_hub/kernel_hub.hpp"
#include "tools/demo/device_decode.h"
#include "tools/demo/device_kernels.h"
#include "tools/demo/device_tensor.h"
#include "tools/demo/fallback_ops.h"
#include "tools/demo/model.h"
#include "tools/demo/model_config.h"

namespace kh::demo {

struct SkinnyPrenorm;     // skinny_gemm.h
struct SkinnyQkNormRope;  // skinny_gemm.h

struct DeviceModelOptions {
  DLDataType dtype = kF32;  // kF32 or kBF16: weights run and activations
  // Tokens a chunk of the train loss: the fused loss package's workspace holds this many rows of
  // logits, the runtime's own loss computes them this many at a time. 2048: +1.4% over 1024 at
  // Qwen3-0.6B's training shape, peak 21.6 GiB with lazy gradients (session 31, RESULTS.md).
  int64_t loss_chunk_rows = 2048;
  // Training's q, k and v projections as one GEMM each way where it applies (fused_qkv_trains);
  // false: three (the tests compare the two).
  bool fuse_qkv = true;
  // Training keeps each layer's normed inputs (the attention's and the MLP's) and its rotated q
  // and k for the backward (KeepNormed), which otherwise recomputes them: three fewer norm and
  // q/k-norm+RoPE passes a layer (+1.9% on an H100, session 34). Kept beside the inputs (kOn
  // without the FromOutput slots) they cost 168 MB a layer at Qwen3-0.6B's 8 x 2048 tokens (4.7
  // GB over 28 layers, peak 21.6 -> 26.0 GiB); with the FromOutput slots they replace the
  // residuals and the q/k projections (their backwards read the outputs) and cost nothing.
  // silu(gate) * up is recomputed either way.
  KeepNormed keep_normed = KeepNormed::kAuto;
};

// Device time of the ops of a profiled stretch (set_profiling), by kind: GEMMs (the linear
// layers and the LM head), attention (package or fallback), hub kernels (every other slot a
// package served); the rest (the runtime's own kernels, copies) is the caller's total minus these.
struct DeviceProfile {
  double gemm_ms = 0, attention_ms = 0, hub_ms = 0;
  std::map<std::string, double> hub_ms_by_slot;  // hub_ms split by slot name (forward + backward)
};

class DeviceCausalLM {
 public:
  // Copies `host`'s weights to CUDA device `device` and compiles the device kernels (JIT
  // cached). The runtime's table decides, per slot, package or fallback at each call.
  DeviceCausalLM(const CausalLM& host, const DemoSlots& slots, const Runtime& runtime, int device,
                 DeviceModelOptions options = {});
  // A model of `config` initialised at random on the device (init_stddev; never built on the
  // host), or from `weights` (a checkpoint's tensors by Transformers name, fp32) when not empty.
  DeviceCausalLM(const ModelConfig& config,
                 const std::map<std::string, std::vector<float>>& weights, uint64_t seed,
                 const DemoSlots& slots, const Runtime& runtime, int device,
                 DeviceModelOptions options = {});

  // Which logits a forward leaves on the device: every token's [batch * len, vocab] (the parity
  // tests), or each sequence's last token's [batch, vocab] (generation: all a prefill needs).
  enum class Logits : uint8_t { kAll, kLast };

  // batch sequences of len tokens (host arrays). The runtime's mode decides eval (prefill) or
  // train (keeps what backward() needs). With targets, returns the mean cross-entropy; without,
  // 0. Train with targets: the fused or chunked loss, no logits (logits() is empty), and the
  // gradients of the LM head (added to its gradient) and of the final hidden states computed.
  // Otherwise the logits stay on the device (logits()); eval with targets and Logits::kLast
  // takes the loss chunk by chunk too.
  float forward(const int64_t* tokens, const int64_t* targets, int batch, int len,
                Logits logits = Logits::kAll);
  // Gradients of the mean loss of the last train forward (with targets), added to the
  // parameters' gradients (none at construction; each layer's taken from the pool, zero, when
  // the backward reaches it).
  void backward();
  // Releases every gradient (PyTorch's zero_grad(set_to_none=True)): zero until the next
  // backward, and their memory free for the forward's activations.
  void zero_grad();
  // One AdamW step on every parameter (CausalLM::adam_step's arithmetic).
  void adam_step(const AdamConfig& adam);

  const DeviceTensor& logits() const { return logits_; }
  // As float32 (bf16 logits are widened on the device first).
  std::vector<float> download_logits();
  // A parameter's weights by Transformers name (gate_proj and up_proj are rows of the fused
  // parameter), downloaded.
  std::vector<float> download_weight(const std::string& name) {
    return download_param(name, false);
  }
  // Its fp32 gradient, likewise (after a backward; none after zero_grad).
  std::vector<float> download_grad(const std::string& name) { return download_param(name, true); }
  // Peak and current device memory of the model's pool.
  kh_device_pool_stats_t memory() const { return pool_.stats(); }
  // The device memory's read bandwidth (bytes/s) a plain streaming pass over `bytes` of the
  // model's pool reaches (DeviceKernels::read_bandwidth): the decode roofline's measured ceiling.
  double read_bandwidth(int64_t bytes) { return kernels_.read_bandwidth(stream_, pool_, bytes); }
  // The slots a package served in the last forward or backward ("RMSNorm", ...); the others ran
  // the runtime's device kernels.
  const std::vector<std::string>& package_slots() const { return package_slots_; }
  // Slots bound to a package that refused this model (its message): the runtime's kernels serve
  // them (the attention package's cuda kernels take head_dim 64, 128, 256, for instance).
  const std::map<std::string, std::string>& refusals() const { return refused_; }
  // How many layers the last forward (and the backward after it) ran on one q/k/v GEMM.
  int fused_qkv_layers() const { return fused_qkv_layers_; }
  DeviceStream& stream() { return stream_; }
  DLDataType dtype() const { return act_; }
  const ModelConfig& config() const { return cfg_; }
  size_t num_parameters() const;

  // While on, every GEMM, attention and package call is bracketed by device events;
  // take_profile() waits for the stream and returns the sums since the last take.
  void set_profiling(bool on) { profiling_ = on; }
  DeviceProfile take_profile();

  // ---- Eval decode with a paged KV cache (device_decode.h; device_decode.cpp) ----
  // Allocates the cache and the decode step's buffers. `runtime` is the one given at
  // construction (non-const: its table is declared capturing while the step graph is captured).
  void init_decode(Runtime& runtime, const DecodeConfig& config);
  // The eval forward of `batch` prompts of `len` tokens that also writes their K/V into the cache
  // (the sequences restart); logits() holds [batch * len, vocab] (kAll) or each sequence's last
  // [batch, vocab] (kLast: what generation needs). The first greedy token of each sequence is
  // left on the device for the next decode_step.
  void prefill(const int64_t* prompts, int batch, int len, Logits logits = Logits::kAll);
  // One decode step of the prefilled batch at each sequence's next position: `tokens` (host,
  // [batch]) or, for nullptr, the previous step's greedy tokens. graph: replay the captured step
  // (the first such call runs the step eagerly, which loads every op, then captures it).
  void decode_step(const int64_t* tokens, bool graph);
  // [batch, vocab] of the last decode step.
  std::vector<float> download_decode_logits();
  // Greedy continuation: prefill, then n - 1 decode steps; [batch * n] tokens, a row per
  // sequence. The decode steps are timed with CUDA events (last_decode_ms).
  std::vector<int64_t> generate(const int64_t* prompts, int batch, int len, int n,
                                bool graph = true);
  // The last generate()'s timed decode steps (all but the first: the warm-up and capture) and
  // their milliseconds (CUDA events): tokens/s = batch * steps / ms * 1000.
  double last_decode_ms() const;
  int last_decode_steps() const;
  // Whether the last decode step projected q, k and v with one GEMM in every layer (a bf16
  // Qwen3 whose attention and QKNormRotaryEmbedding packages are bound).
  bool decode_fuses_qkv() const;
  // ... and, in every layer too, appended the step's K and V in the attention's launch
  // (PagedAttentionWithKVAppend bound).
  bool decode_fuses_append() const;
  // Whether the last decode step's MLPs all ran SiluAndMul as the gate/up GEMM's epilogue
  // (DecodeFuse).
  bool decode_fuses_silu() const;
  // ... and its fused q/k/v GEMMs all ran the q/k norms and RoPE as their epilogue.
  bool decode_fuses_qk_norm() const;
  // ... and every residual add + RMSNorm between two projections was folded into them (the o and
  // down GEMMs add into the residual, the gate/up and next q/k/v GEMMs norm it as they load it).
  bool decode_fuses_norm() const;
  // Whether the last decode step's LM head ran the greedy argmax as its epilogue (one launch
  // for the logits and the tokens; Hopper, DecodeFuse::kOn), and the final norm with it.
  bool decode_fuses_head() const;
  bool decode_fuses_final_norm() const;
  // How many of the last decode step's GEMMs ran on the runtime's skinny GEMM (DecodeGemm).
  int decode_skinny_gemms() const;
  int decode_gemms() const;  // all of the last decode step's GEMMs
  // Whether the attention package serves decode (PagedKVAppend, PagedAttention bound).
  bool decode_uses_package() const;
  // Whether the prefilled batch's decode steps run as two overlapped halves (DecodeOverlap).
  bool decode_overlaps() const;
  // Whether a decode step graph is captured (for the current batch).
  bool decode_graph_captured() const;

 private:
  struct DecodeState;
  struct DecodeRows;
  struct DecodeStateDelete {  // defined where DecodeState is (device_decode.cpp)
    void operator()(DecodeState* d) const;
  };
  struct Param {
    DeviceTensor w, w16, g, m, v;  // fp32 master weights, bf16 copy (bf16 models), gradient,
                                   // AdamW moments
    // g is zero in value but not in memory (fresh from the pool: ensure_grad): its first write
    // overwrites it (the dW GEMM with beta 0, the norms' weight gradients as a copy), so a step
    // spends no pass over every gradient on zeroing it (take_zero, clear_if_zero). No g (none
    // since zero_grad): zero too.
    bool g_zero = false;
  };
  enum class Phase : uint8_t { kGemm, kAttention, kHub };
  static constexpr int64_t kIgnoreIndex = -100;  // as the host model: no target equals it
  using WeightSource = std::function<const std::vector<float>*(const std::string&)>;
  struct Layer {
    Param *attn_norm, *wq, *wk, *wv, *bq, *bk, *bv, *q_norm, *k_norm, *wo, *bo, *mlp_norm, *gate_up,
        *wdown;
    Param* qkv;  // q, k and v's run weights and gradients as one (their rows), or null (build)
  };
  // Activations of one layer kept for backward (train mode): the two residuals (the layer's
  // input h_in and h_mid after the attention branch; each is the FusedAddRMSNorm's new residual,
  // kept without a copy), what attention and the MLP's backward take, and per-row statistics.
  // With keep_normed (DeviceModelOptions) also the normed inputs of the attention and MLP
  // projections (attn_in, mlp_in) and q and k after their norm and RoPE; without it backward
  // recomputes those, as Liger and activation checkpointing do, to hold less at 16k tokens x 28
  // layers: an RMSNorm pass each and, with q/k-norm (Qwen3), q and k from q_pre and k_pre (two
  // norms and a rotary); without q/k-norm, q and k are kept after RoPE either way. silu(gate) *
  // up is always recomputed.
  //
  // The FromOutput slots (KeepNormed): norm_from_output, h_in and h_mid are not kept, and the
  // two norms' backwards read attn_in and mlp_in; qk_from_output, q and k were written in place
  // over the projections in qkv (or copied out of it into q and k, unfuse_qkv), rstd_q and
  // rstd_k kept, and the q/k norms' backward reads them.
  struct Saved {
    DeviceTensor h_in, rstd1, q_pre, k_pre, rstd_q, rstd_k, q, k, v, attn, lse, h_mid, rstd2, gu;
    DeviceTensor attn_in, mlp_in;  // empty unless kept (keep_normed)
    // Training's fused q/k/v projection [T, q_dim + 2 kv_dim] (fused_qkv_trains): its columns
    // are q_pre, k_pre and v (q and k with qk_from_output), which are then empty.
    DeviceTensor qkv;
    bool norm_from_output = false, qk_from_output = false;
  };
  // q_pre and k_pre ([T, heads, head_dim]) and v ([B, S, kv_heads, head_dim]) as strided views of
  // a fused q/k/v tensor (or of its gradient).
  struct QkvViews {
    StridedArg q, k, v;
    StridedArg q4, k4;  // q and k as [B, S, heads, head_dim] (the attention's layout)
  };

  // The members both public constructors set; they then build().
  DeviceCausalLM(const ModelConfig& config, const DemoSlots& slots, const Runtime& runtime,
                 int device, DeviceModelOptions options);
  // Uploads (source) or draws (no source: random init from seed) every parameter.
  void build(const WeightSource& source, uint64_t seed);
  const DeviceTensor& run(const Param& p) const { return bf16_ ? p.w16 : p.w; }
  // p's gradient from the pool if it has none (zero in value: Param::g_zero); a layer's all
  // together, the fused q/k/v's as one buffer whose rows are q's, k's and v's. Gradients live
  // from the backward that writes them to the next zero_grad.
  void ensure_grad(Param& p);
  void ensure_layer_grads(Layer& L);
  static void require_grad(const Param& p);  // throws unless p has its gradient
  // The mean loss of f_ @ head^T against targets_ without the full logits (package or chunks);
  // with grad, df_ and the head's gradient too.
  float fused_loss(bool grad);
  void last_token_logits();
  // The mean of loss_'s per-token losses, downloaded (waits for the stream).
  float mean_loss();
  // body(), bracketed by device events while profiling (take_profile sums them by phase).
  template <typename F>
  void timed(Phase phase, F&& body, const char* slot = nullptr) {
    if (!profiling_) {
      body();
      return;
    }
    const size_t start = profile_.size() * 2;
    while (events_.size() < start + 2) events_.push_back(std::make_unique<DeviceEvent>(device_));
    events_[start]->record(stream_);
    body();
    events_[start + 1]->record(stream_);
    profile_.push_back({phase, start, slot});
  }
  Param& param(const std::string& name);
  Param* optional_param(const std::string& name);
  std::vector<float> download_param(const std::string& name, bool gradient);
  bool bound(uint32_t slot) const;
  // Runs a bound slot's package op. false: the package refused the call (KH_ERR_UNSUPPORTED,
  // nothing written): the caller runs the runtime's kernel, and so does every later call of the
  // slot (refusals()). Any other failure throws.
  bool call_slot(uint32_t slot, const char* name, bool backward, const std::vector<kh_arg_t>& args);
  DeviceTensor empty(std::vector<int64_t> shape, DLDataType dtype = kF32);
  DeviceTensor act(std::vector<int64_t> shape) { return empty(std::move(shape), act_); }
  // p's gradient (fp32) += d (fp32 or bf16), or = d where it is marked zero. A bf16 d (the
  // packages' norm weight gradients, about 4 a layer) waits in pending_grads_ for flush_grads.
  void add_grad(Param& p, const DeviceTensor& d);
  // The pending bf16 gradient adds in one launch (kh_grad_add_multi) instead of a tiny kernel
  // each, and a GEMM's launch gap after each: the end of backward, and before a gradient is read.
  void flush_grads();
  // Before a write of p's gradient: whether it is marked zero, which the write must then
  // overwrite (the mark goes either way).
  bool take_zero(Param& p);
  // Before a write that can only add (the embedding's scatter, a bias's column sums): the
  // gradient's memory cleared if it is marked zero.
  void clear_if_zero(Param& p);
  void linear(const DeviceTensor& x, const Param& w, const Param* bias, DeviceTensor& y);
  void linear_grad(const DeviceTensor& x, Param& w, Param* bias, const DeviceTensor& dy,
                   DeviceTensor* dx, bool accumulate_dx);
  // RMSNorm over rows of w's length; rstd (train) may be null.
  void norm(const DeviceTensor& x, const Param& w, DeviceTensor& y, DeviceTensor* rstd);
  // norm() of what backward recomputes (train mode: the slot's forward_train, rstd discarded).
  void renorm(const DeviceTensor& x, const Param& w, DeviceTensor& y);
  // A layer's normed input for its backward: `kept` (taken, left empty) if the forward kept it,
  // else x normalised again.
  DeviceTensor normed_input(DeviceTensor& kept, const DeviceTensor& x, const Param& w);
  DeviceTensor norm_workspace(int64_t rows, int64_t cols);  // the norm backward's partial rows
  void norm_backward(const DeviceTensor& dy, const DeviceTensor& x, Param& w,
                     const DeviceTensor& rstd, DeviceTensor& dx);
  // The pre-norm of a residual stream held as residual + branch (branch empty: nothing to add):
  // returns the new residual (a new block in train mode, which backward keeps; in eval,
  // residual itself, updated in place) and writes y = RMSNorm(new residual) and, in train, rstd.
  // FusedAddRMSNorm when a package serves it, else the runtime's add and the RMSNorm slot.
  DeviceTensor add_norm(const DeviceTensor& branch, DeviceTensor residual, const Param& w,
                        DeviceTensor& y, DeviceTensor* rstd);
  // Its backward: dx = the norm's input gradient for dy + dresidual (the gradient arriving at
  // the new residual; may be null), the gradient of both the old residual and the branch.
  // from_output: residual_out is the norm's output y instead (FusedAddRMSNormFromOutput, which
  // must serve: the residual is gone).
  void add_norm_backward(const DeviceTensor& dy, const DeviceTensor* dresidual,
                         const DeviceTensor& residual_out, Param& w, const DeviceTensor& rstd,
                         DeviceTensor& dx, bool from_output = false);
  // Whether the train forward keeps the two norms' outputs (options_.keep_normed), and whether
  // it keeps them instead of the residuals (FusedAddRMSNormFromOutput serves).
  bool keeps_normed_inputs() const;
  bool norms_from_output() const;
  // QKNormRotaryEmbeddingFromOutput's forward in place over s.qkv's q and k columns, rstd into
  // s.rstd_q and s.rstd_k (true: done, s.qk_from_output); false: not bound or refused.
  bool qknr_forward_in_place(const Layer& L, Saved& s);
  // q and k of a layer ([T, q_dim] and [T, kv_dim]) after the q/k-norm (Qwen3) and RoPE. In
  // training, QKNormRotaryEmbedding's package op when bound (true: rstd_q and rstd_k were not
  // written; its backward recomputes them), else the RMSNorm and RotaryEmbedding slots.
  bool qk_from_projections(const Layer& L, const DeviceTensor& q_pre, const DeviceTensor& k_pre,
                           DeviceTensor& q, DeviceTensor& k, DeviceTensor* rstd_q,
                           DeviceTensor* rstd_k);
  // QKNormRotaryEmbedding's package op in training: q and k ([T, q_dim] and [T, kv_dim]) from
  // the projections qi and ki ([T, heads, head_dim], any 16-byte-aligned strides); false: not
  // bound or refused (nothing written).
  bool qknr_forward(const Layer& L, kh_arg_t qi, kh_arg_t ki, DeviceTensor& q, DeviceTensor& k);
  // Its backward, from dq3 and dk3 (the gradients of q and k, [T, heads, head_dim]) into dqi and
  // dki (qi's and ki's layout), the weights' gradients added; false: not bound or refused.
  // from_output: QKNormRotaryEmbeddingFromOutput's, qi and ki the forward's rotated q and k and
  // the rstd from_output's; a refusal throws (the projections are gone).
  bool qknr_backward(Layer& L, kh_arg_t qi, kh_arg_t ki, const DeviceTensor& dq3,
                     const DeviceTensor& dk3, kh_arg_t dqi, kh_arg_t dki,
                     const Saved* from_output = nullptr);
  // Whether layer L trains on one q/k/v GEMM (Layer::qkv, the q/k norms, QKNormRotaryEmbedding
  // and the attention package bound): the three projections' GEMMs forward, and their dx and dW
  // GEMMs backward, each become one wider GEMM.
  bool fused_qkv_trains(const Layer& L) const;
  QkvViews qkv_views(const DeviceTensor& qkv) const;
  // s.qkv's columns copied into s.q_pre, s.k_pre (s.q, s.k with qk_from_output) and s.v, s.qkv
  // released: a package refused (its slot is then off, call_slot) and the unfused path, with the
  // runtime's own kernels for it, takes over.
  void unfuse_qkv(Saved& s);
  void rotary(DeviceTensor& q3, DeviceTensor& k3, bool backward);
  void silu_and_mul(const DeviceTensor& gu, DeviceTensor& out);
  // h + branch: the residual stream into the layer (branch: the previous layer's MLP output,
  // added by this layer's first norm; empty for the first layer), and out of it.
  void layer_forward(Layer& L, Saved& s, DeviceTensor& h, DeviceTensor& branch);
  void prefill_kv(const Layer& L, const Saved& s);  // layer_forward's hook while prefilling
  void decode_launch();                             // the step's work, eager or captured
  template <typename F>
  void on_stream(DeviceStream& other, F&& body);  // body() with other swapped in for stream_
  template <typename F>
  void on_branch(DeviceStream& branch, DeviceEvent& joined, F&& body);  // decode's forks
  // One layer of a decode step for the rows r holds (the batch, or one half of it).
  void decode_layer(size_t layer, DecodeRows& r);
  void decode_projections(size_t layer, DecodeRows& r);  // q, k, v apart, then the attention
  bool fused_qkv_applies(const Layer& L) const;
  SkinnyQkNormRope qk_norm_rope_epilogue(const Layer& L, const DecodeRows& r) const;
  bool decode_fused_qkv(size_t layer, DecodeRows& r,  // with Layer::qkv, or false (see .cpp)
                        const SkinnyPrenorm* pre);
  void decode_mlp(size_t layer, DecodeRows& r);  // from the attention output on
  void fold_norm_weights();  // DecodeState's folded-norm weights, when the weights changed
  void decode_gate_up(const Layer& L, DecodeRows& r);  // its o, norm and gate/up, unfolded
  void decode_linear(const DeviceTensor& x, const Param& w, const Param* bias, DeviceTensor& y);
  bool decode_head_argmax(bool fold_norm);  // the LM head and argmax in one launch, if taken
  void decode_append(size_t layer, const DeviceTensor& k4, const DeviceTensor& v4,
                     const DecodeRows& r);
  void decode_attend(size_t layer, const DeviceTensor& q4, DeviceTensor& out4, DecodeRows& r);
  void layer_backward(Layer& L, Saved& s, DeviceTensor& dh);
  float attention_scale() const;
  bool attention_bound() const;

  ModelConfig cfg_;
  DeviceModelOptions options_;
  DLDataType act_;
  bool bf16_;
  DemoSlots slots_;
  const Runtime& runtime_;
  int device_;
  DevicePool pool_;
  DeviceStream stream_;
  DeviceKernels kernels_;
  // This GPU's multiprocessors (the norm backward's workspace rows: norm_workspace).
  int64_t multiprocessors_;
  std::map<std::string, Param> params_;  // by Transformers name; "…mlp.gate_up" for the fused one
  std::vector<Param> qkv_;  // per layer, w16 and g only: the q, k and v weights' and gradients'
                            // shared rows (build, ensure_layer_grads)
  std::vector<Layer> layers_;
  Param *emb_ = nullptr, *final_norm_ = nullptr, *head_ = nullptr;
  DeviceTensor cos_, sin_;
  int64_t adam_t_ = 0;
  // The multi-tensor AdamW's table (DeviceKernels::adamw_table) and its device copy.
  std::vector<KhAdamwTensor> adam_table_host_;
  DeviceTensor adam_table_;

  // The last forward.
  bool train_ = false;
  bool has_targets_ = false;
  int batch_ = 0, len_ = 0;
  DeviceTensor tokens_, targets_, positions_;
  std::vector<Saved> saved_;
  DeviceTensor h_last_, rstd_f_, f_, logits_, loss_, df_;
  std::vector<std::string> package_slots_;
  int fused_qkv_layers_ = 0;
  struct PendingGrad {
    Param* p;
    DeviceTensor d;  // bf16, p's shape; alive until the flush
    bool overwrite;  // p's gradient was zero in value
  };
  std::vector<PendingGrad> pending_grads_;
  std::vector<KhGradAdd> pending_table_host_;  // the flush's KhGradAdd table
  DeviceTensor pending_table_;                 // ... its device copy
  std::map<std::string, std::string> refused_;

  bool profiling_ = false;
  std::vector<std::unique_ptr<DeviceEvent>> events_;  // reused; pairs from profile_ index
  struct Timing {
    Phase phase;
    size_t start;      // index of the start event in events_
    const char* slot;  // the slot a hub-kernel timing belongs to, or null
  };
  std::vector<Timing> profile_;

  // Decode (device_decode.cpp): the cache, the step's buffers and its graph.
  bool prefilling_kv_ = false;
  std::unique_ptr<DecodeState, DecodeStateDelete> decode_;  // last: its tensors go before the pool
};

}  // namespace kh::demo
