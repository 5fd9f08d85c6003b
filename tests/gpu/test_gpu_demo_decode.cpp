// GPU tests of the GPU-resident runtime's eval decode (tools/demo/device_decode.*; CTest label
// `gpu`, every test skips cleanly without a driver or a device): the paged KV cache filled by
// prefill and one decode step per token, against the same model's prefill logits of the whole
// sequence at each position (Llama and Qwen3 shapes, pages smaller than the context so that
// sequences span pages); the CUDA-graph step replayed against eager steps, bit for bit; greedy
// generate() against the host model's greedy continuation (the runtime's own fp32 kernels: nothing
// bound); the attention package's PagedKVAppend / PagedAttention serving decode (bf16 cache at the
// fp32 model's boundary) within bf16 tolerance, graph equal to eager; a bf16 Qwen3's one q/k/v
// projection, skinny GEMMs and folded norms against its own prefill (before and after a train
// step); the attention's fused append against the separate one, bit for bit; two overlapped
// halves of the batch; the greedy argmax alone (ties, odd widths, misaligned rows); and the
// argument errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "kernel_hub/kernel_hub.hpp"
#include "tests/gpu/demo_models.h"
#include "tests/gpu/gpu_device.h"
#include "tools/demo/device_decode.h"
#include "tools/demo/device_model.h"
#include "tools/demo/fallback_ops.h"
#include "tools/demo/model.h"
#include "tools/demo/model_config.h"
#include "tools/demo/skinny_gemm.h"
#include "tools/demo/staging.h"

namespace kh::demo {
namespace {

void expect_close(const float* got, const float* want, size_t n, float atol, float rtol,
                  const std::string& what) {
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    const float tol = atol + rtol * std::fabs(want[i]);
    if (!(std::fabs(got[i] - want[i]) <= tol) && ++bad <= 5)
      ADD_FAILURE() << what << "[" << i << "]: decode " << got[i] << ", prefill " << want[i];
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << n << " elements differ";
}

// head_dim 128 (Qwen3's: what the q/k norm epilogue takes), 2 query heads and 1 KV head over
// `hidden`.
ModelConfig qwen3_d128(int hidden) {
  ModelConfig c = qwen3_d64(160);
  c.hidden = hidden;
  c.heads = 2;
  c.kv_heads = 1;
  c.head_dim = 128;
  return c;
}

// Hidden 128 under 256-wide q/k/v heads and an FFN of 384, `layers` deep: on Hopper the o and
// down projections run on the skinny GEMM, so the norms between projections fold into them.
ModelConfig qwen3_folding(int layers) {
  ModelConfig c = qwen3_d128(128);
  c.ffn = 384;
  c.layers = layers;
  return c;
}

// A bf16 model (fp32 master weights), the decode fusions' dtype.
DeviceModelOptions bf16_model() {
  DeviceModelOptions o;
  o.dtype = kBF16;
  return o;
}

std::vector<int64_t> sequence_tokens(const ModelConfig& cfg, int batch, int len, int salt) {
  std::vector<int64_t> t(static_cast<size_t>(batch) * len);
  for (size_t i = 0; i < t.size(); ++i)
    t[i] = static_cast<int64_t>((i * 37 + 11 + static_cast<size_t>(salt) * 7) % cfg.vocab);
  return t;
}

// Rows [0, len) of each sequence of `all` ([batch, total]).
std::vector<int64_t> prefix(const std::vector<int64_t>& all, int batch, int total, int len) {
  std::vector<int64_t> p;
  for (int b = 0; b < batch; ++b)
    p.insert(p.end(), all.begin() + b * total, all.begin() + b * total + len);
  return p;
}

// Prefill the first P tokens of each of B sequences of `all` ([B, T]), then decode the next K
// with teacher forcing (eager steps, or the captured graph's replays): each step's logits.
std::vector<std::vector<float>> teacher_forced_logits(DeviceCausalLM& dev,
                                                      const std::vector<int64_t>& all, int B, int T,
                                                      int P, int K, bool graph) {
  const std::vector<int64_t> prompts = prefix(all, B, T, P);
  dev.prefill(prompts.data(), B, P);
  std::vector<std::vector<float>> logits;
  for (int j = 0; j < K; ++j) {
    std::vector<int64_t> step(B);
    for (int b = 0; b < B; ++b) step[b] = all[static_cast<size_t>(b) * T + P + j];
    dev.decode_step(step.data(), graph);
    logits.push_back(dev.download_decode_logits());
  }
  return logits;
}

class GpuDemoDecode : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    skip_ = gpu_test::no_cuda_device();
    if (skip_) return;
    runtime_ = new Runtime();
    slots_ = new DemoSlots(add_demo_slots(*runtime_));
    add_decode_slots(*runtime_);
    runtime_->set_mode(Mode::kEval);
  }
  void SetUp() override {
    if (skip_) GTEST_SKIP() << "no usable CUDA device: " << *skip_;
  }

