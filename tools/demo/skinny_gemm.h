// The GPU-resident runtime's GEMM for a few rows (skinny_gemm.cu): y[M, N] = x[M, K] . W[N, K]^T
// (+ bias) in bfloat16 with fp32 accumulation, for M <= 64 rows — a decode step's projections
// and LM head. cuBLASLt's kernels take 4-7 us for the 4-13 MB weights of a Qwen3-0.6B decode
// layer at M = 64 (0.5-2.3 TB/s: too few CTAs for N = 1024 and nothing that overlaps the
// previous kernel); this one splits K over enough CTAs to keep the weights streaming and starts
// loading them while the previous kernel finishes (programmatic dependent launch). Two kernel
// families: mma.sync (any GPU the runtime supports) and, on Hopper, wgmma with the splits of K
// summed in a thread block cluster.
//
// The plans (tile width, stages, splits of K) are pure functions, tested on the CPU; the kernels
// are compiled at run time through the device API (NVRTC, JIT cached) like the runtime's others.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kernel_hub/kernel_hub.hpp"
#include "tools/demo/device_tensor.h"

namespace kh::demo {

inline constexpr int64_t kSkinnyMaxRows = 64;

// What a wgmma plan does to the sums before it writes them: nothing; SiluAndMul of a gate/up
// weight's column pairs (64-column tiles); Qwen3's q/k norms and RoPE of 128-wide heads (128-column
// tiles, a head each); add them into the residual stream and write its rows' sums of squares for
// the next GEMM's folded norm (64-column tiles: SkinnyGemm::run_residual).
enum class SkinnyEpilogue : uint8_t { kNone, kSiluAndMul, kQkNormRope, kResidual };

struct SkinnyPlan {
  int n_tile = 64;     // output columns a CTA owns: 32 or 64 (mma.sync), 64 or 128 (wgmma)
  int stages = 4;      // shared-memory stages of 64 k-values: 3, 4 or 6 (n_tile 32: 4 or 6;
                       // wgmma: 4 or 6)
  int splits = 1;      // CTAs that share one tile's K (1 .. K / 64; wgmma: a cluster, <= 8)
  bool wgmma = false;  // the Hopper kernels (sm_90a code: compute capability 9.x)
  SkinnyEpilogue epilogue = SkinnyEpilogue::kNone;  // wgmma only
  bool prenorm = false;  // a folded norm of x (SkinnyPrenorm; wgmma SiluAndMul and q/k norm)
  // The kernel's name and its dynamic shared memory.
  std::string kernel() const;
  uint32_t shared_bytes() const;
  bool operator==(const SkinnyPlan&) const = default;
};

// The default plan for M x N x K: 64-column tiles, 4 stages, and K split so that the grid has
// about kSkinnyTargetCtas CTAs with at least kSkinnyMinSplitK k-values each (fewer values per
// split would make the fp32 reductions of the partial tiles weigh as much as the weights).
inline constexpr int64_t kSkinnyTargetCtas = 256;
inline constexpr int64_t kSkinnyMinSplitK = 512;
SkinnyPlan skinny_plan(int64_t M, int64_t N, int64_t K);

// The default wgmma plan on a GPU of `multiprocessors` SMs: 64-column tiles of 4 stages (64 KiB:
// three CTAs an SM, so the next kernel's CTAs fit beside this one's under programmatic dependent
// launch), K split so that the grid has about two CTAs an SM (<= 8 splits, the cluster limit; at
// least kSkinnyMinWgmmaSplitK k-values each). The H200 sweep (tools/bench/RESULTS.md): 128-column
// or 6-stage tiles lose up to 2x at 64 rows, since one CTA an SM leaves no room for the next
// kernel to start.
inline constexpr int64_t kSkinnyMaxClusterSplits = 8;
inline constexpr int64_t kSkinnyMinWgmmaSplitK = 128;
SkinnyPlan skinny_wgmma_plan(int64_t M, int64_t N, int64_t K, int multiprocessors);

// Whether the skinny GEMM should take M x N x K from cuBLASLt (DecodeGemm::kAuto): on Hopper
// (wgmma), for weights wider than tall with at most kSkinnyPreferredMaxN rows (N < K, N <= 2048:
// Qwen3-0.6B's o and down projections, 1.2-2.5x at 1-64 rows on an H200), where cuBLASLt's few
// output tiles leave most SMs idle and the cluster split fills them. From N = 2880 up the skinny
// GEMM wins little or loses (gpt-oss's o: 1.07x at one row, 0.87x at 64; Llama-3-8B's down:
// 0.83-1.00x; tools/bench/RESULTS.md).
inline constexpr int64_t kSkinnyPreferredMaxN = 2048;
bool skinny_preferred(int64_t M, int64_t N, int64_t K, bool wgmma);

// Whether the kernels take y[M, N] = x[M, K] . W^T with these shapes and leading dimensions
// (elements): 1 <= M <= 64, K a multiple of 64, N a multiple of 8, ldx and ldy multiples of 8
// (16-byte rows). Empty when they do, else why not (for messages).
std::string skinny_refusal(int64_t M, int64_t N, int64_t K, int64_t ldx, int64_t ldy);
// Whether `plan` is one of the compiled variants and splits K = `K` at most K / 64 ways (a wgmma
// plan at most kSkinnyMaxClusterSplits); empty when it does.
std::string skinny_plan_refusal(const SkinnyPlan& plan, int64_t K);

// The gate/up projection with SiluAndMul as its epilogue (SkinnyGemm::run_silu_and_mul): the
// wgmma plan of the [2 N, K] weight (64-row tiles of 32 gate and 32 up rows), with the epilogue.
SkinnyPlan skinny_silu_plan(int64_t M, int64_t N, int64_t K, int multiprocessors);
// The q/k/v projection with the q/k norms and RoPE (SkinnyGemm::run_qk_norm_rope): a head per
// CTA (128 columns, 3 stages: 72 KiB, three CTAs an SM) and K split to about two CTAs an SM.
SkinnyPlan skinny_qk_norm_rope_plan(int64_t M, int64_t N, int64_t K, int multiprocessors);

// The residual add of the o and down projections (SkinnyGemm::run_residual): the default wgmma
// plan's tiles and splits, with the epilogue.
SkinnyPlan skinny_residual_plan(int64_t M, int64_t N, int64_t K, int multiprocessors);
// Its 64-column tiles of N (the sums-of-squares partials it leaves: SkinnyPrenorm::ss_tiles).
inline int64_t skinny_residual_tiles(int64_t N) {
  return (N + 63) / 64;
}

// The source NVRTC compiles and its compiled variants (tile width, stages and kernel family;
// splits 1). The wgmma variants exist only in sm_90a code. skinny_epilogue_variants(): those with
// an epilogue (wgmma), with the folded norm or without.
const char* skinny_gemm_source();
std::vector<SkinnyPlan> skinny_variants();
std::vector<SkinnyPlan> skinny_epilogue_variants(SkinnyEpilogue epilogue, bool prenorm = false);

// The operands of the q/k norms and RoPE epilogue (the QKNormRotaryEmbedding slot's): int64
// positions [M], bf16 q_norm and k_norm weights [128], eps, fp32 cos and sin [max_pos, 64] (NeoX
// pairs over the whole head), the heads of y's row: q_heads query, then k_heads key, then value
// heads (left as projected).
inline constexpr int64_t kQkHeadDim = 128;  // the q/k norm + RoPE epilogue's head (a tile)
struct SkinnyQkNormRope {
  const DeviceTensor* positions = nullptr;
  const DeviceTensor* q_norm = nullptr;
  const DeviceTensor* k_norm = nullptr;
  float eps = 1e-6f;
  const DeviceTensor* cos = nullptr;
  const DeviceTensor* sin = nullptr;
  int q_heads = 0, k_heads = 0;
};

// A residual add + RMSNorm folded into the GEMMs around it (the decode step's norms between
// projections): run_residual() adds its product into the residual stream h in place and leaves
// the new rows' sums of squares, a partial per 64-column tile, in `ss` (fp32, at least
// kSkinnyMaxRows a tile); the next GEMM, given this SkinnyPrenorm, reads the raw h as its x and
// scales row m of its sums by rstd[m] = rsqrt(sum of the ss_tiles partials / K + eps). Its
// weight must carry the norm's weight: RMSNorm(h) . W^T = rstd * (h . (W diag(norm weight))^T)
// (DeviceKernels::scale_columns folds it). The norm's bf16 rounding of its output is the one
// step of the unfolded norm it leaves out; W diag(w) is rounded to bf16 instead.
struct SkinnyPrenorm {
  const DeviceTensor* ss = nullptr;
  int ss_tiles = 0;
  float eps = 1e-6f;
};

// The LM head of a greedy decode step with the argmax as its epilogue (SkinnyGemm::run_head_argmax):
// persistent CTAs, one an SM, each holding x [64, K] in shared memory beside kSkinnyHeadStages
// stages of 128 x 64 weights, so K is at most kSkinnyHeadMaxK.
inline constexpr int kSkinnyHeadStages = 6;
inline constexpr int64_t kSkinnyHeadTile = 128;  // vocabulary columns a tile (skinny_gemm.cu's BN)
inline constexpr int64_t kSkinnyHeadMaxK = 1024;
// Its scratch, and the greedy argmax kernel's (DecodeKernels::argmax_scratch_elems): int64, a key
// per row, then counters; zero between launches (each launch leaves it so).
inline int64_t greedy_scratch_elems(int64_t rows) {
  return 2 * rows + 1;
}
// The decode state the greedy step advances (DecodeKernels::argmax_advance's operands): int64
// tokens [M] (the next step's input), int64 positions [M] and int32 seq_lens [M] (+ 1), int64
// out_tokens [M, cols] (column *step gets the token while step < cols), int32 step [1] (+ 1),
// and the scratch.
struct SkinnyGreedy {
  DeviceTensor* tokens = nullptr;
  DeviceTensor* positions = nullptr;
  DeviceTensor* seq_lens = nullptr;
  DeviceTensor* out_tokens = nullptr;
  DeviceTensor* step = nullptr;
  DeviceTensor* scratch = nullptr;
};
// The final RMSNorm before the LM head, folded into it: x is the raw residual stream, `sums` the
// residual epilogue's sums of squares (SkinnyPrenorm), `weight` the norm's bf16 weight [K].
struct SkinnyHeadNorm {
  SkinnyPrenorm sums;
  const DeviceTensor* weight = nullptr;
};

class SkinnyGemm {
 public:
  // Compiles (or finds in the JIT cache) the kernels for `device`; the split-K workspace comes
  // from `pool`, per stream (GEMMs on two streams may run at once).
  SkinnyGemm(int device, DevicePool& pool);

