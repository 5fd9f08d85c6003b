#include "tools/demo/decode_roofline.h"

namespace kh::demo {

DecodeTraffic decode_step_traffic(const ModelConfig& c, int weight_bytes, int kv_bytes,
                                  int64_t batch, double context) {
  DecodeTraffic t;
  double elements = 0;
  for (const WeightSpec& w : weight_specs(c)) {
    // The embedding table is read whole only as the tied LM head; untied, lm_head is listed.
    if (w.name == "model.embed_tokens.weight" && !c.tie_embeddings) continue;
    double n = 1;
    for (int64_t d : w.shape) n *= static_cast<double>(d);
    elements += n;
  }
  t.weight_bytes = elements * weight_bytes;
  t.embedding_bytes = static_cast<double>(batch) * c.hidden * weight_bytes;
  t.kv_bytes = static_cast<double>(c.layers) * 2 * c.kv_heads * c.head_dim * kv_bytes * context *
               static_cast<double>(batch);
  return t;
}

double timed_decode_context(int prompt, int n) {
  return n < 3 ? 0 : prompt + (n + 1) / 2.0;
}

double peak_memory_bandwidth(int memory_clock_khz, int bus_width_bits) {
  return memory_clock_khz * 1e3 * bus_width_bits * 2 / 8;
}

double roofline_fraction(double bytes, double step_ms, double peak_bytes_per_s) {
  if (bytes <= 0 || step_ms <= 0 || peak_bytes_per_s <= 0) return 0;
  return bytes / (step_ms / 1e3) / peak_bytes_per_s;
}

}  // namespace kh::demo
