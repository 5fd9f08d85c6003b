#include "tools/demo/device_kernels.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

#include "kernel_hub/kernel_hub.hpp"

namespace kh::demo {

namespace {

constexpr uint32_t kThreads = 256;  // every kernel's block (device_kernels.cu's reductions)

// The kernel parameter of kh_attention_*: the layout of device_kernels.cu's AttnShape.
struct AttnShape {
  long long len;
  int heads, kv_heads, head_dim;
};
static_assert(sizeof(AttnShape) == 24);

const char* const kTyped[] = {"kh_embedding_fwd",   "kh_embedding_bwd",    "kh_add",
                              "kh_bias_add",        "kh_copy_columns",     "kh_scale_columns",
                              "kh_column_sum_add",  "kh_rms_norm",         "kh_rms_norm_bwd_dx",
                              "kh_rms_norm_bwd_dw", "kh_silu_and_mul",     "kh_silu_and_mul_bwd",
                              "kh_rotary",          "kh_attention_fwd",    "kh_attention_bwd",
                              "kh_cross_entropy",   "kh_cross_entropy_bwd"};

[[noreturn]] void fail(const char* op, const std::string& why) {
  throw Error(ErrorKind::kInvalidInput, fmt::format("{} (device kernel): {}", op, why));
}

void expect(bool ok, const char* op, const std::string& why) {
  if (!ok) fail(op, why);
}

// Activations: float32 or bfloat16.
void expect_float(const char* op, const char* name, const DeviceTensor& t) {
  expect(same_dtype(t.dtype(), kF32) || same_dtype(t.dtype(), kBF16), op,
         fmt::format("{} is {}; float32 or bfloat16 expected", name, t.describe()));
}
void expect_dtype(const char* op, const char* name, const DeviceTensor& t, DLDataType dtype) {
  expect(same_dtype(t.dtype(), dtype), op,
         fmt::format("{} is {}; {} expected", name, t.describe(), dtype_name(dtype)));
}
void expect_shape(const char* op, const char* name, const DeviceTensor& t,
                  const std::vector<int64_t>& shape) {
  expect(t.shape() == shape, op,
         fmt::format("{} is {}; shape [{}] expected", name, t.describe(), fmt::join(shape, ", ")));
}
void expect_same(const char* op, const char* name, const DeviceTensor& t, const DeviceTensor& like,
                 const char* like_name) {
  expect(
      t.shape() == like.shape() && same_dtype(t.dtype(), like.dtype()), op,
      fmt::format("{} is {}; {} {} expected (as {})", name, t.describe(), dtype_name(like.dtype()),
                  fmt::format("[{}]", fmt::join(like.shape(), ", ")), like_name));
}
// rows x cols of a tensor seen as a matrix over its last dimension.
int64_t rows_of(const DeviceTensor& t) {
  return t.ndim() ? t.numel() / std::max<int64_t>(1, t.dim(t.ndim() - 1)) : 1;
}
int64_t cols_of(const DeviceTensor& t) {
  return t.ndim() ? t.dim(t.ndim() - 1) : 1;
}
uint32_t blocks_for(int64_t n) {
  return static_cast<uint32_t>(
      std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, int64_t{1} << 20));
}

}  // namespace

std::vector<std::string> device_kernel_names() {
  std::vector<std::string> names;
  for (const char* base : kTyped) {
    names.push_back(std::string(base) + "_f32");
    names.push_back(std::string(base) + "_bf16");
  }
  names.insert(names.end(),
               {"kh_cast_bf16_to_f32", "kh_cast_f32_to_bf16", "kh_grad_add_multi", "kh_adamw_f32",
                "kh_adamw_multi_f32", "kh_init_normal_f32", "kh_fill_f32", "kh_read_u32x4"});
  return names;
}

DeviceKernels::DeviceKernels(int device)
    : module_(device, "demo_device_kernels", device_kernels_source()) {
  for (const std::string& name : device_kernel_names()) functions_[name] = module_.function(name);
}

kh_device_function_t* DeviceKernels::fn(const std::string& name) const {
  return functions_.at(name);
}

