#include "tools/demo/device_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "kernel_hub/kernel_hub.hpp"
#include "tools/demo/device_linear.h"

namespace kh::demo {

namespace {

constexpr int64_t kIgnoreIndex = -100;  // as the host model: no target equals it

std::string gate_up_name(const std::string& layer_prefix) {
  return layer_prefix + "mlp.gate_up";
}

}  // namespace

DeviceCausalLM::DeviceCausalLM(const ModelConfig& config, const DemoSlots& slots,
                               const Runtime& runtime, int device, DeviceModelOptions options)
    : cfg_(config),
      options_(options),
      act_(options.dtype),
      bf16_(same_dtype(options.dtype, kBF16)),
      slots_(slots),
      runtime_(runtime),
      device_(device),
      pool_(device),
      stream_(device),
      kernels_(device) {}

DeviceCausalLM::DeviceCausalLM(const CausalLM& host, const DemoSlots& slots, const Runtime& runtime,
                               int device, DeviceModelOptions options)
    : DeviceCausalLM(host.config(), slots, runtime, device, options) {
  build([&host](const std::string& name) { return host.weight(name); }, 0);
}

DeviceCausalLM::DeviceCausalLM(const ModelConfig& config,
                               const std::map<std::string, std::vector<float>>& weights,
                               uint64_t seed, const DemoSlots& slots, const Runtime& runtime,
                               int device, DeviceModelOptions options)
    : DeviceCausalLM(config, slots, runtime, device, options) {
  WeightSource source;
  if (!weights.empty())
    source = [&weights](const std::string& name) -> const std::vector<float>* {
      auto it = weights.find(name);
      return it == weights.end() ? nullptr : &it->second;
    };
  build(source, seed);
}

void DeviceCausalLM::build(const WeightSource& source, uint64_t seed) {
  cfg_.validate();
  if (!same_dtype(act_, kF32) && !bf16_)
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("device model: dtype {}; float32 or bfloat16", dtype_name(act_)));
  if (options_.loss_chunk_rows < 1)
    throw Error(ErrorKind::kInvalidInput, "device model: loss_chunk_rows must be >= 1");
  uint64_t index = 0;
  // One parameter from the source (its fp32 values, checked against the shape) or drawn.
  auto make = [&](const std::string& name, std::vector<int64_t> shape,
                  const std::vector<const std::vector<float>*>& parts, float stddev) {
    Param& p = params_[name];
    p.w = DeviceTensor(pool_, std::move(shape), kF32);
    ++index;
    if (source) {
      size_t offset = 0;
      for (const std::vector<float>* part : parts) {
        stream_.copy(static_cast<char*>(p.w.data()) + offset, part->data(),
                     part->size() * sizeof(float), KH_COPY_H2D);
        offset += part->size() * sizeof(float);
      }
      if (offset != p.w.bytes())
        throw Error(ErrorKind::kInvalidInput,
                    fmt::format("model {}: tensor {} has {} elements; expected {}", cfg_.name, name,
                                offset / sizeof(float), p.w.numel()));
      stream_.synchronize();  // the host vectors may be temporaries of the source
    } else if (stddev > 0.f) {
      kernels_.init_normal(stream_, p.w, seed * 0x9E3779B97F4A7C15ULL + index, stddev);
    } else {
      kernels_.fill(stream_, p.w, name.ends_with(".bias") ? 0.f : 1.f);
    }
  };
  auto lookup = [&](const std::string& name) {
    const std::vector<float>* w = source ? source(name) : nullptr;
    if (source && !w)
      throw Error(ErrorKind::kInvalidInput, fmt::format("model {}: no tensor {}", cfg_.name, name));
    return w;
  };
  for (const WeightSpec& spec : weight_specs(cfg_)) {
    if (spec.name.ends_with("mlp.up_proj.weight")) continue;  // with gate_proj, below
    if (spec.name.ends_with("mlp.gate_proj.weight")) {
      // gate_proj and up_proj as one [2 * ffn, hidden] parameter: rows [gate | up].
      const std::string prefix = spec.name.substr(0, spec.name.rfind("mlp."));
      std::vector<const std::vector<float>*> parts;
      if (source) parts = {lookup(spec.name), lookup(prefix + "mlp.up_proj.weight")};
      make(gate_up_name(prefix), {2 * spec.shape[0], spec.shape[1]}, parts,
           init_stddev(cfg_, spec.name));
      continue;
    }
    std::vector<const std::vector<float>*> parts;
    if (source) parts = {lookup(spec.name)};
    make(spec.name, spec.shape, parts, init_stddev(cfg_, spec.name));
  }
  if (bf16_)
    for (auto& [name, p] : params_) {
      p.w16 = empty(p.w.shape(), kBF16);
      kernels_.cast(stream_, p.w, p.w16);
    }
  layers_.resize(static_cast<size_t>(cfg_.layers));
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

