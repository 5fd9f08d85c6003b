// The host services table (kh_host_v1_t) the loader hands each package, and the seam where a
// device backend (CUDA driver, NVRTC, JIT cache: loader/device_backend.h) plugs in. kh::Runtime
// installs the CUDA backend; without any backend, get_function and launch fail with
// KH_ERR_NO_DEVICE and a message saying so.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

#include "hub/base/digest.h"
#include "kernel_hub/kernel_hub.hpp"  // last_op_error (the message host->set_error sets)

namespace kh {

// Identity of a loaded package, given to the device backend so that it can find the package's
// device code (packaged cubins, .cu source) next to its host library.
struct PackageIdentity {
  std::filesystem::path library;      // the host library
  std::filesystem::path package_dir;  // its directory
  std::string name;                   // from the module table, once read
  std::string version;
  // kernel.json's digest as verified when the library was loaded: the device code is read
  // against the same kernel.json (and its "files" digests), never a newer one.
  std::optional<Digest> manifest_digest;
};

// Provides device code to packages. Implementations must be thread-safe; both calls may run
// concurrently from any thread calling ops. `error` receives the message on failure.
class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;
  // Loads or compiles the package's device code for `device_id` ahead of op calls (at bind
  // time). Throws kh::Error naming the cause. The default does nothing (code is found on first
  // use).
  virtual void prepare(const PackageIdentity& package, int32_t device_id) {
    (void)package;
    (void)device_id;
  }
  virtual int32_t get_function(const PackageIdentity& package, int32_t device_id,
                               const char* kernel_name, void** fn, std::string& error) = 0;
  // `cfg` is whole and checked (loader/launch_config.h: read_launch_cfg): fields the package's
  // ABI minor lacks are 0, cluster dims divide the grid, flags are known.
  virtual int32_t launch(const PackageIdentity& package, void* fn, const kh_launch_cfg_t& cfg,
                         void** args, void* stream, std::string& error) = 0;
  // Fills `out` (zeroed, header set) for the device-info service (ABI 1.4,
  // loader/device_info_service.h). The default knows no device: KH_ERR_NO_DEVICE.
  virtual int32_t device_info(int32_t device_id, kh_device_info_t& out, std::string& error) {
    (void)out;
    error = "this device backend reports no device properties (CUDA device " +
            std::to_string(device_id) + ")";
    return KH_ERR_NO_DEVICE;
  }
};

// Installs the process-wide device backend (not owned; it must outlive every op call). nullptr
// restores "no device code backend yet".
void set_device_backend(DeviceBackend* backend);
// The installed backend, or nullptr.
DeviceBackend* device_backend();

// Per-package host state: the table handed to kh_module_v1 and what it refers to. Allocated
// once per loaded library and never freed (packages may keep the pointer forever).
struct HostContext {
  PackageIdentity package;
  kh_host_v1_t table{};
};

// Builds the context and its table (ctx points back to the HostContext).
HostContext* make_host_context(PackageIdentity package);

}  // namespace kh
