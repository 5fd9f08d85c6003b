// The demo model's architecture: the Llama / Qwen2 / Qwen3 family of decoder-only transformers,
// as Transformers' modeling_llama.py, modeling_qwen2.py and modeling_qwen3.py define it.
//
//   tokens -> embed_tokens -> L x [ input_layernorm -> q, k, v (+ bias: Qwen2, attention_bias)
//                                   -> q_norm, k_norm per head (Qwen3) -> RoPE (NeoX) on q, k
//                                   -> causal GQA attention (scale 1 / sqrt(head_dim))
//                                   -> o (+ bias: attention_bias, not Qwen2) -> + residual
//                                   post_attention_layernorm -> gate, up -> silu(gate) * up
//                                   -> down -> + residual ]
//          -> norm -> lm_head (or embed_tokens^T when tied) -> cross-entropy
//
// One ModelConfig describes a member of the family; presets() names the built-in ones and
// config_from_transformers() reads a checkpoint's config.json. weight_specs() lists the tensors
// a model of a config has, by their Transformers names and shapes (the checkpoint's layout:
// linear weights [out, in]), which is what the CPU model stores and a checkpoint must provide.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace kh::demo {

enum class Arch : uint8_t { kLlama, kQwen2, kQwen3 };
const char* arch_name(Arch arch);  // Transformers' model_type: "llama", "qwen2", "qwen3"

struct ModelConfig {
  std::string name = "tiny";  // the preset's name, or the checkpoint directory
  Arch arch = Arch::kLlama;
  int vocab = 256;
  int hidden = 64;
  int layers = 2;
  int heads = 4;     // query heads
  int kv_heads = 4;  // key/value heads (GQA: heads is a multiple of kv_heads)
  int head_dim = 16;
  int ffn = 128;  // intermediate_size (SiluAndMul width; gate|up is 2 * ffn)
  int seq = 32;   // the longest sequence this runtime runs (rotary cache rows)
  float eps = 1e-5f;
  double rope_theta = 10000.0;
  bool qkv_bias = false;  // bias on q_proj, k_proj, v_proj (Qwen2; attention_bias)
  bool o_bias = false;    // bias on o_proj (attention_bias in Llama and Qwen3)
  bool qk_norm = false;   // per-head RMSNorm of q and k before RoPE (Qwen3)
  bool tie_embeddings = false;

  int q_dim() const { return heads * head_dim; }
  int kv_dim() const { return kv_heads * head_dim; }
  // Throws kInvalidInput naming what is wrong.
  void validate() const;
  std::string describe() const;  // "qwen3, vocab 151936, hidden 1024, ..."
};

// The built-in presets: "tiny" (the CPU default), "qwen3-0.6b", "llama-3-8b-layers" (Llama 3 8B's
// layer shape, 2 layers, a 32k vocabulary: the layers at real size without the 8B).
std::vector<std::string> preset_names();
// Throws kInvalidInput naming the presets when `name` is none of them.
ModelConfig preset(const std::string& name);

// A Transformers config.json (model_type llama, qwen2 or qwen3). What the CPU model does not
// implement (another model_type, rope scaling, sliding windows, an activation other than silu,
// MLP bias) is refused naming the field; `source` names the file in errors.
ModelConfig config_from_transformers(const nlohmann::json& config, const std::string& source);

struct WeightSpec {
  std::string name;            // Transformers' name: "model.layers.0.self_attn.q_proj.weight"
  std::vector<int64_t> shape;  // as in the checkpoint
};
// Every tensor of the model, embeddings first, then layer by layer, then the final norm and
// (untied) lm_head.
std::vector<WeightSpec> weight_specs(const ModelConfig& config);

// The standard deviation of a weight's random initialization (0: norms start at 1, biases at 0):
// 1 / sqrt(fan in), residual branches (o_proj, down_proj) scaled by 1 / sqrt(2 * layers). Both
// the host model and the device model's on-device init use it.
float init_stddev(const ModelConfig& config, const std::string& name);

// The NeoX rotary cache of Transformers' default RoPE, [seq, head_dim / 2] each:
// inv_freq_j = theta^(-2j / head_dim), angle = pos * inv_freq_j; rotate_half pairs (j, j + half).
void rope_tables(const ModelConfig& config, std::vector<float>& cos, std::vector<float>& sin);

}  // namespace kh::demo