kh_device_function_t* DeviceKernels::typed(const std::string& base, const DeviceTensor& t) const {
  return fn(base + (same_dtype(t.dtype(), kBF16) ? "_bf16" : "_f32"));
}

void DeviceKernels::launch(DeviceStream& s, kh_device_function_t* f, uint32_t grid_x,
                           uint32_t grid_y, uint32_t grid_z, uint32_t shared_bytes,
                           std::vector<void*> args) {
  kh::launch(f, launch_cfg(device(), {grid_x, grid_y, grid_z}, {kThreads, 1, 1}, shared_bytes),
             args.data(), s);
}

void DeviceKernels::embedding_forward(DeviceStream& s, const DeviceTensor& table,
                                      const DeviceTensor& tokens, DeviceTensor& out) {
  const char* op = "embedding_forward";
  expect_float(op, "table", table);
  expect(table.ndim() == 2, op,
         fmt::format("table is {}; [vocab, dim] expected", table.describe()));
  expect(tokens.ndim() == 1 && same_dtype(tokens.dtype(), kI64), op,
         fmt::format("tokens is {}; int64 [rows] expected", tokens.describe()));
  long long vocab = table.dim(0), dim = table.dim(1);
  expect_shape(op, "out", out, {tokens.dim(0), dim});
  expect_dtype(op, "out", out, table.dtype());
  if (tokens.dim(0) == 0) return;
  const void* tp = table.data();
  const void* kp = tokens.data();
  void* op_ = out.data();
  launch(s, typed("kh_embedding_fwd", table), static_cast<uint32_t>(tokens.dim(0)), 1, 1, 0,
         {&tp, &kp, &op_, &vocab, &dim});
}

void DeviceKernels::embedding_backward(DeviceStream& s, const DeviceTensor& tokens,
                                       const DeviceTensor& dh, DeviceTensor& dtable) {
  const char* op = "embedding_backward";
  expect_float(op, "dh", dh);
  expect_dtype(op, "dtable", dtable, kF32);
  expect(dtable.ndim() == 2, op, fmt::format("dtable is {}; [vocab, dim]", dtable.describe()));
  expect(tokens.ndim() == 1 && same_dtype(tokens.dtype(), kI64), op,
         fmt::format("tokens is {}; int64 [rows] expected", tokens.describe()));
  long long vocab = dtable.dim(0), dim = dtable.dim(1);
  expect_shape(op, "dh", dh, {tokens.dim(0), dim});
  if (tokens.dim(0) == 0) return;
  const void* kp = tokens.data();
  const void* hp = dh.data();
  void* tp = dtable.data();
  launch(s, typed("kh_embedding_bwd", dh), static_cast<uint32_t>(tokens.dim(0)), 1, 1, 0,
         {&kp, &hp, &tp, &vocab, &dim});
}

void DeviceKernels::add(DeviceStream& s, const DeviceTensor& a, const DeviceTensor& b,
                        DeviceTensor& out) {
  const char* op = "add";
  expect_float(op, "a", a);
  expect_same(op, "b", b, a, "a");
  expect_same(op, "out", out, a, "a");
  long long n = a.numel();
  if (n == 0) return;
  const void* ap = a.data();
  const void* bp = b.data();
  void* outp = out.data();
  launch(s, typed("kh_add", a), blocks_for(n), 1, 1, 0, {&ap, &bp, &outp, &n});
}

