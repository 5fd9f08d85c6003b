#include "tools/demo/device_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernel_hub/kernel_hub.hpp"

namespace kh::demo {

namespace {

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
      kernels_(device),
      multiprocessors_(device_info(device).multiprocessors) {}

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
  // Decode's one q/k/v GEMM (device_decode.cpp; Qwen3: bf16, q/k norms, no biases): the bf16
  // run weights of q, k and v are the rows of one [q_dim + 2 kv_dim, hidden] tensor, which AdamW's
  // casts write into like any other.
  const bool fuse_qkv =
      bf16_ && cfg_.qk_norm && !optional_param("model.layers.0.self_attn.q_proj.bias");
  auto qkv_name = [](int l, const char* proj) {
    return fmt::format("model.layers.{}.self_attn.{}_proj.weight", l, proj);
  };
  if (fuse_qkv) {
    qkv_.resize(static_cast<size_t>(cfg_.layers));
    for (int l = 0; l < cfg_.layers; ++l) {
      const int64_t Q = cfg_.q_dim(), KV = cfg_.kv_dim();
      DeviceTensor& all = qkv_[static_cast<size_t>(l)].w16;
      all = empty({Q + 2 * KV, cfg_.hidden}, kBF16);
      int64_t row = 0;
      for (const char* proj : {"q", "k", "v"}) {
        Param& p = param(qkv_name(l, proj));
        p.w16 = all.rows(row, p.w.dim(0));
        row += p.w.dim(0);
      }
    }
  }
  if (bf16_)
    for (auto& [name, p] : params_) {
      if (!p.w16.data()) p.w16 = empty(p.w.shape(), kBF16);
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
        fuse_qkv ? &qkv_[static_cast<size_t>(l)] : nullptr,
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

void DeviceCausalLM::add_grad(Param& p, const DeviceTensor& d) {
  require_grad(p);
  if (d.shape() != p.g.shape())
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("device model: gradient {} for a parameter of {}", d.describe(),
                            p.g.describe()));
  // An add to p still pending lands first (the flush's entries run in parallel, one a parameter).
  if (std::any_of(pending_grads_.begin(), pending_grads_.end(),
                  [&p](const PendingGrad& e) { return e.p == &p; }))
    flush_grads();
  if (same_dtype(d.dtype(), kBF16)) {
    const bool overwrite = take_zero(p);
    pending_grads_.push_back({&p, d.view(d.shape()), overwrite});
    return;
  }
  if (!same_dtype(d.dtype(), kF32))
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("device model: gradient {}; float32 or bfloat16", d.describe()));
  // fp32 (an fp32 model's): at once.
  if (take_zero(p))
    stream_.copy(p.g.data(), d.data(), p.g.bytes(), KH_COPY_D2D);
  else
    kernels_.add(stream_, p.g, d, p.g);
}

void DeviceCausalLM::flush_grads() {
  if (pending_grads_.empty()) return;
  // A member, as AdamW's table: upload's host memory must stay valid until the stream reaches
  // the copy.
  std::vector<KhGradAdd>& table = pending_table_host_;
  table.clear();
  for (const PendingGrad& e : pending_grads_)
    table.push_back({e.p->g.data_as<float>(), e.d.data(), static_cast<long long>(e.d.numel()),
                     e.overwrite ? 1 : 0});
  const size_t bytes = table.size() * sizeof(KhGradAdd);
  if (pending_table_.bytes() != bytes) pending_table_ = empty({static_cast<int64_t>(bytes)}, kU8);
  pending_table_.upload(stream_, table.data(), bytes);
  kernels_.grad_add_multi(stream_, pending_table_, table.size());
  pending_grads_.clear();  // the temporaries go back to the pool, in stream order
}

void DeviceCausalLM::require_grad(const Param& p) {
  if (!p.g.data())  // a writer before its ensure_grad: the runtime's bug, not the input's
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("device model: a gradient of {} written before it was taken from the "
                            "pool (ensure_grad): a bug of the runtime's; please report it",
                            p.w.describe()));
}

