// FusedLinearCrossEntropy's ops (linear_ce.h): argument checks, the chunk loop, its GEMMs through
// host->gemm and its elementwise part on the cpu (cpu.cpp) or as softmax.cu's kernels.
#include "kernels/softmax/linear_ce.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>

#include "kernels/common/package_host.h"
#include "kernels/common/tensor_args.h"
#include "kernels/softmax/cpu.h"
#include "kernels/softmax/rows_launch.h"

namespace khk {

namespace {

uint32_t gemm_dtype(int dtype) {
  return dtype == kBF16 ? KH_DTYPE_BF16 : dtype == kFP16 ? KH_DTYPE_FP16 : KH_DTYPE_FP32;
}

// The GEMM service, or a message saying the loader is too old for it.
int32_t gemm_service(const char* op) {
  const kh_host_v1_t* h = host();
  if (!h || h->h.abi_minor < 2 || h->h.struct_size < KH_HOST_V1_2_SIZE || !h->gemm)
    return fail(KH_ERR_UNSUPPORTED,
                "%s: needs the loader's GEMM service (kernel-hub ABI 1.2); this loader offers "
                "ABI 1.%u: update kernel-hub",
                op, h ? h->h.abi_minor : 0u);
  return KH_OK;
}

// D (+)= op(A) @ op(B), row-major, alpha 1 (beta 1 with KH_GEMM_ACCUMULATE).
struct Gemm {
  int32_t device;
  void* stream;
  int32_t run(uint32_t flags, int64_t m, int64_t n, int64_t k, int dtype_ab, int dtype_d,
              const void* a, int64_t lda, const void* b, int64_t ldb, void* d, int64_t ldd) const {
    kh_gemm_t g = {};
    g.h = KH_HEADER_INIT(kh_gemm_t);
    g.device_id = device;
    g.flags = flags;
    g.m = m;
    g.n = n;
    g.k = k;
    g.dtype_ab = gemm_dtype(dtype_ab);
    g.dtype_d = gemm_dtype(dtype_d);
    g.a = a;
    g.lda = lda;
    g.b = b;
    g.ldb = ldb;
    g.d = d;
    g.ldd = ldd;
    g.alpha = 1.f;
    g.beta = (flags & KH_GEMM_ACCUMULATE) ? 1.f : 0.f;
    const kh_host_v1_t* h = host();
    return h->gemm(h->ctx, &g, stream);  // the loader sets the error
  }
};

// The workspace as bytes: a contiguous tensor on `device`, its start rounded up to 256 bytes.
int32_t workspace_arg(const TensorArg& a, DLDevice device, char** data, int64_t* bytes) {
  const DLTensor* t = a.t;
  if (t->dtype.lanes != 1 || t->dtype.bits % 8 != 0 || t->dtype.bits == 0)
    return fail(KH_ERR_INVALID_ARGUMENT, "%s: %s: a tensor of whole bytes (uint8) is expected",
                a.op, a.name);
  int64_t n = 1;
  for (int32_t d = t->ndim - 1; d >= 0; --d) {
    if (t->strides && t->shape[d] > 1 && t->strides[d] != n)
      return fail(KH_ERR_INVALID_ARGUMENT, "%s: %s must be contiguous", a.op, a.name);
    if (t->shape[d] < 0 || (t->shape[d] > 0 && n > INT64_MAX / 16 / t->shape[d]))
      return fail(KH_ERR_INVALID_ARGUMENT, "%s: %s has a bad shape", a.op, a.name);
    n *= t->shape[d];
  }
  KH_TRY(expect_device(a, t->device, device));
  char* p = static_cast<char*>(t->data) + t->byte_offset;
  const int64_t pad = static_cast<int64_t>((256 - reinterpret_cast<uintptr_t>(p) % 256) % 256);
  const int64_t total = n * (t->dtype.bits / 8);
  *data = p + pad;
  *bytes = total > pad ? total - pad : 0;
  return KH_OK;
}

struct Problem {
  RowsView hidden, weight, d_hidden, d_weight;
  const int64_t* labels = nullptr;
  int64_t ignore_index = 0;
  float* loss = nullptr;
  char* workspace = nullptr;
  LceLayout layout;
};

// hidden [N, H], weight [V, H], labels [N], workspace, loss []; the gradients when `train`.
template <const OpSchema& S>
int32_t read_problem(const Args<S>& a, Problem* p) {
  const char* op = a.op();
  KH_TRY(rows_view(a.tensor("hidden"), &p->hidden));
  KH_TRY(rows_view(a.tensor("weight"), &p->weight));
  const RowsView& h = p->hidden;
  const RowsView& w = p->weight;
  if (w.cols != h.cols)
    return fail(KH_ERR_INVALID_ARGUMENT,
                "%s: weight is [%lld, %lld] but hidden rows have %lld features: weight must be "
                "[vocab, hidden]",
                op, static_cast<long long>(w.rows), static_cast<long long>(w.cols),
                static_cast<long long>(h.cols));
  KH_TRY(expect_dtype(a.tensor("weight"), w.dtype, h.dtype, "hidden"));
  KH_TRY(expect_device(a.tensor("weight"), w.device, h.device));
  KH_TRY(index_vector_arg(a.tensor("labels"), h.rows, "row of hidden", h.device, &p->labels));
  p->ignore_index = a.integer("ignore_index");
  VectorView loss;
  KH_TRY(vector_view(a.tensor("loss"), 1, &loss));
  KH_TRY(expect_dtype(a.tensor("loss"), loss.dtype, kFP32, "the loss is a float32 scalar"));
  KH_TRY(expect_device(a.tensor("loss"), loss.device, h.device));
  p->loss = reinterpret_cast<float*>(loss.data);
  if constexpr (&S == &kLinearCeTrain) {
    KH_TRY(rows_view(a.tensor("d_hidden"), &p->d_hidden));
    KH_TRY(expect_shape(a.tensor("d_hidden"), p->d_hidden, h.rows, h.cols, "hidden"));
    KH_TRY(expect_device(a.tensor("d_hidden"), p->d_hidden.device, h.device));
    KH_TRY(rows_view(a.tensor("d_weight"), &p->d_weight));
    KH_TRY(expect_shape(a.tensor("d_weight"), p->d_weight, w.rows, w.cols, "weight"));
    KH_TRY(expect_device(a.tensor("d_weight"), p->d_weight.device, h.device));
    for (const RowsView* g : {&p->d_hidden, &p->d_weight})
      if (g->dtype != h.dtype && g->dtype != kFP32)
        return fail(KH_ERR_UNSUPPORTED, "%s: gradients are %s or float32, got %s", op,
                    dtype_name(h.dtype), dtype_name(g->dtype));
  }
  if (w.rows == 0 || h.cols == 0)
    return fail(KH_ERR_INVALID_ARGUMENT, "%s: weight is empty ([%lld, %lld])", op,
                static_cast<long long>(w.rows), static_cast<long long>(w.cols));
  if (w.rows > 0x7FFFFFFF)
    return fail(KH_ERR_UNSUPPORTED, "%s: vocab %lld above 2^31-1", op,
                static_cast<long long>(w.rows));
  int64_t bytes = 0;
  KH_TRY(workspace_arg(a.tensor("workspace"), h.device, &p->workspace, &bytes));
  p->layout = lce_layout(h.rows, w.rows, dtype_bytes(h.dtype), bytes);
  if (h.rows > 0 && p->layout.chunk < 1)
    return fail(
        KH_ERR_INVALID_ARGUMENT,
        "%s: workspace of %lld usable bytes is too small for %lld tokens and vocab %lld in "
        "%s: pass at least %lld bytes (one row of logits; 1024 rows or more for speed)",
        op, static_cast<long long>(bytes), static_cast<long long>(h.rows),
        static_cast<long long>(w.rows), dtype_name(h.dtype),
        static_cast<long long>(lce_min_workspace_bytes(h.rows, w.rows, dtype_bytes(h.dtype))));
  return KH_OK;
}

// x = 0 (zero) or x *= *factor (device pointer on cuda, host on cpu), over a rows view.
int32_t scale_view(const RowsView& x, const float* factor, bool zero, void* stream) {
  if (x.rows == 0 || x.cols == 0) return KH_OK;
  if (is_cpu(x.device)) {
    if (!zero && *factor == 1.f) return KH_OK;  // loss.backward(): nothing to scale
    softmax_cpu::scale_rows(x.dtype, x.data, x.stride, x.rows, x.cols, zero ? 0.f : *factor, zero);
    return KH_OK;
  }
  void* xp = x.data;
  long long sx = x.stride, rows = x.rows;
  int cols = static_cast<int>(x.cols);
  const float* g = zero ? nullptr : factor;
  void* params[] = {&xp, &sx, &rows, &cols, &g};
  char name[32];
  snprintf(name, sizeof name, "lce_scale_%s", dtype_tag(x.dtype));
  const long long total = rows * cols;
  LaunchDims dims;
  dims.block[0] = 256;
  const long long blocks = (total + 255) / 256;
  dims.grid[0] = static_cast<uint32_t>(blocks < 8192 ? blocks : 8192);
  return launch_kernel(x.device.device_id, name, dims, params, stream);
}

// One CTA of 1024 threads: lce_count / lce_loss.
int32_t launch_single_cta(int32_t device, const char* kernel, void** params, void* stream) {
  LaunchDims dims;
  dims.block[0] = 1024;
  return launch_kernel(device, kernel, dims, params, stream);
}

int32_t run(const char* op, Problem& p, bool train, void* stream) {
  KH_TRY(gemm_service(op));
  const RowsView& h = p.hidden;
  const RowsView& w = p.weight;
  const int64_t n = h.rows, v = w.rows, hd = h.cols;
  const bool cpu = is_cpu(h.device);
  const Gemm gemm{cpu ? -1 : h.device.device_id, cpu ? nullptr : stream};
  float* token_loss = reinterpret_cast<float*>(p.workspace + p.layout.token_loss);
  float* inv_count = reinterpret_cast<float*>(p.workspace);  // device scalar (cuda)
  char* logits = p.workspace + p.layout.logits;
  if (n == 0) {  // no tokens: loss 0, d_weight 0
    if (cpu)
      *p.loss = 0.f;
    else {  // inv_count = 0, then loss = 0 * (an empty sum)
      long long zero = 0, ign = p.ignore_index;
      const int64_t* labels = p.labels;
      float* out = p.loss;
      void* count_params[] = {&labels, &zero, &ign, &inv_count};
      KH_TRY(launch_single_cta(h.device.device_id, "lce_count", count_params, stream));
      void* loss_params[] = {&token_loss, &zero, &inv_count, &out};
      KH_TRY(launch_single_cta(h.device.device_id, "lce_loss", loss_params, stream));
    }
    return train ? scale_view(p.d_weight, nullptr, true, stream) : KH_OK;
  }
  // The gradient's 1 / (valid tokens) is folded into dlogits before they are stored, except in
  // fp16: (softmax - onehot) / valid falls below fp16's smallest subnormal (6e-8) for large
  // vocabularies and batches, so fp16 dlogits stay unscaled and the gradients are scaled at the
  // end (one more pass over d_hidden and d_weight).
  const bool late_scale = h.dtype == kFP16;
  float host_scale = 0.f;
  if (cpu) {
    int64_t valid = 0;
    for (int64_t i = 0; i < n; ++i) valid += p.labels[i] != p.ignore_index;
    host_scale = valid ? 1.f / static_cast<float>(valid) : 0.f;
  } else {
    long long nn = n, ign = p.ignore_index;
    const int64_t* labels = p.labels;
    void* params[] = {&labels, &nn, &ign, &inv_count};
    KH_TRY(launch_single_cta(h.device.device_id, "lce_count", params, stream));
  }
  const int64_t chunk = p.layout.chunk;
  for (int64_t r0 = 0; r0 < n; r0 += chunk) {
    const int64_t c = n - r0 < chunk ? n - r0 : chunk;
    const char* hidden_chunk = h.data + r0 * h.stride * dtype_bytes(h.dtype);
    // logits[c, V] = hidden_chunk[c, H] @ weight[V, H]^T
    KH_TRY(gemm.run(KH_GEMM_TRANS_B, c, v, hd, h.dtype, h.dtype, hidden_chunk, h.stride, w.data,
                    w.stride, logits, v));
    // Per-token loss; in train, logits become dlogits = (softmax - onehot) / valid tokens.
    RowsView lv;
    lv.data = logits;
    lv.rows = c;
    lv.cols = v;
    lv.stride = v;
    lv.dtype = h.dtype;
    lv.device = h.device;
    if (cpu) {
      softmax_cpu::ce_forward(h.dtype, logits, v, p.labels + r0, p.ignore_index, token_loss + r0,
                              train ? logits : nullptr, v, late_scale ? 1.f : host_scale, c, v);
    } else {
      const void* xp = logits;
      void* dxp = train ? logits : nullptr;
      const int64_t* tp = p.labels + r0;
      float* lp = token_loss + r0;
      long long sx = v, ign = p.ignore_index, rows = c;
      int cols = static_cast<int>(v);
      if (train) {
        const float* sp = late_scale ? inv_count + 1 : inv_count;  // lce_count wrote 1 there
        void* params[] = {&xp, &sx, &tp, &ign, &lp, &dxp, &sx, &sp, &rows, &cols};
        KH_TRY(launch_rows(op, "lce_grad", lv, {&lv}, params, stream));
      } else {
        float unused = 1.f;
        void* params[] = {&xp, &sx, &tp, &ign, &lp, &dxp, &sx, &unused, &rows, &cols};
        KH_TRY(launch_rows(op, "ce_fwd", lv, {&lv}, params, stream));
      }
    }
    if (!train) continue;
    // d_hidden[chunk] = dlogits[c, V] @ weight[V, H]
    char* dh = p.d_hidden.data + r0 * p.d_hidden.stride * dtype_bytes(p.d_hidden.dtype);
    KH_TRY(gemm.run(0, c, hd, v, h.dtype, p.d_hidden.dtype, logits, v, w.data, w.stride, dh,
                    p.d_hidden.stride));
    // d_weight (+)= dlogits^T[V, c] @ hidden_chunk[c, H]
    KH_TRY(gemm.run(KH_GEMM_TRANS_A | (r0 > 0 ? KH_GEMM_ACCUMULATE : 0u), v, hd, c, h.dtype,
                    p.d_weight.dtype, logits, v, hidden_chunk, h.stride, p.d_weight.data,
                    p.d_weight.stride));
  }
  if (train && late_scale) {
    const float* factor = cpu ? &host_scale : inv_count;
    KH_TRY(scale_view(p.d_hidden, factor, false, stream));
    KH_TRY(scale_view(p.d_weight, factor, false, stream));
  }
  if (cpu) {
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += token_loss[i];
    *p.loss = static_cast<float>(sum * host_scale);
    return KH_OK;
  }
  long long nn = n;
  float* out = p.loss;
  void* params[] = {&token_loss, &nn, &inv_count, &out};
  return launch_single_cta(h.device.device_id, "lce_loss", params, stream);
}

}  // namespace

int32_t linear_ce(const Args<kLinearCe>& a, void* stream) {
  Problem p;
  KH_TRY(read_problem(a, &p));
  return run(a.op(), p, false, stream);
}

int32_t linear_ce_train(const Args<kLinearCeTrain>& a, void* stream) {
  Problem p;
  KH_TRY(read_problem(a, &p));
  return run(a.op(), p, true, stream);
}

int32_t linear_ce_backward(const Args<kLinearCeBackward>& a, void* stream) {
  const char* op = a.op();
  RowsView dh, dw;
  KH_TRY(rows_view(a.tensor("d_hidden"), &dh));
  KH_TRY(rows_view(a.tensor("d_weight"), &dw));
  KH_TRY(expect_device(a.tensor("d_weight"), dw.device, dh.device));
  VectorView g;
  KH_TRY(vector_view(a.tensor("grad_loss"), 1, &g));
  KH_TRY(expect_dtype(a.tensor("grad_loss"), g.dtype, kFP32,
                      "the loss gradient is a float32 "
                      "scalar"));
  KH_TRY(expect_device(a.tensor("grad_loss"), g.device, dh.device));
  (void)op;
  const float* factor = reinterpret_cast<const float*>(g.data);
  KH_TRY(scale_view(dh, factor, false, stream));
  return scale_view(dw, factor, false, stream);
}

}  // namespace khk
