// The runtime's skinny GEMM (tools/demo/skinny_gemm.*) without a GPU: its source compiles with
// NVRTC for sm_80 and sm_90a (the loader's target on Hopper) with every variant, no warnings and
// no spills; the default plan at the decode shapes the runtime runs (Qwen3-0.6B, Llama-3-8B,
// batches 1-64); and the shapes and plans it refuses, with the reason. The device side is
// tests/gpu/test_gpu_skinny_gemm.cpp.
#include <gtest/gtest.h>

#include <string>

#include "tests/unit/test_kernels_device_util.h"
#include "tools/demo/skinny_gemm.h"

namespace kh::demo {
namespace {

TEST(SkinnyGemm, SourceCompilesForAmpereAndHopperWithEveryVariantAndNoSpills) {
  if (!kernels_test::Nvrtc::get().ok()) GTEST_SKIP() << kernels_test::Nvrtc::get().load_error;
  const std::string src = skinny_gemm_source();
  for (const char* sm : {"sm_80", "sm_90a"}) {
    SCOPED_TRACE(sm);
    kernels_test::expect_source_compiles_without_spills(src, "skinny_gemm.cu", sm);
    const kernels_test::Nvrtc::Output out = kernels_test::Nvrtc::get().compile_source(
        src, "skinny_gemm.cu",
        {std::string("--gpu-architecture=") + sm, "-default-device", "--std=c++17"});
    ASSERT_TRUE(out.ok) << out.log;
    std::vector<SkinnyPlan> all = skinny_variants();
    for (SkinnyEpilogue e :
         {SkinnyEpilogue::kSiluAndMul, SkinnyEpilogue::kQkNormRope, SkinnyEpilogue::kResidual})
      for (bool prenorm : {false, true})
        for (const SkinnyPlan& p : skinny_epilogue_variants(e, prenorm)) all.push_back(p);
    EXPECT_EQ(all.size(), skinny_variants().size() + 9);
    for (const SkinnyPlan& p : all) {
      // The wgmma kernels exist in sm_90a code only; the others everywhere.
      const bool expected = !p.wgmma || std::string(sm) == "sm_90a";
      EXPECT_EQ(out.cubin.find(p.kernel() + '\0') != std::string::npos, expected)
          << sm << (expected ? " lacks " : " has ") << p.kernel();
    }
    // The LM head + argmax (SkinnyGemm::run_head_argmax), Hopper only.
    for (const std::string name : {"kh_skinny_head_argmax_s6", "kh_skinny_head_argmax_norm_s6"})
      EXPECT_EQ(out.cubin.find(name + '\0') != std::string::npos, std::string(sm) == "sm_90a")
          << sm << " " << name;
  }
}

TEST(SkinnyGemm, PlanSplitsKUntilTheGridIsFullOrTheSplitsShort) {
  // Qwen3-0.6B's decode layer (hidden 1024): q/k/v 4096 x 1024, o 1024 x 2048, gate/up
  // 6144 x 1024, down 1024 x 3072, the LM head 151936 x 1024.
  EXPECT_EQ(skinny_plan(64, 4096, 1024), (SkinnyPlan{64, 4, 2}));  // 64 tiles x 2
  EXPECT_EQ(skinny_plan(64, 1024, 2048), (SkinnyPlan{64, 4, 4}));  // 16 tiles, 512 k each
  EXPECT_EQ(skinny_plan(64, 6144, 1024), (SkinnyPlan{64, 4, 2}));  // 96 tiles x 2
  EXPECT_EQ(skinny_plan(64, 1024, 3072), (SkinnyPlan{64, 4, 6}));
  EXPECT_EQ(skinny_plan(64, 151936, 1024), (SkinnyPlan{64, 4, 1}));  // 2374 tiles
  // Llama-3-8B (hidden 4096) and its 14336-wide MLP: splits of 512 k-values at most.
  EXPECT_EQ(skinny_plan(1, 1024, 4096), (SkinnyPlan{64, 4, 8}));
  EXPECT_EQ(skinny_plan(16, 4096, 14336), (SkinnyPlan{64, 4, 4}));
  EXPECT_EQ(skinny_plan(8, 28672, 4096), (SkinnyPlan{64, 4, 1}));
  // The rows do not change the plan; K below 512 is never split.
  EXPECT_EQ(skinny_plan(1, 4096, 1024), skinny_plan(64, 4096, 1024));
  EXPECT_EQ(skinny_plan(64, 64, 448).splits, 1);
  for (const SkinnyPlan& p : {skinny_plan(64, 4096, 1024), skinny_plan(1, 1024, 3072)}) {
    EXPECT_EQ(skinny_plan_refusal(p, 3072), "");
    EXPECT_EQ(p.shared_bytes(), 4u * (64 + 64) * 64 * 2);  // 64 KiB: 3 CTAs an SM on Hopper
  }
}

// The Hopper plan at the decode shapes on an H200 (132 SMs): 64-column tiles, 4 stages, about
// two CTAs an SM.
TEST(SkinnyGemm, WgmmaPlanFillsTwoCtasAnSm) {
  EXPECT_EQ(skinny_wgmma_plan(64, 4096, 1024, 132), (SkinnyPlan{64, 4, 4, true}));  // 256 CTAs
  EXPECT_EQ(skinny_wgmma_plan(64, 6144, 1024, 132), (SkinnyPlan{64, 4, 2, true}));  // 192
  EXPECT_EQ(skinny_wgmma_plan(64, 1024, 2048, 132), (SkinnyPlan{64, 4, 8, true}));  // 16 x 8
  EXPECT_EQ(skinny_wgmma_plan(64, 1024, 3072, 132), (SkinnyPlan{64, 4, 8, true}));
  EXPECT_EQ(skinny_wgmma_plan(64, 151936, 1024, 132), (SkinnyPlan{64, 4, 1, true}));
  // Fewer SMs (an A100's count), fewer splits; a short K is not split below 128 values.
  EXPECT_EQ(skinny_wgmma_plan(64, 4096, 1024, 108).splits, 3);
  EXPECT_EQ(skinny_wgmma_plan(1, 64, 256, 132), (SkinnyPlan{64, 4, 2, true}));
  EXPECT_EQ(skinny_wgmma_plan(1, 64, 64, 132).splits, 1);
  EXPECT_EQ(skinny_wgmma_plan(1, 64, 64, 0).splits, 1);  // no SM count: no split
  for (int64_t K : {64, 1024, 3072, 14336})
    for (int64_t N : {64, 1024, 4096, 151936})
      EXPECT_EQ(skinny_plan_refusal(skinny_wgmma_plan(64, N, K, 132), K), "") << N << " x " << K;
}

// The SiluAndMul epilogue: the wgmma 64-column tiles of the [2 N, K] weight (32 output columns
// each); with tiles for half the SMs, whole K a CTA 6 stages deep, else split like the plain GEMM
// of that weight.
TEST(SkinnyGemm, SiluPlanTilesTheGateUpWeight) {
  EXPECT_EQ(skinny_silu_plan(64, 3072, 1024, 132),
            (SkinnyPlan{64, 6, 1, true, SkinnyEpilogue::kSiluAndMul}));  // 96 tiles
  EXPECT_EQ(skinny_silu_plan(64, 3072, 1024, 132).kernel(), "kh_skinny_wgmma_silu_n1_s6");
  EXPECT_EQ(skinny_silu_plan(64, 256, 1024, 132),
            (SkinnyPlan{64, 4, 8, true, SkinnyEpilogue::kSiluAndMul}));  // 8 tiles x 8
  EXPECT_EQ(skinny_plan_refusal(skinny_silu_plan(1, 14336, 4096, 132), 4096), "");
  const std::vector<SkinnyPlan> silu = skinny_epilogue_variants(SkinnyEpilogue::kSiluAndMul);
  ASSERT_EQ(silu.size(), 2u);
  for (const SkinnyPlan& p : silu) {
    EXPECT_TRUE(p.wgmma && p.epilogue == SkinnyEpilogue::kSiluAndMul && p.n_tile == 64)
        << p.kernel();
    EXPECT_EQ(skinny_plan_refusal(p, 1024), "") << p.kernel();
  }
  EXPECT_NE(skinny_plan_refusal({64, 4, 1, false, SkinnyEpilogue::kSiluAndMul}, 1024)
                .find("no SiluAndMul epilogue for mma.sync"),
            std::string::npos);
  EXPECT_NE(skinny_plan_refusal({128, 4, 1, true, SkinnyEpilogue::kSiluAndMul}, 1024)
                .find("no SiluAndMul epilogue for wgmma tiles of 128"),
            std::string::npos);
}

// The q/k norm + RoPE epilogue: a 128-wide head a CTA, three stages, K split to about one CTA an
// SM: Qwen3-0.6B's q/k/v (32 heads of 1024) 4 ways.
TEST(SkinnyGemm, QkNormRopePlanTakesAHeadACta) {
  const SkinnyPlan p = skinny_qk_norm_rope_plan(64, 4096, 1024, 132);
  EXPECT_EQ(p, (SkinnyPlan{128, 3, 4, true, SkinnyEpilogue::kQkNormRope}));
  EXPECT_EQ(p.kernel(), "kh_skinny_wgmma_qknr_n2_s3");
  EXPECT_EQ(p.shared_bytes(), 3u * (64 + 128) * 64 * 2);
  EXPECT_EQ(skinny_plan_refusal(p, 1024), "");
  EXPECT_EQ(skinny_qk_norm_rope_plan(1, 10240, 5120, 132).splits, 1);  // Qwen3-32B: 80 heads
  EXPECT_EQ(skinny_qk_norm_rope_plan(1, 1024, 128, 132).splits, 1);    // K = 128: no split
  EXPECT_EQ(skinny_epilogue_variants(SkinnyEpilogue::kQkNormRope).size(), 2u);
  EXPECT_NE(skinny_plan_refusal({128, 6, 1, true, SkinnyEpilogue::kQkNormRope}, 1024)
                .find("no q/k norm epilogue for wgmma tiles of 128 columns and 6 stages"),
            std::string::npos);
}

// The folded norm: the residual epilogue takes the default wgmma plan's 64-column tiles and
// splits (Qwen3-0.6B's o and down: 16 tiles, 8 splits); the folded norm comes with the
// SiluAndMul and q/k norm epilogues (their plans, 8 KiB + 256 bytes more shared memory), not alone.
TEST(SkinnyGemm, FoldedNormPlansAndVariants) {
  const SkinnyPlan res = skinny_residual_plan(64, 1024, 3072, 132);
  EXPECT_EQ(res, (SkinnyPlan{64, 4, 8, true, SkinnyEpilogue::kResidual}));
  EXPECT_EQ(res.kernel(), "kh_skinny_wgmma_res_n1_s4");
  EXPECT_EQ(skinny_plan_refusal(res, 3072), "");
  EXPECT_EQ(skinny_epilogue_variants(SkinnyEpilogue::kResidual).size(), 1u);
  EXPECT_TRUE(skinny_epilogue_variants(SkinnyEpilogue::kResidual, true).empty());
  for (SkinnyEpilogue e : {SkinnyEpilogue::kSiluAndMul, SkinnyEpilogue::kQkNormRope}) {
    const std::vector<SkinnyPlan> plain = skinny_epilogue_variants(e),
                                  pn = skinny_epilogue_variants(e, true);
    ASSERT_EQ(pn.size(), plain.size());
    for (size_t i = 0; i < pn.size(); ++i) {
      EXPECT_TRUE(pn[i].prenorm);
      EXPECT_NE(pn[i].kernel().find("_pn_n"), std::string::npos) << pn[i].kernel();
      EXPECT_EQ(pn[i].shared_bytes(), plain[i].shared_bytes() + 64 * 4);  // the rows' rstd
      EXPECT_EQ(skinny_plan_refusal(pn[i], 1024), "") << pn[i].kernel();
    }
  }
  SkinnyPlan silu_pn = skinny_silu_plan(64, 3072, 1024, 132);
  silu_pn.prenorm = true;
  EXPECT_EQ(silu_pn.kernel(), "kh_skinny_wgmma_silu_pn_n1_s6");
  SkinnyPlan alone{64, 4, 1, true};
  alone.prenorm = true;
  EXPECT_NE(skinny_plan_refusal(alone, 1024).find("folded norm comes with"), std::string::npos);
  const SkinnyPlan res6{64, 6, 1, true, SkinnyEpilogue::kResidual};
  EXPECT_NE(skinny_plan_refusal(res6, 1024)
                .find("no residual epilogue for wgmma tiles of 64 "
                      "columns and 6 stages"),
            std::string::npos);
}

// DecodeGemm::kAuto: the skinny GEMM for Hopper's wide-not-tall weights only.
TEST(SkinnyGemm, PreferredForWeightsWiderThanTallOnHopper) {
  EXPECT_TRUE(skinny_preferred(64, 1024, 2048, true));     // Qwen3-0.6B o
  EXPECT_TRUE(skinny_preferred(1, 1024, 3072, true));      // down
  EXPECT_FALSE(skinny_preferred(64, 4096, 1024, true));    // q/k/v
  EXPECT_FALSE(skinny_preferred(64, 6144, 1024, true));    // gate/up
  EXPECT_FALSE(skinny_preferred(64, 151936, 1024, true));  // LM head
  EXPECT_FALSE(skinny_preferred(64, 1024, 2048, false));   // no wgmma: cuBLASLt
  EXPECT_FALSE(skinny_preferred(64, 2880, 4096, true));    // gpt-oss o: N past 2048
  EXPECT_FALSE(skinny_preferred(64, 4096, 14336, true));   // Llama-3-8B down
  EXPECT_FALSE(skinny_preferred(65, 1024, 2048, true));    // more rows than it takes
}

TEST(SkinnyGemm, RefusalsSayWhatIsTaken) {
  EXPECT_EQ(skinny_refusal(64, 4096, 1024, 1024, 4096), "");
  EXPECT_EQ(skinny_refusal(1, 8, 64, 64, 8), "");
  EXPECT_NE(skinny_refusal(65, 4096, 1024, 1024, 4096).find("65 rows (1..64 taken)"),
            std::string::npos);
  EXPECT_NE(skinny_refusal(0, 4096, 1024, 1024, 4096).find("0 rows"), std::string::npos);
  EXPECT_NE(skinny_refusal(8, 4096, 1000, 1000, 4096).find("K = 1000 (a multiple of 64"),
            std::string::npos);
  EXPECT_NE(skinny_refusal(8, 4092, 1024, 1024, 4092).find("N = 4092 (a multiple of 8"),
            std::string::npos);
  EXPECT_NE(skinny_refusal(8, 4096, 1024, 1028, 4096).find("leading dimensions 1028"),
            std::string::npos);
  EXPECT_NE(skinny_plan_refusal({48, 4, 1}, 1024).find("no mma.sync variant of 48 columns"),
            std::string::npos);
  EXPECT_NE(skinny_plan_refusal({32, 4, 1, true}, 1024).find("no wgmma variant of 32 columns"),
            std::string::npos);
  EXPECT_NE(skinny_plan_refusal({128, 4, 1}, 1024).find("no mma.sync variant of 128"),
            std::string::npos);
  EXPECT_EQ(skinny_plan_refusal({128, 6, 8, true}, 1024), "");
  const std::string nine = skinny_plan_refusal({128, 6, 9, true}, 1024);
  EXPECT_NE(nine.find("9 splits of K = 1024 (1..8: one cluster)"), std::string::npos) << nine;
  EXPECT_NE(skinny_plan_refusal({64, 4, 3, true}, 128).find("3 splits of K = 128 (1..2)"),
            std::string::npos);
  EXPECT_EQ((SkinnyPlan{128, 6, 1, true}).kernel(), "kh_skinny_wgmma_n2_s6");
  EXPECT_NE(skinny_plan_refusal({64, 5, 1}, 1024).find("and 5 stages"), std::string::npos);
  EXPECT_NE(skinny_plan_refusal({64, 4, 17}, 1024).find("17 splits of K = 1024 (1..16)"),
            std::string::npos);
  EXPECT_NE(skinny_plan_refusal({64, 4, 0}, 1024), "");
  EXPECT_EQ((SkinnyPlan{32, 6, 1}).kernel(), "kh_skinny_gemm_n1_s6");
}

}  // namespace
}  // namespace kh::demo
