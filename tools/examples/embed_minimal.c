/* The smallest complete C embedding of kernel-hub through libkernel_hub.so (README
 * "Embedding"): one slot, SiluAndMul, with the runtime's own code as fallback; kh_runtime_kernelize
 * binds kernel-hub/activation from the hub for both modes; one call in eval mode, checked
 * against the fallback. Built by the project and run by CTest (example.c); built against the
 * installed SDK with `cc embed_minimal.c $(pkg-config --cflags --libs kernel_hub) -lm` (sdk.install). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernel_hub/kernel_hub.h"

/* out[r, c] = silu(in[r, c]) * in[r, d + c] for fp32 rows of 2d: the runtime's own SiluAndMul.
 * Arguments as the package op: (Tensor input [rows, 2d], Tensor out [rows, d]). */
static int32_t my_silu_and_mul(const kh_arg_t* a, int32_t n, void* stream) {
  (void)stream;
  if (n != 2) return KH_ERR_INVALID_ARGUMENT;
  const DLTensor* in = a[0].v.t;
  const DLTensor* out = a[1].v.t;
  int64_t rows = out->shape[0], d = out->shape[1];
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < d; ++c) {
      float g = ((const float*)in->data)[r * 2 * d + c];
      float u = ((const float*)in->data)[r * 2 * d + d + c];
      ((float*)out->data)[r * d + c] = g / (1.0f + expf(-g)) * u;
    }
  return KH_OK;
}

static DLTensor tensor(float* data, int64_t* shape) {
  DLTensor t = {0};
  t.data = data;
  t.device.device_type = kDLCPU;
  t.ndim = 2;
  t.dtype.code = kDLFloat;
  t.dtype.bits = 32;
  t.dtype.lanes = 1;
  t.shape = shape;
  return t;
}

int main(void) {
  /* The library loaded is the one this program was built for (same MAJOR: kernel_hub.h). */
  printf("kernel-hub %s (built against %s)\n", kh_version(), KH_VERSION_STRING);
  kh_runtime_t* rt = kh_runtime_create(0);
  if (!rt) {
    fprintf(stderr, "error: %s\n", kh_last_error());
    return 1;
  }
  uint32_t slot;
  int32_t status =
      kh_runtime_add_slot(rt, "SiluAndMul", my_silu_and_mul, my_silu_and_mul, NULL, 0, &slot);
  char* report = NULL;
  /* NULL hub: $KERNEL_HUB_ENDPOINT, else the embedded default hub; NULL device: this cpu;
   * modes 0: eval and train; strict 1: a mapped layer that would keep its fallback fails. */
  if (status == KH_OK)
    status = kh_runtime_kernelize(rt, "{\"SiluAndMul\": \"kernel-hub/activation@v1\"}", NULL, NULL,
                                  0, 1, NULL, &report);
  if (status != KH_OK) {
    fprintf(stderr, "error (%s): %s\n", kh_status_name(status), kh_last_error());
    return 1;
  }
  printf("%s\n", report);
  kh_runtime_free_report(report);

  kh_runtime_set_mode(rt, KH_MODE_EVAL);
  float in[2 * 6] = {0.5f, -1, 2, 1, 2, 3, -3, 0, 1.5f, -1, 0.5f, 2};
  float out[2 * 3], ref[2 * 3];
  int64_t in_shape[2] = {2, 6}, out_shape[2] = {2, 3};
  DLTensor tin = tensor(in, in_shape), tout = tensor(out, out_shape), tref = tensor(ref, out_shape);
  kh_arg_t args[2];
  args[0].kind = KH_ARG_TENSOR;
  args[0].v.t = &tin;
  args[1].kind = KH_ARG_TENSOR;
  args[1].v.t = &tout;
  if (kh_runtime_forward(rt, slot, KH_DEVICE_CPU, args, 2, NULL) != KH_OK) {
    fprintf(stderr, "SiluAndMul failed: %s\n", kh_last_error());
    return 1;
  }
  args[1].v.t = &tref;
  my_silu_and_mul(args, 2, NULL);
  for (int i = 0; i < 6; ++i)
    if (fabsf(out[i] - ref[i]) > 1e-5f * (1 + fabsf(ref[i]))) {
      fprintf(stderr, "out[%d] = %g, expected %g\n", i, out[i], ref[i]);
      return 1;
    }
  printf("SiluAndMul through the slot matches the runtime's own code: out[0] = %.6f\n", out[0]);
  kh_runtime_destroy(rt);
  return 0;
}
