// The runtime built against the installed SDK runs: the tiny model's eval prefill on the cpu
// through the runtime's fallbacks, its binding table from the slot query, and, where a CUDA
// device is present, the device model's prefill against the host model's logits.
#include <cmath>
#include <cstdio>
#include <vector>

#include "kernel_hub/kernel_hub.hpp"
#include "tools/demo/device_model.h"
#include "tools/demo/fallback_ops.h"
#include "tools/demo/model.h"
#include "tools/demo/model_config.h"
#include "tools/demo/staging.h"

int main() {
  using namespace kh::demo;
  kh::Runtime rt;
  const DemoSlots slots = add_demo_slots(rt);
  rt.set_mode(kh::Mode::kEval);
  const ModelConfig cfg = preset("tiny");
  CausalLM host(cfg, slots, 7);
  const int batch = 2, len = 8;
  std::vector<int64_t> tokens(batch * len), targets(batch * len);
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<int64_t>((i * 31 + 7) % cfg.vocab);
    targets[i] = static_cast<int64_t>((i * 17 + 3) % cfg.vocab);
  }
  SlotCaller caller(rt, -1);
  const float loss = host.forward(caller, rt, tokens.data(), targets.data(), batch, len);
  std::printf("kernel-hub %s (built against %s): tiny prefill loss %.4f\n", kh::version(),
              KH_VERSION_STRING, loss);
  if (!std::isfinite(loss) || loss <= 0) return 1;
  for (uint32_t s = 0; s < rt.num_slots(); ++s) {
    const kh::SlotBinding b = rt.slot_binding(s, kh::kCpuDevice, rt.mode());
    std::printf("  %-16s %s\n", b.slot.c_str(), b.bound ? b.package.c_str() : "fallback");
  }
  int32_t devices = 0;
  if (kh_device_count(&devices) != KH_OK || devices < 1) {
    std::printf("no CUDA device: the device model was built, not run\n");
    return 0;
  }
  DeviceCausalLM dev(host, slots, rt, 0);
  const float dev_loss = dev.forward(tokens.data(), targets.data(), batch, len);
  std::printf("device prefill loss %.4f\n", dev_loss);
  return std::fabs(dev_loss - loss) <= 1e-3f * loss ? 0 : 1;
}
