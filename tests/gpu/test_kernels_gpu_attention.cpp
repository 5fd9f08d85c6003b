// GPU correctness of the attention package (CTest label gpu; skipped without libcuda.so.1 or a
// device): the cuda ops through the real loader and its CUDA device backend (NVRTC from the
// package's .cu) on device copies of the cpu tests' cases plus GPU-sized ones, against float64
// references: attention_forward for head_dim 64/128/256 (the 128 and 256 kernels need 64 KiB of
// dynamic shared memory: the loader's opt-in above 48 KiB), causal and not, GQA, packed varlen with
// odd lengths, sliding windows; attention_backward (dq, dk, dv) for head_dim 64/128;
// paged_kv_append + paged_attention_decode with split-KV (workspace) and without, GQA groups of 4
// and 8, several query tokens, and paged_attention_decode_append against them bit for bit.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "tests/gpu/kernels_gpu_util.h"
#include "tests/unit/test_kernels_attention_cases.h"
#include "tests/unit/test_kernels_util.h"

namespace kh::kernels_test {
namespace {

using attention_cases::DecodeCase;
using attention_cases::ForwardCase;

class KernelsGpuAttention : public GpuKernelsTest<KernelsGpuAttention> {
 public:
  static constexpr const char* kJitDirName = "kh-kernels-attention-jit";
};

// Context lengths min .. max over n sequences, most of them different: short ones leave splits
// (and some warps of a unit) without a chunk.
std::vector<int32_t> spread_lens(int n, int min, int max) {
  std::vector<int32_t> lens;
  for (int i = 0; i < n; ++i)
    lens.push_back(min + static_cast<int32_t>((i * 7919L) % (max - min + 1)));
  return lens;
}

const ForwardCase kGpuForwardCases[] = {
    {4, 2, 64, {300, 300}, {300, 300}, false, false, -1, true},
    {4, 1, 64, {257, 257, 257}, {513, 513, 513}, false, true, -1, true},
    {4, 4, 128, {1, 700, 130, 683}, {1, 700, 130, 683}, true, true, -1, true},
    {8, 2, 128, {1000, 1000}, {1000, 1000}, false, true, 128, true},
    {4, 2, 128, {64}, {30}, true, true, -1, true},  // rows that see no key
    // Whole query blocks that see no key (no block to multiply): their output is zeros, also
    // without TMA, where the producer used to load Q into the bytes the output leaves through.
    {4, 2, 128, {512}, {64}, true, true, -1, true},
    {2, 2, 256, {333, 190}, {333, 190}, true, true, -1, true},
    {2, 1, 256, {129}, {129}, false, false, -1, false},
    {8, 8, 64, {100, 900}, {100, 900}, true, false, 100, true},
    {4, 2, 128, {300, 171}, {300, 171}, true, true, -1, true, 8},  // output rows padded
    // The Hopper forward is persistent (a CTA a multiprocessor walking pairs of query blocks):
    // more units (256 to 768) than an H200 has CTAs, so that CTAs walk several tiles through
    // both Q buffers, with varlen sequences whose blocks past their end are skipped, odd block
    // counts (a pair of one block), a window, and tiles without keys. Short sequences: the
    // float64 reference costs the square of a length, the units grow with it.
    {16, 4, 128, spread_lens(24, 1, 300), spread_lens(24, 1, 300), true, true, -1, true},
    {8, 8, 64, spread_lens(32, 1, 260), spread_lens(32, 1, 260), true, false, 100, true},
    {4, 2, 128, std::vector<int32_t>(32, 300), std::vector<int32_t>(32, 150), true, true, -1, true},
};

const DecodeCase kGpuDecodeCases[] = {
    {32, 8, 128, {5000, 4999, 1, 300}, 1, 1, 16, -1, true},  // split-KV
    {32, 8, 128, {5000, 17}, 1, 1, 64, -1, false},           // no workspace: one split
    {64, 8, 128, {2048, 1000}, 1, 1, 16, -1, true},          // GQA group of 8
    {16, 2, 64, {1000, 3}, 3, 3, 16, -1, true},              // 3 query tokens
    {4, 4, 256, {777, 40}, 2, 2, 32, 100, true},             // window
    {16, 2, 64, {300, 50}, 1, 20, 16, 5, true},  // new tokens past the window: still appended
    // Page sizes the tensor-core decode walks differently (decode_tc.cuh: a warp's chunks are 64
    // tokens apart): several chunks a page, chunks that wrap into the next page at rows 16 and
    // 32, and pages that are not whole chunks (each row looks its page up).
    {16, 8, 128, {3000, 1234, 77}, 1, 1, 256, -1, true},
    {16, 8, 128, {1500, 999, 48}, 1, 1, 48, -1, true},
    {16, 4, 64, {700, 301}, 1, 1, 40, -1, true},
};

// Decode batches of serving size: more CTAs (split x KV head x row group x sequence) than an
// H200 holds at once, varied lengths (splits and warps with no chunk), several row groups.
const DecodeCase kGpuDecodeServingCases[] = {
    {16, 8, 128, spread_lens(64, 1, 1500), 1, 1, 16, -1, true},  // 3 splits: 1536 CTAs
    {16, 8, 128, spread_lens(64, 1, 700), 1, 1, 64, -1, false},  // one split: 512 CTAs
    {64, 2, 64, spread_lens(40, 3, 900), 3, 3, 64, 200, true},   // 6 row groups, a window
};

TEST_F(KernelsGpuAttention, PagedDecodeAtServingBatchesMatchesFloat64) {
  Package pkg("attention");
  GpuExecutor gpu;
  attention_cases::run_cases(gpu, pkg, {kBF16}, kGpuDecodeServingCases,
                             attention_cases::run_decode);
}

TEST_F(KernelsGpuAttention, ForwardMatchesFloat64) {
  Package pkg("attention");
  GpuExecutor gpu;
  attention_cases::run_cases(gpu, pkg, {kBF16, kFP16}, kGpuForwardCases,
                             attention_cases::run_forward);
}

const ForwardCase kGpuBackwardCases[] = {
    {4, 2, 64, {300, 300}, {300, 300}, false, false, -1, true},
    {4, 4, 128, {1, 700, 130, 683}, {1, 700, 130, 683}, true, true, -1, true},
    {8, 2, 128, {1000, 1000}, {1000, 1000}, false, true, 128, true},
    {4, 2, 128, {64}, {30}, true, true, -1, true},  // rows that see no key
    {6, 3, 64, {21, 517}, {21, 517}, true, false, 40, true},
    {4, 2, 128, {300, 171}, {300, 171}, true, true, -1, true, 8},  // output rows padded
};

TEST_F(KernelsGpuAttention, BackwardMatchesFloat64) {
  Package pkg("attention");
  GpuExecutor gpu;
  attention_cases::run_cases(gpu, pkg, {kBF16, kFP16}, kGpuBackwardCases,
                             attention_cases::run_backward);
}

// The Hopper kernels load with TMA when the loader encodes tensor maps (ABI 1.3) and with
// cp.async otherwise; the tests above take the first path on an H100/H200, these the second.
class WithoutTma {
 public:
  WithoutTma() { setenv("KERNEL_HUB_ATTENTION_TMA", "0", 1); }
  ~WithoutTma() { unsetenv("KERNEL_HUB_ATTENTION_TMA"); }
};

TEST_F(KernelsGpuAttention, ForwardWithoutTmaMatchesFloat64) {
  WithoutTma no_tma;
  Package pkg("attention");
  GpuExecutor gpu;
  attention_cases::run_cases(gpu, pkg, {kBF16, kFP16}, kGpuForwardCases,
                             attention_cases::run_forward);
}

TEST_F(KernelsGpuAttention, BackwardWithoutTmaMatchesFloat64) {
  WithoutTma no_tma;
  Package pkg("attention");
  GpuExecutor gpu;
  attention_cases::run_cases(gpu, pkg, {kBF16, kFP16}, kGpuBackwardCases,
                             attention_cases::run_backward);
}

TEST_F(KernelsGpuAttention, PagedAppendAndDecodeMatchFloat64) {
  Package pkg("attention");
  GpuExecutor gpu;
  attention_cases::run_cases(gpu, pkg, {kBF16, kFP16}, kGpuDecodeCases,
                             attention_cases::run_decode);
}

TEST_F(KernelsGpuAttention, Fp32OnCudaIsRefusedNotMiscomputed) {
  Package pkg("attention");
  GpuExecutor gpu;
  HostTensor q(kFP32, 8, 64), out(kFP32, 8, 64);
  attention_cases::NdView qv(gpu.arg(q), {1, 8, 1, 64}), ov(gpu.arg(out), {1, 8, 1, 64});
  std::string err;
  EXPECT_EQ(gpu.call(pkg, "attention_forward",
                     {targ(&qv.t), targ(&qv.t), targ(&qv.t), targ(nullptr), targ(nullptr), iarg(0),
                      iarg(1), iarg(-1), farg(0.125), targ(&ov.t), targ(nullptr)},
                     &err),
            KH_ERR_UNSUPPORTED);
  EXPECT_NE(err.find("attention_forward: q is fp32 on cuda"), std::string::npos) << err;
  EXPECT_NE(err.find("bf16 or fp16"), std::string::npos) << err;
  // The paged ops: fp32 pages, new tokens and queries.
  HostTensor kc(kFP32, 4 * 16, 64), tab = attention_cases::int32_tensor({0, 1, 2, 3}),
                                    lens = attention_cases::int32_tensor({5});
  attention_cases::NdView kcv(gpu.arg(kc), {4, 16, 1, 64}),
      tv(gpu.arg(tab), {1, 4}, attention_cases::kInt32),
      lv(gpu.arg(lens), {1}, attention_cases::kInt32), qd(gpu.arg(q), {1, 1, 8, 64}),
      od(gpu.arg(out), {1, 1, 8, 64});
  EXPECT_EQ(gpu.call(pkg, "paged_attention_decode",
                     {targ(&qd.t), targ(&kcv.t), targ(&kcv.t), targ(&tv.t), targ(&lv.t), iarg(-1),
                      farg(0.125), targ(&od.t), targ(nullptr)},
                     &err),
            KH_ERR_UNSUPPORTED);
  EXPECT_NE(err.find("paged_attention_decode: q is fp32 on cuda"), std::string::npos) << err;
  attention_cases::NdView kcv2(gpu.arg(kc), {4, 16, 1, 64}),
      tv2(gpu.arg(tab), {1, 4}, attention_cases::kInt32),
      lv2(gpu.arg(lens), {1}, attention_cases::kInt32), kn2(gpu.arg(q), {1, 1, 1, 64});
  EXPECT_EQ(gpu.call(pkg, "paged_kv_append",
                     {targ(&kn2.t), targ(&kn2.t), targ(&tv2.t), targ(&lv2.t), targ(&kcv2.t),
                      targ(&kcv2.t)},
                     &err),
            KH_ERR_UNSUPPORTED);
  EXPECT_NE(err.find("paged_kv_append: k_new is fp32 on cuda"), std::string::npos) << err;
}

// A HostTensor's bytes in device memory that outlive op calls (a captured graph keeps the
// pointers): upload and download copy the whole span.
class DeviceCopy {
 public:
  explicit DeviceCopy(HostTensor& t) : bytes_(t.span_bytes()) {
    EXPECT_EQ(Cuda::get().mem_alloc(&ptr_, bytes_), 0);
    dl_ = *t.dl();
    dl_.data = reinterpret_cast<void*>(ptr_);
    dl_.device = DLDevice{kDLCUDA, 0};
  }
  ~DeviceCopy() { Cuda::get().mem_free(ptr_); }
  DeviceCopy(const DeviceCopy&) = delete;
  DeviceCopy& operator=(const DeviceCopy&) = delete;
  void upload(HostTensor& t) { ASSERT_EQ(Cuda::get().htod(ptr_, t.data(), bytes_), 0); }
  std::vector<unsigned char> download() {
    std::vector<unsigned char> v(bytes_);
    EXPECT_EQ(Cuda::get().dtoh(v.data(), ptr_, bytes_), 0);
    return v;
  }
  const DLTensor* dl() const { return &dl_; }

