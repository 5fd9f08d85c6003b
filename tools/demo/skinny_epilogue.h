// The operands of the skinny GEMM's q/k norm + RoPE epilogue as its kernels take them (the last
// parameter of kh_skinny_wgmma_qknr_*): one definition for skinny_gemm.cu, which the build inlines
// into the device source, and skinny_gemm.cpp, which fills it. Plain C++ (NVRTC compiles it too):
// no CUDA or system types.
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

#endif  // KH_DEMO_SKINNY_EPILOGUE_H_
