// Host library of the kernel-hub/norm package: layers RMSNorm, FusedAddRMSNorm and LayerNorm,
// each with forward (eval), forward_train (also writes the per-row fp32 statistics backward
// needs) and backward; FusedAddRMSNormFromOutput is FusedAddRMSNorm with a backward that takes the
// forward's output instead of the residual. Ops check their DLPack arguments, then run cpu.cpp on kDLCPU tensors or
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

#include "kernels/common/op_schema.h"
#include "kernels/common/package_host.h"
#include "kernels/common/tensor_args.h"
#include "kernels/norm/cpu.h"
#include "kernels/norm/launch_config.h"

namespace khk {
namespace {

constexpr const char* kPackageName = "kernel-hub/norm";
constexpr const char* kPackageVersion = "1.1.0";

enum Kind { kRms = 0, kAddRms = 1, kLayer = 2 };
const char* kind_name(int kind) {
  return kind == kRms ? "rms" : kind == kAddRms ? "add_rms" : "ln";
}
const char* dtype_tag(int dtype) {
  return dtype == kBF16 ? "bf16" : dtype == kFP16 ? "fp16" : "fp32";
}

// A per-row statistics output (fp32, one per row, same device as x).
int32_t stats_arg(const TensorArg& t, const RowsView& x, float** out) {
  VectorView v;
  KH_TRY(vector_view(t, x.rows, &v));
  KH_TRY(expect_dtype(t, v.dtype, kFP32, "per-row statistics are float32"));
  KH_TRY(expect_device(t, v.device, x.device));
  *out = reinterpret_cast<float*>(v.data);
  return KH_OK;
}

// A per-column parameter (weight, bias, their gradients): cols elements of x's dtype.
int32_t param_arg(const TensorArg& t, const RowsView& x, VectorView* out) {
  KH_TRY(vector_view(t, x.cols, out));
  KH_TRY(expect_dtype(t, out->dtype, x.dtype, "the dtype of x"));
  KH_TRY(expect_device(t, out->device, x.device));
  return KH_OK;
}

// A row tensor shaped like x (same rows, cols, dtype and device; its own row stride).
int32_t like_x_arg(const TensorArg& t, const RowsView& x, RowsView* out) {
  KH_TRY(rows_view(t, out));
  KH_TRY(expect_shape(t, *out, x.rows, x.cols, "x"));
  KH_TRY(expect_dtype(t, out->dtype, x.dtype, "the dtype of x"));
  KH_TRY(expect_device(t, out->device, x.device));
  return KH_OK;
}

int32_t eps_arg(const char* op, double e, float* eps) {
  if (!(e >= 0) || !isfinite(e))
    return fail(KH_ERR_INVALID_ARGUMENT, "%s: eps must be a finite number >= 0, got %g", op, e);
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
  dims.flags = kPdlEntry;
  dims.grid[0] = static_cast<uint32_t>(cfg.blocks);
  dims.block[0] = cfg.threads_per_row;
  dims.block[1] = cfg.rows_per_block;
  return launch_kernel(x.device.device_id, name, dims, params, stream);
}

constexpr OpSchema kRmsNorm{"rms_norm(Tensor x, Tensor weight, float eps, Tensor(a!) y) -> ()"};
constexpr OpSchema kRmsNormTrain{
    "rms_norm_train(Tensor x, Tensor weight, float eps, Tensor(a!) y, Tensor(b!) rstd) -> ()"};
constexpr OpSchema kFusedAddRmsNorm{
    "fused_add_rms_norm(Tensor x, Tensor residual, Tensor weight, float eps, Tensor(a!) y, "
    "Tensor(b!) residual_out) -> ()"};
constexpr OpSchema kFusedAddRmsNormTrain{
    "fused_add_rms_norm_train(Tensor x, Tensor residual, Tensor weight, float eps, Tensor(a!) y, "
    "Tensor(b!) residual_out, Tensor(c!) rstd) -> ()"};
constexpr OpSchema kLayerNorm{
    "layer_norm(Tensor x, Tensor weight, Tensor bias, float eps, Tensor(a!) y) -> ()"};
constexpr OpSchema kLayerNormTrain{
    "layer_norm_train(Tensor x, Tensor weight, Tensor bias, float eps, Tensor(a!) y, "
    "Tensor(b!) mean, Tensor(c!) rstd) -> ()"};

// rms_norm, and rms_norm_train, which also writes rstd.
template <const OpSchema& S>
int32_t rms_norm(const Args<S>& a, void* stream) {
  Forward f;
  f.kind = kRms;
  KH_TRY(eps_arg(a.op(), a.real("eps"), &f.eps));
  KH_TRY(rows_view(a.tensor("x"), &f.x));
  KH_TRY(param_arg(a.tensor("weight"), f.x, &f.weight));
  KH_TRY(like_x_arg(a.tensor("y"), f.x, &f.y));
  if constexpr (&S == &kRmsNormTrain) KH_TRY(stats_arg(a.tensor("rstd"), f.x, &f.rstd));
  return run_forward(a.op(), f, stream);
}

// fused_add_rms_norm, and fused_add_rms_norm_train, which also writes rstd.
template <const OpSchema& S>
int32_t fused_add_rms_norm(const Args<S>& a, void* stream) {
  Forward f;
  f.kind = kAddRms;
  KH_TRY(eps_arg(a.op(), a.real("eps"), &f.eps));
  KH_TRY(rows_view(a.tensor("x"), &f.x));
  KH_TRY(like_x_arg(a.tensor("residual"), f.x, &f.residual));
  KH_TRY(param_arg(a.tensor("weight"), f.x, &f.weight));
  KH_TRY(like_x_arg(a.tensor("y"), f.x, &f.y));
  KH_TRY(like_x_arg(a.tensor("residual_out"), f.x, &f.residual_out));
  if constexpr (&S == &kFusedAddRmsNormTrain) KH_TRY(stats_arg(a.tensor("rstd"), f.x, &f.rstd));
  return run_forward(a.op(), f, stream);
}

// layer_norm, and layer_norm_train, which also writes mean and rstd.
template <const OpSchema& S>
int32_t layer_norm(const Args<S>& a, void* stream) {
  Forward f;
  f.kind = kLayer;
  KH_TRY(eps_arg(a.op(), a.real("eps"), &f.eps));
  KH_TRY(rows_view(a.tensor("x"), &f.x));
  KH_TRY(param_arg(a.tensor("weight"), f.x, &f.weight));
  KH_TRY(param_arg(a.tensor("bias"), f.x, &f.bias));
  KH_TRY(like_x_arg(a.tensor("y"), f.x, &f.y));
  if constexpr (&S == &kLayerNormTrain) {
    KH_TRY(stats_arg(a.tensor("mean"), f.x, &f.mean));
    KH_TRY(stats_arg(a.tensor("rstd"), f.x, &f.rstd));
  }
  return run_forward(a.op(), f, stream);
}

// ---------------------------------------------------------------------------------------------
// Backward.
struct Backward {
  bool layer = false;
  bool from_y = false;  // x holds the forward's output y (RMSNorm): norm.cu's rmsy kernels
  RowsView dy, x, dresidual, dx, workspace;
  VectorView weight, dweight, dbias;
  const float* mean = nullptr;
  const float* rstd = nullptr;
};

int32_t workspace_arg(const TensorArg& t, const RowsView& x, int k, RowsView* out) {
  KH_TRY(rows_view(t, out));
  KH_TRY(expect_dtype(t, out->dtype, kFP32, "the workspace holds fp32 partials"));
  KH_TRY(expect_device(t, out->device, x.device));
  if (out->cols != k * x.cols || (x.rows > 0 && out->rows < 1))
    return fail(KH_ERR_INVALID_ARGUMENT,
                "%s: %s is %lld x %lld; expected float32 [W, %d * cols] = [W, %lld] with "
                "W >= 1 (about #SMs; see kh_norm_workspace_rows)",
                t.op, t.name, static_cast<long long>(out->rows), static_cast<long long>(out->cols),
                k, static_cast<long long>(k * x.cols));
  if (out->rows > 0x7FFFFFFF)
    return fail(KH_ERR_UNSUPPORTED, "%s: %s has more than 2^31-1 rows", t.op, t.name);
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
      norm_cpu::rms_backward(
          x.dtype, ConstRows{b.dy.data, b.dy.stride}, ConstRows{x.data, x.stride}, b.weight.data,
          b.rstd, ConstRows{b.dresidual.data, b.dresidual.stride}, Rows{b.dx.data, b.dx.stride},
          b.dweight.data, pt, x.rows, x.cols, b.from_y);
    }
    return KH_OK;
  }
  // Workspace rows the reduce sums: one per walker, or one per CTA of short-row walkers.
  int64_t partial_rows = walkers;
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
    RowLaunch cfg = backward_launch(walkers, x.cols, vec ? vec16 : 1);
    LaunchDims dims;
    dims.flags = kPdlEntry;
    if (cfg.reg && cfg.rows_per_block > 1) {
      // Short rows: each workspace row takes a CTA of rows_per_block walkers (norm.cu sums them
      // in shared memory), so the rows spread over rows_per_block times as many walkers.
      const int64_t rpb = cfg.rows_per_block;
      const int64_t needed = (x.rows + rpb - 1) / rpb;
      cfg.blocks = b.workspace.rows < needed ? b.workspace.rows : needed;
      nwalkers = cfg.blocks * rpb;
      partial_rows = cfg.blocks;
      dims.shared_mem_bytes = static_cast<uint32_t>(rpb * k * x.cols * sizeof(float));
    }
    if (!grid_fits(cfg.blocks))
      return fail(KH_ERR_UNSUPPORTED, "%s: %lld workspace rows need more than 2^31-1 CTAs", op,
                  static_cast<long long>(walkers));
    char name[96];
    snprintf(name, sizeof name, "norm_bwd_%s_%s_%s_%s",
             b.layer ? "ln" : (b.from_y ? "rmsy" : "rms"), dtype_tag(x.dtype),
             vec ? "vec" : "scalar", cfg.reg ? "reg" : "loop");
    void* params[] = {&dyp, &sdy, &xp,  &sx, &wp,  &mean,     &rstd, &drp,
                      &sdr, &dxp, &sdx, &ws, &sws, &nwalkers, &rows, &cols};
    dims.grid[0] = static_cast<uint32_t>(cfg.blocks);
    dims.block[0] = cfg.threads_per_row;
    dims.block[1] = cfg.rows_per_block;
    KH_TRY(launch_kernel(device, name, dims, params, stream));
  }
  // The reduce runs with 0 walkers too: then it writes zero gradients.
  char rname[64];
  snprintf(rname, sizeof rname, "norm_reduce_partials_%s", dtype_tag(x.dtype));
  return launch_reduce_partials(device, rname, ws, sws, static_cast<int>(partial_rows), cols, k,
                                b.dweight.data, b.layer ? b.dbias.data : nullptr, stream);
}

