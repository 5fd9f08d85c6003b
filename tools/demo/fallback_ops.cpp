#include "tools/demo/fallback_ops.h"

#include <fmt/format.h>

#include <cmath>
#include <string>

#include "tools/demo/layers.h"

namespace kh::demo {

namespace {

// Thrown by argument checks, turned into a status and last_op_error() at the C boundary: a
// fallback is called through a C function pointer from noexcept code, so nothing may escape.
struct ArgError {
  int32_t status;
  std::string message;
};

// A contiguous fp32 host tensor viewed as rows x cols (cols = last dimension).
struct Rows {
  float* p = nullptr;
  int64_t rows = 0, cols = 0;
};

class Args {
 public:
  Args(const char* op, const char* schema, const kh_arg_t* a, int32_t n, int32_t expect)
      : op_(op), a_(a) {
    if (n != expect)
      fail(KH_ERR_INVALID_ARGUMENT, fmt::format("got {} arguments; expected {}", n, schema));
  }

  [[noreturn]] void fail(int32_t status, const std::string& why) const {
    throw ArgError{status, fmt::format("{} (runtime fallback): {}", op_, why)};
  }

  // The tensor at i: on the host, contiguous; nullptr only when optional.
  const DLTensor* tensor(int32_t i, const char* name, bool optional = false) const {
    if (a_[i].kind != KH_ARG_TENSOR)
      fail(KH_ERR_INVALID_ARGUMENT, fmt::format("argument {} ({}) is not a tensor", i, name));
    const DLTensor* t = a_[i].v.t;
    if (!t) {
      if (optional) return nullptr;
      fail(KH_ERR_INVALID_ARGUMENT, fmt::format("tensor {} is NULL", name));
    }
    if (t->device.device_type != kDLCPU)
      fail(KH_ERR_UNSUPPORTED,
           fmt::format("tensor {} is not in host memory; the fallback runs on the cpu only", name));
    if (t->strides) {
      int64_t expect = 1;
      for (int d = t->ndim - 1; d >= 0; --d) {
        if (t->shape[d] > 1 && t->strides[d] != expect)
          fail(KH_ERR_UNSUPPORTED, fmt::format("tensor {} is not contiguous", name));
        expect *= t->shape[d];
      }
    }
    return t;
  }

  Rows rows(int32_t i, const char* name) const {
    const DLTensor* t = tensor(i, name);
    if (t->dtype.code != kDLFloat || t->dtype.bits != 32 || t->dtype.lanes != 1)
      fail(KH_ERR_UNSUPPORTED, fmt::format("tensor {} is not float32", name));
    if (t->ndim < 1) fail(KH_ERR_INVALID_ARGUMENT, fmt::format("tensor {} is a scalar", name));
    Rows r;
    r.p = reinterpret_cast<float*>(static_cast<char*>(t->data) + t->byte_offset);
    r.cols = t->shape[t->ndim - 1];
    r.rows = 1;
    for (int d = 0; d + 1 < t->ndim; ++d) r.rows *= t->shape[d];
    return r;
  }

  Rows rows_like(int32_t i, const char* name, int64_t rows_, int64_t cols) const {
    Rows r = rows(i, name);
    if (r.rows != rows_ || r.cols != cols)
      fail(KH_ERR_INVALID_ARGUMENT, fmt::format("tensor {} is {} x {}; expected {} x {}", name,
                                                r.rows, r.cols, rows_, cols));
    return r;
  }

  float* vector(int32_t i, const char* name, int64_t n) const {
    Rows r = rows(i, name);
    if (r.rows * r.cols != n)
      fail(KH_ERR_INVALID_ARGUMENT,
           fmt::format("tensor {} has {} elements; expected {}", name, r.rows * r.cols, n));
    return r.p;
  }

  const int64_t* indices(int32_t i, const char* name, int64_t n) const {
    const DLTensor* t = tensor(i, name);
    if (t->dtype.code != kDLInt || t->dtype.bits != 64 || t->ndim != 1 || t->shape[0] != n)
      fail(KH_ERR_INVALID_ARGUMENT, fmt::format("tensor {} must be int64 [{}]", name, n));
    return reinterpret_cast<const int64_t*>(static_cast<const char*>(t->data) + t->byte_offset);
  }

