#include "kernels/common/package_host.h"

#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>

namespace khk {

namespace {
const kh_host_v1_t* g_host = nullptr;  // written once by the entry point, read by every op
}  // namespace

// The ABI 1.0 table (through `launch`): what every op needs. Services of later minors (gemm,
// tensor_map) are checked where they are called, so a package built against a newer header still
// loads under an older loader and does without them (or fails that op with a clear message).
constexpr size_t kHostV1_0Size = offsetof(kh_host_v1_t, launch) + sizeof(void*);

bool accept_host(const kh_host_v1_t* h, const char* package) {
  if (!h) return false;
  if (h->h.abi_major != KH_ABI_MAJOR || h->h.struct_size < kHostV1_0Size) {
    // Only call set_error when the table is new enough to have it.
    if (h->h.abi_major == KH_ABI_MAJOR &&
        h->h.struct_size >= offsetof(kh_host_v1_t, set_error) + sizeof(h->set_error) &&
        h->set_error) {
      char msg[256];
      snprintf(msg, sizeof msg,
               "%s needs a kernel-hub host table of ABI %d.0 or newer (got %u.%u, %u bytes); "
               "update the loader",
               package, KH_ABI_MAJOR, h->h.abi_major, h->h.abi_minor, h->h.struct_size);
      h->set_error(h->ctx, msg);
    }
    return false;
  }
  __atomic_store_n(&g_host, h, __ATOMIC_RELEASE);
  return true;
}

const kh_host_v1_t* host() {
  return __atomic_load_n(&g_host, __ATOMIC_ACQUIRE);
}

int32_t fail(int32_t status, const char* fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  const kh_host_v1_t* h = host();
  if (h && h->set_error) h->set_error(h->ctx, msg);
  return status;
}

int32_t launch_kernel(int32_t device_id, const char* kernel, const LaunchDims& dims, void** params,
                      void* stream) {
  const kh_host_v1_t* h = host();
  if (!h) return fail(KH_ERR_INTERNAL, "%s: the package was used before kh_module_v1 ran", kernel);
  void* fn = nullptr;
  int32_t status = h->get_function(h->ctx, device_id, kernel, &fn);
  if (status != KH_OK) return status;  // the loader has set the error
  // PDL only relaxes stream order for a kernel that waits for its predecessor itself: an older
  // loader, which would refuse the flag, launches it in plain order instead.
  uint32_t flags = dims.flags;
  if (h->h.abi_minor < 1) flags &= ~KH_LAUNCH_PDL;
  const bool needs_1_1 = flags || dims.cluster[0] || dims.cluster[1] || dims.cluster[2];
  if (needs_1_1 && h->h.abi_minor < 1)
    return fail(KH_ERR_UNSUPPORTED,
                "%s: a cluster or launch flags need a kernel-hub loader of ABI 1.1 or newer (this "
                "one is %u.%u); update kernel-hub",
                kernel, h->h.abi_major, h->h.abi_minor);
  kh_launch_cfg_t cfg = {KH_HEADER_INIT(kh_launch_cfg_t),
                         {dims.grid[0], dims.grid[1], dims.grid[2]},
                         {dims.block[0], dims.block[1], dims.block[2]},
                         dims.shared_mem_bytes,
                         device_id,
                         {dims.cluster[0], dims.cluster[1], dims.cluster[2]},
                         flags};
  return h->launch(h->ctx, fn, &cfg, params, stream);
}

int32_t launch_reduce_partials(int32_t device_id, const char* kernel, const float* ws,
                               long long sws, int walkers, int cols, int k, void* out0, void* out1,
                               void* stream) {
  void* params[] = {&ws, &sws, &walkers, &cols, &k, &out0, &out1};
  LaunchDims dims;
  dims.flags = kPdlEntry;
  dims.grid[0] = static_cast<uint32_t>((int64_t{k} * cols + 31) / 32);
  dims.block[0] = 32;
  dims.block[1] = 32;  // row slices (reduce_partials.cuh: at most KH_REDUCE_MAX_SLICES)
  return launch_kernel(device_id, kernel, dims, params, stream);
}

bool device_info(int32_t device_id, kh_device_info_t* info) {
  const kh_host_v1_t* h = host();
  if (!h || h->h.abi_minor < 4 || h->h.struct_size < KH_HOST_V1_4_SIZE || !h->device_info)
    return false;
  kh_device_info_t answer = {};
  answer.h = KH_HEADER_INIT(kh_device_info_t);
  if (h->device_info(h->ctx, device_id, &answer) != KH_OK) return false;
  *info = answer;
  return true;
}

}  // namespace khk
