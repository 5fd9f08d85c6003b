// Host library of the kernel-hub/rotary package: layer RotaryEmbedding, applied in place to the
// query and the key, NeoX (is_neox = 1, rotate halves) or GPT-J (is_neox = 0, interleaved)
// layout, from int64 positions and a cos/sin cache. forward_train is the forward op (the
// rotation needs nothing saved); backward applies the inverse rotation to the gradients, in
// place. Ops check their DLPack arguments, then run cpu.cpp on kDLCPU tensors or launch
// rotary.cu's kernels through the loader on kDLCUDA tensors.
//
// Tensors: query [tokens, q_heads, head_dim] and key [tokens, k_heads, key_head_dim] (key may be
// NULL; k_heads may differ from q_heads), any token and head strides (non-overlapping), the last
// dimension contiguous, bf16/fp16/fp32. positions: int64, contiguous, [tokens]. cos and sin:
// [max_pos, rot_dim / 2] with a row stride (e.g. the two halves of one [max_pos, rot_dim] cache),
// float32 or the query's dtype, both the same dtype. rot_dim <= head_dim: elements past rot_dim
// are left as they are (partial rotary). A token whose position is outside [0, max_pos) is left
// unchanged (the device cannot report it; check positions upstream).
#include <stdio.h>

#include "kernels/common/package_host.h"
#include "kernels/common/tensor_args.h"
#include "kernels/rotary/cpu.h"
#include "kernels/rotary/launch_config.h"

