// KernelConfig: which kernel package serves which layer, per device key, per compute-capability
// range and per mode. Parsed from JSON (schema: manifests/schemas/kernel-config.schema.json).
//
// Native form (every level but the mode map is optional):
//
//   {
//     "RMSNorm": {
//       "cuda": [                                   // capability list (cuda only)
//         {"capability": {"min": 80, "max": 89}, "modes": {"eval": "org/norm@v1"}},
//         {"capability": {"min": 90},            "modes": {"eval": "org/norm-sm90@v2",
//                                                          "train": "org/norm-sm90@v2"}},
//         {"modes": {"fallback": "org/norm@v1"}}   // no range: covers every capability
//       ],
//       "cpu": {"eval": "org/norm-cpu", "fallback": "org/norm-cpu@1.2.0:RMSNorm"}  // mode map
//     }
//   }
//
// Transformers' forms are accepted wherever a ref may stand and mean "eval and train":
//   "RMSNorm": "org/repo:RMSNorm"                         (every device key)
//   "RMSNorm": {"cuda": "org/repo:RMSNorm", "cpu": "org/repo-cpu"}
//   "RMSNorm": ["org/repo:RMSNorm", {"version": 1}]         (version N = tag vN)
//   "RMSNorm": "org/repo@rev:RMSNorm"
//   "RMSNorm": "/abs/path/layer_norm:RMSNorm"               (a local package directory)
// A mode map value may itself be ["org/repo", {"version": 2}].
//
// Compatibility with Transformers' KernelConfig and kernels' kernel_layer_mapping (README
// "Transformers config compatibility"):
//  - Device keys of other accelerators (kOtherDeviceKeys: rocm, xpu, npu, mps, metal, neuron,
//    tpu) are kept, and skipped on this system with a note: kernel-hub serves cuda and cpu.
//  - Mode names: INFERENCE -> eval, TRAINING -> train, FALLBACK -> fallback; with
//    "| TORCH_COMPILE" they map to the same mode (the loader binds the same kernels under
//    torch.compile); when both spellings of a mode are given the plain one wins, as in kernels'
//    mode priority. TORCH_COMPILE alone, INFERENCE | TRAINING and FALLBACK combined are refused
//    (kernels refuses them too).
//  - Capability ranges also as kernels' CUDAProperties names: {"min_capability": 80,
//    "max_capability": 89}, inside "capability" or directly in the list entry.
//  - Repository names: OCI names are lowercase, HF Hub ids are case-preserving (and looked up
//    case-insensitively there): the repository part of a config ref is lowercased, with a note;
//    tags and layer names keep their case.
//  - Local paths "/abs/path/NAME:Layer" (Transformers' use_local_kernel form) serve the package
//    directory as repo local/NAME (as KERNEL_HUB_LOCAL=local/NAME=/abs/path/NAME would).
//
// Kernel refs: org/name[@TAG|@sha256:HEX][:Layer]; :Layer defaults to the layer type; no tag
// means v1 (kh::Ref). Capabilities are major*10+minor, both ends inclusive; min defaults to 0 and
// max to unbounded.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "hub/oci/ref.h"
#include "loader/layer_table.h"  // kh::Mode (moving to kernel_hub/kernel_hub.hpp)

namespace kh {

// The key a config entry is registered under: a mode (eval, train; the loader's kh::Mode, the
// only mode type) or "fallback", which serves any requested mode (HF's Mode.FALLBACK). A mode
// that is requested (resolution, kernelize, the layer table) is always a kh::Mode.
class ModeKey {
 public:
  constexpr ModeKey(Mode mode)
      : mode_(mode) {}  // NOLINT(google-explicit-constructor): a mode is a key
  static constexpr ModeKey fallback() { return ModeKey(); }

  bool is_fallback() const { return !mode_; }
  std::optional<Mode> mode() const { return mode_; }
  // Does an entry under this key serve `requested` directly (not through the mode chain)?
  bool is(Mode requested) const { return mode_ == requested; }

  // eval < train < fallback: the order mode maps and messages list them.
  friend bool operator<(ModeKey a, ModeKey b) { return a.rank() < b.rank(); }
  friend bool operator==(ModeKey a, ModeKey b) { return a.mode_ == b.mode_; }

 private:
  constexpr ModeKey() = default;
  int rank() const { return mode_ ? static_cast<int>(*mode_) : 2; }