  // Whether this GPU runs the wgmma variants (compute capability 9.x) and the default plans use
  // them; its multiprocessors (the wgmma plan's wave).
  bool has_wgmma() const { return wgmma_; }
  int multiprocessors() const { return multiprocessors_; }
  // The plan run() without one uses.
  SkinnyPlan default_plan(int64_t M, int64_t N, int64_t K) const;

  // Whether run() takes these tensors: bf16 x [.., K] (rows M = numel / K), w [N, K], y [.., N]
  // with M rows, all contiguous on this device, and skinny_refusal() empty. refusal() says why
  // not (empty when it does).
  bool fits(const DeviceTensor& x, const DeviceTensor& w, const DeviceTensor& y) const {
    return refusal(x, w, y).empty();
  }
  std::string refusal(const DeviceTensor& x, const DeviceTensor& w, const DeviceTensor& y) const;

  // y = x . w^T (+ bias [N], bf16), ordered on `stream`, launched with PDL. Throws kh::Error
  // kInvalidInput when !fits() or the plan does not fit (a wgmma plan on a GPU without them).
  // An mma.sync split plan allocates the stream's workspace the first time it needs more than
  // there is: run once outside a CUDA-graph capture first. (wgmma plans need none.)
  void run(DeviceStream& stream, const DeviceTensor& x, const DeviceTensor& w,
           const DeviceTensor* bias, DeviceTensor& y);
  void run(DeviceStream& stream, const DeviceTensor& x, const DeviceTensor& w,
           const DeviceTensor* bias, DeviceTensor& y, const SkinnyPlan& plan);

