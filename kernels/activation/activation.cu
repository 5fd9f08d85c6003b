// Device code of the activation package: SiluAndMul, GeluAndMul (erf and tanh), Silu and
// GeluTanh, forward and backward, bf16/fp16/fp32 storage with fp32 math (act_math.h, the same
// formulas the cpu implementation uses).
//
// Header-free for NVRTC: the build inlines act_math.h and kh_prelude.cuh into the shipped
// activation.cu. Kernels are extern "C", named
//   act_<op>_<fwd|bwd>_<bf16|fp16|fp32>_<vec|scalar>
// with op in silu_and_mul, gelu_and_mul (erf), gelu_tanh_and_mul, silu, gelu_tanh, and
// act_silu_and_mul_bwd_out_<dtype>_<vec|scalar> (the backward that also writes y).
// Rows: x is [rows, 2d] for the *_and_mul ops (gate = x[:, :d], up = x[:, d:]) and [rows, d]
// otherwise; y, dy are [rows, d]; dx is shaped like x; each tensor has its own row stride.
// Geometry (host.cpp): blockDim = (tx, ty) covers ty rows per CTA with tx threads along the row,
// each thread handling kUnroll vectors (all loads issued before the math); gridDim.x covers the
// rows, gridDim.y the column chunks of tx * kUnroll vectors. vec: 16-byte accesses when every
// row start is 16-byte aligned and d % (16 / sizeof(T)) == 0; scalar otherwise.
#include "act_math.h"
#include "pdl.cuh"

namespace {

constexpr int kUnroll = 4;

// OUT (GLU backward only): also y = act(gate) * up, the forward's output, into y (row stride sy),
// for a caller that did not keep it (SiluAndMulRecompute).
template <typename T, int VEC, int OP, bool BWD, bool OUT = false>
__device__ __forceinline__ void act_kernel(const T* x, kh_i64 sx, const T* dy, kh_i64 sdy, T* out,
                                           kh_i64 so, kh_i64 rows, int d, T* y = nullptr,
                                           kh_i64 sy = 0) {
  typedef kh_raw<T, VEC> Raw;
  constexpr bool kGlu = OP <= KH_ACT_GELU_TANH_AND_MUL;
  const kh_i64 row = (kh_i64)blockIdx.x * blockDim.y + threadIdx.y;
  if (row >= rows) return;  // no barriers in this kernel
  const int nvec = d / VEC;
  const int base = blockIdx.y * blockDim.x * kUnroll + threadIdx.x;
  const T* xr = x + row * sx;
  Raw g[kUnroll], u[kUnroll], e[kUnroll];
#pragma unroll
  for (int k = 0; k < kUnroll; ++k) {
    const int v = base + k * blockDim.x;
    if (v < nvec) {
      g[k] = kh_load_raw<T, VEC, KH_LOAD_STREAM>(xr + (kh_i64)v * VEC);
      if constexpr (kGlu) u[k] = kh_load_raw<T, VEC, KH_LOAD_STREAM>(xr + d + (kh_i64)v * VEC);
      if constexpr (BWD)
        e[k] = kh_load_raw<T, VEC, KH_LOAD_STREAM>(dy + row * sdy + (kh_i64)v * VEC);
    }
  }
  T* orow = out + row * so;
#pragma unroll
  for (int k = 0; k < kUnroll; ++k) {
    const int v = base + k * blockDim.x;
    if (v < nvec) {
      float a[VEC], o[VEC];
      kh_unpack<T, VEC>(g[k], a);
      if constexpr (!BWD) {
        if constexpr (kGlu) {
          float b[VEC];
          kh_unpack<T, VEC>(u[k], b);
#pragma unroll
          for (int i = 0; i < VEC; ++i) o[i] = kh_act(OP, a[i]) * b[i];
        } else {
#pragma unroll
          for (int i = 0; i < VEC; ++i) o[i] = kh_act(OP, a[i]);
        }
        kh_store_raw<T, VEC>(orow + (kh_i64)v * VEC, kh_pack<T, VEC>(o));
      } else {
        float gd[VEC];
        kh_unpack<T, VEC>(e[k], gd);
        if constexpr (kGlu) {
          float b[VEC], du[VEC], yo[VEC];
          kh_unpack<T, VEC>(u[k], b);
#pragma unroll
          for (int i = 0; i < VEC; ++i) {
            const float act = kh_act(OP, a[i]);
            o[i] = gd[i] * b[i] * kh_dact(OP, a[i]);  // d gate
            du[i] = gd[i] * act;                      // d up
            yo[i] = act * b[i];                       // the forward's output (OUT)
          }
          kh_store_raw<T, VEC>(orow + (kh_i64)v * VEC, kh_pack<T, VEC>(o));
          kh_store_raw<T, VEC>(orow + d + (kh_i64)v * VEC, kh_pack<T, VEC>(du));
          if constexpr (OUT)
            kh_store_raw<T, VEC>(y + row * sy + (kh_i64)v * VEC, kh_pack<T, VEC>(yo));
        } else {
#pragma unroll
          for (int i = 0; i < VEC; ++i) o[i] = gd[i] * kh_dact(OP, a[i]);
          kh_store_raw<T, VEC>(orow + (kh_i64)v * VEC, kh_pack<T, VEC>(o));
        }
      }
    }
  }
}

}  // namespace

