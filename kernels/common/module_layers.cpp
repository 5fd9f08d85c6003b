// module_layers LIBRARY: prints the "layers" object of a package's kernel.json as the host
// library's module table declares them (the build writes it into kernel.json, so the manifest
// cannot drift from the table the loader binds from). The library is loaded through the loader,
// so a table the loader would refuse fails the build here, with the loader's reasons.
//
//   {
//     "RMSNorm": {
//       "ops": {"forward": "rms_norm", "forward_train": "rms_norm_train", "backward": "..."},
//       "flags": ["backward", "graph_safe", "deterministic"],
//       "dtypes": ["bf16", "fp16", "fp32"]
//     }
//   }
//
// Indented to sit at the top level of kernel.json; keys in the module's layer order.
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "loader/module.h"

namespace {

// ["a", "b"] on one line.
std::string list(const std::vector<std::string>& items) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i)
    out += (i ? ", " : "") + nlohmann::json(items[i]).dump();
  return out + "]";
}

std::string layers_json(const kh::ModuleView& v) {
  std::string out = "{\n";
  for (size_t i = 0; i < v.layers.size(); ++i) {
    const kh_layer_v1_t* l = v.layers[i];
    const bool backward = l->backward && (l->flags & KH_FLAG_HAS_BACKWARD);
    std::string ops = "{\"forward\": " + nlohmann::json(l->forward).dump();
    if (l->forward_train) ops += ", \"forward_train\": " + nlohmann::json(l->forward_train).dump();
    if (backward) ops += ", \"backward\": " + nlohmann::json(l->backward).dump();
    ops += "}";
    std::vector<std::string> flags, dtypes;
    if (backward) flags.push_back("backward");
    if (l->flags & KH_FLAG_GRAPH_SAFE) flags.push_back("graph_safe");
    if (l->flags & KH_FLAG_DETERMINISTIC) flags.push_back("deterministic");
    if (l->dtypes & KH_DTYPE_BF16) dtypes.push_back("bf16");
    if (l->dtypes & KH_DTYPE_FP16) dtypes.push_back("fp16");
    if (l->dtypes & KH_DTYPE_FP32) dtypes.push_back("fp32");
    out += "    " + nlohmann::json(l->name).dump() + ": {\n";
    out += "      \"ops\": " + ops + ",\n";
    out += "      \"flags\": " + list(flags) + ",\n";
    out += "      \"dtypes\": " + list(dtypes) + "\n";
    out += std::string("    }") + (i + 1 < v.layers.size() ? "," : "") + "\n";
  }
  return out + "  }";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s LIBRARY (a package host library)\n", argv[0]);
    return 2;
  }
  try {
    const kh::LoadedModule& m = kh::load_module(argv[1]);
    std::printf("%s", layers_json(m.view).c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "module_layers: %s\n", e.what());
    return 1;
  }
}
