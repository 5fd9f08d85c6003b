// Fuzz target: safetensors files come with checkpoints from anywhere (tools/demo/safetensors.h).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "hub/base/error.h"
#include "tools/demo/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using kh::demo::SafetensorsFile;
  SafetensorsFile f;
  try {
    f = SafetensorsFile::parse(std::string(reinterpret_cast<const char*>(data), size), "fuzz");
  } catch (const kh::Error&) {
    return 0;
  }
  // What parses reads without touching memory outside the file (ASan checks), and the fp32
  // tensors re-encode to a file that parses to the same shapes and bits.
  std::map<std::string, kh::demo::F32Tensor> floats;
  for (const auto& t : f.tensors()) {
    if (t.end > size || t.begin > t.end) __builtin_trap();
    try {
      std::vector<float> v = f.to_f32(t);
      if (v.size() != static_cast<size_t>(t.numel())) __builtin_trap();
      if (t.dtype == "F32") floats[t.name] = {t.shape, std::move(v)};
    } catch (const kh::Error&) {  // dtypes other than floats
    }
  }
  SafetensorsFile again;
  try {
    again = SafetensorsFile::parse(kh::demo::encode_safetensors(floats), "round trip");
  } catch (const kh::Error&) {
    __builtin_trap();
  }
  for (const auto& [name, t] : floats) {
    const auto* u = again.find(name);
    if (!u || u->shape != t.shape) __builtin_trap();
    const std::vector<float> v = again.to_f32(*u);
    if (v.size() != t.values.size() ||
        (!v.empty() && std::memcmp(v.data(), t.values.data(), v.size() * sizeof(float)) != 0))
      __builtin_trap();
  }
  return 0;
}
