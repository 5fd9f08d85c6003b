#include "tools/demo/device_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "kernel_hub/kernel_hub.hpp"
#include "tools/demo/device_linear.h"

namespace kh::demo {

namespace {

constexpr int64_t kIgnoreIndex = -100;  // as the host model: no target equals it

kh_arg_t tensor_arg(const DeviceTensor* t) {
  kh_arg_t a{};
  a.kind = KH_ARG_TENSOR;
  a.v.t = t ? t->dl() : nullptr;
  return a;
}
kh_arg_t int_arg(int64_t i) {
  kh_arg_t a{};
  a.kind = KH_ARG_INT;
  a.v.i = i;
  return a;
}
kh_arg_t float_arg(double f) {
  kh_arg_t a{};
  a.kind = KH_ARG_FLOAT;
  a.v.f = f;
  return a;
}

std::string gate_up_name(const std::string& layer_prefix) {
  return layer_prefix + "mlp.gate_up";
}

}  // namespace

DeviceCausalLM::DeviceCausalLM(const CausalLM& host, const DemoSlots& slots, const Runtime& runtime,
                               int device)
    : cfg_(host.config()),
      slots_(slots),
      runtime_(runtime),
      device_(device),
      pool_(device),
      stream_(device),
      kernels_(device) {
  auto upload = [&](const std::string& name, std::vector<int64_t> shape,
                    const std::vector<float>& w) {
    Param& p = params_[name];
    p.w = DeviceTensor(pool_, std::move(shape), kF32);
    p.w.upload(stream_, w.data(), w.size() * sizeof(float));
  };
  for (const WeightSpec& spec : weight_specs(cfg_)) {
    if (spec.name.ends_with("mlp.gate_proj.weight") || spec.name.ends_with("mlp.up_proj.weight"))
      continue;  // one fused parameter below
    const std::vector<float>* w = host.weight(spec.name);
    if (!w) throw Error(ErrorKind::kInvalidInput, fmt::format("no host tensor {}", spec.name));
    upload(spec.name, spec.shape, *w);
  }
  const int64_t H = cfg_.hidden, F = cfg_.ffn;
  layers_.resize(static_cast<size_t>(cfg_.layers));
  for (int l = 0; l < cfg_.layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    std::vector<float> gate_up(*host.weight(p + "mlp.gate_proj.weight"));
    const std::vector<float>& up = *host.weight(p + "mlp.up_proj.weight");
    gate_up.insert(gate_up.end(), up.begin(), up.end());
    upload(gate_up_name(p), {2 * F, H}, gate_up);
    stream_.synchronize();  // the pageable gate_up is copied before it goes
  }
  for (int l = 0; l < cfg_.layers; ++l) {  // pointers once the map is complete
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
        &param(gate_up_name(p)),
        &param(p + "mlp.down_proj.weight"),
    };
  }
  emb_ = &param("model.embed_tokens.weight");
  final_norm_ = &param("model.norm.weight");
  head_ = cfg_.tie_embeddings ? emb_ : &param("lm_head.weight");

  // The host model's rotary cache (model_config.h).
  const int half = cfg_.head_dim / 2;
  std::vector<float> c, s;
  rope_tables(cfg_, c, s);
  cos_ = DeviceTensor(pool_, {cfg_.seq, half}, kF32);
  sin_ = DeviceTensor(pool_, {cfg_.seq, half}, kF32);
  cos_.upload(stream_, c.data(), c.size() * sizeof(float));
  sin_.upload(stream_, s.data(), s.size() * sizeof(float));
  stream_.synchronize();
}

DeviceCausalLM::Param& DeviceCausalLM::param(const std::string& name) {
  if (Param* p = optional_param(name)) return *p;
  throw Error(ErrorKind::kInvalidInput, fmt::format("model {}: no tensor {}", cfg_.name, name));
}

