#include "tools/demo/device_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "hub/base/error.h"
#include "loader/layer_table.h"
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
  for (const WeightSpec& spec : weight_specs(cfg_)) {
    const std::vector<float>* w = host.weight(spec.name);
    if (!w) throw Error(ErrorKind::kInvalidInput, fmt::format("no host tensor {}", spec.name));
    if (spec.name.ends_with("mlp.gate_proj.weight") || spec.name.ends_with("mlp.up_proj.weight"))
      continue;  // stored as one gate_up weight below
    DeviceTensor t(pool_, spec.shape, kF32);
    t.upload(stream_, w->data(), w->size() * sizeof(float));
    weights_.emplace(spec.name, std::move(t));
  }
  const int64_t H = cfg_.hidden, F = cfg_.ffn;
  layers_.resize(static_cast<size_t>(cfg_.layers));
  for (int l = 0; l < cfg_.layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    Layer& L = layers_[static_cast<size_t>(l)];
    L.attn_norm = &weight(p + "input_layernorm.weight");
    L.wq = &weight(p + "self_attn.q_proj.weight");
    L.wk = &weight(p + "self_attn.k_proj.weight");
    L.wv = &weight(p + "self_attn.v_proj.weight");
    L.bq = optional_weight(p + "self_attn.q_proj.bias");
    L.bk = optional_weight(p + "self_attn.k_proj.bias");
    L.bv = optional_weight(p + "self_attn.v_proj.bias");
    L.q_norm = optional_weight(p + "self_attn.q_norm.weight");
    L.k_norm = optional_weight(p + "self_attn.k_norm.weight");
    L.wo = &weight(p + "self_attn.o_proj.weight");
    L.bo = optional_weight(p + "self_attn.o_proj.bias");
    L.mlp_norm = &weight(p + "post_attention_layernorm.weight");
    L.wdown = &weight(p + "mlp.down_proj.weight");
    std::vector<float> gate_up(*host.weight(p + "mlp.gate_proj.weight"));
    const std::vector<float>& up = *host.weight(p + "mlp.up_proj.weight");
    gate_up.insert(gate_up.end(), up.begin(), up.end());
    L.gate_up = DeviceTensor(pool_, {2 * F, H}, kF32);
    L.gate_up.upload(stream_, gate_up.data(), gate_up.size() * sizeof(float));
    stream_.synchronize();  // gate_up (pageable, local) is copied before it goes
  }
  head_ = cfg_.tie_embeddings ? &weight("model.embed_tokens.weight") : &weight("lm_head.weight");

  // The host model's NeoX rotary cache (model.cpp), computed the same way.
  const int half = cfg_.head_dim / 2;
  std::vector<float> c(static_cast<size_t>(cfg_.seq) * half), s(c.size());
  for (int p = 0; p < cfg_.seq; ++p)
    for (int j = 0; j < half; ++j) {
      const double inv = std::pow(cfg_.rope_theta, -2.0 * j / cfg_.head_dim);
      c[static_cast<size_t>(p) * half + j] = static_cast<float>(std::cos(p * inv));
      s[static_cast<size_t>(p) * half + j] = static_cast<float>(std::sin(p * inv));
    }
  cos_ = DeviceTensor(pool_, {cfg_.seq, half}, kF32);
  sin_ = DeviceTensor(pool_, {cfg_.seq, half}, kF32);
  cos_.upload(stream_, c.data(), c.size() * sizeof(float));
  sin_.upload(stream_, s.data(), s.size() * sizeof(float));
  stream_.synchronize();
}

const DeviceTensor& DeviceCausalLM::weight(const std::string& name) const {
  if (const DeviceTensor* t = optional_weight(name)) return *t;
  throw Error(ErrorKind::kInvalidInput, fmt::format("model {}: no tensor {}", cfg_.name, name));
}

const DeviceTensor* DeviceCausalLM::optional_weight(const std::string& name) const {
  auto it = weights_.find(name);
  return it == weights_.end() ? nullptr : &it->second;
}

