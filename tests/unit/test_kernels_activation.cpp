// The activation package's cpu ops through the real loader against float64 references on fresh
// random inputs (plus fixed extremes): SiluAndMul, GeluAndMul (erf and tanh), GeluTanh, Silu,
// forward and backward, bf16/fp16/fp32, odd and long rows, one row, strided rows, outputs
// poisoned before each call. The float64 derivatives are checked by finite differences.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <vector>

#include "tests/unit/test_kernels_activation_cases.h"
#include "tests/unit/test_kernels_util.h"

namespace kh::kernels_test {
namespace {

using namespace act_cases;

TEST(KernelsActivation, Float64DerivativesMatchFiniteDifferences) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> n(0.0, 2.0);
  const double h = 1e-6;
  for (int op = 0; op < 5; ++op)
    for (int i = 0; i < 20; ++i) {
      const double g = n(rng);
      const double fd = (act(op, g + h) - act(op, g - h)) / (2 * h);
      EXPECT_NEAR(dact(op, g), fd, 1e-7 * (1 + std::fabs(fd))) << op_name(op) << " at " << g;
    }
}

class ActivationCpu : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { pkg_ = new Package("activation"); }
  static Package* pkg_;
};
Package* ActivationCpu::pkg_ = nullptr;

TEST_F(ActivationCpu, EveryOpDtypeAndShapeMatchesFloat64) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  CpuExecutor cpu;
  for (int op = 0; op < 5; ++op)
    for (int dtype : {kBF16, kFP16, kFP32})
      for (const Case& k : kCases) {
        run_case(cpu, *pkg_, op, dtype, k, rng);
        if (HasFatalFailure()) return;
      }
}

TEST_F(ActivationCpu, BadArgumentsAreRefusedWithAMessage) {
  HostTensor x(kFP16, 4, 10), x_odd(kFP16, 4, 9), y(kFP16, 4, 5), y_wrong(kFP16, 4, 6);
  std::string err;
  EXPECT_EQ(pkg_->call("silu_and_mul", {targ(x_odd.dl()), targ(y.dl())}, &err),
            KH_ERR_INVALID_ARGUMENT);
  EXPECT_NE(err.find("even"), std::string::npos) << err;
  EXPECT_EQ(pkg_->call("silu_and_mul", {targ(x.dl()), targ(y_wrong.dl())}, &err),
            KH_ERR_INVALID_ARGUMENT);
  EXPECT_NE(err.find("tensor y"), std::string::npos) << err;
  EXPECT_EQ(pkg_->call("gelu_and_mul", {targ(x.dl()), iarg(2), targ(y.dl())}, &err),
            KH_ERR_INVALID_ARGUMENT);
  EXPECT_NE(err.find("approximate"), std::string::npos) << err;
  EXPECT_EQ(pkg_->call("gelu_and_mul", {targ(x.dl()), farg(1.0), targ(y.dl())}, &err),
            KH_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(pkg_->call("silu", {targ(x.dl()), targ(y.dl())}, &err), KH_ERR_INVALID_ARGUMENT);
  // Unsupported dtype (int32).
  DLTensor xi = *x.dl();
  xi.dtype = DLDataType{kDLInt, 32, 1};
  EXPECT_EQ(pkg_->call("silu", {targ(&xi), targ(x.dl())}, &err), KH_ERR_UNSUPPORTED);
  EXPECT_NE(err.find("dtype"), std::string::npos) << err;
}

}  // namespace
}  // namespace kh::kernels_test