DeviceCausalLM::Param* DeviceCausalLM::optional_param(const std::string& name) {
  auto it = params_.find(name);
  return it == params_.end() ? nullptr : &it->second;
}

bool DeviceCausalLM::bound(uint32_t slot) const {
  return runtime_.slot_bound(slot, device_);
}

void DeviceCausalLM::call_slot(uint32_t slot, const char* name, bool backward,
                               const std::vector<kh_arg_t>& args) {
  if (std::find(package_slots_.begin(), package_slots_.end(), name) == package_slots_.end())
    package_slots_.push_back(name);
  const auto n = static_cast<int32_t>(args.size());
  const int32_t status = backward
                             ? runtime_.backward(slot, device_, args.data(), n, stream_.handle())
                             : runtime_.forward(slot, device_, args.data(), n, stream_.handle());
  if (status != KH_OK)
    throw Error(ErrorKind::kIo, fmt::format("{} {} on CUDA device {} failed ({}): {}", name,
                                            backward ? "backward" : "forward", device_,
                                            kh_status_name(status), last_op_error()));
}

DeviceTensor DeviceCausalLM::empty(std::vector<int64_t> shape, DLDataType dtype) {
  return DeviceTensor(pool_, std::move(shape), dtype);
}

float DeviceCausalLM::attention_scale() const {
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(cfg_.head_dim)));
}

// ---- the layers' calls --------------------------------------------------------------------

void DeviceCausalLM::linear(const DeviceTensor& x, const Param& w, const Param* bias,
                            DeviceTensor& y) {
  linear_forward(stream_, x, w.w, y);
  if (bias) kernels_.bias_add(stream_, y, bias->w);
}

void DeviceCausalLM::linear_grad(const DeviceTensor& x, Param& w, Param* bias,
                                 const DeviceTensor& dy, DeviceTensor* dx, bool accumulate_dx) {
  linear_backward(stream_, x, w.w, dy, dx, &w.g, accumulate_dx);
  if (bias) kernels_.column_sum_add(stream_, dy, bias->g);
}

void DeviceCausalLM::norm(const DeviceTensor& x, const Param& w, DeviceTensor& y,
                          DeviceTensor* rstd) {
  if (bound(slots_.rms_norm)) {
    std::vector<kh_arg_t> args = {tensor_arg(&x), tensor_arg(&w.w), float_arg(cfg_.eps),
                                  tensor_arg(&y)};
    if (rstd) args.push_back(tensor_arg(rstd));
    call_slot(slots_.rms_norm, kRMSNorm, false, args);
  } else {
    kernels_.rms_norm(stream_, x, w.w, cfg_.eps, y, rstd);
  }
}

void DeviceCausalLM::norm_backward(const DeviceTensor& dy, const DeviceTensor& x, Param& w,
                                   const DeviceTensor& rstd, DeviceTensor& dx) {
  const int64_t C = w.w.numel(), R = x.numel() / C;
  DeviceTensor dweight = empty({C});
  if (bound(slots_.rms_norm)) {
    // The package reduces dweight through W partial rows (the host model's workspace).
    DeviceTensor workspace = empty({std::min<int64_t>(R, 64), C});
    call_slot(slots_.rms_norm, kRMSNorm, true,
              {tensor_arg(&dy), tensor_arg(&x), tensor_arg(&w.w), tensor_arg(&rstd),
               tensor_arg(&dx), tensor_arg(&dweight), tensor_arg(&workspace)});
  } else {
    kernels_.rms_norm_backward(stream_, dy, x, w.w, rstd, dx, dweight);
  }
  kernels_.add(stream_, w.g, dweight, w.g);  // the op overwrites dweight; the runtime adds
}

void DeviceCausalLM::rotary(DeviceTensor& q3, DeviceTensor& k3, bool backward) {
  if (bound(slots_.rotary))
    call_slot(slots_.rotary, kRotaryEmbedding, backward,
              {tensor_arg(&positions_), tensor_arg(&q3), tensor_arg(&k3), tensor_arg(&cos_),
               tensor_arg(&sin_), int_arg(1)});
  else
    kernels_.rotary(stream_, positions_, q3, &k3, cos_, sin_, /*neox=*/true, backward);
}