  // Prefill `P` tokens, then decode `K` more one at a time (teacher forcing), each step's logits
  // against the whole sequence's prefill logits at that position.
  void decode_matches_prefill(const ModelConfig& cfg, Runtime& rt, const DemoSlots& slots,
                              int page_size, int P, int K, float atol, float rtol,
                              DeviceModelOptions options = {}, DecodeConfig decode = {}) {
    SCOPED_TRACE(cfg.describe());
    CausalLM host(cfg, slots, 5);
    DeviceCausalLM dev(host, slots, rt, 0, options);
    const int B = 2, T = P + K;
    const std::vector<int64_t> all = sequence_tokens(cfg, B, T, 0);
    dev.forward(all.data(), nullptr, B, T);
    const std::vector<float> want = dev.download_logits();
    const size_t V = static_cast<size_t>(cfg.vocab);
    decode.max_batch = B;
    decode.max_context = T;
    decode.page_size = page_size;
    dev.init_decode(rt, decode);
    const std::vector<int64_t> prompts = prefix(all, B, T, P);
    dev.prefill(prompts.data(), B, P);
    const std::vector<float> prefill_logits = dev.download_logits();
    for (int b = 0; b < B; ++b)  // causal: the prompt's logits are the sequence's first P rows
      expect_close(prefill_logits.data() + static_cast<size_t>(b) * P * V,
                   want.data() + static_cast<size_t>(b) * T * V, P * V, 1e-5f, 1e-5f,
                   "prefill logits, sequence " + std::to_string(b));
    for (int j = 0; j < K; ++j) {
      std::vector<int64_t> step(B);
      for (int b = 0; b < B; ++b) step[b] = all[static_cast<size_t>(b) * T + P + j];
      dev.decode_step(step.data(), /*graph=*/false);
      const std::vector<float> got = dev.download_decode_logits();
      for (int b = 0; b < B; ++b)
        expect_close(got.data() + static_cast<size_t>(b) * V,
                     want.data() + (static_cast<size_t>(b) * T + P + j) * V, V, atol, rtol,
                     "decode step " + std::to_string(j) + ", sequence " + std::to_string(b));
      if (HasFailure()) return;
    }
  }

  // A prefill of 2 x 4 tokens and one eager decode step (2 sequences of up to 16 tokens, pages of
  // 64), then check(dev): what the step ran.
  void after_one_step(const ModelConfig& cfg, Runtime& rt, const DemoSlots& slots,
                      const DeviceModelOptions& options, DecodeConfig decode,
                      const std::function<void(DeviceCausalLM&)>& check) {
    CausalLM host(cfg, slots, 3);
    DeviceCausalLM dev(host, slots, rt, 0, options);
    decode.max_batch = 2;
    decode.max_context = 16;
    decode.page_size = 64;
    dev.init_decode(rt, decode);
    const std::vector<int64_t> prompt = sequence_tokens(cfg, 2, 4, 3);
    dev.prefill(prompt.data(), 2, 4);
    dev.decode_step(nullptr, false);
    check(dev);
  }

  // The same teacher-forced steps eager and replayed from the graph: identical logits.
  void graph_equals_eager(const ModelConfig& cfg, Runtime& rt, const DemoSlots& slots,
                          int page_size, int P, int K, DeviceModelOptions options = {},
                          DecodeConfig decode = {}) {
    SCOPED_TRACE(cfg.describe());
    CausalLM host(cfg, slots, 9);
    DeviceCausalLM dev(host, slots, rt, 0, options);
    const int B = 3, T = P + K;
    const std::vector<int64_t> all = sequence_tokens(cfg, B, T, 1);
    const std::vector<int64_t> prompts = prefix(all, B, T, P);
    decode.max_batch = B;
    decode.max_context = T;
    decode.page_size = page_size;
    dev.init_decode(rt, decode);
    std::vector<std::vector<float>> runs[2];
    for (int graph = 0; graph < 2; ++graph)
      runs[graph] = teacher_forced_logits(dev, all, B, T, P, K, graph == 1);
    EXPECT_TRUE(dev.decode_graph_captured());
    EXPECT_EQ(dev.decode_overlaps(), decode.overlap == DecodeOverlap::kOn);
    if (!same_dtype(options.dtype, kBF16) || decode.gemm == DecodeGemm::kCublasLt) {
      EXPECT_EQ(dev.decode_skinny_gemms(), 0);
    } else if (decode.gemm == DecodeGemm::kSkinny) {
      EXPECT_EQ(dev.decode_skinny_gemms(), dev.decode_gemms());  // every one fits here
    }
    EXPECT_GT(dev.decode_gemms(), 0);
    for (int j = 0; j < K; ++j) {
      ASSERT_EQ(runs[0][j].size(), runs[1][j].size());
      EXPECT_EQ(std::memcmp(runs[0][j].data(), runs[1][j].data(), runs[0][j].size() * 4), 0)
          << "step " << j << ": the graph replay differs from the eager step";
    }
    // Free-running greedy decode (tokens fed back on the device) agrees too.
    const std::vector<int64_t> eager = dev.generate(prompts.data(), B, P, K, false);
    const std::vector<int64_t> graphed = dev.generate(prompts.data(), B, P, K, true);
    EXPECT_EQ(eager, graphed);
  }

