// The GPU-resident runtime's model, first step: eval prefill of the demo's Llama / Qwen2 / Qwen3
// decoder with its weights and activations on one CUDA device (fp32, so that the logits match
// the host model's; bf16 weights with fp32 master copies come with training), every op ordered
// on one stream, nothing staged through the host.
//
// Each slot (RMSNorm, RotaryEmbedding, SiluAndMul, Attention, CrossEntropy) runs what the
// runtime's table holds for the device: a package kernel bound there gets device DLTensors and
// the stream (the same argument lists as the host model's calls), the runtime's fallback runs
// as its device kernel (device_kernels.h). The embedding, the linear layers (kh::gemm) and the
// residual adds are the runtime's own. gate_proj and up_proj are stored as one [2 * ffn, hidden]
// weight, so one GEMM writes the [gate | up] rows SiluAndMul takes.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernel_hub/kernel_hub.hpp"
#include "tools/demo/device_kernels.h"
#include "tools/demo/device_tensor.h"
#include "tools/demo/fallback_ops.h"
#include "tools/demo/model.h"
#include "tools/demo/model_config.h"

namespace kh::demo {

class DeviceCausalLM {
 public:
  // Copies `host`'s weights to CUDA device `device` and compiles the device kernels (JIT
  // cached). The runtime's table decides, per slot, package or fallback at each call.
  DeviceCausalLM(const CausalLM& host, const DemoSlots& slots, const Runtime& runtime, int device);

  // batch sequences of len tokens (host arrays). With targets, the mean cross-entropy; without,
  // 0. The logits [batch * len, vocab] stay on the device (logits()).
  float prefill(const int64_t* tokens, const int64_t* targets, int batch, int len);

  const DeviceTensor& logits() const { return logits_; }
  std::vector<float> download_logits();
  // Peak and current device memory of the model's pool (weights and activations).
  kh_device_pool_stats_t memory() const { return pool_.stats(); }
  // The slots a package served in the last prefill ("RMSNorm", ...); the others ran the
  // runtime's device kernels.
  const std::vector<std::string>& package_slots() const { return package_slots_; }
  DeviceStream& stream() { return stream_; }

 private:
  struct Layer {
    const DeviceTensor *attn_norm, *wq, *wk, *wv, *bq, *bk, *bv, *q_norm, *k_norm, *wo, *bo,
        *mlp_norm, *wdown;
    DeviceTensor gate_up;  // [2 * ffn, hidden]: gate_proj rows, then up_proj rows
  };

  const DeviceTensor& weight(const std::string& name) const;
  const DeviceTensor* optional_weight(const std::string& name) const;
  bool bound(uint32_t slot) const;
  void call_slot(uint32_t slot, const char* name, const std::vector<kh_arg_t>& args);
  DeviceTensor empty(std::vector<int64_t> shape, DLDataType dtype = kF32);
  void linear(const DeviceTensor& x, const DeviceTensor& w, const DeviceTensor* bias,
              DeviceTensor& y);
  void norm(const DeviceTensor& x, const DeviceTensor& w, DeviceTensor& y);
  void layer(const Layer& L, DeviceTensor& h, const DeviceTensor& positions, int batch, int len);

  ModelConfig cfg_;
  DemoSlots slots_;
  const Runtime& runtime_;
  int device_;
  DevicePool pool_;
  DeviceStream stream_;
  DeviceKernels kernels_;
  std::map<std::string, DeviceTensor> weights_;
  std::vector<Layer> layers_;
  const DeviceTensor* head_ = nullptr;
  DeviceTensor cos_, sin_;
  DeviceTensor logits_;
  std::vector<std::string> package_slots_;
};

}  // namespace kh::demo