constexpr OpSchema kRmsNormBackward{
    "rms_norm_backward(Tensor dy, Tensor x, Tensor weight, Tensor rstd, Tensor(a!) dx, "
    "Tensor(b!) dweight, Tensor(c!) workspace) -> ()"};
// dx is the gradient of both x and residual (they enter as a sum); dresidual_out (the gradient
// arriving at the new residual) may be NULL for zero.
constexpr OpSchema kFusedAddRmsNormBackward{
    "fused_add_rms_norm_backward(Tensor dy, Tensor? dresidual_out, Tensor residual_out, "
    "Tensor weight, Tensor rstd, Tensor(a!) dx, Tensor(b!) dweight, Tensor(c!) workspace) -> ()"};
// FusedAddRMSNormFromOutput's backward: fused_add_rms_norm_backward with the forward's output y
// in place of residual_out (xhat = y / weight: 0 in a column whose weight is 0), so that a
// caller keeping y (the next GEMM's input, for its weight gradient) need not keep the residual.
constexpr OpSchema kFusedAddRmsNormBackwardFromOutput{
    "fused_add_rms_norm_backward_from_output(Tensor dy, Tensor? dresidual_out, Tensor y, "
    "Tensor weight, Tensor rstd, Tensor(a!) dx, Tensor(b!) dweight, Tensor(c!) workspace) -> ()"};