// ---- one decoder layer: the host model's layer_forward / layer_backward on the device ------

void DeviceCausalLM::layer_forward(Layer& L, Saved& s, DeviceTensor& h) {
  const int64_t H = cfg_.hidden, Q = cfg_.q_dim(), KV = cfg_.kv_dim(), F = cfg_.ffn;
  const int64_t NH = cfg_.heads, NKV = cfg_.kv_heads, HD = cfg_.head_dim;
  const int64_t B = batch_, S = len_, T = B * S;
  if (train_) {
    s.h_in = empty({T, H});
    stream_.copy(s.h_in.data(), h.data(), h.bytes(), KH_COPY_D2D);
    s.rstd1 = empty({T});
  }
  s.a = empty({T, H});
  norm(h, *L.attn_norm, s.a, train_ ? &s.rstd1 : nullptr);
  s.v = empty({T, KV});
  linear(s.a, *L.wv, L.bv, s.v);
  if (L.q_norm) {  // Qwen3: RMSNorm over each head's head_dim, before RoPE
    s.q_pre = empty({T, Q});
    s.k_pre = empty({T, KV});
    linear(s.a, *L.wq, L.bq, s.q_pre);
    linear(s.a, *L.wk, L.bk, s.k_pre);
    DeviceTensor qn = empty({T * NH, HD}), kn = empty({T * NKV, HD});
    if (train_) {
      s.rstd_q = empty({T * NH});
      s.rstd_k = empty({T * NKV});
    }
    norm(s.q_pre.view({T * NH, HD}), *L.q_norm, qn, train_ ? &s.rstd_q : nullptr);
    norm(s.k_pre.view({T * NKV, HD}), *L.k_norm, kn, train_ ? &s.rstd_k : nullptr);
    s.q = qn.view({T, Q});
    s.k = kn.view({T, KV});
  } else {
    s.q = empty({T, Q});
    s.k = empty({T, KV});
    linear(s.a, *L.wq, L.bq, s.q);
    linear(s.a, *L.wk, L.bk, s.k);
  }
  DeviceTensor q3 = s.q.view({T, NH, HD}), k3 = s.k.view({T, NKV, HD});
  rotary(q3, k3, false);
  DeviceTensor q4 = s.q.view({B, S, NH, HD}), k4 = s.k.view({B, S, NKV, HD}),
               v4 = s.v.view({B, S, NKV, HD});
  s.attn = empty({B, S, NH, HD});
  if (train_) s.lse = empty({NH, T});
  DeviceTensor* lse = train_ ? &s.lse : nullptr;
  if (bound(slots_.attention))
    call_slot(slots_.attention, kAttention, false,
              {tensor_arg(&q4), tensor_arg(&k4), tensor_arg(&v4), tensor_arg(nullptr),
               tensor_arg(nullptr), int_arg(S), int_arg(1), int_arg(-1),
               float_arg(attention_scale()), tensor_arg(&s.attn), tensor_arg(lse)});
  else
    kernels_.attention_forward(stream_, q4, k4, v4, attention_scale(), s.attn, lse);
  DeviceTensor branch = empty({T, H});
  linear(s.attn.view({T, Q}), *L.wo, L.bo, branch);
  kernels_.add(stream_, h, branch, h);

  if (train_) {
    s.h_mid = empty({T, H});
    stream_.copy(s.h_mid.data(), h.data(), h.bytes(), KH_COPY_D2D);
    s.rstd2 = empty({T});
  }
  s.m = empty({T, H});
  norm(h, *L.mlp_norm, s.m, train_ ? &s.rstd2 : nullptr);
  s.gu = empty({T, 2 * F});
  s.s = empty({T, F});
  linear(s.m, *L.gate_up, nullptr, s.gu);
  if (bound(slots_.silu_and_mul))
    call_slot(slots_.silu_and_mul, kSiluAndMul, false, {tensor_arg(&s.gu), tensor_arg(&s.s)});
  else
    kernels_.silu_and_mul(stream_, s.gu, s.s);
  linear(s.s, *L.wdown, nullptr, branch);
  kernels_.add(stream_, h, branch, h);
  if (prefilling_kv_) prefill_kv(L, s);
  if (!train_) s = Saved{};  // eval keeps nothing: the blocks go back to the pool
}

