// kernel-hub's C++ embedding API: a runtime declares layer slots (each with its own fallback
// implementation), binds package layers to them per mode and device, switches modes with one
// atomic store, and calls ops with DLPack tensors.
//
//   kh::Runtime rt;
//   uint32_t scale = rt.add_slot("Scale", {my_scale, my_scale, my_scale_bwd,
//   KH_FLAG_HAS_BACKWARD}); rt.bind("Scale", "/cache/unpacked/<hex>", kh::Mode::kEval);   // cpu by
//   default rt.set_mode(kh::Mode::kEval); int32_t status = rt.forward(scale, kh::kCpuDevice, args,
//   nargs, nullptr); if (status != KH_OK) std::cerr << kh::last_op_error();
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "kernel_hub/kernel_hub_abi.h"
#include "loader/layer_table.h"
#include "loader/log.h"
#include "loader/module.h"
#include "loader/package_dir.h"

namespace kh {

struct RuntimeOptions {
  // Binding a layer without a backward op for train fails instead of keeping the fallback.
  bool strict = false;
  // Where NVRTC output of packages' CUDA sources is cached; empty = <store root>/jit. The device
  // backend is process-wide: the last runtime that sets it wins for later compiles.
  std::filesystem::path jit_cache_dir = {};
};

// A package directory loaded into this process: its kernel.json and its module.
struct LoadedPackage {
  PackageDir dir;
  const LoadedModule* module = nullptr;
};

class Runtime {
 public:
  // Installs the process-wide CUDA device backend (touches no driver: libcuda and NVRTC load on
  // the first GPU bind).
  explicit Runtime(RuntimeOptions options = {});

  // Adds a layer slot with the runtime's own implementation as its fallback.
  uint32_t add_slot(const std::string& name, SlotOps fallback = {}) {
    return table_.add_slot(name, fallback);
  }
  // Looks up a slot by name: its index, or nullopt.
  std::optional<uint32_t> find_slot(const std::string& name) const;

  // Reads kernel.json, preflights, dlopens and validates the package's host library; checks that
  // the module's name and version match kernel.json. Each library loads once per process.
  // Throws kh::Error (kRefused with every failed check, kNotFound, kInvalidInput).
  static LoadedPackage load_package(const std::filesystem::path& package_dir);

  // Binds the package's layer `layer` (default: the slot's name) to `slot` for `mode` on
  // `device`. Returns kKeptFallback when a train bind lacks a backward op (not strict). For a
  // CUDA device (>= 0) the package's device code is loaded or compiled now; without a driver,
  // device or suitable device code this throws kh::Error naming the cause.
  BindOutcome bind(const std::string& slot, const std::filesystem::path& package_dir, Mode mode,
                   int device = kCpuDevice, const std::string& layer = "",
                   std::optional<bool> strict = std::nullopt);

  void set_mode(Mode mode) { table_.set_mode(mode); }
  // As set_mode, but first asks the driver whether any of `streams` (CUstream; nullptr = the
  // legacy default stream) is capturing a CUDA graph, and refuses (kh::Error kRefused) if so.
  void set_mode(Mode mode, const std::vector<void*>& streams);
  Mode mode() const noexcept { return table_.mode(); }
  void set_capturing(bool capturing) noexcept { table_.set_capturing(capturing); }

  // Calls the slot's forward (eval: forward, train: forward_train) or backward for `device`
  // through the published table. On failure the status is not KH_OK and last_op_error() says
  // why. No lock, no allocation on success.
  int32_t forward(uint32_t slot, int device, const kh_arg_t* args, int32_t nargs,
                  void* stream) const noexcept;
  int32_t backward(uint32_t slot, int device, const kh_arg_t* args, int32_t nargs,
                   void* stream) const noexcept;

  LayerTable& table() noexcept { return table_; }
  const LayerTable& table() const noexcept { return table_; }

 private:
  int32_t call(uint32_t slot, int device, bool backward, const kh_arg_t* args, int32_t nargs,
               void* stream) const noexcept;

  RuntimeOptions options_;
  LayerTable table_;
};

}  // namespace kh