  // The host model's rotary cache (model_config.h), fp32 for either precision.
  const int half = cfg_.head_dim / 2;
  std::vector<float> c, s;
  rope_tables(cfg_, c, s);
  cos_ = DeviceTensor(pool_, {cfg_.seq, half}, kF32);
  sin_ = DeviceTensor(pool_, {cfg_.seq, half}, kF32);
  cos_.upload(stream_, c.data(), c.size() * sizeof(float));
  sin_.upload(stream_, s.data(), s.size() * sizeof(float));
  stream_.synchronize();
}

size_t DeviceCausalLM::num_parameters() const {
  size_t n = 0;
  for (const auto& [name, p] : params_) n += static_cast<size_t>(p.w.numel());
  return n;
}

template <typename F>
void DeviceCausalLM::timed(Phase phase, F&& body, const char* slot) {
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

DeviceProfile DeviceCausalLM::take_profile() {
  stream_.synchronize();
  DeviceProfile p;
  for (const Timing& t : profile_) {
    const double ms = events_[t.start + 1]->elapsed_ms_since(*events_[t.start]);
    (t.phase == Phase::kGemm        ? p.gemm_ms
     : t.phase == Phase::kAttention ? p.attention_ms
                                    : p.hub_ms) += ms;
    if (t.phase == Phase::kHub) p.hub_ms_by_slot[t.slot ? t.slot : "other"] += ms;
  }
  profile_.clear();
  return p;
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
  return runtime_.slot_bound(slot, device_) && !refused_.contains(runtime_.slot_name(slot));
}

bool DeviceCausalLM::call_slot(uint32_t slot, const char* name, bool backward,
                               const std::vector<kh_arg_t>& args) {
  const auto n = static_cast<int32_t>(args.size());
  int32_t status = KH_OK;
  timed(
      slot == slots_.attention ? Phase::kAttention : Phase::kHub,
      [&] {
        status = backward ? runtime_.backward(slot, device_, args.data(), n, stream_.handle())
                          : runtime_.forward(slot, device_, args.data(), n, stream_.handle());
      },
      name);
  if (status == KH_ERR_UNSUPPORTED) {
    // The package does not take this model (a head_dim its kernels lack, say): ops check
    // before they launch, so nothing was written; the runtime's own kernels serve the slot
    // from here on.
    refused_.emplace(name, last_op_error());
    return false;
  }
  if (status != KH_OK)
    throw Error(ErrorKind::kIo, fmt::format("{} {} on CUDA device {} failed ({}): {}", name,
                                            backward ? "backward" : "forward", device_,
                                            kh_status_name(status), last_op_error()));
  if (std::find(package_slots_.begin(), package_slots_.end(), name) == package_slots_.end())
    package_slots_.push_back(name);
  return true;
}

DeviceTensor DeviceCausalLM::empty(std::vector<int64_t> shape, DLDataType dtype) {
  return DeviceTensor(pool_, std::move(shape), dtype);
}

void DeviceCausalLM::add_grad(DeviceTensor& gradient, const DeviceTensor& d) {
  if (same_dtype(d.dtype(), kF32)) {
    kernels_.add(stream_, gradient, d, gradient);
    return;
  }
  DeviceTensor wide = empty(d.shape());
  kernels_.cast(stream_, d, wide);
  kernels_.add(stream_, gradient, wide, gradient);
}

void DeviceCausalLM::ensure_grads() {
  for (auto& [name, p] : params_)  // first use: zeroed gradients
    if (!p.g.data() && p.w.numel()) {
      p.g = empty(p.w.shape());
      p.g.zero(stream_);
    }
}

// The attention package's cuda kernels take bf16/fp16: an fp32 model runs the runtime's own.
bool DeviceCausalLM::attention_bound() const {
  return bf16_ && bound(slots_.attention);
}

float DeviceCausalLM::attention_scale() const {
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(cfg_.head_dim)));
}

// ---- the layers' calls --------------------------------------------------------------------

