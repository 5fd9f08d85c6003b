// Host library of the kernel-hub/softmax package: layers Softmax (last dimension),
// CrossEntropy (large vocabularies, ignore_index, fp32 loss per token) and
// FusedLinearCrossEntropy (linear_ce.h: lm_head and cross-entropy fused, chunk by chunk). Ops check their DLPack
// arguments, then run cpu.cpp on kDLCPU tensors or launch softmax.cu's kernels through the
// loader on kDLCUDA tensors.
//
// Softmax: x, y, dy, dx are rows (leading dimensions collapsed, last dimension contiguous, any
// row stride >= the row length), one dtype. forward_train is the forward op (backward needs y,
// which the caller keeps). y may be x itself, dx may be dy or y (in place).
// CrossEntropy: logits [tokens, vocab] rows; targets int64 contiguous [tokens]; loss float32
// contiguous [tokens] (0 for tokens whose target is ignore_index, NaN for a target outside
// [0, vocab)). forward_train also writes dlogits = (softmax(logits) - onehot(target)) *
// grad_scale in the logits dtype (zero rows for ignored tokens); dlogits may be logits itself.
// backward multiplies dlogits in place by the per-token loss gradient dloss (float32 [tokens]);
// a caller that folds the upstream gradient into grad_scale (e.g. 1 / valid tokens for a mean)
// can skip it.
#include <math.h>
#include <stdio.h>

#include <initializer_list>

#include "kernels/common/op_schema.h"
#include "kernels/common/package_host.h"
#include "kernels/common/tensor_args.h"
#include "kernels/softmax/cpu.h"
#include "kernels/softmax/launch_config.h"
#include "kernels/softmax/linear_ce.h"
#include "kernels/softmax/rows_launch.h"