  // A bf16 model's decode with its fusions (DecodeFuse::kOn) and without: check(dev, folds) after
  // one step (folds: on, on Hopper, where the skinny GEMM's epilogues run), then decode against
  // prefill within bf16 tolerance and the graph against eager steps.
  void fused_and_unfused(const ModelConfig& cfg, Runtime& rt, const DemoSlots& slots,
                         const std::function<void(DeviceCausalLM&, bool)>& check) {
    const bool hopper = kh::device_info(0).sm_major == 9;
    DecodeConfig unfused;
    unfused.fuse = DecodeFuse::kOff;
    for (const DecodeConfig& decode : {DecodeConfig{}, unfused}) {
      SCOPED_TRACE(decode.fuse == DecodeFuse::kOn ? "fused" : "unfused");
      const bool folds = hopper && decode.fuse == DecodeFuse::kOn;
      after_one_step(cfg, rt, slots, bf16_model(), decode,
                     [&](DeviceCausalLM& dev) { check(dev, folds); });
      decode_matches_prefill(cfg, rt, slots, 64, 70, 8, 6e-2f, 6e-2f, bf16_model(), decode);
      graph_equals_eager(cfg, rt, slots, 64, 70, 8, bf16_model(), decode);
    }
  }

  static std::string* skip_;
  static Runtime* runtime_;
  static DemoSlots* slots_;
};
std::string* GpuDemoDecode::skip_ = nullptr;
Runtime* GpuDemoDecode::runtime_ = nullptr;
DemoSlots* GpuDemoDecode::slots_ = nullptr;

TEST_F(GpuDemoDecode, DecodeStepLogitsEqualThePrefillLogitsAtEachPosition) {
  // Pages of 4 tokens: the prompt and the decoded tokens span several pages.
  decode_matches_prefill(preset("tiny"), *runtime_, *slots_, 4, 5, 12, 1e-4f, 1e-4f);
  decode_matches_prefill(tiny_qwen3(), *runtime_, *slots_, 4, 7, 10, 1e-4f, 1e-4f);
  decode_matches_prefill(tiny_qwen3(), *runtime_, *slots_, 64, 3, 6, 1e-4f, 1e-4f);
}

TEST_F(GpuDemoDecode, GraphReplayEqualsEagerDecodeBitForBit) {
  graph_equals_eager(preset("tiny"), *runtime_, *slots_, 8, 6, 10);
  graph_equals_eager(tiny_qwen3(), *runtime_, *slots_, 8, 6, 10);
}

TEST_F(GpuDemoDecode, GenerateMatchesTheHostModelsGreedyContinuation) {
  for (const ModelConfig& cfg : {preset("tiny"), tiny_qwen3()}) {
    SCOPED_TRACE(cfg.describe());
    CausalLM host(cfg, *slots_, 21);
    DeviceCausalLM dev(host, *slots_, *runtime_, 0);
    const int B = 2, P = 6, N = 20;
    const std::vector<int64_t> prompts = sequence_tokens(cfg, B, P, 2);
    dev.init_decode(*runtime_, {B, P + N, 8});
    const std::vector<int64_t> got = dev.generate(prompts.data(), B, P, N, true);
    ASSERT_EQ(got.size(), static_cast<size_t>(B * N));
    SlotCaller caller(*runtime_, -1);
    for (int b = 0; b < B; ++b) {
      std::vector<int64_t> seq(prompts.begin() + b * P, prompts.begin() + (b + 1) * P);
      for (int i = 0; i < N; ++i) {
        const int len = static_cast<int>(seq.size());
        host.forward(caller, *runtime_, seq.data(), nullptr, 1, len);
        const std::vector<float>& logits = host.logits();
        const auto last = logits.begin() + static_cast<ptrdiff_t>(len - 1) * cfg.vocab;
        const int64_t next = std::max_element(last, last + cfg.vocab) - last;
        EXPECT_EQ(got[static_cast<size_t>(b) * N + i], next)
            << "sequence " << b << ", generated token " << i;
        seq.push_back(next);
      }
    }
    EXPECT_EQ(dev.last_decode_steps(), N - 2);
    EXPECT_GT(dev.last_decode_ms(), 0.0);
    std::printf("[ decode   ] %s: %d x %d steps in %.3f ms (%.0f tokens/s, graph)\n",
                cfg.name.c_str(), B, dev.last_decode_steps(), dev.last_decode_ms(),
                B * dev.last_decode_steps() / dev.last_decode_ms() * 1000.0);
  }
}