void DeviceCausalLM::linear(const DeviceTensor& x, const Param& w, const Param* bias,
                            DeviceTensor& y) {
  timed(Phase::kGemm, [&] { linear_forward(stream_, x, run(w), y); });
  if (bias) kernels_.bias_add(stream_, y, run(*bias));
}

void DeviceCausalLM::linear_grad(const DeviceTensor& x, Param& w, Param* bias,
                                 const DeviceTensor& dy, DeviceTensor* dx, bool accumulate_dx) {
  timed(Phase::kGemm, [&] { linear_backward(stream_, x, run(w), dy, dx, &w.g, accumulate_dx); });
  if (bias) kernels_.column_sum_add(stream_, dy, bias->g);
}

void DeviceCausalLM::norm(const DeviceTensor& x, const Param& w, DeviceTensor& y,
                          DeviceTensor* rstd) {
  if (bound(slots_.rms_norm)) {
    std::vector<kh_arg_t> args = {tensor_arg(&x), tensor_arg(&run(w)), float_arg(cfg_.eps),
                                  tensor_arg(&y)};
    if (rstd) args.push_back(tensor_arg(rstd));
    if (call_slot(slots_.rms_norm, kRMSNorm, false, args)) return;
  }
  kernels_.rms_norm(stream_, x, run(w), cfg_.eps, y, rstd);
}

namespace {
constexpr int64_t kNormWalkers = 2048;
}  // namespace

void DeviceCausalLM::norm_backward(const DeviceTensor& dy, const DeviceTensor& x, Param& w,
                                   const DeviceTensor& rstd, DeviceTensor& dx) {
  const int64_t C = w.w.numel(), R = x.numel() / C;
  if (bound(slots_.rms_norm)) {
    // The package reduces dweight (x's dtype) through W partial rows, one per walker: W sets
    // the backward's parallelism, so it is sized for a whole GPU (about 16 walkers per
    // multiprocessor on a 132-SM H100/H200, the norm package's own recommendation for short
    // rows; the q/k norms have T * heads rows of head_dim), not the host model's 64, which
    // made the Qwen3-0.6B step's RMSNorm backward 200 ms.
    DeviceTensor dweight = act({C});
    DeviceTensor workspace = empty({std::min<int64_t>(R, kNormWalkers), C});
    if (call_slot(slots_.rms_norm, kRMSNorm, true,
                  {tensor_arg(&dy), tensor_arg(&x), tensor_arg(&run(w)), tensor_arg(&rstd),
                   tensor_arg(&dx), tensor_arg(&dweight), tensor_arg(&workspace)})) {
      add_grad(w.g, dweight);  // the op overwrites dweight; the runtime adds
      return;
    }
  }
  DeviceTensor dweight = empty({C});
  kernels_.rms_norm_backward(stream_, dy, x, run(w), rstd, dx, dweight);
  add_grad(w.g, dweight);
}

void DeviceCausalLM::renorm(const DeviceTensor& x, const Param& w, DeviceTensor& y) {
  const int64_t rows = x.numel() / w.w.numel();
  DeviceTensor rstd = train_ ? empty({rows}) : DeviceTensor();
  norm(x, w, y, train_ ? &rstd : nullptr);
}

DeviceTensor DeviceCausalLM::add_norm(const DeviceTensor& branch, DeviceTensor residual,
                                      const Param& w, DeviceTensor& y, DeviceTensor* rstd) {
  if (!branch.data()) {
    norm(residual, w, y, rstd);
    return residual;
  }
  DeviceTensor out = train_ ? act(residual.shape()) : residual.view(residual.shape());
  if (bound(slots_.fused_add_rms_norm)) {
    std::vector<kh_arg_t> args = {tensor_arg(&branch), tensor_arg(&residual), tensor_arg(&run(w)),
                                  float_arg(cfg_.eps), tensor_arg(&y),        tensor_arg(&out)};
    if (rstd) args.push_back(tensor_arg(rstd));
    if (call_slot(slots_.fused_add_rms_norm, kFusedAddRMSNorm, false, args)) return out;
  }
  kernels_.add(stream_, residual, branch, out);
  norm(out, w, y, rstd);
  return out;
}