// dh: the gradient of the layer's output in, of its input out.
void DeviceCausalLM::layer_backward(Layer& L, Saved& s, DeviceTensor& dh) {
  const int64_t H = cfg_.hidden, Q = cfg_.q_dim(), KV = cfg_.kv_dim(), F = cfg_.ffn;
  const int64_t NH = cfg_.heads, NKV = cfg_.kv_heads, HD = cfg_.head_dim;
  const int64_t B = batch_, S = len_, T = B * S;
  // MLP branch: dgu = [dgate | dup], and the fused weight's backward is both linears' at once.
  DeviceTensor ds = empty({T, F}), dgu = empty({T, 2 * F}), dm = empty({T, H}), dx = empty({T, H});
  linear_grad(s.s, *L.wdown, nullptr, dh, &ds, false);
  if (bound(slots_.silu_and_mul))
    call_slot(slots_.silu_and_mul, kSiluAndMul, true,
              {tensor_arg(&ds), tensor_arg(&s.gu), tensor_arg(&dgu)});
  else
    kernels_.silu_and_mul_backward(stream_, ds, s.gu, dgu);
  linear_grad(s.m, *L.gate_up, nullptr, dgu, &dm, false);
  norm_backward(dm, s.h_mid, *L.mlp_norm, s.rstd2, dx);
  kernels_.add(stream_, dh, dx, dh);

  // Attention branch.
  DeviceTensor dattn = empty({B, S, NH, HD});
  DeviceTensor dattn2 = dattn.view({T, Q});
  linear_grad(s.attn.view({T, Q}), *L.wo, L.bo, dh, &dattn2, false);
  DeviceTensor dq = empty({B, S, NH, HD}), dk = empty({B, S, NKV, HD}), dv = empty({B, S, NKV, HD});
  DeviceTensor q4 = s.q.view({B, S, NH, HD}), k4 = s.k.view({B, S, NKV, HD}),
               v4 = s.v.view({B, S, NKV, HD}), o4 = s.attn.view(s.attn.shape());
  if (bound(slots_.attention)) {
    // The package's cuda backward sums dq through an fp32 workspace of T * NH * (HD + 1).
    DeviceTensor workspace = empty({T * NH * (HD + 1)});
    call_slot(slots_.attention, kAttention, true,
              {tensor_arg(&dattn), tensor_arg(&q4), tensor_arg(&k4), tensor_arg(&v4),
               tensor_arg(&o4), tensor_arg(&s.lse), tensor_arg(nullptr), tensor_arg(nullptr),
               int_arg(S), int_arg(S), int_arg(1), int_arg(-1), float_arg(attention_scale()),
               tensor_arg(&dq), tensor_arg(&dk), tensor_arg(&dv), tensor_arg(&workspace)});
  } else {
    kernels_.attention_backward(stream_, dattn, q4, k4, v4, o4, s.lse, attention_scale(), dq, dk,
                                dv);
  }
  DeviceTensor dq3 = dq.view({T, NH, HD}), dk3 = dk.view({T, NKV, HD});
  rotary(dq3, dk3, true);
  DeviceTensor dq2 = dq.view({T, Q}), dk2 = dk.view({T, KV});
  if (L.q_norm) {
    DeviceTensor dq_pre = empty({T * NH, HD}), dk_pre = empty({T * NKV, HD});
    norm_backward(dq.view({T * NH, HD}), s.q_pre.view({T * NH, HD}), *L.q_norm, s.rstd_q, dq_pre);
    norm_backward(dk.view({T * NKV, HD}), s.k_pre.view({T * NKV, HD}), *L.k_norm, s.rstd_k, dk_pre);
    dq2 = dq_pre.view({T, Q});
    dk2 = dk_pre.view({T, KV});
  }
  DeviceTensor da = empty({T, H});
  linear_grad(s.a, *L.wq, L.bq, dq2, &da, false);
  linear_grad(s.a, *L.wk, L.bk, dk2, &da, true);
  linear_grad(s.a, *L.wv, L.bv, dv.view({T, KV}), &da, true);
  norm_backward(da, s.h_in, *L.attn_norm, s.rstd1, dx);
  kernels_.add(stream_, dh, dx, dh);
}

