#include "tools/demo/model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "kernel_hub/kernel_hub.hpp"
#include "tools/demo/layers.h"

namespace kh::demo {

namespace {

// Targets never equal this, so no token is ignored; the CE ops still take the argument.
constexpr int64_t kIgnoreIndex = -100;

void add_into(std::vector<float>& dst, const std::vector<float>& src) {
  for (size_t i = 0; i < dst.size(); ++i) dst[i] += src[i];
}

// Box-Muller over the raw engine: std::normal_distribution differs between standard libraries.
void fill_normal(std::vector<float>& w, float stddev, std::mt19937_64& rng) {
  for (float& x : w) {
    const double u1 = (static_cast<double>(rng() >> 11) + 1.0) * 0x1.0p-53;
    const double u2 = static_cast<double>(rng() >> 11) * 0x1.0p-53;
    x = static_cast<float>(stddev * std::sqrt(-2.0 * std::log(u1)) *
                           std::cos(6.283185307179586 * u2));
  }
}

size_t numel(const WeightSpec& s) {
  size_t n = 1;
  for (int64_t d : s.shape) n *= static_cast<size_t>(d);
  return n;
}

}  // namespace

CausalLM::CausalLM(const ModelConfig& config, const DemoSlots& slots, uint64_t seed)
    : cfg_(config), slots_(slots) {
  build(nullptr, seed);
}

CausalLM::CausalLM(const ModelConfig& config, const DemoSlots& slots,
                   std::map<std::string, std::vector<float>> weights)
    : cfg_(config), slots_(slots) {
  build(&weights, 0);
}

void CausalLM::build(std::map<std::string, std::vector<float>>* weights, uint64_t seed) {
  cfg_.validate();
  specs_ = weight_specs(cfg_);
  params_.resize(specs_.size());
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < specs_.size(); ++i) {
    const WeightSpec& s = specs_[i];
    std::vector<float>& w = params_[i].w;
    if (weights) {
      auto it = weights->find(s.name);
      if (it == weights->end())
        throw Error(ErrorKind::kInvalidInput,
                    fmt::format("model {}: no tensor {}", cfg_.name, s.name));
      if (it->second.size() != numel(s))
        throw Error(ErrorKind::kInvalidInput,
                    fmt::format("model {}: tensor {} has {} elements; expected {}", cfg_.name,
                                s.name, it->second.size(), numel(s)));
      w = std::move(it->second);
      continue;
    }
    w.resize(numel(s));
    const float stddev = init_stddev(cfg_, s.name);
    if (stddev > 0.f)
      fill_normal(w, stddev, rng);
    else
      std::fill(w.begin(), w.end(), s.name.ends_with(".bias") ? 0.f : 1.f);
  }

  emb_ = &param("model.embed_tokens.weight");
  final_norm_ = &param("model.norm.weight");
  head_ = cfg_.tie_embeddings ? emb_ : &param("lm_head.weight");
  layers_.resize(static_cast<size_t>(cfg_.layers));
  for (int l = 0; l < cfg_.layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    layers_[static_cast<size_t>(l)] = {
        &param(p + "input_layernorm.weight"),
        &param(p + "self_attn.q_proj.weight"),
        &param(p + "self_attn.k_proj.weight"),
        &param(p + "self_attn.v_proj.weight"),
        optional_param(p + "self_attn.q_proj.bias"),
        optional_param(p + "self_attn.k_proj.bias"),
        optional_param(p + "self_attn.v_proj.bias"),
        optional_param(p + "self_attn.q_norm.weight"),
        optional_param(p + "self_attn.k_norm.weight"),
        &param(p + "self_attn.o_proj.weight"),
        optional_param(p + "self_attn.o_proj.bias"),
        &param(p + "post_attention_layernorm.weight"),
        &param(p + "mlp.gate_proj.weight"),
        &param(p + "mlp.up_proj.weight"),
        &param(p + "mlp.down_proj.weight"),
    };
  }

  rope_tables(cfg_, cos_, sin_);
}

CausalLM::Param& CausalLM::param(const std::string& name) {
  if (Param* p = optional_param(name)) return *p;
  throw Error(ErrorKind::kInvalidInput, fmt::format("model {}: no tensor {}", cfg_.name, name));
}

