#include "tools/demo/device_linear.h"

#include <fmt/format.h>

#include <string>

#include "kernel_hub/kernel_hub.hpp"

namespace kh::demo {

namespace {

kh_gemm_t request(int device, uint32_t dtype_ab, uint32_t dtype_d) {
  kh_gemm_t g{};
  g.h = KH_HEADER_INIT(kh_gemm_t);
  g.device_id = device;
  g.dtype_ab = dtype_ab;
  g.dtype_d = dtype_d;
  g.alpha = 1.f;
  g.batch = 1;
  return g;
}

uint32_t gemm_dtype(const DeviceTensor& t, const char* name) {
  if (same_dtype(t.dtype(), kF32)) return KH_DTYPE_FP32;
  if (same_dtype(t.dtype(), kBF16)) return KH_DTYPE_BF16;
  throw Error(ErrorKind::kInvalidInput,
              fmt::format("linear: {} is {}; float32 or bfloat16 expected", name, t.describe()));
}

void expect(bool ok, const std::string& why) {
  if (!ok) throw Error(ErrorKind::kInvalidInput, "linear: " + why);
}

void run(const kh_gemm_t& g, DeviceStream& stream, const char* what) {
  if (int32_t status = gemm(g, stream.handle()); status != KH_OK)
    throw Error(status == KH_ERR_INVALID_ARGUMENT ? ErrorKind::kInvalidInput : ErrorKind::kIo,
                fmt::format("linear {} (GEMM {}x{}x{}): {}", what, g.m, g.n, g.k, last_op_error()));
}

// x [..., in] as rows x in; w [out, in].
LinearShape shape_of(const DeviceTensor& x, const DeviceTensor& w) {
  expect(w.ndim() == 2, fmt::format("weight is {}; [out, in] expected", w.describe()));
  expect(x.ndim() >= 1 && x.dim(x.ndim() - 1) == w.dim(1),
         fmt::format("x is {} for weight {}: its last dimension must be {}", x.describe(),
                     w.describe(), w.dim(1)));
  expect(same_dtype(x.dtype(), w.dtype()),
         fmt::format("x is {} and weight {}: one dtype expected", x.describe(), w.describe()));
  expect(x.device() == w.device(), "x and weight are on different devices");
  LinearShape s;
  s.in = w.dim(1);
  s.out = w.dim(0);
  s.rows = s.in ? x.numel() / s.in : 0;
  return s;
}

void expect_rows(const DeviceTensor& t, const char* name, int64_t rows, int64_t cols,
                 DLDataType dtype) {
  expect(t.numel() == rows * cols && t.ndim() >= 1 && t.dim(t.ndim() - 1) == cols &&
             same_dtype(t.dtype(), dtype),
         fmt::format("{} is {}; {} [{}, {}] expected", name, t.describe(), dtype_name(dtype), rows,
                     cols));
}

}  // namespace

kh_gemm_t linear_forward_gemm(int device, uint32_t dtype_ab, const LinearShape& s, const void* x,
                              const void* w, void* y) {
  // D = y [rows, out]; A = x [rows, in]; B = W^T, W stored row-major [out, in] = [n, k].
  kh_gemm_t g = request(device, dtype_ab, dtype_ab);
  g.flags = KH_GEMM_TRANS_B;
  g.m = s.rows;
  g.n = s.out;
  g.k = s.in;
  g.a = x;
  g.lda = s.in;
  g.b = w;
  g.ldb = s.in;
  g.d = y;
  g.ldd = s.out;
  return g;
}

kh_gemm_t linear_dx_gemm(int device, uint32_t dtype_ab, const LinearShape& s, const void* dy,
                         const void* w, void* dx, bool accumulate) {
  // D = dx [rows, in]; A = dy [rows, out]; B = W [out, in] = [k, n].
  kh_gemm_t g = request(device, dtype_ab, dtype_ab);
  g.flags = accumulate ? KH_GEMM_ACCUMULATE : 0u;
  g.beta = accumulate ? 1.f : 0.f;
  g.m = s.rows;
  g.n = s.in;
  g.k = s.out;
  g.a = dy;
  g.lda = s.out;
  g.b = w;
  g.ldb = s.in;
  g.d = dx;
  g.ldd = s.in;
  return g;
}

kh_gemm_t linear_dw_gemm(int device, uint32_t dtype_ab, const LinearShape& s, const void* dy,
                         const void* x, float* dw, bool accumulate) {
  // D = dW [out, in] (fp32, accumulated or overwritten); A = dy^T, dy stored row-major
  // [rows, out] = [k, m]; B = x [rows, in] = [k, n].
  kh_gemm_t g = request(device, dtype_ab, KH_DTYPE_FP32);
  g.flags = KH_GEMM_TRANS_A | (accumulate ? KH_GEMM_ACCUMULATE : 0u);
  g.beta = accumulate ? 1.f : 0.f;
  g.m = s.out;
  g.n = s.in;
  g.k = s.rows;
  g.a = dy;
  g.lda = s.out;
  g.b = x;
  g.ldb = s.in;
  g.d = dw;
  g.ldd = s.in;
  return g;
}

void linear_forward(DeviceStream& stream, const DeviceTensor& x, const DeviceTensor& w,
                    DeviceTensor& y) {
  const LinearShape s = shape_of(x, w);
  const uint32_t dtype = gemm_dtype(x, "x");
  expect_rows(y, "y", s.rows, s.out, x.dtype());
  if (s.rows == 0 || s.out == 0) return;
  expect(s.in > 0, "in_features is 0");
  run(linear_forward_gemm(x.device(), dtype, s, x.data(), w.data(), y.data()), stream, "forward");
}

void linear_backward(DeviceStream& stream, const DeviceTensor& x, const DeviceTensor& w,
                     const DeviceTensor& dy, DeviceTensor* dx, DeviceTensor* dw, bool accumulate_dx,
                     bool accumulate_dw) {
  const LinearShape s = shape_of(x, w);
  const uint32_t dtype = gemm_dtype(x, "x");
  expect_rows(dy, "dy", s.rows, s.out, x.dtype());
  if (dx) expect_rows(*dx, "dx", s.rows, s.in, x.dtype());
  if (dw)
    expect(dw->shape() == w.shape() && same_dtype(dw->dtype(), kF32),
           fmt::format("dw is {}; float32 of the weight's shape expected", dw->describe()));
  if (s.rows == 0 || s.in == 0) {
    if (dw && !accumulate_dw) dw->zero(stream);  // a sum of no rows
    return;
  }
  if (s.out == 0) {  // dy is empty: dx = 0 (unless accumulating), dw unchanged (or 0)
    if (dx && !accumulate_dx) dx->zero(stream);
    if (dw && !accumulate_dw) dw->zero(stream);
    return;
  }
  if (dx)
    run(linear_dx_gemm(x.device(), dtype, s, dy.data(), w.data(), dx->data(), accumulate_dx),
        stream, "backward dx");
  if (dw)
    run(linear_dw_gemm(x.device(), dtype, s, dy.data(), x.data(), dw->data_as<float>(),
                       accumulate_dw),
        stream, "backward dw");
}

}  // namespace kh::demo
