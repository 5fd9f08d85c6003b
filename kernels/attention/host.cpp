// Host library of the kernel-hub/attention package: layers Attention (forward and backward,
// FlashAttention-2 style on sm_80+ tensor cores, with wgmma on sm_90a for head_dim 64 and 128
// (forward_sm90.cuh: FlashAttention-3's warp-specialized schedule; backward_sm90.cuh): packed
// varlen or padded batches, MHA/GQA/MQA, causal and sliding-window masks, optional fp32
// log-sum-exp), PagedAttention (decode of one or a few query tokens per sequence against a paged KV
// cache, split over the context), PagedKVAppend (writes new tokens' K and V into the pages) and
// PagedAttentionWithKVAppend (both in one launch: the tensor-core decode reads the new tokens from
// k_new / v_new and writes them). Ops check their DLPack arguments, then run cpu.cpp on kDLCPU
// tensors or launch attention.cu's kernels through the loader on kDLCUDA ones.
//
// Attention's forward_train is the forward op with its lse output (backward recomputes the
// probabilities from q, k and lse); its backward takes the caller's fp32 workspace on cuda.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <algorithm>
#include <atomic>

#include "kernels/attention/attention_params.h"
#include "kernels/attention/cpu.h"
#include "kernels/common/op_schema.h"
#include "kernels/common/package_host.h"
#include "kernels/common/tensor_args.h"

