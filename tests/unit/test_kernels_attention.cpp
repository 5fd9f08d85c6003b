// The attention package's cpu ops through the real loader against float64 references on fresh
// random inputs: attention_forward (padded and packed varlen batches, MHA/GQA/MQA, causal and
// non-causal, sliding window, more keys than queries and the reverse, rows that see no key, the
// log-sum-exp), attention_backward (dq, dk, dv) and paged_kv_append + paged_attention_decode and
// paged_attention_decode_append (scrambled block tables, page sizes 1..64, several query tokens, a
// window); bf16/fp16/fp32. Then the argument checks: each refusal names the op and the argument.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "tests/unit/test_kernels_attention_cases.h"
#include "tests/unit/test_kernels_util.h"

namespace kh::kernels_test {
namespace {

using attention_cases::DecodeCase;
using attention_cases::ForwardCase;

const ForwardCase kForwardCases[] = {
    {4, 2, 64, {37, 37}, {37, 37}, false, false, -1, true},
    {4, 4, 32, {16, 16, 16}, {40, 40, 40}, false, true, -1, true},     // more keys than queries
    {8, 1, 64, {1, 50, 17, 0}, {1, 50, 17, 0}, true, true, -1, true},  // MQA, empty sequence
    {4, 2, 128, {30, 9}, {12, 40}, true, true, -1, true},     // fewer keys: rows that see nothing
    {2, 2, 64, {64}, {64}, true, true, 7, false},             // sliding window
    {6, 3, 48, {21, 5}, {21, 5}, true, false, 4, true},       // window without causal
    {4, 2, 64, {19, 33}, {19, 33}, true, true, -1, true, 4},  // output rows padded
};

const DecodeCase kDecodeCases[] = {
    {4, 2, 64, {37, 100, 1}, 1, 1, 16, -1, true},
    {8, 1, 32, {5, 64}, 3, 3, 1, -1, false},  // MQA, 3 query tokens, pages of one token
    {4, 4, 64, {200}, 2, 5, 64, 30, true},    // window, more new tokens than queries
    {6, 2, 16, {70, 3, 33}, 1, 2, 8, -1, false},
};

class AttentionCpu : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { pkg_ = new Package("attention"); }
  static Package* pkg_;
};
Package* AttentionCpu::pkg_ = nullptr;

TEST_F(AttentionCpu, ForwardEveryDtypeAndShapeMatchesFloat64) {
  CpuExecutor cpu;
  attention_cases::run_cases(cpu, *pkg_, {kBF16, kFP16, kFP32}, kForwardCases,
                             attention_cases::run_forward);
}

TEST_F(AttentionCpu, BackwardEveryDtypeAndShapeMatchesFloat64) {
  CpuExecutor cpu;
  attention_cases::run_cases(cpu, *pkg_, {kBF16, kFP16, kFP32}, kForwardCases,
                             attention_cases::run_backward);
}

TEST_F(AttentionCpu, PagedAppendAndDecodeMatchFloat64) {
  CpuExecutor cpu;
  attention_cases::run_cases(cpu, *pkg_, {kBF16, kFP16, kFP32}, kDecodeCases,
                             attention_cases::run_decode);
}

TEST_F(AttentionCpu, BadArgumentsAreRefusedNamingTheArgument) {
  using attention_cases::NdView;
  HostTensor q(kBF16, 8, 4 * 64), k(kBF16, 8, 3 * 64), out(kBF16, 8, 4 * 64);
  NdView qv(q.dl(), {8, 4, 64}), kv(k.dl(), {8, 3, 64}), ov(out.dl(), {8, 4, 64}),
      q4(q.dl(), {2, 4, 4, 64}), o4(out.dl(), {2, 4, 4, 64});
  HostTensor cu = attention_cases::int32_tensor({0, 8});
  NdView cuv(cu.dl(), {2}, attention_cases::kInt32);
  auto call = [&](const DLTensor* qq, const DLTensor* kk, const DLTensor* cu_q,
                  const DLTensor* cu_k, int64_t causal, int64_t window, double scale,
                  const DLTensor* oo) {
    std::string err;
    int32_t s = pkg_->call("attention_forward",
                           {targ(qq), targ(kk), targ(kk), targ(cu_q), targ(cu_k), iarg(8),
                            iarg(causal), iarg(window), farg(scale), targ(oo), targ(nullptr)},
                           &err);
    return std::make_pair(s, err);
  };
  auto [s1, e1] = call(&qv.t, &kv.t, &cuv.t, &cuv.t, 1, -1, 0.125, &ov.t);
  EXPECT_EQ(s1, KH_ERR_INVALID_ARGUMENT);
  EXPECT_NE(e1.find("4 query heads is not a multiple of 3"), std::string::npos) << e1;
  auto [s2, e2] = call(&qv.t, &qv.t, &cuv.t, nullptr, 1, -1, 0.125, &ov.t);
  EXPECT_EQ(s2, KH_ERR_INVALID_ARGUMENT);
  EXPECT_NE(e2.find("cu_seqlens_q and cu_seqlens_k"), std::string::npos) << e2;
  auto [s3, e3] = call(&qv.t, &qv.t, &cuv.t, &cuv.t, 2, -1, 0.125, &ov.t);
  EXPECT_EQ(s3, KH_ERR_INVALID_ARGUMENT);
  EXPECT_NE(e3.find("causal must be 0 or 1"), std::string::npos) << e3;
  auto [s4, e4] = call(&qv.t, &qv.t, &cuv.t, &cuv.t, 1, -5, 0.125, &ov.t);
  EXPECT_EQ(s4, KH_ERR_INVALID_ARGUMENT);
  EXPECT_NE(e4.find("window_left -5"), std::string::npos) << e4;
  auto [s5, e5] = call(&qv.t, &qv.t, &cuv.t, &cuv.t, 1, -1, 0.0, &ov.t);
  EXPECT_EQ(s5, KH_ERR_INVALID_ARGUMENT);
  EXPECT_NE(e5.find("scale"), std::string::npos) << e5;
  auto [s6, e6] = call(&q4.t, &q4.t, &cuv.t, &cuv.t, 1, -1, 0.125, &o4.t);  // 4-D with cu_seqlens
  EXPECT_EQ(s6, KH_ERR_INVALID_ARGUMENT);
  EXPECT_NE(e6.find("tensor q has 4 dimensions"), std::string::npos) << e6;
  auto [s7, e7] = call(&qv.t, &qv.t, &cuv.t, &cuv.t, 1, -1, 0.125, &o4.t);  // out shape
  EXPECT_NE(s7, KH_OK);
  EXPECT_NE(e7.find("out"), std::string::npos) << e7;
}

TEST_F(AttentionCpu, IndexTensorsAreCheckedBeforeTheyAreUsed) {
  using attention_cases::NdView;
  // cu_seqlens that fall, then rise past the tokens.
  HostTensor q(kFP32, 8, 64), out(kFP32, 8, 64);
  NdView qv(q.dl(), {8, 1, 64}), ov(out.dl(), {8, 1, 64});
  for (const std::vector<int32_t>& bad : {std::vector<int32_t>{0, 5, 3}, {0, 4, 9}}) {
    HostTensor cu = attention_cases::int32_tensor(bad);
    NdView cuv(cu.dl(), {3}, attention_cases::kInt32);
    std::string err;
    EXPECT_EQ(pkg_->call("attention_forward",
                         {targ(&qv.t), targ(&qv.t), targ(&qv.t), targ(&cuv.t), targ(&cuv.t),
                          iarg(5), iarg(1), iarg(-1), farg(0.125), targ(&ov.t), targ(nullptr)},
                         &err),
              KH_ERR_INVALID_ARGUMENT);
    EXPECT_NE(err.find("cu_seqlens_q["), std::string::npos) << err;
  }
  // seq_lens past the block table, and a block table entry past the cache.
  HostTensor kc(kFP32, 4 * 2, 64), dq(kFP32, 1, 64), dout(kFP32, 1, 64);
  NdView kcv(kc.dl(), {4, 2, 1, 64}), qd(dq.dl(), {1, 1, 1, 64}), od(dout.dl(), {1, 1, 1, 64});
  // paged_attention_decode_append into kc (as K and V), refused with the cache untouched: its
  // message.
  auto refused_append = [&](const DLTensor* q, const DLTensor* kn, const DLTensor* table,
                            const DLTensor* lens, const DLTensor* out) {
    HostTensor before = kc;
    std::string err;
    EXPECT_EQ(pkg_->call("paged_attention_decode_append",
                         {targ(q), targ(kn), targ(kn), targ(&kcv.t), targ(&kcv.t), targ(table),
                          targ(lens), iarg(-1), farg(0.125), targ(out), targ(nullptr)},
                         &err),
              KH_ERR_INVALID_ARGUMENT);
    for (int64_t i = 0; i < 8 * 64; ++i)
      if (kc.bits_at(i) != before.bits_at(i)) {
        ADD_FAILURE() << "cache row written before the refusal: " << err;
        break;
      }
    return err;
  };
  struct Bad {
    std::vector<int32_t> table, lens;
    const char* needle;
  };
  for (const Bad& b :
       {Bad{{0, 1}, {5}, "seq_lens[0] = 5"}, Bad{{0, 7}, {4}, "block_table[0][1] = 7"}}) {
    HostTensor tab = attention_cases::int32_tensor(b.table),
               lens = attention_cases::int32_tensor(b.lens);
    NdView tv(tab.dl(), {1, 2}, attention_cases::kInt32),
        lv(lens.dl(), {1}, attention_cases::kInt32);
    std::string err;
    EXPECT_EQ(pkg_->call("paged_attention_decode",
                         {targ(&qd.t), targ(&kcv.t), targ(&kcv.t), targ(&tv.t), targ(&lv.t),
                          iarg(-1), farg(0.125), targ(&od.t), targ(nullptr)},
                         &err),
              KH_ERR_INVALID_ARGUMENT);
    EXPECT_NE(err.find(b.needle), std::string::npos) << err;
    // The fused append refuses the same indices before it writes a row of the cache.
    std::mt19937_64 rng(fresh_seed());
    HostTensor kn = attention_cases::random_tensor(kFP32, 1, 64, rng);
    NdView knv(kn.dl(), {1, 1, 1, 64});
    err = refused_append(&qd.t, &knv.t, &tv.t, &lv.t, &od.t);
    EXPECT_NE(err.find(b.needle), std::string::npos) << err;
  }
  // New tokens for two sequences, queries for one.
  HostTensor tab = attention_cases::int32_tensor({0, 1}), lens = attention_cases::int32_tensor({3});
  NdView tv(tab.dl(), {1, 2}, attention_cases::kInt32), lv(lens.dl(), {1}, attention_cases::kInt32);
  HostTensor kn2(kFP32, 2, 64);
  NdView kn2v(kn2.dl(), {2, 1, 1, 64});
  std::string err = refused_append(&qd.t, &kn2v.t, &tv.t, &lv.t, &od.t);
  EXPECT_NE(err.find("k_new has 2 sequences, q 1"), std::string::npos) << err;
  // A length the append takes (1 new token) but the decode does not (3 query tokens): refused
  // before the append writes its row.
  HostTensor q3(kFP32, 3, 64), out3(kFP32, 3, 64), kn1(kFP32, 1, 64),
      short_len = attention_cases::int32_tensor({2});
  NdView q3v(q3.dl(), {1, 3, 1, 64}), o3v(out3.dl(), {1, 3, 1, 64}), kn1v(kn1.dl(), {1, 1, 1, 64}),
      slv(short_len.dl(), {1}, attention_cases::kInt32);
  kn1.fill([](int64_t, int64_t c) { return 1.0 + c; });
  err = refused_append(&q3v.t, &kn1v.t, &tv.t, &slv.t, &o3v.t);
  EXPECT_NE(err.find("seq_lens[0] = 2"), std::string::npos) << err;
}

}  // namespace
}  // namespace kh::kernels_test
