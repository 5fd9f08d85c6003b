// The decode runtime's cpu-side parts (tools/demo/device_decode.h): the paged KV cache's shape
// and size for a model, and the errors for a cache that cannot be built; the decode slots added
// to a runtime without a host fallback (the device model runs its own kernels when nothing is
// bound); the decode kernels' source compiles with the loader's NVRTC for sm_80 and sm_90a (NVRTC
// needs no GPU) with every entry point, the greedy argmax within the register file at its 1024
// threads a CTA (the cubin's register counts); the decode roofline's byte arithmetic
// (decode_roofline.h) and the demo's decode options (resolve_decode: defaults and errors). The
// device parts are tests/gpu/test_gpu_demo_decode.cpp.
#include <elf.h>
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kernel_hub/kernel_hub.hpp"
#include "loader/cuda_arch.h"
#include "loader/nvrtc.h"
#include "tools/demo/decode_roofline.h"
#include "tools/demo/demo.h"
#include "tools/demo/device_decode.h"
#include "tools/demo/model_config.h"
#include "tools/demo/report.h"

namespace kh::demo {
namespace {

// Why the loader's NVRTC cannot be used here, or nothing (it needs no GPU).
std::optional<std::string> nvrtc_missing() {
  try {
    nvrtc();
  } catch (const Error& e) {
    return std::string(e.what());
  }
  return std::nullopt;
}

// The decode kernels' cubin for `target` ("sm_80", "sm_90a"); throws kh::Error.
std::string decode_cubin(const char* target) {
  return nvrtc_compile_cubin(device_decode_source(), "demo_device_decode.cu",
                             nvrtc_options(*CudaArch::parse(target), nvrtc().version),
                             "demo_device_decode.cu");
}

TEST(DemoDecode, KernelSourceCompilesForAmpereAndHopperWithEveryEntryPoint) {
  if (const auto why = nvrtc_missing()) GTEST_SKIP() << "no NVRTC: " << *why;
  EXPECT_EQ(std::string(device_decode_source()).find("#include"), std::string::npos)
      << "the prelude is inlined";
  for (const char* target : {"sm_80", "sm_90a"}) {
    std::string cubin;
    try {
      cubin = decode_cubin(target);
    } catch (const Error& e) {
      FAIL() << target << ": " << e.what();
    }
    for (const std::string& name : decode_kernel_names())
      EXPECT_NE(cubin.find(name + '\0'), std::string::npos) << target << " lacks " << name;
  }
}

// Registers per thread of each kernel of a cubin (EIATTR_REGCOUNT records of its .nv.info
// section, keyed by the .symtab symbols they name). The cubin is NVRTC's output: trusted, so
// the walk only checks that it stays inside the bytes.
std::map<std::string, uint32_t> cubin_registers(const std::string& cubin) {
  std::map<std::string, uint32_t> regs;
  const auto* base = reinterpret_cast<const unsigned char*>(cubin.data());
  auto fits = [&](uint64_t off, uint64_t n) {
    return off <= cubin.size() && n <= cubin.size() - off;
  };
  Elf64_Ehdr eh;
  if (!fits(0, sizeof eh)) return regs;
  std::memcpy(&eh, base, sizeof eh);
  if (eh.e_shentsize != sizeof(Elf64_Shdr) ||
      !fits(eh.e_shoff, uint64_t{eh.e_shnum} * sizeof(Elf64_Shdr)))
    return regs;
  std::vector<Elf64_Shdr> sh(eh.e_shnum);
  std::memcpy(sh.data(), base + eh.e_shoff, sh.size() * sizeof(Elf64_Shdr));
  if (eh.e_shstrndx >= sh.size()) return regs;
  auto name_of = [&](const Elf64_Shdr& strtab, uint32_t off) -> std::string {
    if (off >= strtab.sh_size || !fits(strtab.sh_offset, strtab.sh_size)) return {};
    const char* p = reinterpret_cast<const char*>(base + strtab.sh_offset + off);
    return std::string(p, strnlen(p, strtab.sh_size - off));
  };
  const Elf64_Shdr *symtab = nullptr, *info = nullptr;
  for (const Elf64_Shdr& s : sh) {
    const std::string n = name_of(sh[eh.e_shstrndx], s.sh_name);
    if (n == ".symtab") symtab = &s;
    if (n == ".nv.info") info = &s;
  }
  if (!symtab || !info || symtab->sh_link >= sh.size() ||
      !fits(symtab->sh_offset, symtab->sh_size) || !fits(info->sh_offset, info->sh_size))
    return regs;
  constexpr uint8_t kSval = 0x04, kRegcount = 0x2f;  // EIFMT_SVAL, EIATTR_REGCOUNT
  for (uint64_t at = 0; at + 4 <= info->sh_size;) {
    const unsigned char* e = base + info->sh_offset + at;
    uint16_t size = 0;
    std::memcpy(&size, e + 2, 2);
    const uint64_t payload = e[0] == kSval ? size : 0;
    if (at + 4 + payload > info->sh_size) break;
    if (e[0] == kSval && e[1] == kRegcount && size == 8) {
      uint32_t sym = 0, count = 0;
      std::memcpy(&sym, e + 4, 4);
      std::memcpy(&count, e + 8, 4);
      Elf64_Sym es;
      if ((uint64_t{sym} + 1) * sizeof es <= symtab->sh_size) {
        std::memcpy(&es, base + symtab->sh_offset + uint64_t{sym} * sizeof es, sizeof es);
        regs[name_of(sh[symtab->sh_link], es.st_name)] = count;
      }
    }
    at += 4 + payload;
  }
  return regs;
}

// The greedy argmax launches 1024 threads a CTA: its registers must fit an SM's 64K (at most 64
// a thread) on every target, or the launch fails (CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: what its
// first version did on the H200, which no CPU test could see). NVRTC's cubins say how many it took.
TEST(DemoDecode, TheArgmaxFitsItsThousandThreadsInTheRegisterFile) {
  if (const auto why = nvrtc_missing()) GTEST_SKIP() << "no NVRTC: " << *why;
  for (const char* target : {"sm_80", "sm_90a"}) {
    const std::map<std::string, uint32_t> regs = cubin_registers(decode_cubin(target));
    ASSERT_FALSE(regs.empty()) << target << ": no EIATTR_REGCOUNT in the cubin";
    for (const char* kernel : {"kh_argmax_advance_bf16", "kh_argmax_advance_f32"}) {
      ASSERT_TRUE(regs.count(kernel)) << target << " " << kernel;
      EXPECT_LE(regs.at(kernel) * kArgmaxThreads, 65536u)
          << target << " " << kernel << ": " << regs.at(kernel) << " registers a thread";
    }
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

// Qwen3-0.6B by hand: per layer 2 norms (2 x 1024), q/k/v/o (2048 + 1024 + 1024 + 2048 rows or
// columns of 1024), q/k norms (2 x 128), gate/up/down (3 x 3072 x 1024); 28 layers, the final
// norm and the tied embedding as the LM head: 596,049,920 weights, read once a step.
TEST(DemoDecodeRoofline, WeightsOnceTheHeadOnceAndTheCacheAtItsContext) {
  const ModelConfig q = preset("qwen3-0.6b");
  const double per_layer =
      2 * 1024 + (2048 + 1024 + 1024 + 2048) * 1024.0 + 2 * 128 + 3 * 3072 * 1024.0;
  const double weights = 28 * per_layer + 1024 + 151936 * 1024.0;
  EXPECT_EQ(weights, 596049920.0);
  DecodeTraffic t = decode_step_traffic(q, 2, 2, 64, 2048);
  EXPECT_EQ(t.weight_bytes, 2 * weights);
  EXPECT_EQ(t.embedding_bytes, 64 * 1024 * 2.0) << "a gather of the batch's rows, not the table";
  // layers x (K and V) x kv_heads x head_dim x 2 bytes = 114,688 bytes a token.
  EXPECT_EQ(t.kv_bytes, 114688.0 * 2048 * 64);
  EXPECT_EQ(t.total(), t.weight_bytes + t.embedding_bytes + t.kv_bytes);
  // fp32 weights and cache: twice the bytes; half the context: half the cache.
  DecodeTraffic f = decode_step_traffic(q, 4, 4, 64, 1024);
  EXPECT_EQ(f.weight_bytes, 2 * t.weight_bytes);
  EXPECT_EQ(f.kv_bytes, t.kv_bytes);

  // Untied (Llama): lm_head is read, the embedding table is not.
  ModelConfig tiny = preset("tiny");  // vocab 256, hidden 64, 2 layers, 4 x 16 heads, ffn 128
  ASSERT_FALSE(tiny.tie_embeddings);
  const double tiny_layer = 2 * 64 + 4 * 64 * 64.0 + 3 * 128 * 64.0;
  DecodeTraffic u = decode_step_traffic(tiny, 4, 4, 1, 0);
  EXPECT_EQ(u.weight_bytes, 4 * (2 * tiny_layer + 64 + 256 * 64.0));
  EXPECT_EQ(u.kv_bytes, 0);
  tiny.tie_embeddings = true;
  EXPECT_EQ(decode_step_traffic(tiny, 4, 4, 1, 0).weight_bytes, u.weight_bytes)
      << "tied or not, one [vocab, hidden] head is read";
}

TEST(DemoDecodeRoofline, TimedContextPeakAndFraction) {
  // generate() times steps 2 .. n - 1; step k attends prompt + k tokens.
  EXPECT_EQ(timed_decode_context(1792, 256), 1792 + 257 / 2.0);
  EXPECT_EQ(timed_decode_context(16, 3), 18);  // the one timed step, k = 2
  EXPECT_EQ(timed_decode_context(16, 2), 0) << "no timed step";
  // H100 SXM: 2619 MHz x 5120 bits x 2 / 8 = 3.35 TB/s.
  EXPECT_DOUBLE_EQ(peak_memory_bandwidth(2619000, 5120), 3.35232e12);
  EXPECT_DOUBLE_EQ(roofline_fraction(4.8e9, 1.0, kH200PeakBandwidth), 1.0);
  EXPECT_DOUBLE_EQ(roofline_fraction(2.4e9, 1.0, 4.8e12), 0.5);
  EXPECT_EQ(roofline_fraction(1e9, 0, 4.8e12), 0);
  EXPECT_EQ(roofline_fraction(1e9, 1, 0), 0);
}

std::string decode_error(const DemoOptions& o) {
  try {
    resolve_decode(o);
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
    return e.what();
  }
  return "";
}

TEST(DemoDecodeOptions, DefaultsBySizeAndTheSequenceCap) {
  DemoOptions o;  // tiny, seq 32
  DecodeShape d = resolve_decode(o);
  EXPECT_EQ(d.batch, 8);
  EXPECT_EQ(d.context, 32);
  o.model = preset("qwen3-0.6b");
  o.model.seq = 4096;
  d = resolve_decode(o);
  EXPECT_EQ(d.batch, 64);
  EXPECT_EQ(d.context, 2048);
  o.model.seq = 1024;
  EXPECT_EQ(resolve_decode(o).context, 1024);
  o.model.seq = kMinDecodeContext - 1;
  EXPECT_EQ(resolve_decode(o).context, -1) << "too short a model skips the decode";
  o.model.seq = 2048;
  o.decode_batch = 3;
  o.decode_context = 100;
  d = resolve_decode(o);
  EXPECT_EQ(d.batch, 3);
  EXPECT_EQ(d.context, 100);
  EXPECT_EQ(decode_generated_tokens(2048), 256);
  EXPECT_EQ(decode_generated_tokens(32), 16);
  EXPECT_EQ(decode_generated_tokens(kMinDecodeContext), kMinDecodeContext / 2);
}

TEST(DemoDecodeOptions, ErrorsNameTheOptionAndTheLimit) {
  DemoOptions o;
  o.decode_context = 33;
  std::string e = decode_error(o);
  EXPECT_NE(e.find("--decode-context 33"), std::string::npos) << e;
  EXPECT_NE(e.find("--seq 32"), std::string::npos) << e;
  o.decode_context = kMinDecodeContext - 1;
  e = decode_error(o);
  EXPECT_NE(e.find("8..32"), std::string::npos) << e;
  o.decode_context = 0;
  o.decode_batch = 5000;
  e = decode_error(o);
  EXPECT_NE(e.find("--decode-batch 5000"), std::string::npos) << e;
  o.decode_batch = -2;
  EXPECT_NE(decode_error(o).find("1..4096"), std::string::npos);
}

// `--json`'s decode.gemm says where the step's GEMMs ran, from the runtime's counts.
// A device run's slot lists: a slot whose package ran is a package slot; one the runtime served
// (nothing bound, refused, or bound but not called because the model runs its own, as the fp32
// model's Attention) a runtime slot; only a decode slot another decode slot stood in for is in
// neither.
// (A session-14 change had put every bound, uncalled slot in neither list: the fp32 model's
// Attention vanished from the report, which DemoGpu.CudaFp32RunsTheRuntimesOwnAttention caught on
// the GPU.)
TEST(DemoDecodeJson, SlotListsSayWhoServedEachSlot) {
  EXPECT_EQ(slot_served("Attention", true, false, true), SlotServed::kPackage);
  EXPECT_EQ(slot_served("Attention", false, false, true), SlotServed::kRuntime);
  EXPECT_EQ(slot_served("Attention", false, true, true), SlotServed::kRuntime);
  EXPECT_EQ(slot_served("RMSNorm", false, false, false), SlotServed::kRuntime);
  EXPECT_EQ(slot_served(kPagedAttention, false, false, true), SlotServed::kNeither);
  EXPECT_EQ(slot_served(kPagedKVAppend, false, false, true), SlotServed::kNeither);
  EXPECT_EQ(slot_served(kPagedAttention, false, true, true), SlotServed::kRuntime);
  EXPECT_EQ(slot_served(kPagedAttention, false, false, false), SlotServed::kRuntime);
  EXPECT_EQ(slot_served(kPagedAttention, true, false, true), SlotServed::kPackage);
  EXPECT_EQ(slot_served(kPagedAttentionWithKVAppend, false, false, true), SlotServed::kNeither);
  EXPECT_EQ(slot_served(kPagedAttentionWithKVAppend, false, true, true), SlotServed::kRuntime);
}

TEST(DemoDecodeJson, GemmSaysWhereTheStepsGemmsRan) {
  DemoRun run;
  run.on_device = true;
  run.decoded = true;
  run.decode_gemms = 113;  // Qwen3-0.6B: 4 a layer + the LM head
  for (auto [skinny, label] :
       {std::pair{0, "cuBLASLt"}, std::pair{56, "skinny + cuBLASLt"}, std::pair{113, "skinny"}}) {
    run.decode_skinny_gemms = skinny;
    const nlohmann::json d =
        demo_json({}, DemoOptions{}, KernelizeReport{}, run)["device_run"]["decode"];
    EXPECT_EQ(d["gemm"], label);
    EXPECT_EQ(d["skinny_gemms"], skinny);
    EXPECT_EQ(d["gemms"], 113);
  }
}

}  // namespace
}  // namespace kh::demo