// The packages a Qwen3 decode step binds: the attention package's PagedKVAppend and
// PagedAttention (and, with fused_append, PagedAttentionWithKVAppend), the norm package's
// pre-norms (the decode step adds the residual in FusedAddRMSNorm, in place, inside the captured
// graph) and the rotary package's QKNormRotaryEmbedding (q/k norms and RoPE in one pass, where
// the prefill runs the RMSNorm slot and the runtime's rotary: their logits agree).
DemoSlots bind_decode_packages(Runtime& rt, bool fused_append = true) {
  const std::string dir = KH_KERNEL_PACKAGES_DIR;
  const DemoSlots slots = add_device_demo_slots(rt);
  add_decode_slots(rt);
  rt.bind(kPagedKVAppend, dir + "/attention", Mode::kEval, 0);
  rt.bind(kPagedAttention, dir + "/attention", Mode::kEval, 0);
  if (fused_append) rt.bind(kPagedAttentionWithKVAppend, dir + "/attention", Mode::kEval, 0);
  rt.bind(kRMSNorm, dir + "/norm", Mode::kEval, 0);
  rt.bind(kFusedAddRMSNorm, dir + "/norm", Mode::kEval, 0);
  rt.bind(kQKNormRotaryEmbedding, dir + "/rotary", Mode::kEval, 0);
  rt.set_mode(Mode::kEval);
  return slots;
}

TEST_F(GpuDemoDecode, TheAttentionPackageServesDecodeOnABf16Cache) {
  Runtime rt;
  const DemoSlots slots = bind_decode_packages(rt);
  const ModelConfig cfg = qwen3_d64(160);
  {
    CausalLM host(cfg, slots, 3);
    DeviceCausalLM dev(host, slots, rt, 0);
    dev.init_decode(rt, {1, 16, 64});
    EXPECT_TRUE(dev.decode_uses_package());
    const std::vector<int64_t> prompt = sequence_tokens(cfg, 1, 4, 3);
    dev.prefill(prompt.data(), 1, 4);
    dev.decode_step(nullptr, false);
    const std::vector<std::string> served = dev.package_slots();
    EXPECT_NE(std::find(served.begin(), served.end(), kQKNormRotaryEmbedding), served.end());
    EXPECT_FALSE(dev.refusals().contains(kQKNormRotaryEmbedding));
    EXPECT_FALSE(dev.decode_fuses_qkv());  // fp32 weights: three projections
  }
  // 70 prompt tokens in pages of 64: the decoded tokens go to the second page. q, k and v are
  // rounded to bf16 at the package boundary: bf16 tolerance.
  decode_matches_prefill(cfg, rt, slots, 64, 70, 8, 3e-2f, 3e-2f);
  graph_equals_eager(cfg, rt, slots, 64, 70, 8);
}

// A bf16 Qwen3 decodes with one q/k/v GEMM into a row of q_dim + 2 kv_dim, which the packages
// read through token strides; the prefill's three projections run on views of the same weight
// rows, so the step's logits track the prefill's within bf16 tolerance.
TEST_F(GpuDemoDecode, Bf16Qwen3DecodesWithOneQkvProjection) {
  Runtime rt;
  const DemoSlots slots = bind_decode_packages(rt);
  const ModelConfig cfg = qwen3_d64(160);
  const DeviceModelOptions bf16 = bf16_model();
  after_one_step(cfg, rt, slots, bf16, {}, [&](DeviceCausalLM& dev) {
    EXPECT_TRUE(dev.decode_fuses_qkv());
    EXPECT_TRUE(dev.decode_fuses_append());
    const std::vector<std::string> served = dev.package_slots();
    EXPECT_NE(std::find(served.begin(), served.end(), kPagedAttentionWithKVAppend), served.end());
    // kAuto: on Hopper the skinny GEMM takes the wider-than-tall weights (here o: hidden 128 x
    // q_dim 256), the gate/up GEMM with SiluAndMul as its epilogue and the LM head with the
    // greedy argmax as its (DecodeFuse::kOn), cuBLASLt the rest; elsewhere cuBLASLt all.
    const bool hopper = kh::device_info(0).sm_major == 9;
    const int per_layer = int{skinny_preferred(2, cfg.hidden, cfg.q_dim(), true)} +
                          int{skinny_preferred(2, cfg.hidden, cfg.ffn, true)} + 1;
    EXPECT_EQ(per_layer, 2);
    EXPECT_EQ(dev.decode_fuses_silu(), hopper);
    EXPECT_EQ(dev.decode_fuses_head(), hopper);
    EXPECT_EQ(dev.decode_skinny_gemms(), hopper ? per_layer * cfg.layers + 1 : 0);
    EXPECT_EQ(dev.decode_gemms(), 4 * cfg.layers + 1);
    EXPECT_TRUE(dev.refusals().empty());
  });
  decode_matches_prefill(cfg, rt, slots, 64, 70, 8, 6e-2f, 6e-2f, bf16);
  graph_equals_eager(cfg, rt, slots, 64, 70, 8, bf16);
  // DecodeFuse::kOff: the SiluAndMul slot after a plain gate/up GEMM.
  DecodeConfig unfused;
  unfused.fuse = DecodeFuse::kOff;
  decode_matches_prefill(cfg, rt, slots, 64, 70, 8, 6e-2f, 6e-2f, bf16, unfused);
  after_one_step(cfg, rt, slots, bf16, unfused,
                 [](DeviceCausalLM& dev) { EXPECT_FALSE(dev.decode_fuses_silu()); });
}

