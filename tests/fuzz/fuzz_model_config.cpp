// Fuzz target: a checkpoint's config.json (tools/demo/model_config.h: config_from_transformers),
// read from checkpoint directories from anywhere before any weight is. What it accepts must
// validate or be refused by kh::Error, and a config that validates must describe its weights
// without overflow: every shape's element count fits in int64 and the products the runtime takes
// in int (q_dim, kv_dim) are what the int64 arithmetic gives (UBSan flags signed overflow).
#include <cstddef>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "hub/base/error.h"
#include "tools/demo/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const nlohmann::json j = nlohmann::json::parse(data, data + size, nullptr, false);
  if (j.is_discarded()) return 0;
  kh::demo::ModelConfig c;
  try {
    c = kh::demo::config_from_transformers(j, "fuzz");
    c.seq = 64;  // the demo's --seq, not the file's
    c.validate();
  } catch (const kh::Error&) {
    return 0;
  }
  if (static_cast<int64_t>(c.q_dim()) != int64_t{c.heads} * c.head_dim ||
      static_cast<int64_t>(c.kv_dim()) != int64_t{c.kv_heads} * c.head_dim)
    __builtin_trap();
  for (const kh::demo::WeightSpec& w : kh::demo::weight_specs(c)) {
    int64_t n = 1;
    for (int64_t d : w.shape)
      if (d < 1 || __builtin_mul_overflow(n, d, &n)) __builtin_trap();
    (void)kh::demo::init_stddev(c, w.name);
  }
  (void)c.describe();
  return 0;
}