void DeviceKernels::copy_columns(DeviceStream& s, const DeviceTensor& src, int64_t src_col,
                                 DeviceTensor& dst, int64_t dst_col, int64_t cols) {
  const char* op = "copy_columns";
  expect_float(op, "src", src);
  expect_dtype(op, "dst", dst, src.dtype());
  long long rows = rows_of(src), ld_src = cols_of(src), ld_dst = cols_of(dst);
  expect(rows_of(dst) == rows, op,
         fmt::format("dst is {}; {} rows expected (as src)", dst.describe(), rows));
  expect(src_col >= 0 && dst_col >= 0 && cols >= 0 && src_col + cols <= ld_src &&
             dst_col + cols <= ld_dst,
         op,
         fmt::format("columns [{}, +{}) of {} to [{}, +{}) of {}: out of range", src_col, cols,
                     src.describe(), dst_col, cols, dst.describe()));
  long long n = cols;
  if (rows * n == 0) return;
  const size_t elem = src.bytes() / static_cast<size_t>(src.numel());
  const void* sp = static_cast<const char*>(src.data()) + src_col * elem;
  void* dp = static_cast<char*>(dst.data()) + dst_col * elem;
  launch(s, typed("kh_copy_columns", src), blocks_for(rows * n), 1, 1, 0,
         {&sp, &ld_src, &dp, &ld_dst, &rows, &n});
}

void DeviceKernels::bias_add(DeviceStream& s, DeviceTensor& y, const DeviceTensor& bias) {
  const char* op = "bias_add";
  expect_float(op, "y", y);
  long long rows = rows_of(y), cols = cols_of(y);
  expect_shape(op, "bias", bias, {cols});
  expect_dtype(op, "bias", bias, y.dtype());
  if (rows * cols == 0) return;
  void* yp = y.data();
  const void* bp = bias.data();
  launch(s, typed("kh_bias_add", y), blocks_for(rows * cols), 1, 1, 0, {&yp, &bp, &rows, &cols});
}

void DeviceKernels::scale_columns(DeviceStream& s, const DeviceTensor& x, const DeviceTensor& scale,
                                  DeviceTensor& out) {
  const char* op = "scale_columns";
  expect_float(op, "x", x);
  long long rows = rows_of(x), cols = cols_of(x);
  expect_shape(op, "scale", scale, {cols});
  expect_dtype(op, "scale", scale, x.dtype());
  expect_shape(op, "out", out, x.shape());
  expect_dtype(op, "out", out, x.dtype());
  if (rows * cols == 0) return;
  const void *xp = x.data(), *sp = scale.data();
  void* op_out = out.data();
  launch(s, typed("kh_scale_columns", x), blocks_for(rows * cols), 1, 1, 0,
         {&xp, &sp, &op_out, &rows, &cols});
}

void DeviceKernels::column_sum_add(DeviceStream& s, const DeviceTensor& dy, DeviceTensor& db) {
  const char* op = "column_sum_add";
  expect_float(op, "dy", dy);
  long long rows = rows_of(dy), cols = cols_of(dy);
  expect_shape(op, "db", db, {cols});
  expect_dtype(op, "db", db, kF32);
  if (rows * cols == 0) return;
  const void* dyp = dy.data();
  void* dbp = db.data();
  launch(s, typed("kh_column_sum_add", dy), blocks_for(cols), 1, 1, 0, {&dyp, &dbp, &rows, &cols});
}

void DeviceKernels::cast(DeviceStream& s, const DeviceTensor& in, DeviceTensor& out) {
  const char* op = "cast";
  expect(in.shape() == out.shape(), op,
         fmt::format("in is {}, out is {}: one shape expected", in.describe(), out.describe()));
  const bool to_f32 = same_dtype(in.dtype(), kBF16) && same_dtype(out.dtype(), kF32);
  const bool to_bf16 = same_dtype(in.dtype(), kF32) && same_dtype(out.dtype(), kBF16);
  expect(to_f32 || to_bf16, op,
         fmt::format("{} to {}: bfloat16 <-> float32 only", in.describe(), out.describe()));
  long long n = in.numel();
  if (n == 0) return;
  const void* ip = in.data();
  void* outp = out.data();
  launch(s, fn(to_f32 ? "kh_cast_bf16_to_f32" : "kh_cast_f32_to_bf16"), blocks_for(n), 1, 1, 0,
         {&ip, &outp, &n});
}

void DeviceKernels::grad_add_multi(DeviceStream& s, const DeviceTensor& table, size_t entries) {
  expect(table.bytes() == entries * sizeof(KhGradAdd), "grad_add_multi",
         fmt::format("table is {} bytes; {} entries take {}", table.bytes(), entries,
                     entries * sizeof(KhGradAdd)));
  if (entries == 0) return;
  const void* tp = table.data();
  launch(s, fn("kh_grad_add_multi"), static_cast<uint32_t>(entries), 1, 1, 0, {&tp});
}