// head_dim 128 (Qwen3's): on Hopper the fused q/k/v GEMM also runs the q/k norms and RoPE
// (DecodeFuse::kOn), so no QKNormRotaryEmbedding launch; its steps track the prefill within bf16
// tolerance with the fusion and without it, and replay from the graph bit for bit.
TEST_F(GpuDemoDecode, Bf16Qwen3HeadDim128FoldsTheQkNormsIntoTheQkvGemm) {
  Runtime rt;
  const DemoSlots slots = bind_decode_packages(rt);
  fused_and_unfused(qwen3_d128(256), rt, slots, [](DeviceCausalLM& dev, bool folds) {
    EXPECT_TRUE(dev.decode_fuses_qkv());
    EXPECT_EQ(dev.decode_fuses_qk_norm(), folds);
    EXPECT_EQ(dev.decode_fuses_silu(), folds);
  });
}

// Hidden 128 under 256-wide q/k/v heads and an FFN of 384: on Hopper the o and down projections
// run on the skinny GEMM, so the residual add + RMSNorm between projections folds into them
// (DecodeFuse::kOn): o and down add into the residual, gate/up and the next layer's q/k/v GEMM
// read the raw residual with the norm's weight folded into theirs and scale their rows by its
// rstd; the LM head (with the greedy argmax) norms that residual in its shared memory. The steps
// track the prefill within bf16 tolerance folded and unfolded, and replay from the graph bit for
// bit; the GEMM count stays 4 a layer and the LM head.
TEST_F(GpuDemoDecode, Bf16Qwen3FoldsTheNormsBetweenProjections) {
  Runtime rt;
  const DemoSlots slots = bind_decode_packages(rt);
  const ModelConfig cfg = qwen3_folding(3);
  const bool hopper = kh::device_info(0).sm_major == 9;
  fused_and_unfused(cfg, rt, slots, [&](DeviceCausalLM& dev, bool folds) {
    EXPECT_TRUE(dev.decode_fuses_qkv());
    EXPECT_EQ(dev.decode_fuses_norm(), folds);
    EXPECT_EQ(dev.decode_fuses_qk_norm(), folds);
    EXPECT_EQ(dev.decode_fuses_silu(), folds);
    EXPECT_EQ(dev.decode_gemms(), 4 * cfg.layers + 1);
    EXPECT_EQ(dev.decode_fuses_head(), folds);
    EXPECT_EQ(dev.decode_fuses_final_norm(), folds);
    // q/k/v, gate/up (their epilogues), o and down (preferred) and the LM head (its argmax) on
    // the skinny GEMM. Unfused: o and down only, the LM head on cuBLASLt.
    EXPECT_EQ(dev.decode_skinny_gemms(),
              hopper ? (folds ? 4 * cfg.layers + 1 : 2 * cfg.layers) : 0);
  });
}