namespace khk {
namespace {

constexpr const char* kPackageName = "kernel-hub/rotary";
constexpr const char* kPackageVersion = "1.0.0";

const char* dtype_tag(int dtype) {
  return dtype == kBF16 ? "bf16" : dtype == kFP16 ? "fp16" : "fp32";
}

// A [tokens, heads, head_dim] tensor with token and head strides.
struct HeadsView {
  char* data = nullptr;
  int64_t tokens = 0, heads = 0, head_dim = 0;
  int64_t token_stride = 0, head_stride = 0;
  int dtype = -1;
  DLDevice device{};
};

int32_t heads_view(const char* op, const char* name, const DLTensor* t, HeadsView* out) {
  if (!t) return fail(KH_ERR_INVALID_ARGUMENT, "%s: tensor %s is NULL", op, name);
  if (t->ndim != 3 || !t->shape)
    return fail(KH_ERR_INVALID_ARGUMENT,
                "%s: tensor %s has %d dimensions; expected 3: [tokens, heads, head_dim]", op, name,
                t->ndim);
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
  KH_TRY(rows_view(op, name, &one, &probe));
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
  *out = v;
  return KH_OK;
}

bool heads_vectorizable(const HeadsView& v) {
  const int64_t b = dtype_bytes(v.dtype);
  return aligned16(v.data) && (v.head_stride * b) % 16 == 0 && (v.token_stride * b) % 16 == 0;
}

int32_t positions_arg(const char* op, const DLTensor* t, const HeadsView& q, const int64_t** out) {
  return index_vector_arg(op, "positions", t, q.tokens, "token", q.device, out);
}

// rotary_embedding[_backward](Tensor positions, Tensor(a!) query, Tensor(b!)? key, Tensor cos,
//                             Tensor sin, int is_neox) -> ()
int32_t rope_impl(const char* op, const char* schema, float sign, const kh_arg_t* args,
                  int32_t nargs, void* stream) {
  OpArgs a{op, args, nargs};
  KH_TRY(a.expect(6, schema));
  const DLTensor *pt, *qt, *kt, *ct, *st;
  KH_TRY(a.tensor(0, "positions", &pt));
  KH_TRY(a.tensor(1, "query", &qt));
  KH_TRY(a.tensor(2, "key", &kt, /*optional=*/true));
  KH_TRY(a.tensor(3, "cos", &ct));
  KH_TRY(a.tensor(4, "sin", &st));
  int64_t is_neox = 0;
  KH_TRY(a.integer(5, "is_neox", &is_neox));
  if (is_neox != 0 && is_neox != 1)
    return fail(KH_ERR_INVALID_ARGUMENT,
                "%s: is_neox must be 1 (NeoX, rotate halves) or 0 (GPT-J, interleaved), got %lld",
                op, static_cast<long long>(is_neox));
  HeadsView q, k;
  KH_TRY(heads_view(op, "query", qt, &q));
  if (kt) {
    KH_TRY(heads_view(op, "key", kt, &k));
    KH_TRY(expect_dtype(op, "key", k.dtype, q.dtype, "the dtype of query"));
    KH_TRY(expect_device(op, "key", k.device, q.device));
    if (k.tokens != q.tokens)
      return fail(KH_ERR_INVALID_ARGUMENT, "%s: key has %lld tokens, query has %lld", op,
                  static_cast<long long>(k.tokens), static_cast<long long>(q.tokens));
  }
  const int64_t* positions = nullptr;
  KH_TRY(positions_arg(op, pt, q, &positions));
  RowsView cos, sin;
  KH_TRY(rows_view(op, "cos", ct, &cos));
  KH_TRY(rows_view(op, "sin", st, &sin));
  KH_TRY(expect_device(op, "cos", cos.device, q.device));
  KH_TRY(expect_device(op, "sin", sin.device, q.device));
  if (cos.dtype != kFP32 && cos.dtype != q.dtype)
    return fail(KH_ERR_UNSUPPORTED, "%s: tensor cos is %s; expected float32 or %s (the query's)",
                op, dtype_name(cos.dtype), dtype_name(q.dtype));
  KH_TRY(expect_dtype(op, "sin", sin.dtype, cos.dtype, "the dtype of cos"));
  KH_TRY(expect_shape(op, "sin", sin, cos.rows, cos.cols, "cos"));
  const int64_t half = cos.cols, max_pos = cos.rows;
  if (2 * half > q.head_dim || (kt && 2 * half > k.head_dim))
    return fail(KH_ERR_INVALID_ARGUMENT,
                "%s: cos/sin have %lld columns (rot_dim %lld) but query has head_dim %lld and key "
                "%lld; rot_dim must be at most head_dim",
                op, static_cast<long long>(half), static_cast<long long>(2 * half),
                static_cast<long long>(q.head_dim), static_cast<long long>(kt ? k.head_dim : 0));
  if (q.tokens == 0 || half == 0 || max_pos == 0) return KH_OK;
  if (is_cpu(q.device)) {
    rope_cpu::Heads qh{q.data, q.token_stride, q.head_stride, q.heads};
    rope_cpu::Heads kh{kt ? k.data : nullptr, k.token_stride, k.head_stride, k.heads};
    rope_cpu::apply(q.dtype, cos.dtype, is_neox == 1, positions, q.tokens, qh, kh,
                    rope_cpu::Cache{cos.data, cos.stride}, rope_cpu::Cache{sin.data, sin.stride},
                    max_pos, static_cast<int>(half), sign);
    return KH_OK;
  }
  // 16-byte accesses: NeoX units of vec16 pairs (x1 and x2 vectors), GPT-J units of vec16 / 2
  // interleaved pairs (one vector); every head start 16-byte aligned.
  const int vec16 = dtype_vec16(q.dtype);
  const int64_t pv = is_neox ? vec16 : vec16 / 2;
  const bool vec = half % pv == 0 && heads_vectorizable(q) && (!kt || heads_vectorizable(k));
  const int64_t units = (q.heads + (kt ? k.heads : 0)) * (vec ? half / pv : half);
  char name[64];
  snprintf(name, sizeof name, "rope_%s_%s_%s_%s", is_neox ? "neox" : "gptj", dtype_tag(q.dtype),
           cos.dtype == kFP32 ? "f32" : "same", vec ? "vec" : "scalar");
  const int64_t* pp = positions;
  void* qp = q.data;
  void* kp = kt ? k.data : nullptr;
  long long sqt = q.token_stride, sqh = q.head_stride, skt = k.token_stride, skh = k.head_stride;
  int qheads = static_cast<int>(q.heads), kheads = kt ? static_cast<int>(k.heads) : 0;
  const void* cp = cos.data;
  const void* sp = sin.data;
  long long scos = cos.stride, ssin = sin.stride, mp = max_pos;
  int hf = static_cast<int>(half);
  float sg = sign;
  void* params[] = {&pp,     &qp, &sqt, &sqh,  &qheads, &kp, &skt, &skh,
                    &kheads, &cp, &sp,  &scos, &ssin,   &mp, &hf,  &sg};
  LaunchDims dims;
  dims.grid[0] = static_cast<uint32_t>(q.tokens);
  dims.block[0] = rotary_threads(units);
  return launch_kernel(q.device.device_id, name, dims, params, stream);
}

#define KH_SCHEMA_ROPE                                                                        \
  "rotary_embedding(Tensor positions, Tensor(a!) query, Tensor(b!)? key, Tensor cos, Tensor " \
  "sin, int is_neox) -> ()"
#define KH_SCHEMA_ROPE_BWD                                                                   \
  "rotary_embedding_backward(Tensor positions, Tensor(a!) dquery, Tensor(b!)? dkey, Tensor " \
  "cos, Tensor sin, int is_neox) -> ()"

int32_t rotary_embedding(const kh_arg_t* a, int32_t n, void* s) {
  return rope_impl("rotary_embedding", KH_SCHEMA_ROPE, 1.0f, a, n, s);
}
int32_t rotary_embedding_backward(const kh_arg_t* a, int32_t n, void* s) {
  return rope_impl("rotary_embedding_backward", KH_SCHEMA_ROPE_BWD, -1.0f, a, n, s);
}

const kh_op_v1_t kOps[] = {
    {KH_HEADER_INIT(kh_op_v1_t), "rotary_embedding", KH_SCHEMA_ROPE, kOpFlags, rotary_embedding},
    {KH_HEADER_INIT(kh_op_v1_t), "rotary_embedding_backward", KH_SCHEMA_ROPE_BWD, kOpFlags,
     rotary_embedding_backward},
};

const kh_layer_v1_t kLayers[] = {
    {KH_HEADER_INIT(kh_layer_v1_t), "RotaryEmbedding", "rotary_embedding", "rotary_embedding",
     "rotary_embedding_backward", kLayerFlags, kDtypes},
};

constexpr kh_module_v1_t kModule =
    make_module(kPackageName, kPackageVersion, "kernel-hub/rotary " KH_BUILD_ID, kLayers, kOps);

}  // namespace
}  // namespace khk

KH_PACKAGE_ENTRY(khk::kModule)