bool DeviceCausalLM::take_zero(Param& p) {
  require_grad(p);
  const bool zero = p.g_zero;
  p.g_zero = false;
  return zero;
}

void DeviceCausalLM::clear_if_zero(Param& p) {
  if (take_zero(p)) p.g.zero(stream_);
}

void DeviceCausalLM::ensure_grad(Param& p) {
  if (p.g.data() || !p.w.numel()) return;
  p.g = empty(p.w.shape());
  p.g_zero = true;  // zero in value, its memory not cleared (Param::g_zero)
}

void DeviceCausalLM::ensure_layer_grads(Layer& L) {
  // One pool block for the layer's gradients (each at a 512-byte boundary): zero_grad gives the
  // block back whole, so that the next forward's activations of its size class can take it and
  // the backward's layers take blocks the layers above freed; a gradient a block of its own would
  // sit in size classes no activation asks for (Qwen3-0.6B's 8-24 MiB), the memory held.
  const bool qkv = L.qkv && !L.wq->g.data();
  auto align = [](int64_t n) { return (n + 127) / 128 * 128; };
  std::vector<Param*> missing;
  int64_t total = qkv ? align(L.qkv->w16.numel()) : 0;
  for (Param* p : {L.attn_norm, L.wq, L.wk, L.wv, L.bq, L.bk, L.bv, L.q_norm, L.k_norm, L.wo, L.bo,
                   L.mlp_norm, L.gate_up, L.wdown}) {
    if (!p || p->g.data() || !p->w.numel() || (qkv && (p == L.wq || p == L.wk || p == L.wv)))
      continue;
    missing.push_back(p);
    total += align(p->w.numel());
  }
  if (total == 0) return;
  const DeviceTensor all = empty({total});
  int64_t at = 0;
  auto take = [&](const std::vector<int64_t>& shape, int64_t n) {
    DeviceTensor t = all.rows(at, n).view(shape);
    at += align(n);
    return t;
  };
  if (qkv) {
    // The fused q/k/v's: q's, k's and v's are its rows, so that its dW GEMM writes all three
    // (layer_backward) and AdamW reads each as its own.
    L.qkv->g = take({L.qkv->w16.dim(0), L.qkv->w16.dim(1)}, L.qkv->w16.numel());
    int64_t row = 0;
    for (Param* p : {L.wq, L.wk, L.wv}) {
      p->g = L.qkv->g.rows(row, p->w.dim(0));
      p->g_zero = true;  // zero in value, its memory not cleared (Param::g_zero)
      row += p->w.dim(0);
    }
  }
  for (Param* p : missing) {
    p->g = take(p->w.shape(), p->w.numel());
    p->g_zero = true;
  }
}

// The attention package's cuda kernels take bf16/fp16: an fp32 model runs the runtime's own.
bool DeviceCausalLM::attention_bound() const {
  return bf16_ && bound(slots_.attention);
}

float DeviceCausalLM::attention_scale() const {
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(cfg_.head_dim)));
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
  fused_qkv_layers_ = 0;
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
  return mean_loss();
}

void DeviceCausalLM::backward() {
  if (!train_ || !has_targets_ || !df_.data())
    throw Error(ErrorKind::kInvalidInput,
                "device model: backward needs a train-mode forward with targets since the last "
                "zero_grad (the loss's gradients come with that forward)");
  const int64_t T = static_cast<int64_t>(batch_) * len_, H = cfg_.hidden;
  // The loss's gradients for the LM head and the final hidden states came with the forward.
  DeviceTensor dh = act({T, H});
  ensure_grad(*final_norm_);
  add_norm_backward(df_, nullptr, h_last_, *final_norm_, rstd_f_, dh);
  df_ = DeviceTensor();
  for (size_t l = layers_.size(); l-- > 0;) {
    layer_backward(layers_[l], saved_[l], dh);
    saved_[l] = Saved{};  // this layer's activations go back to the pool
  }
  ensure_grad(*emb_);
  clear_if_zero(*emb_);  // tied: the loss wrote it first
  kernels_.embedding_backward(stream_, tokens_, dh, emb_->g);
  flush_grads();
  h_last_ = DeviceTensor();
}

