#include "tools/demo/checkpoint.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <nlohmann/json.hpp>

#include "kernel_hub/kernel_hub.hpp"
#include "tools/demo/file_util.h"
#include "tools/demo/safetensors.h"

namespace kh::demo {

namespace {

constexpr const char* kConfig = "config.json";
constexpr const char* kSingle = "model.safetensors";
constexpr const char* kIndex = "model.safetensors.index.json";
constexpr uint64_t kMaxJsonBytes = 64ull << 20;  // config.json and the index are small

nlohmann::json read_json(const std::filesystem::path& path) {
  const std::string text = read_file(path, kMaxJsonBytes);
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded())
    throw Error(ErrorKind::kInvalidInput, fmt::format("{}: not valid JSON", path.string()));
  return j;
}

// Tensor name -> shard file name, from the index or the single file.
std::map<std::string, std::string> shard_map(const std::filesystem::path& dir) {
  const auto index = dir / kIndex;
  if (!std::filesystem::exists(index)) {
    if (!std::filesystem::exists(dir / kSingle))
      throw Error(ErrorKind::kNotFound,
                  fmt::format("{}: no {} nor {}; a Transformers checkpoint directory holds its "
                              "weights in one of them",
                              dir.string(), kSingle, kIndex));
    return {};  // everything in model.safetensors
  }
  const nlohmann::json j = read_json(index);
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    throw Error(ErrorKind::kInvalidInput,
                fmt::format("{}: no \"weight_map\" object", index.string()));
  std::map<std::string, std::string> m;
  for (const auto& [name, file] : j["weight_map"].items()) {
    if (!file.is_string())
      throw Error(ErrorKind::kInvalidInput,
                  fmt::format("{}: weight_map[\"{}\"] is not a file name", index.string(), name));
    const std::string f = file.get<std::string>();
    // A shard is a file beside the index, never a path elsewhere.
    if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..")
      throw Error(ErrorKind::kInvalidInput,
                  fmt::format("{}: weight_map[\"{}\"] = \"{}\" is not a file name in the "
                              "checkpoint directory",
                              index.string(), name, f));
    m[name] = f;
  }
  return m;
}

}  // namespace

bool is_checkpoint_dir(const std::filesystem::path& path) {
  std::error_code ec;
  return std::filesystem::is_directory(path, ec) &&
         std::filesystem::is_regular_file(path / kConfig, ec);
}

Checkpoint load_checkpoint(const std::filesystem::path& dir) {
  if (!std::filesystem::is_directory(dir))
    throw Error(ErrorKind::kNotFound,
                fmt::format("{}: not a directory; --model takes a preset name or a Transformers "
                            "checkpoint directory (config.json + model.safetensors)",
                            dir.string()));
  if (!std::filesystem::exists(dir / kConfig))
    throw Error(ErrorKind::kNotFound,
                fmt::format("{}: no {}; a Transformers checkpoint directory holds the model's "
                            "config there",
                            dir.string(), kConfig));
  Checkpoint c;
  c.config = config_from_transformers(read_json(dir / kConfig), (dir / kConfig).string());
  c.config.validate();  // errors name config.json
  c.config.name = dir.string();

  // Which shard holds each tensor the model needs; shards are read one at a time.
  const std::map<std::string, std::string> shards = shard_map(dir);
  const std::string index_name = (dir / kIndex).string();
  std::map<std::string, std::vector<const WeightSpec*>> by_file;
  const std::vector<WeightSpec> specs = weight_specs(c.config);
  for (const WeightSpec& s : specs) {
    if (shards.empty()) {
      by_file[kSingle].push_back(&s);
      continue;
    }
    auto it = shards.find(s.name);
    if (it == shards.end())
      throw Error(ErrorKind::kInvalidInput,
                  fmt::format("{}: no tensor {} in weight_map; a {} model of this config needs it",
                              index_name, s.name, arch_name(c.config.arch)));
    by_file[it->second].push_back(&s);
  }
  for (const auto& [file, wanted] : by_file) {
    const auto path = dir / file;
    if (!std::filesystem::exists(path))
      throw Error(ErrorKind::kNotFound,
                  fmt::format("{}: shard {} is missing{}", path.string(), file,
                              shards.empty() ? "" : fmt::format(" ({} names it)", index_name)));
    const SafetensorsFile st = SafetensorsFile::read(path);
    for (const WeightSpec* s : wanted) {
      const SafetensorsTensor* t = st.find(s->name);
      if (!t)
        throw Error(ErrorKind::kInvalidInput,
                    fmt::format("{}: no tensor {}; a {} model of this config needs it",
                                path.string(), s->name, arch_name(c.config.arch)));
      if (t->shape != s->shape)
        throw Error(
            ErrorKind::kInvalidInput,
            fmt::format("{}: tensor {} has shape [{}]; expected [{}] from {}", path.string(),
                        s->name, fmt::join(t->shape, ", "), fmt::join(s->shape, ", "), kConfig));
      c.weights[s->name] = st.to_f32(*t);
    }
  }
  return c;
}

}  // namespace kh::demo
