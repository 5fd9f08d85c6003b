// The CUDA driver (libcuda.so.1), loaded lazily: nothing here touches the driver until the first
// call of cuda_driver() (the first GPU use). Entry points come from cuGetProcAddress, so the
// build needs no CUDA headers or libraries: the few types, values and prototypes used are
// declared below, with values taken from CUDA 13.0's cuda.h.
//
// Without a driver (no libcuda.so.1, cuInit failing, no device) cuda_driver() throws kh::Error
// naming the cause and suggesting the cpu device; it never crashes. The failure is remembered:
// later calls throw the same error without retrying.
//
// Test hook: KERNEL_HUB_LIBCUDA names another driver library (a path or soname) to open instead
// of libcuda.so.1, read once at first use.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kh::cuda {

// --- declarations mirroring cuda.h (CUDA 13.0) ---
using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
using cuuint64_t = uint64_t;
struct CUctx_st;
using CUcontext = CUctx_st*;
struct CUlib_st;
using CUlibrary = CUlib_st*;
struct CUkern_st;
using CUkernel = CUkern_st*;
struct CUfunc_st;
using CUfunction = CUfunc_st*;
struct CUstream_st;
using CUstream = CUstream_st*;
struct CUgraph_st;
using CUgraph = CUgraph_st*;
struct CUgraphNode_st;
using CUgraphNode = CUgraphNode_st*;
struct CUgraphEdgeData;
using CUjit_option = int;
using CUlibraryOption = int;
using CUdevice_attribute = int;
using CUstreamCaptureStatus = int;
using CUdriverProcAddressQueryResult = int;

constexpr CUresult CUDA_SUCCESS = 0;
constexpr CUresult CUDA_ERROR_INVALID_VALUE = 1;
constexpr CUresult CUDA_ERROR_NO_DEVICE = 100;
constexpr CUresult CUDA_ERROR_NOT_FOUND = 500;
constexpr CUdevice_attribute CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16;
constexpr CUdevice_attribute CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75;
constexpr CUdevice_attribute CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76;
constexpr CUlibraryOption CU_LIBRARY_BINARY_IS_PRESERVED = 1;
constexpr CUstreamCaptureStatus CU_STREAM_CAPTURE_STATUS_NONE = 0;
constexpr CUstreamCaptureStatus CU_STREAM_CAPTURE_STATUS_ACTIVE = 1;
constexpr CUstreamCaptureStatus CU_STREAM_CAPTURE_STATUS_INVALIDATED = 2;
constexpr cuuint64_t CU_GET_PROC_ADDRESS_DEFAULT = 0;
constexpr CUdriverProcAddressQueryResult CU_GET_PROC_ADDRESS_SUCCESS = 0;
constexpr CUdriverProcAddressQueryResult CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1;
constexpr CUdriverProcAddressQueryResult CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT = 2;
constexpr unsigned CU_STREAM_NON_BLOCKING = 1;

// The oldest driver API the loader asks cuGetProcAddress for: cuLibrary* needs CUDA 12.0.
constexpr int kMinDriverCudaVersion = 12000;
// The newest API version whose signatures the declarations below match.
constexpr int kMaxRequestedCudaVersion = 13000;

// Entry points. Required ones are always set once cuda_driver() returned; optional ones
// (marked) may be null on older drivers.
struct Driver {
  int driver_version = 0;     // cuDriverGetVersion: 1000 * major + 10 * minor
  int requested_version = 0;  // the version passed to cuGetProcAddress