  // y [M, N] = silu(x . W_gate^T) * (x . W_up^T) for w [2 N, K] holding W_gate's N rows then
  // W_up's (the runtime's fused gate/up weight): the decode MLP's gate/up GEMM and SiluAndMul in
  // one launch, the activation taken from the fp32 sums. Hopper only (has_wgmma()); otherwise,
  // or when the shapes do not fit, silu_refusal() says why and run_silu_and_mul() throws
  // kInvalidInput.
  // `pre`: x is a residual stream and w carries the folded norm's weight (SkinnyPrenorm).
  std::string silu_refusal(const DeviceTensor& x, const DeviceTensor& w, const DeviceTensor& y,
                           const SkinnyPrenorm* pre = nullptr) const;
  void run_silu_and_mul(DeviceStream& stream, const DeviceTensor& x, const DeviceTensor& w,
                        DeviceTensor& y, const SkinnyPrenorm* pre = nullptr);
  void run_silu_and_mul(DeviceStream& stream, const DeviceTensor& x, const DeviceTensor& w,
                        DeviceTensor& y, const SkinnyPlan& plan,
                        const SkinnyPrenorm* pre = nullptr);

  // y [M, N] = x . w^T (+ bias) with every query and key head of the row (128 wide: q_heads,
  // then k_heads, then the value heads) RMS-normed and rotated as QKNormRotaryEmbedding does to
  // the bf16 row: Qwen3's q/k/v projection and its q/k norms + RoPE in one launch. Hopper only;
  // qk_norm_rope_refusal() says why not (empty when it takes them).
  std::string qk_norm_rope_refusal(const DeviceTensor& x, const DeviceTensor& w,
                                   const DeviceTensor* bias, const DeviceTensor& y,
                                   const SkinnyQkNormRope& e,
                                   const SkinnyPrenorm* pre = nullptr) const;
  void run_qk_norm_rope(DeviceStream& stream, const DeviceTensor& x, const DeviceTensor& w,
                        const DeviceTensor* bias, DeviceTensor& y, const SkinnyQkNormRope& e,
                        const SkinnyPrenorm* pre = nullptr);
  void run_qk_norm_rope(DeviceStream& stream, const DeviceTensor& x, const DeviceTensor& w,
                        const DeviceTensor* bias, DeviceTensor& y, const SkinnyQkNormRope& e,
                        const SkinnyPlan& plan, const SkinnyPrenorm* pre = nullptr);

