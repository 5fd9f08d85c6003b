// GPU correctness of the attention package (CTest label gpu; skipped without libcuda.so.1 or a
// device): the cuda ops through the real loader and its CUDA device backend (NVRTC from the
// package's .cu) on device copies of the cpu tests' cases plus GPU-sized ones, against float64
// references: attention_forward for head_dim 64/128/256 (the 128 and 256 kernels need 64 KiB of
// dynamic shared memory: the loader's opt-in above 48 KiB), causal and not, GQA, packed varlen
// with odd lengths, sliding windows; attention_backward (dq, dk, dv) for head_dim 64/128;
// paged_kv_append + paged_attention_decode with split-KV
// (workspace) and without, GQA groups of 4 and 8, several query tokens.
#include <gtest/gtest.h>

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

const ForwardCase kGpuForwardCases[] = {
    {4, 2, 64, {300, 300}, {300, 300}, false, false, -1, true},
    {4, 1, 64, {257, 257, 257}, {513, 513, 513}, false, true, -1, true},
    {4, 4, 128, {1, 700, 130, 683}, {1, 700, 130, 683}, true, true, -1, true},
    {8, 2, 128, {1000, 1000}, {1000, 1000}, false, true, 128, true},
    {4, 2, 128, {64}, {30}, true, true, -1, true},  // rows that see no key
    {2, 2, 256, {333, 190}, {333, 190}, true, true, -1, true},
    {2, 1, 256, {129}, {129}, false, false, -1, false},
    {8, 8, 64, {100, 900}, {100, 900}, true, false, 100, true},
};

const DecodeCase kGpuDecodeCases[] = {
    {32, 8, 128, {5000, 4999, 1, 300}, 1, 1, 16, -1, true},  // split-KV
    {32, 8, 128, {5000, 17}, 1, 1, 64, -1, false},           // no workspace: one split
    {64, 8, 128, {2048, 1000}, 1, 1, 16, -1, true},          // GQA group of 8
    {16, 2, 64, {1000, 3}, 3, 3, 16, -1, true},              // 3 query tokens
    {4, 4, 256, {777, 40}, 2, 2, 32, 100, true},             // window
};

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
};

TEST_F(KernelsGpuAttention, BackwardMatchesFloat64) {
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
  EXPECT_NE(err.find("fp32"), std::string::npos) << err;
}

}  // namespace
}  // namespace kh::kernels_test
