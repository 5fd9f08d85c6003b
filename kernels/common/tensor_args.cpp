#include "kernels/common/tensor_args.h"

#include "kernels/common/package_host.h"

namespace khk {

namespace {

int dtype_of(DLDataType t) {
  if (t.lanes != 1) return -1;
  if (t.code == kDLBfloat && t.bits == 16) return kBF16;
  if (t.code == kDLFloat && t.bits == 16) return kFP16;
  if (t.code == kDLFloat && t.bits == 32) return kFP32;
  return -1;
}

const char* device_name(int32_t type) {
  switch (type) {
    case kDLCPU:
      return "cpu";
    case kDLCUDA:
      return "cuda";
    case kDLCUDAHost:
      return "cuda_host";
    case kDLCUDAManaged:
      return "cuda_managed";
    default:
      return "other";
  }
}

int32_t common_checks(const char* op, const char* name, const DLTensor* t, int* dtype) {
  if (!t) return fail(KH_ERR_INVALID_ARGUMENT, "%s: tensor %s is NULL", op, name);
  if (t->device.device_type != kDLCPU && t->device.device_type != kDLCUDA)
    return fail(KH_ERR_UNSUPPORTED,
                "%s: tensor %s is on device type %d (%s); this package runs on cpu (kDLCPU) and "
                "cuda (kDLCUDA) tensors",
                op, name, t->device.device_type, device_name(t->device.device_type));
  *dtype = dtype_of(t->dtype);
  if (*dtype < 0)
    return fail(KH_ERR_UNSUPPORTED,
                "%s: tensor %s has dtype code %u bits %u lanes %u; expected bfloat16, float16 or "
                "float32",
                op, name, t->dtype.code, t->dtype.bits, t->dtype.lanes);
  if (t->ndim < 1 || t->ndim > 16 || !t->shape)
    return fail(KH_ERR_INVALID_ARGUMENT, "%s: tensor %s has %d dimensions; expected 1 to 16", op,
                name, t->ndim);
  for (int32_t d = 0; d < t->ndim; ++d)
    if (t->shape[d] < 0)
      return fail(KH_ERR_INVALID_ARGUMENT, "%s: tensor %s has a negative extent in dimension %d",
                  op, name, d);
  if (!t->data) {
    for (int32_t d = 0; d < t->ndim; ++d)
      if (t->shape[d] == 0) return KH_OK;  // empty tensors may have no storage
    return fail(KH_ERR_INVALID_ARGUMENT, "%s: tensor %s has a NULL data pointer", op, name);
  }
  return KH_OK;
}

}  // namespace

const char* dtype_name(int dtype) {
  switch (dtype) {
    case kBF16:
      return "bfloat16";
    case kFP16:
      return "float16";
    case kFP32:
      return "float32";
    default:
      return "unsupported";
  }
}

int32_t rows_view(const TensorArg& a, RowsView* out) {
  const char *op = a.op, *name = a.name;
  const DLTensor* t = a.t;
  int dtype = -1;
  if (int32_t s = common_checks(op, name, t, &dtype); s != KH_OK) return s;
  const int32_t nd = t->ndim;
  const int64_t* sh = t->shape;
  const int64_t* st = t->strides;
  RowsView v;
  v.dtype = dtype;
  v.device = t->device;
  v.data = static_cast<char*>(t->data) + t->byte_offset;
  v.cols = sh[nd - 1];
  if (st && v.cols > 1 && st[nd - 1] != 1)
    return fail(KH_ERR_UNSUPPORTED,
                "%s: tensor %s has stride %lld in its last dimension; the last dimension must be "
                "contiguous (stride 1): pass a .contiguous() tensor",
                op, name, static_cast<long long>(st[nd - 1]));
  if (v.cols >= (int64_t{1} << 31))
    return fail(KH_ERR_UNSUPPORTED, "%s: tensor %s has rows of %lld elements; at most 2^31-1", op,
                name, static_cast<long long>(v.cols));
  // Collapse the leading dimensions into one row index with one stride.
  int64_t rows = 1;
  for (int32_t d = nd - 2; d >= 0; --d) {
    if (sh[d] != 0 && rows > (int64_t{1} << 62) / sh[d])
      return fail(KH_ERR_INVALID_ARGUMENT, "%s: tensor %s has too many rows", op, name);
    rows *= sh[d];
  }
  int64_t stride = v.cols;  // compact rows
  if (st) {
    int64_t cur_stride = 0, cur_extent = 1;
    for (int32_t d = nd - 2; d >= 0; --d) {
      if (sh[d] == 1) continue;
      if (cur_extent == 1) {
        // The innermost leading dimension with more than one index sets the row stride.
        cur_stride = st[d];
        cur_extent = sh[d];
        continue;
      }
      if (st[d] != cur_stride * cur_extent)
        return fail(KH_ERR_UNSUPPORTED,
                    "%s: tensor %s: dimension %d has stride %lld but the dimensions after it "
                    "span %lld elements; its leading dimensions must collapse into one row "
                    "stride (reshape to 2-D or make it contiguous)",
                    op, name, d, static_cast<long long>(st[d]),
                    static_cast<long long>(cur_stride * cur_extent));
      cur_extent *= sh[d];
    }
    if (cur_extent > 1) stride = cur_stride;
  }
  if (rows <= 1) stride = v.cols;
  if (rows > 1 && stride < v.cols)
    return fail(KH_ERR_UNSUPPORTED,
                "%s: tensor %s has a row stride of %lld elements for rows of %lld: rows overlap "
                "(a row stride must be at least the row length)",
                op, name, static_cast<long long>(stride), static_cast<long long>(v.cols));
  v.rows = rows;
  v.stride = stride;
  *out = v;
  return KH_OK;
}

int32_t vector_view(const TensorArg& a, int64_t n, VectorView* out) {
  const char *op = a.op, *name = a.name;
  const DLTensor* t = a.t;
  int dtype = -1;
  if (int32_t s = common_checks(op, name, t, &dtype); s != KH_OK) return s;
  int64_t count = 1, expect_stride = 1;
  for (int32_t d = t->ndim - 1; d >= 0; --d) {
    if (t->strides && t->shape[d] > 1 && t->strides[d] != expect_stride)
      return fail(KH_ERR_UNSUPPORTED,
                  "%s: tensor %s must be contiguous (dimension %d has stride %lld, expected %lld)",
                  op, name, d, static_cast<long long>(t->strides[d]),
                  static_cast<long long>(expect_stride));
    expect_stride *= t->shape[d];
    count *= t->shape[d];
  }
  if (count != n)
    return fail(KH_ERR_INVALID_ARGUMENT, "%s: tensor %s has %lld elements, expected %lld", op, name,
                static_cast<long long>(count), static_cast<long long>(n));
  out->data = static_cast<char*>(t->data) + t->byte_offset;
  out->n = n;
  out->dtype = dtype;
  out->device = t->device;
  return KH_OK;
}

int32_t expect_shape(const TensorArg& a, const RowsView& v, int64_t rows, int64_t cols,
                     const char* like) {
  const char *op = a.op, *name = a.name;
  if (v.rows != rows || v.cols != cols)
    return fail(KH_ERR_INVALID_ARGUMENT,
                "%s: tensor %s is %lld rows x %lld columns, expected %lld x %lld (as %s)", op, name,
                static_cast<long long>(v.rows), static_cast<long long>(v.cols),
                static_cast<long long>(rows), static_cast<long long>(cols), like);
  return KH_OK;
}

int32_t expect_dtype(const TensorArg& a, int dtype, int want, const char* like) {
  const char *op = a.op, *name = a.name;
  if (dtype != want)
    return fail(KH_ERR_UNSUPPORTED, "%s: tensor %s is %s, expected %s (%s)", op, name,
                dtype_name(dtype), dtype_name(want), like);
  return KH_OK;
}

int32_t expect_device(const TensorArg& a, DLDevice got, DLDevice want) {
  const char *op = a.op, *name = a.name;
  if (got.device_type != want.device_type || got.device_id != want.device_id)
    return fail(KH_ERR_INVALID_ARGUMENT,
                "%s: tensor %s is on %s:%d but the input is on %s:%d; pass tensors of one device",
                op, name, device_name(got.device_type), got.device_id,
                device_name(want.device_type), want.device_id);
  return KH_OK;
}

int32_t index_vector_arg(const TensorArg& a, int64_t expected_count, const char* per_what,
                         DLDevice device, const int64_t** out) {
  const char *op = a.op, *name = a.name;
  const DLTensor* t = a.t;
  if (t->dtype.code != kDLInt || t->dtype.bits != 64 || t->dtype.lanes != 1)
    return fail(KH_ERR_UNSUPPORTED,
                "%s: tensor %s has dtype code %u bits %u; expected int64 (torch.long)", op, name,
                t->dtype.code, t->dtype.bits);
  int64_t count = 1, expect_stride = 1;
  for (int32_t d = t->ndim - 1; d >= 0; --d) {
    if (t->shape[d] < 0)
      return fail(KH_ERR_INVALID_ARGUMENT, "%s: tensor %s has a negative extent", op, name);
    if (t->strides && t->shape[d] > 1 && t->strides[d] != expect_stride)
      return fail(KH_ERR_UNSUPPORTED, "%s: tensor %s must be contiguous", op, name);
    expect_stride *= t->shape[d];
    count *= t->shape[d];
  }
  if (count != expected_count)
    return fail(KH_ERR_INVALID_ARGUMENT,
                "%s: tensor %s has %lld elements; expected one per %s (%lld)", op, name,
                static_cast<long long>(count), per_what, static_cast<long long>(expected_count));
  KH_TRY(expect_device(a, t->device, device));
  if (count > 0 && !t->data)
    return fail(KH_ERR_INVALID_ARGUMENT, "%s: tensor %s has a NULL data pointer", op, name);
  *out = reinterpret_cast<const int64_t*>(static_cast<const char*>(t->data) + t->byte_offset);
  return KH_OK;
}

bool vectorizable(const RowsView& v, int64_t vec_cols) {
  const int64_t row_bytes = v.stride * dtype_bytes(v.dtype);
  return aligned16(v.data) && (row_bytes % 16) == 0 && (v.cols % vec_cols) == 0;
}

bool vectorizable(const VectorView& v) {
  return aligned16(v.data) && (v.n % dtype_vec16(v.dtype)) == 0;
}

}  // namespace khk
