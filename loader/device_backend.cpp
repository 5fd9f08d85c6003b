#include "loader/device_backend.h"

#include <atomic>
#include <shared_mutex>
#include <string_view>
#include <unordered_map>

#include <fmt/format.h>

#include "hub/base/cache_layout.h"
#include "hub/base/error.h"
#include "hub/base/fs.h"
#include "hub/base/log.h"
#include "loader/cuda_driver.h"
#include "loader/jit_cache.h"
#include "loader/launch_config.h"
#include "loader/nvrtc.h"
#include "loader/package_dir.h"
#include "loader/verified_file.h"

namespace kh {

namespace {

constexpr uint64_t kFunctionMagic = 0x6b682d636f646531ull;  // "kh-code1"

// The opaque handle get_function hands out: never freed.
struct DeviceFunction {
  uint64_t magic = kFunctionMagic;
  cuda::CUfunction function = nullptr;
  cuda::CUkernel kernel = nullptr;
  cuda::CUcontext context = nullptr;
  int device = -1;
  int sm_major = 0;  // of the device: clusters and PDL need 9
  std::string name;
  // CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED set (the first launch with a cluster of
  // more than 8 blocks sets it).
  std::atomic<bool> non_portable_cluster{false};
  // The dynamic shared memory the function was allowed past the default 48 KiB
  // (CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES), raised on the first launch that asks.
  std::atomic<uint32_t> max_dynamic_smem{kDefaultDynamicSmem};
  static constexpr uint32_t kDefaultDynamicSmem = 48 * 1024;
};

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const noexcept { return std::hash<std::string_view>{}(s); }
};

// Maps a bind/lookup failure to the host services status.
int32_t status_of(ErrorKind kind, bool driver_stage) {
  if (driver_stage) return KH_ERR_NO_DEVICE;
  switch (kind) {
    case ErrorKind::kUnsupported:
      return KH_ERR_UNSUPPORTED;
    case ErrorKind::kNotFound:
      return KH_ERR_NOT_FOUND;
    default:
      return KH_ERR_INTERNAL;
  }
}

std::string package_label(const PackageIdentity& p) {
  if (!p.name.empty()) return fmt::format("{} {} ({})", p.name, p.version, p.package_dir.string());
  return p.package_dir.string();
}

}  // namespace

struct CudaDeviceBackend::Library {
  cuda::CUlibrary handle = nullptr;
  std::string image;  // kept alive: loaded with CU_LIBRARY_BINARY_IS_PRESERVED
};

struct CudaDeviceBackend::Entry {
  std::mutex load_mutex;
  std::atomic<bool> ready{false};
  bool failed = false;
  Error failure{ErrorKind::kIo, ""};
  int32_t failure_status = KH_ERR_INTERNAL;
  DeviceCodeInfo info;
  const Library* library = nullptr;
  cuda::CUcontext context = nullptr;

  std::shared_mutex functions_mutex;
  std::unordered_map<std::string, DeviceFunction*, StringHash, std::equal_to<>> functions;
};

CudaDeviceBackend& CudaDeviceBackend::instance() {
  static CudaDeviceBackend* b = new CudaDeviceBackend;  // never destroyed
  return *b;
}

void install_cuda_device_backend() {
  if (!device_backend()) set_device_backend(&CudaDeviceBackend::instance());
}

void CudaDeviceBackend::set_jit_cache_dir(std::filesystem::path dir) {
  std::lock_guard lock(mutex_);
  jit_dir_ = std::move(dir);
}

std::filesystem::path CudaDeviceBackend::jit_cache_dir() const {
  {
    std::lock_guard lock(mutex_);
    if (!jit_dir_.empty()) return jit_dir_;
  }
  return cache_layout::default_root() / cache_layout::kJit;
}

CudaDeviceBackend::Entry& CudaDeviceBackend::entry(const PackageIdentity& package, int device) {
  // Op calls ask for the same (package, device) over and over: remember the last one per thread.
  struct Last {
    const CudaDeviceBackend* backend = nullptr;
    const PackageIdentity* package = nullptr;
    int device = -1;
    Entry* entry = nullptr;
  };
  thread_local Last last;
  if (last.backend == this && last.package == &package && last.device == device) return *last.entry;
  std::lock_guard lock(mutex_);
  auto& slot = entries_[{&package, device}];
  if (!slot) slot = std::make_unique<Entry>();
  last = {this, &package, device, slot.get()};
  return *slot;
}