 private:
  Cuda::Ptr ptr_ = 0;
  size_t bytes_;
  DLTensor dl_{};
};

// PagedAttention's ops are graph-safe: paged_kv_append then paged_attention_decode (split-KV with
// workspace), and paged_attention_decode_append alone, each captured once in a CUDA graph, replayed
// on fresh inputs (a new cache, new keys and queries, new sequence lengths) written into the same
// buffers between replays; each replay equals an eager run of the same inputs bit for bit (both ops
// are deterministic), and differs from the replay before (the graph reads the buffers, not what
// they held at capture).
TEST_F(KernelsGpuAttention, PagedAppendAndDecodeReplayInACudaGraph) {
  Cuda& cu = Cuda::get();
  Package pkg("attention");
  const int dtype = kBF16;
  const int64_t B = 3, H = 32, HK = 8, D = 128, P = 16, NN = 1;
  const int64_t capacity = 3008, per_seq = capacity / P, pages = B * per_seq;
  // Context lengths per replay (after the append), each within the block table's capacity.
  const std::vector<std::vector<int32_t>> lens_per_round = {
      {3000, 1500, 700}, {2999, 17, 700}, {1234, 3008, 1}, {64, 65, 2048}};
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  std::vector<int32_t> table(static_cast<size_t>(pages));
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), rng);

