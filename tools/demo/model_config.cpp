#include "tools/demo/model_config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>

#include <nlohmann/json.hpp>

#include "kernel_hub/kernel_hub.hpp"

namespace kh::demo {

const char* arch_name(Arch arch) {
  switch (arch) {
    case Arch::kLlama:
      return "llama";
    case Arch::kQwen2:
      return "qwen2";
    case Arch::kQwen3:
      return "qwen3";
  }
  return "?";
}

void ModelConfig::validate() const {
  auto bad = [&](const std::string& why) {
    throw Error(ErrorKind::kInvalidInput, fmt::format("model {}: {}", name, why));
  };
  if (vocab < 2 || hidden < 1 || layers < 1 || heads < 1 || kv_heads < 1 || head_dim < 1 ||
      ffn < 1 || seq < 2)
    bad(fmt::format(
        "vocab ({}), hidden ({}), layers ({}), heads ({}), kv heads ({}), head_dim ({}) and ffn "
        "({}) must be positive and seq ({}) at least 2",
        vocab, hidden, layers, heads, kv_heads, head_dim, ffn, seq));
  // Bounds past every model of the family (the widest today: hidden 16384, FFN 53248, 126
  // layers), so that the sizes the runtime computes stay in range (q_dim() and kv_dim() are int
  // products) and a hostile config.json cannot have it list millions of layers' weights or
  // allocate a model no device holds before a weight is read.
  constexpr int64_t kMaxWidth = int64_t{1} << 20, kMaxLayers = 1024, kMaxVocab = 1 << 24;
  constexpr int64_t kMaxParameters = int64_t{1} << 40;
  const int64_t q = int64_t{heads} * head_dim, kv = int64_t{kv_heads} * head_dim;
  if (hidden > kMaxWidth || ffn > kMaxWidth || q > kMaxWidth || kv > kMaxWidth)
    bad(
        fmt::format("hidden ({}), ffn ({}), heads x head_dim ({}) and kv heads x head_dim ({}) "
                    "must each be at most {}",
                    hidden, ffn, q, kv, kMaxWidth));
  if (layers > kMaxLayers) bad(fmt::format("{} layers; at most {}", layers, kMaxLayers));
  if (vocab > kMaxVocab) bad(fmt::format("a vocabulary of {}; at most {}", vocab, kMaxVocab));
  if (heads % kv_heads != 0)
    bad(fmt::format("{} query heads are not a multiple of {} key/value heads (GQA groups)", heads,
                    kv_heads));
  if (head_dim % 2 != 0) bad(fmt::format("head_dim {} is odd; rotary rotates pairs", head_dim));
  if (!(eps > 0.f)) bad(fmt::format("rms_norm_eps {} must be positive", eps));
  if (!(rope_theta > 1.0)) bad(fmt::format("rope_theta {} must be above 1", rope_theta));
  // Within the bounds above a weight has at most 2^44 elements and there are at most 15,363 of
  // them (1024 layers of 15 and 3 more): the sum fits in int64.
  int64_t parameters = 0;
  for (const WeightSpec& w : weight_specs(*this)) {
    int64_t n = 1;
    for (int64_t d : w.shape) n *= d;
    parameters += n;
  }
  if (parameters > kMaxParameters)
    bad(fmt::format("{} parameters; at most {} (2^40)", parameters, kMaxParameters));
}

std::string ModelConfig::describe() const {
  return fmt::format(
      "{}, vocab {}, hidden {}, {} layers, {} q / {} kv heads x {}, ffn {}{}{}{}, seq {}",
      arch_name(arch), vocab, hidden, layers, heads, kv_heads, head_dim, ffn,
      qk_norm ? ", q/k norm" : "", qkv_bias ? ", qkv bias" : "", tie_embeddings ? ", tied" : "",
      seq);
}

std::vector<std::string> preset_names() {
  return {"tiny", "qwen3-0.6b", "llama-3-8b-layers"};
}

ModelConfig preset(const std::string& name) {
  ModelConfig c;  // "tiny": the defaults
  c.name = name;
  if (name == "tiny") return c;
  if (name == "qwen3-0.6b") {  // Qwen/Qwen3-0.6B's config.json
    c.arch = Arch::kQwen3;
    c.vocab = 151936;
    c.hidden = 1024;
    c.layers = 28;
    c.heads = 16;
    c.kv_heads = 8;
    c.head_dim = 128;
    c.ffn = 3072;
    c.eps = 1e-6f;
    c.rope_theta = 1e6;
    c.qk_norm = true;
    c.tie_embeddings = true;
    return c;
  }
  if (name == "llama-3-8b-layers") {  // meta-llama/Meta-Llama-3-8B's layers, 2 of 32
    c.arch = Arch::kLlama;
    c.vocab = 32000;
    c.hidden = 4096;
    c.layers = 2;
    c.heads = 32;
    c.kv_heads = 8;
    c.head_dim = 128;
    c.ffn = 14336;
    c.eps = 1e-5f;
    c.rope_theta = 500000.0;
    return c;
  }
  throw Error(ErrorKind::kInvalidInput,
              fmt::format("--model {}: not a preset ({}) nor a checkpoint directory", name,
                          fmt::join(preset_names(), ", ")));
}

namespace {

// Reads config.json fields with errors that name the field and the file.
class Fields {
 public:
  Fields(const nlohmann::json& j, const std::string& source) : j_(j), source_(source) {}