void CudaDeviceBackend::ensure_loaded(Entry& e, const PackageIdentity& package, int device) {
  if (e.ready.load(std::memory_order_acquire)) return;
  std::lock_guard lock(e.load_mutex);
  if (e.ready.load(std::memory_order_relaxed)) return;
  if (e.failed) throw e.failure;
  bool driver_stage = true;
  try {
    const cuda::DeviceInfo& dev = cuda::device(device);  // loads the driver on first use
    driver_stage = false;
    e.context = dev.primary_context;
    load(e, package, device);
  } catch (const Error& err) {
    e.failed = true;
    const std::string label = package_label(package);
    const std::string what = err.what();
    e.failure = what.find(label) != std::string::npos
                    ? err
                    : Error(err.kind(),
                            fmt::format("package {} on CUDA device {}: {}", label, device, what));
    e.failure_status = status_of(err.kind(), driver_stage);
    throw e.failure;
  }
  e.ready.store(true, std::memory_order_release);
}

const CudaDeviceBackend::Library& CudaDeviceBackend::library_for(
    const std::string& key, const std::string& what, const std::function<std::string()>& image) {
  std::lock_guard load_lock(library_load_mutex_);
  {
    std::lock_guard lock(mutex_);
    if (auto it = libraries_.find(key); it != libraries_.end()) return *it->second;
  }
  auto lib = std::make_unique<Library>();
  lib->image = image();
  const cuda::Driver& d = cuda::cuda_driver();
  cuda::CUlibraryOption option = cuda::CU_LIBRARY_BINARY_IS_PRESERVED;
  void* value = reinterpret_cast<void*>(uintptr_t{1});
  cuda::CUresult r =
      d.cuLibraryLoadData(&lib->handle, lib->image.data(), nullptr, nullptr, 0, &option, &value, 1);
  if (r == cuda::CUDA_ERROR_INVALID_VALUE)  // a driver that refuses the hint: let it copy
    r = d.cuLibraryLoadData(&lib->handle, lib->image.data(), nullptr, nullptr, 0, nullptr, nullptr,
                            0);
  cuda::check(r, fmt::format("cuLibraryLoadData({})", what));
  // Never cuLibraryUnload: kernels may be in flight or captured in graphs.
  std::lock_guard lock(mutex_);
  auto& slot = libraries_[key];
  slot = std::move(lib);
  return *slot;
}

void CudaDeviceBackend::load(Entry& e, const PackageIdentity& package, int device) {
  const cuda::DeviceInfo& dev = cuda::device(device);
  const CudaArch gpu{dev.sm_major, dev.sm_minor, 0};
  PackageDir pkg = read_package_dir(package.package_dir, package.manifest_digest);
  DeviceCodeInfo& info = e.info;
  info.device = device;
  info.gpu = fmt::format("{} ({})", dev.name, gpu.sm());
  const std::string gpu_label = fmt::format("CUDA device {}, {}", device, dev.name);
  DeviceCodeChoice choice = choose_device_code(packaged_cubins(pkg), pkg.cuda_source, gpu,
                                               package_label(package), gpu_label);
  if (choice.kind == DeviceCodeKind::kNone) throw Error(ErrorKind::kUnsupported, choice.reason);

  if (choice.kind == DeviceCodeKind::kCubin) {
    try {
      VerifiedFile cubin = open_verified(choice.file, pkg.expected_digest(choice.file));
      e.library = &library_for("cubin:" + cubin.digest.str(), choice.file.string(),
                               [&] { return cubin.read_all(uint64_t{1} << 30); });
      info.kind = choice.kind;
      info.arch = choice.arch;
      info.file = choice.file;
      info.description = fmt::format("{} ({})", choice.reason, choice.file.filename().string());
      log_line(kLogDebug,
               fmt::format("{} on {}: {}", package_label(package), gpu_label, info.description));
      return;
    } catch (const Error& err) {
      if (pkg.cuda_source.empty()) throw;
      log_line(kLogWarn, fmt::format("{} on {}: the packaged cubin {} did not load ({}); "
                                     "compiling {} with NVRTC instead",
                                     package_label(package), gpu_label, choice.file.string(),
                                     err.what(), pkg.cuda_source.filename().string()));
      choice.kind = DeviceCodeKind::kSource;
      choice.arch = nvrtc_target(gpu);
      choice.file = pkg.cuda_source;
    }
  }

  // NVRTC from the package's source, through the JIT cache.
  const std::string source =
      open_verified(choice.file, pkg.expected_digest(choice.file)).read_all(uint64_t{64} << 20);
  const NvrtcInfo& compiler = nvrtc();
  std::vector<std::string> options = nvrtc_options(choice.arch, compiler.version);
  JitKeyInput key_input;
  key_input.abi_major = KH_ABI_MAJOR;
  key_input.source = source;
  key_input.options = options;
  key_input.nvrtc_major = compiler.version.major;
  key_input.nvrtc_minor = compiler.version.minor;
  key_input.target = choice.arch.sm();
  const Digest key = jit_cache_key(key_input);
  JitCache cache(jit_cache_dir());
  bool compiled = false;
  e.library = &library_for("jit:" + key.hex, cache.entry_path(key).string(), [&] {
    JitCache::Result r = cache.get_or_build(key, [&] {
      return nvrtc_compile_cubin(source, choice.file.filename().string(), options,
                                 choice.file.string());
    });
    compiled = r.built;
    return std::move(r.payload);
  });
  info.kind = DeviceCodeKind::kSource;
  info.arch = choice.arch;
  info.file = choice.file;
  info.jit_key = key.hex;
  info.jit_entry = cache.entry_path(key);
  info.compiled = compiled;
  info.description =
      fmt::format("NVRTC {} build of {} for {} (JIT cache {}: {})", compiler.version.str(),
                  choice.file.filename().string(), choice.arch.sm(),
                  compiled ? "miss, compiled" : "hit", info.jit_entry.string());
  log_line(kLogDebug,
           fmt::format("{} on {}: {}", package_label(package), gpu_label, info.description));
}