// The folded norms' weights (W diag(norm weight), DecodeState) follow the model: after a train
// step moved every weight, the next decode step, replayed from the graph captured before it,
// tracks the new prefill logits (the step moved them far past the tolerance).
TEST_F(GpuDemoDecode, FoldedNormWeightsFollowATrainStep) {
  Runtime rt;
  const DemoSlots slots = bind_decode_packages(rt);
  const ModelConfig cfg = qwen3_folding(2);
  const DeviceModelOptions bf16 = bf16_model();
  CausalLM host(cfg, slots, 5);
  DeviceCausalLM dev(host, slots, rt, 0, bf16);
  const int B = 2, P = 6, T = P + 1;
  const size_t V = static_cast<size_t>(cfg.vocab);
  const std::vector<int64_t> all = sequence_tokens(cfg, B, T, 2);
  const std::vector<int64_t> prompts = prefix(all, B, T, P);
  std::vector<int64_t> next(B);
  for (int b = 0; b < B; ++b) next[b] = all[static_cast<size_t>(b) * T + P];
  DecodeConfig decode;
  decode.max_batch = B;
  decode.max_context = T;
  decode.page_size = 64;
  dev.init_decode(rt, decode);
  // The whole sequences' logits at position P, and the decode step's against them.
  auto step_matches_prefill = [&](const std::string& what) {
    dev.forward(all.data(), nullptr, B, T);
    const std::vector<float> want = dev.download_logits();
    dev.prefill(prompts.data(), B, P);
    dev.decode_step(next.data(), /*graph=*/true);
    const std::vector<float> got = dev.download_decode_logits();
    std::vector<float> at_p;
    for (int b = 0; b < B; ++b) {
      const float* w = want.data() + (static_cast<size_t>(b) * T + P) * V;
      expect_close(got.data() + b * V, w, V, 6e-2f, 6e-2f,
                   what + ", sequence " + std::to_string(b));
      at_p.insert(at_p.end(), w, w + V);
    }
    return at_p;
  };
  const std::vector<float> before = step_matches_prefill("before the train step");
  EXPECT_EQ(dev.decode_fuses_norm(), kh::device_info(0).sm_major == 9);
  rt.set_mode(Mode::kTrain);
  dev.forward(all.data(), all.data(), B, T);
  dev.backward();
  dev.adam_step(AdamConfig{});
  rt.set_mode(Mode::kEval);
  const std::vector<float> after = step_matches_prefill("after the train step");
  EXPECT_TRUE(dev.decode_graph_captured());
  size_t moved = 0;
  for (size_t i = 0; i < before.size(); ++i)
    moved += std::fabs(after[i] - before[i]) > 6e-2f + 6e-2f * std::fabs(before[i]);
  EXPECT_GT(moved, before.size() / 4) << "the train step hardly moved the logits: no test";
}

// PagedAttentionWithKVAppend (the attention reads the step's K and V from the q/k/v row and
// writes them into the cache) against PagedKVAppend then PagedAttention: the same bf16 values
// reach the same tensor-core math, so every step's logits and the cache's next use agree bit for
// bit, eager and replayed from the graph, with pages of 64 (the new token starts a page at 64)
// and of 16.
TEST_F(GpuDemoDecode, FusedAppendDecodesBitForBitWhatTheSeparateAppendDoes) {
  Runtime fused_rt, apart_rt;
  const DemoSlots fused_slots = bind_decode_packages(fused_rt, true);
  const DemoSlots apart_slots = bind_decode_packages(apart_rt, false);
  const ModelConfig cfg = qwen3_d64(160);
  const DeviceModelOptions bf16 = bf16_model();
  for (const int page_size : {64, 16}) {
    SCOPED_TRACE(::testing::Message() << "page_size " << page_size);
    const int B = 3, P = 63, K = 9, T = P + K;
    const std::vector<int64_t> all = sequence_tokens(cfg, B, T, 4);
    const std::vector<int64_t> prompts = prefix(all, B, T, P);
    std::vector<std::vector<float>> logits[2];
    std::vector<int64_t> generated[2];
    for (int fused = 0; fused < 2; ++fused) {
      Runtime& rt = fused ? fused_rt : apart_rt;
      const DemoSlots& slots = fused ? fused_slots : apart_slots;
      CausalLM host(cfg, slots, 13);
      DeviceCausalLM dev(host, slots, rt, 0, bf16);
      dev.init_decode(rt, {B, T, page_size});
      for (int graph = 0; graph < 2; ++graph)
        for (std::vector<float>& step : teacher_forced_logits(dev, all, B, T, P, K, graph == 1))
          logits[fused].push_back(std::move(step));
      EXPECT_EQ(dev.decode_fuses_append(), fused == 1);
      EXPECT_TRUE(dev.decode_fuses_qkv());
      EXPECT_TRUE(dev.refusals().empty());
      generated[fused] = dev.generate(prompts.data(), B, P, K, true);
    }
    ASSERT_EQ(logits[0].size(), logits[1].size());
    for (size_t j = 0; j < logits[0].size(); ++j) {
      ASSERT_EQ(logits[0][j].size(), logits[1][j].size());
      EXPECT_EQ(std::memcmp(logits[0][j].data(), logits[1][j].data(), logits[0][j].size() * 4), 0)
          << (j < K ? "eager" : "graph") << " step " << j % K
          << ": the fused append's logits differ from the separate append's";
    }
    EXPECT_EQ(generated[0], generated[1]);
  }
}

