// The rotary and softmax packages' cpu ops through the real loader against float64 references
// on fresh random inputs: RotaryEmbedding (NeoX and GPT-J, partial rotary, strided heads and
// tokens, fp32 or same-dtype cache, GQA key, no key) forward and inverse; Softmax forward and
// backward; CrossEntropy (vocab 128256, ignore_index rows, out-of-range targets) with its fused
// gradient and backward. bf16/fp16/fp32, odd sizes, one row, outputs poisoned before each call.
// The float64 gradient formulas are checked by finite differences.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "tests/unit/test_kernels_rotary_cases.h"
#include "tests/unit/test_kernels_softmax_cases.h"
#include "tests/unit/test_kernels_util.h"

namespace kh::kernels_test {
namespace {

TEST(KernelsRotarySoftmaxFloat64, SoftmaxAndCrossEntropyGradientsMatchFiniteDifferences) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> n(0.0, 1.0);
  const int64_t C = 9;
  std::vector<double> x(C), dy(C);
  for (auto& v : x) v = n(rng);
  for (auto& v : dy) v = n(rng);
  const std::vector<double> y = softmax_cases::softmax_ref(x, 1, C);
  double dot = 0;
  for (int64_t c = 0; c < C; ++c) dot += dy[c] * y[c];
  const double h = 1e-6;
  const int64_t target = 4;
  auto lossf = [&](const std::vector<double>& v) {
    double m = -INFINITY, s = 0;
    for (double a : v) m = std::max(m, a);
    for (double a : v) s += std::exp(a - m);
    return m + std::log(s) - v[target];
  };
  for (int64_t i = 0; i < C; ++i) {
    std::vector<double> xp = x, xm = x;
    xp[i] += h;
    xm[i] -= h;
    const auto yp = softmax_cases::softmax_ref(xp, 1, C), ym = softmax_cases::softmax_ref(xm, 1, C);
    double fd = 0;  // d(sum(dy * y)) / dx_i
    for (int64_t c = 0; c < C; ++c) fd += dy[c] * (yp[c] - ym[c]) / (2 * h);
    EXPECT_NEAR(y[i] * (dy[i] - dot), fd, 1e-7) << "softmax backward, element " << i;
    const double fdl = (lossf(xp) - lossf(xm)) / (2 * h);
    EXPECT_NEAR(y[i] - (i == target ? 1.0 : 0.0), fdl, 1e-7) << "cross-entropy, element " << i;
  }
}

class RotarySoftmaxCpu : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    rotary_ = new Package("rotary");
    softmax_ = new Package("softmax");
  }
  static Package* rotary_;
  static Package* softmax_;
};
Package* RotarySoftmaxCpu::rotary_ = nullptr;
Package* RotarySoftmaxCpu::softmax_ = nullptr;

// run(executor, package, dtype, neox, case, rng) over every layout, dtype and case on the cpu.
template <typename Run>
void every_rotary_case(const Package& rotary, Run run) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  CpuExecutor cpu;
  for (bool neox : {true, false})
    for (int dtype : {kBF16, kFP16, kFP32})
      for (const auto& k : rope_cases::kCases) {
        run(cpu, rotary, dtype, neox, k, rng);
        if (::testing::Test::HasFatalFailure()) return;
      }
}

TEST_F(RotarySoftmaxCpu, RotaryEveryLayoutDtypeAndShapeMatchesFloat64) {
  every_rotary_case(*rotary_, rope_cases::run_case);
}

TEST_F(RotarySoftmaxCpu, QkNormRotaryEveryLayoutDtypeAndShapeMatchesFloat64) {
  every_rotary_case(*rotary_, rope_cases::run_qk_norm_case);
}

TEST_F(RotarySoftmaxCpu, QkNormRotaryTrainingOpsMatchFloat64) {
  every_rotary_case(*rotary_, [](Executor& ex, const Package& pkg, int dtype, bool neox,
                                 const rope_cases::Case& k, std::mt19937_64& rng) {
    rope_cases::run_qk_norm_train_case(ex, pkg, dtype, neox, k, rng, /*cuda=*/false);
  });
}