  // h [M, N] += bf16(x . w^T (+ bias)) in place (bf16, as FusedAddRMSNorm's residual add rounds),
  // and the new rows' sums of squares over each 64-column tile into ss [tiles, kSkinnyMaxRows]
  // (fp32): the producer half of a folded norm. Returns the tiles (SkinnyPrenorm::ss_tiles).
  // Hopper only; residual_refusal() says why not.
  std::string residual_refusal(const DeviceTensor& x, const DeviceTensor& w,
                               const DeviceTensor* bias, const DeviceTensor& h,
                               const DeviceTensor& ss) const;
  int run_residual(DeviceStream& stream, const DeviceTensor& x, const DeviceTensor& w,
                   const DeviceTensor* bias, DeviceTensor& h, DeviceTensor& ss);
  int run_residual(DeviceStream& stream, const DeviceTensor& x, const DeviceTensor& w,
                   const DeviceTensor* bias, DeviceTensor& h, DeviceTensor& ss,
                   const SkinnyPlan& plan);

  // y [M, N] = x . w^T (bf16 logits) and each row's first index of its largest logit, which
  // ends the decode step as DecodeKernels::argmax_advance does (SkinnyGreedy): a greedy step's
  // LM head and argmax in one launch; with `norm`, the final RMSNorm too (x is then the raw
  // residual). Hopper only, K <= kSkinnyHeadMaxK; head_argmax_refusal() says why not.
  std::string head_argmax_refusal(const DeviceTensor& x, const DeviceTensor& w,
                                  const DeviceTensor& y, const SkinnyGreedy& g,
                                  const SkinnyHeadNorm* norm = nullptr) const;
  void run_head_argmax(DeviceStream& stream, const DeviceTensor& x, const DeviceTensor& w,
                       DeviceTensor& y, const SkinnyGreedy& g,
                       const SkinnyHeadNorm* norm = nullptr);

 private:
  // The checked launch of `plan` for y [M, N] (N: y's columns) from x [M, K]; `qknr`: the
  // kQkNormRope epilogue's operands; `ss`: kResidual's sums of squares; `pre`: the prologue
  // norm's.
  void launch_plan(DeviceStream& stream, const DeviceTensor& x, const DeviceTensor& w,
                   const DeviceTensor* bias, DeviceTensor& y, const SkinnyPlan& plan,
                   const SkinnyQkNormRope* qknr = nullptr, DeviceTensor* ss = nullptr,
                   const SkinnyPrenorm* pre = nullptr);
  // Why `pre` does not fit x (rows M, width K) and `plan`; empty when it does.
  std::string prenorm_refusal(const DeviceTensor& x, int64_t K, const SkinnyPrenorm* pre) const;
  struct Workspace {
    DeviceTensor acc;       // fp32 [tiles, 64, n_tile] slabs, zero between calls
    DeviceTensor counters;  // int32 [tiles], zero between calls
  };
  Workspace& workspace(DeviceStream& stream, int64_t acc_floats, int64_t tiles);

  DeviceModule module_;
  DevicePool& pool_;
  bool wgmma_ = false;
  int multiprocessors_ = 0;
  std::map<const void*, Workspace> workspaces_;  // by stream handle
};

}  // namespace kh::demo
