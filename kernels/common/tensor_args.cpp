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

namespace {

// A contiguous integer tensor of `bits` bits with `expected_count` elements on `device`.
int32_t int_tensor_arg(const TensorArg& a, uint8_t bits, int64_t expected_count,
                       const char* per_what, DLDevice device, const void** out) {
  const char *op = a.op, *name = a.name;
  const DLTensor* t = a.t;
  if (t->dtype.code != kDLInt || t->dtype.bits != bits || t->dtype.lanes != 1)
    return fail(KH_ERR_UNSUPPORTED, "%s: tensor %s has dtype code %u bits %u; expected %s", op,
                name, t->dtype.code, t->dtype.bits,
                bits == 64 ? "int64 (torch.long)" : "int32 (torch.int32)");
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
  *out = static_cast<const char*>(t->data) + t->byte_offset;
  return KH_OK;
}

}  // namespace

int32_t index_vector_arg(const TensorArg& a, int64_t expected_count, const char* per_what,
                         DLDevice device, const int64_t** out) {
  const void* p = nullptr;
  KH_TRY(int_tensor_arg(a, 64, expected_count, per_what, device, &p));
  *out = static_cast<const int64_t*>(p);
  return KH_OK;
}

int32_t int32_tensor_arg(const TensorArg& a, int64_t expected_count, const char* per_what,
                         DLDevice device, const int32_t** out) {
  const void* p = nullptr;
  KH_TRY(int_tensor_arg(a, 32, expected_count, per_what, device, &p));
  *out = static_cast<const int32_t*>(p);
  return KH_OK;
}

bool vectorizable(const RowsView& v, int64_t vec_cols) {
  const int64_t row_bytes = v.stride * dtype_bytes(v.dtype);
  return aligned16(v.data) && (row_bytes % 16) == 0 && (v.cols % vec_cols) == 0;
}

bool vectorizable(const VectorView& v) {
  return aligned16(v.data) && (v.n % dtype_vec16(v.dtype)) == 0;
}

