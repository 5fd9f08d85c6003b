// Host library of the kernel-hub/rotary package: layer RotaryEmbedding, applied in place to the
// query and the key, and layer QKNormRotaryEmbedding (each head RMS-normed over head_dim with a
// query and a key weight, eps, then rotated: Qwen3's q/k norms and RoPE in one pass; in place
// for eval, out of place with a backward for training) and layer QKNormRotaryEmbeddingFromOutput
// (the same forward; training in place, saving each row's rstd for a backward from the output),
// NeoX (is_neox = 1, rotate halves) or
// GPT-J (is_neox = 0, interleaved) layout, from int64 positions and a cos/sin cache.
// RotaryEmbedding's forward_train is its forward op (the rotation needs nothing saved); its
// backward applies the inverse rotation to the gradients, in place. Ops check their DLPack
// arguments, then run cpu.cpp on kDLCPU tensors or launch rotary.cu's kernels through the loader
// on kDLCUDA tensors.
//
// Tensors: query [tokens, q_heads, head_dim] and key [tokens, k_heads, key_head_dim] (key may be
// NULL; k_heads may differ from q_heads), any token and head strides (non-overlapping), the last
// dimension contiguous, bf16/fp16/fp32. positions: int64, contiguous, [tokens]. cos and sin:
// [max_pos, rot_dim / 2] with a row stride (e.g. the two halves of one [max_pos, rot_dim] cache),
// float32 or the query's dtype, both the same dtype. rot_dim <= head_dim: elements past rot_dim
// are left as they are (partial rotary). A token whose position is outside [0, max_pos) is left
// unchanged (the device cannot report it; check positions upstream).
#include <stdio.h>
#include <string.h>

#include <initializer_list>

#include <utility>

#include "kernels/common/op_schema.h"
#include "kernels/common/package_host.h"
#include "kernels/common/tensor_args.h"
#include "kernels/rotary/cpu.h"
#include "kernels/rotary/launch_config.h"
#include "kernels/rotary/qk_norm_params.h"

