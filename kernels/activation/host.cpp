// Host library of the kernel-hub/activation package: layers SiluAndMul, SiluAndMulRecompute,
// GeluAndMul (int attribute approximate: 0 = "none" (erf), 1 = "tanh"), GeluTanh and Silu.
// forward_train is the forward op (backward needs only the input, which the caller keeps);
// backward returns the input gradient (SiluAndMulRecompute's also the forward's output). Ops
// check their DLPack arguments, then run cpu.cpp on kDLCPU tensors or launch activation.cu's
// kernels through the loader on kDLCUDA tensors.
//
// Tensors are viewed as rows (leading dimensions collapsed, last dimension contiguous, any row
// stride >= the row length). *_and_mul ops: x is [rows, 2d] (gate | up), y and dy are [rows, d],
// dx is [rows, 2d]. Elementwise ops: all [rows, d]. Outputs are preallocated and overwritten.
#include <math.h>  // expf, erfcf for act_math.h
#include <stdio.h>

#include "kernels/activation/act_math.h"
#include "kernels/activation/cpu.h"
#include "kernels/activation/launch_config.h"
#include "kernels/common/op_schema.h"
#include "kernels/common/package_host.h"
#include "kernels/common/tensor_args.h"

namespace khk {
namespace {

constexpr const char* kPackageName = "kernel-hub/activation";
constexpr const char* kPackageVersion = "1.1.0";

const char* op_kernel_name(int op) {
  switch (op) {
    case KH_ACT_SILU_AND_MUL:
      return "silu_and_mul";
    case KH_ACT_GELU_AND_MUL:
      return "gelu_and_mul";
    case KH_ACT_GELU_TANH_AND_MUL:
      return "gelu_tanh_and_mul";
    case KH_ACT_SILU:
      return "silu";
    default:
      return "gelu_tanh";
  }
}
const char* dtype_tag(int dtype) {
  return dtype == kBF16 ? "bf16" : dtype == kFP16 ? "fp16" : "fp32";
}

// A tensor of `rows` x `cols` with x's dtype and device.
int32_t rows_like(const TensorArg& t, const RowsView& x, int64_t cols, const char* like,
                  RowsView* out) {
  KH_TRY(rows_view(t, out));
  KH_TRY(expect_shape(t, *out, x.rows, cols, like));
  KH_TRY(expect_dtype(t, out->dtype, x.dtype, "the dtype of x"));
  KH_TRY(expect_device(t, out->device, x.device));
  return KH_OK;
}

// d (output columns) of op for input x; GLU inputs must have an even number of columns.
int32_t output_cols(const char* op_name, int op, const RowsView& x, int64_t* d) {
  if (kh_act_is_glu(op)) {
    if (x.cols % 2 != 0)
      return fail(KH_ERR_INVALID_ARGUMENT,
                  "%s: x has %lld columns; expected an even number ([gate | up], 2 * d)", op_name,
                  static_cast<long long>(x.cols));
    *d = x.cols / 2;
  } else {
    *d = x.cols;
  }
  return KH_OK;
}

// Runs op forward (dy == nullptr) or backward on cpu or cuda; a GLU backward with y also writes
// the forward's output there.
int32_t run(const char* op_name, int op, const RowsView& x, const RowsView* dy, const RowsView& out,
            int64_t d, void* stream, const RowsView* y = nullptr) {
  if (x.rows == 0 || d == 0) return KH_OK;
  const bool bwd = dy != nullptr;
  if (is_cpu(x.device)) {
    if (bwd)
      act_cpu::backward(op, x.dtype, dy->data, dy->stride, x.data, x.stride, out.data, out.stride,
                        x.rows, d, y ? y->data : nullptr, y ? y->stride : 0);
    else
      act_cpu::forward(op, x.dtype, x.data, x.stride, out.data, out.stride, x.rows, d);
    return KH_OK;
  }
  const int vec16 = dtype_vec16(x.dtype);
  const int64_t in_mult = kh_act_is_glu(op) ? 2 : 1;
  // x (and a GLU dx) hold two halves: d % vec16 == 0 keeps the second half aligned.
  bool vec = (d % vec16) == 0 && vectorizable(x, in_mult * vec16) && vectorizable(out, vec16);
  if (bwd) vec = vec && vectorizable(*dy, vec16);
  if (y) vec = vec && vectorizable(*y, vec16);
  const int64_t nvec = vec ? d / vec16 : d;
  const ActLaunch cfg = act_launch(x.rows, nvec);
  if (cfg.grid_x > 0x7FFFFFFF || cfg.grid_y > 65535)
    return fail(KH_ERR_UNSUPPORTED, "%s: %lld rows of %lld columns exceed the launch grid", op_name,
                static_cast<long long>(x.rows), static_cast<long long>(d));
  char name[96];
  const char* dir = y ? "bwd_out" : bwd ? "bwd" : "fwd";
  snprintf(name, sizeof name, "act_%s_%s_%s_%s", op_kernel_name(op), dir, dtype_tag(x.dtype),
           vec ? "vec" : "scalar");
  const void* xp = x.data;
  const void* dyp = bwd ? dy->data : nullptr;
  void* op_ = out.data;
  void* yp = y ? y->data : nullptr;
  long long sx = x.stride, sdy = bwd ? dy->stride : 0, so = out.stride, rows = x.rows;
  long long sy = y ? y->stride : 0;
  int di = static_cast<int>(d);
  // Every kernel takes the first eight; the bwd_out kernels also y and sy.
  void* params[] = {&xp, &sx, &dyp, &sdy, &op_, &so, &rows, &di, &yp, &sy};
  LaunchDims dims;
  dims.flags = kPdlEntry;
  dims.grid[0] = static_cast<uint32_t>(cfg.grid_x);
  dims.grid[1] = static_cast<uint32_t>(cfg.grid_y);
  dims.block[0] = cfg.tx;
  dims.block[1] = cfg.ty;
  return launch_kernel(x.device.device_id, name, dims, params, stream);
}

// The approximate attribute of GeluAndMul: 0 = "none" (erf), 1 = "tanh".
int32_t gelu_op(const char* op_name, int64_t approximate, int* op) {
  if (approximate != 0 && approximate != 1)
    return fail(KH_ERR_INVALID_ARGUMENT,
                "%s: approximate must be 0 (\"none\", erf) or 1 (\"tanh\"), got %lld", op_name,
                static_cast<long long>(approximate));
  *op = approximate == 1 ? KH_ACT_GELU_TANH_AND_MUL : KH_ACT_GELU_AND_MUL;
  return KH_OK;
}

constexpr OpSchema kSiluAndMul{"silu_and_mul(Tensor x, Tensor(a!) y) -> ()"};
constexpr OpSchema kSiluAndMulBackward{
    "silu_and_mul_backward(Tensor dy, Tensor x, Tensor(a!) dx) -> ()"};
// SiluAndMulRecompute's backward: silu_and_mul_backward's dx, and y = silu(gate) * up (the
// forward's output, which the caller did not keep) in the same pass over x and dy.
constexpr OpSchema kSiluAndMulBackwardRecompute{
    "silu_and_mul_backward_recompute(Tensor dy, Tensor x, Tensor(a!) dx, Tensor(a!) y) -> ()"};
constexpr OpSchema kGeluAndMul{"gelu_and_mul(Tensor x, int approximate, Tensor(a!) y) -> ()"};
constexpr OpSchema kGeluAndMulBackward{
    "gelu_and_mul_backward(Tensor dy, Tensor x, int approximate, Tensor(a!) dx) -> ()"};
constexpr OpSchema kGeluTanh{"gelu_tanh(Tensor x, Tensor(a!) y) -> ()"};
constexpr OpSchema kGeluTanhBackward{
    "gelu_tanh_backward(Tensor dy, Tensor x, Tensor(a!) dx) -> ()"};
constexpr OpSchema kSilu{"silu(Tensor x, Tensor(a!) y) -> ()"};
constexpr OpSchema kSiluBackward{"silu_backward(Tensor dy, Tensor x, Tensor(a!) dx) -> ()"};

// The forward op of activation `act` (GeluAndMul's: by its approximate argument).
template <const OpSchema& S, int act>
int32_t forward(const Args<S>& a, void* stream) {
  const char* op_name = a.op();
  int op = act;
  if constexpr (act == KH_ACT_GELU_AND_MUL) KH_TRY(gelu_op(op_name, a.integer("approximate"), &op));
  RowsView x, y;
  KH_TRY(rows_view(a.tensor("x"), &x));
  int64_t d = 0;
  KH_TRY(output_cols(op_name, op, x, &d));
  KH_TRY(rows_like(a.tensor("y"), x, d, kh_act_is_glu(op) ? "x with half the columns" : "x", &y));
  return run(op_name, op, x, nullptr, y, d, stream);
}

// The backward op of activation `act` (GeluAndMul's: by its approximate argument); kWithY: the
// op also takes `y` and writes the forward's output there (SiluAndMulRecompute's).
template <const OpSchema& S, int act, bool kWithY = false>
int32_t backward(const Args<S>& a, void* stream) {
  const char* op_name = a.op();
  int op = act;
  if constexpr (act == KH_ACT_GELU_AND_MUL) KH_TRY(gelu_op(op_name, a.integer("approximate"), &op));
  RowsView dy, x, dx;
  KH_TRY(rows_view(a.tensor("x"), &x));
  int64_t d = 0;
  KH_TRY(output_cols(op_name, op, x, &d));
  KH_TRY(rows_like(a.tensor("dy"), x, d, kh_act_is_glu(op) ? "y" : "x", &dy));
  KH_TRY(rows_like(a.tensor("dx"), x, x.cols, "x", &dx));
  if constexpr (kWithY) {
    RowsView y;
    KH_TRY(rows_like(a.tensor("y"), x, d, "x with half the columns", &y));
    return run(op_name, op, x, &dy, dx, d, stream, &y);
  }
  return run(op_name, op, x, &dy, dx, d, stream);
}

constexpr kh_op_v1_t kOps[] = {
    op<forward<kSiluAndMul, KH_ACT_SILU_AND_MUL>>(),
    op<backward<kSiluAndMulBackward, KH_ACT_SILU_AND_MUL>>(),
    op<backward<kSiluAndMulBackwardRecompute, KH_ACT_SILU_AND_MUL, true>>(),
    op<forward<kGeluAndMul, KH_ACT_GELU_AND_MUL>>(),
    op<backward<kGeluAndMulBackward, KH_ACT_GELU_AND_MUL>>(),
    op<forward<kGeluTanh, KH_ACT_GELU_TANH>>(),
    op<backward<kGeluTanhBackward, KH_ACT_GELU_TANH>>(),
    op<forward<kSilu, KH_ACT_SILU>>(),
    op<backward<kSiluBackward, KH_ACT_SILU>>(),
};

// forward_train is the forward op: backward needs only the input, which the caller keeps.
constexpr kh_layer_v1_t kLayers[] = {
    layer("SiluAndMul", kSiluAndMul, kSiluAndMul, kSiluAndMulBackward),
    // For a caller that drops SiluAndMul's output after the forward (activation
    // recomputation): backward hands it back with dx, one pass instead of a forward and a
    // backward (a Qwen3-0.6B training step reads 2 x tokens x ffn fewer elements a layer).
    layer("SiluAndMulRecompute", kSiluAndMul, kSiluAndMul, kSiluAndMulBackwardRecompute),
    layer("GeluAndMul", kGeluAndMul, kGeluAndMul, kGeluAndMulBackward),
    layer("GeluTanh", kGeluTanh, kGeluTanh, kGeluTanhBackward),
    layer("Silu", kSilu, kSilu, kSiluBackward),
};

constexpr kh_module_v1_t kModule =
    make_module(kPackageName, kPackageVersion, "kernel-hub/activation " KH_BUILD_ID, kLayers, kOps);

}  // namespace
}  // namespace khk

KH_PACKAGE_ENTRY(khk::kModule)
