// Small Qwen3 configurations that the demo runtime's GPU suites (test_gpu_demo_device,
// test_gpu_demo_decode) share.
#pragma once

#include "tools/demo/model_config.h"

namespace kh::demo {

// The tiny preset as Qwen3: q/k norms, 2 KV heads, tied embeddings (head_dim 16: the attention
// package's cuda kernels refuse it, so the runtime's own serve it).
inline ModelConfig tiny_qwen3() {
  ModelConfig c = preset("tiny");
  c.arch = Arch::kQwen3;
  c.qk_norm = true;
  c.kv_heads = 2;
  c.tie_embeddings = true;
  return c;
}

// head_dim 64, what the attention package's cuda kernels take: hidden 128, 4 query and 2 KV
// heads, `seq` positions.
inline ModelConfig qwen3_d64(int seq) {
  ModelConfig c = tiny_qwen3();
  c.hidden = 128;
  c.heads = 4;
  c.kv_heads = 2;
  c.head_dim = 64;
  c.seq = seq;
  return c;
}

}  // namespace kh::demo
