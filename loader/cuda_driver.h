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
struct CUevent_st;
using CUevent = CUevent_st*;
struct CUgraphExec_st;
using CUgraphExec = CUgraphExec_st*;
using CUstreamCaptureMode = int;
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
constexpr CUdevice_attribute CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE = 36;        // kHz
constexpr CUdevice_attribute CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH = 37;  // bits
constexpr CUdevice_attribute CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75;
constexpr CUdevice_attribute CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76;
constexpr CUdevice_attribute CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR = 39;
constexpr CUdevice_attribute CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR = 81;
constexpr CUdevice_attribute CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR = 82;
constexpr CUdevice_attribute CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97;
constexpr CUdevice_attribute CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK = 111;
constexpr CUlibraryOption CU_LIBRARY_BINARY_IS_PRESERVED = 1;
constexpr CUstreamCaptureStatus CU_STREAM_CAPTURE_STATUS_NONE = 0;
constexpr CUstreamCaptureStatus CU_STREAM_CAPTURE_STATUS_ACTIVE = 1;
constexpr CUstreamCaptureStatus CU_STREAM_CAPTURE_STATUS_INVALIDATED = 2;
constexpr cuuint64_t CU_GET_PROC_ADDRESS_DEFAULT = 0;
constexpr CUdriverProcAddressQueryResult CU_GET_PROC_ADDRESS_SUCCESS = 0;
constexpr CUdriverProcAddressQueryResult CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1;
constexpr CUdriverProcAddressQueryResult CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT = 2;
constexpr unsigned CU_STREAM_NON_BLOCKING = 1;
constexpr unsigned CU_EVENT_DEFAULT = 0;
constexpr CUstreamCaptureMode CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1;
constexpr CUresult CUDA_ERROR_OUT_OF_MEMORY = 2;
constexpr int CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8;
constexpr int CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED = 14;

// cuLaunchKernelEx's configuration (CUDA 12.0+), with the two attributes the loader sets.
using CUlaunchAttributeID = int;
constexpr CUlaunchAttributeID CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION = 4;
constexpr CUlaunchAttributeID CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6;
union CUlaunchAttributeValue {
  alignas(8) char pad[64];  // cuda.h pads the union to 64 bytes; its largest members hold pointers
  struct {
    unsigned x, y, z;
  } clusterDim;
  int programmaticStreamSerializationAllowed;
};
struct CUlaunchAttribute {
  CUlaunchAttributeID id;
  char pad[8 - sizeof(CUlaunchAttributeID)];
  CUlaunchAttributeValue value;
};
struct CUlaunchConfig {
  unsigned gridDimX, gridDimY, gridDimZ;
  unsigned blockDimX, blockDimY, blockDimZ;
  unsigned sharedMemBytes;
  CUstream hStream;
  CUlaunchAttribute* attrs;
  unsigned numAttrs;
};
static_assert(sizeof(CUlaunchAttributeValue) == 64 && sizeof(CUlaunchAttribute) == 72 &&
              sizeof(CUlaunchConfig) == 56);

// cuTensorMapEncodeTiled's types (CUDA 12.0+): the opaque 128-byte descriptor and the enum values
// the tensor-map service (loader/tensor_map_service.h) passes. cuda.h aligns CUtensorMap to 128;
// the driver requires 64, which is what kh_tensor_map_t's callers promise.
struct CUtensorMap {
  alignas(64) cuuint64_t opaque[16];
};
static_assert(sizeof(CUtensorMap) == 128);
using cuuint32_t = uint32_t;
using CUtensorMapDataType = int;
using CUtensorMapInterleave = int;
using CUtensorMapSwizzle = int;
using CUtensorMapL2promotion = int;
using CUtensorMapFloatOOBfill = int;
constexpr CUtensorMapDataType CU_TENSOR_MAP_DATA_TYPE_FLOAT16 = 6;
constexpr CUtensorMapDataType CU_TENSOR_MAP_DATA_TYPE_FLOAT32 = 7;
constexpr CUtensorMapDataType CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 = 9;
constexpr CUtensorMapInterleave CU_TENSOR_MAP_INTERLEAVE_NONE = 0;
constexpr CUtensorMapSwizzle CU_TENSOR_MAP_SWIZZLE_NONE = 0;
constexpr CUtensorMapSwizzle CU_TENSOR_MAP_SWIZZLE_32B = 1;
constexpr CUtensorMapSwizzle CU_TENSOR_MAP_SWIZZLE_64B = 2;
constexpr CUtensorMapSwizzle CU_TENSOR_MAP_SWIZZLE_128B = 3;
constexpr CUtensorMapL2promotion CU_TENSOR_MAP_L2_PROMOTION_L2_256B = 3;
constexpr CUtensorMapFloatOOBfill CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE = 0;  // out of bounds reads 0

