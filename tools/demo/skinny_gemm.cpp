#include "tools/demo/skinny_gemm.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "kernel_hub/kernel_hub.hpp"
#include "tools/demo/skinny_epilogue.h"

namespace kh::demo {

namespace {

constexpr int64_t kBM = 64, kBK = 64;  // skinny_gemm.cu's tile rows and k-values per stage
constexpr uint32_t kThreads = 128;

// The compiled variants (skinny_gemm.cu's KH_SKINNY and KH_SKINNY_WGMMA_KERNEL lines).
struct Variant {
  int n_tile, stages;
  bool wgmma;
  bool operator==(const Variant&) const = default;
};
constexpr Variant kVariants[] = {{32, 4, false}, {32, 6, false}, {64, 3, false},
                                 {64, 4, false}, {64, 6, false}, {64, 4, true},
                                 {64, 6, true},  {128, 4, true}, {128, 6, true}};

// The compiled epilogue variants (skinny_gemm.cu's KH_SKINNY_WGMMA_KERNEL lines with an
// epilogue): tile width, stages and the folded norm (wgmma).
struct EpilogueVariant {
  SkinnyEpilogue epilogue;
  int n_tile, stages;
  bool prenorm;
};
constexpr EpilogueVariant kEpilogueVariants[] = {
    {SkinnyEpilogue::kSiluAndMul, 64, 4, false},  {SkinnyEpilogue::kSiluAndMul, 64, 6, false},
    {SkinnyEpilogue::kSiluAndMul, 64, 4, true},   {SkinnyEpilogue::kSiluAndMul, 64, 6, true},
    {SkinnyEpilogue::kQkNormRope, 128, 3, false}, {SkinnyEpilogue::kQkNormRope, 128, 4, false},
    {SkinnyEpilogue::kQkNormRope, 128, 3, true},  {SkinnyEpilogue::kQkNormRope, 128, 4, true},
    {SkinnyEpilogue::kResidual, 64, 4, false}};

const char* epilogue_name(SkinnyEpilogue e) {
  switch (e) {
    case SkinnyEpilogue::kSiluAndMul:
      return "SiluAndMul";
    case SkinnyEpilogue::kQkNormRope:
      return "q/k norm";
    case SkinnyEpilogue::kResidual:
      return "residual";
    default:
      return "no";
  }
}

[[noreturn]] void invalid(const std::string& why) {
  throw Error(ErrorKind::kInvalidInput, "skinny GEMM: " + why);
}

// Why `bias` is not a bf16 [N] on `device`; empty when it is (or is null).
std::string bias_refusal(const DeviceTensor* bias, int64_t N, int device) {
  if (bias && (!same_dtype(bias->dtype(), kBF16) || bias->numel() != N || bias->device() != device))
    return fmt::format("bias is {}; bfloat16 [{}] expected", bias->describe(), N);
  return {};
}

// Why `ss` cannot hold `tiles` partial sums of squares a row (fp32 [tiles, 64] on `device`);
// empty when it can. `what` names it in the message.
std::string sums_refusal(const DeviceTensor* ss, int64_t tiles, int device, const char* what) {
  if (!ss || !same_dtype(ss->dtype(), kF32) || ss->device() != device || tiles < 1 ||
      ss->numel() < tiles * kSkinnyMaxRows)
    return fmt::format("{} ({}): float32 of at least {} tiles x {} rows on device {} taken", what,
                       ss ? ss->describe() : "none", std::max<int64_t>(tiles, 1), kSkinnyMaxRows,
                       device);
  return {};
}

}  // namespace

std::string SkinnyPlan::kernel() const {
  const char* epi = epilogue == SkinnyEpilogue::kSiluAndMul   ? "silu_"
                    : epilogue == SkinnyEpilogue::kQkNormRope ? "qknr_"
                    : epilogue == SkinnyEpilogue::kResidual   ? "res_"
                                                              : "";
  return wgmma ? fmt::format("kh_skinny_wgmma_{}{}n{}_s{}", epi, prenorm ? "pn_" : "", n_tile / 64,
                             stages)
               : fmt::format("kh_skinny_gemm_n{}_s{}", n_tile / 32, stages);
}

uint32_t SkinnyPlan::shared_bytes() const {
  // The folded norm's row factors after the stages (skinny_gemm.cu).
  const int norm = prenorm ? kSkinnyMaxRows * 4 : 0;
  return static_cast<uint32_t>(stages * (kBM + n_tile) * kBK * 2 + norm);
}

std::vector<SkinnyPlan> skinny_variants() {
  std::vector<SkinnyPlan> plans;
  for (const Variant& v : kVariants) plans.push_back({v.n_tile, v.stages, 1, v.wgmma});
  return plans;
}

std::vector<SkinnyPlan> skinny_epilogue_variants(SkinnyEpilogue epilogue, bool prenorm) {
  std::vector<SkinnyPlan> plans;
  for (const EpilogueVariant& v : kEpilogueVariants)
    if (v.epilogue == epilogue && v.prenorm == prenorm)
      plans.push_back({v.n_tile, v.stages, 1, true, epilogue, prenorm});
  return plans;
}

SkinnyPlan skinny_plan(int64_t M, int64_t N, int64_t K) {
  (void)M;  // every M <= 64 streams the same weights
  SkinnyPlan p;
  const int64_t tiles = (N + p.n_tile - 1) / p.n_tile;
  const int64_t by_ctas = (kSkinnyTargetCtas + tiles - 1) / tiles;
  const int64_t by_k = std::max<int64_t>(1, K / kSkinnyMinSplitK);
  p.splits = static_cast<int>(std::clamp<int64_t>(std::min(by_ctas, by_k), 1, K / kBK));
  return p;
}

namespace {

// A wgmma plan's splits of K for N columns in tiles of n_tile: about `per_sm` CTAs an SM, at most
// a cluster, at least kSkinnyMinWgmmaSplitK k-values each.
int wgmma_splits(int64_t N, int64_t n_tile, int64_t K, int multiprocessors, int per_sm = 2) {
  const int64_t tiles = (N + n_tile - 1) / n_tile;
  const int64_t max_splits =
      std::clamp<int64_t>(K / kSkinnyMinWgmmaSplitK, 1, kSkinnyMaxClusterSplits);
  return static_cast<int>(
      std::clamp<int64_t>(per_sm * std::max(0, multiprocessors) / tiles, 1, max_splits));
}

}  // namespace

SkinnyPlan skinny_wgmma_plan(int64_t M, int64_t N, int64_t K, int multiprocessors) {
  (void)M;
  SkinnyPlan p{64, 4, 1, true};
  p.splits = wgmma_splits(N, p.n_tile, K, multiprocessors);
  return p;
}

SkinnyPlan skinny_silu_plan(int64_t M, int64_t N, int64_t K, int multiprocessors) {
  SkinnyPlan p = skinny_wgmma_plan(M, 2 * N, K, multiprocessors);  // the same tiles of W
  p.epilogue = SkinnyEpilogue::kSiluAndMul;
  // Tiles enough for half the SMs: whole K a CTA, 6 stages deep, and no cluster sum (in the
  // H200's decode step 0.016 ms faster than 4 stages x 2 splits, which tie alone).
  if (2 * ((2 * N + p.n_tile - 1) / p.n_tile) >= multiprocessors) {
    p.stages = 6;
    p.splits = 1;
  }
  return p;
}

SkinnyPlan skinny_qk_norm_rope_plan(int64_t M, int64_t N, int64_t K, int multiprocessors) {
  (void)M;
  SkinnyPlan p{128, 3, 1, true, SkinnyEpilogue::kQkNormRope};
  // About one CTA an SM (Qwen3-0.6B: 32 heads x 4 splits; two an SM, 8 splits, measured 0.012 ms
  // slower a decode step on the H200).
  p.splits = wgmma_splits(N, p.n_tile, K, multiprocessors, 1);
  return p;
}

SkinnyPlan skinny_residual_plan(int64_t M, int64_t N, int64_t K, int multiprocessors) {
  SkinnyPlan p = skinny_wgmma_plan(M, N, K, multiprocessors);
  p.epilogue = SkinnyEpilogue::kResidual;
  return p;
}

bool skinny_preferred(int64_t M, int64_t N, int64_t K, bool wgmma) {
  return wgmma && M <= kSkinnyMaxRows && N < K && N <= kSkinnyPreferredMaxN;
}

std::string skinny_refusal(int64_t M, int64_t N, int64_t K, int64_t ldx, int64_t ldy) {
  if (M < 1 || M > kSkinnyMaxRows) return fmt::format("{} rows (1..{} taken)", M, kSkinnyMaxRows);
  if (K < kBK || K % kBK) return fmt::format("K = {} (a multiple of {} taken)", K, kBK);
  if (N < 8 || N % 8) return fmt::format("N = {} (a multiple of 8 taken)", N);
  if (ldx < K || ldx % 8 || ldy < N || ldy % 8)
    return fmt::format("leading dimensions {} (x) and {} (y): multiples of 8, at least K and N",
                       ldx, ldy);
  return {};
}

std::string skinny_plan_refusal(const SkinnyPlan& plan, int64_t K) {
  if (plan.epilogue != SkinnyEpilogue::kNone) {
    const bool compiled =
        plan.wgmma && std::any_of(std::begin(kEpilogueVariants), std::end(kEpilogueVariants),
                                  [&](const EpilogueVariant& v) {
                                    return v.epilogue == plan.epilogue && v.n_tile == plan.n_tile &&
                                           v.stages == plan.stages && v.prenorm == plan.prenorm;
                                  });
    if (!compiled)
      return fmt::format("no {} epilogue{} for {} tiles of {} columns and {} stages",
                         epilogue_name(plan.epilogue), plan.prenorm ? " with the folded norm" : "",
                         plan.wgmma ? "wgmma" : "mma.sync", plan.n_tile, plan.stages);
  } else if (plan.prenorm) {
    return "the folded norm comes with the SiluAndMul or q/k norm epilogue only";
  } else if (std::find(std::begin(kVariants), std::end(kVariants),
                       Variant{plan.n_tile, plan.stages, plan.wgmma}) == std::end(kVariants)) {
    return fmt::format("no {} variant of {} columns and {} stages",
                       plan.wgmma ? "wgmma" : "mma.sync", plan.n_tile, plan.stages);
  }
  const int64_t most = plan.wgmma ? std::min(K / kBK, kSkinnyMaxClusterSplits) : K / kBK;
  if (plan.splits < 1 || plan.splits > most)
    return fmt::format("{} splits of K = {} (1..{}{})", plan.splits, K, most,
                       plan.wgmma && most == kSkinnyMaxClusterSplits ? ": one cluster" : "");
  return {};
}

namespace {

// The LM head + argmax kernels (skinny_gemm.cu's KH_SKINNY_HEAD_KERNEL lines).
std::string head_kernel(bool norm) {
  return fmt::format("kh_skinny_head_argmax_{}s{}", norm ? "norm_" : "", kSkinnyHeadStages);
}

}  // namespace

SkinnyGemm::SkinnyGemm(int device, DevicePool& pool)
    : module_(device, "demo_skinny_gemm", skinny_gemm_source()), pool_(pool) {
  const kh_device_info_t info = device_info(device);
  wgmma_ = info.sm_major == 9;  // sm_90a code: the loader's NVRTC target on Hopper
  multiprocessors_ = info.multiprocessors;
  for (const SkinnyPlan& p : skinny_variants())
    if (!p.wgmma || wgmma_) module_.function(p.kernel());  // fail early
  if (wgmma_) {
    for (const EpilogueVariant& v : kEpilogueVariants)
      module_.function(SkinnyPlan{v.n_tile, v.stages, 1, true, v.epilogue, v.prenorm}.kernel());
    for (bool norm : {false, true}) module_.function(head_kernel(norm));
  }
}

SkinnyPlan SkinnyGemm::default_plan(int64_t M, int64_t N, int64_t K) const {
  return wgmma_ ? skinny_wgmma_plan(M, N, K, multiprocessors_) : skinny_plan(M, N, K);
}

std::string SkinnyGemm::refusal(const DeviceTensor& x, const DeviceTensor& w,
                                const DeviceTensor& y) const {
  const std::string tensors =
      fmt::format("x {}, w {}, y {}: ", x.describe(), w.describe(), y.describe());
  if (!same_dtype(x.dtype(), kBF16) || !same_dtype(w.dtype(), kBF16) ||
      !same_dtype(y.dtype(), kBF16))
    return tensors + "bfloat16 taken";
  if (x.device() != module_.device() || w.device() != x.device() || y.device() != x.device())
    return tensors + fmt::format("all on device {} taken", module_.device());
  if (w.ndim() != 2 || w.dim(1) == 0 || x.ndim() < 1 || y.ndim() < 1 ||
      x.dim(x.ndim() - 1) != w.dim(1) || y.dim(y.ndim() - 1) != w.dim(0))
    return tensors + "x [M, K], w [N, K] and y [M, N] taken";
  const int64_t N = w.dim(0), K = w.dim(1), M = x.numel() / K;
  if (y.numel() != M * N) return tensors + fmt::format("y must have the {} rows of x", M);
  const std::string why = skinny_refusal(M, N, K, K, N);
  return why.empty() ? why : tensors + why;
}

SkinnyGemm::Workspace& SkinnyGemm::workspace(DeviceStream& stream, int64_t acc_floats,
                                             int64_t tiles) {
  Workspace& ws = workspaces_[stream.handle()];
  if (ws.acc.numel() < acc_floats || ws.counters.numel() < tiles) {
    // The old slabs may still be in use by a launch on this stream: let it finish first.
    stream.synchronize();
    ws.acc = DeviceTensor(pool_, {std::max(acc_floats, ws.acc.numel())}, kF32);
    ws.counters = DeviceTensor(pool_, {std::max(tiles, ws.counters.numel())}, kI32);
    ws.acc.zero(stream);
    ws.counters.zero(stream);
  }
  return ws;
}

void SkinnyGemm::run(DeviceStream& stream, const DeviceTensor& x, const DeviceTensor& w,
                     const DeviceTensor* bias, DeviceTensor& y) {
  if (std::string why = refusal(x, w, y); !why.empty()) invalid(why);
  run(stream, x, w, bias, y, default_plan(x.numel() / w.dim(1), w.dim(0), w.dim(1)));
}

void SkinnyGemm::run(DeviceStream& stream, const DeviceTensor& x, const DeviceTensor& w,
                     const DeviceTensor* bias, DeviceTensor& y, const SkinnyPlan& plan) {
  if (std::string why = refusal(x, w, y); !why.empty()) invalid(why);
  if (plan.epilogue != SkinnyEpilogue::kNone) invalid(plan.kernel() + " has an epilogue");
  launch_plan(stream, x, w, bias, y, plan);
}

std::string SkinnyGemm::prenorm_refusal(const DeviceTensor& x, int64_t K,
                                        const SkinnyPrenorm* pre) const {
  if (!pre) return {};
  if (std::string why = sums_refusal(pre->ss, pre->ss_tiles, x.device(),
                                     "the folded norm's sums of squares (run_residual's)");
      !why.empty())
    return why;
  if (pre->ss_tiles != skinny_residual_tiles(K))
    return fmt::format(
        "the folded norm's sums of squares cover {} tiles of 64 columns; rows of {} values "
        "have {}",
        pre->ss_tiles, K, skinny_residual_tiles(K));
  return {};
}

std::string SkinnyGemm::silu_refusal(const DeviceTensor& x, const DeviceTensor& w,
                                     const DeviceTensor& y, const SkinnyPrenorm* pre) const {
  if (!wgmma_)
    return fmt::format("the SiluAndMul epilogue is a Hopper (sm_90) kernel; device {} is not one",
                       module_.device());
  if (w.ndim() != 2 || w.dim(0) % 2)
    return fmt::format("w {}: [2 N, K] taken (the gate's rows, then the up's)", w.describe());
  // The refusal of the plain GEMM whose weight is the gate half: y [M, N].
  if (std::string why = refusal(x, w.rows(0, w.dim(0) / 2), y); !why.empty()) return why;
  return prenorm_refusal(x, w.dim(1), pre);
}

void SkinnyGemm::run_silu_and_mul(DeviceStream& stream, const DeviceTensor& x,
                                  const DeviceTensor& w, DeviceTensor& y,
                                  const SkinnyPrenorm* pre) {
  if (std::string why = silu_refusal(x, w, y, pre); !why.empty()) invalid(why);
  const int64_t K = w.dim(1);
  SkinnyPlan plan = skinny_silu_plan(x.numel() / K, w.dim(0) / 2, K, multiprocessors_);
  plan.prenorm = pre != nullptr;
  run_silu_and_mul(stream, x, w, y, plan, pre);
}

void SkinnyGemm::run_silu_and_mul(DeviceStream& stream, const DeviceTensor& x,
                                  const DeviceTensor& w, DeviceTensor& y, const SkinnyPlan& plan,
                                  const SkinnyPrenorm* pre) {
  if (std::string why = silu_refusal(x, w, y, pre); !why.empty()) invalid(why);
  if (plan.epilogue != SkinnyEpilogue::kSiluAndMul)
    invalid(plan.kernel() + " has no SiluAndMul epilogue");
  launch_plan(stream, x, w, nullptr, y, plan, nullptr, nullptr, pre);
}

std::string SkinnyGemm::qk_norm_rope_refusal(const DeviceTensor& x, const DeviceTensor& w,
                                             const DeviceTensor* bias, const DeviceTensor& y,
                                             const SkinnyQkNormRope& e,
                                             const SkinnyPrenorm* pre) const {
  if (!wgmma_)
    return fmt::format(
        "the q/k norm + RoPE epilogue is a Hopper (sm_90) kernel; device {} is "
        "not one",
        module_.device());
  if (std::string why = refusal(x, w, y); !why.empty()) return why;
  const int64_t M = x.numel() / w.dim(1), N = w.dim(0);
  if (e.q_heads < 1 || e.k_heads < 1 || N % kQkHeadDim ||
      N / kQkHeadDim < int64_t{e.q_heads} + e.k_heads)
    return fmt::format("w {}: {} query and {} key heads of {} (then value heads) taken",
                       w.describe(), e.q_heads, e.k_heads, kQkHeadDim);
  if (std::string why = bias_refusal(bias, N, x.device()); !why.empty()) return why;
  auto on_device = [&](const DeviceTensor* t) { return t && t->device() == x.device(); };
  if (!on_device(e.positions) || !same_dtype(e.positions->dtype(), kI64) ||
      e.positions->numel() != M)
    return fmt::format("positions: int64 [{}] on device {} taken", M, x.device());
  for (const DeviceTensor* n : {e.q_norm, e.k_norm})
    if (!on_device(n) || !same_dtype(n->dtype(), kBF16) || n->numel() != kQkHeadDim)
      return fmt::format("q/k norm weights: bfloat16 [{}] on device {} taken", kQkHeadDim,
                         x.device());
  for (const DeviceTensor* t : {e.cos, e.sin})
    if (!on_device(t) || !same_dtype(t->dtype(), kF32) || t->ndim() != 2 ||
        t->dim(1) != kQkHeadDim / 2)
      return fmt::format(
          "cos and sin: float32 [positions, {}] on device {} taken (NeoX pairs "
          "over the whole head)",
          kQkHeadDim / 2, x.device());
  if (e.cos->dim(0) != e.sin->dim(0)) return "cos and sin of different lengths";
  return prenorm_refusal(x, w.dim(1), pre);
}

void SkinnyGemm::run_qk_norm_rope(DeviceStream& stream, const DeviceTensor& x,
                                  const DeviceTensor& w, const DeviceTensor* bias, DeviceTensor& y,
                                  const SkinnyQkNormRope& e, const SkinnyPrenorm* pre) {
  if (std::string why = qk_norm_rope_refusal(x, w, bias, y, e, pre); !why.empty()) invalid(why);
  const int64_t K = w.dim(1);
  SkinnyPlan plan = skinny_qk_norm_rope_plan(x.numel() / K, w.dim(0), K, multiprocessors_);
  plan.prenorm = pre != nullptr;
  run_qk_norm_rope(stream, x, w, bias, y, e, plan, pre);
}

void SkinnyGemm::run_qk_norm_rope(DeviceStream& stream, const DeviceTensor& x,
                                  const DeviceTensor& w, const DeviceTensor* bias, DeviceTensor& y,
                                  const SkinnyQkNormRope& e, const SkinnyPlan& plan,
                                  const SkinnyPrenorm* pre) {
  if (std::string why = qk_norm_rope_refusal(x, w, bias, y, e, pre); !why.empty()) invalid(why);
  if (plan.epilogue != SkinnyEpilogue::kQkNormRope)
    invalid(plan.kernel() + " has no q/k norm + RoPE epilogue");
  launch_plan(stream, x, w, bias, y, plan, &e, nullptr, pre);
}

std::string SkinnyGemm::residual_refusal(const DeviceTensor& x, const DeviceTensor& w,
                                         const DeviceTensor* bias, const DeviceTensor& h,
                                         const DeviceTensor& ss) const {
  if (!wgmma_)
    return fmt::format("the residual epilogue is a Hopper (sm_90) kernel; device {} is not one",
                       module_.device());
  if (std::string why = refusal(x, w, h); !why.empty()) return why;
  const int64_t N = w.dim(0);
  if (std::string why = bias_refusal(bias, N, x.device()); !why.empty()) return why;
  return sums_refusal(&ss, skinny_residual_tiles(N), x.device(), "ss");
}

int SkinnyGemm::run_residual(DeviceStream& stream, const DeviceTensor& x, const DeviceTensor& w,
                             const DeviceTensor* bias, DeviceTensor& h, DeviceTensor& ss) {
  if (std::string why = residual_refusal(x, w, bias, h, ss); !why.empty()) invalid(why);
  const int64_t K = w.dim(1);
  return run_residual(stream, x, w, bias, h, ss,
                      skinny_residual_plan(x.numel() / K, w.dim(0), K, multiprocessors_));
}

int SkinnyGemm::run_residual(DeviceStream& stream, const DeviceTensor& x, const DeviceTensor& w,
                             const DeviceTensor* bias, DeviceTensor& h, DeviceTensor& ss,
                             const SkinnyPlan& plan) {
  if (std::string why = residual_refusal(x, w, bias, h, ss); !why.empty()) invalid(why);
  if (plan.epilogue != SkinnyEpilogue::kResidual || plan.n_tile != 64)
    invalid(plan.kernel() + " has no residual epilogue of 64-column tiles");
  launch_plan(stream, x, w, bias, h, plan, nullptr, &ss);
  return static_cast<int>(skinny_residual_tiles(w.dim(0)));
}

void SkinnyGemm::launch_plan(DeviceStream& stream, const DeviceTensor& x, const DeviceTensor& w,
                             const DeviceTensor* bias, DeviceTensor& y, const SkinnyPlan& plan,
                             const SkinnyQkNormRope* qknr, DeviceTensor* ss,
                             const SkinnyPrenorm* pre) {
  int N = static_cast<int>(y.dim(y.ndim() - 1)), K = static_cast<int>(w.dim(1));
  int M = static_cast<int>(x.numel() / K);
  if (std::string why = skinny_plan_refusal(plan, K); !why.empty()) invalid(why);
  if (plan.wgmma && !wgmma_)
    invalid(fmt::format("{} is a Hopper (sm_90) kernel; device {} is not one", plan.kernel(),
                        module_.device()));
  if (plan.prenorm != (pre != nullptr) ||
      (plan.epilogue == SkinnyEpilogue::kResidual) != (ss != nullptr))
    invalid(plan.kernel() +
            ": the operands of its folded norm or residual epilogue are missing "
            "or not its own");
  if (std::string why = bias_refusal(bias, N, x.device()); !why.empty()) invalid(why);
  const int64_t cols =  // y's, a tile
      plan.epilogue == SkinnyEpilogue::kSiluAndMul ? plan.n_tile / 2 : plan.n_tile;
  const int64_t tiles = (N + cols - 1) / cols;
  void* acc = nullptr;
  void* counters = nullptr;
  if (plan.splits > 1 && !plan.wgmma) {  // the wgmma kernels sum their splits in a cluster
    Workspace& ws = workspace(stream, tiles * kBM * plan.n_tile, tiles);
    acc = ws.acc.data();
    counters = ws.counters.data();
  }
  const void *xp = x.data(), *wp = w.data(), *bp = bias ? bias->data() : nullptr;
  void* yp = y.data();
  long long ldx = K, ldy = N;
  // mma.sync: (..., K, acc, counters); wgmma: (..., K, epi, norm), no workspace.
  void* args[] = {&xp, &ldx, &wp, &bp, &yp, &ldy, &M, &N, &K, &acc, &counters};
  KhSkinnyQkNormRope epi{};
  KhSkinnyNorm norm{};
  if (plan.wgmma) {
    args[9] = &epi;
    args[10] = &norm;
  }
  if (ss) norm.ss = static_cast<float*>(ss->data());
  if (pre) norm = {static_cast<float*>(pre->ss->data()), pre->ss_tiles, pre->eps};
  if (plan.epilogue == SkinnyEpilogue::kQkNormRope) {
    if (!qknr) invalid(plan.kernel() + " without its operands");
    epi = {static_cast<const long long*>(qknr->positions->data()),
           qknr->q_norm->data(),
           qknr->k_norm->data(),
           static_cast<const float*>(qknr->cos->data()),
           static_cast<const float*>(qknr->sin->data()),
           qknr->cos->dim(1),
           qknr->cos->dim(0),
           qknr->q_heads,
           qknr->k_heads,
           qknr->eps};
  }
  kh_launch_cfg_t cfg = launch_cfg(
      module_.device(), {static_cast<uint32_t>(tiles), static_cast<uint32_t>(plan.splits), 1},
      {kThreads, 1, 1}, plan.shared_bytes());
  cfg.flags = KH_LAUNCH_PDL;
  if (plan.wgmma && plan.splits > 1) {
    cfg.cluster[0] = 1;
    cfg.cluster[1] = static_cast<uint32_t>(plan.splits);
    cfg.cluster[2] = 1;
  }
  launch(module_.function(plan.kernel()), cfg, args, stream);
}

std::string SkinnyGemm::head_argmax_refusal(const DeviceTensor& x, const DeviceTensor& w,
                                            const DeviceTensor& y, const SkinnyGreedy& g,
                                            const SkinnyHeadNorm* norm) const {
  if (!wgmma_)
    return fmt::format("the LM head + argmax is a Hopper (sm_90) kernel; device {} is not one",
                       module_.device());
  if (std::string why = refusal(x, w, y); !why.empty()) return why;
  const int64_t N = w.dim(0), K = w.dim(1), M = x.numel() / K;
  if (K > kSkinnyHeadMaxK)
    return fmt::format("w {}: K = {}; x [64, K] must fit in shared memory (K <= {})", w.describe(),
                       K, kSkinnyHeadMaxK);
  if (N >= 0xFFFFFFFFll) return fmt::format("w {}: fewer than 2^32 - 1 rows taken", w.describe());
  const int dev = x.device();
  auto is = [&](const DeviceTensor* t, DLDataType dtype, int64_t numel) {
    return t && t->device() == dev && same_dtype(t->dtype(), dtype) && t->numel() == numel;
  };
  if (!is(g.tokens, kI64, M) || !is(g.positions, kI64, M) || !is(g.seq_lens, kI32, M) ||
      !is(g.step, kI32, 1) || !g.out_tokens || g.out_tokens->device() != dev ||
      !same_dtype(g.out_tokens->dtype(), kI64) || g.out_tokens->ndim() != 2 ||
      g.out_tokens->dim(0) != M || !g.scratch || g.scratch->device() != dev ||
      !same_dtype(g.scratch->dtype(), kI64) || g.scratch->numel() < greedy_scratch_elems(M))
    return fmt::format(
        "the greedy step's state on device {}: int64 tokens and positions [{}], int32 seq_lens "
        "[{}], int64 out_tokens [{}, columns], int32 step [1] and int64 scratch of at least {} "
        "taken",
        dev, M, M, M, greedy_scratch_elems(M));
  if (!norm) return {};
  if (!norm->weight || norm->weight->device() != dev || !same_dtype(norm->weight->dtype(), kBF16) ||
      norm->weight->numel() != K)
    return fmt::format("the final norm's weight ({}): bfloat16 [{}] on device {} taken",
                       norm->weight ? norm->weight->describe() : "none", K, dev);
  return prenorm_refusal(x, K, &norm->sums);
}

void SkinnyGemm::run_head_argmax(DeviceStream& stream, const DeviceTensor& x, const DeviceTensor& w,
                                 DeviceTensor& y, const SkinnyGreedy& g,
                                 const SkinnyHeadNorm* norm) {
  if (std::string why = head_argmax_refusal(x, w, y, g, norm); !why.empty()) invalid(why);
  int N = static_cast<int>(w.dim(0)), K = static_cast<int>(w.dim(1));
  int M = static_cast<int>(x.numel() / K);
  const void *xp = x.data(), *wp = w.data();
  void* yp = y.data();
  KhSkinnyNorm nf{};
  if (norm) nf = {static_cast<float*>(norm->sums.ss->data()), norm->sums.ss_tiles, norm->sums.eps};
  KhSkinnyGreedy greedy{static_cast<long long*>(g.tokens->data()),
                        static_cast<long long*>(g.positions->data()),
                        static_cast<int*>(g.seq_lens->data()),
                        static_cast<long long*>(g.out_tokens->data()),
                        static_cast<int*>(g.step->data()),
                        static_cast<unsigned long long*>(g.scratch->data()),
                        norm ? norm->weight->data() : nullptr,
                        static_cast<int>(g.out_tokens->dim(1))};
  void* args[] = {&xp, &wp, &yp, &M, &N, &K, &nf, &greedy};
  // x's tiles, the stages, the rows' rstd and the last-CTA flag (skinny_gemm.cu).
  const auto shared = static_cast<uint32_t>(
      K / kBK * kBM * kBK * 2 + kSkinnyHeadStages * kSkinnyHeadTile * kBK * 2 + kBM * 4 + 16);
  const int64_t tiles = (N + kSkinnyHeadTile - 1) / kSkinnyHeadTile;
  kh_launch_cfg_t cfg = launch_cfg(
      module_.device(),
      {static_cast<uint32_t>(std::min<int64_t>(tiles, std::max(1, multiprocessors_))), 1, 1},
      {kThreads, 1, 1}, shared);
  cfg.flags = KH_LAUNCH_PDL;
  launch(module_.function(head_kernel(norm != nullptr)), cfg, args, stream);
}

}  // namespace kh::demo
