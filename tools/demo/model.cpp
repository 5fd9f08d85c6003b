#include "tools/demo/model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "hub/base/error.h"
#include "tools/demo/layers.h"

namespace kh::demo {

namespace {

// Targets never equal this, so no token is ignored; the CE ops still take the argument.
constexpr int64_t kIgnoreIndex = -100;

void add_into(std::vector<float>& dst, const std::vector<float>& src) {
  for (size_t i = 0; i < dst.size(); ++i) dst[i] += src[i];
}

}  // namespace

TinyLM::TinyLM(const ModelConfig& config, const DemoSlots& slots, uint64_t seed)
    : cfg_(config), slots_(slots) {
  if (cfg_.vocab < 2 || cfg_.hidden < 2 || cfg_.layers < 1 || cfg_.heads < 1 || cfg_.ffn < 1 ||
      cfg_.seq < 2 || cfg_.hidden % cfg_.heads != 0 || cfg_.head_dim() % 2 != 0)
    throw Error(ErrorKind::kInvalidInput,
                "demo model: vocab, hidden, layers, heads, ffn and seq must be positive, hidden "
                "divisible by heads and the head size even (rotary pairs)");
  std::mt19937_64 rng(seed);
  const size_t V = cfg_.vocab, H = cfg_.hidden, F = cfg_.ffn;
  const float in_h = 1.0f / std::sqrt(static_cast<float>(H));
  const float in_f = 1.0f / std::sqrt(static_cast<float>(F));
  // Residual branches start small (1/sqrt(2L)) so the stack begins close to the identity.
  const float branch = 1.0f / std::sqrt(2.0f * static_cast<float>(cfg_.layers));
  init(emb_, V * H, 1.0f, rng);
  layers_.resize(static_cast<size_t>(cfg_.layers));
  for (Layer& l : layers_) {
    init_const(l.attn_norm, H, 1.0f);
    init(l.wq, H * H, in_h, rng);
    init(l.wk, H * H, in_h, rng);
    init(l.wv, H * H, in_h, rng);
    init(l.wo, H * H, in_h * branch, rng);
    init_const(l.mlp_norm, H, 1.0f);
    init(l.wgu, H * 2 * F, in_h, rng);
    init(l.wdown, F * H, in_f * branch, rng);
  }
  init_const(final_norm_, H, 1.0f);
  init(head_, H * V, in_h, rng);

  // NeoX rotary cache: angle(pos, j) = pos * base^(-2j / head_dim).
  const int half = cfg_.head_dim() / 2;
  cos_.resize(static_cast<size_t>(cfg_.seq) * half);
  sin_.resize(cos_.size());
  for (int p = 0; p < cfg_.seq; ++p)
    for (int j = 0; j < half; ++j) {
      const double inv = std::pow(cfg_.rope_base, -2.0 * j / cfg_.head_dim());
      cos_[static_cast<size_t>(p) * half + j] = static_cast<float>(std::cos(p * inv));
      sin_[static_cast<size_t>(p) * half + j] = static_cast<float>(std::sin(p * inv));
    }
}

void TinyLM::init(Param& p, size_t n, float stddev, std::mt19937_64& rng) {
  // Box-Muller over the raw engine: std::normal_distribution differs between standard libraries.
  p.w.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const double u1 = (static_cast<double>(rng() >> 11) + 1.0) * 0x1.0p-53;
    const double u2 = static_cast<double>(rng() >> 11) * 0x1.0p-53;
    p.w[i] = static_cast<float>(stddev * std::sqrt(-2.0 * std::log(u1)) *
                                std::cos(6.283185307179586 * u2));
  }
  p.g.assign(n, 0.f);
  p.m.assign(n, 0.f);
  p.v.assign(n, 0.f);
}

void TinyLM::init_const(Param& p, size_t n, float value) {
  p.w.assign(n, value);
  p.g.assign(n, 0.f);
  p.m.assign(n, 0.f);
  p.v.assign(n, 0.f);
}