void DeviceCausalLM::add_norm_backward(const DeviceTensor& dy, const DeviceTensor* dresidual,
                                       const DeviceTensor& residual_out, Param& w,
                                       const DeviceTensor& rstd, DeviceTensor& dx) {
  if (bound(slots_.fused_add_rms_norm)) {
    const int64_t C = w.w.numel(), R = residual_out.numel() / C;
    DeviceTensor dweight = act({C});
    DeviceTensor workspace = empty({std::min<int64_t>(R, kNormWalkers), C});
    if (call_slot(
            slots_.fused_add_rms_norm, kFusedAddRMSNorm, true,
            {tensor_arg(&dy), tensor_arg(dresidual), tensor_arg(&residual_out), tensor_arg(&run(w)),
             tensor_arg(&rstd), tensor_arg(&dx), tensor_arg(&dweight), tensor_arg(&workspace)})) {
      add_grad(w.g, dweight);
      return;
    }
  }
  norm_backward(dy, residual_out, w, rstd, dx);
  if (dresidual) kernels_.add(stream_, dx, *dresidual, dx);
}

void DeviceCausalLM::qk_from_projections(const Layer& L, const DeviceTensor& q_pre,
                                         const DeviceTensor& k_pre, DeviceTensor& q,
                                         DeviceTensor& k, DeviceTensor* rstd_q,
                                         DeviceTensor* rstd_k) {
  const int64_t T = q_pre.shape()[0], NH = cfg_.heads, NKV = cfg_.kv_heads, HD = cfg_.head_dim;
  DeviceTensor qn = q.view({T * NH, HD}), kn = k.view({T * NKV, HD});
  if (rstd_q) {
    norm(q_pre.view({T * NH, HD}), *L.q_norm, qn, rstd_q);
    norm(k_pre.view({T * NKV, HD}), *L.k_norm, kn, rstd_k);
  } else {
    renorm(q_pre.view({T * NH, HD}), *L.q_norm, qn);
    renorm(k_pre.view({T * NKV, HD}), *L.k_norm, kn);
  }
  DeviceTensor q3 = q.view({T, NH, HD}), k3 = k.view({T, NKV, HD});
  rotary(q3, k3, false);
}

void DeviceCausalLM::rotary(DeviceTensor& q3, DeviceTensor& k3, bool backward) {
  if (bound(slots_.rotary) && call_slot(slots_.rotary, kRotaryEmbedding, backward,
                                        {tensor_arg(&positions_), tensor_arg(&q3), tensor_arg(&k3),
                                         tensor_arg(&cos_), tensor_arg(&sin_), int_arg(1)}))
    return;
  kernels_.rotary(stream_, positions_, q3, &k3, cos_, sin_, /*neox=*/true, backward);
}

// ---- one decoder layer: the host model's layer_forward / layer_backward on the device ------

void DeviceCausalLM::layer_forward(Layer& L, Saved& s, DeviceTensor& h, DeviceTensor& branch) {
  const int64_t H = cfg_.hidden, Q = cfg_.q_dim(), KV = cfg_.kv_dim(), F = cfg_.ffn;
  const int64_t NH = cfg_.heads, NKV = cfg_.kv_heads, HD = cfg_.head_dim;
  const int64_t B = batch_, S = len_, T = B * S;
  if (train_) {
    s.rstd1 = empty({T});
    s.rstd2 = empty({T});
  }
  DeviceTensor a = act({T, H});
  h = add_norm(branch, std::move(h), *L.attn_norm, a, train_ ? &s.rstd1 : nullptr);
  if (train_) s.h_in = h.view(h.shape());
  s.v = act({T, KV});
  linear(a, *L.wv, L.bv, s.v);
  s.q = act({T, Q});
  s.k = act({T, KV});
  if (L.q_norm) {  // Qwen3: RMSNorm over each head's head_dim, before RoPE
    s.q_pre = act({T, Q});
    s.k_pre = act({T, KV});
    linear(a, *L.wq, L.bq, s.q_pre);
    linear(a, *L.wk, L.bk, s.k_pre);
    if (train_) {
      s.rstd_q = empty({T * NH});
      s.rstd_k = empty({T * NKV});
    }
    qk_from_projections(L, s.q_pre, s.k_pre, s.q, s.k, train_ ? &s.rstd_q : nullptr,
                        train_ ? &s.rstd_k : nullptr);
  } else {
    linear(a, *L.wq, L.bq, s.q);
    linear(a, *L.wk, L.bk, s.k);
    DeviceTensor q3 = s.q.view({T, NH, HD}), k3 = s.k.view({T, NKV, HD});
    rotary(q3, k3, false);
  }
  a = DeviceTensor();
  DeviceTensor q4 = s.q.view({B, S, NH, HD}), k4 = s.k.view({B, S, NKV, HD}),
               v4 = s.v.view({B, S, NKV, HD});
  s.attn = act({B, S, NH, HD});
  if (train_) s.lse = empty({NH, T});
  DeviceTensor* lse = train_ ? &s.lse : nullptr;
  if (!(attention_bound() &&
        call_slot(slots_.attention, kAttention, false,
                  {tensor_arg(&q4), tensor_arg(&k4), tensor_arg(&v4), tensor_arg(nullptr),
                   tensor_arg(nullptr), int_arg(S), int_arg(1), int_arg(-1),
                   float_arg(attention_scale()), tensor_arg(&s.attn), tensor_arg(lse)})))
    timed(Phase::kAttention,
          [&] { kernels_.attention_forward(stream_, q4, k4, v4, attention_scale(), s.attn, lse); });
  if (prefilling_kv_) prefill_kv(L, s);
  if (L.q_norm) {  // backward recomputes them from q_pre and k_pre
    s.q = DeviceTensor();
    s.k = DeviceTensor();
  }
  branch = act({T, H});
  linear(s.attn.view({T, Q}), *L.wo, L.bo, branch);

  DeviceTensor m = act({T, H});
  h = add_norm(branch, std::move(h), *L.mlp_norm, m, train_ ? &s.rstd2 : nullptr);
  if (train_) s.h_mid = h.view(h.shape());
  s.gu = act({T, 2 * F});
  DeviceTensor act_out = act({T, F});
  linear(m, *L.gate_up, nullptr, s.gu);
  m = DeviceTensor();
  silu_and_mul(s.gu, act_out);
  branch = act({T, H});  // added to h by the next norm (the next layer's, or the final one)
  linear(act_out, *L.wdown, nullptr, branch);
  // silu(gate) * up is not kept: backward recomputes it from gu (cheap, and T * ffn fewer
  // elements held per layer). Eval keeps nothing: the blocks go back to the pool.
  if (!train_) s = Saved{};
}