// ---- the model ----------------------------------------------------------------------------

float DeviceCausalLM::forward(const int64_t* tokens, const int64_t* targets, int batch, int len) {
  if (batch < 1 || len < 1 || len > cfg_.seq)
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("device model: {} x {} tokens; sequences hold 1..{} tokens", batch, len,
                            cfg_.seq));
  const int64_t T = static_cast<int64_t>(batch) * len, H = cfg_.hidden, V = cfg_.vocab;
  for (int64_t t = 0; t < T; ++t)
    if (tokens[t] < 0 || tokens[t] >= V || (targets && (targets[t] < 0 || targets[t] >= V)))
      throw Error(ErrorKind::kInvalidInput,
                  fmt::format("device model: token or target at {} outside the vocabulary", t));
  package_slots_.clear();
  train_ = runtime_.mode() == Mode::kTrain;
  has_targets_ = targets != nullptr;
  batch_ = batch;
  len_ = len;
  std::vector<int64_t> positions(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) positions[t] = t % len;
  tokens_ = empty({T}, kI64);
  positions_ = empty({T}, kI64);
  tokens_.upload(stream_, tokens, static_cast<size_t>(T) * sizeof(int64_t));
  positions_.upload(stream_, positions.data(), positions.size() * sizeof(int64_t));

  DeviceTensor h = empty({T, H});
  kernels_.embedding_forward(stream_, emb_->w, tokens_, h);
  saved_.resize(layers_.size());
  for (size_t l = 0; l < layers_.size(); ++l) layer_forward(layers_[l], saved_[l], h);
  f_ = empty({T, H});
  rstd_f_ = train_ ? empty({T}) : DeviceTensor();
  norm(h, *final_norm_, f_, train_ ? &rstd_f_ : nullptr);
  h_last_ = train_ ? std::move(h) : DeviceTensor();
  logits_ = empty({T, V});
  linear(f_, *head_, nullptr, logits_);
  if (!targets) {
    stream_.synchronize();
    return 0.f;
  }
  targets_ = empty({T}, kI64);
  targets_.upload(stream_, targets, static_cast<size_t>(T) * sizeof(int64_t));
  loss_ = empty({T});
  if (train_) {
    // grad_scale 1: dlogits = softmax - onehot; backward() scales by dloss = 1 / T (the mean).
    dlogits_ = empty({T, V});
    if (bound(slots_.cross_entropy))
      call_slot(slots_.cross_entropy, kCrossEntropy, false,
                {tensor_arg(&logits_), tensor_arg(&targets_), int_arg(kIgnoreIndex), float_arg(1.0),
                 tensor_arg(&loss_), tensor_arg(&dlogits_)});
    else
      kernels_.cross_entropy(stream_, logits_, targets_, kIgnoreIndex, 1.f, loss_, &dlogits_);
  } else if (bound(slots_.cross_entropy)) {
    call_slot(
        slots_.cross_entropy, kCrossEntropy, false,
        {tensor_arg(&logits_), tensor_arg(&targets_), int_arg(kIgnoreIndex), tensor_arg(&loss_)});
  } else {
    kernels_.cross_entropy(stream_, logits_, targets_, kIgnoreIndex, 1.f, loss_, nullptr);
  }
  std::vector<float> host(static_cast<size_t>(T));
  loss_.download(stream_, host.data(), host.size() * sizeof(float));
  stream_.synchronize();
  double sum = 0;
  for (float v : host) sum += v;
  return static_cast<float>(sum / static_cast<double>(T));
}

