#include "loader/cuda_driver.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include <fmt/format.h>

#include "hub/base/dynamic_library.h"
#include "hub/base/error.h"
#include "hub/base/log.h"

namespace kh::cuda {

namespace {

using GetProcAddressFn = CUresult (*)(const char* symbol, void** pfn, int cuda_version,
                                      cuuint64_t flags, CUdriverProcAddressQueryResult* status);
using DriverGetVersionFn = CUresult (*)(int* version);

const char kNoGpuHint[] = "bind the cpu device instead";

struct State {
  std::once_flag once;
  std::atomic<bool> attempted{false};
  Driver driver;
  std::unique_ptr<Error> failure;  // set when loading failed; rethrown on every later call
  int device_count = 0;
  std::mutex devices_mutex;
  std::vector<std::unique_ptr<DeviceInfo>> devices;  // index = ordinal; filled on first use
};

State& state() {
  static State* s = new State;  // never destroyed: the driver outlives static destructors
  return *s;
}

// Resolves `name` through cuGetProcAddress at `version`. Returns null when the driver lacks it
// (and sets `why`).
void* resolve(GetProcAddressFn get, const char* name, int version, std::string& why) {
  void* pfn = nullptr;
  CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
  CUresult r = get(name, &pfn, version, CU_GET_PROC_ADDRESS_DEFAULT, &status);
  if (r == CUDA_SUCCESS && status == CU_GET_PROC_ADDRESS_SUCCESS && pfn) return pfn;
  if (r != CUDA_SUCCESS)
    why = fmt::format("cuGetProcAddress({}, {}) returned CUresult {}", name, version, r);
  else if (status == CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT)
    why = fmt::format("{} needs a newer CUDA version than {}", name, version);
  else
    why = fmt::format("the driver has no {}", name);
  return nullptr;
}

template <typename Fn>
void required(GetProcAddressFn get, const char* name, int version, Fn& out,
              std::vector<std::string>& missing) {
  std::string why;
  out = reinterpret_cast<Fn>(resolve(get, name, version, why));
  if (!out) missing.push_back(why);
}

template <typename Fn>
void optional(GetProcAddressFn get, const char* name, int version, Fn& out) {
  std::string why;
  out = reinterpret_cast<Fn>(resolve(get, name, version, why));
  if (!out) log_line(kLogDebug, fmt::format("CUDA driver: optional entry missing: {}", why));
}

std::string version_text(int v) {
  return fmt::format("{}.{}", v / 1000, (v % 1000) / 10);
}

void load(State& s) {
  const char* override_name = std::getenv("KERNEL_HUB_LIBCUDA");
  std::string lib_name = override_name && *override_name ? override_name : "libcuda.so.1";
  std::string why;
  // Never closed: function pointers and contexts live for the rest of the process.
  std::optional<DynamicLibrary> lib = DynamicLibrary::try_open(lib_name, why);
  if (!lib)
    throw Error(ErrorKind::kNotFound,
                fmt::format("{} not found: no NVIDIA driver on this machine ({}); {}", lib_name,
                            why, kNoGpuHint));
  GetProcAddressFn get = nullptr;
  DriverGetVersionFn get_version = nullptr;
  if (!lib->find("cuGetProcAddress_v2", get) || !lib->find("cuDriverGetVersion", get_version))
    throw Error(ErrorKind::kUnsupported,
                fmt::format("{} has no cuGetProcAddress_v2: the NVIDIA driver is older than CUDA "
                            "12.0; install driver 525 or newer, or {}",
                            lib_name, kNoGpuHint));
  Driver& d = s.driver;
  CUresult r = get_version(&d.driver_version);
  if (r != CUDA_SUCCESS)
    throw Error(ErrorKind::kIo,
                fmt::format("cuDriverGetVersion failed with CUresult {}; {}", r, kNoGpuHint));
  if (d.driver_version < kMinDriverCudaVersion)
    throw Error(ErrorKind::kUnsupported,
                fmt::format("the NVIDIA driver supports CUDA {}, but kernel-hub needs CUDA {} or "
                            "newer (cuLibrary APIs); install driver 525 or newer, or {}",
                            version_text(d.driver_version), version_text(kMinDriverCudaVersion),
                            kNoGpuHint));
  // Ask for the signatures we declared: never newer than our declarations, never older than
  // the cuLibrary floor.
  d.requested_version =
      std::clamp(d.driver_version, kMinDriverCudaVersion, kMaxRequestedCudaVersion);
  const int v = d.requested_version;
  std::vector<std::string> missing;
#define KH_CUDA_REQUIRE(name, params) required(get, #name, v, d.name, missing);
  KH_CUDA_REQUIRED(KH_CUDA_REQUIRE)
#undef KH_CUDA_REQUIRE
  if (!missing.empty()) {
    std::string list;
    for (const auto& m : missing) list += (list.empty() ? "" : "; ") + m;
    throw Error(ErrorKind::kUnsupported,
                fmt::format("the NVIDIA driver (CUDA {}) lacks entry points kernel-hub needs: {}; "
                            "update the driver, or {}",
                            version_text(d.driver_version), list, kNoGpuHint));
  }
#define KH_CUDA_FIND(name, params) optional(get, #name, v, d.name);
  KH_CUDA_OPTIONAL(KH_CUDA_FIND)
#undef KH_CUDA_FIND
  if (v >= 12030)
    optional(get, "cuStreamGetCaptureInfo", v, d.cuStreamGetCaptureInfo_v3);
  else
    optional(get, "cuStreamGetCaptureInfo", v, d.cuStreamGetCaptureInfo_v2);

  r = d.cuInit(0);
  if (r == CUDA_ERROR_NO_DEVICE)
    throw Error(ErrorKind::kNotFound,
                fmt::format("the NVIDIA driver (CUDA {}) found no CUDA device (cuInit: {}); {}",
                            version_text(d.driver_version), result_text(r), kNoGpuHint));
  if (r != CUDA_SUCCESS)
    throw Error(ErrorKind::kIo,
                fmt::format("cuInit failed: {} (driver CUDA {}); check the driver installation "
                            "(nvidia-smi), or {}",
                            result_text(r), version_text(d.driver_version), kNoGpuHint));
  r = d.cuDeviceGetCount(&s.device_count);
  if (r != CUDA_SUCCESS)
    throw Error(ErrorKind::kIo, fmt::format("cuDeviceGetCount failed: {}", result_text(r)));
  if (s.device_count <= 0)
    throw Error(ErrorKind::kNotFound,
                fmt::format("the NVIDIA driver found no CUDA device; {}", kNoGpuHint));
  s.devices.resize(static_cast<size_t>(s.device_count));
  log_line(kLogDebug, fmt::format("CUDA driver {} loaded from {}: {} device(s)",
                                  version_text(d.driver_version), lib_name, s.device_count));
}

}  // namespace

const Driver& cuda_driver() {
  State& s = state();
  load_once_or_throw(s.once, s.failure, "the CUDA driver", [&] {
    s.attempted.store(true, std::memory_order_release);
    load(s);
  });
  return s.driver;
}

bool cuda_driver_attempted() {
  return state().attempted.load(std::memory_order_acquire);
}

int device_count() {
  cuda_driver();
  return state().device_count;
}

const DeviceInfo& device(int ordinal) {
  const Driver& d = cuda_driver();
  State& s = state();
  if (ordinal < 0 || ordinal >= s.device_count)
    throw Error(ErrorKind::kNotFound,
                fmt::format("CUDA device {} does not exist: this machine has {} (ordinals 0 to "
                            "{})",
                            ordinal, s.device_count, s.device_count - 1));
  std::lock_guard lock(s.devices_mutex);
  auto& slot = s.devices[static_cast<size_t>(ordinal)];
  if (slot) return *slot;
  auto info = std::make_unique<DeviceInfo>();
  info->ordinal = ordinal;
  check(d.cuDeviceGet(&info->handle, ordinal), fmt::format("cuDeviceGet({})", ordinal));
  char name[256] = {};
  check(d.cuDeviceGetName(name, sizeof(name) - 1, info->handle),
        fmt::format("cuDeviceGetName(device {})", ordinal));
  info->name = name;
  struct Attribute {
    int* out;
    CUdevice_attribute attribute;
    const char* what;
  };
  const Attribute attributes[] = {
      {&info->sm_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, "compute capability major"},
      {&info->sm_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, "compute capability minor"},
      {&info->multiprocessors, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, "multiprocessor count"},
      {&info->max_threads_per_multiprocessor, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR,
       "threads per multiprocessor"},
      {&info->registers_per_multiprocessor, CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR,
       "registers per multiprocessor"},
      {&info->shared_memory_per_multiprocessor,
       CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR,
       "shared memory per multiprocessor"},
      {&info->shared_memory_per_block_optin, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
       "opt-in shared memory per block"},
      {&info->shared_memory_reserved_per_block,
       CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK, "reserved shared memory per block"},
  };
  for (const Attribute& a : attributes)
    check(d.cuDeviceGetAttribute(a.out, a.attribute, info->handle),
          fmt::format("cuDeviceGetAttribute({}, device {})", a.what, ordinal));
  check(d.cuDeviceTotalMem(&info->total_memory, info->handle),
        fmt::format("cuDeviceTotalMem(device {})", ordinal));
  // The primary context coexists with runtime-API frameworks; retained once, never released.
  check(d.cuDevicePrimaryCtxRetain(&info->primary_context, info->handle),
        fmt::format("cuDevicePrimaryCtxRetain(device {})", ordinal));
  log_line(kLogDebug, fmt::format("CUDA device {}: {}, sm_{}{}, {} MiB", ordinal, info->name,
                                  info->sm_major, info->sm_minor, info->total_memory >> 20));
  slot = std::move(info);
  return *slot;
}

std::string result_text(CUresult result) {
  State& s = state();
  const Driver& d = s.driver;  // only read when loading got far enough to set these
  const char* name = nullptr;
  const char* text = nullptr;
  if (cuda_driver_attempted()) {
    if (d.cuGetErrorName && d.cuGetErrorName(result, &name) != CUDA_SUCCESS) name = nullptr;
    if (d.cuGetErrorString && d.cuGetErrorString(result, &text) != CUDA_SUCCESS) text = nullptr;
  }
  if (name && text) return fmt::format("{} ({})", name, text);
  if (name) return name;
  return fmt::format("CUresult {}", result);
}

void check(CUresult result, const std::string& what) {
  if (result != CUDA_SUCCESS)
    throw Error(ErrorKind::kIo, fmt::format("{} failed: {}", what, result_text(result)));
}

CUstreamCaptureStatus stream_capture_status(CUstream stream) {
  if (!cuda_driver_attempted()) return CU_STREAM_CAPTURE_STATUS_NONE;
  const Driver& d = cuda_driver();
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  if (d.cuStreamGetCaptureInfo_v3)
    check(d.cuStreamGetCaptureInfo_v3(stream, &status, nullptr, nullptr, nullptr, nullptr, nullptr),
          "cuStreamGetCaptureInfo");
  else if (d.cuStreamGetCaptureInfo_v2)
    check(d.cuStreamGetCaptureInfo_v2(stream, &status, nullptr, nullptr, nullptr, nullptr),
          "cuStreamGetCaptureInfo");
  else
    throw Error(ErrorKind::kUnsupported,
                "the NVIDIA driver has no cuStreamGetCaptureInfo: cannot tell whether a CUDA "
                "graph capture is in progress; declare it with set_capturing instead");
  return status;
}

ScopedContext::ScopedContext(CUcontext ctx) {
  const Driver& d = cuda_driver();
  CUcontext current = nullptr;
  check(d.cuCtxGetCurrent(&current), "cuCtxGetCurrent");
  if (current == ctx) return;
  check(d.cuCtxPushCurrent(ctx), "cuCtxPushCurrent");
  pushed_ = true;
}

ScopedContext::~ScopedContext() {
  if (!pushed_) return;
  CUcontext popped = nullptr;
  cuda_driver().cuCtxPopCurrent(&popped);  // nothing useful to do on failure in a destructor
}

}  // namespace kh::cuda