void DeviceCausalLM::silu_and_mul(const DeviceTensor& gu, DeviceTensor& out) {
  if (!(bound(slots_.silu_and_mul) &&
        call_slot(slots_.silu_and_mul, kSiluAndMul, false, {tensor_arg(&gu), tensor_arg(&out)})))
    kernels_.silu_and_mul(stream_, gu, out);
}

// dh: the gradient of the layer's output stream in (both h_mid and the MLP branch get it), of
// its input stream out (the previous layer's h_mid and MLP branch, or the embedding).
void DeviceCausalLM::layer_backward(Layer& L, Saved& s, DeviceTensor& dh) {
  const int64_t H = cfg_.hidden, Q = cfg_.q_dim(), KV = cfg_.kv_dim(), F = cfg_.ffn;
  const int64_t NH = cfg_.heads, NKV = cfg_.kv_heads, HD = cfg_.head_dim;
  const int64_t B = batch_, S = len_, T = B * S;
  // MLP branch: dgu = [dgate | dup], and the fused weight's backward is both linears' at once.
  DeviceTensor act_out = act({T, F}), ds = act({T, F}), dgu = act({T, 2 * F}), dm = act({T, H});
  silu_and_mul(s.gu, act_out);  // recomputed (not kept by forward)
  linear_grad(act_out, *L.wdown, nullptr, dh, &ds, false);
  act_out = DeviceTensor();
  if (!(bound(slots_.silu_and_mul) &&
        call_slot(slots_.silu_and_mul, kSiluAndMul, true,
                  {tensor_arg(&ds), tensor_arg(&s.gu), tensor_arg(&dgu)})))
    kernels_.silu_and_mul_backward(stream_, ds, s.gu, dgu);
  ds = DeviceTensor();
  {
    DeviceTensor m = act({T, H});
    renorm(s.h_mid, *L.mlp_norm, m);
    linear_grad(m, *L.gate_up, nullptr, dgu, &dm, false);
  }
  dgu = DeviceTensor();
  DeviceTensor d_mid = act({T, H});
  add_norm_backward(dm, &dh, s.h_mid, *L.mlp_norm, s.rstd2, d_mid);
  dh = std::move(d_mid);
  dm = DeviceTensor();

  // Attention branch.
  DeviceTensor dattn = act({B, S, NH, HD});
  DeviceTensor dattn2 = dattn.view({T, Q});
  linear_grad(s.attn.view({T, Q}), *L.wo, L.bo, dh, &dattn2, false);
  if (L.q_norm) {
    s.q = act({T, Q});
    s.k = act({T, KV});
    qk_from_projections(L, s.q_pre, s.k_pre, s.q, s.k, nullptr, nullptr);
  }
  DeviceTensor dq = act({B, S, NH, HD}), dk = act({B, S, NKV, HD}), dv = act({B, S, NKV, HD});
  DeviceTensor q4 = s.q.view({B, S, NH, HD}), k4 = s.k.view({B, S, NKV, HD}),
               v4 = s.v.view({B, S, NKV, HD}), o4 = s.attn.view(s.attn.shape());
  bool served = false;
  if (attention_bound()) {
    // The package's cuda backward sums dq through an fp32 workspace of T * NH * (HD + 1).
    DeviceTensor workspace = empty({T * NH * (HD + 1)});
    served =
        call_slot(slots_.attention, kAttention, true,
                  {tensor_arg(&dattn), tensor_arg(&q4), tensor_arg(&k4), tensor_arg(&v4),
                   tensor_arg(&o4), tensor_arg(&s.lse), tensor_arg(nullptr), tensor_arg(nullptr),
                   int_arg(S), int_arg(S), int_arg(1), int_arg(-1), float_arg(attention_scale()),
                   tensor_arg(&dq), tensor_arg(&dk), tensor_arg(&dv), tensor_arg(&workspace)});
  }
  if (!served) {
    // The runtime's attention accumulates dk and dv in fp32 (atomics): narrowed for bf16.
    DeviceTensor dk32 = bf16_ ? empty(dk.shape()) : dk.view(dk.shape());
    DeviceTensor dv32 = bf16_ ? empty(dv.shape()) : dv.view(dv.shape());
    timed(Phase::kAttention, [&] {
      kernels_.attention_backward(stream_, dattn, q4, k4, v4, o4, s.lse, attention_scale(), dq,
                                  dk32, dv32);
    });
    if (bf16_) {
      kernels_.cast(stream_, dk32, dk);
      kernels_.cast(stream_, dv32, dv);
    }
  }
  dattn = DeviceTensor();
  s.q = DeviceTensor();
  s.k = DeviceTensor();
  DeviceTensor dq3 = dq.view({T, NH, HD}), dk3 = dk.view({T, NKV, HD});
  rotary(dq3, dk3, true);
  DeviceTensor dq2 = dq.view({T, Q}), dk2 = dk.view({T, KV});
  if (L.q_norm) {
    DeviceTensor dq_pre = act({T * NH, HD}), dk_pre = act({T * NKV, HD});
    norm_backward(dq.view({T * NH, HD}), s.q_pre.view({T * NH, HD}), *L.q_norm, s.rstd_q, dq_pre);
    norm_backward(dk.view({T * NKV, HD}), s.k_pre.view({T * NKV, HD}), *L.k_norm, s.rstd_k, dk_pre);
    dq2 = dq_pre.view({T, Q});
    dk2 = dk_pre.view({T, KV});
  }
  DeviceTensor da = act({T, H});
  {
    DeviceTensor a = act({T, H});
    renorm(s.h_in, *L.attn_norm, a);
    linear_grad(a, *L.wq, L.bq, dq2, &da, false);
    linear_grad(a, *L.wk, L.bk, dk2, &da, true);
    linear_grad(a, *L.wv, L.bv, dv.view({T, KV}), &da, true);
  }
  DeviceTensor d_in = act({T, H});
  add_norm_backward(da, &dh, s.h_in, *L.attn_norm, s.rstd1, d_in);
  dh = std::move(d_in);
}