bool DeviceCausalLM::bound(uint32_t slot) const {
  const Table* t = runtime_.table().current();
  return slot < t->num_slots && !t->entry(device_, slot).is_fallback;
}

void DeviceCausalLM::call_slot(uint32_t slot, const char* name, const std::vector<kh_arg_t>& args) {
  if (std::find(package_slots_.begin(), package_slots_.end(), name) == package_slots_.end())
    package_slots_.push_back(name);
  const int32_t status = runtime_.forward(slot, device_, args.data(),
                                          static_cast<int32_t>(args.size()), stream_.handle());
  if (status != KH_OK)
    throw Error(ErrorKind::kIo, fmt::format("{} on CUDA device {} failed ({}): {}", name, device_,
                                            kh_status_name(status), last_op_error()));
}

DeviceTensor DeviceCausalLM::empty(std::vector<int64_t> shape, DLDataType dtype) {
  return DeviceTensor(pool_, std::move(shape), dtype);
}

void DeviceCausalLM::linear(const DeviceTensor& x, const DeviceTensor& w, const DeviceTensor* bias,
                            DeviceTensor& y) {
  linear_forward(stream_, x, w, y);
  if (bias) kernels_.bias_add(stream_, y, *bias);
}

void DeviceCausalLM::norm(const DeviceTensor& x, const DeviceTensor& w, DeviceTensor& y) {
  if (bound(slots_.rms_norm))
    call_slot(slots_.rms_norm, kRMSNorm,
              {tensor_arg(&x), tensor_arg(&w), float_arg(cfg_.eps), tensor_arg(&y)});
  else
    kernels_.rms_norm(stream_, x, w, cfg_.eps, y, nullptr);
}

// The host model's layer_forward (model.cpp) in eval mode, on the device.
void DeviceCausalLM::layer(const Layer& L, DeviceTensor& h, const DeviceTensor& positions,
                           int batch, int len) {
  const int64_t H = cfg_.hidden, Q = cfg_.q_dim(), KV = cfg_.kv_dim(), F = cfg_.ffn;
  const int64_t NH = cfg_.heads, NKV = cfg_.kv_heads, HD = cfg_.head_dim;
  const int64_t T = static_cast<int64_t>(batch) * len;
  DeviceTensor a = empty({T, H});
  norm(h, *L.attn_norm, a);
  DeviceTensor q = empty({T, Q}), k = empty({T, KV}), v = empty({T, KV});
  linear(a, *L.wv, L.bv, v);
  linear(a, *L.wq, L.bq, q);
  linear(a, *L.wk, L.bk, k);
  if (L.q_norm) {  // Qwen3: RMSNorm over each head's head_dim, before RoPE
    DeviceTensor q_pre = q.view({T * NH, HD}), k_pre = k.view({T * NKV, HD});
    DeviceTensor qn = empty({T * NH, HD}), kn = empty({T * NKV, HD});
    norm(q_pre, *L.q_norm, qn);
    norm(k_pre, *L.k_norm, kn);
    q = qn.view({T, Q});
    k = kn.view({T, KV});
  }
  DeviceTensor q3 = q.view({T, NH, HD}), k3 = k.view({T, NKV, HD});
  if (bound(slots_.rotary))
    call_slot(slots_.rotary, kRotaryEmbedding,
              {tensor_arg(&positions), tensor_arg(&q3), tensor_arg(&k3), tensor_arg(&cos_),
               tensor_arg(&sin_), int_arg(1)});
  else
    kernels_.rotary(stream_, positions, q3, &k3, cos_, sin_, /*neox=*/true, /*backward=*/false);
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(HD)));
  DeviceTensor q4 = q.view({batch, len, NH, HD}), k4 = k.view({batch, len, NKV, HD}),
               v4 = v.view({batch, len, NKV, HD});
  DeviceTensor attn = empty({batch, len, NH, HD});
  if (bound(slots_.attention))
    call_slot(slots_.attention, kAttention,
              {tensor_arg(&q4), tensor_arg(&k4), tensor_arg(&v4), tensor_arg(nullptr),
               tensor_arg(nullptr), int_arg(len), int_arg(1), int_arg(-1), float_arg(scale),
               tensor_arg(&attn), tensor_arg(nullptr)});
  else
    kernels_.attention_forward(stream_, q4, k4, v4, scale, attn, nullptr);
  DeviceTensor branch = empty({T, H});
  linear(attn.view({T, Q}), *L.wo, L.bo, branch);
  kernels_.add(stream_, h, branch, h);

  DeviceTensor m = empty({T, H});
  norm(h, *L.mlp_norm, m);
  DeviceTensor gu = empty({T, 2 * F}), s = empty({T, F});
  linear(m, L.gate_up, nullptr, gu);
  if (bound(slots_.silu_and_mul))
    call_slot(slots_.silu_and_mul, kSiluAndMul, {tensor_arg(&gu), tensor_arg(&s)});
  else
    kernels_.silu_and_mul(stream_, gu, s);
  linear(s, *L.wdown, nullptr, branch);
  kernels_.add(stream_, h, branch, h);
}