  int64_t integer(int32_t i, const char* name) const {
    if (a_[i].kind != KH_ARG_INT)
      fail(KH_ERR_INVALID_ARGUMENT, fmt::format("argument {} ({}) is not an int", i, name));
    return a_[i].v.i;
  }
  double real(int32_t i, const char* name) const {
    if (a_[i].kind != KH_ARG_FLOAT)
      fail(KH_ERR_INVALID_ARGUMENT, fmt::format("argument {} ({}) is not a float", i, name));
    return a_[i].v.f;
  }

 private:
  const char* op_;
  const kh_arg_t* a_;
};

template <typename F>
int32_t guarded(F&& body) noexcept {
  try {
    body();
    return KH_OK;
  } catch (const ArgError& e) {
    set_last_op_error(e.message);
    return e.status;
  } catch (const std::exception& e) {
    set_last_op_error(std::string("runtime fallback: ") + e.what());
    return KH_ERR_INTERNAL;
  }
}

// ---- RMSNorm: y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps) -----------------------------

int32_t rms_norm_impl(const kh_arg_t* a, int32_t n, bool train) {
  return guarded([&] {
    Args g(train ? "rms_norm_train" : "rms_norm",
           train ? "rms_norm_train(Tensor x, Tensor weight, float eps, Tensor(a!) y, Tensor(b!) "
                   "rstd)"
                 : "rms_norm(Tensor x, Tensor weight, float eps, Tensor(a!) y)",
           a, n, train ? 5 : 4);
    Rows x = g.rows(0, "x");
    const float* w = g.vector(1, "weight", x.cols);
    const float eps = static_cast<float>(g.real(2, "eps"));
    Rows y = g.rows_like(3, "y", x.rows, x.cols);
    float* rstd = train ? g.vector(4, "rstd", x.rows) : nullptr;
    for (int64_t r = 0; r < x.rows; ++r) {
      const float* xr = x.p + r * x.cols;
      float ss = 0.f;
      for (int64_t c = 0; c < x.cols; ++c) ss += xr[c] * xr[c];
      const float rs = 1.0f / std::sqrt(ss / static_cast<float>(x.cols) + eps);
      if (rstd) rstd[r] = rs;
      float* yr = y.p + r * x.cols;
      for (int64_t c = 0; c < x.cols; ++c) yr[c] = xr[c] * rs * w[c];
    }
  });
}

int32_t rms_norm(const kh_arg_t* a, int32_t n, void*) {
  return rms_norm_impl(a, n, false);
}
int32_t rms_norm_train(const kh_arg_t* a, int32_t n, void*) {
  return rms_norm_impl(a, n, true);
}

// dx = rstd * (g - xhat * mean(g * xhat)), g = dy * w; dweight = sum over rows of dy * xhat
// (overwritten, as the package does). The workspace (the package's per-walker partials) is
// accepted for schema compatibility and not needed here.
int32_t rms_norm_backward(const kh_arg_t* a, int32_t n, void*) {
  return guarded([&] {
    Args g("rms_norm_backward",
           "rms_norm_backward(Tensor dy, Tensor x, Tensor weight, Tensor rstd, Tensor(a!) dx, "
           "Tensor(b!) dweight, Tensor(c!) workspace)",
           a, n, 7);
    Rows x = g.rows(1, "x");
    Rows dy = g.rows_like(0, "dy", x.rows, x.cols);
    const float* w = g.vector(2, "weight", x.cols);
    const float* rstd = g.vector(3, "rstd", x.rows);
    Rows dx = g.rows_like(4, "dx", x.rows, x.cols);
    float* dw = g.vector(5, "dweight", x.cols);
    g.tensor(6, "workspace");
    for (int64_t c = 0; c < x.cols; ++c) dw[c] = 0.f;
    const float inv_n = 1.0f / static_cast<float>(x.cols);
    for (int64_t r = 0; r < x.rows; ++r) {
      const float* xr = x.p + r * x.cols;
      const float* dyr = dy.p + r * x.cols;
      float* dxr = dx.p + r * x.cols;
      const float rs = rstd[r];
      float sum_gx = 0.f;
      for (int64_t c = 0; c < x.cols; ++c) sum_gx += dyr[c] * w[c] * (xr[c] * rs);
      const float c1 = sum_gx * inv_n;
      for (int64_t c = 0; c < x.cols; ++c) {
        const float xhat = xr[c] * rs;
        dxr[c] = rs * (dyr[c] * w[c] - xhat * c1);
        dw[c] += dyr[c] * xhat;
      }
    }
  });
}

// ---- RotaryEmbedding (NeoX: pairs (j, j + half); GPT-J: (2j, 2j + 1)), in place -------------

void rotate_heads(float* base, int64_t heads, int64_t head_dim, const float* c, const float* s,
                  int64_t half, bool neox, float sign) {
  for (int64_t h = 0; h < heads; ++h) {
    float* v = base + h * head_dim;
    for (int64_t j = 0; j < half; ++j) {
      const int64_t i1 = neox ? j : 2 * j, i2 = neox ? j + half : 2 * j + 1;
      const float x1 = v[i1], x2 = v[i2], sn = sign * s[j];
      v[i1] = x1 * c[j] - x2 * sn;
      v[i2] = x2 * c[j] + x1 * sn;
    }
  }
}

int32_t rotary_impl(const char* op, const kh_arg_t* a, int32_t n, float sign) {
  return guarded([&] {
    Args g(op,
           "(Tensor positions, Tensor(a!) query, Tensor(b!)? key, Tensor cos, Tensor sin, int "
           "is_neox)",
           a, n, 6);
    const DLTensor* q = g.tensor(1, "query");
    const DLTensor* k = g.tensor(2, "key", /*optional=*/true);
    if (q->ndim != 3 || (k && (k->ndim != 3 || k->shape[0] != q->shape[0])))
      g.fail(KH_ERR_INVALID_ARGUMENT, "query and key must be [tokens, heads, head_dim]");
    Rows qr = g.rows(1, "query");
    Rows kr = k ? g.rows(2, "key") : Rows{};
    const int64_t tokens = q->shape[0];
    const int64_t* pos = g.indices(0, "positions", tokens);
    Rows cs = g.rows(3, "cos");
    Rows sn = g.rows_like(4, "sin", cs.rows, cs.cols);
    const bool neox = g.integer(5, "is_neox") != 0;
    const int64_t half = cs.cols;
    if (2 * half > q->shape[2] || (k && 2 * half > k->shape[2]))
      g.fail(KH_ERR_INVALID_ARGUMENT, "rot_dim (2 * cos columns) exceeds head_dim");
    for (int64_t t = 0; t < tokens; ++t) {
      if (pos[t] < 0 || pos[t] >= cs.rows) continue;  // as the package: left unchanged
      const float* c = cs.p + pos[t] * half;
      const float* s = sn.p + pos[t] * half;
      rotate_heads(qr.p + t * q->shape[1] * q->shape[2], q->shape[1], q->shape[2], c, s, half, neox,
                   sign);
      if (k)
        rotate_heads(kr.p + t * k->shape[1] * k->shape[2], k->shape[1], k->shape[2], c, s, half,
                     neox, sign);
    }
  });
}

int32_t rotary_embedding(const kh_arg_t* a, int32_t n, void*) {
  return rotary_impl("rotary_embedding", a, n, 1.0f);
}
// The inverse rotation (sin negated) maps output gradients to input gradients.
int32_t rotary_embedding_backward(const kh_arg_t* a, int32_t n, void*) {
  return rotary_impl("rotary_embedding_backward", a, n, -1.0f);
}

// ---- SiluAndMul: y = silu(gate) * up, x = [gate | up] ----------------------------------------

float silu(float g) {
  return g / (1.0f + std::exp(-g));
}
float dsilu(float g) {
  const float s = 1.0f / (1.0f + std::exp(-g));
  return s * (1.0f + g * (1.0f - s));
}

int32_t silu_and_mul(const kh_arg_t* a, int32_t n, void*) {
  return guarded([&] {
    Args g("silu_and_mul", "silu_and_mul(Tensor x, Tensor(a!) y)", a, n, 2);
    Rows x = g.rows(0, "x");
    if (x.cols % 2) g.fail(KH_ERR_INVALID_ARGUMENT, "x needs an even number of columns");
    const int64_t d = x.cols / 2;
    Rows y = g.rows_like(1, "y", x.rows, d);
    for (int64_t r = 0; r < x.rows; ++r) {
      const float* xr = x.p + r * x.cols;
      float* yr = y.p + r * d;
      for (int64_t c = 0; c < d; ++c) yr[c] = silu(xr[c]) * xr[d + c];
    }
  });
}

int32_t silu_and_mul_backward(const kh_arg_t* a, int32_t n, void*) {
  return guarded([&] {
    Args g("silu_and_mul_backward", "silu_and_mul_backward(Tensor dy, Tensor x, Tensor(a!) dx)", a,
           n, 3);
    Rows x = g.rows(1, "x");
    if (x.cols % 2) g.fail(KH_ERR_INVALID_ARGUMENT, "x needs an even number of columns");
    const int64_t d = x.cols / 2;
    Rows dy = g.rows_like(0, "dy", x.rows, d);
    Rows dx = g.rows_like(2, "dx", x.rows, x.cols);
    for (int64_t r = 0; r < x.rows; ++r) {
      const float* xr = x.p + r * x.cols;
      const float* dyr = dy.p + r * d;
      float* dxr = dx.p + r * x.cols;
      for (int64_t c = 0; c < d; ++c) {
        const float gate = xr[c], up = xr[d + c];
        dxr[c] = dyr[c] * up * dsilu(gate);
        dxr[d + c] = dyr[c] * silu(gate);
      }
    }
  });
}

// ---- CrossEntropy: loss = logsumexp(logits) - logits[target]; dlogits = (p - onehot) * scale --

int32_t ce_impl(const char* op, const kh_arg_t* a, int32_t n, bool train) {
  return guarded([&] {
    Args g(op,
           train ? "cross_entropy_train(Tensor logits, Tensor targets, int ignore_index, float "
                   "grad_scale, Tensor(a!) loss, Tensor(b!) dlogits)"
                 : "cross_entropy(Tensor logits, Tensor targets, int ignore_index, Tensor(a!) "
                   "loss)",
           a, n, train ? 6 : 4);
    Rows x = g.rows(0, "logits");
    const int64_t* targets = g.indices(1, "targets", x.rows);
    const int64_t ignore = g.integer(2, "ignore_index");
    const float scale = train ? static_cast<float>(g.real(3, "grad_scale")) : 1.0f;
    float* loss = g.vector(train ? 4 : 3, "loss", x.rows);
    Rows dx = train ? g.rows_like(5, "dlogits", x.rows, x.cols) : Rows{};
    if (x.rows > 0 && x.cols == 0) g.fail(KH_ERR_INVALID_ARGUMENT, "logits have 0 classes");
    for (int64_t r = 0; r < x.rows; ++r) {
      const float* xr = x.p + r * x.cols;
      float* dxr = train ? dx.p + r * x.cols : nullptr;
      const int64_t t = targets[r];
      if (t == ignore) {
        loss[r] = 0.f;
        if (dxr)
          for (int64_t c = 0; c < x.cols; ++c) dxr[c] = 0.f;
        continue;
      }
      float m = xr[0];
      for (int64_t c = 1; c < x.cols; ++c) m = std::fmax(m, xr[c]);
      float s = 0.f;
      for (int64_t c = 0; c < x.cols; ++c) s += std::exp(xr[c] - m);
      const bool in_range = t >= 0 && t < x.cols;
      loss[r] = in_range ? (m + std::log(s)) - xr[t] : std::nanf("");
      if (!dxr) continue;
      const float inv = 1.f / s;
      for (int64_t c = 0; c < x.cols; ++c)
        dxr[c] = (std::exp(xr[c] - m) * inv - (c == t ? 1.f : 0.f)) * scale;
    }
  });
}

int32_t cross_entropy(const kh_arg_t* a, int32_t n, void*) {
  return ce_impl("cross_entropy", a, n, false);
}
int32_t cross_entropy_train(const kh_arg_t* a, int32_t n, void*) {
  return ce_impl("cross_entropy_train", a, n, true);
}

int32_t cross_entropy_backward(const kh_arg_t* a, int32_t n, void*) {
  return guarded([&] {
    Args g("cross_entropy_backward", "cross_entropy_backward(Tensor dloss, Tensor(a!) dlogits)", a,
           n, 2);
    Rows dx = g.rows(1, "dlogits");
    const float* dloss = g.vector(0, "dloss", dx.rows);
    for (int64_t r = 0; r < dx.rows; ++r)
      for (int64_t c = 0; c < dx.cols; ++c) dx.p[r * dx.cols + c] *= dloss[r];
  });
}

// ---- Attention: the runtime's own causal attention (layers.h), padded batches only -----------

// A [batch, len, heads, head_dim] fp32 tensor shaped exactly as `like` (q for q, out, dout and dq;
// k for v, dk and dv).
float* heads_tensor(const Args& g, int32_t i, const char* name, const DLTensor* like) {
  Rows r = g.rows(i, name);
  const DLTensor* t = g.tensor(i, name);
  if (t->ndim != 4)
    g.fail(KH_ERR_UNSUPPORTED,
           fmt::format("tensor {} is {}-D; the fallback takes padded [batch, len, heads, "
                       "head_dim] tensors only (bind kernel-hub/attention for packed ones)",
                       name, t->ndim));
  for (int d = 0; d < 4; ++d)
    if (t->shape[d] != like->shape[d])
      g.fail(KH_ERR_INVALID_ARGUMENT,
             fmt::format("tensor {} is [{}, {}, {}, {}]; expected [{}, {}, {}, {}]", name,
                         t->shape[0], t->shape[1], t->shape[2], t->shape[3], like->shape[0],
                         like->shape[1], like->shape[2], like->shape[3]));
  return r.p;
}

// k: [batch, len, kv_heads, head_dim] with q's batch, length and head_dim and kv_heads dividing
// q's heads (grouped-query attention). Keys of another length are valid for the package (decode
// against a longer context) but not implemented here.
const DLTensor* kv_tensor(const Args& g, int32_t i, const char* name, const DLTensor* q) {
  heads_tensor(g, i, name, g.tensor(i, name));  // 4-D, fp32, contiguous
  const DLTensor* t = g.tensor(i, name);
  if (t->shape[0] != q->shape[0] || t->shape[1] != q->shape[1] || t->shape[3] != q->shape[3])
    g.fail(KH_ERR_UNSUPPORTED,
           fmt::format("tensor {} is [{}, {}, {}, {}] for q [{}, {}, {}, {}]; the fallback needs "
                       "q's batch, length and head_dim (no key lengths other than q's)",
                       name, t->shape[0], t->shape[1], t->shape[2], t->shape[3], q->shape[0],
                       q->shape[1], q->shape[2], q->shape[3]));
  if (t->shape[2] < 1 || q->shape[2] % t->shape[2] != 0)
    g.fail(KH_ERR_INVALID_ARGUMENT,
           fmt::format("{} query heads are not a multiple of {}'s {} key/value heads (GQA)",
                       q->shape[2], name, t->shape[2]));
  return t;
}

// The arguments forward and backward share, from index `first` (cu_seqlens_q): what the fallback
// does not implement is refused, not ignored.
struct AttentionOptions {
  AttentionShape shape;
  float scale = 0;
};

AttentionOptions attention_options(const Args& g, const DLTensor* q, const DLTensor* k,
                                   int32_t first, bool has_max_k) {
  if (g.tensor(first, "cu_seqlens_q", true) || g.tensor(first + 1, "cu_seqlens_k", true))
    g.fail(KH_ERR_UNSUPPORTED,
           "packed sequences (cu_seqlens) are not supported by the fallback; pass padded "
           "[batch, len, heads, head_dim] tensors or bind kernel-hub/attention");
  g.integer(first + 2, "max_seqlen_q");  // padded: the lengths are q's and k's shapes
  const int32_t c = first + (has_max_k ? 4 : 3);
  if (has_max_k) g.integer(first + 3, "max_seqlen_k");
  if (g.integer(c, "causal") != 1)
    g.fail(KH_ERR_UNSUPPORTED, "causal must be 1; the fallback is causal attention only");
  if (g.integer(c + 1, "window_left") != -1)
    g.fail(KH_ERR_UNSUPPORTED, "window_left must be -1; the fallback has no sliding window");
  const double scale = g.real(c + 2, "scale");
  if (!(scale > 0.0) || !std::isfinite(scale))
    g.fail(KH_ERR_INVALID_ARGUMENT,
           fmt::format("scale {}; expected a positive softmax scale (1 / sqrt(head_dim))", scale));
  AttentionShape shape{q->shape[0], q->shape[1], q->shape[2], q->shape[3]};
  shape.kv_heads = k->shape[2];
  return {shape, static_cast<float>(scale)};
}

// forward (eval) and forward_train (with lse) are one op, as in the package.
int32_t attention_fwd(const kh_arg_t* a, int32_t n, void*) {
  return guarded([&] {
    Args g("attention_forward",
           "attention_forward(Tensor q, Tensor k, Tensor v, Tensor? cu_seqlens_q, Tensor? "
           "cu_seqlens_k, int max_seqlen_q, int causal, int window_left, float scale, "
           "Tensor(a!) out, Tensor(b!)? lse)",
           a, n, 11);
    const DLTensor* qt = g.tensor(0, "q");
    const float* q = heads_tensor(g, 0, "q", qt);
    const DLTensor* kt = kv_tensor(g, 1, "k", qt);
    const float* k = heads_tensor(g, 1, "k", kt);
    const float* v = heads_tensor(g, 2, "v", kt);
    const AttentionOptions o = attention_options(g, qt, kt, 3, false);
    float* out = heads_tensor(g, 9, "out", qt);
    const int64_t tokens = o.shape.batch * o.shape.len;
    float* lse = g.tensor(10, "lse", true) ? g.vector(10, "lse", o.shape.heads * tokens) : nullptr;
    attention_forward(o.shape, o.scale, q, k, v, out, lse);
  });
}

int32_t attention_bwd(const kh_arg_t* a, int32_t n, void*) {
  return guarded([&] {
    Args g("attention_backward",
           "attention_backward(Tensor dout, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
           "Tensor? cu_seqlens_q, Tensor? cu_seqlens_k, int max_seqlen_q, int max_seqlen_k, int "
           "causal, int window_left, float scale, Tensor(a!) dq, Tensor(b!) dk, Tensor(c!) dv, "
           "Tensor(d!)? workspace)",
           a, n, 17);
    const DLTensor* qt = g.tensor(1, "q");
    const float* q = heads_tensor(g, 1, "q", qt);
    const float* dout = heads_tensor(g, 0, "dout", qt);
    const DLTensor* kt = kv_tensor(g, 2, "k", qt);
    const float* k = heads_tensor(g, 2, "k", kt);
    const float* v = heads_tensor(g, 3, "v", kt);
    const float* out = heads_tensor(g, 4, "out", qt);
    const AttentionOptions o = attention_options(g, qt, kt, 6, true);
    const float* lse = g.vector(5, "lse", o.shape.heads * o.shape.batch * o.shape.len);
    float* dq = heads_tensor(g, 13, "dq", qt);
    float* dk = heads_tensor(g, 14, "dk", kt);
    float* dv = heads_tensor(g, 15, "dv", kt);
    g.tensor(16, "workspace", true);  // the package's cuda scratch; not needed here
    attention_backward(o.shape, o.scale, q, k, v, out, lse, dout, dq, dk, dv);
  });
}

}  // namespace

namespace {

// FusedLinearCrossEntropy has no host fallback: the device model runs its own chunked LM head
// and cross-entropy (device_model.cpp) when no package serves the slot, and never calls this.
int32_t linear_cross_entropy_unserved(const kh_arg_t*, int32_t, void*) {
  set_last_op_error(
      "FusedLinearCrossEntropy: the runtime has no fallback op of its own for this slot (the "
      "device model computes its chunked loss itself when no package serves it)");
  return KH_ERR_UNSUPPORTED;
}

// FusedAddRMSNorm likewise: without a package the device model adds, then runs the RMSNorm slot.
int32_t fused_add_rms_norm_unserved(const kh_arg_t*, int32_t, void*) {
  set_last_op_error(
      "FusedAddRMSNorm: the runtime has no fallback op of its own for this slot (the device "
      "model adds the residual and runs the RMSNorm slot when no package serves it)");
  return KH_ERR_UNSUPPORTED;
}

// QKNormRotaryEmbedding likewise: without a package the device model runs the RMSNorm slot on q
// and k, then the RotaryEmbedding slot.
int32_t qk_norm_rotary_unserved(const kh_arg_t*, int32_t, void*) {
  set_last_op_error(
      "QKNormRotaryEmbedding: the runtime has no fallback op of its own for this slot (the "
      "device model runs the RMSNorm slot on q and k, then RotaryEmbedding, when no package "
      "serves it)");
  return KH_ERR_UNSUPPORTED;
}

// SiluAndMulRecompute likewise: without a package the device model runs the SiluAndMul slot's
// forward again, then its backward.
int32_t silu_and_mul_recompute_unserved(const kh_arg_t*, int32_t, void*) {
  set_last_op_error(
      "SiluAndMulRecompute: the runtime has no fallback op of its own for this slot (the device "
      "model runs the SiluAndMul slot's forward, then its backward, when no package serves it)");
  return KH_ERR_UNSUPPORTED;
}

// The FromOutput slots: without a package the device model keeps the forward's inputs too and
// runs the backwards from them.
int32_t from_output_unserved(const kh_arg_t*, int32_t, void*) {
  set_last_op_error(
      "FusedAddRMSNormFromOutput / QKNormRotaryEmbeddingFromOutput: the runtime has no fallback "
      "op of its own for these slots (the device model keeps the forward's inputs and runs the "
      "backwards from them when no package serves them)");
  return KH_ERR_UNSUPPORTED;
}

}  // namespace

DemoSlots add_demo_slots(Runtime& rt) {
  // Every fallback has a backward, so the runtime trains with no package at all.
  const uint32_t f = KH_FLAG_HAS_BACKWARD | KH_FLAG_DETERMINISTIC;
  DemoSlots s;
  s.rms_norm = rt.add_slot(kRMSNorm, {rms_norm, rms_norm_train, rms_norm_backward, f});
  s.rotary = rt.add_slot(kRotaryEmbedding,
                         {rotary_embedding, rotary_embedding, rotary_embedding_backward, f});
  s.silu_and_mul = rt.add_slot(kSiluAndMul, {silu_and_mul, silu_and_mul, silu_and_mul_backward, f});
  s.cross_entropy =
      rt.add_slot(kCrossEntropy, {cross_entropy, cross_entropy_train, cross_entropy_backward, f});
  s.attention = rt.add_slot(kAttention, {attention_fwd, attention_fwd, attention_bwd, f});
  return s;
}

DemoSlots add_device_demo_slots(Runtime& rt) {
  DemoSlots s = add_demo_slots(rt);
  s.linear_cross_entropy = rt.add_slot(
      kFusedLinearCrossEntropy, {linear_cross_entropy_unserved, linear_cross_entropy_unserved,
                                 linear_cross_entropy_unserved, KH_FLAG_HAS_BACKWARD});
  s.fused_add_rms_norm =
      rt.add_slot(kFusedAddRMSNorm, {fused_add_rms_norm_unserved, fused_add_rms_norm_unserved,
                                     fused_add_rms_norm_unserved, KH_FLAG_HAS_BACKWARD});
  s.qk_norm_rotary =
      rt.add_slot(kQKNormRotaryEmbedding, {qk_norm_rotary_unserved, qk_norm_rotary_unserved,
                                           qk_norm_rotary_unserved, KH_FLAG_HAS_BACKWARD});
  s.silu_and_mul_recompute = rt.add_slot(
      kSiluAndMulRecompute, {silu_and_mul_recompute_unserved, silu_and_mul_recompute_unserved,
                             silu_and_mul_recompute_unserved, KH_FLAG_HAS_BACKWARD});
  const SlotOps unserved{from_output_unserved, from_output_unserved, from_output_unserved,
                         KH_FLAG_HAS_BACKWARD};
  s.fused_add_rms_norm_from_output = rt.add_slot(kFusedAddRMSNormFromOutput, unserved);
  s.qk_norm_rotary_from_output = rt.add_slot(kQKNormRotaryEmbeddingFromOutput, unserved);
  return s;
}

}  // namespace kh::demo
