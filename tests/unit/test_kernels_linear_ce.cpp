// FusedLinearCrossEntropy (kernel-hub/softmax 1.1) on the cpu through the real loader: its GEMMs
// reach the loader's GEMM service through the package's kh_host_v1_t (ABI 1.2) with device -1.
// Loss, d_hidden and d_weight against float64 (odd N and V, ignore_index rows, one chunk and
// several, strided rows, fp32 or input-dtype gradients), a fully ignored batch (loss 0, no NaN),
// no tokens at all, backward, and refused arguments (a workspace too small names the minimum).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "tests/unit/test_kernels_linear_ce_cases.h"
#include "tests/unit/test_kernels_util.h"

namespace kh::kernels_test {
namespace {

using linear_ce_cases::kIgnore;

class LinearCeCpu : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { softmax_ = new Package("softmax"); }
  static Package* softmax_;
};
Package* LinearCeCpu::softmax_ = nullptr;

TEST_F(LinearCeCpu, EveryDtypeAndShapeMatchesFloat64) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  CpuExecutor cpu;
  for (int dtype : {kBF16, kFP16, kFP32})
    for (const auto& k : linear_ce_cases::kCases) {
      linear_ce_cases::run_case(cpu, *softmax_, dtype, k, rng);
      if (HasFatalFailure()) return;
    }
}

// (softmax - onehot) / valid tokens is below fp16's smallest subnormal here (~5e-8): fp16
// gradients must not be formed from dlogits already divided by the token count.
TEST_F(LinearCeCpu, Fp16GradientsSurviveManyTokens) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  CpuExecutor cpu;
  linear_ce_cases::run_case(cpu, *softmax_, kFP16, {40000, 512, 4, 4096, 0, true, 0}, rng);
}

TEST_F(LinearCeCpu, NoTokensGiveLossZeroAndZeroWeightGradient) {
  CpuExecutor cpu;
  HostTensor hidden(kFP32, 0, 8), weight(kFP32, 5, 8), d_hidden(kFP32, 0, 8),
      d_weight(kFP32, 5, 8);  // d_weight poisoned: it must be overwritten with zeros
  weight.fill([](int64_t, int64_t) { return 0.5; });
  HostTensor ws = linear_ce_cases::workspace_for(0, 5, kFP32, 1), loss = vector_tensor(kFP32, 1);
  rope_cases::Int64Tensor labels({});
  std::string err;
  ASSERT_EQ(
      softmax_->call("linear_cross_entropy_train",
                     {targ(hidden.dl()), targ(weight.dl()), targ(labels.view(cpu)), iarg(kIgnore),
                      targ(ws.dl()), targ(loss.dl()), targ(d_hidden.dl()), targ(d_weight.dl())},
                     &err),
      KH_OK)
      << err;
  EXPECT_EQ(loss.get(0, 0), 0.0);
  for (double x : d_weight.values()) ASSERT_EQ(x, 0.0);
}

TEST_F(LinearCeCpu, BadArgumentsAreRefusedWithAMessage) {
  CpuExecutor cpu;
  HostTensor hidden(kBF16, 4, 8), weight(kBF16, 100, 8), weight_h(kBF16, 100, 7),
      weight32(kFP32, 100, 8), loss = vector_tensor(kFP32, 1);
  hidden.fill([](int64_t, int64_t) { return 0.25; });
  weight.fill([](int64_t, int64_t) { return 0.25; });
  rope_cases::Int64Tensor labels({1, 2, kIgnore, 3});
  std::string err;
  // A workspace one byte short of the minimum.
  const int64_t min = khk::lce_min_workspace_bytes(4, 100, 2);
  HostTensor small = vector_tensor(kFP32, (min - 256) / 4);
  EXPECT_EQ(softmax_->call("linear_cross_entropy",
                           {targ(hidden.dl()), targ(weight.dl()), targ(labels.view(cpu)),
                            iarg(kIgnore), targ(small.dl()), targ(loss.dl())},
                           &err),
            KH_ERR_INVALID_ARGUMENT);
  EXPECT_NE(err.find("pass at least " + std::to_string(min) + " bytes"), std::string::npos) << err;
  HostTensor ws = linear_ce_cases::workspace_for(4, 100, kBF16, 4);
  EXPECT_EQ(softmax_->call("linear_cross_entropy",
                           {targ(hidden.dl()), targ(weight_h.dl()), targ(labels.view(cpu)),
                            iarg(kIgnore), targ(ws.dl()), targ(loss.dl())},
                           &err),
            KH_ERR_INVALID_ARGUMENT);
  EXPECT_NE(err.find("weight must be [vocab, hidden]"), std::string::npos) << err;
  EXPECT_EQ(softmax_->call("linear_cross_entropy",
                           {targ(hidden.dl()), targ(weight32.dl()), targ(labels.view(cpu)),
                            iarg(kIgnore), targ(ws.dl()), targ(loss.dl())},
                           &err),
            KH_ERR_UNSUPPORTED);
  rope_cases::Int64Tensor short_labels({1, 2});
  EXPECT_EQ(softmax_->call("linear_cross_entropy",
                           {targ(hidden.dl()), targ(weight.dl()), targ(short_labels.view(cpu)),
                            iarg(kIgnore), targ(ws.dl()), targ(loss.dl())},
                           &err),
            KH_ERR_INVALID_ARGUMENT);
  EXPECT_NE(err.find("labels"), std::string::npos) << err;
  HostTensor d_hidden16(kFP16, 4, 8), d_weight(kFP32, 100, 8);
  EXPECT_EQ(
      softmax_->call("linear_cross_entropy_train",
                     {targ(hidden.dl()), targ(weight.dl()), targ(labels.view(cpu)), iarg(kIgnore),
                      targ(ws.dl()), targ(loss.dl()), targ(d_hidden16.dl()), targ(d_weight.dl())},
                     &err),
      KH_ERR_UNSUPPORTED);
  EXPECT_NE(err.find("gradients are bfloat16 or float32"), std::string::npos) << err;
}

TEST_F(LinearCeCpu, TheLayerIsInTheModuleTable) {
  const kh_op_v1_t* op = softmax_->op("linear_cross_entropy_train");
  ASSERT_NE(op, nullptr);
  EXPECT_NE(std::string(op->schema).find("Tensor(d!) d_weight"), std::string::npos);
}

}  // namespace
}  // namespace kh::kernels_test