CausalLM::Param* CausalLM::optional_param(const std::string& name) {
  for (size_t i = 0; i < specs_.size(); ++i)
    if (specs_[i].name == name) return &params_[i];
  return nullptr;
}

const std::vector<float>* CausalLM::weight(const std::string& name) const {
  Param* p = const_cast<CausalLM*>(this)->optional_param(name);
  return p ? &p->w : nullptr;
}

size_t CausalLM::num_parameters() const {
  size_t n = 0;
  for (const Param& p : params_) n += p.w.size();
  return n;
}

// ---- the layers' calls -------------------------------------------------------------------------

void CausalLM::norm_forward(SlotCaller& call, const std::vector<float>& x, const Param& w,
                            std::vector<float>& y, std::vector<float>& rstd) {
  const int64_t C = static_cast<int64_t>(w.w.size()), R = static_cast<int64_t>(x.size()) / C;
  y.resize(x.size());
  if (train_) {
    rstd.resize(static_cast<size_t>(R));
    call.forward(slots_.rms_norm, {in(x.data(), {R, C}), in(w.w.data(), {C}), real(cfg_.eps),
                                   out(y.data(), {R, C}), out(rstd.data(), {R})});
  } else {
    call.forward(slots_.rms_norm, {in(x.data(), {R, C}), in(w.w.data(), {C}), real(cfg_.eps),
                                   out(y.data(), {R, C})});
  }
}

void CausalLM::norm_backward(SlotCaller& call, const std::vector<float>& dy,
                             const std::vector<float>& x, Param& w, const std::vector<float>& rstd,
                             std::vector<float>& dx) {
  const int64_t C = static_cast<int64_t>(w.w.size()), R = static_cast<int64_t>(x.size()) / C;
  // The package reduces dweight through W partial rows; W bounds its parallelism on a GPU.
  const int64_t W = std::min<int64_t>(R, 64);
  dx.resize(dy.size());
  dweight_.resize(static_cast<size_t>(C));
  workspace_.resize(static_cast<size_t>(W * C));
  call.backward(slots_.rms_norm, {in(dy.data(), {R, C}), in(x.data(), {R, C}), in(w.w.data(), {C}),
                                  in(rstd.data(), {R}), out(dx.data(), {R, C}),
                                  out(dweight_.data(), {C}), scratch(workspace_.data(), {W, C})});
  add_into(w.g, dweight_);  // the op overwrites dweight; the runtime accumulates
}

void CausalLM::linear(const std::vector<float>& x, const Param& w, const Param* b,
                      std::vector<float>& y, int64_t in, int64_t out) {
  y.resize(static_cast<size_t>(tokens() * out));
  linear_forward(x.data(), w.w.data(), b ? b->w.data() : nullptr, y.data(), tokens(), in, out);
}

void CausalLM::linear_grad(const std::vector<float>& x, Param& w, Param* b,
                           const std::vector<float>& dy, std::vector<float>& dx, int64_t in,
                           int64_t out, bool accumulate_dx) {
  dx.resize(static_cast<size_t>(tokens() * in));
  linear_backward(x.data(), w.w.data(), dy.data(), dx.data(), w.g.data(), b ? b->g.data() : nullptr,
                  tokens(), in, out, accumulate_dx);
}

void CausalLM::rotary(SlotCaller& call, bool backward, std::vector<float>& q,
                      std::vector<float>& k) {
  const int64_t T = tokens(), HD = cfg_.head_dim;
  const OpArgs args = {in_i64(positions_.data(), T),
                       inout(q.data(), {T, cfg_.heads, HD}),
                       inout(k.data(), {T, cfg_.kv_heads, HD}),
                       in(cos_.data(), {cfg_.seq, HD / 2}),
                       in(sin_.data(), {cfg_.seq, HD / 2}),
                       integer(1)};  // NeoX (rotate_half)
  if (backward)
    call.backward(slots_.rotary, args);
  else
    call.forward(slots_.rotary, args);
}

double CausalLM::attention_scale() const {
  return 1.0 / std::sqrt(static_cast<double>(cfg_.head_dim));  // Transformers: head_dim**-0.5
}