namespace khk {
namespace {

constexpr const char* kPackageName = "kernel-hub/rotary";
constexpr const char* kPackageVersion = "1.3.0";

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

constexpr OpSchema kQkNormRotaryEmbeddingTrain{
    "qk_norm_rotary_embedding_train(Tensor positions, Tensor query_in, Tensor? key_in, Tensor "
    "query_weight, Tensor? key_weight, float eps, Tensor cos, Tensor sin, int is_neox, "
    "Tensor(a!) query, Tensor(b!)? key) -> ()"};
// QKNormRotaryEmbeddingFromOutput's: forward_train as the one above, also writing each row's rstd
// (fp32 [tokens, heads]), query may be query_in itself (and key key_in: in place, the same data
// and strides; any other overlap of the outputs with the inputs or each other is not allowed);
// the backward takes the forward's outputs and rstd instead of its inputs.
constexpr OpSchema kQkNormRotaryEmbeddingTrainRstd{
    "qk_norm_rotary_embedding_train_rstd(Tensor positions, Tensor query_in, Tensor? key_in, "
    "Tensor query_weight, Tensor? key_weight, float eps, Tensor cos, Tensor sin, int is_neox, "
    "Tensor(a!) query, Tensor(b!)? key, Tensor(c!) rstd_query, Tensor(d!)? rstd_key) -> ()"};
constexpr OpSchema kQkNormRotaryEmbeddingBackwardFromOutput{
    "qk_norm_rotary_embedding_backward_from_output(Tensor positions, Tensor dquery, Tensor? dkey, "
    "Tensor query, Tensor? key, Tensor rstd_query, Tensor? rstd_key, Tensor query_weight, "
    "Tensor? key_weight, Tensor cos, Tensor sin, int is_neox, Tensor(a!) dquery_in, "
    "Tensor(b!)? dkey_in, Tensor(c!) dquery_weight, Tensor(d!)? dkey_weight, "
    "Tensor(e!)? workspace) -> ()"};
constexpr OpSchema kQkNormRotaryEmbeddingBackward{
    "qk_norm_rotary_embedding_backward(Tensor positions, Tensor dquery, Tensor? dkey, Tensor "
    "query_in, Tensor? key_in, Tensor query_weight, Tensor? key_weight, float eps, Tensor cos, "
    "Tensor sin, int is_neox, Tensor(a!) dquery_in, Tensor(b!)? dkey_in, Tensor(c!) "
    "dquery_weight, Tensor(d!)? dkey_weight, Tensor(e!)? workspace) -> ()"};

// The arguments of the rotation ops: the rotation (sign 1) or its inverse (sign -1) of query and
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

// The checked tensors of a rotation: query and key (has_k: given), positions and the cos/sin
// cache.
struct RopeViews {
  HeadsView q, k;
  bool has_k = false;
  const int64_t* positions = nullptr;
  RowsView cos, sin;
  const HeadsView* key() const { return has_k ? &k : nullptr; }
};

int32_t rope_views(const Rope& r, RopeViews* out) {
  const char* op = r.query.op;
  const int64_t is_neox = r.is_neox;
  const DLTensor* kt = r.key.t;
  if (is_neox != 0 && is_neox != 1)
    return fail(KH_ERR_INVALID_ARGUMENT,
                "%s: is_neox must be 1 (NeoX, rotate halves) or 0 (GPT-J, interleaved), got %lld",
                op, static_cast<long long>(is_neox));
  RopeViews v;
  HeadsView &q = v.q, &k = v.k;
  KH_TRY(heads_view(r.query, &q));
  if (kt) {
    KH_TRY(heads_view(r.key, &k));
    KH_TRY(expect_dtype(r.key, k.dtype, q.dtype, "the dtype of the query"));
    KH_TRY(expect_device(r.key, k.device, q.device));
    if (k.tokens != q.tokens)
      return fail(KH_ERR_INVALID_ARGUMENT, "%s: %s has %lld tokens, %s has %lld", op, r.key.name,
                  static_cast<long long>(k.tokens), r.query.name, static_cast<long long>(q.tokens));
    v.has_k = true;
  }
  KH_TRY(index_vector_arg(r.positions, q.tokens, "token", q.device, &v.positions));
  RowsView &cos = v.cos, &sin = v.sin;
  KH_TRY(rows_view(r.cos, &cos));
  KH_TRY(rows_view(r.sin, &sin));
  KH_TRY(expect_device(r.cos, cos.device, q.device));
  KH_TRY(expect_device(r.sin, sin.device, q.device));
  if (cos.dtype != kFP32 && cos.dtype != q.dtype)
    return fail(KH_ERR_UNSUPPORTED, "%s: tensor cos is %s; expected float32 or %s (the %s's)", op,
                dtype_name(cos.dtype), dtype_name(q.dtype), r.query.name);
  KH_TRY(expect_dtype(r.sin, sin.dtype, cos.dtype, "the dtype of cos"));
  KH_TRY(expect_shape(r.sin, sin, cos.rows, cos.cols, "cos"));
  const int64_t half = cos.cols;
  if (2 * half > q.head_dim || (kt && 2 * half > k.head_dim))
    return fail(KH_ERR_INVALID_ARGUMENT,
                "%s: cos/sin have %lld columns (rot_dim %lld) but %s has head_dim %lld and %s "
                "%lld; rot_dim must be at most head_dim",
                op, static_cast<long long>(half), static_cast<long long>(2 * half), r.query.name,
                static_cast<long long>(q.head_dim), r.key.name,
                static_cast<long long>(kt ? k.head_dim : 0));
  *out = v;
  return KH_OK;
}

int32_t rope(const Rope& r, void* stream) {
  const int64_t is_neox = r.is_neox;
  const float sign = r.sign;
  const DLTensor* kt = r.key.t;
  RopeViews views;
  KH_TRY(rope_views(r, &views));
  const HeadsView &q = views.q, &k = views.k;
  const int64_t* positions = views.positions;
  const RowsView &cos = views.cos, &sin = views.sin;
  const int64_t half = cos.cols, max_pos = cos.rows;
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

// ---- QKNormRotaryEmbedding for training ------------------------------------------------------
// forward_train writes query (and key) from query_in (and key_in), which the backward needs: the
// eval op's result, out of place. The backward takes the forward's inputs and the gradients of
// its outputs and writes the inputs' gradients and both weights' (overwritten, not added), with
// no saved statistics: each row's rstd is recomputed from its input in the same pass. The
// weights' gradients go through `workspace` (cuda: fp32 [W, 2 * head_dim], one partial row per
// walker CTA, then summed in row order, so the result is deterministic; W about
// kh_qknr_workspace_rows(); the cpu path needs none, and checks one given all the same).
//
// The cuda kernels take NeoX with full rotary (rot_dim == head_dim), 16-byte aligned heads and
// head_dim / (2 * elements per 16 bytes) a power of two of at most 32 (head_dim 16 to 512 in
// bf16/fp16, 8 to 256 in fp32); anything else is KH_ERR_UNSUPPORTED on cuda (the caller runs
// RMSNorm and RotaryEmbedding instead) and runs on the cpu.

constexpr uint32_t kQknrThreads = 256;  // __launch_bounds__ of rotary.cu's qknr_* kernels

// The checked arguments of both ops. Rope r: its query and key are query_in and key_in.
struct QkNormTrain {
  Rope r;
  RopeViews v;
  VectorView qw, kw;
  HeadsView out_q, out_k;  // query / key (forward), dquery_in / dkey_in (backward)
  HeadsView d_q, d_k;      // backward: dquery, dkey
  VectorView dqw, dkw;     // backward
  RowsView workspace;      // backward, cuda
  bool has_workspace = false;
  // The FromOutput ops' rows' rstd (fp32, [tokens, heads]): the forward writes them, the backward
  // reads them, and its query_in / key_in (r's query and key) are then the forward's outputs.
  float *rstd_q = nullptr, *rstd_k = nullptr;
};

// A tensor given exactly when the key is (`with` = key_in), of key_in's shape.
int32_t key_like(const TensorArg& a, const QkNormTrain& t, HeadsView* out) {
  if (!a.t != !t.v.has_k)
    return fail(KH_ERR_INVALID_ARGUMENT, "%s: %s must be given %s", a.op, a.name,
                t.v.has_k ? "with key_in" : "only with key_in");
  if (!a.t) return KH_OK;
  KH_TRY(heads_view(a, out));
  return same_shape(a, *out, t.v.k, "key_in");
}

int32_t check_inputs(QkNormTrain& t, const TensorArg& out_q, const TensorArg& out_k) {
  t.r.norm = true;
  KH_TRY(rope_views(t.r, &t.v));
  KH_TRY(norm_weights(t.r, t.v.q, t.v.key(), &t.qw, &t.kw));
  KH_TRY(heads_view(out_q, &t.out_q));
  KH_TRY(same_shape(out_q, t.out_q, t.v.q, "query_in"));
  return key_like(out_k, t, &t.out_k);
}

// Whether the cuda kernels take these tensors (see above); *G: lanes a row.
int32_t qknr_cuda_ok(const QkNormTrain& t, std::initializer_list<const HeadsView*> heads, int* G) {
  const char* op = t.r.query.op;
  const HeadsView& q = t.v.q;
  const int vec = dtype_vec16(q.dtype);
  const int64_t g = q.head_dim / (2 * vec);
  if (t.r.is_neox != 1 || 2 * t.v.cos.cols != q.head_dim)
    return fail(
        KH_ERR_UNSUPPORTED,
        "%s: the cuda kernels take NeoX (is_neox = 1) with full rotary (cos/sin of head_dim "
        "/ 2 columns); got is_neox %lld, %lld columns for head_dim %lld",
        op, static_cast<long long>(t.r.is_neox), static_cast<long long>(t.v.cos.cols),
        static_cast<long long>(q.head_dim));
  if (q.head_dim % (2 * vec) != 0 || g < 1 || g > 32 || (g & (g - 1)) != 0)
    return fail(KH_ERR_UNSUPPORTED,
                "%s: the cuda kernels take head_dim = 2 x %d x a power of two up to 32 for %s; "
                "got %lld",
                op, vec, dtype_name(q.dtype), static_cast<long long>(q.head_dim));
  for (const HeadsView* h : heads)
    if (h && !heads_vectorizable(*h))
      return fail(KH_ERR_UNSUPPORTED,
                  "%s: the cuda kernels need 16-byte aligned heads (start, token and head strides)",
                  op);
  if (!aligned16(t.qw.data) || (t.v.has_k && !aligned16(t.kw.data)))
    return fail(KH_ERR_UNSUPPORTED, "%s: the cuda kernels need 16-byte aligned weights", op);
  const int64_t all_heads = q.heads + (t.v.has_k ? t.v.k.heads : 0);
  if (all_heads > 0 && q.tokens > ((int64_t{1} << 30) - 1) / all_heads)
    return fail(KH_ERR_UNSUPPORTED,
                "%s: the cuda kernels index rows (tokens x query and key heads) in 32 bits, below "
                "2^30; %lld tokens x %lld heads is more: split the tokens",
                op, static_cast<long long>(q.tokens), static_cast<long long>(all_heads));
  *G = static_cast<int>(g);
  return KH_OK;
}

kh_qknr_tensor qknr_tensor(const HeadsView& in, const HeadsView* d, const HeadsView& out,
                           const VectorView& w) {
  kh_u32 mul = 0, shift = 0;  // heads < 2^30 (qknr_cuda_ok's row bound)
  kh_qknr_divider(static_cast<kh_u32>(in.heads), &mul, &shift);
  return {in.data,
          d ? d->data : nullptr,
          out.data,
          w.data,
          nullptr,
          in.token_stride,
          in.head_stride,
          d ? d->token_stride : 0,
          d ? d->head_stride : 0,
          out.token_stride,
          out.head_stride,
          in.heads,
          mul,
          shift};
}

kh_qknr_params qknr_params(const QkNormTrain& t, bool backward) {
  kh_qknr_params p{};
  p.t[0] = qknr_tensor(t.v.q, backward ? &t.d_q : nullptr, t.out_q, t.qw);
  p.t[0].rstd = t.rstd_q;
  if (t.v.has_k) {
    p.t[1] = qknr_tensor(t.v.k, backward ? &t.d_k : nullptr, t.out_k, t.kw);
    p.t[1].rstd = t.rstd_k;
  }
  p.positions = reinterpret_cast<const kh_i64*>(t.v.positions);
  p.cos = t.v.cos.data;
  p.sin = t.v.sin.data;
  p.tokens = t.v.q.tokens;
  p.scos = t.v.cos.stride;
  p.ssin = t.v.sin.stride;
  p.max_pos = t.v.cos.rows;
  p.eps = static_cast<float>(t.r.eps);
  p.head_dim = static_cast<int>(t.v.q.head_dim);
  const int64_t cb = dtype_bytes(t.v.cos.dtype);
  p.cs_vec = aligned16(t.v.cos.data) && aligned16(t.v.sin.data) && (p.scos * cb) % 16 == 0 &&
             (p.ssin * cb) % 16 == 0;
  return p;
}

// Launches qknr_<dir>_neox_<dtype>_<cache> with `p`: `blocks` CTAs of kQknrThreads.
int32_t launch_qknr(const char* dir, const QkNormTrain& t, kh_qknr_params& p, int64_t blocks,
                    uint32_t shared_mem_bytes, void* stream) {
  char name[64];
  snprintf(name, sizeof name, "qknr_%s_neox_%s_%s", dir, dtype_tag(t.v.q.dtype),
           t.v.cos.dtype == kFP32 ? "f32" : "same");
  LaunchDims dims;
  dims.flags = kPdlEntry;
  dims.grid[0] = static_cast<uint32_t>(blocks);
  dims.block[0] = kQknrThreads;
  dims.shared_mem_bytes = shared_mem_bytes;
  void* params[] = {&p};
  return launch_kernel(t.v.q.device.device_id, name, dims, params, stream);
}

// Copies one [tokens, heads, head_dim] view into another of the same shape (cpu).
void copy_heads(const HeadsView& from, const HeadsView& to) {
  const int64_t row = from.head_dim * dtype_bytes(from.dtype), b = dtype_bytes(from.dtype);
  for (int64_t t = 0; t < from.tokens; ++t)
    for (int64_t h = 0; h < from.heads; ++h)
      memmove(to.data + (t * to.token_stride + h * to.head_stride) * b,
              from.data + (t * from.token_stride + h * from.head_stride) * b, row);
}

constexpr bool from_output(const OpSchema& s) {
  return &s == &kQkNormRotaryEmbeddingBackwardFromOutput;
}

// The inputs the training ops take by the same names: query_in and key_in (the backward from the
// output: query and key, and no eps) as the rotation's query and key.
template <const OpSchema& S>
Rope train_inputs(const Args<S>& a) {
  constexpr bool out = from_output(S);
  Rope r{a.tensor("positions"),
         a.tensor(out ? "query" : "query_in"),
         a.optional_tensor(out ? "key" : "key_in"),
         a.tensor("cos"),
         a.tensor("sin"),
         a.integer("is_neox"),
         1.0f};
  r.query_weight = a.tensor("query_weight");
  r.key_weight = a.optional_tensor("key_weight");
  if constexpr (out)
    r.eps = 1e-6;  // the checks' (rope_views) placeholder: the given rstd replaces it
  else
    r.eps = a.real("eps");
  return r;
}

// The FromOutput ops' rstd_query and rstd_key: fp32, contiguous, one a row of query_in / key_in.
template <const OpSchema& S>
int32_t rstd_args(const Args<S>& a, QkNormTrain& t) {
  const TensorArg rq = a.tensor("rstd_query"), rk = a.optional_tensor("rstd_key");
  if (!rk.t != !t.v.has_k)
    return fail(KH_ERR_INVALID_ARGUMENT, "%s: %s must be given %s", rk.op, rk.name,
                t.v.has_k ? "with the key" : "only with the key");
  const std::pair<const TensorArg*, const HeadsView*> want[2] = {{&rq, &t.v.q}, {&rk, &t.v.k}};
  float** dst[2] = {&t.rstd_q, &t.rstd_k};
  for (int i = 0; i < (t.v.has_k ? 2 : 1); ++i) {
    VectorView v;
    KH_TRY(vector_view(*want[i].first, want[i].second->tokens * want[i].second->heads, &v));
    KH_TRY(expect_dtype(*want[i].first, v.dtype, kFP32, "rstd is fp32"));
    KH_TRY(expect_device(*want[i].first, v.device, t.v.q.device));
    *dst[i] = reinterpret_cast<float*>(v.data);
  }
  return KH_OK;
}

template <const OpSchema& S>
int32_t qk_norm_rotary_embedding_train(const Args<S>& a, void* stream) {
  QkNormTrain t;
  t.r = train_inputs(a);
  KH_TRY(check_inputs(t, a.tensor("query"), a.optional_tensor("key")));
  if constexpr (&S == &kQkNormRotaryEmbeddingTrainRstd) KH_TRY(rstd_args(a, t));
  const HeadsView& q = t.v.q;
  if (q.tokens == 0 || q.head_dim == 0) return KH_OK;
  if (is_cpu(q.device)) {  // the eval op's computation on a copy of the inputs
    const float eps = static_cast<float>(t.r.eps);
    if (t.rstd_q)  // before the copy: query may be query_in
      rope_cpu::qk_rstd(q.dtype, q.tokens, q.head_dim,
                        {q.data, q.token_stride, q.head_stride, q.heads}, eps, t.rstd_q);
    if (t.rstd_k)
      rope_cpu::qk_rstd(q.dtype, q.tokens, q.head_dim,
                        {t.v.k.data, t.v.k.token_stride, t.v.k.head_stride, t.v.k.heads}, eps,
                        t.rstd_k);
    copy_heads(q, t.out_q);
    if (t.v.has_k) copy_heads(t.v.k, t.out_k);
    return qk_norm_rope(t.r, t.out_q, t.v.has_k ? &t.out_k : nullptr, t.qw, t.kw, t.v.positions,
                        t.v.cos, t.v.sin, stream);
  }
  int G = 0;
  KH_TRY(qknr_cuda_ok(t, {&q, t.v.key(), &t.out_q, t.v.has_k ? &t.out_k : nullptr}, &G));
  kh_qknr_params p = qknr_params(t, false);
  // Two rows a group of G lanes (rotary.cu).
  const int64_t rows = q.tokens * (q.heads + (t.v.has_k ? t.v.k.heads : 0));
  if (rows == 0) return KH_OK;
  const int64_t threads = (rows + 1) / 2 * G;
  const int64_t blocks = (threads + kQknrThreads - 1) / kQknrThreads;
  if (blocks > 0x7FFFFFFF)
    return fail(KH_ERR_UNSUPPORTED, "%s: %lld rows need more than 2^31-1 CTAs", t.r.query.op,
                static_cast<long long>(rows));
  return launch_qknr("fwd", t, p, blocks, 0, stream);
}

template <const OpSchema& S>
int32_t qk_norm_rotary_embedding_backward(const Args<S>& a, void* stream) {
  QkNormTrain t;
  t.r = train_inputs(a);
  KH_TRY(check_inputs(t, a.tensor("dquery_in"), a.optional_tensor("dkey_in")));
  if constexpr (from_output(S)) KH_TRY(rstd_args(a, t));
  const HeadsView& q = t.v.q;
  const TensorArg dq = a.tensor("dquery"), dk = a.optional_tensor("dkey");
  KH_TRY(heads_view(dq, &t.d_q));
  KH_TRY(same_shape(dq, t.d_q, q, "query_in"));
  KH_TRY(key_like(dk, t, &t.d_k));
  const TensorArg dqw = a.tensor("dquery_weight"), dkw = a.optional_tensor("dkey_weight");
  const std::pair<const TensorArg*, VectorView*> grads[2] = {{&dqw, &t.dqw}, {&dkw, &t.dkw}};
  for (int i = 0; i < 2; ++i) {
    const TensorArg& g = *grads[i].first;
    if (i == 1 && !g.t != !t.v.has_k)
      return fail(KH_ERR_INVALID_ARGUMENT, "%s: %s must be given %s", g.op, g.name,
                  t.v.has_k ? "with key_in" : "only with key_in");
    if (!g.t) continue;
    KH_TRY(vector_view(g, q.head_dim, grads[i].second));
    KH_TRY(expect_dtype(g, grads[i].second->dtype, q.dtype, "the query's dtype"));
    KH_TRY(expect_device(g, grads[i].second->device, q.device));
  }
  const TensorArg ws = a.optional_tensor("workspace");
  if (ws.t) {
    KH_TRY(rows_view(ws, &t.workspace));
    KH_TRY(expect_dtype(ws, t.workspace.dtype, kFP32, "the workspace holds fp32 partials"));
    KH_TRY(expect_device(ws, t.workspace.device, q.device));
    if (t.workspace.cols != 2 * q.head_dim || t.workspace.rows < 1 || t.workspace.rows > 0x7FFFFFFF)
      return fail(KH_ERR_INVALID_ARGUMENT,
                  "%s: %s is %lld x %lld; expected float32 [W, 2 * head_dim] = [W, %lld] with "
                  "1 <= W < 2^31 (see kh_qknr_workspace_rows)",
                  ws.op, ws.name, static_cast<long long>(t.workspace.rows),
                  static_cast<long long>(t.workspace.cols), static_cast<long long>(2 * q.head_dim));
    t.has_workspace = true;
  }
  if (is_cpu(q.device)) {
    const rope_cpu::Cache cos{t.v.cos.data, t.v.cos.stride}, sin{t.v.sin.data, t.v.sin.stride};
    for (int i = 0; i < (t.v.has_k ? 2 : 1); ++i) {
      const HeadsView &in = i ? t.v.k : q, &d = i ? t.d_k : t.d_q, &out = i ? t.out_k : t.out_q;
      const rope_cpu::NormGrad g{in.data,
                                 in.token_stride,
                                 in.head_stride,
                                 d.data,
                                 d.token_stride,
                                 d.head_stride,
                                 out.data,
                                 out.token_stride,
                                 out.head_stride,
                                 in.heads,
                                 (i ? t.kw : t.qw).data,
                                 (i ? t.dkw : t.dqw).data,
                                 i ? t.rstd_k : t.rstd_q};
      rope_cpu::qk_norm_backward(q.dtype, t.v.cos.dtype, t.r.is_neox == 1, t.v.positions, q.tokens,
                                 q.head_dim, cos, sin, t.v.cos.rows, static_cast<int>(t.v.cos.cols),
                                 static_cast<float>(t.r.eps), g);
    }
    return KH_OK;
  }
  if (q.head_dim == 0) return KH_OK;  // no elements, no weights
  int G = 0;
  KH_TRY(qknr_cuda_ok(t,
                      {&q, t.v.key(), &t.out_q, t.v.has_k ? &t.out_k : nullptr, &t.d_q,
                       t.v.has_k ? &t.d_k : nullptr},
                      &G));
  if (!t.has_workspace)
    return fail(KH_ERR_INVALID_ARGUMENT,
                "%s: workspace is required on cuda: float32 [W, 2 * head_dim] (W about "
                "kh_qknr_workspace_rows)",
                t.r.query.op);
  kh_qknr_params p = qknr_params(t, true);
  p.ws = reinterpret_cast<float*>(t.workspace.data);
  p.sws = t.workspace.stride;
  const int device = q.device.device_id;
  // Walker CTAs: the workspace's rows, fewer when the query and the key have fewer rows than
  // that many CTAs take in one turn.
  const int64_t groups = kQknrThreads / G;
  const int64_t heads = t.v.has_k && t.v.k.heads > q.heads ? t.v.k.heads : q.heads;
  int64_t walkers = (q.tokens * heads + groups - 1) / groups;
  if (walkers > t.workspace.rows) walkers = t.workspace.rows;
  if (q.tokens > 0 && walkers > 0) {
    const auto smem = static_cast<uint32_t>(kQknrThreads / 32 * 2 * q.head_dim * sizeof(float));
    KH_TRY(launch_qknr(t.rstd_q ? "bwdo" : "bwd", t, p, walkers, smem, stream));
  } else {
    walkers = 0;  // the reduce then writes zero gradients
  }
  char rname[64];
  snprintf(rname, sizeof rname, "qknr_reduce_partials_%s", dtype_tag(q.dtype));
  return launch_reduce_partials(device, rname, p.ws, p.sws, static_cast<int>(walkers),
                                static_cast<int>(q.head_dim), t.v.has_k ? 2 : 1, t.dqw.data,
                                t.v.has_k ? t.dkw.data : nullptr, stream);
}

constexpr kh_op_v1_t kOps[] = {
    op<rotary_embedding>(),
    op<rotary_embedding_backward>(),
    op<qk_norm_rotary_embedding>(),
    op<qk_norm_rotary_embedding_train<kQkNormRotaryEmbeddingTrain>>(),
    op<qk_norm_rotary_embedding_backward<kQkNormRotaryEmbeddingBackward>>(),
    op<qk_norm_rotary_embedding_train<kQkNormRotaryEmbeddingTrainRstd>>(),
    op<qk_norm_rotary_embedding_backward<kQkNormRotaryEmbeddingBackwardFromOutput>>()};

// forward_train is the forward op for RotaryEmbedding: the rotation needs nothing saved.
// QKNormRotaryEmbedding trains out of place (its backward reads the forward's input).
constexpr kh_layer_v1_t kLayers[] = {
    layer("RotaryEmbedding", kRotaryEmbedding, kRotaryEmbedding, kRotaryEmbeddingBackward),
    layer("QKNormRotaryEmbedding", kQkNormRotaryEmbedding, kQkNormRotaryEmbeddingTrain,
          kQkNormRotaryEmbeddingBackward),
    // Trains in place (a caller keeps q and k rotated for the attention's backward and not the
    // projections too): the forward saves rstd, the backward reads the output.
    layer("QKNormRotaryEmbeddingFromOutput", kQkNormRotaryEmbedding,
          kQkNormRotaryEmbeddingTrainRstd, kQkNormRotaryEmbeddingBackwardFromOutput),
};

constexpr kh_module_v1_t kModule =
    make_module(kPackageName, kPackageVersion, "kernel-hub/rotary " KH_BUILD_ID, kLayers, kOps);

}  // namespace
}  // namespace khk

KH_PACKAGE_ENTRY(khk::kModule)
