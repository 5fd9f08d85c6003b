// The operands of the skinny GEMM's epilogues and folded norm as its wgmma kernels take them (their
// last two parameters): one definition for skinny_gemm.cu, which the build inlines into the device
// source, and skinny_gemm.cpp, which fills them. Plain C++ (NVRTC compiles it too): no CUDA or
// system types.
#ifndef KH_DEMO_SKINNY_EPILOGUE_H_
#define KH_DEMO_SKINNY_EPILOGUE_H_

// Qwen3's q/k RMSNorms (bf16 weights qw, kw [128]) and NeoX RoPE of the whole 128-wide head at
// positions[m], from the cos/sin rows [max_pos, 64] (row stride rot_stride floats).
struct KhSkinnyQkNormRope {
  const long long* positions;
  const void* qw;
  const void* kw;
  const float* cos;
  const float* sin;
  long long rot_stride, max_pos;
  int q_heads, k_heads;
  float eps;
};

// A residual add + RMSNorm between two projections, folded into them. The producer's residual
// epilogue (kh_skinny_wgmma_res_*) adds its bf16 output into the residual y in place and writes
// each row's sum of squares of the new residual over its tile's columns to ss[tile * 64 + row];
// the consumer (the _pn_ kernels) reads that residual as x, its weights carry the norm's weight,
// and it scales row m of its sums by rsqrt(sum of row m's ss_tiles partials / K + eps).
struct KhSkinnyNorm {
  float* ss;
  int ss_tiles;
  float eps;
};

// The greedy decode step that the LM head's argmax epilogue ends (kh_skinny_head_argmax_*), as
// kh_argmax_advance takes it: each row's token goes to tokens[m] (the next step's input) and to
// out_tokens[m * out_cols + *step] (when *step < out_cols), positions[m] and seq_lens[m] advance,
// then *step; scratch is that kernel's too (a key per row, then counters; zero between launches).
// norm_w: the final RMSNorm's bf16 weight [K] (the _norm kernel, whose x is the raw residual),
// else null.
struct KhSkinnyGreedy {
  long long* tokens;
  long long* positions;
  int* seq_lens;
  long long* out_tokens;
  int* step;
  unsigned long long* scratch;
  const void* norm_w;
  int out_cols;
};

#endif  // KH_DEMO_SKINNY_EPILOGUE_H_