void CausalLM::attention_forward(SlotCaller& call, Saved& s) {
  const int64_t B = batch_, S = len_, NH = cfg_.heads, NKV = cfg_.kv_heads, HD = cfg_.head_dim,
                T = B * S;
  // Padded causal batches: no cu_seqlens, no window; train keeps the lse for backward.
  s.attn.resize(static_cast<size_t>(T * NH * HD));
  if (train_) s.lse.resize(static_cast<size_t>(NH * T));
  call.forward(slots_.attention,
               {in(s.q.data(), {B, S, NH, HD}), in(s.k.data(), {B, S, NKV, HD}),
                in(s.v.data(), {B, S, NKV, HD}), none(), none(), integer(S), integer(1),
                integer(-1), real(attention_scale()), out(s.attn.data(), {B, S, NH, HD}),
                train_ ? out(s.lse.data(), {NH, T}) : none()});
}

void CausalLM::attention_backward(SlotCaller& call, const Saved& s, const std::vector<float>& dout,
                                  std::vector<float>& dq, std::vector<float>& dk,
                                  std::vector<float>& dv) {
  const int64_t B = batch_, S = len_, NH = cfg_.heads, NKV = cfg_.kv_heads, HD = cfg_.head_dim,
                T = B * S;
  dq.resize(static_cast<size_t>(T * NH * HD));
  dk.resize(static_cast<size_t>(T * NKV * HD));
  dv.resize(dk.size());
  // The package's cuda backward sums dq through an fp32 workspace of T * NH * (HD + 1).
  attn_workspace_.resize(static_cast<size_t>(T * NH * (HD + 1)));
  call.backward(
      slots_.attention,
      {in(dout.data(), {B, S, NH, HD}), in(s.q.data(), {B, S, NH, HD}),
       in(s.k.data(), {B, S, NKV, HD}), in(s.v.data(), {B, S, NKV, HD}),
       in(s.attn.data(), {B, S, NH, HD}), in(s.lse.data(), {NH, T}), none(), none(), integer(S),
       integer(S), integer(1), integer(-1), real(attention_scale()), out(dq.data(), {B, S, NH, HD}),
       out(dk.data(), {B, S, NKV, HD}), out(dv.data(), {B, S, NKV, HD}),
       scratch(attn_workspace_.data(), {static_cast<int64_t>(attn_workspace_.size())})});
}

// ---- one decoder layer ------------------------------------------------------------------------

// h -> h + o(attention(rope(norm_q(q)), rope(norm_k(k)), v)) with q, k, v of
// input_layernorm(h); then h -> h + down(silu(gate(m)) * up(m)), m = post_attention_layernorm(h).
void CausalLM::layer_forward(SlotCaller& call, Layer& L, Saved& s, std::vector<float>& h) {
  const int64_t H = cfg_.hidden, Q = cfg_.q_dim(), KV = cfg_.kv_dim(), F = cfg_.ffn, T = tokens();
  s.h_in = h;
  norm_forward(call, h, *L.attn_norm, s.a, s.rstd1);
  linear(s.a, *L.wv, L.bv, s.v, H, KV);
  if (cfg_.qk_norm) {  // Qwen3: RMSNorm over each head's head_dim, before RoPE
    linear(s.a, *L.wq, L.bq, s.q_pre, H, Q);
    linear(s.a, *L.wk, L.bk, s.k_pre, H, KV);
    norm_forward(call, s.q_pre, *L.q_norm, s.q, s.rstd_q);
    norm_forward(call, s.k_pre, *L.k_norm, s.k, s.rstd_k);
  } else {
    linear(s.a, *L.wq, L.bq, s.q, H, Q);
    linear(s.a, *L.wk, L.bk, s.k, H, KV);
  }
  rotary(call, false, s.q, s.k);
  attention_forward(call, s);
  std::vector<float> branch;
  linear(s.attn, *L.wo, L.bo, branch, Q, H);
  add_into(h, branch);

  s.h_mid = h;
  norm_forward(call, h, *L.mlp_norm, s.m, s.rstd2);
  std::vector<float> gate, up;
  linear(s.m, *L.wgate, nullptr, gate, H, F);
  linear(s.m, *L.wup, nullptr, up, H, F);
  s.gu.resize(static_cast<size_t>(T * 2 * F));  // SiluAndMul takes [gate | up] rows
  for (int64_t t = 0; t < T; ++t) {
    std::copy_n(gate.data() + t * F, F, s.gu.data() + t * 2 * F);
    std::copy_n(up.data() + t * F, F, s.gu.data() + t * 2 * F + F);
  }
  s.s.resize(static_cast<size_t>(T * F));
  call.forward(slots_.silu_and_mul, {in(s.gu.data(), {T, 2 * F}), out(s.s.data(), {T, F})});
  linear(s.s, *L.wdown, nullptr, branch, F, H);
  add_into(h, branch);
}

