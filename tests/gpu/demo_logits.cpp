// demo_logits: the GPU-resident runtime's logits of a Transformers checkpoint, for the parity test
// against Transformers (tests/gpu/test_gpu_demo_transformers.py, label gpu). Test-only: the CLI
// has no option for it.
//
//   demo_logits CHECKPOINT TOKENS BATCH LEN OUT [--dtype bf16|fp32] [--packages DIR]
//
// Loads CHECKPOINT (config.json + model.safetensors; tools/demo/checkpoint.h) into DeviceCausalLM
// on CUDA device 0, in eval mode, with RMSNorm, RotaryEmbedding, SiluAndMul and Attention bound to
// the packages under DIR (the build's kernel packages: norm, rotary, activation, attention), or
// with the runtime's own kernels only when --packages is not given; runs one forward of TOKENS
// (BATCH x LEN int64, little-endian, row-major) and writes every token's logits to OUT as
// float32 [BATCH * LEN, vocab]. Prints one JSON line: which slots a package served and which it
// refused (why). Exit 77 without a CUDA device, 1 on any other error.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kernel_hub/kernel_hub.hpp"
#include "tools/demo/checkpoint.h"
#include "tools/demo/device_model.h"
#include "tools/demo/fallback_ops.h"

namespace {

int run(int argc, char** argv) {
  using namespace kh;
  using namespace kh::demo;
  if (argc < 6) {
    std::cerr << "usage: demo_logits CHECKPOINT TOKENS BATCH LEN OUT [--dtype bf16|fp32] "
                 "[--packages DIR]\n";
    return 2;
  }
  const std::string ckpt_dir = argv[1], tokens_path = argv[2], out_path = argv[5];
  const int batch = std::stoi(argv[3]), len = std::stoi(argv[4]);
  std::string dtype = "bf16", packages;
  for (int i = 6; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--dtype") == 0) dtype = argv[i + 1];
    if (std::strcmp(argv[i], "--packages") == 0) packages = argv[i + 1];
  }
  int32_t devices = 0;
  if (kh_device_count(&devices) != KH_OK || devices < 1) {
    std::cout << "SKIPPED: no CUDA device\n";
    return 77;
  }

  std::vector<int64_t> tokens(static_cast<size_t>(batch) * len);
  std::ifstream in(tokens_path, std::ios::binary);
  in.read(reinterpret_cast<char*>(tokens.data()),
          static_cast<std::streamsize>(tokens.size() * sizeof(int64_t)));
  if (!in) throw Error(ErrorKind::kInvalidInput, tokens_path + ": fewer than BATCH x LEN int64s");

  Checkpoint ckpt = load_checkpoint(ckpt_dir);
  ckpt.config.seq = len;  // the rotary table's rows
  Runtime rt;
  const DemoSlots slots = add_device_demo_slots(rt);
  if (!packages.empty()) {
    const std::pair<const char*, const char*> bound[] = {{kRMSNorm, "norm"},
                                                         {kRotaryEmbedding, "rotary"},
                                                         {kSiluAndMul, "activation"},
                                                         {kAttention, "attention"}};
    for (const auto& [slot, package] : bound)
      rt.bind(slot, packages + "/" + package, Mode::kEval, 0);
  }
  rt.set_mode(Mode::kEval);
  DeviceModelOptions mo;
  mo.dtype = dtype == "bf16" ? kBF16 : kF32;
  DeviceCausalLM model(ckpt.config, ckpt.weights, 1, slots, rt, 0, mo);
  model.forward(tokens.data(), nullptr, batch, len, DeviceCausalLM::Logits::kAll);
  const std::vector<float> logits = model.download_logits();
  std::ofstream out(out_path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(logits.data()),
            static_cast<std::streamsize>(logits.size() * sizeof(float)));
  if (!out) throw Error(ErrorKind::kIo, out_path + ": cannot write the logits");
  std::cout << nlohmann::json{{"dtype", dtype},
                              {"package_slots", model.package_slots()},
                              {"refused_slots", model.refusals()},
                              {"logits", logits.size()}}
                   .dump()
            << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "demo_logits: " << e.what() << "\n";
    return 1;
  }
}