int32_t heads_view(const TensorArg& a, HeadsView* out, bool allow_batch) {
  const char *op = a.op, *name = a.name;
  const DLTensor* t = a.t;
  if (!t) return fail(KH_ERR_INVALID_ARGUMENT, "%s: tensor %s is NULL", op, name);
  // A 4-D [batch, seqlen, heads, head_dim] tensor is viewed as [batch * seqlen, heads, head_dim]
  // when its batch stride is seqlen token strides (or either extent is 1).
  DLTensor flat;
  int64_t flat_shape[3], flat_strides[3];
  int64_t batch = 1, seqlen = -1;
  if (allow_batch && t && t->ndim == 4 && t->shape) {
    const int64_t* s4 = t->shape;
    batch = s4[0];
    seqlen = s4[1];
    int64_t tok_stride = t->strides ? t->strides[1] : s4[2] * s4[3];
    if (t->strides && s4[1] == 1) tok_stride = t->strides[0];
    if (t->strides && s4[0] > 1 && s4[1] > 1 && t->strides[0] != s4[1] * t->strides[1])
      return fail(KH_ERR_UNSUPPORTED,
                  "%s: tensor %s [batch, seqlen, heads, head_dim] has batch stride %lld but "
                  "seqlen * token stride is %lld; batch and sequence must collapse into one "
                  "token stride (make it contiguous)",
                  op, name, static_cast<long long>(t->strides[0]),
                  static_cast<long long>(s4[1] * t->strides[1]));
    flat = *t;
    flat.ndim = 3;
    flat_shape[0] = s4[0] * s4[1];
    flat_shape[1] = s4[2];
    flat_shape[2] = s4[3];
    flat.shape = flat_shape;
    if (t->strides) {
      flat_strides[0] = tok_stride;
      flat_strides[1] = t->strides[2];
      flat_strides[2] = t->strides[3];
      flat.strides = flat_strides;
    }
    t = &flat;
  }
  if (t->ndim != 3 || !t->shape)
    return fail(KH_ERR_INVALID_ARGUMENT,
                allow_batch ? "%s: tensor %s has %d dimensions; expected [tokens, heads, "
                              "head_dim] or [batch, seqlen, heads, head_dim]"
                            : "%s: tensor %s has %d dimensions; expected 3: [tokens, heads, "
                              "head_dim]",
                op, name, a.t->ndim);
  const int64_t* sh = t->shape;
  const bool empty = sh[0] == 0 || sh[1] == 0 || sh[2] == 0;
  // dtype, device and extents through the shared checks, on a one-element view of the same
  // tensor (an empty tensor may have no storage: the checks then see a placeholder pointer that
  // nothing dereferences).
  DLTensor one = *t;
  int64_t one_shape = 1;
  one.ndim = 1;
  one.shape = &one_shape;
  one.strides = nullptr;
  one.byte_offset = 0;
  if (empty && !one.data) one.data = reinterpret_cast<void*>(uintptr_t{16});
  for (int d = 0; d < 3; ++d)
    if (sh[d] < 0)
      return fail(KH_ERR_INVALID_ARGUMENT, "%s: tensor %s has a negative extent in dimension %d",
                  op, name, d);
  RowsView probe;
  KH_TRY(rows_view({op, name, &one}, &probe));
  HeadsView v;
  v.data = static_cast<char*>(t->data) + t->byte_offset;
  v.tokens = sh[0];
  v.heads = sh[1];
  v.head_dim = sh[2];
  v.dtype = probe.dtype;
  v.device = probe.device;
  v.head_stride = v.head_dim;
  v.token_stride = v.heads * v.head_dim;
  if (t->strides) {
    if (v.head_dim > 1 && t->strides[2] != 1)
      return fail(KH_ERR_UNSUPPORTED,
                  "%s: tensor %s has stride %lld in its last dimension; head_dim must be "
                  "contiguous (stride 1)",
                  op, name, static_cast<long long>(t->strides[2]));
    if (v.heads > 1) v.head_stride = t->strides[1];
    if (v.tokens > 1) v.token_stride = t->strides[0];
  }
  if (v.head_stride < 0 || v.token_stride < 0)
    return fail(KH_ERR_UNSUPPORTED, "%s: tensor %s has a negative stride", op, name);
  // Non-overlapping: heads inside tokens, or tokens inside heads (a transposed view).
  const bool token_major =
      (v.heads <= 1 || v.head_stride >= v.head_dim) &&
      (v.tokens <= 1 || v.token_stride >= (v.heads - 1) * v.head_stride + v.head_dim);
  const bool head_major =
      (v.tokens <= 1 || v.token_stride >= v.head_dim) &&
      (v.heads <= 1 || v.head_stride >= (v.tokens - 1) * v.token_stride + v.head_dim);
  if (!empty && !token_major && !head_major)
    return fail(KH_ERR_UNSUPPORTED,
                "%s: tensor %s (token stride %lld, head stride %lld, head_dim %lld) has "
                "overlapping heads; the op writes in place and needs distinct elements",
                op, name, static_cast<long long>(v.token_stride),
                static_cast<long long>(v.head_stride), static_cast<long long>(v.head_dim));
  if (v.heads * v.head_dim >= (int64_t{1} << 31) || v.tokens > 0x7FFFFFFF)
    return fail(KH_ERR_UNSUPPORTED,
                "%s: tensor %s is too large (at most 2^31-1 tokens and heads * head_dim < 2^31)",
                op, name);
  v.batch = batch;
  v.seqlen = seqlen < 0 ? v.tokens : seqlen;
  *out = v;
  return KH_OK;
}

int32_t same_kind(const TensorArg& a, const HeadsView& v, const HeadsView& like,
                  const char* like_name) {
  KH_TRY(expect_dtype(a, v.dtype, like.dtype, like_name));
  KH_TRY(expect_device(a, v.device, like.device));
  if (v.head_dim != like.head_dim)
    return fail(KH_ERR_INVALID_ARGUMENT, "%s: %s has head_dim %lld, %s has %lld", a.op, a.name,
                static_cast<long long>(v.head_dim), like_name,
                static_cast<long long>(like.head_dim));
  return KH_OK;
}

int32_t same_shape(const TensorArg& a, const HeadsView& v, const HeadsView& like,
                   const char* like_name) {
  KH_TRY(same_kind(a, v, like, like_name));
  if (v.tokens != like.tokens || v.heads != like.heads)
    return fail(KH_ERR_INVALID_ARGUMENT,
                "%s: %s is [%lld tokens, %lld heads]; expected the shape of %s [%lld, %lld]", a.op,
                a.name, static_cast<long long>(v.tokens), static_cast<long long>(v.heads),
                like_name, static_cast<long long>(like.tokens), static_cast<long long>(like.heads));
  return KH_OK;
}

}  // namespace khk