  HostTensor kc(dtype, pages * P, HK * D), vc(dtype, pages * P, HK * D);
  HostTensor kn(dtype, B * NN, HK * D), vn(dtype, B * NN, HK * D);
  HostTensor q(dtype, B, H * D), out(dtype, B, H * D);
  HostTensor tab = attention_cases::int32_tensor(table);
  HostTensor lens = attention_cases::int32_tensor(lens_per_round[0]);
  const int64_t ws_elems = B * H * 32 * (D + 2);
  HostTensor ws(kFP32, 1, ws_elems);
  DeviceCopy dkc(kc), dvc(vc), dkn(kn), dvn(vn), dq(q), dout(out), dtab(tab), dlens(lens), dws(ws);
  dtab.upload(tab);
  dws.upload(ws);
  using attention_cases::NdView;
  NdView kcv(dkc.dl(), {pages, P, HK, D}), vcv(dvc.dl(), {pages, P, HK, D}),
      knv(dkn.dl(), {B, NN, HK, D}), vnv(dvn.dl(), {B, NN, HK, D}),
      tv(dtab.dl(), {B, per_seq}, attention_cases::kInt32),
      lv(dlens.dl(), {B}, attention_cases::kInt32), qv(dq.dl(), {B, 1, H, D}),
      ov(dout.dl(), {B, 1, H, D}), wv(dws.dl(), {ws_elems});