void DeviceKernels::init_normal(DeviceStream& s, DeviceTensor& w, uint64_t seed, float stddev) {
  const char* op = "init_normal";
  expect_dtype(op, "w", w, kF32);
  long long n = w.numel();
  if (n == 0) return;
  void* wp = w.data();
  unsigned long long sd = seed;
  launch(s, fn("kh_init_normal_f32"), blocks_for(n), 1, 1, 0, {&wp, &n, &sd, &stddev});
}

void DeviceKernels::fill(DeviceStream& s, DeviceTensor& w, float value) {
  const char* op = "fill";
  expect_dtype(op, "w", w, kF32);
  long long n = w.numel();
  if (n == 0) return;
  void* wp = w.data();
  launch(s, fn("kh_fill_f32"), blocks_for(n), 1, 1, 0, {&wp, &n, &value});
}

double DeviceKernels::read_bandwidth(DeviceStream& s, DevicePool& pool, int64_t bytes) {
  expect(bytes >= 16, "read_bandwidth", fmt::format("{} bytes; at least 16", bytes));
  DeviceTensor buffer(pool, {bytes / 16 * 16}, kU8), sink(pool, {4}, kU8);
  buffer.zero(s);
  const void* bp = buffer.data();
  void* sp = sink.data();
  long long n = bytes / 16;
  // Enough blocks for every SM of a large GPU several times over; each walks the buffer in a
  // grid-stride loop.
  const uint32_t blocks = std::min<uint32_t>(blocks_for(n), 4096);
  DeviceEvent start(device()), stop(device());
  double best_ms = 0;
  for (int pass = 0; pass < 4; ++pass) {  // the first pass warms up
    start.record(s);
    launch(s, fn("kh_read_u32x4"), blocks, 1, 1, 0, {&bp, &n, &sp});
    stop.record(s);
    stop.synchronize();
    const double ms = stop.elapsed_ms_since(start);
    if (pass > 0 && (best_ms == 0 || ms < best_ms)) best_ms = ms;
  }
  return best_ms > 0 ? static_cast<double>(n) * 16 / (best_ms / 1e3) : 0;
}

void DeviceKernels::rms_norm(DeviceStream& s, const DeviceTensor& x, const DeviceTensor& weight,
                             float eps, DeviceTensor& y, DeviceTensor* rstd) {
  const char* op = "rms_norm";
  expect_float(op, "x", x);
  long long cols = cols_of(x);
  const int64_t rows = rows_of(x);
  expect_shape(op, "weight", weight, {cols});
  expect_dtype(op, "weight", weight, x.dtype());
  expect_same(op, "y", y, x, "x");
  if (rstd) {
    expect_shape(op, "rstd", *rstd, {rows});
    expect_dtype(op, "rstd", *rstd, kF32);
  }
  if (rows == 0) return;
  const void* xp = x.data();
  const void* wp = weight.data();
  void* yp = y.data();
  void* rp = rstd ? rstd->data() : nullptr;
  launch(s, typed("kh_rms_norm", x), static_cast<uint32_t>(rows), 1, 1, 0,
         {&xp, &wp, &eps, &yp, &rp, &cols});
}