// ---- the model ----------------------------------------------------------------------------

float DeviceCausalLM::forward(const int64_t* tokens, const int64_t* targets, int batch, int len,
                              Logits logits) {
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
  // What the last forward left goes back to the pool before this one allocates.
  logits_ = DeviceTensor();
  df_ = DeviceTensor();
  loss_ = DeviceTensor();
  std::vector<int64_t> positions(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) positions[t] = t % len;
  tokens_ = empty({T}, kI64);
  positions_ = empty({T}, kI64);
  tokens_.upload(stream_, tokens, static_cast<size_t>(T) * sizeof(int64_t));
  positions_.upload(stream_, positions.data(), positions.size() * sizeof(int64_t));

  DeviceTensor h = act({T, H}), branch;
  kernels_.embedding_forward(stream_, run(*emb_), tokens_, h);
  saved_.resize(layers_.size());
  for (size_t l = 0; l < layers_.size(); ++l) layer_forward(layers_[l], saved_[l], h, branch);
  f_ = act({T, H});
  rstd_f_ = train_ ? empty({T}) : DeviceTensor();
  h = add_norm(branch, std::move(h), *final_norm_, f_, train_ ? &rstd_f_ : nullptr);
  h_last_ = train_ ? std::move(h) : DeviceTensor();
  if (targets) {
    targets_ = empty({T}, kI64);
    targets_.upload(stream_, targets, static_cast<size_t>(T) * sizeof(int64_t));
  }
  // Train with targets, or a prefill that wants only the last logits: the loss without the
  // [T, V] logits.
  if (targets && (train_ || logits == Logits::kLast)) {
    const float loss = fused_loss(train_);
    if (!train_) last_token_logits();
    return loss;
  }
  if (logits == Logits::kLast) {
    last_token_logits();
    stream_.synchronize();
    return 0.f;
  }
  logits_ = act({T, V});
  linear(f_, *head_, nullptr, logits_);
  if (!targets) {
    stream_.synchronize();
    return 0.f;
  }
  // Eval with every logit (the parity tests): cross-entropy over them.
  loss_ = empty({T});
  if (!(bound(slots_.cross_entropy) && call_slot(slots_.cross_entropy, kCrossEntropy, false,
                                                 {tensor_arg(&logits_), tensor_arg(&targets_),
                                                  int_arg(kIgnoreIndex), tensor_arg(&loss_)})))
    kernels_.cross_entropy(stream_, logits_, targets_, kIgnoreIndex, 1.f, loss_, nullptr);
  std::vector<float> host(static_cast<size_t>(T));
  loss_.download(stream_, host.data(), host.size() * sizeof(float));
  stream_.synchronize();
  double sum = 0;
  for (float v : host) sum += v;
  return static_cast<float>(sum / static_cast<double>(T));
}