const DeviceCodeInfo& CudaDeviceBackend::prepare_device_code(const PackageIdentity& package,
                                                             int device) {
  Entry& e = entry(package, device);
  ensure_loaded(e, package, device);
  return e.info;
}

int32_t CudaDeviceBackend::get_function(const PackageIdentity& package, int32_t device_id,
                                        const char* kernel_name, void** fn, std::string& error) {
  Entry& e = entry(package, device_id);
  if (!e.ready.load(std::memory_order_acquire)) {
    try {
      ensure_loaded(e, package, device_id);
    } catch (const Error& err) {
      error = fmt::format("kernel {}: {}", kernel_name, err.what());
      return e.failure_status;
    }
  }
  const std::string_view name(kernel_name);
  {
    std::shared_lock lock(e.functions_mutex);
    if (auto it = e.functions.find(name); it != e.functions.end()) {
      *fn = it->second;
      return KH_OK;
    }
  }
  std::unique_lock lock(e.functions_mutex);
  if (auto it = e.functions.find(name); it != e.functions.end()) {
    *fn = it->second;
    return KH_OK;
  }
  const cuda::Driver& d = cuda::cuda_driver();
  auto f = std::make_unique<DeviceFunction>();
  f->device = device_id;
  f->context = e.context;
  f->sm_major = cuda::device(device_id).sm_major;  // loaded: ensure_loaded succeeded
  f->name = kernel_name;
  cuda::CUresult r = d.cuLibraryGetKernel(&f->kernel, e.library->handle, kernel_name);
  if (r == cuda::CUDA_ERROR_NOT_FOUND) {
    error = fmt::format(
        "no kernel named {} in the device code for CUDA device {} ({}); kernels "
        "are looked up by their extern \"C\" __global__ name",
        kernel_name, device_id, e.info.description);
    return KH_ERR_NOT_FOUND;
  }
  if (r != cuda::CUDA_SUCCESS) {
    error = fmt::format("cuLibraryGetKernel({}) failed: {}", kernel_name, cuda::result_text(r));
    return KH_ERR_INTERNAL;
  }
  try {
    cuda::ScopedContext scope(e.context);
    cuda::check(d.cuKernelGetFunction(&f->function, f->kernel),
                fmt::format("cuKernelGetFunction({}) on CUDA device {}", kernel_name, device_id));
  } catch (const Error& err) {
    error = err.what();
    return KH_ERR_INTERNAL;
  }
  DeviceFunction* raw = f.release();  // never freed: packages may keep the handle
  e.functions.emplace(raw->name, raw);
  *fn = raw;
  return KH_OK;
}