void DeviceKernels::rms_norm_backward(DeviceStream& s, const DeviceTensor& dy,
                                      const DeviceTensor& x, const DeviceTensor& weight,
                                      const DeviceTensor& rstd, DeviceTensor& dx,
                                      DeviceTensor& dweight) {
  const char* op = "rms_norm_backward";
  expect_float(op, "x", x);
  long long cols = cols_of(x);
  long long rows = rows_of(x);
  expect_same(op, "dy", dy, x, "x");
  expect_same(op, "dx", dx, x, "x");
  expect_shape(op, "weight", weight, {cols});
  expect_dtype(op, "weight", weight, x.dtype());
  expect_shape(op, "rstd", rstd, {rows});
  expect_dtype(op, "rstd", rstd, kF32);
  expect_shape(op, "dweight", dweight, {cols});
  expect_dtype(op, "dweight", dweight, kF32);
  if (rows == 0) {
    dweight.zero(s);
    return;
  }
  const void* dyp = dy.data();
  const void* xp = x.data();
  const void* wp = weight.data();
  const void* rp = rstd.data();
  void* dxp = dx.data();
  void* dwp = dweight.data();
  launch(s, typed("kh_rms_norm_bwd_dx", x), static_cast<uint32_t>(rows), 1, 1, 0,
         {&dyp, &xp, &wp, &rp, &dxp, &cols});
  launch(s, typed("kh_rms_norm_bwd_dw", x), blocks_for(cols), 1, 1, 0,
         {&dyp, &xp, &rp, &dwp, &rows, &cols});
}

void DeviceKernels::silu_and_mul(DeviceStream& s, const DeviceTensor& x, DeviceTensor& y) {
  const char* op = "silu_and_mul";
  expect_float(op, "x", x);
  expect(cols_of(x) % 2 == 0, op, fmt::format("x is {}: an even last dimension", x.describe()));
  long long rows = rows_of(x), d = cols_of(x) / 2;
  std::vector<int64_t> yshape = x.shape();
  yshape.back() = d;
  expect_shape(op, "y", y, yshape);
  expect_dtype(op, "y", y, x.dtype());
  if (rows * d == 0) return;
  const void* xp = x.data();
  void* yp = y.data();
  launch(s, typed("kh_silu_and_mul", x), blocks_for(rows * d), 1, 1, 0, {&xp, &yp, &rows, &d});
}

void DeviceKernels::silu_and_mul_backward(DeviceStream& s, const DeviceTensor& dy,
                                          const DeviceTensor& x, DeviceTensor& dx) {
  const char* op = "silu_and_mul_backward";
  expect_float(op, "x", x);
  expect(cols_of(x) % 2 == 0, op, fmt::format("x is {}: an even last dimension", x.describe()));
  long long rows = rows_of(x), d = cols_of(x) / 2;
  std::vector<int64_t> yshape = x.shape();
  yshape.back() = d;
  expect_shape(op, "dy", dy, yshape);
  expect_dtype(op, "dy", dy, x.dtype());
  expect_same(op, "dx", dx, x, "x");
  if (rows * d == 0) return;
  const void* dyp = dy.data();
  const void* xp = x.data();
  void* dxp = dx.data();
  launch(s, typed("kh_silu_and_mul_bwd", x), blocks_for(rows * d), 1, 1, 0,
         {&dyp, &xp, &dxp, &rows, &d});
}

void DeviceKernels::rotary(DeviceStream& s, const DeviceTensor& positions, DeviceTensor& q,
                           DeviceTensor* k, const DeviceTensor& cos, const DeviceTensor& sin,
                           bool neox, bool backward) {
  const char* op = backward ? "rotary_embedding_backward" : "rotary_embedding";
  expect_float(op, "query", q);
  expect(q.ndim() == 3, op,
         fmt::format("query is {}; [tokens, heads, head_dim] expected", q.describe()));
  const int64_t tokens = q.dim(0);
  expect_shape(op, "positions", positions, {tokens});
  expect_dtype(op, "positions", positions, kI64);
  if (k) {
    expect(k->ndim() == 3 && k->dim(0) == tokens && k->dim(2) == q.dim(2), op,
           fmt::format("key is {}; [{}, kv_heads, {}] expected", k->describe(), tokens, q.dim(2)));
    expect_dtype(op, "key", *k, q.dtype());
  }
  expect(cos.ndim() == 2, op, fmt::format("cos is {}; [max_pos, half]", cos.describe()));
  expect_dtype(op, "cos", cos, kF32);
  expect_same(op, "sin", sin, cos, "cos");
  long long max_pos = cos.dim(0);
  int half = static_cast<int>(cos.dim(1));
  expect(2 * half <= q.dim(2), op, "rot_dim (2 * cos columns) exceeds head_dim");
  if (tokens == 0) return;
  const void* pp = positions.data();
  void* qp = q.data();
  void* kp = k ? k->data() : nullptr;
  const void* cp = cos.data();
  const void* sp = sin.data();
  int q_heads = static_cast<int>(q.dim(1)), k_heads = k ? static_cast<int>(k->dim(1)) : 0;
  int head_dim = static_cast<int>(q.dim(2));
  int is_neox = neox ? 1 : 0;
  float sign = backward ? -1.f : 1.f;
  launch(
      s, typed("kh_rotary", q), static_cast<uint32_t>(tokens), 1, 1, 0,
      {&pp, &qp, &kp, &cp, &sp, &q_heads, &k_heads, &head_dim, &half, &max_pos, &is_neox, &sign});
}