void DeviceCausalLM::last_token_logits() {
  const int64_t H = cfg_.hidden;
  DeviceTensor last = act({batch_, H});
  for (int64_t b = 0; b < batch_; ++b)
    stream_.copy(last.rows(b, 1).data(), f_.rows(b * len_ + len_ - 1, 1).data(),
                 last.bytes() / static_cast<size_t>(batch_), KH_COPY_D2D);
  logits_ = act({batch_, cfg_.vocab});
  linear(last, *head_, nullptr, logits_);
}

float DeviceCausalLM::fused_loss(bool grad) {
  const int64_t T = static_cast<int64_t>(batch_) * len_, H = cfg_.hidden, V = cfg_.vocab;
  const DeviceTensor& head = run(*head_);
  if (grad) {
    ensure_grads();
    df_ = act({T, H});
  }
  if (bound(slots_.linear_cross_entropy)) {
    // kernel-hub/softmax's FusedLinearCrossEntropy: the mean loss, and in train d_hidden and
    // d_weight (fp32, overwritten) of it. Its workspace (linear_ce.h): 256 bytes of scalars, the
    // per-token losses, then chunk rows of V logits (+ 256 to align the start).
    const int64_t chunk = std::min(T, options_.loss_chunk_rows);
    const int64_t elem = act_.bits / 8;
    const int64_t bytes = 256 + (T * 4 + 255) / 256 * 256 + chunk * V * elem + 256;
    DeviceTensor workspace = empty({bytes}, kU8);
    DeviceTensor loss = empty({1});
    bool served = false;
    if (grad) {
      // d_weight is overwritten: straight into a zero gradient, else through a scratch added.
      DeviceTensor dw = head_grad_zero_ ? head_->g.view(head_->g.shape()) : empty({V, H});
      served = call_slot(
          slots_.linear_cross_entropy, kFusedLinearCrossEntropy, false,
          {tensor_arg(&f_), tensor_arg(&head), tensor_arg(&targets_), int_arg(kIgnoreIndex),
           tensor_arg(&workspace), tensor_arg(&loss), tensor_arg(&df_), tensor_arg(&dw)});
      // The loss is the mean: its upstream gradient is 1, so the backward op (which scales
      // d_hidden and d_weight by it) has nothing to do.
      if (served && !head_grad_zero_) kernels_.add(stream_, head_->g, dw, head_->g);
      if (served) head_grad_zero_ = false;
    } else {
      served = call_slot(slots_.linear_cross_entropy, kFusedLinearCrossEntropy, false,
                         {tensor_arg(&f_), tensor_arg(&head), tensor_arg(&targets_),
                          int_arg(kIgnoreIndex), tensor_arg(&workspace), tensor_arg(&loss)});
    }
    if (served) {
      float host = 0;
      loss.download(stream_, &host, sizeof host);
      stream_.synchronize();
      return host;
    }
  }
  // The runtime's own: chunk rows of logits at a time (GEMM), cross-entropy with the gradient
  // (softmax - onehot) / T written over the logits, then dhidden = dlogits . W and
  // dW += dlogits^T . hidden (two GEMMs) before the next chunk reuses the buffer.
  loss_ = empty({T});
  const int64_t chunk = std::min(T, options_.loss_chunk_rows);
  DeviceTensor logits = act({chunk, V});
  bool ce_package = bound(slots_.cross_entropy);
  DeviceTensor dlogits = grad && ce_package ? act({chunk, V}) : DeviceTensor();
  const float scale = 1.0f / static_cast<float>(T);
  for (int64_t r0 = 0; r0 < T; r0 += chunk) {
    const int64_t n = std::min(chunk, T - r0);
    DeviceTensor f_c = f_.rows(r0, n), logits_c = logits.rows(0, n), loss_c = loss_.rows(r0, n);
    DeviceTensor targets_c = targets_.rows(r0, n);
    timed(Phase::kGemm, [&] { linear_forward(stream_, f_c, head, logits_c); });
    DeviceTensor dlogits_c = grad && ce_package ? dlogits.rows(0, n) : logits_c.view({n, V});
    std::vector<kh_arg_t> args = {tensor_arg(&logits_c), tensor_arg(&targets_c),
                                  int_arg(kIgnoreIndex)};
    if (grad)
      args.insert(args.end(), {float_arg(scale), tensor_arg(&loss_c), tensor_arg(&dlogits_c)});
    else
      args.push_back(tensor_arg(&loss_c));
    ce_package = ce_package && call_slot(slots_.cross_entropy, kCrossEntropy, false, args);
    if (!ce_package)  // dlogits_c: the package's buffer or, in place, the logits
      kernels_.cross_entropy(stream_, logits_c, targets_c, kIgnoreIndex, scale, loss_c,
                             grad ? &dlogits_c : nullptr);
    if (grad) {
      DeviceTensor df_c = df_.rows(r0, n);
      timed(Phase::kGemm,
            [&] { linear_backward(stream_, f_c, head, dlogits_c, &df_c, &head_->g, false); });
    }
  }
  if (grad) head_grad_zero_ = false;
  std::vector<float> host(static_cast<size_t>(T));
  loss_.download(stream_, host.data(), host.size() * sizeof(float));
  stream_.synchronize();
  double sum = 0;
  for (float v : host) sum += v;
  return static_cast<float>(sum / static_cast<double>(T));
}

