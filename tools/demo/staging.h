// Calls a layer slot of a kh::Runtime with host tensors, wherever the slot's kernel runs.
//
// The demo keeps all model state (parameters, activations, gradients) in host memory. On the
// cpu, or for a slot whose entry for the CUDA device is the runtime fallback, the call gets the
// host tensors directly. For a slot bound to a CUDA kernel, the call is STAGED: each tensor
// argument gets a device buffer (one per slot, direction and argument position, allocated on
// first use, grown when needed, then reused), inputs are copied in, the op runs on the legacy
// default stream, that stream is synchronized and the tensors the op writes are copied back. This
// is a demo simplification, not how a real runtime would use GPU kernels (it would keep its tensors
// on the device); it shows that the same slot table serves host and device with the same argument
// lists. Device memory, copies and the stream come from the embedding API's device API
// (kernel_hub.hpp: DevicePool, DeviceStream, on the driver kernel-hub loads lazily), so this
// builds and runs on machines without CUDA.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <tuple>

#include "kernel_hub/kernel_hub.hpp"
#include "tools/demo/op_args.h"

namespace kh::demo {

struct StagingStats {
  uint64_t staged_calls = 0;  // calls that ran on the device
  uint64_t host_calls = 0;    // calls that ran on host tensors
  uint64_t bytes_to_device = 0;
  uint64_t bytes_to_host = 0;
  uint64_t device_bytes = 0;  // device memory held by the staging buffers
};

class SlotCaller {
 public:
  // cuda_ordinal < 0: every call gets host tensors (kCpuDevice).
  SlotCaller(const Runtime& runtime, int cuda_ordinal);
  ~SlotCaller();
  SlotCaller(const SlotCaller&) = delete;
  SlotCaller& operator=(const SlotCaller&) = delete;

  // Runs the slot's forward (eval: forward, train: forward_train, per the runtime's mode) or
  // backward. Throws kh::Error naming the slot and the op's message on a status other than KH_OK.
  void forward(uint32_t slot, const OpArgs& args) { call(slot, false, args); }
  void backward(uint32_t slot, const OpArgs& args) { call(slot, true, args); }

  // Whether the slot's entry for this caller's CUDA device is a package kernel (staged).
  bool staged(uint32_t slot) const;
  const StagingStats& stats() const { return stats_; }

 private:
  void call(uint32_t slot, bool backward, const OpArgs& args);
  void call_staged(uint32_t slot, bool backward, const OpArgs& args);
  void* buffer(uint32_t slot, bool backward, size_t index, size_t bytes);

  const Runtime& runtime_;
  int ordinal_;
  StagingStats stats_;
  // Made on the first staged call (a cpu run never touches the driver).
  std::unique_ptr<DevicePool> pool_;
  std::unique_ptr<DeviceStream> stream_;
  std::map<std::tuple<uint32_t, bool, size_t>, DeviceBuffer> buffers_;  // freed before pool_
};

}  // namespace kh::demo
