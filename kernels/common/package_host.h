// Host-library plumbing every kernel package shares: the host table the loader handed us, error
// reporting through host->set_error, launching device kernels through the loader, and the module
// table and kh_module_v1 entry built from a package's arrays of layers and ops (whose entries
// kernels/common/op_schema.h makes).
// Compiled into each package's host library (hidden visibility; nothing here is exported).
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "kernel_hub/kernel_hub_abi.h"

// Returns the status of `expr` from the enclosing function unless it is KH_OK.
#define KH_TRY(expr)                            \
  do {                                          \
    int32_t kh_status_ = (expr);                \
    if (kh_status_ != KH_OK) return kh_status_; \
  } while (0)

namespace khk {

// Validates the loader's host table (ABI major, struct size) and remembers it. Returns false
// after reporting through the table when it is too old for `package`.
bool accept_host(const kh_host_v1_t* h, const char* package);

// The table accepted by accept_host, or nullptr before the entry point ran.
const kh_host_v1_t* host();

// Reports a printf-style message through host->set_error and returns `status`.
int32_t fail(int32_t status, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

// Grid and block of one launch; a cluster and launch flags (KH_LAUNCH_PDL) need a loader of
// ABI 1.1 or newer (launch_kernel refuses them on an older one, which would ignore them).
struct LaunchDims {
  uint32_t grid[3] = {1, 1, 1};
  uint32_t block[3] = {1, 1, 1};
  uint32_t shared_mem_bytes = 0;
  uint32_t cluster[3] = {0, 0, 0};  // {0,0,0}: no cluster (sm_90+ only otherwise)
  uint32_t flags = 0;               // KH_LAUNCH_*
};

// The launch flags of a kernel whose first statement is kh_pdl_enter() (pdl.cuh): programmatic
// dependent launch, so that its blocks are resident and waiting when the kernel before it on the
// stream ends (launch_kernel drops it for a loader older than ABI 1.1, which keeps plain stream
// order: correct, only without the overlap).
constexpr uint32_t kPdlEntry = KH_LAUNCH_PDL;

// Looks up `kernel` for `device_id` through host->get_function and launches it on `stream`
// with `params` (pointers to each kernel parameter). The loader sets the error on failure.
int32_t launch_kernel(int32_t device_id, const char* kernel, const LaunchDims& dims, void** params,
                      void* stream);

// Launches a weight-gradient reduce, `kernel` being a KH_REDUCE_PARTIALS_KERNEL of
// kernels/common/reduce_partials.cuh: the fp32 rows [0, walkers) of `ws` (sws elements apart),
// k * cols columns each, summed in row order into out0 (the first cols columns) and out1 (the
// rest, k = 2), in the kernel's dtype. With 0 walkers it writes zeros.
int32_t launch_reduce_partials(int32_t device_id, const char* kernel, const float* ws,
                               long long sws, int walkers, int cols, int k, void* out0, void* out1,
                               void* stream);

// Asks the loader what CUDA device `device_id` holds (the device-info service, ABI 1.4) into
// *info. False, with *info untouched, where the loader is older or does not answer (no such
// device, no backend): the caller then plans with its own assumption (the loader's message
// stays recorded as this thread's last op error; the op that recovers returns KH_OK).
bool device_info(int32_t device_id, kh_device_info_t* info);

// Flags and dtypes every package so far declares for its ops and layers.
constexpr uint32_t kOpFlags = KH_FLAG_GRAPH_SAFE | KH_FLAG_DETERMINISTIC;
constexpr uint32_t kLayerFlags = KH_FLAG_HAS_BACKWARD | KH_FLAG_GRAPH_SAFE | KH_FLAG_DETERMINISTIC;
constexpr uint32_t kDtypes = KH_DTYPE_BF16 | KH_DTYPE_FP16 | KH_DTYPE_FP32;

// The module table the loader reads: the package's identity and its arrays of layers and ops.
template <size_t NumLayers, size_t NumOps>
constexpr kh_module_v1_t make_module(const char* name, const char* version, const char* build_id,
                                     const kh_layer_v1_t (&layers)[NumLayers],
                                     const kh_op_v1_t (&ops)[NumOps]) {
  return {KH_HEADER_INIT(kh_module_v1_t),
          name,
          version,
          build_id,
          static_cast<uint32_t>(NumLayers),
          layers,
          static_cast<uint32_t>(NumOps),
          ops,
          nullptr};
}

}  // namespace khk

// Defines the exported kh_module_v1 entry (at global scope) handing the loader `module`, a
// kh_module_v1_t made by make_module, once the host table is accepted for the package.
#define KH_PACKAGE_ENTRY(module)                                \
  KH_MODULE_ENTRY(host) {                                       \
    if (!khk::accept_host(host, (module).name)) return nullptr; \
    return &(module);                                           \
  }
