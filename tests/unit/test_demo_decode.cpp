// The decode runtime's cpu-side parts (tools/demo/device_decode.h): the paged KV cache's shape
// and size for a model, and the errors for a cache that cannot be built; the decode slots added
// to a runtime without a host fallback (the device model runs its own kernels when nothing is
// bound); the decode kernels' source compiles with the loader's NVRTC for sm_80 and sm_90a (NVRTC
// needs no GPU) with every entry point. The device parts are tests/gpu/test_gpu_demo_decode.cpp.
#include <gtest/gtest.h>

#include <string>

#include "kernel_hub/kernel_hub.hpp"
#include "loader/cuda_arch.h"
#include "loader/nvrtc.h"
#include "tools/demo/device_decode.h"
#include "tools/demo/model_config.h"

namespace kh::demo {
namespace {

TEST(DemoDecode, KernelSourceCompilesForAmpereAndHopperWithEveryEntryPoint) {
  const NvrtcInfo* compiler = nullptr;
  try {
    compiler = &nvrtc();
  } catch (const Error& e) {
    GTEST_SKIP() << "no NVRTC: " << e.what();
  }
  const std::string source = device_decode_source();
  EXPECT_EQ(source.find("#include"), std::string::npos) << "the prelude is inlined";
  for (const char* target : {"sm_80", "sm_90a"}) {
    const CudaArch arch = *CudaArch::parse(target);
    std::string cubin;
    try {
      cubin = nvrtc_compile_cubin(source, "demo_device_decode.cu",
                                  nvrtc_options(arch, compiler->version), "demo_device_decode.cu");
    } catch (const Error& e) {
      FAIL() << target << ": " << e.what();
    }
    for (const std::string& name : decode_kernel_names())
      EXPECT_NE(cubin.find(name + '\0'), std::string::npos) << target << " lacks " << name;
  }
}

TEST(DemoDecode, CacheShapeRoundsTheContextUpToWholePages) {
  ModelConfig qwen3 = preset("qwen3-0.6b");
  qwen3.seq = 4096;  // the rotary table bounds the context
  DecodeConfig d;
  d.max_batch = 64;
  d.max_context = 2048;  // the decode target: batch 64, context 2048
  KvCacheShape c = kv_cache_shape(qwen3, d);
  EXPECT_EQ(c.page_size, 64);  // the default
  EXPECT_EQ(c.pages_per_sequence, 32);
  EXPECT_EQ(c.pages, 64 * 32);
  EXPECT_EQ(c.kv_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  // K and V, 28 layers, 64 x 2048 tokens, 8 x 128 bf16 values each: 14 GiB.
  EXPECT_EQ(c.bytes(2), 2ull * 28 * 64 * 2048 * 8 * 128 * 2);

  d.max_context = 2049;  // one token more: one page more per sequence
  c = kv_cache_shape(qwen3, d);
  EXPECT_EQ(c.pages_per_sequence, 33);
  d.max_context = 0;  // the model's own length
  d.page_size = 16;
  c = kv_cache_shape(preset("tiny"), d);
  EXPECT_EQ(c.max_context, preset("tiny").seq);
  EXPECT_EQ(c.pages_per_sequence, 2);
}

TEST(DemoDecode, CacheErrorsNameTheFieldAndTheLimit) {
  const ModelConfig tiny = preset("tiny");
  auto error = [&](DecodeConfig d) {
    try {
      kv_cache_shape(tiny, d);
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
      return std::string(e.what());
    }
    return std::string("no error");
  };
  DecodeConfig d;
  d.max_batch = 0;
  EXPECT_NE(error(d).find("max_batch is 0"), std::string::npos) << error(d);
  d = {};
  d.page_size = 0;
  EXPECT_NE(error(d).find("page_size is 0"), std::string::npos) << error(d);
  d = {};
  d.max_context = tiny.seq + 1;
  EXPECT_NE(error(d).find("holds 1..32 tokens"), std::string::npos) << error(d);
  d.max_context = -1;
  EXPECT_NE(error(d).find("max_context is -1"), std::string::npos) << error(d);
}

TEST(DemoDecode, DecodeSlotsHaveNoHostFallback) {
  Runtime rt;
  const DecodeSlots s = add_decode_slots(rt);
  EXPECT_EQ(rt.slot_name(s.paged_attention), kPagedAttention);
  EXPECT_EQ(rt.slot_name(s.paged_kv_append), kPagedKVAppend);
  EXPECT_FALSE(rt.slot_bound(s.paged_attention, 0));
  EXPECT_FALSE(rt.slot_binding(s.paged_kv_append, 0, Mode::kEval).bound);
  EXPECT_NE(rt.forward(s.paged_attention, kCpuDevice, nullptr, 0, nullptr), KH_OK)
      << "nothing bound and no fallback: the call says so instead of running";
}

}  // namespace
}  // namespace kh::demo
