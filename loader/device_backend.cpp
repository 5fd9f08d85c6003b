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
#include "loader/device_function.h"
#include "loader/jit_cache.h"
#include "loader/launch_config.h"
#include "loader/nvrtc.h"
#include "loader/package_dir.h"
#include "loader/verified_file.h"

namespace kh {

namespace {

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
  SourceBuild build =
      build_source(source, choice.file.filename().string(), choice.file.string(), choice.arch, {});
  e.library = build.library;
  info.kind = DeviceCodeKind::kSource;
  info.arch = choice.arch;
  info.file = choice.file;
  info.jit_key = build.jit_key;
  info.jit_entry = build.jit_entry;
  info.compiled = build.compiled;
  info.description = build.description;
  log_line(kLogDebug,
           fmt::format("{} on {}: {}", package_label(package), gpu_label, info.description));
}

CudaDeviceBackend::SourceBuild CudaDeviceBackend::build_source(
    const std::string& source, const std::string& file_name, const std::string& display_path,
    const CudaArch& arch, const std::vector<std::string>& extra_options) {
  const NvrtcInfo& compiler = nvrtc();
  std::vector<std::string> options = nvrtc_options(arch, compiler.version);
  options.insert(options.end(), extra_options.begin(), extra_options.end());
  JitKeyInput key_input;
  key_input.abi_major = KH_ABI_MAJOR;
  key_input.source = source;
  key_input.options = options;
  key_input.nvrtc_major = compiler.version.major;
  key_input.nvrtc_minor = compiler.version.minor;
  key_input.target = arch.sm();
  const Digest key = jit_cache_key(key_input);
  JitCache cache(jit_cache_dir());
  SourceBuild build;
  build.library = &library_for("jit:" + key.hex, cache.entry_path(key).string(), [&] {
    JitCache::Result r = cache.get_or_build(
        key, [&] { return nvrtc_compile_cubin(source, file_name, options, display_path); });
    build.compiled = r.built;
    return std::move(r.payload);
  });
  build.jit_key = key.hex;
  build.jit_entry = cache.entry_path(key);
  build.description = fmt::format(
      "NVRTC {} build of {} for {} (JIT cache {}: {})", compiler.version.str(), file_name,
      arch.sm(), build.compiled ? "miss, compiled" : "hit", build.jit_entry.string());
  return build;
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
  auto f = std::make_unique<DeviceFunction>();
  if (int32_t status = find_device_function(e.library->handle, e.context, device_id, kernel_name,
                                            e.info.description, *f, error);
      status != KH_OK)
    return status;
  DeviceFunction* raw = f.release();  // never freed: packages may keep the handle
  e.functions.emplace(raw->name, raw);
  *fn = raw;
  return KH_OK;
}

int32_t CudaDeviceBackend::launch(const PackageIdentity& package, void* fn,
                                  const kh_launch_cfg_t& cfg, void** args, void* stream,
                                  std::string& error) {
  (void)package;
  return launch_device_function(fn, cfg, args, stream, error);
}

int32_t CudaDeviceBackend::device_info(int32_t device_id, kh_device_info_t& out,
                                       std::string& error) {
  try {
    const cuda::DeviceInfo& d = cuda::device(device_id);
    out.sm_major = d.sm_major;
    out.sm_minor = d.sm_minor;
    out.multiprocessors = d.multiprocessors;
    out.max_threads_per_multiprocessor = d.max_threads_per_multiprocessor;
    out.registers_per_multiprocessor = d.registers_per_multiprocessor;
    out.shared_memory_per_multiprocessor = d.shared_memory_per_multiprocessor;
    out.shared_memory_per_block_optin = d.shared_memory_per_block_optin;
    out.shared_memory_reserved_per_block = d.shared_memory_reserved_per_block;
    out.total_memory = static_cast<int64_t>(d.total_memory);
    return KH_OK;
  } catch (const Error& e) {
    error = fmt::format("CUDA device {}: {}", device_id, e.what());
    return KH_ERR_NO_DEVICE;
  }
}

}  // namespace kh
