// The CUDA device backend behind the host services get_function/launch: per package and CUDA
// device it picks the device code (device_code.h), loads a packaged cubin or compiles the
// package's .cu source with NVRTC through the JIT cache, loads it with cuLibraryLoadData (never
// unloaded) and hands out per-context CUfunction handles for kernels looked up by name.
// Two devices get their own entries (and their own code when their sm differs); devices with
// the same choice share one CUlibrary (a CUkernel is valid in every context).
//
// Nothing touches libcuda or NVRTC until the first GPU bind or get_function.
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "loader/cuda_arch.h"
#include "loader/cuda_driver.h"
#include "loader/device_code.h"
#include "loader/host_services.h"

namespace kh {

// What serves a package on one device.
struct DeviceCodeInfo {
  int device = -1;
  std::string gpu;  // "NVIDIA H200 (sm_90)"
  DeviceCodeKind kind = DeviceCodeKind::kNone;
  CudaArch arch;               // cubin target or NVRTC target
  std::filesystem::path file;  // the cubin or the source
  std::string description;     // one line for logs and `info`
  // NVRTC path only:
  std::string jit_key;              // hex
  std::filesystem::path jit_entry;  // <jit dir>/<key>.cubin
  bool compiled = false;            // NVRTC ran in this process (a JIT cache miss)
};

class CudaDeviceBackend final : public DeviceBackend {
 public:
  // The process-wide backend (never destroyed: libraries and handles live for the process).
  static CudaDeviceBackend& instance();

  // Where NVRTC output is cached; empty (the default) = <store root>/jit, where the store root
  // is $KERNEL_HUB_CACHE or ~/.cache/kernel-hub (in the shared mode JitCache keeps each user's
  // entries in <dir>/u<uid>). Affects compiles that start afterwards.
  void set_jit_cache_dir(std::filesystem::path dir);
  std::filesystem::path jit_cache_dir() const;

  // Loads or compiles the package's device code for `device` now (bind time), so that op calls
  // find it ready. Idempotent; a failure is remembered and rethrown. Throws kh::Error naming the
  // cause (no driver, no such device, no suitable device code, compile log).
  const DeviceCodeInfo& prepare_device_code(const PackageIdentity& package, int device);
  void prepare(const PackageIdentity& package, int32_t device_id) override {
    prepare_device_code(package, device_id);
  }

  int32_t get_function(const PackageIdentity& package, int32_t device_id, const char* kernel_name,
                       void** fn, std::string& error) override;
  int32_t launch(const PackageIdentity& package, void* fn, const kh_launch_cfg_t& cfg, void** args,
                 void* stream, std::string& error) override;
  // The driver's answers for the device (loader/cuda_driver.h: DeviceInfo, queried once).
  int32_t device_info(int32_t device_id, kh_device_info_t& out, std::string& error) override;

  struct Entry;
  // A CUlibrary loaded once per cubin digest or JIT key and never unloaded (kernels may be in
  // flight or captured in graphs).
  struct Library {
    cuda::CUlibrary handle = nullptr;
    std::string image;  // kept alive: loaded with CU_LIBRARY_BINARY_IS_PRESERVED
  };

  // CUDA source compiled by NVRTC for `arch` through the JIT cache (jit_cache_dir()) and loaded:
  // the one compile path, for packages' sources and for runtime modules (device_api.h).
  // `extra_options` follow nvrtc_options(arch) and are part of the cache key. Throws kh::Error:
  // kNotFound (no NVRTC), kInvalidInput (the source does not compile: NVRTC's log, positions
  // as `display_path`(line)), kIo (the driver refused the cubin).
  struct SourceBuild {
    const Library* library = nullptr;
    std::string jit_key;              // hex
    std::filesystem::path jit_entry;  // <jit dir>/<key>.cubin
    bool compiled = false;            // NVRTC ran (a JIT cache miss)
    std::string description;          // "NVRTC 13.0 build of x.cu for sm_90a (JIT cache hit: ...)"
  };
  SourceBuild build_source(const std::string& source, const std::string& file_name,
                           const std::string& display_path, const CudaArch& arch,
                           const std::vector<std::string>& extra_options);

 private:
  CudaDeviceBackend() = default;
  Entry& entry(const PackageIdentity& package, int device);
  void ensure_loaded(Entry& e, const PackageIdentity& package, int device);
  void load(Entry& e, const PackageIdentity& package, int device);
  const Library& library_for(const std::string& key, const std::string& what,
                             const std::function<std::string()>& image);

  mutable std::mutex mutex_;  // entries_, libraries_, jit_dir_
  std::map<std::pair<const PackageIdentity*, int>, std::unique_ptr<Entry>> entries_;
  std::map<std::string, std::unique_ptr<Library>> libraries_;
  std::filesystem::path jit_dir_;
  std::mutex library_load_mutex_;
};

// Installs CudaDeviceBackend::instance() as the host services' backend unless another backend
// is installed (cheap; touches no driver). kh::Runtime does this when constructed.
void install_cuda_device_backend();

}  // namespace kh
