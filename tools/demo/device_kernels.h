// The GPU-resident runtime's own device kernels (device_kernels.cu): compiled once per device at
// run time through the device API (kh::DeviceModule: the loader's NVRTC, JIT cached), then
// launched on the caller's stream by typed wrappers that check shapes and dtypes (kh::Error
// kInvalidInput naming the op and the tensor) before anything reaches the device.
//
// Tensors are DeviceTensors of the module's device, float32 or bfloat16 (the same dtype for
// the activations of one call), row-major. The fallbacks compute what the host fallbacks
// (fallback_ops.cpp, layers.cpp) compute, in fp32 arithmetic; the GPU tests compare them.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "kernel_hub/kernel_hub.hpp"
#include "tools/demo/adamw_table.h"
#include "tools/demo/device_tensor.h"
#include "tools/demo/model.h"

namespace kh::demo {

// The source NVRTC compiles (the prelude inlined), carried in the binary.
const char* device_kernels_source();
// The extern "C" names of its entry points, for tests and lookups.
std::vector<std::string> device_kernel_names();

class DeviceKernels {
 public:
  // Compiles (or finds in the JIT cache) the source for `device` and looks up every kernel.
  explicit DeviceKernels(int device);

  int device() const { return module_.device(); }

  // out[r] = table[tokens[r]] (zeros for a token outside the table); table [vocab, dim], tokens
  // int64 [rows], out [rows, dim].
  void embedding_forward(DeviceStream& s, const DeviceTensor& table, const DeviceTensor& tokens,
                         DeviceTensor& out);
  // dtable (float32 [vocab, dim]) += scatter of dh [rows, dim] by tokens (fp32 atomics).
  void embedding_backward(DeviceStream& s, const DeviceTensor& tokens, const DeviceTensor& dh,
                          DeviceTensor& dtable);
  // out = a + b (out may be a or b).
  void add(DeviceStream& s, const DeviceTensor& a, const DeviceTensor& b, DeviceTensor& out);
  // dst[r, dst_col + c] = src[r, src_col + c] for c < cols (src and dst: rows x their last
  // dimension, one dtype): a column block between matrices of different widths.
  void copy_columns(DeviceStream& s, const DeviceTensor& src, int64_t src_col, DeviceTensor& dst,
                    int64_t dst_col, int64_t cols);
  // y[r, c] += bias[c] (bias [cols], y's dtype).
  void bias_add(DeviceStream& s, DeviceTensor& y, const DeviceTensor& bias);
  // out [rows, cols] = x * scale[c] column by column (scale [cols], x's dtype; rounded once): a
  // norm's weight folded into the projection after it (SkinnyPrenorm).
  void scale_columns(DeviceStream& s, const DeviceTensor& x, const DeviceTensor& scale,
                     DeviceTensor& out);
  // db (float32 [cols]) += the column sums of dy [rows, cols] (a bias gradient).
  void column_sum_add(DeviceStream& s, const DeviceTensor& dy, DeviceTensor& db);
  // bfloat16 <-> float32 (round to nearest even).
  void cast(DeviceStream& s, const DeviceTensor& in, DeviceTensor& out);
  // Every entry of `table` (device memory: `entries` KhGradAdd, adamw_table.h), one launch: dst
  // (float32) += float(src) (bfloat16), what a cast and an add give, or dst = float(src).
  void grad_add_multi(DeviceStream& s, const DeviceTensor& table, size_t entries);
  // w (float32) = normal(0, stddev) draws that depend on seed and the element index only.
  void init_normal(DeviceStream& s, DeviceTensor& w, uint64_t seed, float stddev);
  // w (float32) = value everywhere.
  void fill(DeviceStream& s, DeviceTensor& w, float value);
  // The device memory's read bandwidth (bytes/s) as a plain streaming kernel reaches it: the
  // best of 3 passes of 16-byte loads over `bytes` of `pool` (the ceiling a memory-bound step is
  // measured against, in the same run; METHOD: measure the ceilings, do not take the datasheet's).
  double read_bandwidth(DeviceStream& s, DevicePool& pool, int64_t bytes);