namespace khk {
namespace {

constexpr const char* kPackageName = "kernel-hub/softmax";
constexpr const char* kPackageVersion = "1.1.2";

// A row tensor shaped like x (same rows, cols, dtype and device; its own row stride).
int32_t like_arg(const TensorArg& t, const RowsView& x, const char* like, RowsView* out) {
  KH_TRY(rows_view(t, out));
  KH_TRY(expect_shape(t, *out, x.rows, x.cols, like));
  KH_TRY(expect_dtype(t, out->dtype, x.dtype, like));
  KH_TRY(expect_device(t, out->device, x.device));
  return KH_OK;
}

// A float32 contiguous vector with one value per row of x.
int32_t per_row_f32(const TensorArg& t, const RowsView& x, float** out) {
  VectorView v;
  KH_TRY(vector_view(t, x.rows, &v));
  KH_TRY(expect_dtype(t, v.dtype, kFP32, "per-token values are float32"));
  KH_TRY(expect_device(t, v.device, x.device));
  *out = reinterpret_cast<float*>(v.data);
  return KH_OK;
}

constexpr OpSchema kSoftmax{"softmax(Tensor x, Tensor(a!) y) -> ()"};
constexpr OpSchema kSoftmaxBackward{"softmax_backward(Tensor dy, Tensor y, Tensor(a!) dx) -> ()"};
constexpr OpSchema kCrossEntropy{
    "cross_entropy(Tensor logits, Tensor targets, int ignore_index, Tensor(a!) loss) -> ()"};
constexpr OpSchema kCrossEntropyTrain{
    "cross_entropy_train(Tensor logits, Tensor targets, int ignore_index, float grad_scale, "
    "Tensor(a!) loss, Tensor(b!) dlogits) -> ()"};
constexpr OpSchema kCrossEntropyBackward{
    "cross_entropy_backward(Tensor dloss, Tensor(a!) dlogits) -> ()"};

int32_t softmax(const Args<kSoftmax>& a, void* stream) {
  const char* op = a.op();
  RowsView x, y;
  KH_TRY(rows_view(a.tensor("x"), &x));
  KH_TRY(like_arg(a.tensor("y"), x, "x", &y));
  if (x.rows == 0 || x.cols == 0) return KH_OK;
  if (is_cpu(x.device)) {
    softmax_cpu::forward(x.dtype, x.data, x.stride, y.data, y.stride, x.rows, x.cols);
    return KH_OK;
  }
  const void* xp = x.data;
  void* yp = y.data;
  long long sx = x.stride, sy = y.stride, rows = x.rows;
  int cols = static_cast<int>(x.cols);
  void* params[] = {&xp, &sx, &yp, &sy, &rows, &cols};
  return launch_rows(op, "softmax_fwd", x, {&x, &y}, params, stream);
}

int32_t softmax_backward(const Args<kSoftmaxBackward>& a, void* stream) {
  const char* op = a.op();
  RowsView dy, y, dx;
  KH_TRY(rows_view(a.tensor("y"), &y));
  KH_TRY(like_arg(a.tensor("dy"), y, "y", &dy));
  KH_TRY(like_arg(a.tensor("dx"), y, "y", &dx));
  if (y.rows == 0 || y.cols == 0) return KH_OK;
  if (is_cpu(y.device)) {
    softmax_cpu::backward(y.dtype, dy.data, dy.stride, y.data, y.stride, dx.data, dx.stride, y.rows,
                          y.cols);
    return KH_OK;
  }
  const void* dyp = dy.data;
  const void* yp = y.data;
  void* dxp = dx.data;
  long long sdy = dy.stride, sy = y.stride, sdx = dx.stride, rows = y.rows;
  int cols = static_cast<int>(y.cols);
  void* params[] = {&dyp, &sdy, &yp, &sy, &dxp, &sdx, &rows, &cols};
  return launch_rows(op, "softmax_bwd", y, {&dy, &y, &dx}, params, stream);
}

// cross_entropy, and cross_entropy_train, which also writes dlogits.
template <const OpSchema& S>
int32_t cross_entropy(const Args<S>& a, void* stream) {
  constexpr bool train = &S == &kCrossEntropyTrain;
  const char* op = a.op();
  const int64_t ignore_index = a.integer("ignore_index");
  double grad_scale = 1.0;
  if constexpr (train) {
    grad_scale = a.real("grad_scale");
    if (!isfinite(grad_scale))
      return fail(KH_ERR_INVALID_ARGUMENT, "%s: grad_scale must be finite, got %g", op, grad_scale);
  }
  RowsView x, dx;
  KH_TRY(rows_view(a.tensor("logits"), &x));
  const int64_t* targets = nullptr;
  KH_TRY(index_vector_arg(a.tensor("targets"), x.rows, "row of logits", x.device, &targets));
  float* loss = nullptr;
  KH_TRY(per_row_f32(a.tensor("loss"), x, &loss));
  if constexpr (train) KH_TRY(like_arg(a.tensor("dlogits"), x, "logits", &dx));
  if (x.rows == 0) return KH_OK;
  if (x.cols == 0) return fail(KH_ERR_INVALID_ARGUMENT, "%s: logits have 0 classes (vocab 0)", op);
  const float scale = static_cast<float>(grad_scale);
  if (is_cpu(x.device)) {
    softmax_cpu::ce_forward(x.dtype, x.data, x.stride, targets, ignore_index, loss,
                            train ? dx.data : nullptr, dx.stride, scale, x.rows, x.cols);
    return KH_OK;
  }
  const void* xp = x.data;
  const int64_t* tp = targets;
  void* dxp = train ? dx.data : nullptr;
  long long sx = x.stride, ign = ignore_index, sdx = train ? dx.stride : 0, rows = x.rows;
  float sc = scale;
  int cols = static_cast<int>(x.cols);
  void* params[] = {&xp, &sx, &tp, &ign, &loss, &dxp, &sdx, &sc, &rows, &cols};
  if (train) return launch_rows(op, "ce_train", x, {&x, &dx}, params, stream);
  return launch_rows(op, "ce_fwd", x, {&x}, params, stream);
}

int32_t cross_entropy_backward(const Args<kCrossEntropyBackward>& a, void* stream) {
  const char* op = a.op();
  RowsView dx;
  KH_TRY(rows_view(a.tensor("dlogits"), &dx));
  float* dloss = nullptr;
  KH_TRY(per_row_f32(a.tensor("dloss"), dx, &dloss));
  if (dx.rows == 0 || dx.cols == 0) return KH_OK;
  if (is_cpu(dx.device)) {
    softmax_cpu::ce_backward(dx.dtype, dloss, dx.data, dx.stride, dx.rows, dx.cols);
    return KH_OK;
  }
  const float* gp = dloss;
  void* dxp = dx.data;
  long long sdx = dx.stride, rows = dx.rows;
  int cols = static_cast<int>(dx.cols);
  void* params[] = {&gp, &dxp, &sdx, &rows, &cols};
  return launch_rows(op, "ce_bwd", dx, {&dx}, params, stream);
}

constexpr kh_op_v1_t kOps[] = {
    op<softmax>(),
    op<softmax_backward>(),
    op<cross_entropy<kCrossEntropy>>(),
    op<cross_entropy<kCrossEntropyTrain>>(),
    op<cross_entropy_backward>(),
    op<linear_ce>(),
    op<linear_ce_train>(),
    op<linear_ce_backward>(),
};

// Softmax's forward_train is the forward op: backward needs y, which the caller keeps.
constexpr kh_layer_v1_t kLayers[] = {
    layer("Softmax", kSoftmax, kSoftmax, kSoftmaxBackward),
    layer("CrossEntropy", kCrossEntropy, kCrossEntropyTrain, kCrossEntropyBackward),
    layer("FusedLinearCrossEntropy", kLinearCe, kLinearCeTrain, kLinearCeBackward),
};

constexpr kh_module_v1_t kModule =
    make_module(kPackageName, kPackageVersion, "kernel-hub/softmax " KH_BUILD_ID, kLayers, kOps);

}  // namespace

const char* dtype_tag(int dtype) {
  return dtype == kBF16 ? "bf16" : dtype == kFP16 ? "fp16" : "fp32";
}

int32_t launch_rows(const char* op, const char* kernel_base, const RowsView& shape,
                    std::initializer_list<const RowsView*> rows, void** params, void* stream) {
  const int vec16 = dtype_vec16(shape.dtype);
  bool vec = true;
  for (const RowsView* r : rows) vec = vec && vectorizable(*r, vec16);
  const SoftmaxLaunch cfg = softmax_launch(shape.rows, vec ? shape.cols / vec16 : shape.cols);
  if (cfg.blocks > 0x7FFFFFFF)
    return fail(KH_ERR_UNSUPPORTED, "%s: %lld rows need more than 2^31-1 CTAs", op,
                static_cast<long long>(shape.rows));
  char name[64];
  snprintf(name, sizeof name, "%s_%s_%s", kernel_base, dtype_tag(shape.dtype),
           vec ? "vec" : "scalar");
  LaunchDims dims;
  dims.grid[0] = static_cast<uint32_t>(cfg.blocks);
  dims.block[0] = cfg.threads_per_row;
  dims.block[1] = cfg.rows_per_block;
  return launch_kernel(shape.device.device_id, name, dims, params, stream);
}

}  // namespace khk

KH_PACKAGE_ENTRY(khk::kModule)