  [[noreturn]] void refuse(const std::string& field, const std::string& why) const {
    throw Error(ErrorKind::kUnsupported, fmt::format("{}: field \"{}\": {}", source_, field, why));
  }
  bool has(const char* field) const { return j_.contains(field) && !j_[field].is_null(); }

  int integer(const char* field) const {
    if (!has(field)) refuse(field, "missing; the model's shape needs it");
    return integer_at(field, j_[field]);
  }
  int integer_or(const char* field, int fallback) const {
    return has(field) ? integer_at(field, j_[field]) : fallback;
  }
  double number_or(const char* field, double fallback) const {
    if (!has(field)) return fallback;
    if (!j_[field].is_number()) refuse(field, "not a number");
    return j_[field].get<double>();
  }
  bool boolean_or(const char* field, bool fallback) const {
    if (!has(field)) return fallback;
    if (!j_[field].is_boolean()) refuse(field, "not true or false");
    return j_[field].get<bool>();
  }
  std::string string_or(const char* field, const std::string& fallback) const {
    if (!has(field)) return fallback;
    if (!j_[field].is_string()) refuse(field, "not a string");
    return j_[field].get<std::string>();
  }

 private:
  int integer_at(const char* field, const nlohmann::json& v) const {
    if (!v.is_number_integer() || v.get<int64_t>() < 1 || v.get<int64_t>() > (1 << 24))
      refuse(field, fmt::format("{} is not an integer in 1..{}", v.dump(), 1 << 24));
    return v.get<int>();
  }