namespace {

AttnShape attention_shape(const char* op, const DeviceTensor& q, const DeviceTensor& k,
                          const DeviceTensor& v) {
  expect_float(op, "q", q);
  expect(q.ndim() == 4, op,
         fmt::format("q is {}; padded [batch, len, heads, head_dim] expected", q.describe()));
  expect(k.ndim() == 4 && k.dim(0) == q.dim(0) && k.dim(1) == q.dim(1) && k.dim(3) == q.dim(3), op,
         fmt::format("k is {} for q {}: q's batch, length and head_dim expected", k.describe(),
                     q.describe()));
  expect(
      k.dim(2) >= 1 && q.dim(2) % k.dim(2) == 0, op,
      fmt::format("{} query heads are not a multiple of k's {} heads (GQA)", q.dim(2), k.dim(2)));
  expect_dtype(op, "k", k, q.dtype());
  expect_same(op, "v", v, k, "k");
  return AttnShape{q.dim(1), static_cast<int>(q.dim(2)), static_cast<int>(k.dim(2)),
                   static_cast<int>(q.dim(3))};
}

}  // namespace

void DeviceKernels::attention_forward(DeviceStream& s, const DeviceTensor& q, const DeviceTensor& k,
                                      const DeviceTensor& v, float scale, DeviceTensor& out,
                                      DeviceTensor* lse) {
  const char* op = "attention_forward";
  AttnShape shape = attention_shape(op, q, k, v);
  expect(scale > 0 && std::isfinite(scale), op, fmt::format("scale {}: positive expected", scale));
  expect_same(op, "out", out, q, "q");
  if (lse) {
    expect_shape(op, "lse", *lse, {q.dim(2), q.dim(0) * q.dim(1)});
    expect_dtype(op, "lse", *lse, kF32);
  }
  if (q.numel() == 0) return;
  const void* qp = q.data();
  const void* kp = k.data();
  const void* vp = v.data();
  void* op_ = out.data();
  void* lp = lse ? lse->data() : nullptr;
  launch(s, typed("kh_attention_fwd", q), static_cast<uint32_t>(shape.len),
         static_cast<uint32_t>(shape.heads), static_cast<uint32_t>(q.dim(0)),
         static_cast<uint32_t>(shape.len * sizeof(float)),
         {&qp, &kp, &vp, &op_, &lp, &shape, &scale});
}

