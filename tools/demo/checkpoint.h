// Loads a Transformers checkpoint directory for the demo model: config.json (model_type llama,
// qwen2 or qwen3; model_config.h) and the weights, either model.safetensors or shards listed by
// model.safetensors.index.json ({"weight_map": {tensor name: shard file}}). F32, BF16 and F16
// tensors are converted to fp32. Every tensor weight_specs() lists must be there with its shape;
// others (lm_head.weight of a tied model, buffers of older exports) are ignored. Errors name the
// file and the tensor: a missing tensor, a shape with the expected and actual dims, a bad header
// (safetensors.h), a shard the index names that is not there.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "tools/demo/model_config.h"

namespace kh::demo {

struct Checkpoint {
  ModelConfig config;
  std::map<std::string, std::vector<float>> weights;  // by Transformers name, fp32
};

// Whether `path` looks like a checkpoint directory (a directory with a config.json).
bool is_checkpoint_dir(const std::filesystem::path& path);

// Throws kh::Error (kNotFound for missing files, kInvalidInput / kUnsupported for bad content).
Checkpoint load_checkpoint(const std::filesystem::path& dir);

}  // namespace kh::demo