  const nlohmann::json& j_;
  const std::string& source_;
};

}  // namespace

ModelConfig config_from_transformers(const nlohmann::json& j, const std::string& source) {
  if (!j.is_object())
    throw Error(ErrorKind::kInvalidInput, fmt::format("{}: not a JSON object", source));
  const Fields f(j, source);
  ModelConfig c;
  c.name = source;
  const std::string type = f.string_or("model_type", "");
  if (type == "llama")
    c.arch = Arch::kLlama;
  else if (type == "qwen2")
    c.arch = Arch::kQwen2;
  else if (type == "qwen3")
    c.arch = Arch::kQwen3;
  else
    f.refuse("model_type", fmt::format("'{}'; the demo runtime implements llama, qwen2 and qwen3",
                                       type.empty() ? "(missing)" : type));
  if (j.contains("architectures") && j["architectures"].is_array())
    for (const auto& a : j["architectures"])
      if (!a.is_string() || !a.get<std::string>().ends_with("ForCausalLM"))
        f.refuse("architectures",
                 fmt::format("{}; the demo runtime runs *ForCausalLM models", a.dump()));

  c.vocab = f.integer("vocab_size");
  c.hidden = f.integer("hidden_size");
  c.layers = f.integer("num_hidden_layers");
  c.heads = f.integer("num_attention_heads");
  c.ffn = f.integer("intermediate_size");
  c.kv_heads = f.integer_or("num_key_value_heads", c.heads);
  // Qwen3Config's head_dim defaults to 128; Llama and Qwen2 derive it.
  c.head_dim = f.integer_or("head_dim", c.arch == Arch::kQwen3 ? 128 : c.hidden / c.heads);
  c.eps = static_cast<float>(f.number_or("rms_norm_eps", 1e-6));
  c.tie_embeddings = f.boolean_or("tie_word_embeddings", false);
  const bool attention_bias = f.boolean_or("attention_bias", false);
  c.qkv_bias = c.arch == Arch::kQwen2 || attention_bias;  // Qwen2: always on q, k, v
  c.o_bias = c.arch != Arch::kQwen2 && attention_bias;
  c.qk_norm = c.arch == Arch::kQwen3;

  const std::string act = f.string_or("hidden_act", "silu");
  if (act != "silu")
    f.refuse("hidden_act", fmt::format("'{}'; only silu (SwiGLU) is implemented", act));
  if (f.boolean_or("mlp_bias", false)) f.refuse("mlp_bias", "true; the MLP has no bias here");
  if (f.boolean_or("use_sliding_window", false))
    f.refuse("use_sliding_window", "true; the attention here is full causal");
  if (j.contains("layer_types") && j["layer_types"].is_array())
    for (const auto& t : j["layer_types"])
      if (t != "full_attention")
        f.refuse("layer_types",
                 fmt::format("{}; only full_attention layers are implemented", t.dump()));
  // RoPE: Transformers 4.x writes rope_theta and rope_scaling, 5.x rope_parameters.
  c.rope_theta = f.number_or("rope_theta", 10000.0);
  if (f.has("rope_scaling")) f.refuse("rope_scaling", "set; only the default RoPE is implemented");
  if (f.has("rope_parameters")) {
    const nlohmann::json& rp = j["rope_parameters"];
    if (!rp.is_object()) f.refuse("rope_parameters", "not an object");
    const Fields r(rp, source);
    const std::string rope_type = r.string_or("rope_type", "default");
    if (rope_type != "default")
      f.refuse("rope_parameters.rope_type",
               fmt::format("'{}'; only the default RoPE is implemented", rope_type));
    c.rope_theta = r.number_or("rope_theta", c.rope_theta);
  }
  return c;
}

std::vector<WeightSpec> weight_specs(const ModelConfig& c) {
  const int64_t V = c.vocab, H = c.hidden, F = c.ffn, Q = c.q_dim(), KV = c.kv_dim(),
                D = c.head_dim;
  std::vector<WeightSpec> w = {{"model.embed_tokens.weight", {V, H}}};
  for (int l = 0; l < c.layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    w.push_back({p + "input_layernorm.weight", {H}});
    w.push_back({p + "self_attn.q_proj.weight", {Q, H}});
    w.push_back({p + "self_attn.k_proj.weight", {KV, H}});
    w.push_back({p + "self_attn.v_proj.weight", {KV, H}});
    if (c.qkv_bias) {
      w.push_back({p + "self_attn.q_proj.bias", {Q}});
      w.push_back({p + "self_attn.k_proj.bias", {KV}});
      w.push_back({p + "self_attn.v_proj.bias", {KV}});
    }
    if (c.qk_norm) {
      w.push_back({p + "self_attn.q_norm.weight", {D}});
      w.push_back({p + "self_attn.k_norm.weight", {D}});
    }
    w.push_back({p + "self_attn.o_proj.weight", {H, Q}});
    if (c.o_bias) w.push_back({p + "self_attn.o_proj.bias", {H}});
    w.push_back({p + "post_attention_layernorm.weight", {H}});
    w.push_back({p + "mlp.gate_proj.weight", {F, H}});
    w.push_back({p + "mlp.up_proj.weight", {F, H}});
    w.push_back({p + "mlp.down_proj.weight", {H, F}});
  }
  w.push_back({"model.norm.weight", {H}});
  if (!c.tie_embeddings) w.push_back({"lm_head.weight", {V, H}});
  return w;
}

void rope_tables(const ModelConfig& config, std::vector<float>& cos, std::vector<float>& sin) {
  const int half = config.head_dim / 2;
  cos.resize(static_cast<size_t>(config.seq) * half);
  sin.resize(cos.size());
  for (int p = 0; p < config.seq; ++p)
    for (int j = 0; j < half; ++j) {
      const double inv = std::pow(config.rope_theta, -2.0 * j / config.head_dim);
      cos[static_cast<size_t>(p) * half + j] = static_cast<float>(std::cos(p * inv));
      sin[static_cast<size_t>(p) * half + j] = static_cast<float>(std::sin(p * inv));
    }
}

// The random initialization of a preset: norms 1, biases 0, the rest normal with 1 / sqrt(fan in);
// residual branches (o_proj, down_proj) start small (1 / sqrt(2L)) so the stack begins close to
// the identity. An untied embedding has unit rows (RMSNorm follows); a tied one is also the LM
// head, so it takes the head's scale.
float init_stddev(const ModelConfig& c, const std::string& name) {
  const float branch = 1.0f / std::sqrt(2.0f * static_cast<float>(c.layers));
  auto fan_in = [](int n) { return 1.0f / std::sqrt(static_cast<float>(n)); };
  if (name.ends_with("norm.weight") || name.ends_with(".bias")) return 0.f;
  if (name == "model.embed_tokens.weight") return c.tie_embeddings ? fan_in(c.hidden) : 1.0f;
  if (name.ends_with("o_proj.weight")) return fan_in(c.q_dim()) * branch;
  if (name.ends_with("down_proj.weight")) return fan_in(c.ffn) * branch;
  return fan_in(c.hidden);  // q, k, v, gate, up, lm_head
}

}  // namespace kh::demo
