// The smallest complete C++ embedding of kernel-hub (README "Embedding"): a runtime with one
// layer slot, RMSNorm, whose fallback is the runtime's own code; kernelize binds the signed
// kernel-hub/norm package from the hub (the embedded default hub unless KERNEL_HUB_ENDPOINT says
// otherwise) for eval and train; then one call through the slot, checked against the fallback.
// One header, one kernelize call, one library: built against the installed SDK by
// tools/examples/sdk/CMakeLists.txt (find_package(KernelHub), KernelHub::kernel_hub), inside the
// build against libkernel_hub.so, and run by CTest (example.cpp, sdk.install).
#include <cmath>
#include <cstdio>
#include <vector>

#include "kernel_hub/kernel_hub.hpp"

namespace {

// y = x / rms(x) * w for one fp32 row per call: the runtime's own RMSNorm (the fallback).
// Arguments as the package op: (Tensor x, Tensor weight, float eps, Tensor y).
int32_t my_rms_norm(const kh_arg_t* a, int32_t n, void*) {
  if (n != 4) return KH_ERR_INVALID_ARGUMENT;
  const DLTensor *x = a[0].v.t, *w = a[1].v.t, *y = a[3].v.t;
  const int64_t rows = x->shape[0], cols = x->shape[1];
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = static_cast<const float*>(x->data) + r * cols;
    float* yr = static_cast<float*>(y->data) + r * cols;
    double ss = 0;
    for (int64_t c = 0; c < cols; ++c) ss += double(xr[c]) * xr[c];
    const double inv = 1.0 / std::sqrt(ss / cols + a[2].v.f);
    for (int64_t c = 0; c < cols; ++c)
      yr[c] = float(xr[c] * inv * static_cast<const float*>(w->data)[c]);
  }
  return KH_OK;
}

DLTensor tensor(std::vector<float>& v, int64_t* shape, int32_t ndim) {
  DLTensor t{};
  t.data = v.data();
  t.device = {kDLCPU, 0};
  t.ndim = ndim;
  t.dtype = {kDLFloat, 32, 1};
  t.shape = shape;
  return t;
}

}  // namespace

int main() {
  try {
    // The library loaded is the one this program was built for (same MAJOR: kernel_hub.h).
    std::printf("kernel-hub %s (built against %s)\n", kh::version(), KH_VERSION_STRING);
    kh::Runtime rt;
    const uint32_t slot = rt.add_slot("RMSNorm", {my_rms_norm, my_rms_norm, nullptr, 0});

    // Which kernel serves which layer: here every device and mode from kernel-hub/norm@v1.
    // Resolve, fetch, verify (signature, digests, files), load and bind both modes up front;
    // strict: a mapped layer that would keep its fallback is an error.
    kh::EmbedReport report =
        kh::kernelize(rt, R"({"RMSNorm": "kernel-hub/norm@v1"})", {.strict = true});
    std::printf("%s", report.text.c_str());

    rt.set_mode(kh::Mode::kEval);  // one atomic store; no I/O from here on
    std::vector<float> x = {1, -2, 3, -4, 5, -6, 7, -8}, w(4, 0.5f), y(8), ref(8);
    int64_t shape[2] = {2, 4}, wshape[1] = {4};  // two rows of four; one weight per column
    DLTensor tx = tensor(x, shape, 2), tw = tensor(w, wshape, 1), ty = tensor(y, shape, 2),
             tref = tensor(ref, shape, 2);
    kh_arg_t args[4];
    args[0].kind = KH_ARG_TENSOR, args[0].v.t = &tx;
    args[1].kind = KH_ARG_TENSOR, args[1].v.t = &tw;
    args[2].kind = KH_ARG_FLOAT, args[2].v.f = 1e-6;
    args[3].kind = KH_ARG_TENSOR, args[3].v.t = &ty;
    if (rt.forward(slot, kh::kCpuDevice, args, 4, nullptr) != KH_OK) {
      std::fprintf(stderr, "RMSNorm failed: %s\n", kh::last_op_error().c_str());
      return 1;
    }
    args[3].v.t = &tref;
    my_rms_norm(args, 4, nullptr);
    for (size_t i = 0; i < y.size(); ++i)
      if (std::fabs(y[i] - ref[i]) > 1e-5f * (1 + std::fabs(ref[i]))) {
        std::fprintf(stderr, "y[%zu] = %g, expected %g\n", i, y[i], ref[i]);
        return 1;
      }
    std::printf("RMSNorm through the slot matches the runtime's own code: y[0] = %.6f\n", y[0]);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