std::vector<TinyLM::Param*> TinyLM::params() {
  std::vector<Param*> out = {&emb_, &final_norm_, &head_};
  for (Layer& l : layers_)
    for (Param* p : {&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.wo, &l.mlp_norm, &l.wgu, &l.wdown})
      out.push_back(p);
  return out;
}

size_t TinyLM::num_parameters() const {
  size_t n = 0;
  for (Param* p : const_cast<TinyLM*>(this)->params()) n += p->w.size();
  return n;
}

void TinyLM::norm_forward(SlotCaller& call, const std::vector<float>& x, const Param& w,
                          std::vector<float>& y, std::vector<float>& rstd) {
  const int64_t T = static_cast<int64_t>(tokens_.size()), H = cfg_.hidden;
  y.resize(x.size());
  if (train_) {
    rstd.resize(static_cast<size_t>(T));
    call.forward(slots_.rms_norm, {in(x.data(), {T, H}), in(w.w.data(), {H}), real(cfg_.eps),
                                   out(y.data(), {T, H}), out(rstd.data(), {T})});
  } else {
    call.forward(slots_.rms_norm, {in(x.data(), {T, H}), in(w.w.data(), {H}), real(cfg_.eps),
                                   out(y.data(), {T, H})});
  }
}

void TinyLM::norm_backward(SlotCaller& call, const std::vector<float>& dy,
                           const std::vector<float>& x, Param& w, const std::vector<float>& rstd,
                           std::vector<float>& dx) {
  const int64_t T = static_cast<int64_t>(tokens_.size()), H = cfg_.hidden;
  // The package reduces dweight through W partial rows; W bounds its parallelism on a GPU.
  const int64_t W = std::min<int64_t>(T, 64);
  dx.resize(dy.size());
  dweight_.resize(static_cast<size_t>(H));
  workspace_.resize(static_cast<size_t>(W * H));
  call.backward(slots_.rms_norm, {in(dy.data(), {T, H}), in(x.data(), {T, H}), in(w.w.data(), {H}),
                                  in(rstd.data(), {T}), out(dx.data(), {T, H}),
                                  out(dweight_.data(), {H}), scratch(workspace_.data(), {W, H})});
  add_into(w.g, dweight_);  // the op overwrites dweight; the runtime accumulates
}

double TinyLM::attention_scale() const {
  return 1.0 / std::sqrt(static_cast<double>(cfg_.head_dim()));
}

void TinyLM::attention_forward(SlotCaller& call, Saved& s) {
  const int64_t B = batch_, S = len_, NH = cfg_.heads, HD = cfg_.head_dim(), T = B * S;
  // Padded causal batches: no cu_seqlens, no window; train keeps the lse for backward.
  if (train_) s.lse.resize(static_cast<size_t>(NH * T));
  call.forward(slots_.attention,
               {in(s.q.data(), {B, S, NH, HD}), in(s.k.data(), {B, S, NH, HD}),
                in(s.v.data(), {B, S, NH, HD}), none(), none(), integer(S), integer(1), integer(-1),
                real(attention_scale()), out(s.attn.data(), {B, S, NH, HD}),
                train_ ? out(s.lse.data(), {NH, T}) : none()});
}

void TinyLM::attention_backward(SlotCaller& call, const Saved& s, const std::vector<float>& dout,
                                std::vector<float>& dq, std::vector<float>& dk,
                                std::vector<float>& dv) {
  const int64_t B = batch_, S = len_, NH = cfg_.heads, HD = cfg_.head_dim(), T = B * S;
  // The package's cuda backward sums dq through an fp32 workspace of T * NH * (HD + 1).
  attn_workspace_.resize(static_cast<size_t>(T * NH * (HD + 1)));
  call.backward(
      slots_.attention,
      {in(dout.data(), {B, S, NH, HD}), in(s.q.data(), {B, S, NH, HD}),
       in(s.k.data(), {B, S, NH, HD}), in(s.v.data(), {B, S, NH, HD}),
       in(s.attn.data(), {B, S, NH, HD}), in(s.lse.data(), {NH, T}), none(), none(), integer(S),
       integer(S), integer(1), integer(-1), real(attention_scale()), out(dq.data(), {B, S, NH, HD}),
       out(dk.data(), {B, S, NH, HD}), out(dv.data(), {B, S, NH, HD}),
       scratch(attn_workspace_.data(), {static_cast<int64_t>(attn_workspace_.size())})});
}