constexpr OpSchema kLayerNormBackward{
    "layer_norm_backward(Tensor dy, Tensor x, Tensor weight, Tensor mean, Tensor rstd, "
    "Tensor(a!) dx, Tensor(b!) dweight, Tensor(c!) dbias, Tensor(d!) workspace) -> ()"};

int32_t rms_norm_backward(const Args<kRmsNormBackward>& a, void* stream) {
  Backward b;
  KH_TRY(rows_view(a.tensor("x"), &b.x));
  KH_TRY(like_x_arg(a.tensor("dy"), b.x, &b.dy));
  KH_TRY(param_arg(a.tensor("weight"), b.x, &b.weight));
  float* r = nullptr;
  KH_TRY(stats_arg(a.tensor("rstd"), b.x, &r));
  b.rstd = r;
  KH_TRY(like_x_arg(a.tensor("dx"), b.x, &b.dx));
  KH_TRY(param_arg(a.tensor("dweight"), b.x, &b.dweight));
  KH_TRY(workspace_arg(a.tensor("workspace"), b.x, 1, &b.workspace));
  return run_backward(a.op(), b, stream);
}

template <const OpSchema& S>
int32_t fused_add_rms_norm_backward(const Args<S>& a, void* stream) {
  Backward b;
  if constexpr (&S == &kFusedAddRmsNormBackwardFromOutput) {
    b.from_y = true;
    KH_TRY(rows_view(a.tensor("y"), &b.x));
  } else {
    KH_TRY(rows_view(a.tensor("residual_out"), &b.x));
  }
  KH_TRY(like_x_arg(a.tensor("dy"), b.x, &b.dy));
  const TensorArg dres = a.optional_tensor("dresidual_out");
  if (dres.t) KH_TRY(like_x_arg(dres, b.x, &b.dresidual));
  KH_TRY(param_arg(a.tensor("weight"), b.x, &b.weight));
  float* r = nullptr;
  KH_TRY(stats_arg(a.tensor("rstd"), b.x, &r));
  b.rstd = r;
  KH_TRY(like_x_arg(a.tensor("dx"), b.x, &b.dx));
  KH_TRY(param_arg(a.tensor("dweight"), b.x, &b.dweight));
  KH_TRY(workspace_arg(a.tensor("workspace"), b.x, 1, &b.workspace));
  return run_backward(a.op(), b, stream);
}