// DecodeGemm::kSkinny: the decode steps' GEMMs (2 and 3 rows of bf16) on the runtime's skinny
// GEMM, the prefill's on cuBLASLt; their logits agree, and the graph (PDL launches, split K:
// clusters on Hopper, the workspace elsewhere) replays what the eager steps compute.
TEST_F(GpuDemoDecode, SkinnyGemmDecodesWhatCublasLtDoes) {
  Runtime rt;
  const DemoSlots slots = bind_decode_packages(rt);
  const DeviceModelOptions bf16 = bf16_model();
  DecodeConfig skinny;
  skinny.gemm = DecodeGemm::kSkinny;
  decode_matches_prefill(qwen3_d64(160), rt, slots, 64, 70, 8, 6e-2f, 6e-2f, bf16, skinny);
  graph_equals_eager(qwen3_d64(160), rt, slots, 64, 70, 8, bf16, skinny);
}

// Two overlapped halves (DecodeOverlap::kOn; 3 sequences: halves of 1 and 2) compute what one
// batch does: the runtime's own kernels, and the packages on a bf16 Qwen3 with the one q/k/v GEMM,
// against the prefill and, replayed from the graph (the halves' streams and events captured),
// against the eager steps.
TEST_F(GpuDemoDecode, OverlappedHalvesDecodeWhatOneBatchDoes) {
  DecodeConfig halves;
  halves.overlap = DecodeOverlap::kOn;
  decode_matches_prefill(tiny_qwen3(), *runtime_, *slots_, 4, 7, 10, 1e-4f, 1e-4f, {}, halves);
  graph_equals_eager(tiny_qwen3(), *runtime_, *slots_, 8, 6, 10, {}, halves);
  Runtime rt;
  const DemoSlots slots = bind_decode_packages(rt);
  const DeviceModelOptions bf16 = bf16_model();
  decode_matches_prefill(qwen3_d64(160), rt, slots, 64, 70, 8, 6e-2f, 6e-2f, bf16, halves);
  graph_equals_eager(qwen3_d64(160), rt, slots, 64, 70, 8, bf16, halves);
  // Off by default.
  CausalLM host(qwen3_d64(160), slots, 3);
  DeviceCausalLM dev(host, slots, rt, 0, bf16);
  dev.init_decode(rt, {4, 16, 64});
  const std::vector<int64_t> prompt = sequence_tokens(qwen3_d64(160), 4, 4, 3);
  dev.prefill(prompt.data(), 4, 4);
  EXPECT_FALSE(dev.decode_overlaps());
}