// dh: the gradient of the layer's output in, of its input out.
void CausalLM::layer_backward(SlotCaller& call, Layer& L, Saved& s, std::vector<float>& dh) {
  const int64_t H = cfg_.hidden, Q = cfg_.q_dim(), KV = cfg_.kv_dim(), F = cfg_.ffn, T = tokens();
  // MLP branch.
  std::vector<float> ds, dgu(static_cast<size_t>(T * 2 * F)), dm, dx;
  linear_grad(s.s, *L.wdown, nullptr, dh, ds, F, H, false);
  call.backward(slots_.silu_and_mul,
                {in(ds.data(), {T, F}), in(s.gu.data(), {T, 2 * F}), out(dgu.data(), {T, 2 * F})});
  std::vector<float> dgate(static_cast<size_t>(T * F)), dup(dgate.size());
  for (int64_t t = 0; t < T; ++t) {
    std::copy_n(dgu.data() + t * 2 * F, F, dgate.data() + t * F);
    std::copy_n(dgu.data() + t * 2 * F + F, F, dup.data() + t * F);
  }
  linear_grad(s.m, *L.wgate, nullptr, dgate, dm, H, F, false);
  linear_grad(s.m, *L.wup, nullptr, dup, dm, H, F, true);
  norm_backward(call, dm, s.h_mid, *L.mlp_norm, s.rstd2, dx);
  add_into(dh, dx);

  // Attention branch.
  std::vector<float> dattn, dq, dk, dv, da;
  linear_grad(s.attn, *L.wo, L.bo, dh, dattn, Q, H, false);
  attention_backward(call, s, dattn, dq, dk, dv);
  rotary(call, true, dq, dk);
  if (cfg_.qk_norm) {
    std::vector<float> dq_pre, dk_pre;
    norm_backward(call, dq, s.q_pre, *L.q_norm, s.rstd_q, dq_pre);
    norm_backward(call, dk, s.k_pre, *L.k_norm, s.rstd_k, dk_pre);
    dq.swap(dq_pre);
    dk.swap(dk_pre);
  }
  linear_grad(s.a, *L.wq, L.bq, dq, da, H, Q, false);
  linear_grad(s.a, *L.wk, L.bk, dk, da, H, KV, true);
  linear_grad(s.a, *L.wv, L.bv, dv, da, H, KV, true);
  norm_backward(call, da, s.h_in, *L.attn_norm, s.rstd1, dx);
  add_into(dh, dx);
}

// ---- the model ---------------------------------------------------------------------------------