int32_t layer_norm_backward(const Args<kLayerNormBackward>& a, void* stream) {
  Backward b;
  b.layer = true;
  KH_TRY(rows_view(a.tensor("x"), &b.x));
  KH_TRY(like_x_arg(a.tensor("dy"), b.x, &b.dy));
  KH_TRY(param_arg(a.tensor("weight"), b.x, &b.weight));
  float *m = nullptr, *r = nullptr;
  KH_TRY(stats_arg(a.tensor("mean"), b.x, &m));
  KH_TRY(stats_arg(a.tensor("rstd"), b.x, &r));
  b.mean = m;
  b.rstd = r;
  KH_TRY(like_x_arg(a.tensor("dx"), b.x, &b.dx));
  KH_TRY(param_arg(a.tensor("dweight"), b.x, &b.dweight));
  KH_TRY(param_arg(a.tensor("dbias"), b.x, &b.dbias));
  KH_TRY(workspace_arg(a.tensor("workspace"), b.x, 2, &b.workspace));
  return run_backward(a.op(), b, stream);
}

// ---------------------------------------------------------------------------------------------
// The module table.
constexpr kh_op_v1_t kOps[] = {
    op<rms_norm<kRmsNorm>>(),
    op<rms_norm<kRmsNormTrain>>(),
    op<rms_norm_backward>(),
    op<fused_add_rms_norm<kFusedAddRmsNorm>>(),
    op<fused_add_rms_norm<kFusedAddRmsNormTrain>>(),
    op<fused_add_rms_norm_backward<kFusedAddRmsNormBackward>>(),
    op<fused_add_rms_norm_backward<kFusedAddRmsNormBackwardFromOutput>>(),
    op<layer_norm<kLayerNorm>>(),
    op<layer_norm<kLayerNormTrain>>(),
    op<layer_norm_backward>(),
};

constexpr kh_layer_v1_t kLayers[] = {
    layer("RMSNorm", kRmsNorm, kRmsNormTrain, kRmsNormBackward),
    layer("FusedAddRMSNorm", kFusedAddRmsNorm, kFusedAddRmsNormTrain, kFusedAddRmsNormBackward),
    // The same forward; the backward from the output (see kFusedAddRmsNormBackwardFromOutput).
    layer("FusedAddRMSNormFromOutput", kFusedAddRmsNorm, kFusedAddRmsNormTrain,
          kFusedAddRmsNormBackwardFromOutput),
    layer("LayerNorm", kLayerNorm, kLayerNormTrain, kLayerNormBackward),
};

constexpr kh_module_v1_t kModule =
    make_module(kPackageName, kPackageVersion, "kernel-hub/norm " KH_BUILD_ID, kLayers, kOps);

}  // namespace
}  // namespace khk

KH_PACKAGE_ENTRY(khk::kModule)