int32_t CudaDeviceBackend::launch(const PackageIdentity& package, void* fn,
                                  const kh_launch_cfg_t& cfg, void** args, void* stream,
                                  std::string& error) {
  (void)package;
  auto* f = static_cast<DeviceFunction*>(fn);
  if (f->magic != kFunctionMagic) {
    error = "launch: the function handle did not come from get_function";
    return KH_ERR_INVALID_ARGUMENT;
  }
  if (cfg.device_id != f->device) {
    error = fmt::format(
        "launch: kernel {} was looked up for CUDA device {} but cfg.device_id is "
        "{}; look it up for the device you launch on",
        f->name, f->device, cfg.device_id);
    return KH_ERR_INVALID_ARGUMENT;
  }
  LaunchPlan plan;
  if (int32_t status = plan_launch(cfg, f->sm_major, f->name, f->device, plan, error);
      status != KH_OK)
    return status;
  const cuda::Driver& d = cuda::cuda_driver();  // loaded: get_function succeeded
  if (plan.extended() && !d.cuLaunchKernelEx) {
    error = fmt::format(
        "launch of {}: a cluster or programmatic dependent launch needs cuLaunchKernelEx, which "
        "this NVIDIA driver (CUDA {}) lacks; update the driver",
        f->name, d.driver_version);
    return KH_ERR_LAUNCH;
  }
  // The function belongs to the device's primary context; make it current only if it is not.
  cuda::CUcontext current = nullptr;
  bool pushed = false;
  if (d.cuCtxGetCurrent(&current) != cuda::CUDA_SUCCESS || current != f->context) {
    cuda::CUresult r = d.cuCtxPushCurrent(f->context);
    if (r != cuda::CUDA_SUCCESS) {
      error =
          fmt::format("launch of {}: cuCtxPushCurrent failed: {}", f->name, cuda::result_text(r));
      return KH_ERR_LAUNCH;
    }
    pushed = true;
  }
  auto pop = [&] {
    if (!pushed) return;
    cuda::CUcontext popped = nullptr;
    d.cuCtxPopCurrent(&popped);
  };
  // Function attributes a launch needs, set once per function by the first launch that asks
  // (concurrent setters write the same or a larger value).
  auto set_attribute = [&](int attribute, int value, const char* name) -> bool {
    cuda::CUresult a = d.cuFuncSetAttribute ? d.cuFuncSetAttribute(f->function, attribute, value)
                                            : cuda::CUDA_ERROR_INVALID_VALUE;
    if (a == cuda::CUDA_SUCCESS) return true;
    error = fmt::format("launch of {}: cuFuncSetAttribute({}, {}) failed: {}", f->name, name, value,
                        d.cuFuncSetAttribute ? cuda::result_text(a) : "the driver lacks it");
    return false;
  };
  if (cfg.shared_mem_bytes > f->max_dynamic_smem.load(std::memory_order_acquire)) {
    // Above 48 KiB a kernel must opt in.
    if (!set_attribute(cuda::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                       static_cast<int>(cfg.shared_mem_bytes), "MAX_DYNAMIC_SHARED_SIZE_BYTES")) {
      pop();
      error += fmt::format(
          " ({} B of dynamic shared memory: more than the device allows per "
          "block?)",
          cfg.shared_mem_bytes);
      return KH_ERR_LAUNCH;
    }
    uint32_t seen = f->max_dynamic_smem.load(std::memory_order_relaxed);
    while (seen < cfg.shared_mem_bytes &&
           !f->max_dynamic_smem.compare_exchange_weak(seen, cfg.shared_mem_bytes)) {
    }
  }
  if (plan.non_portable_cluster && !f->non_portable_cluster.load(std::memory_order_acquire)) {
    if (!set_attribute(cuda::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1,
                       "NON_PORTABLE_CLUSTER_SIZE_ALLOWED")) {
      pop();
      return KH_ERR_LAUNCH;
    }
    f->non_portable_cluster.store(true, std::memory_order_release);
  }
  const auto cu_stream = static_cast<cuda::CUstream>(stream);
  cuda::CUresult r = cuda::CUDA_SUCCESS;
  if (!plan.extended()) {
    r = d.cuLaunchKernel(f->function, cfg.grid[0], cfg.grid[1], cfg.grid[2], cfg.block[0],
                         cfg.block[1], cfg.block[2], cfg.shared_mem_bytes, cu_stream, args,
                         nullptr);
  } else {
    cuda::CUlaunchAttribute attrs[2] = {};
    unsigned n = 0;
    if (plan.cluster) {
      attrs[n].id = cuda::CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
      attrs[n].value.clusterDim = {plan.cluster_dims[0], plan.cluster_dims[1],
                                   plan.cluster_dims[2]};
      ++n;
    }
    if (plan.pdl) {
      attrs[n].id = cuda::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
      attrs[n].value.programmaticStreamSerializationAllowed = 1;
      ++n;
    }
    const cuda::CUlaunchConfig config = {
        cfg.grid[0],  cfg.grid[1],          cfg.grid[2], cfg.block[0], cfg.block[1],
        cfg.block[2], cfg.shared_mem_bytes, cu_stream,   attrs,        n};
    r = d.cuLaunchKernelEx(&config, f->function, args, nullptr);
  }
  pop();
  if (r != cuda::CUDA_SUCCESS) {
    error = fmt::format(
        "{}({}, grid {}x{}x{}, block {}x{}x{}, {} B shared{}{}) on CUDA device {} failed: {}",
        plan.extended() ? "cuLaunchKernelEx" : "cuLaunchKernel", f->name, cfg.grid[0], cfg.grid[1],
        cfg.grid[2], cfg.block[0], cfg.block[1], cfg.block[2], cfg.shared_mem_bytes,
        plan.cluster ? fmt::format(", cluster {}x{}x{}", plan.cluster_dims[0], plan.cluster_dims[1],
                                   plan.cluster_dims[2])
                     : std::string(),
        plan.pdl ? ", programmatic dependent launch" : "", f->device, cuda::result_text(r));
    return KH_ERR_LAUNCH;
  }
  return KH_OK;
}

}  // namespace kh
