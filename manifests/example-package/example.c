/* kernel-hub/example: the smallest real kernel package, packed into the embedded default hub so
 * that a fresh machine can pull, resolve and bind something with no server. One layer, "Copy"
 * (y = x, float32, cpu tensors), with forward, forward_train and backward (dx = dy). C only, no
 * libstdc++, exports kh_module_v1 alone (example.map). */
#include <stdint.h>
#include <string.h>

#include "kernel_hub/kernel_hub_abi.h"

static const kh_host_v1_t* g_host;

static int32_t fail(int32_t status, const char* msg) {
  const kh_host_v1_t* h = __atomic_load_n(&g_host, __ATOMIC_ACQUIRE);
  if (h) h->set_error(h->ctx, msg);
  return status;
}

static int64_t numel(const DLTensor* t) {
  int64_t n = 1;
  if (t->ndim < 0 || t->ndim > 16 || (t->ndim > 0 && !t->shape)) return -1;
  for (int32_t d = t->ndim - 1; d >= 0; --d) {
    if (t->shape[d] < 0) return -1;
    if (t->strides && t->shape[d] > 1 && t->strides[d] != n) return -1;
    n *= t->shape[d];
  }
  return n;
}

/* copy(Tensor x, Tensor(a!) y) -> () */
static int32_t copy_op(const kh_arg_t* args, int32_t nargs, void* stream) {
  (void)stream;
  if (nargs != 2 || !args || args[0].kind != KH_ARG_TENSOR || args[1].kind != KH_ARG_TENSOR)
    return fail(KH_ERR_INVALID_ARGUMENT, "copy: expected (Tensor x, Tensor y)");
  const DLTensor* x = args[0].v.t;
  const DLTensor* y = args[1].v.t;
  if (x->device.device_type != kDLCPU || y->device.device_type != kDLCPU)
    return fail(KH_ERR_UNSUPPORTED, "copy: cpu tensors only");
  if (x->dtype.code != kDLFloat || x->dtype.bits != 32 || y->dtype.code != kDLFloat ||
      y->dtype.bits != 32)
    return fail(KH_ERR_UNSUPPORTED, "copy: float32 only");
  int64_t n = numel(x);
  if (n < 0 || n != numel(y)) return fail(KH_ERR_INVALID_ARGUMENT, "copy: shapes differ");
  memmove((char*)y->data + y->byte_offset, (const char*)x->data + x->byte_offset,
          (size_t)n * sizeof(float));
  return KH_OK;
}

#define HEADER(type) \
  { (uint32_t)sizeof(type), (uint16_t)KH_ABI_MAJOR, (uint16_t)KH_ABI_MINOR }
#define FLAGS (KH_FLAG_GRAPH_SAFE | KH_FLAG_DETERMINISTIC)

static const kh_op_v1_t kOps[] = {
    {HEADER(kh_op_v1_t), "copy", "copy(Tensor x, Tensor(a!) y) -> ()", FLAGS, copy_op},
    {HEADER(kh_op_v1_t), "copy_backward", "copy_backward(Tensor dy, Tensor(a!) dx) -> ()", FLAGS,
     copy_op},
};

static const kh_layer_v1_t kLayers[] = {
    {HEADER(kh_layer_v1_t), "Copy", "copy", "copy", "copy_backward", FLAGS | KH_FLAG_HAS_BACKWARD,
     KH_DTYPE_FP32},
};

static const kh_module_v1_t kModule = {HEADER(kh_module_v1_t),
                                       "kernel-hub/example",
                                       "1.0.0",
                                       "kernel-hub example package",
                                       1,
                                       kLayers,
                                       2,
                                       kOps,
                                       NULL};

KH_MODULE_ENTRY(h) {
  if (!h || h->h.abi_major != KH_ABI_MAJOR || h->h.struct_size < sizeof(kh_host_v1_t)) return NULL;
  __atomic_store_n(&g_host, h, __ATOMIC_RELEASE);
  return &kModule;
}
