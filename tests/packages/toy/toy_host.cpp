// Host library of the toy test package: layer "Scale" (y = x * alpha + offset; offset is 0 in
// version 1.0.0 and 1 in 2.0.0, so two versions compute differently) with forward,
// forward_train and backward (dx = dy * alpha), and layer "ScaleInfer" without a backward op.
// cpu tensors run here; CUDA tensors go through host->get_function / host->launch on the
// package's toy.cu. No libstdc++ use, no CUDA runtime. Variants are selected by macros:
//   TOY_VERSION "x.y.z", TOY_OFFSET n, TOY_MINOR_PLUS (ABI minor + 1, larger structs),
//   TOY_ABI_MAJOR n (another major), TOY_NO_ENTRY (no kh_module_v1), TOY_LINK_FAKE_CUDART.
#include <stddef.h>
#include <stdint.h>

#include "kernel_hub/kernel_hub_abi.h"

#ifndef TOY_VERSION
#define TOY_VERSION "1.0.0"
#endif
#ifndef TOY_OFFSET
#define TOY_OFFSET 0
#endif
#ifndef TOY_ABI_MAJOR
#define TOY_ABI_MAJOR KH_ABI_MAJOR
#endif

#ifdef TOY_LINK_FAKE_CUDART
extern "C" int cudaGetDeviceCount(int* count);
#endif

