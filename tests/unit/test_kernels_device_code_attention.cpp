// The attention package's device code without a GPU:
//  - attention.cu compiles with NVRTC (no -I path, as the loader compiles it) for sm_80 and for
//    sm_90a, the target the loader's NVRTC uses on Hopper, with no warnings and no spills but
//    the known ones (bounded);
//  - the Hopper forward (attn_fwd90_*, wgmma) is in the sm_90a code only;
//  - the forward and backward ops launch attn_fwd90 / attn_bwd90 where the device code has them
//    (head_dim 64 and 128) and the portable attn_fwd / attn_bwd elsewhere, decode the
//    tensor-core attn_decode_tc for head_dim 64 and 128, every launch names a kernel of that device's code and fits
//    its launch bounds and the 227 KiB shared-memory limit (a recording backend with sm_80's
//    kernels on device 0 and sm_90a's on device 1).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/attention/attention_params.h"
#include "tests/unit/device_info_a100.h"
#include "tests/unit/test_kernels_attention_cases.h"
#include "tests/unit/test_kernels_device_util.h"

namespace kh::kernels_test {
namespace {

class AttentionDeviceSourceCompiles
    : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(AttentionDeviceSourceCompiles, WithNvrtcAndNoSpills) {
  if (!Nvrtc::get().ok()) GTEST_SKIP() << Nvrtc::get().load_error;
  // Known spills (measured with nvcc 13.0, the same ptxas): the head_dim 256 forward keeps a
  // 16 x 256 output tile and Q fragments per warp at 255 registers; the head_dim 128 backward
  // 8 (nvcc) to 32 (NVRTC, sm_90a) bytes. The Hopper backward (NVRTC: 80 bytes at d128, less at
  // d64) keeps loop invariants of its producer warpgroup, which runs on 40 registers, in local
  // memory, and at d128 a few of the consumers' (232 registers); 24/240 instead removes the
  // consumers' but ran 4% slower on the H200 (RESULTS.md). The Hopper forward spills none.
  expect_compiles_without_spills(std::get<0>(GetParam()), std::get<1>(GetParam()),
                                 {{"attn_fwd_bf16_d256", 160},
                                  {"attn_fwd_fp16_d256", 160},
                                  {"attn_bwd_bf16_d128", 32},
                                  {"attn_bwd_fp16_d128", 32},
                                  {"attn_bwd90_bf16_d128", 96},
                                  {"attn_bwd90_fp16_d128", 96},
                                  {"attn_bwd90_bf16_d64", 64},
                                  {"attn_bwd90_fp16_d64", 64}});
}

INSTANTIATE_TEST_SUITE_P(Kernels, AttentionDeviceSourceCompiles,
                         ::testing::Combine(::testing::Values("attention"),
                                            ::testing::Values("sm_80", "sm_90a")),
                         package_sm_name);

class AttentionCudaDispatch : public ::testing::Test {
 protected:
  void SetUp() override { set_device_backend(&backend_); }
  void TearDown() override { set_device_backend(nullptr); }
  RecordingBackend backend_;
};

// attention_forward's query, key (also the value) and output on device `dev`: padded
// [B, S, H or HK, d] tensors (views into host memory the recording backend never reads).
struct ForwardTensors {
  ForwardTensors(int dev, int dtype, int64_t B, int64_t S, int64_t H, int64_t HK, int64_t d)
      : S(S),
        q(dtype, B * S, H * d),
        k(dtype, B * S, HK * d),
        o(dtype, B * S, H * d),
        qv(q.dl(), {B, S, H, d}),
        kv(k.dl(), {B, S, HK, d}),
        ov(o.dl(), {B, S, H, d}),
        Q(on_cuda(&qv.t, dev)),
        K(on_cuda(&kv.t, dev)),
        O(on_cuda(&ov.t, dev)) {}
  ForwardTensors(const ForwardTensors&) = delete;  // the views point into the members
  // The causal forward without an LSE.
  int32_t call(const Package& pkg, std::string* err) {
    return pkg.call("attention_forward",
                    {targ(&Q), targ(&K), targ(&K), targ(nullptr), targ(nullptr), iarg(S), iarg(1),
                     iarg(-1), farg(0.125), targ(&O), targ(nullptr)},
                    err);
  }
  int64_t S;
  HostTensor q, k, o;
  attention_cases::NdView qv, kv, ov;
  DLTensor Q, K, O;
};

// ForwardTensors in bf16 with the forward's LSE and the backward's least workspace: the causal
// ops with a window (-1: none), the backward's outputs dq, dk, dv in q's and k's bytes.
struct BackwardTensors : ForwardTensors {
  BackwardTensors(int dev, int64_t B, int64_t S, int64_t H, int64_t HK, int64_t d)
      : ForwardTensors(dev, kBF16, B, S, H, HK, d),
        lse(kFP32, H, B * S),
        ws(kFP32, 1, B * S * H * (d + 1)),
        L(on_cuda(lse.dl(), dev)),
        W(on_cuda(ws.dl(), dev)) {}
  int32_t forward(const Package& pkg, int64_t window, std::string* err) {
    return pkg.call("attention_forward",
                    {targ(&Q), targ(&K), targ(&K), targ(nullptr), targ(nullptr), iarg(S), iarg(1),
                     iarg(window), farg(0.125), targ(&O), targ(&L)},
                    err);
  }
  int32_t backward(const Package& pkg, int64_t window, std::string* err) {
    return pkg.call("attention_backward",
                    {targ(&O), targ(&Q), targ(&K), targ(&K), targ(&O), targ(&L), targ(nullptr),
                     targ(nullptr), iarg(S), iarg(S), iarg(1), iarg(window), farg(0.125), targ(&Q),
                     targ(&K), targ(&K), targ(&W)},
                    err);
  }
  HostTensor lse, ws;
  DLTensor L, W;
};

// The backward grid's tile order (kh_attn_tile_of): every (block, group) exactly
// once; group order (a group's blocks side by side) before the tail; in the tail, blocks longest
// (0) first across the tail's groups, which are whole groups at the grid's end.
TEST(AttentionTileOrder, CoversTheGridOnceAndEndsLongestFirst) {
  for (const int nb : {1, 3, 16})
    for (const int groups : {1, 5, 64})
      for (const int tail : {0, 1, nb, 2 * nb + 1, 264, 1 << 30}) {
        SCOPED_TRACE(testing::Message() << nb << " blocks, " << groups << " groups, tail " << tail);
        std::set<std::pair<int, int>> seen;
        const int tail_groups = std::min(groups, tail > 0 ? (tail + nb - 1) / nb : 0);
        const int head = (groups - tail_groups) * nb;
        int last_blk = -1;
        for (int lin = 0; lin < nb * groups; ++lin) {
          const kh_attn_tile_t t = kh_attn_tile_of(lin, nb, groups, tail);
          ASSERT_GE(t.blk, 0);
          ASSERT_LT(t.blk, nb);
          ASSERT_GE(t.group, 0);
          ASSERT_LT(t.group, groups);
          ASSERT_TRUE(seen.insert({t.blk, t.group}).second) << "tile taken twice at " << lin;
          if (lin < head) {
            EXPECT_EQ(t.group, lin / nb);
            EXPECT_EQ(t.blk, lin % nb);
          } else {
            EXPECT_GE(t.group, groups - tail_groups);
            EXPECT_GE(t.blk, last_blk) << "the tail goes longest block first";
            last_blk = t.blk;
          }
        }
        EXPECT_EQ(seen.size(), static_cast<size_t>(nb * groups));
      }
}

// The persistent forward's units (kh_attn_fwd90_tile_of): every (sequence, head, query block)
// exactly once, the longer block of a pair first, and under a causal mask every unit the same
// work (nm + 1 key blocks) but the middle one of an odd nm, which is its only block.
TEST(AttentionForwardUnits, CoverEveryQueryBlockOnceInPairsOfEqualCausalWork) {
  for (const int nm : {1, 2, 3, 16, 17})
    for (const int heads : {1, 3, 16})
      for (const int batch : {1, 5}) {
        SCOPED_TRACE(testing::Message()
                     << nm << " blocks, " << heads << " heads, " << batch << " sequences");
        kh_attn_params p{};
        p.max_seqlen_q = nm * kh_attn_fwd90_block_m() - 5;  // the last block partial
        p.q_heads = heads;
        p.batch = batch;
        ASSERT_EQ(kh_attn_fwd90_query_blocks(p), nm);
        const kh_i64 units = kh_attn_fwd90_units(p);
        EXPECT_EQ(units, static_cast<kh_i64>((nm + 1) / 2) * heads * batch);
        std::set<std::tuple<int, int, int>> seen;
        int single = 0;
        for (int u = 0; u < units; ++u) {
          kh_attn_fwd90_tile_t first, second;
          ASSERT_TRUE(kh_attn_fwd90_tile_of(nm, heads, u, 0, &first));
          const bool two = kh_attn_fwd90_tile_of(nm, heads, u, 1, &second);
          int work = first.mblk + 1;
          for (const kh_attn_fwd90_tile_t* t : {&first, two ? &second : nullptr}) {
            if (!t) continue;
            ASSERT_GE(t->mblk, 0);
            ASSERT_LT(t->mblk, nm);
            ASSERT_LT(t->head, heads);
            ASSERT_LT(t->seq, batch);
            ASSERT_TRUE(seen.insert({t->seq, t->head, t->mblk}).second) << "unit " << u;
          }
          if (two) {
            EXPECT_EQ(second.seq, first.seq);
            EXPECT_EQ(second.head, first.head);
            EXPECT_GT(first.mblk, second.mblk) << "the longer block first";
            work += second.mblk + 1;
            EXPECT_EQ(work, nm + 1) << "unit " << u;
          } else {
            ++single;
            EXPECT_EQ(first.mblk, (nm - 1) / 2);
          }
        }
        EXPECT_EQ(seen.size(), static_cast<size_t>(nm) * heads * batch);
        EXPECT_EQ(single, nm % 2 ? heads * batch : 0);
      }
}

// The Hopper kernels mask with ranges (kh_attn_keys_of for a query row, kh_attn_queries_of for
// a key) instead of kh_attn_visible per element: both must give kh_attn_visible's answer, and
// none past the sequences' ends, for queries before or after the keys' end (offset < 0 and > 0),
// causal or not, with and without a window, rows and columns past the ends included.
TEST(AttentionMaskSpans, AgreeWithVisibleEverywhere) {
  int checked = 0;
  for (int len_q : {1, 5, 16, 37})
    for (int len_k : {1, 5, 16, 37})
      for (int causal : {0, 1})
        for (int window : {-1, 0, 3, 40}) {
          const int offset = len_k - len_q;
          for (int i = 0; i < len_q + 3; ++i)
            for (int j = 0; j < len_k + 3; ++j) {
              const bool want =
                  i < len_q && j < len_k && kh_attn_visible(i, j, offset, causal, window);
              const kh_attn_span keys = kh_attn_keys_of(i, len_k, offset, causal, window);
              const kh_attn_span queries =
                  kh_attn_queries_of(j, len_q, len_k, offset, causal, window);
              // A row past len_q is never stored by the forward: only the key range is checked
              // for rows inside the sequence.
              if (i < len_q) {
                EXPECT_EQ(j >= keys.lo && j < keys.hi, want)
                    << "keys of query " << i << ", key " << j << ": len_q " << len_q << " len_k "
                    << len_k << " causal " << causal << " window " << window;
              }
              EXPECT_EQ(i >= queries.lo && i < queries.hi, want)
                  << "queries of key " << j << ", query " << i << ": len_q " << len_q << " len_k "
                  << len_k << " causal " << causal << " window " << window;
              ++checked;
            }
        }
  EXPECT_GT(checked, 10000);
}

const char* kHopperKernels[] = {
    "attn_fwd90_bf16_d64", "attn_fwd90_bf16_d128", "attn_fwd90_fp16_d64", "attn_fwd90_fp16_d128",
    "attn_bwd90_bf16_d64", "attn_bwd90_bf16_d128", "attn_bwd90_fp16_d64", "attn_bwd90_fp16_d128"};

TEST_F(AttentionCudaDispatch, HopperKernelsWhereTheDeviceCodeHasThemPortableElsewhere) {
  if (!Nvrtc::get().ok()) GTEST_SKIP() << Nvrtc::get().load_error;
  std::set<std::string> code[2];
  const char* sms[2] = {"sm_80", "sm_90a"};
  for (int dev = 0; dev < 2; ++dev) {
    Nvrtc::Output out = compile_for("attention", sms[dev], false);
    ASSERT_TRUE(out.ok) << out.log;
    code[dev] = cubin_strings(out.cubin);
    backend_.set_kernels(dev, code[dev]);
  }
  for (const char* k : kHopperKernels) {
    EXPECT_FALSE(code[0].count(k)) << k << " must not exist in sm_80 code";
    EXPECT_TRUE(code[1].count(k)) << k << " is missing from the sm_90a code";
  }

  using attention_cases::NdView;
  Package pkg("attention");
  for (int dev = 0; dev < 2; ++dev)
    for (int dtype : {kBF16, kFP16})
      for (int64_t d : {64, 128, 256}) {
        SCOPED_TRACE(testing::Message() << sms[dev] << " " << dtype_name(dtype) << " d" << d);
        const int64_t B = 2, S = 300, H = 8, HK = 2;
        ForwardTensors ft(dev, dtype, B, S, H, HK, d);
        DLTensor &Q = ft.Q, &K = ft.K, &O = ft.O;
        std::string err;
        ASSERT_EQ(ft.call(pkg, &err), KH_OK) << err;
        std::vector<Launch> l = backend_.take();
        ASSERT_EQ(l.size(), 1u);
        const bool hopper = dev == 1 && d != 256;
        const std::string want = std::string(hopper ? "attn_fwd90_" : "attn_fwd_") +
                                 (dtype == kBF16 ? "bf16" : "fp16") + "_d" + std::to_string(d);
        EXPECT_EQ(l[0].kernel, want);
        EXPECT_TRUE(code[dev].count(l[0].kernel));
        const kh_launch_cfg_t& c = l[0].cfg;
        EXPECT_EQ(c.block[0], hopper ? 384u : 32u * kh_attn_fwd_warps(static_cast<int>(d)));
        if (hopper) {  // persistent: a CTA a unit (two query blocks) up to the 132 SMs assumed
          EXPECT_EQ(c.grid[0], static_cast<uint32_t>((S + 127) / 128 + 1) / 2 * H * B);
          EXPECT_EQ(c.grid[1], 1u);
          EXPECT_EQ(c.grid[2], 1u);
        } else {
          const uint32_t bm = 16u * kh_attn_fwd_warps(static_cast<int>(d));
          EXPECT_EQ(c.grid[0], (S + bm - 1) / bm);
          EXPECT_EQ(c.grid[1], static_cast<uint32_t>(H));
          EXPECT_EQ(c.grid[2], static_cast<uint32_t>(B));
        }
        EXPECT_LE(c.shared_mem_bytes, 227u * 1024u);
        EXPECT_EQ(c.device_id, dev);

        // Decode: tensor cores (16 rows per CTA) for head_dim 64 and 128, else CUDA cores.
        {
          const int64_t pages = 8, page = 16;
          HostTensor dq_(dtype, B, H * d), dout(dtype, B, H * d), kc(dtype, pages * page, HK * d);
          NdView qd(dq_.dl(), {B, 1, H, d}), od(dout.dl(), {B, 1, H, d}),
              kcv(kc.dl(), {pages, page, HK, d});
          HostTensor tab = attention_cases::int32_tensor({0, 1, 2, 3, 4, 5, 6, 7}),
                     lens = attention_cases::int32_tensor({60, 50});
          NdView tv(tab.dl(), {B, 4}, attention_cases::kInt32),
              lv(lens.dl(), {B}, attention_cases::kInt32);
          DLTensor DQ = on_cuda(&qd.t, dev), DO = on_cuda(&od.t, dev), KC = on_cuda(&kcv.t, dev),
                   TB = on_cuda(&tv.t, dev), SL = on_cuda(&lv.t, dev);
          ASSERT_EQ(pkg.call("paged_attention_decode",
                             {targ(&DQ), targ(&KC), targ(&KC), targ(&TB), targ(&SL), iarg(-1),
                              farg(0.125), targ(&DO), targ(nullptr)},
                             &err),
                    KH_OK)
              << err;
          std::vector<Launch> dl = backend_.take();
          ASSERT_EQ(dl.size(), 1u);
          const std::string dt = dtype == kBF16 ? "bf16" : "fp16";
          if (d == 256)
            EXPECT_TRUE(dl[0].kernel.starts_with("attn_decode_" + dt + "_d256_r")) << dl[0].kernel;
          else
            EXPECT_EQ(dl[0].kernel, "attn_decode_tc_" + dt + "_d" + std::to_string(d));
          EXPECT_TRUE(code[dev].count(dl[0].kernel)) << dl[0].kernel;
          EXPECT_EQ(dl[0].cfg.block[0], 128u);
          EXPECT_EQ(dl[0].cfg.grid[1], static_cast<uint32_t>(HK));  // 4 rows per KV head: 1 group
          EXPECT_LE(dl[0].cfg.shared_mem_bytes, 227u * 1024u);
        }
        if (d == 256) continue;  // no backward for head_dim 256

        // The backward: pre, main (attn_bwd90 where the code has it), post.
        HostTensor lse(kFP32, H, B * S), ws(kFP32, 1, B * S * H * (d + 1));
        DLTensor L = on_cuda(lse.dl(), dev), W = on_cuda(ws.dl(), dev);
        auto backward = [&](DLTensor* workspace) {
          return pkg.call("attention_backward",
                          {targ(&O), targ(&Q), targ(&K), targ(&K), targ(&O), targ(&L),
                           targ(nullptr), targ(nullptr), iarg(S), iarg(S), iarg(1), iarg(-1),
                           farg(0.125), targ(&Q), targ(&K), targ(&K), targ(workspace)},
                          &err);
        };
        ASSERT_EQ(backward(&W), KH_OK) << err;
        l = backend_.take();
        ASSERT_EQ(l.size(), 3u);
        const std::string main = std::string(dev == 1 ? "attn_bwd90_" : "attn_bwd_") +
                                 (dtype == kBF16 ? "bf16" : "fp16") + "_d" + std::to_string(d);
        EXPECT_EQ(l[1].kernel, main);
        for (const Launch& x : l) EXPECT_TRUE(code[dev].count(x.kernel)) << x.kernel;
        const kh_launch_cfg_t& m = l[1].cfg;
        const uint32_t bn = dev == 1 ? 128u : 64u;
        EXPECT_EQ(m.block[0], dev == 1 ? static_cast<uint32_t>(kh_attn_bwd90_threads()) : 128u);
        EXPECT_EQ(m.grid[0], (S + bn - 1) / bn);
        EXPECT_EQ(m.grid[1], static_cast<uint32_t>(HK));
        EXPECT_LE(m.shared_mem_bytes, 227u * 1024u);

        // dq_accum's layout: heads-major for the Hopper kernel's bulk reductions, which need it
        // on a 16-byte boundary; 4 bytes off it, the portable kernel runs (token-major), and the
        // post kernel is told which.
        for (const int64_t offset : {int64_t{0}, int64_t{4}}) {
          SCOPED_TRACE(testing::Message() << "workspace at byte " << offset);
          const int64_t n = B * S * H * (d + 1);
          HostTensor ws1(kFP32, 1, n + 4);
          NdView wv(ws1.dl(), {n});
          DLTensor W1 = on_cuda(&wv.t, dev);
          W1.byte_offset = static_cast<uint64_t>(offset);
          std::map<std::string, int> heads_major;
          backend_.on_params = [&](const std::string& kernel, void** params) {
            heads_major[kernel] = static_cast<const kh_attn_bwd_params*>(params[0])->dq_heads_major;
          };
          ASSERT_EQ(backward(&W1), KH_OK) << err;
          backend_.on_params = nullptr;
          l = backend_.take();
          ASSERT_EQ(l.size(), 3u);
          const bool bulk = dev == 1 && offset == 0;
          EXPECT_EQ(l[1].kernel.starts_with("attn_bwd90_"), bulk) << l[1].kernel;
          EXPECT_EQ(heads_major[l[2].kernel], bulk ? 1 : 0) << l[2].kernel;
        }
      }
}

// The persistent Hopper forward launches a CTA per multiprocessor (the device-info service's
// count; 132 where the loader does not answer), fewer when there are fewer units of work.
// Devices 6 and 7: the Hopper kernels' lookup is cached per device for the process, and the
// tests above give devices 0 and 1 sm_80 and sm_90a code.
TEST_F(AttentionCudaDispatch, PersistentForwardGridIsTheMultiprocessorsOrTheUnits) {
  Package pkg("attention");
  kh_device_info_t few = test::a100_device_info();
  few.sm_major = 9;
  few.multiprocessors = 20;
  backend_.set_device_info(7, few);
  for (const int dev : {6, 7})
    for (const int64_t B : {1, 8}) {
      SCOPED_TRACE(testing::Message() << "device " << dev << ", " << B << " sequences");
      const int64_t S = 1000, H = 8, d = 128;  // 8 query blocks: 4 units a head
      ForwardTensors ft(dev, kBF16, B, S, H, 2, d);
      std::string err;
      ASSERT_EQ(ft.call(pkg, &err), KH_OK) << err;
      std::vector<Launch> l = backend_.take();
      ASSERT_EQ(l.size(), 1u);
      EXPECT_EQ(l[0].kernel, "attn_fwd90_bf16_d128");
      const int64_t units = 4 * H * B, sms = dev == 7 ? 20 : 132;  // 32 or 256 units
      EXPECT_EQ(l[0].cfg.grid[0], static_cast<uint32_t>(std::min(units, sms)));
      EXPECT_EQ(l[0].cfg.grid[1], 1u);
      EXPECT_EQ(l[0].cfg.grid[2], 1u);
    }
}

// A window of at least the key tokens hides no key: the kernels get none (window_left -1), so that
// their 32-bit sums with it cannot overflow (at INT_MAX the backward's kh_attn_query_range gave
// every key block no query); a shorter one is passed as it is.
TEST_F(AttentionCudaDispatch, WindowAsLongAsTheKeysReachesTheKernelsAsNone) {
  Package pkg("attention");
  const int64_t B = 2, S = 300;
  BackwardTensors t(1, B, S, 4, 2, 128);
  std::map<std::string, int> windows;
  backend_.on_params = [&](const std::string& kernel, void** params) {
    windows[kernel] = static_cast<const kh_attn_params*>(params[0])->window_left;
  };
  for (const int64_t window :
       {int64_t{0x7FFFFFFF}, int64_t{0x7FFFFFFF} - 200, B * S, B * S - 1, int64_t{5}}) {
    SCOPED_TRACE(testing::Message() << "window_left " << window);
    std::string err;
    windows.clear();
    ASSERT_EQ(t.forward(pkg, window, &err), KH_OK) << err;
    ASSERT_EQ(t.backward(pkg, window, &err), KH_OK) << err;
    backend_.take();
    // The forward's and the backward's main kernels (kh_attn_bwd_params starts with its f).
    ASSERT_EQ(windows.count("attn_fwd90_bf16_d128"), 1u);
    ASSERT_EQ(windows.count("attn_bwd90_bf16_d128"), 1u);
    for (const auto& [kernel, w] : windows) EXPECT_EQ(w, window >= B * S ? -1 : window) << kernel;
  }
  backend_.on_params = nullptr;
}

// The backward's last two waves of CTAs take their key blocks longest first (kh_attn_tile): the
// kernel's tail_ctas counts what the GPU holds, from the device-info service where the loader
// answers, an H100/H200's where it does not.
TEST_F(AttentionCudaDispatch, BackwardTailIsTwoWavesOfTheDevice) {
  Package pkg("attention");
  // Devices no other test of this binary uses: the package remembers per device whether its
  // code has the Hopper kernels, and the dispatch test gives devices 0 and 1 sm_80's and sm_90a's.
  const int plain = 4, a100 = 5;
  backend_.set_device_info(a100, test::a100_device_info());
  std::map<std::string, int> tails;
  backend_.on_params = [&](const std::string& kernel, void** params) {
    if (kernel.starts_with("attn_bwd90_") || kernel.starts_with("attn_bwd_bf16"))
      tails[kernel] = static_cast<const kh_attn_bwd_params*>(params[0])->f.tail_ctas;
  };
  for (int dev : {plain, a100}) {
    SCOPED_TRACE(testing::Message() << "device " << dev);
    BackwardTensors t(dev, 2, 300, 8, 2, 128);
    std::string err;
    tails.clear();
    ASSERT_EQ(t.backward(pkg, -1, &err), KH_OK) << err;
    backend_.take();
    // One CTA an SM (its shared memory): 2 x 132 SMs with no answer, 2 x 108 on the A100.
    ASSERT_EQ(tails.size(), 1u);
    EXPECT_EQ(tails.begin()->first, "attn_bwd90_bf16_d128");
    EXPECT_EQ(tails.begin()->second, dev == plain ? 264 : 216);
  }
  backend_.on_params = nullptr;
}

// The decode's split count fills whole waves of the GPU it runs on: the device-info service's
// SMs and shared memory where the loader answers, an H100/H200's where it does not.
TEST_F(AttentionCudaDispatch, DecodeSplitsFollowTheDevicesMultiprocessors) {
  using attention_cases::NdView;
  Package pkg("attention");
  backend_.set_device_info(1, test::a100_device_info());
  // Qwen3-0.6B's decode: batch 64, 16/8 heads, head_dim 128, 2048 tokens of 64-token pages (the
  // plan depends on the block table's width; the cache holds one page, as nothing reads it).
  const int64_t B = 64, H = 16, HK = 8, page = 64, per_seq = 32;
  std::vector<int32_t> table(static_cast<size_t>(B * per_seq)), lens(static_cast<size_t>(B), 2048);
  for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i);
  HostTensor tab = attention_cases::int32_tensor(table), len = attention_cases::int32_tensor(lens),
             ws(kFP32, 1, B * H * 32 * (128 + 2));
  NdView tv(tab.dl(), {B, per_seq}, attention_cases::kInt32),
      lv(len.dl(), {B}, attention_cases::kInt32);
  // One decode of head_dim d on device `dev`: its launches.
  auto decode = [&](int dev, int64_t d) {
    HostTensor q(kBF16, B, H * d), out(kBF16, B, H * d), cache(kBF16, page, HK * d);
    NdView qv(q.dl(), {B, 1, H, d}), ov(out.dl(), {B, 1, H, d}), cv(cache.dl(), {1, page, HK, d});
    DLTensor Q = on_cuda(&qv.t, dev), O = on_cuda(&ov.t, dev), C = on_cuda(&cv.t, dev),
             T = on_cuda(&tv.t, dev), L = on_cuda(&lv.t, dev), W = on_cuda(ws.dl(), dev);
    std::string err;
    EXPECT_EQ(pkg.call("paged_attention_decode",
                       {targ(&Q), targ(&C), targ(&C), targ(&T), targ(&L), iarg(-1), farg(0.088),
                        targ(&O), targ(&W)},
                       &err),
              KH_OK)
        << err;
    return backend_.take();
  };
  // Device 0 reports nothing (the H200 plan: 3 CTAs an SM by shared memory and the register
  // cap, 396 slots, 3 splits fill 97%); device 1 is an A100 (2 CTAs an SM by its 164 KiB: 216
  // slots; 5 splits fill 99%, 2 and 4 only 94.8%).
  for (int dev : {0, 1}) {
    SCOPED_TRACE(testing::Message() << "device " << dev);
    std::vector<Launch> l = decode(dev, 128);
    ASSERT_EQ(l.size(), 2u);  // the splits, then their combine
    EXPECT_EQ(l[0].kernel, "attn_decode_tc_bf16_d128");
    EXPECT_EQ(l[0].cfg.grid[0], dev == 0 ? 3u : 5u);
    EXPECT_EQ(l[0].cfg.grid[1], static_cast<uint32_t>(HK));
    EXPECT_EQ(l[0].cfg.grid[2], static_cast<uint32_t>(B));
    EXPECT_EQ(l[1].kernel, "attn_decode_combine_bf16_d128");
  }

