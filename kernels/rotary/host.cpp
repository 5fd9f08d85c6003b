// Host library of the kernel-hub/rotary package: layer RotaryEmbedding, applied in place to the
// query and the key, and layer QKNormRotaryEmbedding (eval only: each head RMS-normed over
// head_dim with a query and a key weight, eps, then rotated, in place: Qwen3's q/k norms and RoPE
// in one pass), NeoX (is_neox = 1, rotate halves) or GPT-J (is_neox = 0, interleaved)
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

#include <utility>

#include "kernels/common/op_schema.h"
#include "kernels/common/package_host.h"
#include "kernels/common/tensor_args.h"
#include "kernels/rotary/cpu.h"
#include "kernels/rotary/launch_config.h"

namespace khk {
namespace {

constexpr const char* kPackageName = "kernel-hub/rotary";
constexpr const char* kPackageVersion = "1.1.0";

const char* dtype_tag(int dtype) {
  return dtype == kBF16 ? "bf16" : dtype == kFP16 ? "fp16" : "fp32";
}

bool heads_vectorizable(const HeadsView& v) {
  const int64_t b = dtype_bytes(v.dtype);
  return aligned16(v.data) && (v.head_stride * b) % 16 == 0 && (v.token_stride * b) % 16 == 0;
}

constexpr OpSchema kRotaryEmbedding{
    "rotary_embedding(Tensor positions, Tensor(a!) query, Tensor(b!)? key, Tensor cos, Tensor "
    "sin, int is_neox) -> ()"};
constexpr OpSchema kQkNormRotaryEmbedding{
    "qk_norm_rotary_embedding(Tensor positions, Tensor(a!) query, Tensor(b!)? key, Tensor "
    "query_weight, Tensor? key_weight, float eps, Tensor cos, Tensor sin, int is_neox) -> ()"};
constexpr OpSchema kRotaryEmbeddingBackward{
    "rotary_embedding_backward(Tensor positions, Tensor(a!) dquery, Tensor(b!)? dkey, Tensor "
    "cos, Tensor sin, int is_neox) -> ()"};

// The arguments of the three ops: the rotation (sign 1) or its inverse (sign -1) of query and
// key (the backward op's dquery and dkey); with `norm`, each head RMS-normed first (weights of
// head_dim elements of the query's dtype, eps).
struct Rope {
  TensorArg positions, query, key, cos, sin;
  int64_t is_neox;
  float sign;
  bool norm = false;
  TensorArg query_weight{}, key_weight{};
  double eps = 0;
};

// QKNormRotaryEmbedding's weights: head_dim elements each, the query's dtype and device; a key
// needs its weight. Fills *qw and *kw (kw stays NULL without a key).
int32_t norm_weights(const Rope& r, const HeadsView& q, const HeadsView* k, VectorView* qw,
                     VectorView* kw) {
  const char* op = r.query.op;
  if (!(r.eps > 0) || r.eps > 1)
    return fail(KH_ERR_INVALID_ARGUMENT, "%s: eps is %g; expected a small positive number (1e-6)",
                op, r.eps);
  if (k && k->head_dim != q.head_dim)
    return fail(KH_ERR_INVALID_ARGUMENT,
                "%s: %s has head_dim %lld and %s %lld; the fused norm takes one head_dim", op,
                r.key.name, static_cast<long long>(k->head_dim), r.query.name,
                static_cast<long long>(q.head_dim));
  const std::pair<const TensorArg*, VectorView*> ws[2] = {{&r.query_weight, qw},
                                                          {&r.key_weight, kw}};
  for (int i = 0; i < (k ? 2 : 1); ++i) {
    const TensorArg& w = *ws[i].first;
    if (!w.t)
      return fail(KH_ERR_INVALID_ARGUMENT, "%s: %s is required with %s", op, w.name, r.key.name);
    KH_TRY(vector_view(w, q.head_dim, ws[i].second));
    KH_TRY(expect_dtype(w, ws[i].second->dtype, q.dtype, "the query's dtype"));
    KH_TRY(expect_device(w, ws[i].second->device, q.device));
  }
  return KH_OK;
}

// QKNormRotaryEmbedding on checked views: the cpu code's norm then rotation, or one kernel.
int32_t qk_norm_rope(const Rope& r, const HeadsView& q, const HeadsView* k, const VectorView& qw,
                     const VectorView& kw, const int64_t* positions, const RowsView& cos,
                     const RowsView& sin, void* stream) {
  const int64_t half = cos.cols, max_pos = cos.rows;
  const float eps = static_cast<float>(r.eps);
  if (is_cpu(q.device)) {
    rope_cpu::Heads qh{q.data, q.token_stride, q.head_stride, q.heads};
    rope_cpu::Heads kh{k ? k->data : nullptr, k ? k->token_stride : 0, k ? k->head_stride : 0,
                       k ? k->heads : 0};
    rope_cpu::qk_norm(q.dtype, q.tokens, q.head_dim, qh, qw.data, kh, k ? kw.data : nullptr, eps);
    if (half > 0 && max_pos > 0)
      rope_cpu::apply(q.dtype, cos.dtype, r.is_neox == 1, positions, q.tokens, qh, kh,
                      rope_cpu::Cache{cos.data, cos.stride}, rope_cpu::Cache{sin.data, sin.stride},
                      max_pos, static_cast<int>(half), 1.0f);
    return KH_OK;
  }
  char name[64];
  snprintf(name, sizeof name, "qk_norm_rope_%s_%s_%s", r.is_neox ? "neox" : "gptj",
           dtype_tag(q.dtype), cos.dtype == kFP32 ? "f32" : "same");
  const int64_t* pp = positions;
  void* qp = q.data;
  void* kp = k ? k->data : nullptr;
  long long sqt = q.token_stride, sqh = q.head_stride, skt = k ? k->token_stride : 0,
            skh = k ? k->head_stride : 0;
  int qheads = static_cast<int>(q.heads), kheads = k ? static_cast<int>(k->heads) : 0;
  const void* qwp = qw.data;
  const void* kwp = k ? kw.data : nullptr;
  float e = eps;
  int hd = static_cast<int>(q.head_dim);
  const void* cp = cos.data;
  const void* sp = sin.data;
  long long scos = cos.stride, ssin = sin.stride, mp = max_pos;
  int hf = static_cast<int>(half);
  void* params[] = {&pp,  &qp, &sqt, &sqh, &qheads, &kp,   &skt,  &skh, &kheads, &qwp,
                    &kwp, &e,  &hd,  &cp,  &sp,     &scos, &ssin, &mp,  &hf};
  // A warp per head (CTAs of a power of two up to 8 warps, as many per token as the heads need)
  // and its normed row staged in shared memory.
  const auto heads = static_cast<uint32_t>(qheads + kheads);
  uint32_t warps = 1;
  while (warps < 8 && 2 * warps <= heads) warps *= 2;
  LaunchDims dims;
  dims.flags = kPdlEntry;
  dims.grid[0] = static_cast<uint32_t>(q.tokens);
  dims.grid[1] = (heads + warps - 1) / warps;
  dims.block[0] = 32 * warps;
  dims.shared_mem_bytes = static_cast<uint32_t>(warps * q.head_dim * sizeof(float));
  return launch_kernel(q.device.device_id, name, dims, params, stream);
}

int32_t rope(const Rope& r, void* stream) {
  const char* op = r.query.op;
  const int64_t is_neox = r.is_neox;
  const float sign = r.sign;
  const DLTensor* kt = r.key.t;
  if (is_neox != 0 && is_neox != 1)
    return fail(KH_ERR_INVALID_ARGUMENT,
                "%s: is_neox must be 1 (NeoX, rotate halves) or 0 (GPT-J, interleaved), got %lld",
                op, static_cast<long long>(is_neox));
  HeadsView q, k;
  KH_TRY(heads_view(r.query, &q));
  if (kt) {
    KH_TRY(heads_view(r.key, &k));
    KH_TRY(expect_dtype(r.key, k.dtype, q.dtype, "the dtype of the query"));
    KH_TRY(expect_device(r.key, k.device, q.device));
    if (k.tokens != q.tokens)
      return fail(KH_ERR_INVALID_ARGUMENT, "%s: %s has %lld tokens, %s has %lld", op, r.key.name,
                  static_cast<long long>(k.tokens), r.query.name, static_cast<long long>(q.tokens));
  }
  const int64_t* positions = nullptr;
  KH_TRY(index_vector_arg(r.positions, q.tokens, "token", q.device, &positions));
  RowsView cos, sin;
  KH_TRY(rows_view(r.cos, &cos));
  KH_TRY(rows_view(r.sin, &sin));
  KH_TRY(expect_device(r.cos, cos.device, q.device));
  KH_TRY(expect_device(r.sin, sin.device, q.device));
  if (cos.dtype != kFP32 && cos.dtype != q.dtype)
    return fail(KH_ERR_UNSUPPORTED, "%s: tensor cos is %s; expected float32 or %s (the %s's)", op,
                dtype_name(cos.dtype), dtype_name(q.dtype), r.query.name);
  KH_TRY(expect_dtype(r.sin, sin.dtype, cos.dtype, "the dtype of cos"));
  KH_TRY(expect_shape(r.sin, sin, cos.rows, cos.cols, "cos"));
  const int64_t half = cos.cols, max_pos = cos.rows;
  if (2 * half > q.head_dim || (kt && 2 * half > k.head_dim))
    return fail(KH_ERR_INVALID_ARGUMENT,
                "%s: cos/sin have %lld columns (rot_dim %lld) but %s has head_dim %lld and %s "
                "%lld; rot_dim must be at most head_dim",
                op, static_cast<long long>(half), static_cast<long long>(2 * half), r.query.name,
                static_cast<long long>(q.head_dim), r.key.name,
                static_cast<long long>(kt ? k.head_dim : 0));
  VectorView qw, kw;
  if (r.norm) KH_TRY(norm_weights(r, q, kt ? &k : nullptr, &qw, &kw));
  if (r.norm && q.tokens > 0 && q.head_dim > 0)
    return qk_norm_rope(r, q, kt ? &k : nullptr, qw, kw, positions, cos, sin, stream);
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
  dims.flags = kPdlEntry;
  dims.grid[0] = static_cast<uint32_t>(q.tokens);
  dims.block[0] = rotary_threads(units);
  return launch_kernel(q.device.device_id, name, dims, params, stream);
}

int32_t rotary_embedding(const Args<kRotaryEmbedding>& a, void* stream) {
  return rope({a.tensor("positions"), a.tensor("query"), a.optional_tensor("key"), a.tensor("cos"),
               a.tensor("sin"), a.integer("is_neox"), 1.0f},
              stream);
}
int32_t qk_norm_rotary_embedding(const Args<kQkNormRotaryEmbedding>& a, void* stream) {
  Rope r{a.tensor("positions"),
         a.tensor("query"),
         a.optional_tensor("key"),
         a.tensor("cos"),
         a.tensor("sin"),
         a.integer("is_neox"),
         1.0f};
  r.norm = true;
  r.query_weight = a.tensor("query_weight");
  r.key_weight = a.optional_tensor("key_weight");
  r.eps = a.real("eps");
  return rope(r, stream);
}
int32_t rotary_embedding_backward(const Args<kRotaryEmbeddingBackward>& a, void* stream) {
  return rope({a.tensor("positions"), a.tensor("dquery"), a.optional_tensor("dkey"),
               a.tensor("cos"), a.tensor("sin"), a.integer("is_neox"), -1.0f},
              stream);
}

constexpr kh_op_v1_t kOps[] = {op<rotary_embedding>(), op<rotary_embedding_backward>(),
                               op<qk_norm_rotary_embedding>()};

// forward_train is the forward op: the rotation needs nothing saved. QKNormRotaryEmbedding is for
// inference (decode): training keeps the norms' statistics for backward (RMSNorm, then
// RotaryEmbedding).
constexpr kh_layer_v1_t kLayers[] = {
    layer("RotaryEmbedding", kRotaryEmbedding, kRotaryEmbedding, kRotaryEmbeddingBackward),
    layer("QKNormRotaryEmbedding", kQkNormRotaryEmbedding, kQkNormRotaryEmbedding, kOpFlags,
          kDtypes),
};

constexpr kh_module_v1_t kModule =
    make_module(kPackageName, kPackageVersion, "kernel-hub/rotary " KH_BUILD_ID, kLayers, kOps);

}  // namespace
}  // namespace khk

KH_PACKAGE_ENTRY(khk::kModule)