// QKNormRotaryEmbeddingFromOutput's: the forward in place with rstd, the backward from the output.
TEST_F(RotarySoftmaxCpu, QkNormRotaryFromOutputTrainingOpsMatchFloat64) {
  every_rotary_case(*rotary_, [](Executor& ex, const Package& pkg, int dtype, bool neox,
                                 const rope_cases::Case& k, std::mt19937_64& rng) {
    rope_cases::run_qk_norm_train_case(ex, pkg, dtype, neox, k, rng, /*cuda=*/false,
                                       /*from_output=*/true);
    // Weights 100x apart (trained q/k norms are uneven): still within the dtype's tolerance.
    rope_cases::run_qk_norm_train_case(ex, pkg, dtype, neox, k, rng, /*cuda=*/false,
                                       /*from_output=*/true, /*weight_spread=*/10);
  });
}

TEST_F(RotarySoftmaxCpu, SoftmaxEveryDtypeAndShapeMatchesFloat64) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  CpuExecutor cpu;
  for (int dtype : {kBF16, kFP16, kFP32})
    for (const auto& k : softmax_cases::kSoftmaxCases) {
      softmax_cases::run_softmax_case(cpu, *softmax_, dtype, k, rng);
      if (HasFatalFailure()) return;
    }
}

TEST_F(RotarySoftmaxCpu, CrossEntropyEveryDtypeAndShapeMatchesFloat64) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE(testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  CpuExecutor cpu;
  for (int dtype : {kBF16, kFP16, kFP32})
    for (const auto& k : softmax_cases::kCeCases) {
      softmax_cases::run_ce_case(cpu, *softmax_, dtype, k, rng);
      if (HasFatalFailure()) return;
    }
}