  // A GPU that reserves no shared memory per block (the CUDA-core decode of head_dim 256 uses
  // none either): the plan is bound by threads, not a division by zero.
  kh_device_info_t none_reserved = test::a100_device_info();
  none_reserved.shared_memory_reserved_per_block = 0;
  backend_.set_device_info(2, none_reserved);
  std::vector<Launch> l = decode(2, 256);
  ASSERT_GE(l.size(), 1u);
  EXPECT_TRUE(l[0].kernel.starts_with("attn_decode_bf16_d256_r")) << l[0].kernel;
  // 4 rows a CTA, 512 CTAs a split, 16 an SM by threads: 3 splits fill 89% of 1728 slots (the
  // 8 the context allows at most fill no more).
  EXPECT_EQ(l[0].cfg.grid[0], 3u);
}

// The tensor-core decode offsets a page's rows in 32 bits: a cache whose page spans 2^31 elements
// or more (its tokens strided across the whole cache) is refused by name, before any launch.
TEST_F(AttentionCudaDispatch, DecodeRefusesPagesPast32BitRowOffsets) {
  using attention_cases::NdView;
  Package pkg("attention");
  const int64_t B = 1, H = 2, HK = 1, D = 64, page = 64;
  HostTensor tab = attention_cases::int32_tensor({0}), len = attention_cases::int32_tensor({5}),
             q(kBF16, B, H * D), out(kBF16, B, H * D), cache(kBF16, page, HK * D);
  NdView tv(tab.dl(), {B, 1}, attention_cases::kInt32), lv(len.dl(), {B}, attention_cases::kInt32),
      qv(q.dl(), {B, 1, H, D}), ov(out.dl(), {B, 1, H, D}), cv(cache.dl(), {1, page, HK, D});
  std::string err;
  for (int64_t row : {int64_t{1} << 24, int64_t{1} << 25}) {  // 2^30 and 2^31 elements a page
    cv.strides[1] = row;
    cv.strides[0] = row * page;
    DLTensor Q = on_cuda(&qv.t, 0), O = on_cuda(&ov.t, 0), C = on_cuda(&cv.t, 0),
             T = on_cuda(&tv.t, 0), L = on_cuda(&lv.t, 0);
    const int32_t rc = pkg.call("paged_attention_decode",
                                {targ(&Q), targ(&C), targ(&C), targ(&T), targ(&L), iarg(-1),
                                 farg(0.125), targ(&O), targ(nullptr)},
                                &err);
    if (row == int64_t{1} << 24) {
      EXPECT_EQ(rc, KH_OK) << err;
      EXPECT_EQ(backend_.take().size(), 1u);
    } else {
      EXPECT_EQ(rc, KH_ERR_UNSUPPORTED);
      EXPECT_NE(err.find("paged_attention_decode: a page of 64 tokens spans 2147483648 elements"),
                std::string::npos)
          << err;
      EXPECT_TRUE(backend_.take().empty());
    }
  }
}

}  // namespace
}  // namespace kh::kernels_test
