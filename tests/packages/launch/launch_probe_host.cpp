// Host library of the launch-probe test package (tests/gpu/test_gpu_launch.cpp): each op launches
// launch_probe.cu's kernels through host->launch with one ABI 1.1 launch feature, so that the
// GPU tests can see what the loader's launch did:
//   cluster_info(Tensor(a!) out, int gx, int gy, int gz, int cx, int cy, int cz) -> ()
//       grid gx x gy x gz in clusters of cx x cy x cz; out: uint32 [gx*gy*gz*6]
//   pdl_pair(Tensor(a!) buf, Tensor(a!) out, int spin, int pdl, int wait) -> ()
//       probe_pdl_produce then probe_pdl_consume (with KH_LAUNCH_PDL when pdl != 0) on one stream
//   big_smem(Tensor(a!) out, int bytes) -> ()
//       one block per element of out, each with `bytes` of dynamic shared memory
// cuda tensors only; no libstdc++ use, no CUDA runtime (the toy package's build rules).
#include <stddef.h>
#include <stdint.h>

#include "kernel_hub/kernel_hub_abi.h"

namespace {

const kh_host_v1_t* g_host = nullptr;  // set once by the entry point

const kh_host_v1_t* host() {
  return __atomic_load_n(&g_host, __ATOMIC_ACQUIRE);
}

int32_t fail(int32_t status, const char* msg) {
  const kh_host_v1_t* h = host();
  if (h) h->set_error(h->ctx, msg);
  return status;
}

// A compact 1-d cuda tensor of 32-bit elements: its data pointer and element count.
int32_t u32_vector(const kh_arg_t& a, void** data, int64_t* n) {
  const DLTensor* t = a.kind == KH_ARG_TENSOR ? a.v.t : nullptr;
  if (!t || t->ndim != 1 || !t->shape || t->dtype.bits != 32 || t->dtype.lanes != 1 ||
      (t->strides && t->strides[0] != 1) || t->device.device_type != kDLCUDA)
    return fail(KH_ERR_INVALID_ARGUMENT, "expected a compact 1-d cuda tensor of 32-bit elements");
  *data = static_cast<char*>(t->data) + t->byte_offset;
  *n = t->shape[0];
  return KH_OK;
}

bool ints(const kh_arg_t* args, int32_t from, int32_t to) {
  for (int32_t i = from; i < to; ++i)
    if (args[i].kind != KH_ARG_INT) return false;
  return true;
}

kh_launch_cfg_t make_cfg(int32_t device, uint32_t gx, uint32_t gy, uint32_t gz, uint32_t block) {
  kh_launch_cfg_t cfg = {};
  cfg.h = KH_HEADER_INIT(kh_launch_cfg_t);
  cfg.grid[0] = gx;
  cfg.grid[1] = gy;
  cfg.grid[2] = gz;
  cfg.block[0] = block;
  cfg.block[1] = 1;
  cfg.block[2] = 1;
  cfg.device_id = device;
  return cfg;
}

int32_t launch(int32_t device, const char* kernel, const kh_launch_cfg_t& cfg, void** params,
               void* stream) {
  const kh_host_v1_t* h = host();
  void* fn = nullptr;
  int32_t status = h->get_function(h->ctx, device, kernel, &fn);
  if (status != KH_OK) return status;  // the loader has set the error
  return h->launch(h->ctx, fn, &cfg, params, stream);
}

int32_t cluster_info(const kh_arg_t* args, int32_t nargs, void* stream) {
  if (nargs != 7 || !ints(args, 1, 7))
    return fail(KH_ERR_INVALID_ARGUMENT, "cluster_info(Tensor out, int gx, gy, gz, cx, cy, cz)");
  void* out = nullptr;
  int64_t n = 0;
  if (int32_t s = u32_vector(args[0], &out, &n); s != KH_OK) return s;
  const int64_t gx = args[1].v.i, gy = args[2].v.i, gz = args[3].v.i;
  if (gx <= 0 || gy <= 0 || gz <= 0 || n != gx * gy * gz * 6)
    return fail(KH_ERR_INVALID_ARGUMENT, "cluster_info: out must hold 6 words per block");
  kh_launch_cfg_t cfg = make_cfg(args[0].v.t->device.device_id, static_cast<uint32_t>(gx),
                                 static_cast<uint32_t>(gy), static_cast<uint32_t>(gz), 32);
  for (int i = 0; i < 3; ++i) cfg.cluster[i] = static_cast<uint32_t>(args[4 + i].v.i);
  void* params[] = {&out};
  return launch(cfg.device_id, "probe_cluster_info", cfg, params, stream);
}

int32_t pdl_pair(const kh_arg_t* args, int32_t nargs, void* stream) {
  if (nargs != 5 || !ints(args, 2, 5))
    return fail(KH_ERR_INVALID_ARGUMENT, "pdl_pair(Tensor buf, Tensor out, int spin, pdl, wait)");
  void *buf = nullptr, *out = nullptr;
  int64_t n = 0, n_out = 0;
  if (int32_t s = u32_vector(args[0], &buf, &n); s != KH_OK) return s;
  if (int32_t s = u32_vector(args[1], &out, &n_out); s != KH_OK) return s;
  if (n != n_out || n <= 0 || n > 0x7fffffff)
    return fail(KH_ERR_INVALID_ARGUMENT, "pdl_pair: buf and out must have the same size");
  const int32_t device = args[0].v.t->device.device_id;
  unsigned count = static_cast<unsigned>(n);
  long long spin = args[2].v.i;
  int wait = args[4].v.i != 0;
  const uint32_t blocks = static_cast<uint32_t>((n + 255) / 256);
  kh_launch_cfg_t first = make_cfg(device, blocks, 1, 1, 256);
  void* produce[] = {&buf, &count, &spin};
  if (int32_t s = launch(device, "probe_pdl_produce", first, produce, stream); s != KH_OK) return s;
  kh_launch_cfg_t second = make_cfg(device, blocks, 1, 1, 256);
  if (args[3].v.i) second.flags = KH_LAUNCH_PDL;
  void* consume[] = {&buf, &out, &count, &wait};
  return launch(device, "probe_pdl_consume", second, consume, stream);
}

int32_t big_smem(const kh_arg_t* args, int32_t nargs, void* stream) {
  if (nargs != 2 || !ints(args, 1, 2))
    return fail(KH_ERR_INVALID_ARGUMENT, "big_smem(Tensor out, int bytes)");
  void* out = nullptr;
  int64_t n = 0;
  if (int32_t s = u32_vector(args[0], &out, &n); s != KH_OK) return s;
  if (n <= 0 || args[1].v.i < 0 || args[1].v.i % 4 || args[1].v.i > 0x7fffffff)
    return fail(KH_ERR_INVALID_ARGUMENT, "big_smem: bytes must be a multiple of 4");
  unsigned bytes = static_cast<unsigned>(args[1].v.i);
  kh_launch_cfg_t cfg =
      make_cfg(args[0].v.t->device.device_id, static_cast<uint32_t>(n), 1, 1, 256);
  cfg.shared_mem_bytes = bytes;
  void* params[] = {&out, &bytes};
  return launch(cfg.device_id, "probe_big_smem", cfg, params, stream);
}

const kh_op_v1_t kOps[] = {
    {KH_HEADER_INIT(kh_op_v1_t), "cluster_info",
     "cluster_info(Tensor(a!) out, int gx, int gy, int gz, int cx, int cy, int cz) -> ()", 0,
     cluster_info},
    {KH_HEADER_INIT(kh_op_v1_t), "pdl_pair",
     "pdl_pair(Tensor(a!) buf, Tensor(b!) out, int spin, int pdl, int wait) -> ()", 0, pdl_pair},
    {KH_HEADER_INIT(kh_op_v1_t), "big_smem", "big_smem(Tensor(a!) out, int bytes) -> ()", 0,
     big_smem},
};

const kh_layer_v1_t kLayers[] = {
    {KH_HEADER_INIT(kh_layer_v1_t), "LaunchProbe", "cluster_info", nullptr, nullptr, 0,
     KH_DTYPE_FP32},
};

const kh_module_v1_t kModule = {KH_HEADER_INIT(kh_module_v1_t),
                                "launch-probe",
                                "1.0.0",
                                "launch-probe-test-package",
                                1,
                                kLayers,
                                3,
                                kOps,
                                nullptr};

}  // namespace

KH_MODULE_ENTRY(h) {
  if (!h || h->h.abi_major != KH_ABI_MAJOR || h->h.struct_size < sizeof(kh_host_v1_t))
    return nullptr;
  if (h->h.abi_minor < 1) {  // clusters and launch flags: an ABI 1.0 loader would ignore them
    h->set_error(h->ctx, "launch-probe needs a kernel-hub loader of ABI 1.1 or newer");
    return nullptr;
  }
  __atomic_store_n(&g_host, h, __ATOMIC_RELEASE);
  return &kModule;
}