  CUresult (*cuInit)(unsigned flags) = nullptr;
  CUresult (*cuDeviceGetCount)(int* count) = nullptr;
  CUresult (*cuDeviceGet)(CUdevice* device, int ordinal) = nullptr;
  CUresult (*cuDeviceGetName)(char* name, int len, CUdevice dev) = nullptr;
  CUresult (*cuDeviceGetAttribute)(int* value, CUdevice_attribute attrib, CUdevice dev) = nullptr;
  CUresult (*cuDeviceTotalMem)(size_t* bytes, CUdevice dev) = nullptr;
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext* ctx, CUdevice dev) = nullptr;
  CUresult (*cuCtxGetCurrent)(CUcontext* ctx) = nullptr;
  CUresult (*cuCtxPushCurrent)(CUcontext ctx) = nullptr;
  CUresult (*cuCtxPopCurrent)(CUcontext* ctx) = nullptr;
  CUresult (*cuLibraryLoadData)(CUlibrary* library, const void* code, CUjit_option* jit_options,
                                void** jit_option_values, unsigned num_jit_options,
                                CUlibraryOption* library_options, void** library_option_values,
                                unsigned num_library_options) = nullptr;
  CUresult (*cuLibraryGetKernel)(CUkernel* kernel, CUlibrary library, const char* name) = nullptr;
  CUresult (*cuKernelGetFunction)(CUfunction* fn, CUkernel kernel) = nullptr;
  CUresult (*cuLaunchKernel)(CUfunction f, unsigned grid_x, unsigned grid_y, unsigned grid_z,
                             unsigned block_x, unsigned block_y, unsigned block_z,
                             unsigned shared_mem_bytes, CUstream stream, void** kernel_params,
                             void** extra) = nullptr;

  // Optional.
  CUresult (*cuGetErrorName)(CUresult error, const char** text) = nullptr;
  CUresult (*cuGetErrorString)(CUresult error, const char** text) = nullptr;
  // cuStreamGetCaptureInfo_v3 (CUDA 12.3+) or, on older drivers, _v2 (no edge data).
  CUresult (*cuStreamGetCaptureInfo_v3)(CUstream stream, CUstreamCaptureStatus* status,
                                        cuuint64_t* id, CUgraph* graph, const CUgraphNode** deps,
                                        const CUgraphEdgeData** edge_data,
                                        size_t* num_deps) = nullptr;
  CUresult (*cuStreamGetCaptureInfo_v2)(CUstream stream, CUstreamCaptureStatus* status,
                                        cuuint64_t* id, CUgraph* graph, const CUgraphNode** deps,
                                        size_t* num_deps) = nullptr;
  // Memory and streams: the loader itself never allocates; tests and tools use these.
  CUresult (*cuMemAlloc)(CUdeviceptr* ptr, size_t bytes) = nullptr;
  CUresult (*cuMemFree)(CUdeviceptr ptr) = nullptr;
  CUresult (*cuMemcpyHtoD)(CUdeviceptr dst, const void* src, size_t bytes) = nullptr;
  CUresult (*cuMemcpyDtoH)(void* dst, CUdeviceptr src, size_t bytes) = nullptr;
  CUresult (*cuMemsetD32)(CUdeviceptr dst, unsigned value, size_t count) = nullptr;
  CUresult (*cuStreamCreate)(CUstream* stream, unsigned flags) = nullptr;
  CUresult (*cuStreamSynchronize)(CUstream stream) = nullptr;
  CUresult (*cuStreamDestroy)(CUstream stream) = nullptr;
};

// A CUDA device as the loader sees it.
struct DeviceInfo {
  int ordinal = -1;
  CUdevice handle = 0;
  std::string name;  // e.g. "NVIDIA H200"
  int sm_major = 0;
  int sm_minor = 0;
  size_t total_memory = 0;  // bytes
  int multiprocessors = 0;
  CUcontext primary_context = nullptr;  // retained once, never released
};

// Loads and initializes the driver on first use (std::call_once). Throws kh::Error
// (kNotFound: no driver library or no device; kUnsupported: too old a driver or a missing
// required entry point; kIo: cuInit failed) with the cause and what to do.
const Driver& cuda_driver();

// Whether cuda_driver() has been called (successfully or not) in this process. Never loads.
bool cuda_driver_attempted();

// Number of CUDA devices (loads the driver).
int device_count();

// Device `ordinal` with its primary context retained (once per device, then cached).
// Throws kh::Error(kNotFound) naming how many devices there are.
const DeviceInfo& device(int ordinal);

// "CUDA_ERROR_NO_BINARY_FOR_GPU (no kernel image is available for execution on the device)"
// when the driver can say, else "CUresult 209".
std::string result_text(CUresult result);

// Throws kh::Error(kIo) "<what> failed: <result_text>" unless result is CUDA_SUCCESS.
void check(CUresult result, const std::string& what);

// Capture state of `stream`: CU_STREAM_CAPTURE_STATUS_*. A process that never used the driver
// has no capture in progress: returns NONE without loading the driver. Throws when the query
// fails.
CUstreamCaptureStatus stream_capture_status(CUstream stream);

// Makes `ctx` current on this thread for the scope when another context (or none) is current.
class ScopedContext {
 public:
  explicit ScopedContext(CUcontext ctx);
  ~ScopedContext();
  ScopedContext(const ScopedContext&) = delete;
  ScopedContext& operator=(const ScopedContext&) = delete;

 private:
  bool pushed_ = false;
};

}  // namespace kh::cuda