namespace {

const kh_host_v1_t* g_host = nullptr;  // set once by the entry point

// kh_launch_cfg_t as ABI 1.0 declared it (the loader reads the prefix its struct_size covers).
struct toy_launch_cfg_v1_0_t {
  kh_header_t h;
  uint32_t grid[3];
  uint32_t block[3];
  uint32_t shared_mem_bytes;
  int32_t device_id;
};
static_assert(sizeof(toy_launch_cfg_v1_0_t) == KH_LAUNCH_CFG_V1_0_SIZE, "ABI 1.0 layout");

const kh_host_v1_t* host() {
  return __atomic_load_n(&g_host, __ATOMIC_ACQUIRE);
}

int32_t fail(int32_t status, const char* msg) {
  const kh_host_v1_t* h = host();
  if (h) h->set_error(h->ctx, msg);
  return status;
}

bool is_f32(const DLTensor* t) {
  return t->dtype.code == kDLFloat && t->dtype.bits == 32 && t->dtype.lanes == 1;
}

// Element count of a compact (row-major, strides NULL or matching) tensor; -1 otherwise.
int64_t compact_numel(const DLTensor* t) {
  if (t->ndim < 0 || t->ndim > 16 || (t->ndim > 0 && !t->shape)) return -1;
  int64_t n = 1;
  for (int32_t d = t->ndim - 1; d >= 0; --d) {
    if (t->shape[d] < 0) return -1;
    if (t->strides && t->shape[d] > 1 && t->strides[d] != n) return -1;
    if (t->shape[d] != 0 && n > INT64_MAX / t->shape[d]) return -1;
    n *= t->shape[d];
  }
  return n;
}

// y = x * alpha + offset, on cpu or through the loader's device code.
int32_t scale(const DLTensor* x, double alpha, const DLTensor* y, void* stream) {
  if (!x || !y) return fail(KH_ERR_INVALID_ARGUMENT, "scale: tensor arguments must not be NULL");
  if (!is_f32(x) || !is_f32(y))
    return fail(KH_ERR_UNSUPPORTED, "scale: only float32 tensors are supported");
  int64_t n = compact_numel(x);
  if (n < 0 || n != compact_numel(y))
    return fail(KH_ERR_INVALID_ARGUMENT,
                "scale: x and y must be compact tensors with the same number of elements");
  if (x->device.device_type != y->device.device_type || x->device.device_id != y->device.device_id)
    return fail(KH_ERR_INVALID_ARGUMENT, "scale: x and y must be on the same device");
  const float* xp =
      reinterpret_cast<const float*>(static_cast<const char*>(x->data) + x->byte_offset);
  float* yp = reinterpret_cast<float*>(static_cast<char*>(y->data) + y->byte_offset);
  float a = static_cast<float>(alpha);
  float offset = static_cast<float>(TOY_OFFSET);
  if (x->device.device_type == kDLCPU) {
    for (int64_t i = 0; i < n; ++i) yp[i] = xp[i] * a + offset;
    return KH_OK;
  }
  if (x->device.device_type == kDLCUDA) {
    const kh_host_v1_t* h = host();
    void* fn = nullptr;
    int32_t status = h->get_function(h->ctx, x->device.device_id, "toy_scale_f32", &fn);
    if (status != KH_OK) return status;  // the host has set the error
    long long count = n;
    void* params[] = {&xp, &yp, &a, &offset, &count};
    // The toy writes the launch cfg of ABI 1.0 (no cluster, no flags: struct_size 40), as a
    // package built before ABI 1.1 does: the loader must still launch it the plain way.
    toy_launch_cfg_v1_0_t cfg = {{KH_LAUNCH_CFG_V1_0_SIZE, KH_ABI_MAJOR, 0},
                                 {static_cast<uint32_t>((n + 255) / 256), 1, 1},
                                 {256, 1, 1},
                                 0,
                                 x->device.device_id};
    if (n == 0) return KH_OK;
    return h->launch(h->ctx, fn, reinterpret_cast<const kh_launch_cfg_t*>(&cfg), params, stream);
  }
  return fail(KH_ERR_UNSUPPORTED, "scale: tensors must be on kDLCPU or kDLCUDA");
}

// scale(Tensor x, float alpha, Tensor(a!) y) -> ()
int32_t unpack(const kh_arg_t* args, int32_t nargs, const DLTensor** x, double* alpha,
               const DLTensor** y) {
  if (nargs != 3 || !args || args[0].kind != KH_ARG_TENSOR || args[1].kind != KH_ARG_FLOAT ||
      args[2].kind != KH_ARG_TENSOR)
    return fail(KH_ERR_INVALID_ARGUMENT, "expected arguments (Tensor x, float alpha, Tensor y)");
  *x = args[0].v.t;
  *alpha = args[1].v.f;
  *y = args[2].v.t;
  return KH_OK;
}

int32_t scale_forward(const kh_arg_t* args, int32_t nargs, void* stream) {
  const DLTensor *x, *y;
  double alpha;
  int32_t s = unpack(args, nargs, &x, &alpha, &y);
  return s != KH_OK ? s : scale(x, alpha, y, stream);
}

// Same result; a separate function so that tests can tell which one a mode bound.
int32_t scale_forward_train(const kh_arg_t* args, int32_t nargs, void* stream) {
  const DLTensor *x, *y;
  double alpha;
  int32_t s = unpack(args, nargs, &x, &alpha, &y);
  return s != KH_OK ? s : scale(x, alpha, y, stream);
}

// dx = dy * alpha (the offset has no gradient).
int32_t scale_backward(const kh_arg_t* args, int32_t nargs, void* stream) {
  (void)stream;
  const DLTensor *dy, *dx;
  double alpha;
  int32_t s = unpack(args, nargs, &dy, &alpha, &dx);
  if (s != KH_OK) return s;
  if (dy->device.device_type != kDLCPU || dx->device.device_type != kDLCPU)
    return fail(KH_ERR_UNSUPPORTED, "scale_backward: only cpu tensors are supported");
  if (!is_f32(dy) || !is_f32(dx)) return fail(KH_ERR_UNSUPPORTED, "scale_backward: float32 only");
  int64_t n = compact_numel(dy);
  if (n < 0 || n != compact_numel(dx))
    return fail(KH_ERR_INVALID_ARGUMENT, "scale_backward: dy and dx must match");
  const float* g =
      reinterpret_cast<const float*>(static_cast<const char*>(dy->data) + dy->byte_offset);
  float* out = reinterpret_cast<float*>(static_cast<char*>(dx->data) + dx->byte_offset);
  for (int64_t i = 0; i < n; ++i) out[i] = g[i] * static_cast<float>(alpha);
  return KH_OK;
}

#ifdef TOY_MINOR_PLUS
// An ABI 1.1 package: every struct grew by a field a 1.0 loader does not know.
struct toy_op_t {
  kh_op_v1_t base;
  uint64_t future_op_field;
};
struct toy_layer_t {
  kh_layer_v1_t base;
  uint64_t future_layer_field;
};
struct toy_module_t {
  kh_module_v1_t base;
  uint64_t future_module_field;
};
#define TOY_MINOR (KH_ABI_MINOR + 1)
#define TOY_ENTRY(...) \
  { {__VA_ARGS__}, 42 }
#else
typedef kh_op_v1_t toy_op_t;
typedef kh_layer_v1_t toy_layer_t;
typedef kh_module_v1_t toy_module_t;
#define TOY_MINOR KH_ABI_MINOR
#define TOY_ENTRY(...) \
  { __VA_ARGS__ }
#endif

#define TOY_HEADER(type) \
  { (uint32_t)sizeof(type), (uint16_t)TOY_ABI_MAJOR, (uint16_t)TOY_MINOR }

const uint32_t kScaleFlags = KH_FLAG_HAS_BACKWARD | KH_FLAG_GRAPH_SAFE | KH_FLAG_DETERMINISTIC;

const toy_op_t kOps[] = {
    TOY_ENTRY(TOY_HEADER(toy_op_t), "scale_forward",
              "scale(Tensor x, float alpha, Tensor(a!) y) -> ()",
              KH_FLAG_GRAPH_SAFE | KH_FLAG_DETERMINISTIC, scale_forward),
    TOY_ENTRY(TOY_HEADER(toy_op_t), "scale_forward_train",
              "scale(Tensor x, float alpha, Tensor(a!) y) -> ()",
              KH_FLAG_GRAPH_SAFE | KH_FLAG_DETERMINISTIC, scale_forward_train),
    TOY_ENTRY(TOY_HEADER(toy_op_t), "scale_backward",
              "scale_backward(Tensor dy, float alpha, Tensor(a!) dx) -> ()",
              KH_FLAG_GRAPH_SAFE | KH_FLAG_DETERMINISTIC, scale_backward),
};

const toy_layer_t kLayers[] = {
    TOY_ENTRY(TOY_HEADER(toy_layer_t), "Scale", "scale_forward", "scale_forward_train",
              "scale_backward", kScaleFlags, KH_DTYPE_FP32),
    TOY_ENTRY(TOY_HEADER(toy_layer_t), "ScaleInfer", "scale_forward", nullptr, nullptr,
              KH_FLAG_GRAPH_SAFE | KH_FLAG_DETERMINISTIC, KH_DTYPE_FP32),
};

const toy_module_t kModule =
    TOY_ENTRY(TOY_HEADER(toy_module_t), "toy", TOY_VERSION, "toy-test-package", 2,
              reinterpret_cast<const kh_layer_v1_t*>(kLayers), 3,
              reinterpret_cast<const kh_op_v1_t*>(kOps), nullptr);

#if TOY_ABI_MAJOR != KH_ABI_MAJOR
// Another major's table: a header followed by words that would crash a loader which read past
// the header as if it were ABI 1 (they are not valid pointers).
struct other_major_t {
  kh_header_t h;
  uintptr_t poison[8];
};
const other_major_t kOtherMajor = {{(uint32_t)sizeof(other_major_t), (uint16_t)TOY_ABI_MAJOR, 0},
                                   {1, 1, 1, 1, 1, 1, 1, 1}};
#endif

const kh_module_v1_t* entry(const kh_host_v1_t* h) {
  if (!h) return nullptr;
  if (h->h.abi_major != KH_ABI_MAJOR || h->h.struct_size < sizeof(kh_host_v1_t)) {
    if (h->h.abi_major == KH_ABI_MAJOR && h->h.struct_size >= offsetof(kh_host_v1_t, get_function))
      h->set_error(h->ctx, "toy needs a kernel-hub host table of ABI 1.0 or newer");
    return nullptr;
  }
#ifdef TOY_LINK_FAKE_CUDART
  int devices = 0;
  cudaGetDeviceCount(&devices);
#endif
  __atomic_store_n(&g_host, h, __ATOMIC_RELEASE);
#if TOY_ABI_MAJOR != KH_ABI_MAJOR
  return reinterpret_cast<const kh_module_v1_t*>(&kOtherMajor);
#else
  return reinterpret_cast<const kh_module_v1_t*>(&kModule);
#endif
}

}  // namespace

#ifdef TOY_NO_ENTRY
// Exported under another name: the preflight must refuse the library for lacking kh_module_v1.
extern "C" KH_EXPORT const kh_module_v1_t* toy_module_misnamed(const kh_host_v1_t* h) {
  return entry(h);
}
#else
KH_MODULE_ENTRY(h) {
  return entry(h);
}
#endif