  // RMSNorm over the last dimension; rstd (float32 [rows]) may be null (eval).
  void rms_norm(DeviceStream& s, const DeviceTensor& x, const DeviceTensor& weight, float eps,
                DeviceTensor& y, DeviceTensor* rstd);
  // dx, and dweight (float32 [cols], overwritten).
  void rms_norm_backward(DeviceStream& s, const DeviceTensor& dy, const DeviceTensor& x,
                         const DeviceTensor& weight, const DeviceTensor& rstd, DeviceTensor& dx,
                         DeviceTensor& dweight);
  // y [rows, d] = silu(x[:, :d]) * x[:, d:], x [rows, 2d].
  void silu_and_mul(DeviceStream& s, const DeviceTensor& x, DeviceTensor& y);
  void silu_and_mul_backward(DeviceStream& s, const DeviceTensor& dy, const DeviceTensor& x,
                             DeviceTensor& dx);
  // In place on q [tokens, heads, head_dim] and k (may be null); cos/sin float32 [max_pos, half];
  // positions int64 [tokens]; backward applies the inverse rotation.
  void rotary(DeviceStream& s, const DeviceTensor& positions, DeviceTensor& q, DeviceTensor* k,
              const DeviceTensor& cos, const DeviceTensor& sin, bool neox, bool backward);
  // Causal attention, padded: q/out [batch, len, heads, head_dim], k/v [batch, len, kv_heads,
  // head_dim]; lse float32 [heads, batch * len] (may be null in eval).
  void attention_forward(DeviceStream& s, const DeviceTensor& q, const DeviceTensor& k,
                         const DeviceTensor& v, float scale, DeviceTensor& out, DeviceTensor* lse);
  // dq (q's dtype); dk and dv float32 (accumulated with atomics: zeroed here first).
  void attention_backward(DeviceStream& s, const DeviceTensor& dout, const DeviceTensor& q,
                          const DeviceTensor& k, const DeviceTensor& v, const DeviceTensor& out,
                          const DeviceTensor& lse, float scale, DeviceTensor& dq, DeviceTensor& dk,
                          DeviceTensor& dv);
  // loss float32 [rows] per row; with dlogits (logits' shape and dtype, may be logits itself):
  // (softmax - onehot) * grad_scale, zero rows for ignore_index.
  void cross_entropy(DeviceStream& s, const DeviceTensor& logits, const DeviceTensor& targets,
                     int64_t ignore_index, float grad_scale, DeviceTensor& loss,
                     DeviceTensor* dlogits);
  // dlogits[r] *= dloss[r] in place (dloss float32 [rows]).
  void cross_entropy_backward(DeviceStream& s, const DeviceTensor& dloss, DeviceTensor& dlogits);
  // One AdamW step (`step` = t, from 1) on fp32 master weights w with gradients g and moments
  // m, v (all float32, one shape); w_bf16 (may be null) receives the new weights in bfloat16.
  void adamw(DeviceStream& s, DeviceTensor& w, const DeviceTensor& g, DeviceTensor& m,
             DeviceTensor& v, DeviceTensor* w_bf16, const AdamConfig& config, int64_t step);
  // The same step over many parameters in one launch (kh_adamw_multi_f32): adamw_table checks
  // each as adamw does and gives the launch's table; adamw_multi runs it from `table`, that
  // table's copy in device memory (bytes: entries x sizeof(KhAdamwTensor)), which the caller
  // uploads once and keeps while the parameters' buffers stay the same.
  struct AdamwParam {
    DeviceTensor* w;
    const DeviceTensor* g;
    DeviceTensor* m;
    DeviceTensor* v;
    DeviceTensor* w_bf16;  // may be null
  };
  static std::vector<KhAdamwTensor> adamw_table(const std::vector<AdamwParam>& params);
  void adamw_multi(DeviceStream& s, const DeviceTensor& table,
                   const std::vector<KhAdamwTensor>& entries, const AdamConfig& config,
                   int64_t step);

 private:
  kh_device_function_t* fn(const std::string& name) const;
  kh_device_function_t* typed(const std::string& base, const DeviceTensor& t) const;
  void launch(DeviceStream& s, kh_device_function_t* f, uint32_t grid_x, uint32_t grid_y,
              uint32_t grid_z, uint32_t shared_bytes, std::vector<void*> args);

  DeviceModule module_;
  std::map<std::string, kh_device_function_t*> functions_;
};

}  // namespace kh::demo