TEST_F(RotarySoftmaxCpu, BadArgumentsAreRefusedWithAMessage) {
  std::string err;
  // Rotary: rot_dim > head_dim, bad layout attribute, 2-D query, int32 positions.
  HostTensor q(kBF16, 3, 2 * 8), cache(kFP32, 10, 8), wide(kFP32, 10, 10);
  rope_cases::HeadsDl qd(q.dl(), 2, 8, 8);
  rope_cases::CacheDl cos(cache.dl(), 4, 0, kFP32), sin(cache.dl(), 4, 4, kFP32);
  rope_cases::CacheDl cos5(wide.dl(), 5, 0, kFP32), sin5(wide.dl(), 5, 5, kFP32);
  CpuExecutor cpu;
  rope_cases::Int64Tensor pos({0, 1, 2});
  const DLTensor* p = pos.view(cpu);
  EXPECT_EQ(rotary_->call(
                "rotary_embedding",
                {targ(p), targ(&qd.t), targ(nullptr), targ(&cos5.t), targ(&sin5.t), iarg(1)}, &err),
            KH_ERR_INVALID_ARGUMENT);
  EXPECT_NE(err.find("rot_dim"), std::string::npos) << err;
  EXPECT_EQ(rotary_->call(
                "rotary_embedding",
                {targ(p), targ(&qd.t), targ(nullptr), targ(&cos.t), targ(&sin.t), iarg(2)}, &err),
            KH_ERR_INVALID_ARGUMENT);
  EXPECT_NE(err.find("is_neox"), std::string::npos) << err;
  EXPECT_EQ(rotary_->call(
                "rotary_embedding",
                {targ(p), targ(q.dl()), targ(nullptr), targ(&cos.t), targ(&sin.t), iarg(1)}, &err),
            KH_ERR_INVALID_ARGUMENT);
  EXPECT_NE(err.find("[tokens, heads, head_dim]"), std::string::npos) << err;
  DLTensor p32 = *p;
  p32.dtype = DLDataType{kDLInt, 32, 1};
  EXPECT_EQ(
      rotary_->call("rotary_embedding",
                    {targ(&p32), targ(&qd.t), targ(nullptr), targ(&cos.t), targ(&sin.t), iarg(1)},
                    &err),
      KH_ERR_UNSUPPORTED);
  EXPECT_NE(err.find("int64"), std::string::npos) << err;
  // Overlapping heads (head stride smaller than head_dim).
  rope_cases::HeadsDl overlap(q.dl(), 2, 8, 4);
  EXPECT_EQ(
      rotary_->call("rotary_embedding",
                    {targ(p), targ(&overlap.t), targ(nullptr), targ(&cos.t), targ(&sin.t), iarg(1)},
                    &err),
      KH_ERR_UNSUPPORTED);
  EXPECT_NE(err.find("overlapping"), std::string::npos) << err;
  // QKNormRotaryEmbedding: eps not positive, a key without its weight, a weight of the wrong
  // length or dtype.
  HostTensor kt(kBF16, 3, 8), w8 = vector_tensor(kBF16, 8), w4 = vector_tensor(kBF16, 4),
                              w8f = vector_tensor(kFP32, 8);
  rope_cases::HeadsDl kd(kt.dl(), 1, 8, 8);
  auto qk = [&](const DLTensor* key, const DLTensor* qw, const DLTensor* kw, double eps) {
    return rotary_->call("qk_norm_rotary_embedding",
                         {targ(p), targ(&qd.t), targ(key), targ(qw), targ(kw), farg(eps),
                          targ(&cos.t), targ(&sin.t), iarg(1)},
                         &err);
  };
  EXPECT_EQ(qk(&kd.t, w8.dl(), w8.dl(), 1e-6), KH_OK) << err;
  EXPECT_EQ(qk(&kd.t, w8.dl(), w8.dl(), 0.0), KH_ERR_INVALID_ARGUMENT);
  EXPECT_NE(err.find("eps"), std::string::npos) << err;
  EXPECT_EQ(qk(&kd.t, w8.dl(), nullptr, 1e-6), KH_ERR_INVALID_ARGUMENT);
  EXPECT_NE(err.find("key_weight"), std::string::npos) << err;
  EXPECT_NE(qk(&kd.t, w4.dl(), w8.dl(), 1e-6), KH_OK);
  EXPECT_NE(err.find("query_weight"), std::string::npos) << err;
  EXPECT_NE(qk(&kd.t, w8.dl(), w8f.dl(), 1e-6), KH_OK);
  EXPECT_NE(err.find("key_weight"), std::string::npos) << err;
  // Its training ops: an output of another shape, a key output without key_in, a key gradient
  // missing, a workspace of the wrong width.
  HostTensor qo(kBF16, 3, 2 * 8), qo_short(kBF16, 2, 2 * 8), ko(kBF16, 3, 8);
  rope_cases::HeadsDl qod(qo.dl(), 2, 8, 8), qos(qo_short.dl(), 2, 8, 8), kod(ko.dl(), 1, 8, 8);
  auto train = [&](const DLTensor* key_in, const DLTensor* q_out, const DLTensor* k_out) {
    return rotary_->call(
        "qk_norm_rotary_embedding_train",
        {targ(p), targ(&qd.t), targ(key_in), targ(w8.dl()), targ(key_in ? w8.dl() : nullptr),
         farg(1e-6), targ(&cos.t), targ(&sin.t), iarg(1), targ(q_out), targ(k_out)},
        &err);
  };
  EXPECT_EQ(train(&kd.t, &qod.t, &kod.t), KH_OK) << err;
  EXPECT_EQ(train(&kd.t, &qos.t, &kod.t), KH_ERR_INVALID_ARGUMENT);
  EXPECT_NE(err.find("query_in"), std::string::npos) << err;
  EXPECT_EQ(train(nullptr, &qod.t, &kod.t), KH_ERR_INVALID_ARGUMENT);
  EXPECT_NE(err.find("only with key_in"), std::string::npos) << err;
  HostTensor dqw = vector_tensor(kBF16, 8), dkw = vector_tensor(kBF16, 8), ws(kFP32, 2, 16),
             ws_narrow(kFP32, 2, 8);
  auto backward = [&](const DLTensor* dkey, const DLTensor* workspace) {
    return rotary_->call(
        "qk_norm_rotary_embedding_backward",
        {targ(p), targ(&qod.t), targ(dkey), targ(&qd.t), targ(&kd.t), targ(w8.dl()), targ(w8.dl()),
         farg(1e-6), targ(&cos.t), targ(&sin.t), iarg(1), targ(&qod.t), targ(&kod.t),
         targ(dqw.dl()), targ(dkw.dl()), targ(workspace)},
        &err);
  };
  EXPECT_EQ(backward(&kod.t, ws.dl()), KH_OK) << err;
  EXPECT_EQ(backward(nullptr, ws.dl()), KH_ERR_INVALID_ARGUMENT);
  EXPECT_NE(err.find("dkey must be given with key_in"), std::string::npos) << err;
  EXPECT_EQ(backward(&kod.t, ws_narrow.dl()), KH_ERR_INVALID_ARGUMENT);
  EXPECT_NE(err.find("2 * head_dim"), std::string::npos) << err;
  // The FromOutput ops' rstd: one fp32 a row (3 tokens x 2 query heads, 3 x 1 key head), given
  // for the key exactly when there is one.
  HostTensor rq = vector_tensor(kFP32, 6), rk = vector_tensor(kFP32, 3),
             rq_short = vector_tensor(kFP32, 5), rq16 = vector_tensor(kBF16, 6);
  auto train_rstd = [&](const DLTensor* key_in, const DLTensor* rstd_q, const DLTensor* rstd_k) {
    return rotary_->call(
        "qk_norm_rotary_embedding_train_rstd",
        {targ(p), targ(&qd.t), targ(key_in), targ(w8.dl()), targ(key_in ? w8.dl() : nullptr),
         farg(1e-6), targ(&cos.t), targ(&sin.t), iarg(1), targ(&qod.t),
         targ(key_in ? &kod.t : nullptr), targ(rstd_q), targ(rstd_k)},
        &err);
  };
  EXPECT_EQ(train_rstd(&kd.t, rq.dl(), rk.dl()), KH_OK) << err;
  EXPECT_EQ(train_rstd(&kd.t, rq_short.dl(), rk.dl()), KH_ERR_INVALID_ARGUMENT);
  EXPECT_NE(err.find("rstd_query"), std::string::npos) << err;
  EXPECT_NE(train_rstd(&kd.t, rq16.dl(), rk.dl()), KH_OK);
  EXPECT_NE(err.find("fp32"), std::string::npos) << err;
  EXPECT_EQ(train_rstd(&kd.t, rq.dl(), nullptr), KH_ERR_INVALID_ARGUMENT);
  EXPECT_NE(err.find("rstd_key must be given with the key"), std::string::npos) << err;
  EXPECT_EQ(train_rstd(nullptr, rq.dl(), rk.dl()), KH_ERR_INVALID_ARGUMENT);
  EXPECT_NE(err.find("only with the key"), std::string::npos) << err;
  auto backward_out = [&](const DLTensor* rstd_q, const DLTensor* rstd_k) {
    return rotary_->call(
        "qk_norm_rotary_embedding_backward_from_output",
        {targ(p), targ(&qod.t), targ(&kod.t), targ(&qd.t), targ(&kd.t), targ(rstd_q), targ(rstd_k),
         targ(w8.dl()), targ(w8.dl()), targ(&cos.t), targ(&sin.t), iarg(1), targ(&qod.t),
         targ(&kod.t), targ(dqw.dl()), targ(dkw.dl()), targ(ws.dl())},
        &err);
  };
  EXPECT_EQ(backward_out(rq.dl(), rk.dl()), KH_OK) << err;
  EXPECT_EQ(backward_out(rq.dl(), rq.dl()), KH_ERR_INVALID_ARGUMENT);  // 6 for the key's 3 rows
  EXPECT_NE(err.find("rstd_key"), std::string::npos) << err;

  // Softmax / cross-entropy: shape and dtype mismatches.
  HostTensor x(kFP16, 4, 10), y(kFP16, 4, 9), y32(kFP32, 4, 10);
  EXPECT_EQ(softmax_->call("softmax", {targ(x.dl()), targ(y.dl())}, &err), KH_ERR_INVALID_ARGUMENT);
  EXPECT_NE(err.find("tensor y"), std::string::npos) << err;
  EXPECT_EQ(softmax_->call("softmax", {targ(x.dl()), targ(y32.dl())}, &err), KH_ERR_UNSUPPORTED);
  rope_cases::Int64Tensor t3({0, 1, 2});
  HostTensor loss = vector_tensor(kFP32, 4), loss16 = vector_tensor(kFP16, 4);
  EXPECT_EQ(softmax_->call("cross_entropy",
                           {targ(x.dl()), targ(t3.view(cpu)), iarg(-100), targ(loss.dl())}, &err),
            KH_ERR_INVALID_ARGUMENT);
  EXPECT_NE(err.find("targets"), std::string::npos) << err;
  rope_cases::Int64Tensor t4({0, 1, 2, 3});
  EXPECT_EQ(softmax_->call("cross_entropy",
                           {targ(x.dl()), targ(t4.view(cpu)), iarg(-100), targ(loss16.dl())}, &err),
            KH_ERR_UNSUPPORTED);
  EXPECT_NE(err.find("float32"), std::string::npos) << err;
  EXPECT_EQ(softmax_->call("cross_entropy_train",
                           {targ(x.dl()), targ(t4.view(cpu)), iarg(-100), farg(INFINITY),
                            targ(loss.dl()), targ(x.dl())},
                           &err),
            KH_ERR_INVALID_ARGUMENT);
  EXPECT_NE(err.find("grad_scale"), std::string::npos) << err;
}

