// Host library of the kernel-hub/norm package: layers RMSNorm, FusedAddRMSNorm and LayerNorm,
// each with forward (eval), forward_train (also writes the per-row fp32 statistics backward
// needs) and backward. Ops check their DLPack arguments, then run cpu.cpp on kDLCPU tensors or
// launch norm.cu's kernels through the loader (host->get_function / host->launch) on kDLCUDA
// tensors, with the launch geometry computed here.
//
// Tensors: x-like tensors are viewed as rows (leading dimensions collapsed, last dimension
// contiguous, any row stride >= the row length; kernels/common/tensor_args.h). weight/bias are
// contiguous with `cols` elements of x's dtype; mean/rstd are contiguous fp32 with one value per
// row. Outputs are preallocated and fully overwritten; y may be x itself and residual_out may be
// residual itself (in place), other overlaps are not allowed.
//
// Backward workspace: an fp32 tensor [W, K * cols] (K = 1 for RMSNorm, 2 for LayerNorm),
// W >= 1 chosen by the caller (the host library cannot query the GPU): min(W, rows) groups of
// threads each walk every W-th row and keep one fp32 partial row of the weight (and bias)
// gradient; a second kernel sums the partial rows in a fixed order (deterministic, no atomics).
// Recommended W: kh_norm_workspace_rows() in kernels/norm/launch_config.h (about #SMs x rows per
// CTA). The cpu path uses the workspace the same way.
#include <math.h>
#include <stdio.h>

#include "kernels/common/package_host.h"
#include "kernels/common/tensor_args.h"
#include "kernels/norm/cpu.h"
#include "kernels/norm/launch_config.h"