// One parameter list for every kernel: forward kernels get dy = NULL.
#define KH_ACT_KERNEL(ONAME, OP, DIR, BWD, TNAME, T, VEC, VNAME)                               \
  extern "C" __global__ void __launch_bounds__(256) act_##ONAME##_##DIR##_##TNAME##_##VNAME(   \
      const T* x, kh_i64 sx, const T* dy, kh_i64 sdy, T* out, kh_i64 so, kh_i64 rows, int d) { \
    kh_pdl_enter();                                                                            \
    act_kernel<T, VEC, OP, BWD>(x, sx, dy, sdy, out, so, rows, d);                             \
  }

#define KH_ACT_OP_DTYPE(ONAME, OP, TNAME, T)                          \
  KH_ACT_KERNEL(ONAME, OP, fwd, false, TNAME, T, kh_vec16<T>::n, vec) \
  KH_ACT_KERNEL(ONAME, OP, fwd, false, TNAME, T, 1, scalar)           \
  KH_ACT_KERNEL(ONAME, OP, bwd, true, TNAME, T, kh_vec16<T>::n, vec)  \
  KH_ACT_KERNEL(ONAME, OP, bwd, true, TNAME, T, 1, scalar)

#define KH_ACT_OP(ONAME, OP)                \
  KH_ACT_OP_DTYPE(ONAME, OP, bf16, kh_bf16) \
  KH_ACT_OP_DTYPE(ONAME, OP, fp16, kh_fp16) \
  KH_ACT_OP_DTYPE(ONAME, OP, fp32, float)

// The GLU backward that also writes the forward's output y (row stride sy):
//   act_<op>_bwd_out_<dtype>_<vec|scalar>(x, sx, dy, sdy, dx, sdx, rows, d, y, sy)
#define KH_ACT_BWD_OUT_KERNEL(ONAME, OP, TNAME, T, VEC, VNAME)                                     \
  extern "C" __global__ void __launch_bounds__(256) act_##ONAME##_bwd_out_##TNAME##_##VNAME(       \
      const T* x, kh_i64 sx, const T* dy, kh_i64 sdy, T* out, kh_i64 so, kh_i64 rows, int d, T* y, \
      kh_i64 sy) {                                                                                 \
    kh_pdl_enter();                                                                                \
    act_kernel<T, VEC, OP, true, true>(x, sx, dy, sdy, out, so, rows, d, y, sy);                   \
  }
#define KH_ACT_BWD_OUT(ONAME, OP)                                            \
  KH_ACT_BWD_OUT_KERNEL(ONAME, OP, bf16, kh_bf16, kh_vec16<kh_bf16>::n, vec) \
  KH_ACT_BWD_OUT_KERNEL(ONAME, OP, bf16, kh_bf16, 1, scalar)                 \
  KH_ACT_BWD_OUT_KERNEL(ONAME, OP, fp16, kh_fp16, kh_vec16<kh_fp16>::n, vec) \
  KH_ACT_BWD_OUT_KERNEL(ONAME, OP, fp16, kh_fp16, 1, scalar)                 \
  KH_ACT_BWD_OUT_KERNEL(ONAME, OP, fp32, float, kh_vec16<float>::n, vec)     \
  KH_ACT_BWD_OUT_KERNEL(ONAME, OP, fp32, float, 1, scalar)

KH_ACT_OP(silu_and_mul, KH_ACT_SILU_AND_MUL)
KH_ACT_BWD_OUT(silu_and_mul, KH_ACT_SILU_AND_MUL)
KH_ACT_OP(gelu_and_mul, KH_ACT_GELU_AND_MUL)
KH_ACT_OP(gelu_tanh_and_mul, KH_ACT_GELU_TANH_AND_MUL)
KH_ACT_OP(silu, KH_ACT_SILU)
KH_ACT_OP(gelu_tanh, KH_ACT_GELU_TANH)