// The oldest driver API the loader asks cuGetProcAddress for: cuLibrary* needs CUDA 12.0.
constexpr int kMinDriverCudaVersion = 12000;
// The newest API version whose signatures the declarations below match.
constexpr int kMaxRequestedCudaVersion = 13000;

// clang-format off
// The driver entry points the loader and its tests call, each named once: X(name, (parameters));
// every one returns CUresult and is resolved by its name through cuGetProcAddress.
// Required: always set once cuda_driver() returned.
#define KH_CUDA_REQUIRED(X)                                                                     \
  X(cuInit, (unsigned flags))                                                                   \
  X(cuDeviceGetCount, (int* count))                                                             \
  X(cuDeviceGet, (CUdevice* device, int ordinal))                                               \
  X(cuDeviceGetName, (char* name, int len, CUdevice dev))                                       \
  X(cuDeviceGetAttribute, (int* value, CUdevice_attribute attrib, CUdevice dev))                \
  X(cuDeviceTotalMem, (size_t* bytes, CUdevice dev))                                            \
  X(cuDevicePrimaryCtxRetain, (CUcontext* ctx, CUdevice dev))                                   \
  X(cuCtxGetCurrent, (CUcontext* ctx))                                                          \
  X(cuCtxPushCurrent, (CUcontext ctx))                                                          \
  X(cuCtxPopCurrent, (CUcontext* ctx))                                                          \
  X(cuLibraryLoadData,                                                                          \
    (CUlibrary* library, const void* code, CUjit_option* jit_options, void** jit_option_values, \
     unsigned num_jit_options, CUlibraryOption* library_options, void** library_option_values,  \
     unsigned num_library_options))                                                             \
  X(cuLibraryGetKernel, (CUkernel* kernel, CUlibrary library, const char* name))                \
  X(cuKernelGetFunction, (CUfunction* fn, CUkernel kernel))                                     \
  X(cuLaunchKernel,                                                                             \
    (CUfunction f, unsigned grid_x, unsigned grid_y, unsigned grid_z, unsigned block_x,         \
     unsigned block_y, unsigned block_z, unsigned shared_mem_bytes, CUstream stream,            \
     void** kernel_params, void** extra))
