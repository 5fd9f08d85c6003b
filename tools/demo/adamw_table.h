// The multi-tensor AdamW's table (kh_adamw_multi_f32 in device_kernels.cu, filled by
// DeviceKernels::adamw_table), and the deferred gradient adds' (kh_grad_add_multi): one definition for the device source, which the build inlines, and
// the host. Plain C++ (NVRTC compiles it too): no CUDA or system types; every member 8 bytes, so
// both compilers lay it out alike.
#ifndef KH_DEMO_ADAMW_TABLE_H_
#define KH_DEMO_ADAMW_TABLE_H_

// Elements one CTA of the multi-tensor AdamW updates: 256 threads x 4 elements x 4 turns.
#define KH_ADAMW_CHUNK 4096

// One parameter: its fp32 master weights, gradient and moments (n elements each), the bf16 copy
// the model runs on (may be null), and the first CTA of the launch that updates it (tensor i
// takes CTAs [first_block, next tensor's first_block), KH_ADAMW_CHUNK elements each).
struct KhAdamwTensor {
  float* w;
  const float* g;
  float* m;
  float* v;
  void* w_bf16;
  long long n;
  long long first_block;
};

// One deferred gradient add of kh_grad_add_multi (DeviceCausalLM::flush_grads): dst (fp32, n
// elements) = float(src) (overwrite: the gradient was zero in value) or += float(src) (bf16).
struct KhGradAdd {
  float* dst;
  const void* src;
  long long n;
  long long overwrite;
};

#endif  // KH_DEMO_ADAMW_TABLE_H_