void DeviceKernels::attention_backward(DeviceStream& s, const DeviceTensor& dout,
                                       const DeviceTensor& q, const DeviceTensor& k,
                                       const DeviceTensor& v, const DeviceTensor& out,
                                       const DeviceTensor& lse, float scale, DeviceTensor& dq,
                                       DeviceTensor& dk, DeviceTensor& dv) {
  const char* op = "attention_backward";
  AttnShape shape = attention_shape(op, q, k, v);
  expect(scale > 0 && std::isfinite(scale), op, fmt::format("scale {}: positive expected", scale));
  expect_same(op, "dout", dout, q, "q");
  expect_same(op, "out", out, q, "q");
  expect_same(op, "dq", dq, q, "q");
  expect_shape(op, "lse", lse, {q.dim(2), q.dim(0) * q.dim(1)});
  expect_dtype(op, "lse", lse, kF32);
  expect(dk.shape() == k.shape() && same_dtype(dk.dtype(), kF32), op,
         fmt::format("dk is {}; float32 of k's shape expected", dk.describe()));
  expect(dv.shape() == k.shape() && same_dtype(dv.dtype(), kF32), op,
         fmt::format("dv is {}; float32 of k's shape expected", dv.describe()));
  dk.zero(s);
  dv.zero(s);
  if (q.numel() == 0) return;
  const void* dop = dout.data();
  const void* qp = q.data();
  const void* kp = k.data();
  const void* vp = v.data();
  const void* outp = out.data();
  const void* lp = lse.data();
  void* dqp = dq.data();
  void* dkp = dk.data();
  void* dvp = dv.data();
  launch(s, typed("kh_attention_bwd", q), static_cast<uint32_t>(shape.len),
         static_cast<uint32_t>(shape.heads), static_cast<uint32_t>(q.dim(0)),
         static_cast<uint32_t>(2 * shape.len * sizeof(float)),
         {&dop, &qp, &kp, &vp, &outp, &lp, &dqp, &dkp, &dvp, &shape, &scale});
}

void DeviceKernels::cross_entropy(DeviceStream& s, const DeviceTensor& logits,
                                  const DeviceTensor& targets, int64_t ignore_index,
                                  float grad_scale, DeviceTensor& loss, DeviceTensor* dlogits) {
  const char* op = dlogits ? "cross_entropy_train" : "cross_entropy";
  expect_float(op, "logits", logits);
  expect(logits.ndim() == 2, op, fmt::format("logits is {}; [rows, classes]", logits.describe()));
  long long rows = logits.dim(0), cols = logits.dim(1);
  expect(rows == 0 || cols > 0, op, "logits have 0 classes");
  expect_shape(op, "targets", targets, {rows});
  expect_dtype(op, "targets", targets, kI64);
  expect_shape(op, "loss", loss, {rows});
  expect_dtype(op, "loss", loss, kF32);
  if (dlogits) expect_same(op, "dlogits", *dlogits, logits, "logits");
  if (rows == 0) return;
  const void* xp = logits.data();
  const void* tp = targets.data();
  long long ignore = ignore_index;
  void* lp = loss.data();
  void* dp = dlogits ? dlogits->data() : nullptr;
  launch(s, typed("kh_cross_entropy", logits), static_cast<uint32_t>(rows), 1, 1, 0,
         {&xp, &tp, &ignore, &grad_scale, &lp, &dp, &cols});
}

void DeviceKernels::cross_entropy_backward(DeviceStream& s, const DeviceTensor& dloss,
                                           DeviceTensor& dlogits) {
  const char* op = "cross_entropy_backward";
  expect_float(op, "dlogits", dlogits);
  long long rows = rows_of(dlogits), cols = cols_of(dlogits);
  expect_shape(op, "dloss", dloss, {rows});
  expect_dtype(op, "dloss", dloss, kF32);
  if (rows * cols == 0) return;
  const void* lp = dloss.data();
  void* dp = dlogits.data();
  launch(s, typed("kh_cross_entropy_bwd", dlogits), blocks_for(rows * cols), 1, 1, 0,
         {&lp, &dp, &rows, &cols});
}

namespace {

void expect_adamw_operands(const DeviceTensor& w, const DeviceTensor& g, const DeviceTensor& m,
                           const DeviceTensor& v, const DeviceTensor* w_bf16) {
  const char* op = "adamw";
  expect_dtype(op, "w", w, kF32);
  expect_same(op, "g", g, w, "w");
  expect_same(op, "m", m, w, "w");
  expect_same(op, "v", v, w, "w");
  if (w_bf16) {
    expect_shape(op, "w_bf16", *w_bf16, w.shape());
    expect_dtype(op, "w_bf16", *w_bf16, kBF16);
  }
}

// The step's scalars exactly as CausalLM::adam_step computes them (bias corrections in double):
// beta1, beta2, lr / c1, sqrt(c2), decay, eps, in kh_adamw_*'s parameter order.
struct AdamwScalars {
  float beta1, beta2, lr_step, c2_sqrt, decay, eps;
};
AdamwScalars adamw_scalars(const AdamConfig& a, int64_t step) {
  expect(step >= 1, "adamw", fmt::format("step {}: steps count from 1", step));
  const double c1 = 1.0 - std::pow(static_cast<double>(a.beta1), static_cast<double>(step));
  const double c2 = 1.0 - std::pow(static_cast<double>(a.beta2), static_cast<double>(step));
  return {a.beta1,
          a.beta2,
          static_cast<float>(a.lr / c1),
          static_cast<float>(std::sqrt(c2)),
          1.0f - a.lr * a.weight_decay,
          a.eps};
}

}  // namespace