float DeviceCausalLM::prefill(const int64_t* tokens, const int64_t* targets, int batch, int len) {
  if (batch < 1 || len < 1 || len > cfg_.seq)
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("device model: {} x {} tokens; sequences hold 1..{} tokens", batch, len,
                            cfg_.seq));
  package_slots_.clear();
  const int64_t T = static_cast<int64_t>(batch) * len, H = cfg_.hidden, V = cfg_.vocab;
  for (int64_t t = 0; t < T; ++t)
    if (tokens[t] < 0 || tokens[t] >= V || (targets && (targets[t] < 0 || targets[t] >= V)))
      throw Error(ErrorKind::kInvalidInput,
                  fmt::format("device model: token or target at {} outside the vocabulary", t));
  std::vector<int64_t> positions(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) positions[t] = t % len;
  DeviceTensor tok = empty({T}, kI64), pos = empty({T}, kI64);
  tok.upload(stream_, tokens, static_cast<size_t>(T) * sizeof(int64_t));
  pos.upload(stream_, positions.data(), positions.size() * sizeof(int64_t));

  DeviceTensor h = empty({T, H});
  kernels_.embedding_forward(stream_, weight("model.embed_tokens.weight"), tok, h);
  for (const Layer& L : layers_) layer(L, h, pos, batch, len);
  DeviceTensor f = empty({T, H});
  norm(h, weight("model.norm.weight"), f);
  logits_ = empty({T, V});
  linear(f, *head_, nullptr, logits_);
  if (!targets) {
    stream_.synchronize();
    return 0.f;
  }
  DeviceTensor tgt = empty({T}, kI64), loss = empty({T});
  tgt.upload(stream_, targets, static_cast<size_t>(T) * sizeof(int64_t));
  if (bound(slots_.cross_entropy))
    call_slot(slots_.cross_entropy, kCrossEntropy,
              {tensor_arg(&logits_), tensor_arg(&tgt), int_arg(kIgnoreIndex), tensor_arg(&loss)});
  else
    kernels_.cross_entropy(stream_, logits_, tgt, kIgnoreIndex, 1.f, loss, nullptr);
  std::vector<float> host(static_cast<size_t>(T));
  loss.download(stream_, host.data(), host.size() * sizeof(float));
  stream_.synchronize();
  double sum = 0;
  for (float v : host) sum += v;
  return static_cast<float>(sum / static_cast<double>(T));
}

std::vector<float> DeviceCausalLM::download_logits() {
  std::vector<float> host(static_cast<size_t>(logits_.numel()));
  logits_.download(stream_, host.data(), host.size() * sizeof(float));
  stream_.synchronize();
  return host;
}

}  // namespace kh::demo