namespace khk {
namespace {

constexpr const char* kPackageName = "kernel-hub/norm";
constexpr const char* kPackageVersion = "1.0.0";

enum Kind { kRms = 0, kAddRms = 1, kLayer = 2 };
const char* kind_name(int kind) {
  return kind == kRms ? "rms" : kind == kAddRms ? "add_rms" : "ln";
}
const char* dtype_tag(int dtype) {
  return dtype == kBF16 ? "bf16" : dtype == kFP16 ? "fp16" : "fp32";
}

// A per-row statistics output (fp32, one per row, same device as x).
int32_t stats_arg(const char* op, const char* name, const DLTensor* t, const RowsView& x,
                  float** out) {
  VectorView v;
  KH_TRY(vector_view(op, name, t, x.rows, &v));
  KH_TRY(expect_dtype(op, name, v.dtype, kFP32, "per-row statistics are float32"));
  KH_TRY(expect_device(op, name, v.device, x.device));
  *out = reinterpret_cast<float*>(v.data);
  return KH_OK;
}

// A per-column parameter (weight, bias, their gradients): cols elements of x's dtype.
int32_t param_arg(const char* op, const char* name, const DLTensor* t, const RowsView& x,
                  VectorView* out) {
  KH_TRY(vector_view(op, name, t, x.cols, out));
  KH_TRY(expect_dtype(op, name, out->dtype, x.dtype, "the dtype of x"));
  KH_TRY(expect_device(op, name, out->device, x.device));
  return KH_OK;
}

// A row tensor shaped like x (same rows, cols, dtype and device; its own row stride).
int32_t like_x_arg(const char* op, const char* name, const DLTensor* t, const RowsView& x,
                   RowsView* out) {
  KH_TRY(rows_view(op, name, t, out));
  KH_TRY(expect_shape(op, name, *out, x.rows, x.cols, "x"));
  KH_TRY(expect_dtype(op, name, out->dtype, x.dtype, "the dtype of x"));
  KH_TRY(expect_device(op, name, out->device, x.device));
  return KH_OK;
}

int32_t eps_arg(const OpArgs& a, int32_t i, float* eps) {
  double e = 0;
  KH_TRY(a.real(i, "eps", &e));
  if (!(e >= 0) || !isfinite(e))
    return fail(KH_ERR_INVALID_ARGUMENT, "%s: eps must be a finite number >= 0, got %g", a.op, e);
  *eps = static_cast<float>(e);
  return KH_OK;
}

bool grid_fits(int64_t blocks) {
  return blocks >= 1 && blocks <= 0x7FFFFFFF;
}

// ---------------------------------------------------------------------------------------------
// Forward.
struct Forward {
  int kind = kRms;
  RowsView x, residual, y, residual_out;
  VectorView weight, bias;
  float* mean = nullptr;
  float* rstd = nullptr;
  float eps = 0.f;
};

int32_t run_forward(const char* op, const Forward& f, void* stream) {
  const RowsView& x = f.x;
  if (x.rows == 0 || x.cols == 0) return KH_OK;
  if (is_cpu(x.device)) {
    using norm_cpu::ConstRows;
    using norm_cpu::Rows;
    if (f.kind == kLayer) {
      norm_cpu::layer_forward(x.dtype, ConstRows{x.data, x.stride}, f.weight.data, f.bias.data,
                              Rows{f.y.data, f.y.stride}, f.mean, f.rstd, x.rows, x.cols, f.eps);
    } else {
      ConstRows res{f.kind == kAddRms ? f.residual.data : nullptr, f.residual.stride};
      norm_cpu::rms_forward(
          x.dtype, ConstRows{x.data, x.stride}, res, f.weight.data, Rows{f.y.data, f.y.stride},
          Rows{f.residual_out.data, f.residual_out.stride}, f.rstd, x.rows, x.cols, f.eps);
    }
    return KH_OK;
  }
  const int vec16 = dtype_vec16(x.dtype);
  bool vec = vectorizable(x, vec16) && vectorizable(f.y, vec16) && vectorizable(f.weight);
  if (f.kind == kAddRms)
    vec = vec && vectorizable(f.residual, vec16) && vectorizable(f.residual_out, vec16);
  if (f.kind == kLayer) vec = vec && vectorizable(f.bias);
  const RowLaunch cfg = forward_launch(x.rows, x.cols, vec ? vec16 : 1);
  if (!grid_fits(cfg.blocks))
    return fail(KH_ERR_UNSUPPORTED, "%s: %lld rows need more than 2^31-1 CTAs", op,
                static_cast<long long>(x.rows));
  char name[96];
  snprintf(name, sizeof name, "norm_fwd_%s_%s_%s_%s", kind_name(f.kind), dtype_tag(x.dtype),
           vec ? "vec" : "scalar", cfg.reg ? "reg" : "loop");
  const void* xp = x.data;
  const void* rp = f.kind == kAddRms ? f.residual.data : nullptr;
  const void* wp = f.weight.data;
  const void* bp = f.kind == kLayer ? f.bias.data : nullptr;
  void* yp = f.y.data;
  void* rop = f.kind == kAddRms ? f.residual_out.data : nullptr;
  long long sx = x.stride, sr = f.residual.stride, sy = f.y.stride, sro = f.residual_out.stride;
  float* mean = f.mean;
  float* rstd = f.rstd;
  long long rows = x.rows;
  int cols = static_cast<int>(x.cols);
  float eps = f.eps;
  void* params[] = {&xp,  &sx,  &rp,   &sr,   &wp,   &bp,   &yp, &sy,
                    &rop, &sro, &mean, &rstd, &rows, &cols, &eps};
  LaunchDims dims;
  dims.grid[0] = static_cast<uint32_t>(cfg.blocks);
  dims.block[0] = cfg.threads_per_row;
  dims.block[1] = cfg.rows_per_block;
  return launch_kernel(x.device.device_id, name, dims, params, stream);
}

// rms_norm(Tensor x, Tensor weight, float eps, Tensor(a!) y[, Tensor(b!) rstd]) -> ()
int32_t rms_norm_impl(const char* op, const kh_arg_t* args, int32_t nargs, void* stream,
                      bool train) {
  OpArgs a{op, args, nargs};
  KH_TRY(a.expect(train ? 5 : 4,
                  train ? "rms_norm_train(Tensor x, Tensor weight, float eps, Tensor(a!) y, "
                          "Tensor(b!) rstd)"
                        : "rms_norm(Tensor x, Tensor weight, float eps, Tensor(a!) y)"));
  const DLTensor *x, *w, *y, *rstd = nullptr;
  KH_TRY(a.tensor(0, "x", &x));
  KH_TRY(a.tensor(1, "weight", &w));
  KH_TRY(a.tensor(3, "y", &y));
  if (train) KH_TRY(a.tensor(4, "rstd", &rstd));
  Forward f;
  f.kind = kRms;
  KH_TRY(eps_arg(a, 2, &f.eps));
  KH_TRY(rows_view(op, "x", x, &f.x));
  KH_TRY(param_arg(op, "weight", w, f.x, &f.weight));
  KH_TRY(like_x_arg(op, "y", y, f.x, &f.y));
  if (train) KH_TRY(stats_arg(op, "rstd", rstd, f.x, &f.rstd));
  return run_forward(op, f, stream);
}

// fused_add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps, Tensor(a!) y,
//                    Tensor(b!) residual_out[, Tensor(c!) rstd]) -> ()
int32_t fused_add_rms_norm_impl(const char* op, const kh_arg_t* args, int32_t nargs, void* stream,
                                bool train) {
  OpArgs a{op, args, nargs};
  KH_TRY(a.expect(train ? 7 : 6,
                  train ? "fused_add_rms_norm_train(Tensor x, Tensor residual, Tensor weight, "
                          "float eps, Tensor(a!) y, Tensor(b!) residual_out, Tensor(c!) rstd)"
                        : "fused_add_rms_norm(Tensor x, Tensor residual, Tensor weight, float "
                          "eps, Tensor(a!) y, Tensor(b!) residual_out)"));
  const DLTensor *x, *res, *w, *y, *res_out, *rstd = nullptr;
  KH_TRY(a.tensor(0, "x", &x));
  KH_TRY(a.tensor(1, "residual", &res));
  KH_TRY(a.tensor(2, "weight", &w));
  KH_TRY(a.tensor(4, "y", &y));
  KH_TRY(a.tensor(5, "residual_out", &res_out));
  if (train) KH_TRY(a.tensor(6, "rstd", &rstd));
  Forward f;
  f.kind = kAddRms;
  KH_TRY(eps_arg(a, 3, &f.eps));
  KH_TRY(rows_view(op, "x", x, &f.x));
  KH_TRY(like_x_arg(op, "residual", res, f.x, &f.residual));
  KH_TRY(param_arg(op, "weight", w, f.x, &f.weight));
  KH_TRY(like_x_arg(op, "y", y, f.x, &f.y));
  KH_TRY(like_x_arg(op, "residual_out", res_out, f.x, &f.residual_out));
  if (train) KH_TRY(stats_arg(op, "rstd", rstd, f.x, &f.rstd));
  return run_forward(op, f, stream);
}

// layer_norm(Tensor x, Tensor weight, Tensor bias, float eps, Tensor(a!) y[, Tensor(b!) mean,
//            Tensor(c!) rstd]) -> ()
int32_t layer_norm_impl(const char* op, const kh_arg_t* args, int32_t nargs, void* stream,
                        bool train) {
  OpArgs a{op, args, nargs};
  KH_TRY(a.expect(train ? 7 : 5,
                  train ? "layer_norm_train(Tensor x, Tensor weight, Tensor bias, float eps, "
                          "Tensor(a!) y, Tensor(b!) mean, Tensor(c!) rstd)"
                        : "layer_norm(Tensor x, Tensor weight, Tensor bias, float eps, Tensor(a!) "
                          "y)"));
  const DLTensor *x, *w, *b, *y, *mean = nullptr, *rstd = nullptr;
  KH_TRY(a.tensor(0, "x", &x));
  KH_TRY(a.tensor(1, "weight", &w));
  KH_TRY(a.tensor(2, "bias", &b));
  KH_TRY(a.tensor(4, "y", &y));
  if (train) {
    KH_TRY(a.tensor(5, "mean", &mean));
    KH_TRY(a.tensor(6, "rstd", &rstd));
  }
  Forward f;
  f.kind = kLayer;
  KH_TRY(eps_arg(a, 3, &f.eps));
  KH_TRY(rows_view(op, "x", x, &f.x));
  KH_TRY(param_arg(op, "weight", w, f.x, &f.weight));
  KH_TRY(param_arg(op, "bias", b, f.x, &f.bias));
  KH_TRY(like_x_arg(op, "y", y, f.x, &f.y));
  if (train) {
    KH_TRY(stats_arg(op, "mean", mean, f.x, &f.mean));
    KH_TRY(stats_arg(op, "rstd", rstd, f.x, &f.rstd));
  }
  return run_forward(op, f, stream);
}

// ---------------------------------------------------------------------------------------------
// Backward.
struct Backward {
  bool layer = false;
  RowsView dy, x, dresidual, dx, workspace;
  VectorView weight, dweight, dbias;
  const float* mean = nullptr;
  const float* rstd = nullptr;
};

int32_t workspace_arg(const char* op, const DLTensor* t, const RowsView& x, int k, RowsView* out) {
  KH_TRY(rows_view(op, "workspace", t, out));
  KH_TRY(expect_dtype(op, "workspace", out->dtype, kFP32, "the workspace holds fp32 partials"));
  KH_TRY(expect_device(op, "workspace", out->device, x.device));
  if (out->cols != k * x.cols || (x.rows > 0 && out->rows < 1))
    return fail(KH_ERR_INVALID_ARGUMENT,
                "%s: workspace is %lld x %lld; expected float32 [W, %d * cols] = [W, %lld] with "
                "W >= 1 (about #SMs; see kh_norm_workspace_rows)",
                op, static_cast<long long>(out->rows), static_cast<long long>(out->cols), k,
                static_cast<long long>(k * x.cols));
  if (out->rows > 0x7FFFFFFF)
    return fail(KH_ERR_UNSUPPORTED, "%s: workspace has more than 2^31-1 rows", op);
  return KH_OK;
}

int32_t run_backward(const char* op, const Backward& b, void* stream) {
  const RowsView& x = b.x;
  if (x.cols == 0) return KH_OK;
  const int k = b.layer ? 2 : 1;
  const int64_t walkers = x.rows < b.workspace.rows ? x.rows : b.workspace.rows;
  if (is_cpu(x.device)) {
    using norm_cpu::ConstRows;
    using norm_cpu::Rows;
    norm_cpu::Partials pt{reinterpret_cast<float*>(b.workspace.data), b.workspace.stride, walkers};
    if (b.layer) {
      norm_cpu::layer_backward(x.dtype, ConstRows{b.dy.data, b.dy.stride},
                               ConstRows{x.data, x.stride}, b.weight.data, b.mean, b.rstd,
                               Rows{b.dx.data, b.dx.stride}, b.dweight.data, b.dbias.data, pt,
                               x.rows, x.cols);
    } else {
      norm_cpu::rms_backward(x.dtype, ConstRows{b.dy.data, b.dy.stride},
                             ConstRows{x.data, x.stride}, b.weight.data, b.rstd,
                             ConstRows{b.dresidual.data, b.dresidual.stride},
                             Rows{b.dx.data, b.dx.stride}, b.dweight.data, pt, x.rows, x.cols);
    }
    return KH_OK;
  }
  const int device = x.device.device_id;
  const void* dyp = b.dy.data;
  const void* xp = x.data;
  const void* wp = b.weight.data;
  const float* mean = b.mean;
  const float* rstd = b.rstd;
  const void* drp = b.dresidual.data;
  void* dxp = b.dx.data;
  float* ws = reinterpret_cast<float*>(b.workspace.data);
  long long sdy = b.dy.stride, sx = x.stride, sdr = b.dresidual.stride, sdx = b.dx.stride,
            sws = b.workspace.stride;
  long long nwalkers = walkers, rows = x.rows;
  int cols = static_cast<int>(x.cols);
  if (walkers > 0) {
    const int vec16 = dtype_vec16(x.dtype);
    bool vec = vectorizable(x, vec16) && vectorizable(b.dy, vec16) && vectorizable(b.dx, vec16) &&
               vectorizable(b.weight) && aligned16(b.workspace.data) &&
               (b.workspace.stride % 4) == 0;
    if (b.dresidual.data) vec = vec && vectorizable(b.dresidual, vec16);
    const RowLaunch cfg = backward_launch(walkers, x.cols, vec ? vec16 : 1);
    if (!grid_fits(cfg.blocks))
      return fail(KH_ERR_UNSUPPORTED, "%s: %lld workspace rows need more than 2^31-1 CTAs", op,
                  static_cast<long long>(walkers));
    char name[96];
    snprintf(name, sizeof name, "norm_bwd_%s_%s_%s_%s", b.layer ? "ln" : "rms", dtype_tag(x.dtype),
             vec ? "vec" : "scalar", cfg.reg ? "reg" : "loop");
    void* params[] = {&dyp, &sdy, &xp,  &sx, &wp,  &mean,     &rstd, &drp,
                      &sdr, &dxp, &sdx, &ws, &sws, &nwalkers, &rows, &cols};
    LaunchDims dims;
    dims.grid[0] = static_cast<uint32_t>(cfg.blocks);
    dims.block[0] = cfg.threads_per_row;
    dims.block[1] = cfg.rows_per_block;
    KH_TRY(launch_kernel(device, name, dims, params, stream));
  }
  // The reduce runs with 0 walkers too: then it writes zero gradients.
  char rname[64];
  snprintf(rname, sizeof rname, "norm_reduce_partials_%s", dtype_tag(x.dtype));
  int iwalkers = static_cast<int>(walkers);
  void* dwp = b.dweight.data;
  void* dbp = b.layer ? b.dbias.data : nullptr;
  const float* wsc = ws;
  void* rparams[] = {&wsc, &sws, &iwalkers, &cols, const_cast<int*>(&k), &dwp, &dbp};
  LaunchDims rdims;
  rdims.grid[0] = static_cast<uint32_t>((int64_t{k} * cols + 31) / 32);
  rdims.block[0] = 32;
  rdims.block[1] = 8;
  return launch_kernel(device, rname, rdims, rparams, stream);
}

// rms_norm_backward(Tensor dy, Tensor x, Tensor weight, Tensor rstd, Tensor(a!) dx,
//                   Tensor(b!) dweight, Tensor(c!) workspace) -> ()
int32_t rms_norm_backward(const kh_arg_t* args, int32_t nargs, void* stream) {
  const char* op = "rms_norm_backward";
  OpArgs a{op, args, nargs};
  KH_TRY(a.expect(7,
                  "rms_norm_backward(Tensor dy, Tensor x, Tensor weight, Tensor rstd, "
                  "Tensor(a!) dx, Tensor(b!) dweight, Tensor(c!) workspace)"));
  const DLTensor *dy, *x, *w, *rstd, *dx, *dw, *ws;
  KH_TRY(a.tensor(0, "dy", &dy));
  KH_TRY(a.tensor(1, "x", &x));
  KH_TRY(a.tensor(2, "weight", &w));
  KH_TRY(a.tensor(3, "rstd", &rstd));
  KH_TRY(a.tensor(4, "dx", &dx));
  KH_TRY(a.tensor(5, "dweight", &dw));
  KH_TRY(a.tensor(6, "workspace", &ws));
  Backward b;
  KH_TRY(rows_view(op, "x", x, &b.x));
  KH_TRY(like_x_arg(op, "dy", dy, b.x, &b.dy));
  KH_TRY(param_arg(op, "weight", w, b.x, &b.weight));
  float* r = nullptr;
  KH_TRY(stats_arg(op, "rstd", rstd, b.x, &r));
  b.rstd = r;
  KH_TRY(like_x_arg(op, "dx", dx, b.x, &b.dx));
  KH_TRY(param_arg(op, "dweight", dw, b.x, &b.dweight));
  KH_TRY(workspace_arg(op, ws, b.x, 1, &b.workspace));
  return run_backward(op, b, stream);
}

// fused_add_rms_norm_backward(Tensor dy, Tensor? dresidual_out, Tensor residual_out,
//     Tensor weight, Tensor rstd, Tensor(a!) dx, Tensor(b!) dweight, Tensor(c!) workspace) -> ()
// dx is the gradient of both x and residual (they enter as a sum); dresidual_out (the gradient
// arriving at the new residual) may be NULL for zero.
int32_t fused_add_rms_norm_backward(const kh_arg_t* args, int32_t nargs, void* stream) {
  const char* op = "fused_add_rms_norm_backward";
  OpArgs a{op, args, nargs};
  KH_TRY(a.expect(8,
                  "fused_add_rms_norm_backward(Tensor dy, Tensor? dresidual_out, Tensor "
                  "residual_out, Tensor weight, Tensor rstd, Tensor(a!) dx, Tensor(b!) "
                  "dweight, Tensor(c!) workspace)"));
  const DLTensor *dy, *dres, *s, *w, *rstd, *dx, *dw, *ws;
  KH_TRY(a.tensor(0, "dy", &dy));
  KH_TRY(a.tensor(1, "dresidual_out", &dres, /*optional=*/true));
  KH_TRY(a.tensor(2, "residual_out", &s));
  KH_TRY(a.tensor(3, "weight", &w));
  KH_TRY(a.tensor(4, "rstd", &rstd));
  KH_TRY(a.tensor(5, "dx", &dx));
  KH_TRY(a.tensor(6, "dweight", &dw));
  KH_TRY(a.tensor(7, "workspace", &ws));
  Backward b;
  KH_TRY(rows_view(op, "residual_out", s, &b.x));
  KH_TRY(like_x_arg(op, "dy", dy, b.x, &b.dy));
  if (dres) KH_TRY(like_x_arg(op, "dresidual_out", dres, b.x, &b.dresidual));
  KH_TRY(param_arg(op, "weight", w, b.x, &b.weight));
  float* r = nullptr;
  KH_TRY(stats_arg(op, "rstd", rstd, b.x, &r));
  b.rstd = r;
  KH_TRY(like_x_arg(op, "dx", dx, b.x, &b.dx));
  KH_TRY(param_arg(op, "dweight", dw, b.x, &b.dweight));
  KH_TRY(workspace_arg(op, ws, b.x, 1, &b.workspace));
  return run_backward(op, b, stream);
}

// layer_norm_backward(Tensor dy, Tensor x, Tensor weight, Tensor mean, Tensor rstd,
//     Tensor(a!) dx, Tensor(b!) dweight, Tensor(c!) dbias, Tensor(d!) workspace) -> ()
int32_t layer_norm_backward(const kh_arg_t* args, int32_t nargs, void* stream) {
  const char* op = "layer_norm_backward";
  OpArgs a{op, args, nargs};
  KH_TRY(a.expect(9,
                  "layer_norm_backward(Tensor dy, Tensor x, Tensor weight, Tensor mean, "
                  "Tensor rstd, Tensor(a!) dx, Tensor(b!) dweight, Tensor(c!) dbias, "
                  "Tensor(d!) workspace)"));
  const DLTensor *dy, *x, *w, *mean, *rstd, *dx, *dw, *db, *ws;
  KH_TRY(a.tensor(0, "dy", &dy));
  KH_TRY(a.tensor(1, "x", &x));
  KH_TRY(a.tensor(2, "weight", &w));
  KH_TRY(a.tensor(3, "mean", &mean));
  KH_TRY(a.tensor(4, "rstd", &rstd));
  KH_TRY(a.tensor(5, "dx", &dx));
  KH_TRY(a.tensor(6, "dweight", &dw));
  KH_TRY(a.tensor(7, "dbias", &db));
  KH_TRY(a.tensor(8, "workspace", &ws));
  Backward b;
  b.layer = true;
  KH_TRY(rows_view(op, "x", x, &b.x));
  KH_TRY(like_x_arg(op, "dy", dy, b.x, &b.dy));
  KH_TRY(param_arg(op, "weight", w, b.x, &b.weight));
  float *m = nullptr, *r = nullptr;
  KH_TRY(stats_arg(op, "mean", mean, b.x, &m));
  KH_TRY(stats_arg(op, "rstd", rstd, b.x, &r));
  b.mean = m;
  b.rstd = r;
  KH_TRY(like_x_arg(op, "dx", dx, b.x, &b.dx));
  KH_TRY(param_arg(op, "dweight", dw, b.x, &b.dweight));
  KH_TRY(param_arg(op, "dbias", db, b.x, &b.dbias));
  KH_TRY(workspace_arg(op, ws, b.x, 2, &b.workspace));
  return run_backward(op, b, stream);
}

int32_t rms_norm(const kh_arg_t* a, int32_t n, void* s) {
  return rms_norm_impl("rms_norm", a, n, s, false);
}
int32_t rms_norm_train(const kh_arg_t* a, int32_t n, void* s) {
  return rms_norm_impl("rms_norm_train", a, n, s, true);
}
int32_t fused_add_rms_norm(const kh_arg_t* a, int32_t n, void* s) {
  return fused_add_rms_norm_impl("fused_add_rms_norm", a, n, s, false);
}
int32_t fused_add_rms_norm_train(const kh_arg_t* a, int32_t n, void* s) {
  return fused_add_rms_norm_impl("fused_add_rms_norm_train", a, n, s, true);
}
int32_t layer_norm(const kh_arg_t* a, int32_t n, void* s) {
  return layer_norm_impl("layer_norm", a, n, s, false);
}
int32_t layer_norm_train(const kh_arg_t* a, int32_t n, void* s) {
  return layer_norm_impl("layer_norm_train", a, n, s, true);
}

// ---------------------------------------------------------------------------------------------
// The module table.
#define KH_OP(name, schema, fn) \
  { KH_HEADER_INIT(kh_op_v1_t), name, schema, kOpFlags, fn }

const kh_op_v1_t kOps[] = {
    KH_OP("rms_norm", "rms_norm(Tensor x, Tensor weight, float eps, Tensor(a!) y) -> ()", rms_norm),
    KH_OP("rms_norm_train",
          "rms_norm_train(Tensor x, Tensor weight, float eps, Tensor(a!) y, Tensor(b!) rstd) -> ()",
          rms_norm_train),
    KH_OP("rms_norm_backward",
          "rms_norm_backward(Tensor dy, Tensor x, Tensor weight, Tensor rstd, Tensor(a!) dx, "
          "Tensor(b!) dweight, Tensor(c!) workspace) -> ()",
          rms_norm_backward),
    KH_OP("fused_add_rms_norm",
          "fused_add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps, Tensor(a!) y, "
          "Tensor(b!) residual_out) -> ()",
          fused_add_rms_norm),
    KH_OP("fused_add_rms_norm_train",
          "fused_add_rms_norm_train(Tensor x, Tensor residual, Tensor weight, float eps, "
          "Tensor(a!) y, Tensor(b!) residual_out, Tensor(c!) rstd) -> ()",
          fused_add_rms_norm_train),
    KH_OP("fused_add_rms_norm_backward",
          "fused_add_rms_norm_backward(Tensor dy, Tensor? dresidual_out, Tensor residual_out, "
          "Tensor weight, Tensor rstd, Tensor(a!) dx, Tensor(b!) dweight, Tensor(c!) workspace) "
          "-> ()",
          fused_add_rms_norm_backward),
    KH_OP("layer_norm",
          "layer_norm(Tensor x, Tensor weight, Tensor bias, float eps, Tensor(a!) y) -> ()",
          layer_norm),
    KH_OP("layer_norm_train",
          "layer_norm_train(Tensor x, Tensor weight, Tensor bias, float eps, Tensor(a!) y, "
          "Tensor(b!) mean, Tensor(c!) rstd) -> ()",
          layer_norm_train),
    KH_OP("layer_norm_backward",
          "layer_norm_backward(Tensor dy, Tensor x, Tensor weight, Tensor mean, Tensor rstd, "
          "Tensor(a!) dx, Tensor(b!) dweight, Tensor(c!) dbias, Tensor(d!) workspace) -> ()",
          layer_norm_backward),
};

const kh_layer_v1_t kLayers[] = {
    {KH_HEADER_INIT(kh_layer_v1_t), "RMSNorm", "rms_norm", "rms_norm_train", "rms_norm_backward",
     kLayerFlags, kDtypes},
    {KH_HEADER_INIT(kh_layer_v1_t), "FusedAddRMSNorm", "fused_add_rms_norm",
     "fused_add_rms_norm_train", "fused_add_rms_norm_backward", kLayerFlags, kDtypes},
    {KH_HEADER_INIT(kh_layer_v1_t), "LayerNorm", "layer_norm", "layer_norm_train",
     "layer_norm_backward", kLayerFlags, kDtypes},
};

constexpr kh_module_v1_t kModule =
    make_module(kPackageName, kPackageVersion, "kernel-hub/norm " KH_BUILD_ID, kLayers, kOps);

}  // namespace
}  // namespace khk

KH_PACKAGE_ENTRY(khk::kModule)