void DeviceKernels::adamw(DeviceStream& s, DeviceTensor& w, const DeviceTensor& g, DeviceTensor& m,
                          DeviceTensor& v, DeviceTensor* w_bf16, const AdamConfig& a,
                          int64_t step) {
  expect_adamw_operands(w, g, m, v, w_bf16);
  AdamwScalars k = adamw_scalars(a, step);
  long long n = w.numel();
  if (n == 0) return;
  void* wp = w.data();
  const void* gp = g.data();
  void* mp = m.data();
  void* vp = v.data();
  void* bp = w_bf16 ? w_bf16->data() : nullptr;
  launch(
      s, fn("kh_adamw_f32"), blocks_for((n + 3) / 4), 1, 1, 0,
      {&wp, &gp, &mp, &vp, &bp, &n, &k.beta1, &k.beta2, &k.lr_step, &k.c2_sqrt, &k.decay, &k.eps});
}

namespace {

// CTAs of kh_adamw_multi_f32 for a tensor of n elements.
long long adamw_ctas(long long n) {
  return (n + KH_ADAMW_CHUNK - 1) / KH_ADAMW_CHUNK;
}

}  // namespace

std::vector<KhAdamwTensor> DeviceKernels::adamw_table(const std::vector<AdamwParam>& params) {
  static_assert(KH_ADAMW_CHUNK == kThreads * 16,
                "a CTA of kh_adamw_multi_f32: 4 x 4 elements a thread");
  std::vector<KhAdamwTensor> table;
  long long blocks = 0;
  for (const AdamwParam& p : params) {
    expect_adamw_operands(*p.w, *p.g, *p.m, *p.v, p.w_bf16);
    const long long n = p.w->numel();
    if (n == 0) continue;  // no CTA: the kernel's search would never land on it
    table.push_back({p.w->data_as<float>(), p.g->data_as<const float>(), p.m->data_as<float>(),
                     p.v->data_as<float>(), p.w_bf16 ? p.w_bf16->data() : nullptr, n, blocks});
    blocks += adamw_ctas(n);
  }
  expect(blocks <= 0x7FFFFFFF, "adamw",
         fmt::format("{} CTAs of {} elements: more than one launch takes", blocks, KH_ADAMW_CHUNK));
  return table;
}

void DeviceKernels::adamw_multi(DeviceStream& s, const DeviceTensor& table,
                                const std::vector<KhAdamwTensor>& entries, const AdamConfig& a,
                                int64_t step) {
  AdamwScalars k = adamw_scalars(a, step);
  if (entries.empty()) return;
  expect(table.bytes() == entries.size() * sizeof(KhAdamwTensor), "adamw",
         fmt::format("the device table is {} bytes; {} entries take {}", table.bytes(),
                     entries.size(), entries.size() * sizeof(KhAdamwTensor)));
  const KhAdamwTensor& last = entries.back();
  const long long blocks = last.first_block + adamw_ctas(last.n);
  const void* tp = table.data();
  int count = static_cast<int>(entries.size());
  launch(s, fn("kh_adamw_multi_f32"), static_cast<uint32_t>(blocks), 1, 1, 0,
         {&tp, &count, &k.beta1, &k.beta2, &k.lr_step, &k.c2_sqrt, &k.decay, &k.eps});
}

}  // namespace kh::demo