  void* stream = nullptr;
  ASSERT_EQ(cu.stream_create(&stream, 1 /* CU_STREAM_NON_BLOCKING */), 0);
  std::string err;
  bool fused = false;  // paged_attention_decode_append instead of the two ops
  auto run_ops = [&]() -> int32_t {
    if (fused)
      return pkg.call("paged_attention_decode_append",
                      {targ(&qv.t), targ(&knv.t), targ(&vnv.t), targ(&kcv.t), targ(&vcv.t),
                       targ(&tv.t), targ(&lv.t), iarg(-1),
                       farg(1.0 / std::sqrt(static_cast<double>(D))), targ(&ov.t), targ(&wv.t)},
                      &err, stream);
    int32_t s =
        pkg.call("paged_kv_append",
                 {targ(&knv.t), targ(&vnv.t), targ(&tv.t), targ(&lv.t), targ(&kcv.t), targ(&vcv.t)},
                 &err, stream);
    if (s != KH_OK) return s;
    return pkg.call("paged_attention_decode",
                    {targ(&qv.t), targ(&kcv.t), targ(&vcv.t), targ(&tv.t), targ(&lv.t), iarg(-1),
                     farg(1.0 / std::sqrt(static_cast<double>(D))), targ(&ov.t), targ(&wv.t)},
                    &err, stream);
  };
  // Fresh inputs for a round, written into the device buffers the graph captured.
  auto upload_round = [&](size_t round, bool regenerate) {
    if (regenerate) {
      kc = attention_cases::random_tensor(dtype, pages * P, HK * D, rng);
      vc = attention_cases::random_tensor(dtype, pages * P, HK * D, rng);
      kn = attention_cases::random_tensor(dtype, B * NN, HK * D, rng);
      vn = attention_cases::random_tensor(dtype, B * NN, HK * D, rng);
      q = attention_cases::random_tensor(dtype, B, H * D, rng);
      lens = attention_cases::int32_tensor(lens_per_round[round]);
    }
    dkc.upload(kc);
    dvc.upload(vc);
    dkn.upload(kn);
    dvn.upload(vn);
    dq.upload(q);
    dlens.upload(lens);
    // The copies (legacy stream) are complete before the test's non-blocking stream reads.
    ASSERT_EQ(cu.ctx_synchronize(), 0);
  };