float TinyLM::forward(SlotCaller& call, const Runtime& runtime, const int64_t* tokens,
                      const int64_t* targets, int batch, int len) {
  if (batch < 1 || len < 1 || len > cfg_.seq)
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("demo model: {} x {} tokens; sequences hold 1..{} tokens", batch, len,
                            cfg_.seq));
  train_ = runtime.mode() == Mode::kTrain;
  has_targets_ = targets != nullptr;
  batch_ = batch;
  len_ = len;
  const int64_t T = static_cast<int64_t>(batch) * len, H = cfg_.hidden, F = cfg_.ffn,
                V = cfg_.vocab, NH = cfg_.heads, HD = cfg_.head_dim();
  tokens_.assign(tokens, tokens + T);
  targets_.assign(targets ? targets : tokens, (targets ? targets : tokens) + T);
  positions_.resize(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) positions_[t] = t % len;
  for (int64_t tok : tokens_)
    if (tok < 0 || tok >= V)
      throw Error(ErrorKind::kInvalidInput,
                  fmt::format("demo model: token {} outside the vocabulary", tok));

  std::vector<float> h(static_cast<size_t>(T * H)), tmp(h.size());
  embedding_forward(emb_.w.data(), tokens_.data(), h.data(), T, H);
  saved_.resize(layers_.size());
  for (size_t l = 0; l < layers_.size(); ++l) {
    Layer& L = layers_[l];
    Saved& s = saved_[l];
    s.h_in = h;
    norm_forward(call, h, L.attn_norm, s.a, s.rstd1);
    const std::pair<const Param*, std::vector<float>*> qkv[] = {
        {&L.wq, &s.q}, {&L.wk, &s.k}, {&L.wv, &s.v}};
    for (auto [w, y] : qkv) {
      y->resize(h.size());
      linear_forward(s.a.data(), w->w.data(), y->data(), T, H, H);
    }
    call.forward(slots_.rotary,
                 {in_i64(positions_.data(), T), inout(s.q.data(), {T, NH, HD}),
                  inout(s.k.data(), {T, NH, HD}), in(cos_.data(), {cfg_.seq, HD / 2}),
                  in(sin_.data(), {cfg_.seq, HD / 2}), integer(1)});
    s.attn.resize(h.size());
    attention_forward(call, s);
    linear_forward(s.attn.data(), L.wo.w.data(), tmp.data(), T, H, H);
    add_into(h, tmp);
    s.h_mid = h;
    norm_forward(call, h, L.mlp_norm, s.m, s.rstd2);
    s.gu.resize(static_cast<size_t>(T * 2 * F));
    linear_forward(s.m.data(), L.wgu.w.data(), s.gu.data(), T, H, 2 * F);
    s.s.resize(static_cast<size_t>(T * F));
    call.forward(slots_.silu_and_mul, {in(s.gu.data(), {T, 2 * F}), out(s.s.data(), {T, F})});
    linear_forward(s.s.data(), L.wdown.w.data(), tmp.data(), T, F, H);
    add_into(h, tmp);
  }
  h_last_ = h;
  norm_forward(call, h, final_norm_, f_, rstd_f_);
  logits_.resize(static_cast<size_t>(T * V));
  linear_forward(f_.data(), head_.w.data(), logits_.data(), T, H, V);
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

