// Host library of @KH_PACKAGE@: one layer, Scale (y = alpha * x, fp32), with a backward op
// (dx = alpha * dy). The loader calls kh_module_v1 once and binds layers from the table it
// returns; ops check their DLPack arguments, then run the loop below on cpu tensors or launch
// @KH_NAME@.cu's kernel through the loader on cuda tensors (no CUDA runtime is linked: the loader
// owns device code). The ABI and its rules: kernel_hub/kernel_hub_abi.h.
//
// To grow it: add ops to kOps (a name and a schema string each), layers to kLayers (the ops
// they use in eval, train and backward), kernels to @KH_NAME@.cu; `cmake --build build`
// rewrites kernel.json's layers from this table.
#include <stdint.h>
#include <stdio.h>

#include <atomic>

#include "kernel_hub/kernel_hub_abi.h"

namespace {

// The loader's services, set by kh_module_v1 before any op runs.
std::atomic<const kh_host_v1_t*> g_host{nullptr};

// Reports "op: message" through the loader and returns `status`.
int32_t fail(int32_t status, const char* op, const char* message) {
  char line[256];
  snprintf(line, sizeof line, "%s: %s", op, message);
  const kh_host_v1_t* host = g_host.load();
  host->set_error(host->ctx, line);
  return status;
}

// Elements of a dense tensor (no strides, or row-major strides); -1 for other layouts.
int64_t dense_numel(const DLTensor* t) {
  int64_t n = 1;
  for (int32_t d = t->ndim - 1; d >= 0; --d) {
    if (t->shape[d] < 0) return -1;
    if (t->strides && t->shape[d] > 1 && t->strides[d] != n) return -1;
    n *= t->shape[d];
  }
  return n;
}

bool is_fp32(const DLTensor* t) {
  return t->dtype.code == kDLFloat && t->dtype.bits == 32 && t->dtype.lanes == 1;
}

// out = alpha * in, for `op` called as op(Tensor in, float alpha, Tensor(a!) out).
int32_t scale(const char* op, const kh_arg_t* args, int32_t nargs, void* stream) {
  if (nargs != 3 || args[0].kind != KH_ARG_TENSOR || args[1].kind != KH_ARG_FLOAT ||
      args[2].kind != KH_ARG_TENSOR)
    return fail(KH_ERR_INVALID_ARGUMENT, op, "expected (Tensor, float alpha, Tensor out)");
  const DLTensor* in = args[0].v.t;
  const DLTensor* out = args[2].v.t;
  if (!is_fp32(in) || !is_fp32(out)) return fail(KH_ERR_UNSUPPORTED, op, "fp32 tensors only");
  const int64_t n = dense_numel(in);
  if (n < 0 || n != dense_numel(out))
    return fail(KH_ERR_INVALID_ARGUMENT, op, "the tensors must be dense and of the same size");
  if (in->device.device_type != out->device.device_type ||
      in->device.device_id != out->device.device_id)
    return fail(KH_ERR_INVALID_ARGUMENT, op, "the tensors are on different devices");
  float alpha = static_cast<float>(args[1].v.f);
  const float* x =
      reinterpret_cast<const float*>(static_cast<const char*>(in->data) + in->byte_offset);
  float* y = reinterpret_cast<float*>(static_cast<char*>(out->data) + out->byte_offset);

  if (in->device.device_type == kDLCPU) {
    for (int64_t i = 0; i < n; ++i) y[i] = alpha * x[i];
    return KH_OK;
  }
  if (in->device.device_type != kDLCUDA)
    return fail(KH_ERR_UNSUPPORTED, op, "cpu and cuda tensors only");
  if (n == 0) return KH_OK;
  // The kernel from @KH_NAME@.cu (a packaged cubin, or NVRTC output for this GPU).
  const kh_host_v1_t* host = g_host.load();
  const int32_t device = in->device.device_id;
  void* fn = nullptr;
  int32_t status = host->get_function(host->ctx, device, "scale_fp32", &fn);
  if (status != KH_OK) return status;  // the loader has set the error
  const int64_t blocks = (n + 255) / 256;
  if (blocks > 0x7FFFFFFF) return fail(KH_ERR_UNSUPPORTED, op, "too many elements for one launch");
  kh_launch_cfg_t cfg = {KH_HEADER_INIT(kh_launch_cfg_t),
                         {static_cast<uint32_t>(blocks), 1, 1},
                         {256, 1, 1},
                         0,
                         device,
                         {0, 0, 0},  // no thread block cluster
                         0};         // no launch flags (KH_LAUNCH_*)
  long long count = n;
  void* params[] = {&x, &alpha, &y, &count};  // scale_fp32's parameters, in order
  return host->launch(host->ctx, fn, &cfg, params, stream);
}

// scale(Tensor x, float alpha, Tensor(a!) y) -> ()
int32_t scale_forward(const kh_arg_t* args, int32_t nargs, void* stream) {
  return scale("scale", args, nargs, stream);
}

// scale_backward(Tensor dy, float alpha, Tensor(a!) dx) -> (): dx = alpha * dy.
int32_t scale_backward(const kh_arg_t* args, int32_t nargs, void* stream) {
  return scale("scale_backward", args, nargs, stream);
}

constexpr uint32_t kFlags = KH_FLAG_GRAPH_SAFE | KH_FLAG_DETERMINISTIC;

const kh_op_v1_t kOps[] = {
    {KH_HEADER_INIT(kh_op_v1_t), "scale", "scale(Tensor x, float alpha, Tensor(a!) y) -> ()",
     kFlags, scale_forward},
    {KH_HEADER_INIT(kh_op_v1_t), "scale_backward",
     "scale_backward(Tensor dy, float alpha, Tensor(a!) dx) -> ()", kFlags, scale_backward},
};

// Scale: forward in eval and train (backward needs nothing saved), backward scale_backward.
const kh_layer_v1_t kLayers[] = {
    {KH_HEADER_INIT(kh_layer_v1_t), "Scale", "scale", nullptr, "scale_backward",
     kFlags | KH_FLAG_HAS_BACKWARD, KH_DTYPE_FP32},
};

// Name and version come from kernel.json.in (kernel_hub_add_package defines them).
const kh_module_v1_t kModule = {KH_HEADER_INIT(kh_module_v1_t),
                                KH_PACKAGE_NAME,
                                KH_PACKAGE_VERSION,
                                KH_PACKAGE_NAME " " KH_PACKAGE_VERSION,
                                sizeof kLayers / sizeof kLayers[0],
                                kLayers,
                                sizeof kOps / sizeof kOps[0],
                                kOps,
                                nullptr};

}  // namespace

// The package's one exported symbol. Idempotent, no GPU work, no exceptions.
KH_MODULE_ENTRY(host) {
  if (!host || host->h.abi_major != KH_ABI_MAJOR || host->h.struct_size < sizeof(kh_host_v1_t)) {
    if (host && host->h.abi_major == KH_ABI_MAJOR)
      host->set_error(host->ctx, KH_PACKAGE_NAME ": the loader's host table is too old");
    return nullptr;
  }
  g_host.store(host);
  return &kModule;
}