void DeviceCausalLM::zero_grad() {
  flush_grads();  // none pending after a backward; a partial one's adds land first
  // Released, as PyTorch's zero_grad(set_to_none=True): the next backward takes each layer's
  // gradients from the pool when it reaches the layer, so that they never sit beside the whole
  // forward's activations (2.2 GiB at Qwen3-0.6B: the LM head's alone live at the loss). The loss
  // gradient a train forward computed goes too (a backward after this is refused, not silently
  // missing the LM head's part).
  df_ = DeviceTensor();
  for (auto& [name, p] : params_) {
    p.g = DeviceTensor();
    p.g_zero = false;
  }
  for (Param& p : qkv_) p.g = DeviceTensor();  // the last of q's, k's and v's rows
}

void DeviceCausalLM::adam_step(const AdamConfig& adam) {
  flush_grads();
  std::vector<DeviceKernels::AdamwParam> list;
  for (auto& [name, p] : params_) {
    if (!p.g.data()) continue;  // none since zero_grad: skipped, as PyTorch skips a None grad
    clear_if_zero(p);           // taken but never written: AdamW reads zeros
    if (!p.m.data()) {
      p.m = empty(p.w.shape());
      p.v = empty(p.w.shape());
      p.m.zero(stream_);
      p.v.zero(stream_);
    }
    list.push_back({&p.w, &p.g, &p.m, &p.v, bf16_ ? &p.w16 : nullptr});
  }
  if (list.empty()) return;  // no gradient at all: no step (the bias corrections count steps)
  ++adam_t_;
  // Every parameter in one launch. Its table changes when the parameters' buffers do (the first
  // step allocates the moments; each backward takes the gradients from the pool, where they may
  // come back in another order): the upload is then, a few KiB.
  std::vector<KhAdamwTensor> table = DeviceKernels::adamw_table(list);
  const size_t bytes = table.size() * sizeof(KhAdamwTensor);
  if (table.size() != adam_table_host_.size() ||
      (bytes && std::memcmp(table.data(), adam_table_host_.data(), bytes) != 0)) {
    adam_table_host_ = std::move(table);
    adam_table_ = bytes ? empty({static_cast<int64_t>(bytes)}, kU8) : DeviceTensor();
    if (bytes) adam_table_.upload(stream_, adam_table_host_.data(), bytes);
  }
  kernels_.adamw_multi(stream_, adam_table_, adam_table_host_, adam, adam_t_);
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

std::vector<float> DeviceCausalLM::download_param(const std::string& name, bool gradient) {
  const bool gate = name.ends_with("mlp.gate_proj.weight");
  const bool up = name.ends_with("mlp.up_proj.weight");
  const Param& p =
      gate || up ? param(gate_up_name(name.substr(0, name.rfind("mlp.")))) : param(name);
  if (gradient) flush_grads();
  const DeviceTensor& t = gradient ? p.g : p.w;
  if (!t.data())
    throw Error(
        ErrorKind::kInvalidInput,
        fmt::format("model {}: {} has no gradient (none since zero_grad: run a train forward "
                    "and backward)",
                    cfg_.name, name));
  std::vector<float> all(static_cast<size_t>(t.numel()));
  if (!(gradient && p.g_zero)) {  // else zero in value (Param::g_zero), as `all` is
    t.download(stream_, all.data(), all.size() * sizeof(float));
    stream_.synchronize();
  }
  if (!gate && !up) return all;
  const size_t half = all.size() / 2;
  return gate ? std::vector<float>(all.begin(), all.begin() + static_cast<ptrdiff_t>(half))
              : std::vector<float>(all.begin() + static_cast<ptrdiff_t>(half), all.end());
}

}  // namespace kh::demo