void TinyLM::backward(SlotCaller& call) {
  if (!train_ || !has_targets_)
    throw Error(ErrorKind::kInvalidInput,
                "demo model: backward needs a forward with targets in train mode");
  const int64_t T = static_cast<int64_t>(tokens_.size()), H = cfg_.hidden, F = cfg_.ffn,
                V = cfg_.vocab, NH = cfg_.heads, HD = cfg_.head_dim();
  std::vector<float> dloss(static_cast<size_t>(T), 1.0f / static_cast<float>(T));
  call.backward(slots_.cross_entropy, {in(dloss.data(), {T}), inout(dlogits_.data(), {T, V})});

  std::vector<float> df(static_cast<size_t>(T * H)), dh, dx;
  linear_backward(f_.data(), head_.w.data(), dlogits_.data(), df.data(), head_.g.data(), T, H, V,
                  false);
  norm_backward(call, df, h_last_, final_norm_, rstd_f_, dh);

  std::vector<float> ds(static_cast<size_t>(T * F)), dgu(static_cast<size_t>(T * 2 * F));
  std::vector<float> dm(dh.size()), dattn(dh.size()), dq(dh.size()), dk(dh.size()), dv(dh.size()),
      da(dh.size());
  for (size_t l = layers_.size(); l-- > 0;) {
    Layer& L = layers_[l];
    Saved& s = saved_[l];
    // MLP branch: h_out = h_mid + down(silu_and_mul(gate_up(norm(h_mid)))).
    linear_backward(s.s.data(), L.wdown.w.data(), dh.data(), ds.data(), L.wdown.g.data(), T, F, H,
                    false);
    call.backward(slots_.silu_and_mul, {in(ds.data(), {T, F}), in(s.gu.data(), {T, 2 * F}),
                                        out(dgu.data(), {T, 2 * F})});
    linear_backward(s.m.data(), L.wgu.w.data(), dgu.data(), dm.data(), L.wgu.g.data(), T, H, 2 * F,
                    false);
    norm_backward(call, dm, s.h_mid, L.mlp_norm, s.rstd2, dx);
    add_into(dh, dx);
    // Attention branch: h_mid = h_in + o(attention(rope(q), rope(k), v)).
    linear_backward(s.attn.data(), L.wo.w.data(), dh.data(), dattn.data(), L.wo.g.data(), T, H, H,
                    false);
    attention_backward(call, s, dattn, dq, dk, dv);
    call.backward(
        slots_.rotary,
        {in_i64(positions_.data(), T), inout(dq.data(), {T, NH, HD}), inout(dk.data(), {T, NH, HD}),
         in(cos_.data(), {cfg_.seq, HD / 2}), in(sin_.data(), {cfg_.seq, HD / 2}), integer(1)});
    linear_backward(s.a.data(), L.wq.w.data(), dq.data(), da.data(), L.wq.g.data(), T, H, H, false);
    linear_backward(s.a.data(), L.wk.w.data(), dk.data(), da.data(), L.wk.g.data(), T, H, H, true);
    linear_backward(s.a.data(), L.wv.w.data(), dv.data(), da.data(), L.wv.g.data(), T, H, H, true);
    norm_backward(call, da, s.h_in, L.attn_norm, s.rstd1, dx);
    add_into(dh, dx);
  }
  embedding_backward(tokens_.data(), dh.data(), emb_.g.data(), T, H);
}

void TinyLM::zero_grad() {
  for (Param* p : params()) std::fill(p->g.begin(), p->g.end(), 0.f);
}

void TinyLM::adam_step(const AdamConfig& a) {
  ++adam_t_;
  const float c1 = 1.0f - std::pow(a.beta1, static_cast<float>(adam_t_));
  const float c2 = 1.0f - std::pow(a.beta2, static_cast<float>(adam_t_));
  for (Param* p : params())
    for (size_t i = 0; i < p->w.size(); ++i) {
      const float g = p->g[i];
      p->m[i] = a.beta1 * p->m[i] + (1.0f - a.beta1) * g;
      p->v[i] = a.beta2 * p->v[i] + (1.0f - a.beta2) * g * g;
      p->w[i] -= a.lr * (p->m[i] / c1) / (std::sqrt(p->v[i] / c2) + a.eps);
    }
}

}  // namespace kh::demo