  std::optional<Mode> mode_;  // nullopt: "fallback"
};
// "eval", "train", "fallback".
const char* mode_key_name(ModeKey key);
// "eval", "train", "fallback"; nullopt otherwise.
std::optional<ModeKey> parse_mode_key(std::string_view text);

// Device keys kernel-hub serves, in the order error messages list them.
inline constexpr std::string_view kDeviceKeys[] = {"cuda", "cpu"};
bool is_device_key(std::string_view key);
// Device keys of other accelerators (Transformers' and kernels' names): kept in a config and
// skipped on this system with a note.
inline constexpr std::string_view kOtherDeviceKeys[] = {"rocm",  "xpu",    "npu", "mps",
                                                        "metal", "neuron", "tpu"};
bool is_other_device_key(std::string_view key);

// A mode map key as a config spells it: eval, train, fallback, or kernels' Mode names
// (INFERENCE, TRAINING, FALLBACK, "TRAINING | TORCH_COMPILE", "Mode.INFERENCE", ...).
struct ConfigModeKey {
  ModeKey key;
  bool torch_compile = false;  // spelled with | TORCH_COMPILE
};
// nullopt with *why set when the text is a mode combination kernels refuses too.
std::optional<ConfigModeKey> parse_config_mode_key(std::string_view text, std::string* why);

// A layer type name: [A-Za-z_][A-Za-z0-9_.-]*, at most 128 characters.
bool is_valid_layer_name(std::string_view name);

// org/name[@TAG|@sha256:HEX][:Layer]
struct KernelRef {
  Ref ref;
  std::string layer;  // the package layer to bind; never empty after parse

  // default_layer is used when the text has no ":Layer". Throws kInvalidInput naming the text.
  static KernelRef parse(std::string_view text, std::string_view default_layer);
  std::string str() const { return ref.str() + ":" + layer; }
  bool operator==(const KernelRef&) const = default;
};

struct CapabilityRange {
  int min = 0;
  int max = kUnbounded;
  static constexpr int kUnbounded = 1 << 30;

  bool contains(int capability) const { return capability >= min && capability <= max; }
  int64_t width() const { return static_cast<int64_t>(max) - min; }
  std::string str() const;  // "[80, 89]", "[90, any]"
  bool operator==(const CapabilityRange&) const = default;
};

struct ModeEntry {
  KernelRef kernel;
  std::string path;  // JSON path of the entry, for traces: $.RMSNorm.cuda[0].modes.eval
};

// One registration under a device key: an optional capability range and its mode map.
struct CapabilityEntry {
  std::optional<CapabilityRange> range;  // none: every capability (loses to any range)
  std::map<ModeKey, ModeEntry> modes;
  std::string path;
};

struct DeviceMapping {
  // In registration order; equal ranges are replaced when merged, so a later entry with the same
  // range overrides an earlier one.
  std::vector<CapabilityEntry> entries;
};

struct LayerMapping {
  std::map<std::string, DeviceMapping> devices;  // device key -> mapping
};

struct KernelConfig {
  std::map<std::string, LayerMapping> layers;  // layer type -> mapping
  // Local package directories the config names by path (repo local/NAME -> directory).
  std::map<std::string, std::string> local_packages;
  // What parsing changed or skips, one line each with its JSON path: device keys of other
  // accelerators, lowercased repository names, a TORCH_COMPILE spelling that lost to the plain
  // one. resolve, lock and kernelize show them.
  std::vector<std::string> notes;

  // Parses and validates. `what` names the document in messages ("kernels.json"). Errors are
  // kInvalidInput "<what>: <JSON path>: <problem>; expected ...".
  static KernelConfig parse(std::string_view json_text, std::string_view what = "kernel config");
  static KernelConfig load(const std::string& path);

  // Every distinct package ref under the device keys served here (kDeviceKeys; tags/digests as
  // written), sorted.
  std::vector<Ref> refs() const;
  bool empty() const { return layers.empty(); }
};

// Applies `overlay` on top of `base` as HF's register_kernel_mapping does: layers and device keys
// missing from the overlay stay; for cpu the overlay's entry replaces the device's mapping; for
// cuda each overlay entry replaces the entry with the same range (or lack of one) and other
// entries are appended after the existing ones.
KernelConfig merge_kernel_configs(const KernelConfig& base, const KernelConfig& overlay);

}  // namespace kh
