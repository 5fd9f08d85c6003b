// A tiny transformer language model in fp32, written against the kh::Runtime layer table:
//
//   tokens -> embedding -> L x [ RMSNorm -> q,k,v (linear) -> RotaryEmbedding (NeoX) on q,k
//                                -> Attention (causal) -> o (linear) -> + residual
//                              RMSNorm -> gate|up (linear) -> SiluAndMul -> down (linear)
//                                -> + residual ]
//          -> RMSNorm -> LM head (linear) -> CrossEntropy
//
// RMSNorm, RotaryEmbedding, SiluAndMul, CrossEntropy and Attention are slots (a package kernel
// or the runtime's fallback, whichever the table binds); everything else is the runtime's own
// code with a manual backward (layers.h). The runtime's mode picks the argument lists: in train
// mode the slots' forward_train ops run (RMSNorm saves rstd, Attention its lse, CrossEntropy
// writes dlogits) and backward() may follow; in eval mode the plain forward ops run.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "kernel_hub/kernel_hub.hpp"
#include "tools/demo/fallback_ops.h"
#include "tools/demo/staging.h"

namespace kh::demo {

struct ModelConfig {
  int vocab = 256;
  int hidden = 64;
  int layers = 2;
  int heads = 4;  // head_dim = hidden / heads = 16
  int ffn = 128;  // SiluAndMul width (gate|up is 2 * ffn)
  int seq = 32;   // the longest sequence (rotary cache rows)
  float eps = 1e-5f;
  double rope_base = 10000.0;
  int head_dim() const { return hidden / heads; }
};

struct AdamConfig {
  float lr = 1e-2f;
  float beta1 = 0.9f;
  float beta2 = 0.99f;
  float eps = 1e-8f;
};

class TinyLM {
 public:
  // Parameters drawn from `seed` (same seed, same model). Throws kInvalidInput on a bad config.
  TinyLM(const ModelConfig& config, const DemoSlots& slots, uint64_t seed);

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

 private:
  struct Param {
    std::vector<float> w, g, m, v;
  };
  struct Layer {
    Param attn_norm, wq, wk, wv, wo, mlp_norm, wgu, wdown;
  };
  // Activations of one layer kept for backward.
  struct Saved {
    std::vector<float> h_in, rstd1, a, q, k, v, attn, lse, h_mid, rstd2, m, gu, s;
  };

  void init(Param& p, size_t n, float stddev, std::mt19937_64& rng);
  void init_const(Param& p, size_t n, float value);
  std::vector<Param*> params();
  void norm_forward(SlotCaller& call, const std::vector<float>& x, const Param& w,
                    std::vector<float>& y, std::vector<float>& rstd);
  void norm_backward(SlotCaller& call, const std::vector<float>& dy, const std::vector<float>& x,
                     Param& w, const std::vector<float>& rstd, std::vector<float>& dx);
  // The Attention slot on s.q, s.k, s.v (after rotary) into s.attn (and s.lse in train mode).
  double attention_scale() const;
  void attention_forward(SlotCaller& call, Saved& s);
  void attention_backward(SlotCaller& call, const Saved& s, const std::vector<float>& dout,
                          std::vector<float>& dq, std::vector<float>& dk, std::vector<float>& dv);

  ModelConfig cfg_;
  DemoSlots slots_;
  Param emb_, final_norm_, head_;
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