namespace khk {
namespace {

constexpr const char* kPackageName = "kernel-hub/attention";
constexpr const char* kPackageVersion = "1.3.12";
constexpr uint32_t kAttnDtypes = KH_DTYPE_BF16 | KH_DTYPE_FP16;
// Splits of a decode's context are at least this many tokens, and at most kMaxSplits.
constexpr int kMinSplitTokens = 256;
constexpr int kMaxSplits = 32;
// What the GPU the op runs on holds: the decode's split plan fills whole waves of its CTAs
// (every CTA of a decode does the same work, so a last, partly filled wave costs as much as a
// full one), and the backward orders its last two waves (kh_attn_tile). What an SM holds comes
// from the loader's device-info service (ABI 1.4); with an older loader, or a device that does
// not answer, an H100/H200 is assumed (still correct elsewhere, with less even waves).
struct GpuSlots {
  int64_t sms = 132;
  int64_t smem_per_sm = 228 * 1024;
  int64_t smem_reserved_per_cta = 1024;
  int64_t threads_per_sm = 2048;
};
// The first split count whose waves are this full is taken.
constexpr double kDecodeWaveFill = 0.95;

GpuSlots gpu_slots(int32_t device_id) {
  GpuSlots g;
  kh_device_info_t info;
  if (!device_info(device_id, &info) || info.multiprocessors < 1) return g;
  g.sms = info.multiprocessors;
  if (info.shared_memory_per_multiprocessor > 0)
    g.smem_per_sm = info.shared_memory_per_multiprocessor;
  if (info.shared_memory_reserved_per_block >= 0)
    g.smem_reserved_per_cta = info.shared_memory_reserved_per_block;
  if (info.max_threads_per_multiprocessor > 0)
    g.threads_per_sm = info.max_threads_per_multiprocessor;
  return g;
}

// CTAs one SM holds: its shared memory (with what the driver reserves per CTA) and
// threads bound it, and `cap` (> 0) where the kernel's register budget is set for that many.
int64_t ctas_per_sm(const GpuSlots& g, int64_t smem_bytes, int64_t threads, int64_t cap) {
  // A kernel without shared memory on a GPU that reserves none per CTA: threads alone bound it.
  const int64_t per_cta = smem_bytes + g.smem_reserved_per_cta;
  int64_t n = g.threads_per_sm / threads;
  if (per_cta > 0 && g.smem_per_sm / per_cta < n) n = g.smem_per_sm / per_cta;
  if (cap > 0 && cap < n) n = cap;
  return n > 0 ? n : 1;
}

// The CTAs of a backward grid that take their key blocks longest first (kh_attn_tile): two
// waves of what the GPU holds at once. Measured on an H200 (Qwen3-0.6B training, 1024 CTAs of
// one an SM): the backward 33.7 -> 30.8 ms a step with 2 waves (1 as good, 3 and 4 less, the
// whole grid no better than none: a group's blocks then no longer share Q, dO and dQ in L2).
// The forward's grid, longest block first within each group, gained nothing from it.
constexpr int64_t kTailWaves = 2;
int backward_tail_ctas(int32_t device_id, int64_t smem_bytes, int64_t threads) {
  const GpuSlots g = gpu_slots(device_id);
  return static_cast<int>(std::min<int64_t>(
      kTailWaves * g.sms * ctas_per_sm(g, smem_bytes, threads, 0), int64_t{1} << 30));
}

// Splits of the context for `ctas` CTAs per split: the fewest whose waves are kDecodeWaveFill
// full, else the fullest, at most max_splits.
int64_t decode_splits(const GpuSlots& g, int64_t ctas, int64_t per_sm, int64_t max_splits) {
  const int64_t slots = g.sms * per_sm;
  int64_t best = 1;
  double best_fill = 0;
  for (int64_t s = 1; s <= max_splits; ++s) {
    const int64_t n = ctas * s, waves = (n + slots - 1) / slots;
    const double fill = static_cast<double>(n) / static_cast<double>(waves * slots);
    if (fill > best_fill) {
      best = s;
      best_fill = fill;
    }
    if (fill >= kDecodeWaveFill) break;
  }
  return best;
}

const char* dtype_tag(int dtype) {
  return dtype == kBF16 ? "bf16" : "fp16";
}

// The device kernels read rows in 16-byte chunks and take head_dim 64, 128 or 256.
int32_t cuda_layout_ok(const TensorArg& a, const HeadsView& v) {
  if (v.dtype == kFP32)
    return fail(KH_ERR_UNSUPPORTED,
                "%s: %s is fp32 on cuda; the cuda kernels take bf16 or fp16 (convert the "
                "tensors, or pass cpu tensors: fp32 runs on the cpu implementation)",
                a.op, a.name);
  if (v.head_dim != 64 && v.head_dim != 128 && v.head_dim != 256)
    return fail(KH_ERR_UNSUPPORTED, "%s: head_dim %lld; the cuda kernels take 64, 128 or 256", a.op,
                static_cast<long long>(v.head_dim));
  if (!aligned16(v.data) || (v.token_stride * 2) % 16 || (v.head_stride * 2) % 16)
    return fail(KH_ERR_UNSUPPORTED,
                "%s: %s must start on a 16-byte boundary with token and head strides that are "
                "multiples of 8 elements (got %lld and %lld)",
                a.op, a.name, static_cast<long long>(v.token_stride),
                static_cast<long long>(v.head_stride));
  return KH_OK;
}

int32_t heads_ratio(const char* op, int64_t q_heads, int64_t kv_heads) {
  if (kv_heads <= 0 || q_heads % kv_heads)
    return fail(KH_ERR_INVALID_ARGUMENT,
                "%s: %lld query heads is not a multiple of %lld key/value heads (GQA groups "
                "query heads evenly)",
                op, static_cast<long long>(q_heads), static_cast<long long>(kv_heads));
  return KH_OK;
}

int32_t window_arg(const char* op, int64_t window_left) {
  if (window_left < -1 || window_left > 0x7FFFFFFF)
    return fail(KH_ERR_INVALID_ARGUMENT,
                "%s: window_left %lld; expected -1 (no window) or the number of earlier keys a "
                "query sees",
                op, static_cast<long long>(window_left));
  return KH_OK;
}

int32_t scale_arg(const char* op, double scale) {
  if (!(scale > 0.0) || !isfinite(scale))
    return fail(KH_ERR_INVALID_ARGUMENT,
                "%s: scale %g; expected a positive softmax scale (1 / sqrt(head_dim) usually)", op,
                scale);
  return KH_OK;
}

// ---- Index checks on host tensors ----
// The cpu ops read cu_seqlens, seq_lens and block tables on the host, so they check them before
// indexing with them; the cuda kernels cannot without a synchronisation and trust them, as
// FlashAttention's and paged-attention kernels do (the README says so).

int32_t cpu_seqlens_ok(const char* op, const char* name, const int32_t* cu, int batch,
                       int64_t tokens) {
  if (!cu) return KH_OK;
  for (int b = 0; b <= batch; ++b)
    if (cu[b] < 0 || cu[b] > tokens || (b > 0 && cu[b] < cu[b - 1]))
      return fail(KH_ERR_INVALID_ARGUMENT,
                  "%s: %s[%d] = %d; offsets must rise from 0 to at most the %lld tokens", op, name,
                  b, cu[b], static_cast<long long>(tokens));
  return KH_OK;
}

int32_t cpu_pages_ok(const char* op, const kh_paged_kv& kv, int batch, int64_t pages, int min_len) {
  const int page_size = kv.page_size, table_stride = kv.table_stride;
  for (int b = 0; b < batch; ++b) {
    const int64_t len = kv.seq_lens[b];
    if (len < min_len || len > static_cast<int64_t>(table_stride) * page_size)
      return fail(KH_ERR_INVALID_ARGUMENT,
                  "%s: seq_lens[%d] = %lld; expected %d..%lld (the block table's %d pages of %d)",
                  op, b, static_cast<long long>(len), min_len,
                  static_cast<long long>(table_stride) * page_size, table_stride, page_size);
    for (int64_t i = 0; i < (len + page_size - 1) / page_size; ++i) {
      const int32_t page = kv.block_table[static_cast<int64_t>(b) * table_stride + i];
      if (page < 0 || page >= pages)
        return fail(KH_ERR_INVALID_ARGUMENT,
                    "%s: block_table[%d][%lld] = %d; the cache has pages 0..%lld", op, b,
                    static_cast<long long>(i), page, static_cast<long long>(pages - 1));
    }
  }
  return KH_OK;
}

// ---- Attention ----

constexpr OpSchema kForward{
    "attention_forward(Tensor q, Tensor k, Tensor v, Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, "
    "int max_seqlen_q, int causal, int window_left, float scale, Tensor(a!) out, Tensor(b!)? "
    "lse) -> ()"};
constexpr OpSchema kBackward{
    "attention_backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
    "Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, int causal, "
    "int window_left, float scale, Tensor(a!) dq, Tensor(b!) dk, Tensor(c!) dv, Tensor(d!)? "
    "workspace) -> ()"};

// The arguments forward and backward share: q, k, v, out (the forward's output), the sequences,
// the masks and the scale, checked and gathered into p (lse is the caller's).
struct AttnInputs {
  HeadsView q, k, v, o;
};

template <const OpSchema& S>
int32_t attention_inputs(const Args<S>& a, kh_attn_params* pp, AttnInputs* in) {
  const char* op = S.name();
  const TensorArg cu_q_arg = a.optional_tensor("cu_seqlens_q");
  const TensorArg cu_k_arg = a.optional_tensor("cu_seqlens_k");
  const bool varlen = cu_q_arg.t != nullptr;
  if ((cu_k_arg.t != nullptr) != varlen)
    return fail(KH_ERR_INVALID_ARGUMENT,
                "%s: pass both cu_seqlens_q and cu_seqlens_k (packed sequences) or neither "
                "(padded [batch, seqlen, heads, head_dim] tensors)",
                op);
  HeadsView &q = in->q, &k = in->k, &v = in->v, &o = in->o;
  KH_TRY(heads_view(a.tensor("q"), &q, !varlen));
  KH_TRY(heads_view(a.tensor("k"), &k, !varlen));
  KH_TRY(heads_view(a.tensor("v"), &v, !varlen));
  KH_TRY(heads_view(a.tensor("out"), &o, !varlen));
  KH_TRY(same_kind(a.tensor("k"), k, q, "q"));
  KH_TRY(same_shape(a.tensor("v"), v, k, "k"));
  KH_TRY(same_shape(a.tensor("out"), o, q, "q"));
  KH_TRY(heads_ratio(op, q.heads, k.heads));
  const int64_t causal = a.integer("causal"), window_left = a.integer("window_left");
  if (causal != 0 && causal != 1)
    return fail(KH_ERR_INVALID_ARGUMENT, "%s: causal must be 0 or 1, got %lld", op,
                static_cast<long long>(causal));
  KH_TRY(window_arg(op, window_left));
  const double scale = a.real("scale");
  KH_TRY(scale_arg(op, scale));

  kh_attn_params p{};
  p.q = q.data;
  p.k = k.data;
  p.v = v.data;
  p.o = o.data;
  p.q_row = q.token_stride;
  p.q_head = q.head_stride;
  p.k_row = k.token_stride;
  p.k_head = k.head_stride;
  p.v_row = v.token_stride;
  p.v_head = v.head_stride;
  p.o_row = o.token_stride;
  p.o_head = o.head_stride;
  p.q_heads = static_cast<int>(q.heads);
  p.kv_heads = static_cast<int>(k.heads);
  p.causal = static_cast<int>(causal);
  // A window of at least every key sequence's length hides no key: none, so that the kernels'
  // 32-bit index sums with window_left (kh_attn_query_range's n0 + bn - offset + window_left)
  // cannot overflow: at INT_MAX the backward's key blocks walked no query and dk, dv were zeros.
  p.window_left = window_left >= k.tokens ? -1 : static_cast<int>(window_left);
  p.scale = static_cast<float>(scale);
  p.scale_log2 = static_cast<float>(scale * 1.4426950408889634);
  p.lse_head = q.tokens;
  if (varlen) {
    const int64_t batch = cu_q_arg.t->ndim == 1 ? cu_q_arg.t->shape[0] - 1 : -1;
    if (batch < 0)
      return fail(KH_ERR_INVALID_ARGUMENT,
                  "%s: cu_seqlens_q must be a 1-D int32 tensor of batch + 1 offsets", op);
    KH_TRY(int32_tensor_arg(cu_q_arg, batch + 1, "sequence plus one", q.device, &p.cu_seqlens_q));
    KH_TRY(int32_tensor_arg(cu_k_arg, batch + 1, "sequence plus one", q.device, &p.cu_seqlens_k));
    const int64_t max_q = a.integer("max_seqlen_q");
    if (max_q < 0 || max_q > q.tokens)
      return fail(KH_ERR_INVALID_ARGUMENT,
                  "%s: max_seqlen_q %lld; expected the longest query sequence (0..%lld tokens)", op,
                  static_cast<long long>(max_q), static_cast<long long>(q.tokens));
    p.batch = static_cast<int>(batch);
    p.max_seqlen_q = static_cast<int>(max_q);
  } else {
    if (k.batch != q.batch)
      return fail(KH_ERR_INVALID_ARGUMENT, "%s: k has batch %lld, q has %lld", op,
                  static_cast<long long>(k.batch), static_cast<long long>(q.batch));
    p.batch = static_cast<int>(q.batch);
    p.seqlen_q = static_cast<int>(q.seqlen);
    p.seqlen_k = static_cast<int>(k.seqlen);
    p.max_seqlen_q = p.seqlen_q;
  }
  *pp = p;
  return KH_OK;
}

// workspace: a contiguous fp32 tensor of any shape on q's device; *data and its element count.
int32_t workspace_arg(const TensorArg& a, const HeadsView& q, float** data, int64_t* n) {
  int64_t count = 1;
  for (int i = 0; i < a.t->ndim; ++i) count *= a.t->shape[i];
  VectorView ws;
  KH_TRY(vector_view(a, count, &ws));
  KH_TRY(expect_dtype(a, ws.dtype, kFP32, "fp32"));
  KH_TRY(expect_device(a, ws.device, q.device));
  *data = reinterpret_cast<float*>(ws.data);
  *n = count;
  return KH_OK;
}

// lse: fp32 [q_heads, tokens_q], contiguous.
int32_t lse_arg(const TensorArg& a, const HeadsView& q, float** out) {
  VectorView lse;
  KH_TRY(vector_view(a, q.heads * q.tokens, &lse));
  KH_TRY(expect_dtype(a, lse.dtype, kFP32, "fp32 ([q_heads, tokens])"));
  KH_TRY(expect_device(a, lse.device, q.device));
  *out = reinterpret_cast<float*>(lse.data);
  return KH_OK;
}

int32_t cuda_inputs_ok(const Args<kForward>& a, const AttnInputs& in) {
  KH_TRY(cuda_layout_ok(a.tensor("q"), in.q));
  KH_TRY(cuda_layout_ok(a.tensor("k"), in.k));
  KH_TRY(cuda_layout_ok(a.tensor("v"), in.v));
  return cuda_layout_ok(a.tensor("out"), in.o);
}

// Whether the device code for `device` has `kernel`: the Hopper kernels (attn_fwd90_*,
// attn_bwd90_*) exist only where NVRTC (or a packaged cubin) targeted sm_90a, all under the same
// condition, so one answer per device serves them all.
int32_t has_kernel(int32_t device, const char* kernel, bool* out) {
  static std::atomic<int8_t> known[64];  // 0 unknown, 1 yes, -1 no
  const bool cached = device >= 0 && device < 64;
  if (cached && known[device].load(std::memory_order_relaxed) != 0) {
    *out = known[device].load(std::memory_order_relaxed) > 0;
    return KH_OK;
  }
  const kh_host_v1_t* h = host();
  if (!h) return fail(KH_ERR_INTERNAL, "%s: the package was used before kh_module_v1 ran", kernel);
  void* fn = nullptr;
  const int32_t status = h->get_function(h->ctx, device, kernel, &fn);
  if (status != KH_OK && status != KH_ERR_NOT_FOUND) return status;  // the loader set the error
  *out = status == KH_OK;
  if (cached) known[device].store(*out ? 1 : -1, std::memory_order_relaxed);
  return KH_OK;
}

// A TMA descriptor of q, k, v or dO for the Hopper kernels, from the loader's tensor-map service
// (ABI 1.3): the tensor viewed as {64 columns of a panel, token, head_dim / 64 panels, head}
// (attention_params.h), boxes of `rows` tokens and every panel, the 128-byte swizzle. False
// where the loader is older or the layout is not one TMA takes (strides or the base not
// multiples of 16 bytes): the kernels then load with cp.async.
bool head_map(int32_t device, const HeadsView& t, int rows, kh_tma_desc* out) {
  // KERNEL_HUB_ATTENTION_TMA=0 keeps the cp.async loads (the GPU tests run both paths).
  if (const char* e = getenv("KERNEL_HUB_ATTENTION_TMA"); e && strcmp(e, "0") == 0) return false;
  const kh_host_v1_t* h = host();
  if (!h || h->h.abi_minor < 3 || h->h.struct_size < KH_HOST_V1_3_SIZE || !h->tensor_map)
    return false;
  constexpr int64_t kElem = 2;  // bf16 and fp16: the Hopper kernels take nothing else
  if ((t.token_stride * kElem) % 16 != 0 || (t.head_stride * kElem) % 16 != 0 ||
      reinterpret_cast<uintptr_t>(t.data) % 16 != 0 || t.head_dim % 64 != 0)
    return false;
  kh_tensor_map_t r{};
  r.h = KH_HEADER_INIT(kh_tensor_map_t);
  r.device_id = device;
  r.dtype = t.dtype == kBF16 ? KH_DTYPE_BF16 : KH_DTYPE_FP16;
  r.rank = 4;
  r.swizzle_bytes = 128;
  r.base = t.data;
  const uint64_t dims[4] = {64, static_cast<uint64_t>(t.tokens),
                            static_cast<uint64_t>(t.head_dim / 64), static_cast<uint64_t>(t.heads)};
  const uint64_t strides[4] = {0, static_cast<uint64_t>(t.token_stride * kElem), 128,
                               static_cast<uint64_t>(t.head_stride * kElem)};
  const uint32_t box[4] = {64, static_cast<uint32_t>(rows), static_cast<uint32_t>(t.head_dim / 64),
                           1};
  for (int i = 0; i < 4; ++i) {
    r.dims[i] = dims[i];
    r.strides[i] = strides[i];
    r.box[i] = box[i];
  }
  return h->tensor_map(h->ctx, &r, out) == KH_OK;
}

int32_t attention_forward(const Args<kForward>& a, void* stream) {
  kh_attn_params p;
  AttnInputs in;
  KH_TRY(attention_inputs(a, &p, &in));
  const HeadsView& q = in.q;
  if (const TensorArg lse = a.optional_tensor("lse"); lse.t) KH_TRY(lse_arg(lse, q, &p.lse));
  if (q.tokens == 0 || p.batch == 0) return KH_OK;

  if (is_cpu(q.device)) {
    KH_TRY(cpu_seqlens_ok(kForward.name(), "cu_seqlens_q", p.cu_seqlens_q, p.batch, q.tokens));
    KH_TRY(cpu_seqlens_ok(kForward.name(), "cu_seqlens_k", p.cu_seqlens_k, p.batch, in.k.tokens));
    attention_cpu::forward(q.dtype, static_cast<int>(q.head_dim), p);
    return KH_OK;
  }
  KH_TRY(cuda_inputs_ok(a, in));
  if (p.max_seqlen_q == 0) return KH_OK;
  const int d = static_cast<int>(q.head_dim);
  const int32_t device = q.device.device_id;
  char name[48];
  bool hopper = false;
  if (d != 256) {
    snprintf(name, sizeof name, "attn_fwd90_%s_d%d", dtype_tag(q.dtype), d);
    KH_TRY(has_kernel(device, name, &hopper));
  }
  if (!hopper) snprintf(name, sizeof name, "attn_fwd_%s_d%d", dtype_tag(q.dtype), d);
  if (hopper)
    p.tma = head_map(device, q, kh_attn_fwd90_block_m(), &p.q_map) &&
            head_map(device, in.k, kh_attn_fwd90_block_n(d), &p.k_map) &&
            head_map(device, in.v, kh_attn_fwd90_block_n(d), &p.v_map);
  LaunchDims dims;
  dims.flags = kPdlEntry;
  if (hopper) {  // persistent: a CTA a multiprocessor walks the units (forward_sm90.cuh)
    const int64_t units = kh_attn_fwd90_units(p), sms = gpu_slots(device).sms;
    if (units == 0) return KH_OK;
    if (units > 0x7FFFFFFF)
      return fail(KH_ERR_UNSUPPORTED,
                  "%s: %lld pairs of query blocks x heads x sequences; the cuda kernel walks at "
                  "most 2^31-1 (split the batch)",
                  kForward.name(), static_cast<long long>(units));
    dims.grid[0] = static_cast<uint32_t>(units < sms ? units : sms);
  } else {
    const int bm = 16 * kh_attn_fwd_warps(d);
    dims.grid[0] = static_cast<uint32_t>((p.max_seqlen_q + bm - 1) / bm);
    dims.grid[1] = static_cast<uint32_t>(p.q_heads);
    dims.grid[2] = static_cast<uint32_t>(p.batch);
  }
  dims.block[0] =
      static_cast<uint32_t>(hopper ? kh_attn_fwd90_threads() : 32 * kh_attn_fwd_warps(d));
  dims.shared_mem_bytes =
      static_cast<uint32_t>(hopper ? kh_attn_fwd90_smem_bytes(d) : kh_attn_fwd_smem_bytes(d));
  void* params[] = {&p};
  return launch_kernel(device, name, dims, params, stream);
}

int32_t attention_backward(const Args<kBackward>& a, void* stream) {
  const char* op = kBackward.name();
  kh_attn_bwd_params bp{};
  AttnInputs in;
  KH_TRY(attention_inputs(a, &bp.f, &in));
  const HeadsView &q = in.q, &k = in.k;
  KH_TRY(lse_arg(a.tensor("lse"), q, &bp.f.lse));
  HeadsView g, dq, dk, dv;
  const bool varlen = bp.f.cu_seqlens_q != nullptr;
  KH_TRY(heads_view(a.tensor("dout"), &g, !varlen));
  KH_TRY(heads_view(a.tensor("dq"), &dq, !varlen));
  KH_TRY(heads_view(a.tensor("dk"), &dk, !varlen));
  KH_TRY(heads_view(a.tensor("dv"), &dv, !varlen));
  KH_TRY(same_shape(a.tensor("dout"), g, q, "q"));
  KH_TRY(same_shape(a.tensor("dq"), dq, q, "q"));
  KH_TRY(same_shape(a.tensor("dk"), dk, k, "k"));
  KH_TRY(same_shape(a.tensor("dv"), dv, k, "k"));
  bp.dout = g.data;
  bp.dq = dq.data;
  bp.dk = dk.data;
  bp.dv = dv.data;
  bp.do_row = g.token_stride;
  bp.do_head = g.head_stride;
  bp.dq_row = dq.token_stride;
  bp.dq_head = dq.head_stride;
  bp.dk_row = dk.token_stride;
  bp.dk_head = dk.head_stride;
  bp.dv_row = dv.token_stride;
  bp.dv_head = dv.head_stride;
  bp.tokens_q = q.tokens;
  if (varlen) {
    const int64_t max_k = a.integer("max_seqlen_k");
    if (max_k < 0 || max_k > k.tokens)
      return fail(KH_ERR_INVALID_ARGUMENT,
                  "%s: max_seqlen_k %lld; expected the longest key sequence (0..%lld tokens)", op,
                  static_cast<long long>(max_k), static_cast<long long>(k.tokens));
    bp.max_seqlen_k = static_cast<int>(max_k);
  } else {
    bp.max_seqlen_k = bp.f.seqlen_k;
  }
  if (bp.f.batch == 0 || (q.tokens == 0 && k.tokens == 0)) return KH_OK;

  if (is_cpu(q.device)) {
    KH_TRY(cpu_seqlens_ok(op, "cu_seqlens_q", bp.f.cu_seqlens_q, bp.f.batch, q.tokens));
    KH_TRY(cpu_seqlens_ok(op, "cu_seqlens_k", bp.f.cu_seqlens_k, bp.f.batch, k.tokens));
    attention_cpu::backward(q.dtype, static_cast<int>(q.head_dim), bp);
    return KH_OK;
  }
  KH_TRY(cuda_layout_ok(a.tensor("q"), q));
  KH_TRY(cuda_layout_ok(a.tensor("k"), k));
  KH_TRY(cuda_layout_ok(a.tensor("v"), in.v));
  KH_TRY(cuda_layout_ok(a.tensor("out"), in.o));
  KH_TRY(cuda_layout_ok(a.tensor("dout"), g));
  KH_TRY(cuda_layout_ok(a.tensor("dq"), dq));
  KH_TRY(cuda_layout_ok(a.tensor("dk"), dk));
  KH_TRY(cuda_layout_ok(a.tensor("dv"), dv));
  const int d = static_cast<int>(q.head_dim);
  if (d == 256)
    return fail(KH_ERR_UNSUPPORTED, "%s: head_dim 256 has no cuda backward yet (64 and 128 do)",
                op);
  const TensorArg ws_arg = a.optional_tensor("workspace");
  const int64_t need = q.tokens * q.heads * (q.head_dim + 1);
  if (!ws_arg.t)
    return fail(KH_ERR_INVALID_ARGUMENT,
                "%s: the cuda backward needs workspace: an fp32 tensor of at least tokens_q * "
                "q_heads * (head_dim + 1) = %lld elements",
                op, static_cast<long long>(need));
  int64_t n = 0;
  KH_TRY(workspace_arg(ws_arg, q, &bp.dq_accum, &n));
  if (n < need)
    return fail(KH_ERR_INVALID_ARGUMENT,
                "%s: workspace has %lld elements; the backward needs tokens_q * q_heads * "
                "(head_dim + 1) = %lld",
                op, static_cast<long long>(n), static_cast<long long>(need));
  bp.delta = bp.dq_accum + q.tokens * q.heads * q.head_dim;

  void* params[] = {&bp};
  char name[48];
  LaunchDims pre;
  pre.flags = kPdlEntry;
  // attn_bwd_pre and attn_bwd_post: a thread per kh_attn_bwd_vec() columns of every row.
  const int64_t vec_threads = q.tokens * q.heads * d / kh_attn_bwd_vec();
  pre.block[0] = 128;
  pre.grid[0] = static_cast<uint32_t>((vec_threads + 127) / 128);
  snprintf(name, sizeof name, "attn_bwd_pre_%s_d%d", dtype_tag(q.dtype), d);
  if (q.tokens > 0) KH_TRY(launch_kernel(q.device.device_id, name, pre, params, stream));
  if (bp.max_seqlen_k > 0) {
    snprintf(name, sizeof name, "attn_bwd90_%s_d%d", dtype_tag(q.dtype), d);
    bool hopper = false;
    KH_TRY(has_kernel(q.device.device_id, name, &hopper));
    // The Hopper kernel's bulk reductions need dq_accum on a 16-byte boundary.
    hopper = hopper && aligned16(bp.dq_accum);
    bp.dq_heads_major = hopper ? 1 : 0;
    if (!hopper) snprintf(name, sizeof name, "attn_bwd_%s_d%d", dtype_tag(q.dtype), d);
    const int32_t device = q.device.device_id;
    if (hopper)
      bp.f.tma = head_map(device, q, kh_attn_bwd90_block_m(), &bp.f.q_map) &&
                 head_map(device, g, kh_attn_bwd90_block_m(), &bp.do_map) &&
                 head_map(device, k, kh_attn_bwd90_block_n(), &bp.f.k_map) &&
                 head_map(device, in.v, kh_attn_bwd90_block_n(), &bp.f.v_map);
    const int bn = hopper ? kh_attn_bwd90_block_n() : kh_attn_bwd_block();
    LaunchDims main;
    main.flags = kPdlEntry;
    main.grid[0] = static_cast<uint32_t>((bp.max_seqlen_k + bn - 1) / bn);
    main.grid[1] = static_cast<uint32_t>(bp.f.kv_heads);
    main.grid[2] = static_cast<uint32_t>(bp.f.batch);
    main.block[0] =
        static_cast<uint32_t>(hopper ? kh_attn_bwd90_threads() : 32 * kh_attn_bwd_warps());
    main.shared_mem_bytes =
        static_cast<uint32_t>(hopper ? kh_attn_bwd90_smem_bytes(d) : kh_attn_bwd_smem_bytes(d));
    bp.f.tail_ctas = backward_tail_ctas(device, main.shared_mem_bytes, main.block[0]);
    KH_TRY(launch_kernel(q.device.device_id, name, main, params, stream));
  }
  if (q.tokens == 0) return KH_OK;
  LaunchDims post;
  post.flags = kPdlEntry;
  post.block[0] = 256;
  post.grid[0] = static_cast<uint32_t>((vec_threads + 255) / 256);
  snprintf(name, sizeof name, "attn_bwd_post_%s_d%d", dtype_tag(q.dtype), d);
  return launch_kernel(q.device.device_id, name, post, params, stream);
}

// ---- PagedAttention ----

// A paged cache [pages, page_size, kv_heads, head_dim]: its page stride and the view of one page
// row as heads.
struct PagedCache {
  HeadsView rows;  // tokens = pages * page_size
  int64_t pages = 0, page_size = 0, page_stride = 0;
};

int32_t paged_cache_view(const TensorArg& a, PagedCache* out) {
  const DLTensor* t = a.t;
  if (t->ndim != 4 || !t->shape)
    return fail(KH_ERR_INVALID_ARGUMENT,
                "%s: tensor %s has %d dimensions; expected [pages, page_size, kv_heads, "
                "head_dim]",
                a.op, a.name, t->ndim);
  PagedCache c;
  c.pages = t->shape[0];
  c.page_size = t->shape[1];
  // Rows inside a page are viewed as tokens; the page stride is kept apart so that a cache
  // whose pages are padded or interleaved with others (K and V of one allocation) works too.
  DLTensor page = *t;
  page.ndim = 3;
  page.shape = t->shape + 1;
  page.strides = t->strides ? t->strides + 1 : nullptr;
  KH_TRY(heads_view({a.op, a.name, &page}, &c.rows));
  c.page_stride = t->strides ? t->strides[0] : c.page_size * c.rows.token_stride;
  if (c.page_size <= 0 || c.pages <= 0)
    return fail(KH_ERR_INVALID_ARGUMENT, "%s: %s has no pages", a.op, a.name);
  *out = c;
  return KH_OK;
}

// k_cache and v_cache (the same shape), block_table int32 [batch, pages per sequence]
// (contiguous) and seq_lens int32 [batch], on `device`: their views and the kernels' kh_paged_kv.
struct PagedKvArgs {
  PagedCache k, v;
  kh_paged_kv kv{};
};

int32_t paged_kv_args(const TensorArg& k_arg, const TensorArg& v_arg, const TensorArg& table_arg,
                      const TensorArg& lens_arg, int64_t batch, DLDevice device, PagedKvArgs* out) {
  PagedKvArgs& c = *out;
  KH_TRY(paged_cache_view(k_arg, &c.k));
  KH_TRY(paged_cache_view(v_arg, &c.v));
  KH_TRY(same_shape(v_arg, c.v.rows, c.k.rows, "k_cache"));
  const DLTensor* t = table_arg.t;
  if (t->ndim != 2 || t->shape[0] != batch)
    return fail(KH_ERR_INVALID_ARGUMENT,
                "%s: block_table must be int32 [batch = %lld, pages per sequence]", table_arg.op,
                static_cast<long long>(batch));
  KH_TRY(int32_tensor_arg(table_arg, t->shape[0] * t->shape[1], "(sequence, page)", device,
                          &c.kv.block_table));
  KH_TRY(int32_tensor_arg(lens_arg, batch, "sequence", device, &c.kv.seq_lens));
  c.kv.k = c.k.rows.data;
  c.kv.v = c.v.rows.data;
  c.kv.k_page = c.k.page_stride;
  c.kv.k_row = c.k.rows.token_stride;
  c.kv.k_head = c.k.rows.head_stride;
  c.kv.v_page = c.v.page_stride;
  c.kv.v_row = c.v.rows.token_stride;
  c.kv.v_head = c.v.rows.head_stride;
  c.kv.table_stride = static_cast<int>(t->shape[1]);
  c.kv.page_size = static_cast<int>(c.k.page_size);
  return KH_OK;
}

// k_new / v_new [batch, new_tokens, kv_heads, head_dim] checked against the cache: the append's
// kernel parameters.
int32_t append_args(const TensorArg& kn_arg, const TensorArg& vn_arg, const PagedKvArgs& c,
                    kh_append_params* out) {
  const char* op = kn_arg.op;
  HeadsView kn, vn;
  KH_TRY(heads_view(kn_arg, &kn, true));
  KH_TRY(heads_view(vn_arg, &vn, true));
  if (kn_arg.t->ndim != 4)
    return fail(KH_ERR_INVALID_ARGUMENT,
                "%s: k_new must be [batch, new_tokens, kv_heads, head_dim]", op);
  KH_TRY(same_shape(vn_arg, vn, kn, "k_new"));
  KH_TRY(same_kind(kn_arg, kn, c.k.rows, "k_cache"));
  if (c.k.rows.heads != kn.heads)
    return fail(KH_ERR_INVALID_ARGUMENT, "%s: k_cache has %lld kv heads, k_new %lld", op,
                static_cast<long long>(c.k.rows.heads), static_cast<long long>(kn.heads));
  if (!is_cpu(kn.device)) {
    KH_TRY(cuda_layout_ok(kn_arg, kn));
    KH_TRY(cuda_layout_ok(vn_arg, vn));
  }
  kh_append_params& p = *out;
  p = kh_append_params{};
  p.kv = c.kv;
  p.nw = {kn.data,
          vn.data,
          kn.token_stride,
          kn.head_stride,
          vn.token_stride,
          vn.head_stride,
          static_cast<int>(kn.seqlen)};
  p.batch = static_cast<int>(kn.batch);
  p.kv_heads = static_cast<int>(kn.heads);
  p.head_dim = static_cast<int>(kn.head_dim);
  return KH_OK;
}

// The append on cpu (checked pages) or its kernel: one CTA per (new token, KV head).
int32_t run_append(const char* op, const kh_append_params& p, const PagedCache& k, int dtype,
                   DLDevice device, void* stream) {
  if (p.batch == 0 || p.nw.n == 0) return KH_OK;
  if (is_cpu(device)) {
    KH_TRY(cpu_pages_ok(op, p.kv, p.batch, k.pages, p.nw.n));
    attention_cpu::append(dtype, p);
    return KH_OK;
  }
  char name[48];
  snprintf(name, sizeof name, "paged_kv_append_%s", dtype_tag(dtype));
  LaunchDims dims;
  dims.flags = kPdlEntry;
  dims.grid[0] = static_cast<uint32_t>(p.batch * p.nw.n);
  dims.grid[1] = static_cast<uint32_t>(p.kv_heads);
  dims.block[0] = 32;
  kh_append_params copy = p;
  void* params[] = {&copy};
  return launch_kernel(device.device_id, name, dims, params, stream);
}

// paged_attention_decode and (with k_new / v_new) paged_attention_decode_append: q and out
// checked against the cache, the split plan, the launches.
struct DecodeArgs {
  TensorArg q, k_cache, v_cache, block_table, seq_lens, out, workspace;
  const TensorArg* k_new = nullptr;  // the fused append's new K and V, or null
  const TensorArg* v_new = nullptr;
  int64_t window_left = -1;
  double scale = 1;
};

int32_t run_decode(const char* op, const DecodeArgs& a, void* stream) {
  // q and out: [batch, q_tokens, q_heads, head_dim].
  HeadsView q, o;
  KH_TRY(heads_view(a.q, &q, true));
  KH_TRY(heads_view(a.out, &o, true));
  if (a.q.t->ndim != 4)
    return fail(KH_ERR_INVALID_ARGUMENT,
                "%s: q must be [batch, q_tokens, q_heads, head_dim] (q_tokens = 1 for plain "
                "decode)",
                op);
  KH_TRY(same_shape(a.out, o, q, "q"));
  PagedKvArgs c;
  KH_TRY(paged_kv_args(a.k_cache, a.v_cache, a.block_table, a.seq_lens, q.batch, q.device, &c));
  const HeadsView& kc = c.k.rows;
  KH_TRY(same_kind(a.k_cache, kc, q, "q"));
  KH_TRY(heads_ratio(op, q.heads, kc.heads));
  KH_TRY(window_arg(op, a.window_left));
  KH_TRY(scale_arg(op, a.scale));
  kh_append_params ap{};
  if (a.k_new) {
    KH_TRY(append_args(*a.k_new, *a.v_new, c, &ap));
    if (ap.batch != q.batch)
      return fail(KH_ERR_INVALID_ARGUMENT, "%s: k_new has %d sequences, q %lld", op, ap.batch,
                  static_cast<long long>(q.batch));
  }

  kh_decode_params p{};
  p.kv = c.kv;
  p.q = q.data;
  p.o = o.data;
  p.q_row = q.token_stride;
  p.q_head = q.head_stride;
  p.o_row = o.token_stride;
  p.o_head = o.head_stride;
  p.batch = static_cast<int>(q.batch);
  p.q_tokens = static_cast<int>(q.seqlen);
  p.q_heads = static_cast<int>(q.heads);
  p.kv_heads = static_cast<int>(kc.heads);
  p.window_left = static_cast<int>(a.window_left);
  p.scale_log2 = static_cast<float>(a.scale * 1.4426950408889634);
  p.splits = 1;
  // The longest context the table can address: the split plan depends on shapes and the device
  // only, so a captured CUDA graph replays correctly for any seq_lens.
  const int64_t max_ctx = static_cast<int64_t>(p.kv.table_stride) * p.kv.page_size;
  p.split_tokens = static_cast<int>(max_ctx > 0x7FFFFFFF ? 0x7FFFFFFF : max_ctx);

  if (is_cpu(q.device)) {
    // Both ops' checks before the append writes: a refused decode leaves the cache as it was.
    if (q.tokens > 0) KH_TRY(cpu_pages_ok(op, p.kv, p.batch, c.k.pages, p.q_tokens));
    KH_TRY(run_append(op, ap, c.k, q.dtype, q.device, stream));  // then the cache holds all
    if (q.tokens > 0) attention_cpu::decode(q.dtype, static_cast<int>(q.head_dim), p);
    return KH_OK;
  }
  KH_TRY(cuda_layout_ok(a.q, q));
  KH_TRY(cuda_layout_ok(a.out, o));
  KH_TRY(cuda_layout_ok(a.k_cache, c.k.rows));
  KH_TRY(cuda_layout_ok(a.v_cache, c.v.rows));
  const int d = static_cast<int>(q.head_dim);
  // Tensor cores (decode_tc.cuh: 16 rows per CTA) for head_dim 64 and 128, which also fuse the
  // append; CUDA cores (4 or 8 rows per CTA) for head_dim 256, after the append's own kernel.
  const bool tc = d != 256;
  const int64_t page_span =
      static_cast<int64_t>(p.kv.page_size) * std::max<int64_t>(p.kv.k_row, p.kv.v_row);
  if (tc && page_span > kh_decode_tc_page_span_max())
    return fail(KH_ERR_UNSUPPORTED,
                "%s: a page of %d tokens spans %lld elements of k_cache/v_cache (token stride x "
                "page size); the cuda decode takes pages of at most 2^31 - 1 elements: keep each "
                "page's tokens together (a [pages, page_size, kv_heads, head_dim] cache)",
                op, p.kv.page_size, static_cast<long long>(page_span));
  // The append's own kernel, where the decode does not fuse it, goes right before the decode's
  // launch: after every check, so that a refusal writes nothing.
  const bool fused = a.k_new && tc && ap.nw.n > 0 && q.tokens > 0;
  if (fused) p.nw = ap.nw;
  if (q.tokens == 0) return a.k_new ? run_append(op, ap, c.k, q.dtype, q.device, stream) : KH_OK;
  const int rows = p.q_heads / p.kv_heads * p.q_tokens;
  const int r = tc ? 16 : kh_decode_rows(rows), groups = (rows + r - 1) / r;
  const int64_t ctas = static_cast<int64_t>(p.batch) * p.kv_heads * groups;
  int64_t max_splits = (max_ctx + kMinSplitTokens - 1) / kMinSplitTokens;
  if (max_splits > kMaxSplits) max_splits = kMaxSplits;
  const int64_t threads = 32 * (tc ? kh_decode_tc_warps() : kh_decode_warps());
  const GpuSlots gpu = gpu_slots(q.device.device_id);
  const int64_t per_sm = ctas_per_sm(gpu, tc ? kh_decode_tc_smem_bytes(d) : 0, threads,
                                     tc ? kh_decode_tc_ctas_per_sm(d) : 0);
  int64_t splits = decode_splits(gpu, ctas, per_sm, max_splits);
  const int64_t per_split = q.tokens * q.heads * (q.head_dim + 2);
  if (splits > 1) {
    if (!a.workspace.t) {
      splits = 1;  // no workspace: one pass over the context per CTA
    } else {
      int64_t n = 0;
      KH_TRY(workspace_arg(a.workspace, q, &p.partial, &n));
      if (n / per_split < splits) splits = n / per_split;
      if (splits < 1) splits = 1;
    }
  }
  p.splits = static_cast<int>(splits);
  // Whole 16-token chunks per split (decode_tc.cuh looks a chunk's page up once when the page
  // size is a multiple of 16 too).
  p.split_tokens = static_cast<int>(((max_ctx + splits - 1) / splits + 15) / 16 * 16);

  char name[48];
  if (tc)
    snprintf(name, sizeof name, "attn_decode_tc_%s_d%d", dtype_tag(q.dtype), d);
  else
    snprintf(name, sizeof name, "attn_decode_%s_d%d_r%d", dtype_tag(q.dtype), d, r);
  LaunchDims dims;
  dims.flags = kPdlEntry;
  if (tc) dims.shared_mem_bytes = static_cast<uint32_t>(kh_decode_tc_smem_bytes(d));
  dims.grid[0] = static_cast<uint32_t>(p.splits);
  dims.grid[1] = static_cast<uint32_t>(p.kv_heads * groups);
  dims.grid[2] = static_cast<uint32_t>(p.batch);
  dims.block[0] = static_cast<uint32_t>(threads);
  void* params[] = {&p};
  if (a.k_new && !fused) KH_TRY(run_append(op, ap, c.k, q.dtype, q.device, stream));
  KH_TRY(launch_kernel(q.device.device_id, name, dims, params, stream));
  if (p.splits == 1) return KH_OK;
  snprintf(name, sizeof name, "attn_decode_combine_%s_d%d", dtype_tag(q.dtype), d);
  LaunchDims combine;
  combine.flags = kPdlEntry;
  combine.grid[0] = static_cast<uint32_t>(q.tokens * q.heads);
  combine.block[0] = static_cast<uint32_t>(d);
  return launch_kernel(q.device.device_id, name, combine, params, stream);
}

constexpr OpSchema kDecode{
    "paged_attention_decode(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_table, Tensor "
    "seq_lens, int window_left, float scale, Tensor(a!) out, Tensor(b!)? workspace) -> ()"};

// The arguments both decode ops have, by name.
template <const OpSchema& S>
DecodeArgs decode_args(const Args<S>& a) {
  DecodeArgs d{a.tensor("q"),
               a.tensor("k_cache"),
               a.tensor("v_cache"),
               a.tensor("block_table"),
               a.tensor("seq_lens"),
               a.tensor("out"),
               a.optional_tensor("workspace")};
  d.window_left = a.integer("window_left");
  d.scale = a.real("scale");
  return d;
}

int32_t paged_attention_decode(const Args<kDecode>& a, void* stream) {
  return run_decode(kDecode.name(), decode_args(a), stream);
}

// ---- PagedAttentionWithKVAppend: the append and the decode in one launch ----

constexpr OpSchema kDecodeAppend{
    "paged_attention_decode_append(Tensor q, Tensor k_new, Tensor v_new, Tensor(a!) k_cache, "
    "Tensor(b!) v_cache, Tensor block_table, Tensor seq_lens, int window_left, float scale, "
    "Tensor(c!) out, Tensor(d!)? workspace) -> ()"};

int32_t paged_attention_decode_append(const Args<kDecodeAppend>& a, void* stream) {
  const TensorArg k_new = a.tensor("k_new"), v_new = a.tensor("v_new");
  DecodeArgs d = decode_args(a);
  d.k_new = &k_new;
  d.v_new = &v_new;
  return run_decode(kDecodeAppend.name(), d, stream);
}

// ---- PagedKVAppend ----

constexpr OpSchema kAppend{
    "paged_kv_append(Tensor k_new, Tensor v_new, Tensor block_table, Tensor seq_lens, Tensor(a!) "
    "k_cache, Tensor(b!) v_cache) -> ()"};

int32_t paged_kv_append(const Args<kAppend>& a, void* stream) {
  const char* op = kAppend.name();
  const TensorArg kn = a.tensor("k_new");
  HeadsView kv;
  KH_TRY(heads_view(kn, &kv, true));
  PagedKvArgs c;
  KH_TRY(paged_kv_args(a.tensor("k_cache"), a.tensor("v_cache"), a.tensor("block_table"),
                       a.tensor("seq_lens"), kv.batch, kv.device, &c));
  kh_append_params p;
  KH_TRY(append_args(kn, a.tensor("v_new"), c, &p));
  if (!is_cpu(kv.device)) {
    KH_TRY(cuda_layout_ok(a.tensor("k_cache"), c.k.rows));
    KH_TRY(cuda_layout_ok(a.tensor("v_cache"), c.v.rows));
  }
  return run_append(op, p, c.k, kv.dtype, kv.device, stream);
}

constexpr kh_op_v1_t kOps[] = {
    op<attention_forward>(),
    op<attention_backward>(KH_FLAG_GRAPH_SAFE),  // dQ sums with atomics: not deterministic
    op<paged_attention_decode>(KH_FLAG_GRAPH_SAFE | KH_FLAG_DETERMINISTIC | KH_FLAG_INFERENCE_ONLY),
    op<paged_kv_append>(KH_FLAG_GRAPH_SAFE | KH_FLAG_DETERMINISTIC | KH_FLAG_INFERENCE_ONLY),
    op<paged_attention_decode_append>(KH_FLAG_GRAPH_SAFE | KH_FLAG_DETERMINISTIC |
                                      KH_FLAG_INFERENCE_ONLY),
};

constexpr uint32_t kLayerFlagsNoBackward = KH_FLAG_GRAPH_SAFE | KH_FLAG_DETERMINISTIC;
constexpr kh_layer_v1_t kLayers[] = {
    layer("Attention", kForward, kForward, kBackward, KH_FLAG_HAS_BACKWARD | KH_FLAG_GRAPH_SAFE,
          kAttnDtypes),
    layer("PagedAttention", kDecode, kDecode, kLayerFlagsNoBackward, kAttnDtypes),
    layer("PagedKVAppend", kAppend, kAppend, kLayerFlagsNoBackward, kAttnDtypes),
    layer("PagedAttentionWithKVAppend", kDecodeAppend, kDecodeAppend, kLayerFlagsNoBackward,
          kAttnDtypes),
};

constexpr kh_module_v1_t kModule =
    make_module(kPackageName, kPackageVersion, "kernel-hub/attention " KH_BUILD_ID, kLayers, kOps);

}  // namespace
}  // namespace khk

KH_PACKAGE_ENTRY(khk::kModule)