void DeviceCausalLM::backward() {
  if (!train_ || !has_targets_ || !df_.data())
    throw Error(ErrorKind::kInvalidInput,
                "device model: backward needs a forward with targets in train mode");
  const int64_t T = static_cast<int64_t>(batch_) * len_, H = cfg_.hidden;
  // The loss's gradients for the LM head and the final hidden states came with the forward.
  DeviceTensor dh = act({T, H});
  add_norm_backward(df_, nullptr, h_last_, *final_norm_, rstd_f_, dh);
  df_ = DeviceTensor();
  for (size_t l = layers_.size(); l-- > 0;) {
    layer_backward(layers_[l], saved_[l], dh);
    saved_[l] = Saved{};  // this layer's activations go back to the pool
  }
  kernels_.embedding_backward(stream_, tokens_, dh, emb_->g);
  if (emb_ == head_) head_grad_zero_ = false;
  h_last_ = DeviceTensor();
}

void DeviceCausalLM::zero_grad() {
  for (auto& [name, p] : params_)
    if (p.g.data()) p.g.zero(stream_);
  head_grad_zero_ = true;
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
    kernels_.adamw(stream_, p.w, p.g, p.m, p.v, bf16_ ? &p.w16 : nullptr, adam, adam_t_);
  }
}

std::vector<float> DeviceCausalLM::download_logits() {
  if (!logits_.data())
    throw Error(ErrorKind::kInvalidInput,
                "device model: no logits (a train forward with targets computes the loss "
                "without them)");
  std::vector<float> host(static_cast<size_t>(logits_.numel()));
  if (bf16_) {
    DeviceTensor wide = empty(logits_.shape());
    kernels_.cast(stream_, logits_, wide);
    wide.download(stream_, host.data(), host.size() * sizeof(float));
  } else {
    logits_.download(stream_, host.data(), host.size() * sizeof(float));
  }
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
