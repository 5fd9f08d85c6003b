#include "kernels/common/rope_args.h"

#include "kernels/common/package_host.h"

namespace khk {

int32_t rope_layout_arg(const char* op, int64_t is_neox) {
  if (is_neox != 0 && is_neox != 1)
    return fail(KH_ERR_INVALID_ARGUMENT,
                "%s: is_neox must be 1 (NeoX, rotate halves) or 0 (GPT-J, interleaved), got %lld",
                op, static_cast<long long>(is_neox));
  return KH_OK;
}

int32_t rope_cache_args(const TensorArg& cos, const TensorArg& sin, int dtype, DLDevice device,
                        const char* rows_name, RowsView* cos_out, RowsView* sin_out) {
  RowsView& c = *cos_out;
  RowsView& s = *sin_out;
  KH_TRY(rows_view(cos, &c));
  KH_TRY(rows_view(sin, &s));
  KH_TRY(expect_device(cos, c.device, device));
  KH_TRY(expect_device(sin, s.device, device));
  if (c.dtype != kFP32 && c.dtype != dtype)
    return fail(KH_ERR_UNSUPPORTED, "%s: tensor %s is %s; expected float32 or %s (the %s's)",
                cos.op, cos.name, dtype_name(c.dtype), dtype_name(dtype), rows_name);
  KH_TRY(expect_dtype(sin, s.dtype, c.dtype, "the dtype of cos"));
  return expect_shape(sin, s, c.rows, c.cols, cos.name);
}

int32_t rope_fits_arg(const TensorArg& cos, const RowsView& c, const char* rows_name,
                      int64_t head_dim) {
  if (2 * c.cols > head_dim)
    return fail(KH_ERR_INVALID_ARGUMENT,
                "%s: %s has %lld columns (rot_dim %lld) but %s has head_dim %lld; rot_dim must "
                "be at most head_dim",
                cos.op, cos.name, static_cast<long long>(c.cols),
                static_cast<long long>(2 * c.cols), rows_name, static_cast<long long>(head_dim));
  return KH_OK;
}

int32_t norm_weight_arg(const TensorArg& w, const char* required_by, int64_t head_dim, int dtype,
                        DLDevice device, VectorView* out) {
  if (!w.t)
    return fail(KH_ERR_INVALID_ARGUMENT, "%s: %s is required with %s", w.op, w.name,
                required_by);
  KH_TRY(vector_view(w, head_dim, out));
  KH_TRY(expect_dtype(w, out->dtype, dtype, "the query's dtype"));
  return expect_device(w, out->device, device);
}

int32_t norm_eps_arg(const char* op, double eps) {
  if (!(eps > 0) || eps > 1)
    return fail(KH_ERR_INVALID_ARGUMENT, "%s: eps is %g; expected a small positive number (1e-6)",
                op, eps);
  return KH_OK;
}

}  // namespace khk