  for (const bool f : {false, true}) {
    fused = f;
    SCOPED_TRACE(fused ? "paged_attention_decode_append"
                       : "paged_kv_append + paged_attention_decode");
    // Eager first: the kernels are compiled and loaded before the capture (nothing may load
    // device code while a stream captures).
    upload_round(0, true);
    KH_EXPECT_OK(run_ops(), err);
    ASSERT_EQ(cu.stream_sync(stream), 0);

    ASSERT_EQ(cu.begin_capture(stream, 1 /* CU_STREAM_CAPTURE_MODE_THREAD_LOCAL */), 0);
    const int32_t captured = run_ops();
    void* graph = nullptr;
    ASSERT_EQ(cu.end_capture(stream, &graph), 0);
    KH_EXPECT_OK(captured, err);
    void* exec = nullptr;
    ASSERT_EQ(cu.graph_instantiate(&exec, graph, 0), 0);

    std::vector<unsigned char> previous;
    for (size_t round = 0; round < lens_per_round.size(); ++round) {
      SCOPED_TRACE(testing::Message() << "replay " << round);
      upload_round(round, round > 0);
      ASSERT_EQ(cu.graph_launch(exec, stream), 0);
      ASSERT_EQ(cu.stream_sync(stream), 0);
      const std::vector<unsigned char> replay_out = dout.download(), replay_k = dkc.download(),
                                       replay_v = dvc.download();
      upload_round(round, false);  // the same inputs again (the append wrote into the cache)
      KH_EXPECT_OK(run_ops(), err);
      ASSERT_EQ(cu.stream_sync(stream), 0);
      EXPECT_TRUE(replay_out == dout.download()) << "decode output: replay != eager";
      EXPECT_TRUE(replay_k == dkc.download()) << "k_cache after the append: replay != eager";
      EXPECT_TRUE(replay_v == dvc.download()) << "v_cache after the append: replay != eager";
      EXPECT_FALSE(replay_out == previous) << "the replay repeated the previous round's output";
      previous = replay_out;
    }
    cu.graph_exec_destroy(exec);
    cu.graph_destroy(graph);
  }
  cu.stream_destroy(stream);
}

}  // namespace
}  // namespace kh::kernels_test