// In place: softmax y = x and cross_entropy_train dlogits = logits give the same results.
TEST_F(RotarySoftmaxCpu, InPlaceCallsMatchOutOfPlace) {
  std::mt19937_64 rng(fresh_seed());
  std::normal_distribution<double> n(0.0, 2.0);
  CpuExecutor cpu;
  for (int dtype : {kBF16, kFP32}) {
    HostTensor x(dtype, 5, 1001), y(dtype, 5, 1001), x2(dtype, 5, 1001);
    x.fill([&](int64_t, int64_t) { return n(rng); });
    x2.fill([&](int64_t r, int64_t c) { return x.get(r, c); });
    std::string err;
    ASSERT_EQ(softmax_->call("softmax", {targ(x.dl()), targ(y.dl())}, &err), KH_OK) << err;
    ASSERT_EQ(softmax_->call("softmax", {targ(x2.dl()), targ(x2.dl())}, &err), KH_OK) << err;
    EXPECT_EQ(x2.values(), y.values());
    HostTensor g(dtype, 5, 1001), loss = vector_tensor(kFP32, 5), loss2 = vector_tensor(kFP32, 5);
    x2.fill([&](int64_t r, int64_t c) { return x.get(r, c); });
    rope_cases::Int64Tensor t({3, -100, 1000, 0, 7});
    ASSERT_EQ(softmax_->call("cross_entropy_train",
                             {targ(x.dl()), targ(t.view(cpu)), iarg(-100), farg(0.5),
                              targ(loss.dl()), targ(g.dl())},
                             &err),
              KH_OK)
        << err;
    ASSERT_EQ(softmax_->call("cross_entropy_train",
                             {targ(x2.dl()), targ(t.view(cpu)), iarg(-100), farg(0.5),
                              targ(loss2.dl()), targ(x2.dl())},
                             &err),
              KH_OK)
        << err;
    EXPECT_EQ(x2.values(), g.values());
    EXPECT_EQ(loss2.values(), loss.values());
  }
}

}  // namespace
}  // namespace kh::kernels_test