float CausalLM::forward(SlotCaller& call, const Runtime& runtime, const int64_t* tokens,
                        const int64_t* targets, int batch, int len) {
  if (batch < 1 || len < 1 || len > cfg_.seq)
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("demo model: {} x {} tokens; sequences hold 1..{} tokens", batch, len,
                            cfg_.seq));
  train_ = runtime.mode() == Mode::kTrain;
  has_targets_ = targets != nullptr;
  batch_ = batch;
  len_ = len;
  const int64_t T = static_cast<int64_t>(batch) * len, H = cfg_.hidden, V = cfg_.vocab;
  tokens_.assign(tokens, tokens + T);
  targets_.assign(targets ? targets : tokens, (targets ? targets : tokens) + T);
  positions_.resize(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) positions_[t] = t % len;
  for (int64_t tok : tokens_)
    if (tok < 0 || tok >= V)
      throw Error(ErrorKind::kInvalidInput,
                  fmt::format("demo model: token {} outside the vocabulary", tok));
  if (targets)
    for (int64_t tok : targets_)
      if (tok < 0 || tok >= V)
        throw Error(ErrorKind::kInvalidInput,
                    fmt::format("demo model: target {} outside the vocabulary", tok));

  std::vector<float> h(static_cast<size_t>(T * H));
  embedding_forward(emb_->w.data(), tokens_.data(), h.data(), T, H);
  saved_.resize(layers_.size());
  for (size_t l = 0; l < layers_.size(); ++l) layer_forward(call, layers_[l], saved_[l], h);
  h_last_ = h;
  norm_forward(call, h, *final_norm_, f_, rstd_f_);
  linear(f_, *head_, nullptr, logits_, H, V);
  if (!targets) return 0.f;

  loss_.resize(static_cast<size_t>(T));
  if (train_) {
    // grad_scale 1: dlogits = softmax - onehot; backward() scales by dloss = 1 / T (the mean).
    dlogits_.resize(logits_.size());
    call.forward(slots_.cross_entropy,
                 {in(logits_.data(), {T, V}), in_i64(targets_.data(), T), integer(kIgnoreIndex),
                  real(1.0), out(loss_.data(), {T}), out(dlogits_.data(), {T, V})});
  } else {
    call.forward(slots_.cross_entropy, {in(logits_.data(), {T, V}), in_i64(targets_.data(), T),
                                        integer(kIgnoreIndex), out(loss_.data(), {T})});
  }
  double sum = 0;
  for (float v : loss_) sum += v;
  return static_cast<float>(sum / static_cast<double>(T));
}

void CausalLM::backward(SlotCaller& call) {
  if (!train_ || !has_targets_)
    throw Error(ErrorKind::kInvalidInput,
                "demo model: backward needs a forward with targets in train mode");
  for (Param& p : params_) p.g.resize(p.w.size(), 0.f);  // first backward: zero gradients
  const int64_t T = tokens(), H = cfg_.hidden, V = cfg_.vocab;
  std::vector<float> dloss(static_cast<size_t>(T), 1.0f / static_cast<float>(T));
  call.backward(slots_.cross_entropy, {in(dloss.data(), {T}), inout(dlogits_.data(), {T, V})});

  std::vector<float> df, dh;
  linear_grad(f_, *head_, nullptr, dlogits_, df, H, V, false);
  norm_backward(call, df, h_last_, *final_norm_, rstd_f_, dh);
  for (size_t l = layers_.size(); l-- > 0;) layer_backward(call, layers_[l], saved_[l], dh);
  embedding_backward(tokens_.data(), dh.data(), emb_->g.data(), T, H);
}

void CausalLM::zero_grad() {
  for (Param& p : params_) p.g.assign(p.w.size(), 0.f);
}

void CausalLM::adam_step(const AdamConfig& a) {
  // torch.optim.AdamW's arithmetic: w *= 1 - lr * wd; w -= (lr / c1) * m / (sqrt(v) / sqrt(c2) +
  // eps), the bias corrections in double as Python computes them.
  ++adam_t_;
  const double c1 = 1.0 - std::pow(static_cast<double>(a.beta1), static_cast<double>(adam_t_));
  const double c2 = 1.0 - std::pow(static_cast<double>(a.beta2), static_cast<double>(adam_t_));
  const float step = static_cast<float>(a.lr / c1), c2_sqrt = static_cast<float>(std::sqrt(c2));
  const float decay = 1.0f - a.lr * a.weight_decay;
  for (Param& p : params_) {
    if (p.g.size() != p.w.size()) continue;  // no gradient yet
    p.m.resize(p.w.size(), 0.f);
    p.v.resize(p.w.size(), 0.f);
    for (size_t i = 0; i < p.w.size(); ++i) {
      const float g = p.g[i];
      p.m[i] = a.beta1 * p.m[i] + (1.0f - a.beta1) * g;
      p.v[i] = a.beta2 * p.v[i] + (1.0f - a.beta2) * g * g;
      p.w[i] = p.w[i] * decay - step * p.m[i] / (std::sqrt(p.v[i]) / c2_sqrt + a.eps);
    }
  }
}

}  // namespace kh::demo
