// The demo's language model: a Llama / Qwen2 / Qwen3 decoder (model_config.h) in fp32 on the
// host, written against the kh::Runtime layer table.
//
// RMSNorm (the layer norms, the final norm and Qwen3's per-head q_norm / k_norm),
// RotaryEmbedding (NeoX), SiluAndMul, Attention (causal, GQA) and CrossEntropy are slots (a
// package kernel or the runtime's fallback, whichever the table binds); the embedding and the
// linear layers are the runtime's own code with a manual backward (layers.h). The runtime's mode
// picks the argument lists: in train mode the slots' forward_train ops run (RMSNorm saves rstd,
// Attention its lse, CrossEntropy writes dlogits) and backward() may follow; in eval mode the
// plain forward ops run.
//
// Parameters are stored as the checkpoint stores them, by Transformers name and shape
// (weight_specs()), so loading is a copy and the per-layer math below reads one weight map:
// layer_forward / layer_backward are the whole decoder layer, in the order a device runtime
// mirrors.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kernel_hub/kernel_hub.hpp"
#include "tools/demo/fallback_ops.h"
#include "tools/demo/model_config.h"
#include "tools/demo/staging.h"

namespace kh::demo {

// AdamW as torch.optim.AdamW: decoupled weight decay (w -= lr * weight_decay * w) before the
// Adam update with bias corrections. weight_decay 0 is Adam.
struct AdamConfig {
  float lr = 1e-2f;
  float beta1 = 0.9f;
  float beta2 = 0.99f;
  float eps = 1e-8f;
  float weight_decay = 0.f;
};

class CausalLM {
 public:
  // Parameters drawn from `seed` (same seed, same model). Throws kInvalidInput on a bad config.
  CausalLM(const ModelConfig& config, const DemoSlots& slots, uint64_t seed);
  // Parameters from a checkpoint's tensors (by Transformers name, fp32, weight_specs() shapes;
  // checkpoint.h checks them). Throws kInvalidInput naming a missing or misshapen tensor.
  CausalLM(const ModelConfig& config, const DemoSlots& slots,
           std::map<std::string, std::vector<float>> weights);

  // Runs `batch` sequences of `len` tokens. With targets, returns the mean cross-entropy (the
  // CrossEntropy slot); without, 0 (logits only). The runtime's current mode decides eval or
  // train; a train forward keeps what backward() needs.
  float forward(SlotCaller& call, const Runtime& runtime, const int64_t* tokens,
                const int64_t* targets, int batch, int len);
  // Gradients of the mean loss of the last train forward (with targets), added to the
  // parameters' gradients.
  void backward(SlotCaller& call);
  void zero_grad();
  void adam_step(const AdamConfig& adam);

  // [batch * len, vocab] of the last forward.
  const std::vector<float>& logits() const { return logits_; }
  size_t num_parameters() const;
  const ModelConfig& config() const { return cfg_; }
  // A parameter by Transformers name, nullptr when the model has none of that name.
  const std::vector<float>* weight(const std::string& name) const;

 private:
  // A parameter and (allocated on first use: eval-only runs of large models need none) its
  // gradient and AdamW moments.
  struct Param {
    std::vector<float> w, g, m, v;
  };
  // The tensors of one decoder layer; optional ones (biases, q/k norms) are nullptr when the
  // architecture has none.
  struct Layer {
    Param *attn_norm, *wq, *wk, *wv, *bq, *bk, *bv, *q_norm, *k_norm, *wo, *bo, *mlp_norm, *wgate,
        *wup, *wdown;
  };
  // Activations of one layer kept for backward.
  struct Saved {
    std::vector<float> h_in, rstd1, a, q_pre, k_pre, rstd_q, rstd_k, q, k, v, attn, lse, h_mid,
        rstd2, m, gu, s;
  };

  void build(std::map<std::string, std::vector<float>>* weights, uint64_t seed);
  Param& param(const std::string& name);
  Param* optional_param(const std::string& name);
  void layer_forward(SlotCaller& call, Layer& L, Saved& s, std::vector<float>& h);
  void layer_backward(SlotCaller& call, Layer& L, Saved& s, std::vector<float>& dh);
  // RMSNorm slot over `rows` rows of w's length (the hidden size, or head_dim for q/k norms).
  void norm_forward(SlotCaller& call, const std::vector<float>& x, const Param& w,
                    std::vector<float>& y, std::vector<float>& rstd);
  void norm_backward(SlotCaller& call, const std::vector<float>& dy, const std::vector<float>& x,
                     Param& w, const std::vector<float>& rstd, std::vector<float>& dx);
  void linear(const std::vector<float>& x, const Param& w, const Param* b, std::vector<float>& y,
              int64_t in, int64_t out);
  void linear_grad(const std::vector<float>& x, Param& w, Param* b, const std::vector<float>& dy,
                   std::vector<float>& dx, int64_t in, int64_t out, bool accumulate_dx);
  void rotary(SlotCaller& call, bool backward, std::vector<float>& q, std::vector<float>& k);
  double attention_scale() const;
  void attention_forward(SlotCaller& call, Saved& s);
  void attention_backward(SlotCaller& call, const Saved& s, const std::vector<float>& dout,
                          std::vector<float>& dq, std::vector<float>& dk, std::vector<float>& dv);
  int64_t tokens() const { return static_cast<int64_t>(tokens_.size()); }

  ModelConfig cfg_;
  DemoSlots slots_;
  std::vector<WeightSpec> specs_;
  std::vector<Param> params_;  // in specs_ order; never resized after build (Layer points in)
  Param *emb_ = nullptr, *final_norm_ = nullptr, *head_ = nullptr;  // head_ == emb_ when tied
  std::vector<Layer> layers_;
  std::vector<float> cos_, sin_;  // rotary cache [seq, head_dim / 2]
  int64_t adam_t_ = 0;

  // The last forward.
  bool train_ = false;
  bool has_targets_ = false;
  int batch_ = 0, len_ = 0;
  std::vector<int64_t> tokens_, targets_, positions_;
  std::vector<Saved> saved_;
  std::vector<float> h_last_, rstd_f_, f_, logits_, loss_, dlogits_;
  std::vector<float> dweight_, workspace_;  // RMSNorm backward outputs (per call)
  std::vector<float> attn_workspace_;       // Attention backward scratch
};

}  // namespace kh::demo