// Optional: null when the driver lacks them. Error texts, then memory and streams (the package
// loader itself never allocates; the device API (device_api.h), tests and tools use these),
// function attributes, cuLaunchKernelEx (clusters and PDL; a plain launch keeps cuLaunchKernel),
// then the device API's async copies, events and CUDA graphs, and the tensor-map service's
// encoder (TMA descriptors).
#define KH_CUDA_OPTIONAL(X)                                         \
  X(cuGetErrorName, (CUresult error, const char** text))            \
  X(cuGetErrorString, (CUresult error, const char** text))          \
  X(cuMemAlloc, (CUdeviceptr* ptr, size_t bytes))                   \
  X(cuMemFree, (CUdeviceptr ptr))                                   \
  X(cuMemcpyHtoD, (CUdeviceptr dst, const void* src, size_t bytes)) \
  X(cuMemcpyDtoH, (void* dst, CUdeviceptr src, size_t bytes))       \
  X(cuMemsetD32, (CUdeviceptr dst, unsigned value, size_t count))   \
  X(cuStreamCreate, (CUstream* stream, unsigned flags))             \
  X(cuStreamSynchronize, (CUstream stream))                         \
  X(cuStreamDestroy, (CUstream stream))                             \
  X(cuFuncSetAttribute, (CUfunction fn, int attrib, int value))     \
  X(cuLaunchKernelEx,                                               \
    (const CUlaunchConfig* config, CUfunction f, void** kernel_params, void** extra)) \
  X(cuMemGetInfo, (size_t* free_bytes, size_t* total_bytes))                  \
  X(cuMemcpyHtoDAsync,                                                        \
    (CUdeviceptr dst, const void* src, size_t bytes, CUstream stream))        \
  X(cuMemcpyDtoHAsync, (void* dst, CUdeviceptr src, size_t bytes, CUstream stream)) \
  X(cuMemcpyDtoDAsync,                                                        \
    (CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream stream))        \
  X(cuMemsetD8Async, (CUdeviceptr dst, unsigned char value, size_t count, CUstream stream)) \
  X(cuStreamWaitEvent, (CUstream stream, CUevent event, unsigned flags))      \
  X(cuEventCreate, (CUevent* event, unsigned flags))                          \
  X(cuEventRecord, (CUevent event, CUstream stream))                          \
  X(cuEventSynchronize, (CUevent event))                                      \
  X(cuEventElapsedTime, (float* ms, CUevent start, CUevent end))              \
  X(cuEventDestroy, (CUevent event))                                          \
  X(cuStreamBeginCapture, (CUstream stream, CUstreamCaptureMode mode))        \
  X(cuStreamEndCapture, (CUstream stream, CUgraph* graph))                    \
  X(cuGraphInstantiateWithFlags,                                              \
    (CUgraphExec* exec, CUgraph graph, unsigned long long flags))             \
  X(cuGraphLaunch, (CUgraphExec exec, CUstream stream))                       \
  X(cuGraphExecDestroy, (CUgraphExec exec))                                   \
  X(cuGraphDestroy, (CUgraph graph))                                          \
  X(cuTensorMapEncodeTiled,                                                   \
    (CUtensorMap* map, CUtensorMapDataType dtype, cuuint32_t rank, void* address, \
     const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box,  \
     const cuuint32_t* element_strides, CUtensorMapInterleave interleave,       \
     CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2_promotion,           \
     CUtensorMapFloatOOBfill oob_fill))
// clang-format on

struct Driver {
  int driver_version = 0;     // cuDriverGetVersion: 1000 * major + 10 * minor
  int requested_version = 0;  // the version passed to cuGetProcAddress

#define KH_CUDA_FIELD(name, params) CUresult(*name) params = nullptr;
  KH_CUDA_REQUIRED(KH_CUDA_FIELD)
  KH_CUDA_OPTIONAL(KH_CUDA_FIELD)
#undef KH_CUDA_FIELD

  // Optional, one name with two signatures: cuStreamGetCaptureInfo at CUDA 12.3+ is _v3, on
  // older drivers _v2 (no edge data); the one matching the requested version is set.
  CUresult (*cuStreamGetCaptureInfo_v3)(CUstream stream, CUstreamCaptureStatus* status,
                                        cuuint64_t* id, CUgraph* graph, const CUgraphNode** deps,
                                        const CUgraphEdgeData** edge_data,
                                        size_t* num_deps) = nullptr;
  CUresult (*cuStreamGetCaptureInfo_v2)(CUstream stream, CUstreamCaptureStatus* status,
                                        cuuint64_t* id, CUgraph* graph, const CUgraphNode** deps,
                                        size_t* num_deps) = nullptr;
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
  // What one multiprocessor holds (the device-info service, ABI 1.4, hands these to packages).
  int max_threads_per_multiprocessor = 0;
  int registers_per_multiprocessor = 0;
  int shared_memory_per_multiprocessor = 0;  // bytes
  int shared_memory_per_block_optin = 0;     // bytes
  int shared_memory_reserved_per_block = 0;  // bytes
  CUcontext primary_context = nullptr;       // retained once, never released
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