// The greedy step's argmax on its own, at a real vocabulary's width and at odd ones (3: fewer
// logits than the elements before the row's first 16-byte boundary), with rows that start off the
// 16-byte grid (a column offset): a maximum planted twice in every row, the copies in one thread,
// in neighbouring lanes, in different warps and far apart, and a row of -inf only; the token is the
// host's std::max_element of the same values (the first index on ties), in fp32 and bf16, whether a
// row's CTAs meet in scratch (151936 logits: 19-26 CTAs a row on an H200) or one CTA reads it; the
// sequences advance by one and out_tokens gets the step's column, twice.
TEST_F(GpuDemoDecode, GreedyArgmaxTakesEachRowsFirstMaximum) {
  DevicePool pool(0);
  DeviceStream stream(0);
  DecodeKernels kernels(0);
  const int64_t B = 5;
  const int64_t apart[B] = {1, 9, 4096, 0, 40000};  // row 3: all -inf
  for (const DLDataType dtype : {kF32, kBF16}) {
    const bool bf16 = same_dtype(dtype, kBF16);
    for (const int64_t vocab : {int64_t{151936}, int64_t{1003}, int64_t{7}, int64_t{3}}) {
      for (const int64_t offset : {int64_t{0}, int64_t{3}}) {
        SCOPED_TRACE(::testing::Message()
                     << (bf16 ? "bf16" : "fp32") << " vocab " << vocab << " offset " << offset);
        const int64_t stride = vocab + offset + 5;
        // Random values in [-15.6, 15.6], below the two planted copies of the row's maximum (an
        // integer: exact in bf16 too, where the others are truncated).
        std::vector<float> host(static_cast<size_t>(B * stride));
        uint64_t state = 0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(vocab * 31 + offset);
        for (float& x : host) {
          state = state * 6364136223846793005ull + 1442695040888963407ull;
          x = static_cast<float>(static_cast<int>((state >> 33) % 2000) - 1000) / 64.f;
        }
        for (int64_t b = 0; b < B; ++b) {
          float* row = host.data() + b * stride + offset;
          if (apart[b] == 0) {
            std::fill(row, row + vocab, -std::numeric_limits<float>::infinity());
            continue;
          }
          const int64_t first = (b * 7919 + 13) % vocab;
          int64_t second = (first + apart[b]) % vocab;
          if (second == first) second = (first + 1) % vocab;
          row[first] = row[second] = 64.f + static_cast<float>(b);
        }
        if (bf16)  // what the kernel reads: the values truncated to bf16
          for (float& x : host) {
            uint32_t u;
            std::memcpy(&u, &x, 4);
            u &= 0xFFFF0000u;
            std::memcpy(&x, &u, 4);
          }
        std::vector<int64_t> want(B);
        for (int64_t b = 0; b < B; ++b) {
          const float* row = host.data() + b * stride + offset;
          want[b] = std::max_element(row, row + vocab) - row;
        }
        DeviceTensor logits(pool, {B, stride}, dtype);
        if (bf16) {
          std::vector<uint16_t> bits(host.size());
          for (size_t i = 0; i < host.size(); ++i) {
            uint32_t u;
            std::memcpy(&u, &host[i], 4);
            bits[i] = static_cast<uint16_t>(u >> 16);
          }
          logits.upload(stream, bits.data(), bits.size() * 2);
        } else {
          logits.upload(stream, host.data(), host.size() * 4);
        }
        DeviceTensor tokens(pool, {B}, kI64), positions(pool, {B}, kI64), seq_lens(pool, {B}, kI32),
            out_tokens(pool, {B, 4}, kI64), step(pool, {1}, kI32),
            scratch(pool, {DecodeKernels::argmax_scratch_elems(B)}, kI64);
        const std::vector<int64_t> pos0 = {10, 20, 30, 40, 50}, none(B * 4, -1);
        const std::vector<int32_t> len0 = {11, 21, 31, 41, 51}, step0 = {2};
        positions.upload(stream, pos0.data(), B * 8);
        seq_lens.upload(stream, len0.data(), B * 4);
        out_tokens.upload(stream, none.data(), none.size() * 8);
        step.upload(stream, step0.data(), 4);
        scratch.zero(stream);
        // Twice on the same logits: the CTAs of a row meet in scratch, which each launch must
        // leave zeroed for the next (a graph replays it), and the step column moves on.
        for (int call = 0; call < 2; ++call) {
          SCOPED_TRACE(::testing::Message() << "call " << call);
          kernels.argmax_advance(stream, logits, offset, stride, B, vocab, tokens, positions,
                                 seq_lens, out_tokens, step, scratch);
          std::vector<int64_t> got(B), pos(B), out(B * 4),
              left(static_cast<size_t>(scratch.numel()));
          std::vector<int32_t> len(B), st(1);
          tokens.download(stream, got.data(), B * 8);
          positions.download(stream, pos.data(), B * 8);
          seq_lens.download(stream, len.data(), B * 4);
          out_tokens.download(stream, out.data(), out.size() * 8);
          step.download(stream, st.data(), 4);
          scratch.download(stream, left.data(), left.size() * 8);
          stream.synchronize();
          EXPECT_EQ(got, want);
          for (int64_t b = 0; b < B; ++b) {
            EXPECT_EQ(pos[b], pos0[b] + 1 + call);
            EXPECT_EQ(len[b], len0[b] + 1 + call);
            EXPECT_EQ(out[b * 4 + 2 + call], want[b]) << "out_tokens[" << b << "][step]";
            EXPECT_EQ(out[b * 4 + 1], -1) << "out_tokens[" << b << "][1]: not a step's column";
          }
          EXPECT_EQ(st[0], 3 + call);
          EXPECT_EQ(left, std::vector<int64_t>(left.size(), 0)) << "scratch not left zeroed";
        }
      }
    }
  }
}

TEST_F(GpuDemoDecode, ArgumentErrorsSayWhatToDo) {
  const ModelConfig cfg = preset("tiny");
  CausalLM host(cfg, *slots_, 1);
  DeviceCausalLM dev(host, *slots_, *runtime_, 0);
  const std::vector<int64_t> prompts = sequence_tokens(cfg, 2, 4, 3);
  auto message = [](auto&& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([&] { dev.prefill(prompts.data(), 2, 4); }).find("init_decode"),
            std::string::npos);
  EXPECT_NE(message([&] { dev.decode_step(nullptr, false); }).find("before prefill"),
            std::string::npos);
  dev.init_decode(*runtime_, {2, 8, 4});
  EXPECT_NE(message([&] { dev.prefill(prompts.data(), 3, 4); }).find("1..2"), std::string::npos);
  EXPECT_NE(message([&] { dev.generate(prompts.data(), 2, 4, 6); }).find("cache positions"),
            std::string::npos);
  dev.prefill(prompts.data(), 2, 4);
  const int64_t bad[2] = {0, cfg.vocab};
  EXPECT_NE(message([&] { dev.decode_step(bad, false); }).find("outside the vocabulary"),
            std::string::npos);
  runtime_->set_mode(Mode::kTrain);
  EXPECT_NE(message([&] { dev.decode_step(nullptr, false); }).find("eval mode"), std::string::npos);
  runtime_->set_mode(Mode::kEval);
}

}  // namespace
}  // namespace kh::demo