void DeviceCausalLM::backward() {
  if (!train_ || !has_targets_)
    throw Error(ErrorKind::kInvalidInput,
                "device model: backward needs a forward with targets in train mode");
  for (auto& [name, p] : params_)  // first backward: zeroed gradients
    if (!p.g.data() && p.w.numel()) {
      p.g = empty(p.w.shape());
      p.g.zero(stream_);
    }
  const int64_t T = static_cast<int64_t>(batch_) * len_, H = cfg_.hidden;
  std::vector<float> dloss_host(static_cast<size_t>(T), 1.0f / static_cast<float>(T));
  DeviceTensor dloss = empty({T});
  dloss.upload(stream_, dloss_host.data(), dloss_host.size() * sizeof(float));
  if (bound(slots_.cross_entropy))
    call_slot(slots_.cross_entropy, kCrossEntropy, true,
              {tensor_arg(&dloss), tensor_arg(&dlogits_)});
  else
    kernels_.cross_entropy_backward(stream_, dloss, dlogits_);
  DeviceTensor df = empty({T, H}), dh = empty({T, H});
  linear_grad(f_, *head_, nullptr, dlogits_, &df, false);
  norm_backward(df, h_last_, *final_norm_, rstd_f_, dh);
  for (size_t l = layers_.size(); l-- > 0;) layer_backward(layers_[l], saved_[l], dh);
  kernels_.embedding_backward(stream_, tokens_, dh, emb_->g);
  stream_.synchronize();  // dloss_host is pageable and local
}

void DeviceCausalLM::zero_grad() {
  for (auto& [name, p] : params_)
    if (p.g.data()) p.g.zero(stream_);
}

void DeviceCausalLM::adam_step(const AdamConfig& adam) {
  ++adam_t_;
  for (auto& [name, p] : params_) {
    if (!p.g.data()) continue;  // no gradient yet
    if (!p.m.data()) {
      p.m = empty(p.w.shape());
      p.v = empty(p.w.shape());
      p.m.zero(stream_);
      p.v.zero(stream_);
    }
    kernels_.adamw(stream_, p.w, p.g, p.m, p.v, nullptr, adam, adam_t_);
  }
}

std::vector<float> DeviceCausalLM::download_logits() {
  std::vector<float> host(static_cast<size_t>(logits_.numel()));
  logits_.download(stream_, host.data(), host.size() * sizeof(float));
  stream_.synchronize();
  return host;
}

std::vector<float> DeviceCausalLM::download_weight(const std::string& name) {
  const bool gate = name.ends_with("mlp.gate_proj.weight");
  const bool up = name.ends_with("mlp.up_proj.weight");
  std::vector<float> all;
  if (gate || up) {
    const std::string prefix = name.substr(0, name.rfind("mlp."));
    const Param& p = param(gate_up_name(prefix));
    all.resize(static_cast<size_t>(p.w.numel()));
    p.w.download(stream_, all.data(), all.size() * sizeof(float));
    stream_.synchronize();
    const size_t half = all.size() / 2;
    return gate ? std::vector<float>(all.begin(), all.begin() + static_cast<ptrdiff_t>(half))
                : std::vector<float>(all.begin() + static_cast<ptrdiff_t>(half), all.end());
  }
  const Param& p = param(name);
  all.resize(static_cast<size_t>(p.w.numel()));
  p.w.download(stream_, all.data(), all.size() * sizeof(float));
  stream_.synchronize();
  return all;
}

}  // namespace kh::demo
