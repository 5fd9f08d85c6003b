// GPU tests of the GPU-resident runtime's device building blocks (tools/demo/device_*; CTest
// label `gpu`, every test skips cleanly without a driver or a device): each device kernel on
// random inputs against the host fallback the demo already trusts (fallback_ops.cpp through a
// kh::Runtime on the cpu, layers.h) or a float64 reference: embedding and its scatter-add
// backward, residual add, bf16 <-> fp32 casts (bit-exact against the prelude's host conversion),
// RMSNorm, SiluAndMul, RoPE (NeoX and GPT-J), causal GQA attention, cross-entropy with an
// ignored row, AdamW on fp32 master weights writing bf16 weights, and the Linear on the GEMM
// service (forward, dx, accumulated dW); bf16 activations for RMSNorm, attention and the Linear
// against the fp32 result within bf16 tolerance; shape errors; and the device-resident model's
// eval prefill (weights and activations on the device, one stream) against the host model's
// logits and loss for the Llama, Qwen2 (q/k/v bias) and Qwen3 (q/k norms, GQA, tied) shapes,
// and 3 AdamW training steps on the device against the host model's losses and weights; the bf16
// model (fp32 master weights) against the fp32 one (logits, training losses), the chunked train
// loss and its gradients against the host model's full-logits ones, and the random init on the
// device (seeded, scaled as init_stddev).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "hub/base/error.h"
#include "kernel_hub/kernel_hub.hpp"
#include "kernels/common/kh_prelude.cuh"
#include "tests/gpu/demo_models.h"
#include "tests/gpu/gpu_device.h"
#include "tools/demo/adamw_table.h"
#include "tools/demo/device_kernels.h"
#include "tools/demo/device_linear.h"
#include "tools/demo/device_model.h"
#include "tools/demo/device_tensor.h"
#include "tools/demo/fallback_ops.h"
#include "tools/demo/layers.h"
#include "tools/demo/model.h"
#include "tools/demo/model_config.h"
#include "tools/demo/staging.h"

namespace kh::demo {
namespace {

std::vector<float> randn(size_t n, uint32_t seed, float scale = 1.f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// A host DLTensor over `data` (kept alive by the caller).
struct HostView {
  std::vector<int64_t> shape;
  DLTensor t{};
  HostView(void* data, std::vector<int64_t> s, DLDataType dtype = kF32) : shape(std::move(s)) {
    t.data = data;
    t.device = {kDLCPU, 0};
    t.ndim = static_cast<int32_t>(shape.size());
    t.dtype = dtype;
    t.shape = shape.data();
  }
  kh_arg_t arg() const {
    kh_arg_t a{};
    a.kind = KH_ARG_TENSOR;
    a.v.t = &t;
    return a;
  }
};
kh_arg_t arg_int(int64_t i) {
  kh_arg_t a{};
  a.kind = KH_ARG_INT;
  a.v.i = i;
  return a;
}
kh_arg_t arg_float(double f) {
  kh_arg_t a{};
  a.kind = KH_ARG_FLOAT;
  a.v.f = f;
  return a;
}
kh_arg_t arg_null() {
  kh_arg_t a{};
  a.kind = KH_ARG_TENSOR;
  a.v.t = nullptr;
  return a;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, float atol,
                  float rtol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const float tol = atol + rtol * std::fabs(want[i]);
    if (!(std::fabs(got[i] - want[i]) <= tol) && !(std::isnan(got[i]) && std::isnan(want[i]))) {
      if (++bad <= 5)
        ADD_FAILURE() << what << "[" << i << "]: device " << got[i] << ", reference " << want[i];
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " elements differ";
}

// Each named gradient of `got` against `want`'s, within atol_share of the largest of want's (not
// zero: a gradient that is not computed cannot pass) plus rtol.
void expect_grads_close(DeviceCausalLM& got, DeviceCausalLM& want,
                        const std::vector<const char*>& names, float atol_share, float rtol) {
  for (const char* name : names) {
    const std::vector<float> w = want.download_grad(name);
    float peak = 0.f;
    for (float g : w) peak = std::max(peak, std::fabs(g));
    ASSERT_GT(peak, 0.f) << name;
    expect_close(got.download_grad(name), w, atol_share * peak, rtol, name);
  }
}

class GpuDemoDevice : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    skip_ = gpu_test::no_cuda_device();
    if (skip_) return;
    try {
      kernels_ = new DeviceKernels(0);
    } catch (const Error& e) {
      skip_ = new std::string(std::string("device kernels failed to build: ") + e.what());
      failed_ = true;
    }
    pool_ = new DevicePool(0);
    stream_ = new DeviceStream(0);
    runtime_ = new Runtime();
    slots_ = new DemoSlots(add_demo_slots(*runtime_));
    runtime_->set_mode(Mode::kTrain);
  }
  void SetUp() override {
    if (failed_) FAIL() << *skip_;
    if (skip_) GTEST_SKIP() << "no usable CUDA device: " << *skip_;
  }

  DeviceTensor upload(const std::vector<float>& host, std::vector<int64_t> shape) {
    DeviceTensor t(*pool_, std::move(shape), kF32);
    t.upload(*stream_, host.data(), host.size() * sizeof(float));
    return t;
  }
  DeviceTensor upload_i64(const std::vector<int64_t>& host) {
    DeviceTensor t(*pool_, {static_cast<int64_t>(host.size())}, kI64);
    t.upload(*stream_, host.data(), host.size() * sizeof(int64_t));
    return t;
  }
  DeviceTensor empty(std::vector<int64_t> shape, DLDataType dtype = kF32) {
    return DeviceTensor(*pool_, std::move(shape), dtype);
  }
  std::vector<float> download(const DeviceTensor& t) {
    std::vector<float> host(static_cast<size_t>(t.numel()));
    t.download(*stream_, host.data(), host.size() * sizeof(float));
    stream_->synchronize();
    return host;
  }
  // bf16 round trip through the device casts.
  DeviceTensor to_bf16(const DeviceTensor& f) {
    DeviceTensor b = empty(f.shape(), kBF16);
    kernels_->cast(*stream_, f, b);
    return b;
  }
  DeviceTensor to_f32(const DeviceTensor& b) {
    DeviceTensor f = empty(b.shape(), kF32);
    kernels_->cast(*stream_, b, f);
    return f;
  }
  void host_call(uint32_t slot, bool backward, const std::vector<kh_arg_t>& args) {
    int32_t status = backward ? runtime_->backward(slot, kCpuDevice, args.data(),
                                                   static_cast<int32_t>(args.size()), nullptr)
                              : runtime_->forward(slot, kCpuDevice, args.data(),
                                                  static_cast<int32_t>(args.size()), nullptr);
    ASSERT_EQ(status, KH_OK) << last_op_error();
  }

  static std::string* skip_;
  static bool failed_;
  static DeviceKernels* kernels_;
  static DevicePool* pool_;
  static DeviceStream* stream_;
  static Runtime* runtime_;
  static DemoSlots* slots_;
};
std::string* GpuDemoDevice::skip_ = nullptr;
bool GpuDemoDevice::failed_ = false;
DeviceKernels* GpuDemoDevice::kernels_ = nullptr;
DevicePool* GpuDemoDevice::pool_ = nullptr;
DeviceStream* GpuDemoDevice::stream_ = nullptr;
Runtime* GpuDemoDevice::runtime_ = nullptr;
DemoSlots* GpuDemoDevice::slots_ = nullptr;

TEST_F(GpuDemoDevice, EmbeddingGatherAndScatterAdd) {
  const int64_t vocab = 50, dim = 72, rows = 40;
  std::vector<float> table = randn(vocab * dim, 1);
  std::vector<int64_t> tokens(rows);
  for (int64_t r = 0; r < rows; ++r) tokens[r] = (r * 7) % 13;  // repeated tokens
  tokens[3] = vocab + 5;                                        // outside: a zero row
  std::vector<float> dh = randn(rows * dim, 2);
  DeviceTensor t = upload(table, {vocab, dim});
  DeviceTensor k = upload_i64(tokens);
  DeviceTensor h = empty({rows, dim});
  kernels_->embedding_forward(*stream_, t, k, h);
  DeviceTensor dt = upload(std::vector<float>(vocab * dim, 0.5f), {vocab, dim});
  kernels_->embedding_backward(*stream_, k, upload(dh, {rows, dim}), dt);
  std::vector<float> want_h(rows * dim, 0.f);
  std::vector<double> want_dt(vocab * dim, 0.5);
  for (int64_t r = 0; r < rows; ++r) {
    if (tokens[r] >= vocab) continue;
    for (int64_t c = 0; c < dim; ++c) {
      want_h[r * dim + c] = table[tokens[r] * dim + c];
      want_dt[tokens[r] * dim + c] += dh[r * dim + c];
    }
  }
  expect_close(download(h), want_h, 0, 0, "embedding");
  expect_close(download(dt), std::vector<float>(want_dt.begin(), want_dt.end()), 1e-5f, 1e-5f,
               "embedding backward");
}

TEST_F(GpuDemoDevice, ResidualAddAndCasts) {
  const int64_t n = 3000;
  std::vector<float> a = randn(n, 3), b = randn(n, 4);
  a[0] = NAN;
  a[1] = 1e38f;
  a[2] = 3.0e38f;  // rounds to inf in bf16
  DeviceTensor da = upload(a, {n}), db = upload(b, {n});
  kernels_->add(*stream_, da, db, db);  // in place
  std::vector<float> sum(n);
  for (int64_t i = 0; i < n; ++i) sum[i] = a[i] + b[i];
  expect_close(download(db), sum, 0, 0, "add");
  std::vector<float> back = download(to_f32(to_bf16(da)));
  for (int64_t i = 0; i < n; ++i) {
    const uint16_t bits = kh_float_to_bf16_bits(a[i]);
    const float want = kh_bf16_bits_to_float(bits);
    if (std::isnan(want))
      EXPECT_TRUE(std::isnan(back[i])) << i;
    else
      ASSERT_EQ(back[i], want) << i << ": " << a[i];
  }
}

// grad_add_multi (DeviceCausalLM's deferred bf16 gradients into the fp32 ones, one launch): each
// entry adds float(src) to dst, rounded once (bit for bit what a cast and an add give), or
// overwrites dst with it; entries of other lengths (one CTA each, longer and shorter than its
// threads) leave the elements past their n alone; a table of the wrong size is refused.
TEST_F(GpuDemoDevice, GradAddMultiAddsOrOverwritesEachEntry) {
  const std::vector<int64_t> lengths = {1003, 4099, 1};
  std::vector<std::vector<float>> acc, d;
  std::vector<DeviceTensor> dacc, dd;
  std::vector<KhGradAdd> table;
  for (size_t e = 0; e < lengths.size(); ++e) {
    const int64_t n = lengths[e];
    acc.push_back(randn(n + 1, 20 + static_cast<uint32_t>(e)));
    d.push_back(randn(n, 30 + static_cast<uint32_t>(e), 100.f));
    dacc.push_back(upload(acc.back(), {n + 1}));  // one element past the entry's end
    dd.push_back(to_bf16(upload(d.back(), {n})));
    table.push_back({static_cast<float*>(dacc.back().data()), dd.back().data(), n,
                     e == 1 ? 1 : 0});  // the second (4099 elements) overwrites
  }
  const size_t bytes = table.size() * sizeof(KhGradAdd);
  DeviceTensor dtable = empty({static_cast<int64_t>(bytes)}, kU8);
  dtable.upload(*stream_, table.data(), bytes);
  kernels_->grad_add_multi(*stream_, dtable, table.size());
  for (size_t e = 0; e < lengths.size(); ++e) {
    SCOPED_TRACE(testing::Message() << "entry " << e);
    const int64_t n = lengths[e];
    const std::vector<float> got = download(dacc[e]), wide = download(to_f32(dd[e]));
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[i], e == 1 ? wide[i] : acc[e][i] + wide[i]) << i;
    EXPECT_EQ(got[n], acc[e][n]) << "past the entry's end";
  }
  EXPECT_THROW(kernels_->grad_add_multi(*stream_, dtable, table.size() + 1), Error);
}

// scale_columns (a norm's weight folded into the weight after it): out[r, c] = x[r, c] * s[c],
// rounded once, fp32 exact and bf16 to the nearest of the fp32 product; wrong shapes refused.
TEST_F(GpuDemoDevice, ScaleColumnsRoundsTheProductOnce) {
  const int64_t rows = 37, cols = 300;
  const std::vector<float> x = randn(rows * cols, 12, 3.f), s = randn(cols, 13);
  std::vector<float> want(x.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) want[r * cols + c] = x[r * cols + c] * s[c];
  DeviceTensor dx_ = upload(x, {rows, cols}), ds = upload(s, {cols}), out = empty({rows, cols});
  kernels_->scale_columns(*stream_, dx_, ds, out);
  expect_close(download(out), want, 0, 0, "scale_columns");
  const DeviceTensor xb = to_bf16(dx_), sb = to_bf16(ds);
  DeviceTensor ob = empty({rows, cols}, kBF16);
  kernels_->scale_columns(*stream_, xb, sb, ob);
  const std::vector<float> xr = download(to_f32(xb)), sr = download(to_f32(sb)),
                           got = download(to_f32(ob));
  for (int64_t i = 0; i < rows * cols; ++i)
    ASSERT_EQ(got[i], kh_bf16_bits_to_float(kh_float_to_bf16_bits(xr[i] * sr[i % cols]))) << i;
  DeviceTensor narrow = empty({cols - 1});
  EXPECT_THROW(kernels_->scale_columns(*stream_, dx_, narrow, out), Error);
  EXPECT_THROW(kernels_->scale_columns(*stream_, dx_, ds, ob), Error);  // another dtype
}

TEST_F(GpuDemoDevice, RMSNormMatchesTheHostFallback) {
  const int64_t rows = 37, cols = 200;
  const float eps = 1e-6f;
  std::vector<float> x = randn(rows * cols, 5), w = randn(cols, 6), dy = randn(rows * cols, 7);
  std::vector<float> y(rows * cols), rstd(rows), dx(rows * cols), dw(cols), ws(1);
  HostView hx(x.data(), {rows, cols}), hw(w.data(), {cols}), hy(y.data(), {rows, cols}),
      hr(rstd.data(), {rows}), hdy(dy.data(), {rows, cols}), hdx(dx.data(), {rows, cols}),
      hdw(dw.data(), {cols}), hws(ws.data(), {1});
  host_call(slots_->rms_norm, false, {hx.arg(), hw.arg(), arg_float(eps), hy.arg(), hr.arg()});
  host_call(slots_->rms_norm, true,
            {hdy.arg(), hx.arg(), hw.arg(), hr.arg(), hdx.arg(), hdw.arg(), hws.arg()});
  DeviceTensor dx_ = upload(x, {rows, cols}), dw_ = upload(w, {cols});
  DeviceTensor out = empty({rows, cols}), drstd = empty({rows});
  kernels_->rms_norm(*stream_, dx_, dw_, eps, out, &drstd);
  DeviceTensor ddx = empty({rows, cols}), ddw = empty({cols});
  kernels_->rms_norm_backward(*stream_, upload(dy, {rows, cols}), dx_, dw_, drstd, ddx, ddw);
  expect_close(download(out), y, 1e-5f, 1e-5f, "rms_norm y");
  expect_close(download(drstd), rstd, 0, 1e-5f, "rms_norm rstd");
  expect_close(download(ddx), dx, 1e-5f, 1e-4f, "rms_norm dx");
  expect_close(download(ddw), dw, 1e-4f, 1e-4f, "rms_norm dweight");
  // bf16 activations and weight: within bf16 rounding of the fp32 result.
  DeviceTensor yb = empty({rows, cols}, kBF16);
  kernels_->rms_norm(*stream_, to_bf16(dx_), to_bf16(dw_), eps, yb, nullptr);
  expect_close(download(to_f32(yb)), y, 2e-2f, 2e-2f, "rms_norm bf16");
}

TEST_F(GpuDemoDevice, SiluAndMulMatchesTheHostFallback) {
  const int64_t rows = 33, d = 150;
  std::vector<float> x = randn(rows * 2 * d, 8, 2.f), dy = randn(rows * d, 9);
  std::vector<float> y(rows * d), dx(rows * 2 * d);
  HostView hx(x.data(), {rows, 2 * d}), hy(y.data(), {rows, d}), hdy(dy.data(), {rows, d}),
      hdx(dx.data(), {rows, 2 * d});
  host_call(slots_->silu_and_mul, false, {hx.arg(), hy.arg()});
  host_call(slots_->silu_and_mul, true, {hdy.arg(), hx.arg(), hdx.arg()});
  DeviceTensor dx_ = upload(x, {rows, 2 * d}), out = empty({rows, d}), ddx = empty({rows, 2 * d});
  kernels_->silu_and_mul(*stream_, dx_, out);
  kernels_->silu_and_mul_backward(*stream_, upload(dy, {rows, d}), dx_, ddx);
  expect_close(download(out), y, 1e-6f, 1e-5f, "silu_and_mul");
  expect_close(download(ddx), dx, 1e-6f, 1e-5f, "silu_and_mul backward");
}

TEST_F(GpuDemoDevice, RotaryMatchesTheHostFallbackBothLayouts) {
  const int64_t tokens = 21, heads = 4, kv_heads = 2, head_dim = 32, half = 12, max_pos = 30;
  std::vector<int64_t> pos(tokens);
  for (int64_t t = 0; t < tokens; ++t) pos[t] = (t * 5) % max_pos;
  pos[2] = max_pos + 3;  // outside the table: unchanged
  std::vector<float> cs(max_pos * half), sn(max_pos * half);
  for (int64_t p = 0; p < max_pos; ++p)
    for (int64_t j = 0; j < half; ++j) {
      const double f = p * std::pow(10000.0, -2.0 * j / head_dim);
      cs[p * half + j] = static_cast<float>(std::cos(f));
      sn[p * half + j] = static_cast<float>(std::sin(f));
    }
  for (int neox = 0; neox < 2; ++neox)
    for (int backward = 0; backward < 2; ++backward) {
      std::vector<float> q = randn(tokens * heads * head_dim, 10 + neox),
                         k = randn(tokens * kv_heads * head_dim, 20 + neox);
      DeviceTensor dq = upload(q, {tokens, heads, head_dim}),
                   dk = upload(k, {tokens, kv_heads, head_dim});
      HostView hp(pos.data(), {tokens}, kI64), hq(q.data(), {tokens, heads, head_dim}),
          hk(k.data(), {tokens, kv_heads, head_dim}), hc(cs.data(), {max_pos, half}),
          hs(sn.data(), {max_pos, half});
      host_call(slots_->rotary, backward != 0,
                {hp.arg(), hq.arg(), hk.arg(), hc.arg(), hs.arg(), arg_int(neox)});
      kernels_->rotary(*stream_, upload_i64(pos), dq, &dk, upload(cs, {max_pos, half}),
                       upload(sn, {max_pos, half}), neox != 0, backward != 0);
      const std::string what =
          std::string(neox ? "neox" : "gptj") + (backward ? " backward" : " forward");
      expect_close(download(dq), q, 1e-6f, 1e-6f, "rotary q " + what);
      expect_close(download(dk), k, 1e-6f, 1e-6f, "rotary k " + what);
    }
}

TEST_F(GpuDemoDevice, AttentionMatchesTheHostFallback) {
  const int64_t B = 2, L = 19, H = 4, KVH = 2, D = 16;
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  std::vector<float> q = randn(B * L * H * D, 30), k = randn(B * L * KVH * D, 31),
                     v = randn(B * L * KVH * D, 32), dout = randn(B * L * H * D, 33);
  std::vector<float> out(q.size()), lse(H * B * L), dq(q.size()), dk(k.size()), dv(v.size());
  HostView hq(q.data(), {B, L, H, D}), hk(k.data(), {B, L, KVH, D}), hv(v.data(), {B, L, KVH, D}),
      ho(out.data(), {B, L, H, D}), hl(lse.data(), {H, B * L}), hdo(dout.data(), {B, L, H, D}),
      hdq(dq.data(), {B, L, H, D}), hdk(dk.data(), {B, L, KVH, D}), hdv(dv.data(), {B, L, KVH, D});
  host_call(slots_->attention, false,
            {hq.arg(), hk.arg(), hv.arg(), arg_null(), arg_null(), arg_int(L), arg_int(1),
             arg_int(-1), arg_float(scale), ho.arg(), hl.arg()});
  host_call(slots_->attention, true,
            {hdo.arg(), hq.arg(), hk.arg(), hv.arg(), ho.arg(), hl.arg(), arg_null(), arg_null(),
             arg_int(L), arg_int(L), arg_int(1), arg_int(-1), arg_float(scale), hdq.arg(),
             hdk.arg(), hdv.arg(), arg_null()});
  DeviceTensor Q = upload(q, {B, L, H, D}), K = upload(k, {B, L, KVH, D}),
               V = upload(v, {B, L, KVH, D});
  DeviceTensor O = empty({B, L, H, D}), LSE = empty({H, B * L});
  kernels_->attention_forward(*stream_, Q, K, V, scale, O, &LSE);
  DeviceTensor DQ = empty({B, L, H, D}), DK = empty({B, L, KVH, D}), DV = empty({B, L, KVH, D});
  kernels_->attention_backward(*stream_, upload(dout, {B, L, H, D}), Q, K, V, O, LSE, scale, DQ, DK,
                               DV);
  expect_close(download(O), out, 1e-5f, 1e-4f, "attention out");
  expect_close(download(LSE), lse, 1e-5f, 1e-5f, "attention lse");
  expect_close(download(DQ), dq, 1e-5f, 1e-4f, "attention dq");
  expect_close(download(DK), dk, 1e-5f, 1e-4f, "attention dk");
  expect_close(download(DV), dv, 1e-5f, 1e-4f, "attention dv");
  // bf16 q, k, v: within bf16 tolerance of the fp32 output.
  DeviceTensor Ob = empty({B, L, H, D}, kBF16);
  kernels_->attention_forward(*stream_, to_bf16(Q), to_bf16(K), to_bf16(V), scale, Ob, nullptr);
  expect_close(download(to_f32(Ob)), out, 3e-2f, 3e-2f, "attention bf16");
}

TEST_F(GpuDemoDevice, CrossEntropyMatchesTheHostFallback) {
  const int64_t rows = 17, classes = 301;
  std::vector<float> x = randn(rows * classes, 40, 3.f);
  std::vector<int64_t> targets(rows);
  for (int64_t r = 0; r < rows; ++r) targets[r] = (r * 37) % classes;
  targets[4] = -100;  // ignored
  std::vector<float> loss(rows), dx(rows * classes), dloss = randn(rows, 41);
  HostView hx(x.data(), {rows, classes}), ht(targets.data(), {rows}, kI64), hl(loss.data(), {rows}),
      hdx(dx.data(), {rows, classes}), hdl(dloss.data(), {rows});
  host_call(slots_->cross_entropy, false,
            {hx.arg(), ht.arg(), arg_int(-100), arg_float(0.25), hl.arg(), hdx.arg()});
  host_call(slots_->cross_entropy, true, {hdl.arg(), hdx.arg()});
  DeviceTensor X = upload(x, {rows, classes}), L = empty({rows}), DX = empty({rows, classes});
  kernels_->cross_entropy(*stream_, X, upload_i64(targets), -100, 0.25f, L, &DX);
  kernels_->cross_entropy_backward(*stream_, upload(dloss, {rows}), DX);
  expect_close(download(L), loss, 1e-5f, 1e-5f, "cross_entropy loss");
  expect_close(download(DX), dx, 1e-7f, 1e-4f, "cross_entropy dlogits");
}

// 5000: every element through the kernel's 16-byte path; 5003: its scalar loop takes the last
// 3; 3: no 16-byte group at all.
TEST_F(GpuDemoDevice, AdamWMatchesAFloat64Reference) {
  for (const int64_t n : {int64_t{5000}, int64_t{5003}, int64_t{3}}) {
    SCOPED_TRACE(n);
    AdamConfig a;
    a.lr = 1e-2f;
    a.weight_decay = 0.1f;
    std::vector<float> w = randn(n, 50), m(n, 0.f), v(n, 0.f);
    std::vector<double> rw(w.begin(), w.end()), rm(n, 0.0), rv(n, 0.0);
    DeviceTensor W = upload(w, {n}), M = upload(m, {n}), V = upload(v, {n});
    DeviceTensor Wb = empty({n}, kBF16);
    for (int64_t step = 1; step <= 3; ++step) {
      std::vector<float> g = randn(n, 60 + static_cast<uint32_t>(step));
      kernels_->adamw(*stream_, W, upload(g, {n}), M, V, &Wb, a, step);
      const double c1 = 1 - std::pow(double{a.beta1}, double(step));
      const double c2 = 1 - std::pow(double{a.beta2}, double(step));
      for (int64_t i = 0; i < n; ++i) {
        rm[i] = a.beta1 * rm[i] + (1 - double{a.beta1}) * g[i];
        rv[i] = a.beta2 * rv[i] + (1 - double{a.beta2}) * g[i] * double{g[i]};
        rw[i] = rw[i] * (1 - double{a.lr} * a.weight_decay) -
                (a.lr / c1) * rm[i] / (std::sqrt(rv[i]) / std::sqrt(c2) + a.eps);
      }
    }
    std::vector<float> want(rw.begin(), rw.end());
    std::vector<float> got = download(W);
    expect_close(got, want, 1e-5f, 1e-5f, "adamw master weights");
    std::vector<float> wb = download(to_f32(Wb));
    for (int64_t i = 0; i < n; ++i)
      ASSERT_EQ(wb[i], kh_bf16_bits_to_float(kh_float_to_bf16_bits(got[i]))) << i;
  }
}

// The multi-tensor AdamW (one launch, what the model's adam_step runs) against one launch a
// tensor, bit for bit: sizes around its 4096-element CTAs and the 16-byte groups, a tensor without
// a bf16 copy, 3 steps from the same start.
TEST_F(GpuDemoDevice, MultiTensorAdamWEqualsOneLaunchATensor) {
  const std::vector<int64_t> sizes = {5000, 5003, 3, 1, 4096, 4097, 70001, 8192};
  AdamConfig a;
  a.lr = 1e-2f;
  a.weight_decay = 0.1f;
  struct Set {
    std::vector<DeviceTensor> w, m, v, wb;
  };
  auto make = [&]() {
    Set s;
    for (size_t i = 0; i < sizes.size(); ++i) {
      const int64_t n = sizes[i];
      s.w.push_back(upload(randn(n, 70 + static_cast<uint32_t>(i)), {n}));
      s.m.push_back(upload(std::vector<float>(static_cast<size_t>(n), 0.f), {n}));
      s.v.push_back(upload(std::vector<float>(static_cast<size_t>(n), 0.f), {n}));
      s.wb.push_back(empty({n}, kBF16));
    }
    return s;
  };
  Set one = make(), multi = make();
  for (int64_t step = 1; step <= 3; ++step) {
    std::vector<DeviceTensor> g;
    for (size_t i = 0; i < sizes.size(); ++i)
      g.push_back(upload(randn(sizes[i], 90 + static_cast<uint32_t>(step * 16 + i)), {sizes[i]}));
    std::vector<DeviceKernels::AdamwParam> list;
    for (size_t i = 0; i < sizes.size(); ++i) {
      DeviceTensor* wb = i == 2 ? nullptr : &one.wb[i];
      kernels_->adamw(*stream_, one.w[i], g[i], one.m[i], one.v[i], wb, a, step);
      list.push_back(
          {&multi.w[i], &g[i], &multi.m[i], &multi.v[i], i == 2 ? nullptr : &multi.wb[i]});
    }
    std::vector<KhAdamwTensor> table = DeviceKernels::adamw_table(list);
    ASSERT_EQ(table.size(), sizes.size());
    EXPECT_EQ(table[1].first_block, 2);  // 5000 elements: 2 CTAs of 4096
    DeviceTensor dev = empty({static_cast<int64_t>(table.size() * sizeof(KhAdamwTensor))}, kU8);
    dev.upload(*stream_, table.data(), dev.bytes());
    kernels_->adamw_multi(*stream_, dev, table, a, step);
    stream_->synchronize();
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    SCOPED_TRACE(sizes[i]);
    for (auto [x, y] : {std::pair{&one.w[i], &multi.w[i]}, std::pair{&one.m[i], &multi.m[i]},
                        std::pair{&one.v[i], &multi.v[i]}}) {
      const std::vector<float> want = download(*x), got = download(*y);
      ASSERT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0);
    }
    if (i == 2) continue;
    const std::vector<float> want = download(to_f32(one.wb[i])),
                             got = download(to_f32(multi.wb[i]));
    ASSERT_EQ(want, got);
  }
}

TEST_F(GpuDemoDevice, LinearOnTheGemmServiceMatchesTheHostLinear) {
  const int64_t rows = 45, in = 96, out = 80;
  std::vector<float> x = randn(rows * in, 70), w = randn(out * in, 71, 0.1f),
                     dy = randn(rows * out, 72);
  std::vector<float> y(rows * out), dx(rows * in), dw(out * in, 0.f);
  linear_forward(x.data(), w.data(), nullptr, y.data(), rows, in, out);
  linear_backward(x.data(), w.data(), dy.data(), dx.data(), dw.data(), nullptr, rows, in, out,
                  false);
  DeviceTensor X = upload(x, {rows, in}), Wt = upload(w, {out, in}), Y = empty({rows, out});
  DeviceTensor DY = upload(dy, {rows, out}), DX = empty({rows, in});
  DeviceTensor DW = upload(std::vector<float>(out * in, 0.f), {out, in});
  linear_forward(*stream_, X, Wt, Y);
  linear_backward(*stream_, X, Wt, DY, &DX, &DW);
  expect_close(download(Y), y, 1e-4f, 1e-4f, "linear y");
  expect_close(download(DX), dx, 1e-4f, 1e-4f, "linear dx");
  expect_close(download(DW), dw, 1e-4f, 1e-4f, "linear dw");
  // bf16 in, fp32 dW accumulated twice.
  DeviceTensor Yb = empty({rows, out}, kBF16);
  DeviceTensor Xb = to_bf16(X), Wb = to_bf16(Wt), DYb = to_bf16(DY);
  linear_forward(*stream_, Xb, Wb, Yb);
  linear_backward(*stream_, Xb, Wb, DYb, nullptr, &DW);
  expect_close(download(to_f32(Yb)), y, 5e-2f, 3e-2f, "linear bf16 y");
  std::vector<float> dw2(dw);
  for (float& v : dw2) v *= 2.f;
  expect_close(download(DW), dw2, 5e-2f, 3e-2f, "linear bf16 dw accumulated");
  try {
    DeviceTensor wrong = empty({rows, out + 1});
    linear_forward(*stream_, X, Wt, wrong);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("linear: y is float32[45, 81]"), std::string::npos)
        << e.what();
  }
}

TEST_F(GpuDemoDevice, DeviceModelPrefillMatchesTheHostModel) {
  ModelConfig llama = preset("tiny");
  ModelConfig qwen2 = llama;
  qwen2.arch = Arch::kQwen2;
  qwen2.qkv_bias = true;
  qwen2.kv_heads = 2;
  const ModelConfig qwen3 = tiny_qwen3();
  runtime_->set_mode(Mode::kEval);
  for (const ModelConfig& cfg : {llama, qwen2, qwen3}) {
    SCOPED_TRACE(cfg.describe());
    CausalLM host(cfg, *slots_, 1234);
    const int batch = 2, len = std::min(cfg.seq, 24);
    std::vector<int64_t> tokens(batch * len), targets(batch * len);
    for (size_t i = 0; i < tokens.size(); ++i) {
      tokens[i] = static_cast<int64_t>((i * 31 + 7) % cfg.vocab);
      targets[i] = static_cast<int64_t>((i * 17 + 3) % cfg.vocab);
    }
    SlotCaller caller(*runtime_, -1);
    const float host_loss =
        host.forward(caller, *runtime_, tokens.data(), targets.data(), batch, len);
    DeviceCausalLM dev(host, *slots_, *runtime_, 0);
    const float dev_loss = dev.forward(tokens.data(), targets.data(), batch, len);
    EXPECT_TRUE(dev.package_slots().empty()) << "nothing is bound: every slot ran its fallback";
    expect_close(dev.download_logits(), host.logits(), 1e-4f, 1e-4f, "logits");
    EXPECT_NEAR(dev_loss, host_loss, 1e-4f * std::fabs(host_loss));
    kh_device_pool_stats_t mem = dev.memory();
    EXPECT_GT(mem.peak_bytes, host.num_parameters() * sizeof(float));
  }
  runtime_->set_mode(Mode::kTrain);
}

TEST_F(GpuDemoDevice, DeviceModelTrainsLikeTheHostModel) {
  ModelConfig qwen2 = preset("tiny");
  qwen2.arch = Arch::kQwen2;
  qwen2.qkv_bias = true;
  qwen2.o_bias = true;
  qwen2.kv_heads = 2;
  const ModelConfig qwen3 = tiny_qwen3();
  AdamConfig adam;
  adam.lr = 1e-2f;
  adam.weight_decay = 0.01f;
  runtime_->set_mode(Mode::kTrain);
  for (const ModelConfig& cfg : {preset("tiny"), qwen2, qwen3}) {
    SCOPED_TRACE(cfg.describe());
    CausalLM host(cfg, *slots_, 99);
    DeviceCausalLM dev(host, *slots_, *runtime_, 0);
    SlotCaller caller(*runtime_, -1);
    const int batch = 2, len = std::min(cfg.seq, 16);
    std::vector<int64_t> tokens(batch * len), targets(batch * len);
    for (int step = 0; step < 3; ++step) {
      for (size_t i = 0; i < tokens.size(); ++i) {
        tokens[i] = static_cast<int64_t>((i * 13 + step * 5 + 1) % cfg.vocab);
        targets[i] = static_cast<int64_t>((i * 7 + step * 3 + 2) % cfg.vocab);
      }
      host.zero_grad();
      dev.zero_grad();
      const float host_loss =
          host.forward(caller, *runtime_, tokens.data(), targets.data(), batch, len);
      const float dev_loss = dev.forward(tokens.data(), targets.data(), batch, len);
      EXPECT_NEAR(dev_loss, host_loss, 1e-4f * std::fabs(host_loss)) << "step " << step;
      host.backward(caller);
      dev.backward();
      host.adam_step(adam);
      dev.adam_step(adam);
    }
    // Weights after three AdamW steps: an element whose gradient is near zero moves by up to
    // lr * m / sqrt(v), whose sign and size depend on the last bits of that gradient (the GEMM's
    // summation order against the host loops'), so the bound is a tenth of one step (lr 1e-2);
    // a wrong gradient moves elements by whole steps. The losses above are checked tightly.
    for (const char* name : {"model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
                             "model.layers.1.mlp.up_proj.weight", "model.norm.weight"})
      expect_close(dev.download_weight(name), *host.weight(name), 1e-3f, 1e-3f, name);
    if (cfg.qkv_bias)
      expect_close(dev.download_weight("model.layers.0.self_attn.k_proj.bias"),
                   *host.weight("model.layers.0.self_attn.k_proj.bias"), 1e-4f, 1e-3f, "k bias");
    if (cfg.qk_norm)
      expect_close(dev.download_weight("model.layers.1.self_attn.q_norm.weight"),
                   *host.weight("model.layers.1.self_attn.q_norm.weight"), 1e-4f, 1e-3f, "q_norm");
  }
}

void fill_batch(std::vector<int64_t>& tokens, std::vector<int64_t>& targets, int vocab, int step) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<int64_t>((i * 13 + step * 5 + 1) % vocab);
    // The target is a fixed function of the token (a bigram the model can learn across steps).
    targets[i] = (tokens[i] * 7 + 2) % vocab;
  }
}

// Binds each slot to the built package of that name (KH_KERNEL_PACKAGES_DIR) in both modes, and
// leaves `rt` in train mode.
void bind_packages(Runtime& rt, std::initializer_list<std::pair<const char*, const char*>> slots) {
  const std::string dir = KH_KERNEL_PACKAGES_DIR;
  for (Mode mode : {Mode::kTrain, Mode::kEval})
    for (const auto& [slot, package] : slots) rt.bind(slot, dir + "/" + package, mode, 0);
  rt.set_mode(Mode::kTrain);
}

// The packages a bf16 Qwen3 needs to train its q, k and v projections as one GEMM
// (fused_qkv_trains): attention, both norms, q/k norm + RoPE.
void bind_fused_qkv_packages(Runtime& rt) {
  bind_packages(rt, {{kAttention, "attention"},
                     {kRMSNorm, "norm"},
                     {kFusedAddRMSNorm, "norm"},
                     {kQKNormRotaryEmbedding, "rotary"}});
}

DeviceModelOptions with_dtype(DLDataType dtype, int64_t chunk = 1024) {
  DeviceModelOptions o;
  o.dtype = dtype;
  o.loss_chunk_rows = chunk;
  return o;
}

TEST_F(GpuDemoDevice, Bf16ModelLogitsMatchTheFp32ModelWithinBf16Tolerance) {
  runtime_->set_mode(Mode::kEval);
  for (const ModelConfig& cfg : {preset("tiny"), tiny_qwen3()}) {
    SCOPED_TRACE(cfg.describe());
    CausalLM host(cfg, *slots_, 4321);
    DeviceCausalLM f32(host, *slots_, *runtime_, 0, with_dtype(kF32));
    DeviceCausalLM b16(host, *slots_, *runtime_, 0, with_dtype(kBF16));
    EXPECT_TRUE(same_dtype(b16.dtype(), kBF16));
    const int batch = 2, len = 24;
    std::vector<int64_t> tokens(batch * len), targets(batch * len);
    fill_batch(tokens, targets, cfg.vocab, 0);
    const float loss32 = f32.forward(tokens.data(), targets.data(), batch, len);
    const float loss16 = b16.forward(tokens.data(), targets.data(), batch, len);
    EXPECT_TRUE(same_dtype(b16.logits().dtype(), kBF16));
    // bf16 keeps 8 mantissa bits: a few roundings per layer of logits of size ~1.
    expect_close(b16.download_logits(), f32.download_logits(), 6e-2f, 4e-2f, "bf16 logits");
    EXPECT_NEAR(loss16, loss32, 2e-2f * std::fabs(loss32));
    // The last-token logits are those rows of the full ones.
    const std::vector<float> all = f32.download_logits();
    f32.forward(tokens.data(), nullptr, batch, len, DeviceCausalLM::Logits::kLast);
    ASSERT_EQ(f32.logits().shape(), (std::vector<int64_t>{batch, cfg.vocab}));
    const std::vector<float> last = f32.download_logits();
    for (int b = 0; b < batch; ++b)
      for (int v = 0; v < cfg.vocab; ++v)
        ASSERT_NEAR(last[b * cfg.vocab + v], all[(b * len + len - 1) * cfg.vocab + v], 1e-5f);
  }
  runtime_->set_mode(Mode::kTrain);
}

TEST_F(GpuDemoDevice, Bf16TrainingTracksTheFp32Losses) {
  runtime_->set_mode(Mode::kTrain);
  AdamConfig adam;
  adam.lr = 1e-2f;
  const ModelConfig cfg = tiny_qwen3();
  CausalLM host(cfg, *slots_, 77);
  DeviceCausalLM f32(host, *slots_, *runtime_, 0, with_dtype(kF32));
  DeviceCausalLM b16(host, *slots_, *runtime_, 0, with_dtype(kBF16));
  const int batch = 4, len = 32;
  std::vector<int64_t> tokens(batch * len), targets(batch * len);
  std::vector<float> l32, l16;
  for (int step = 0; step < 6; ++step) {
    fill_batch(tokens, targets, cfg.vocab, step);
    for (auto [model, losses] : {std::pair{&f32, &l32}, std::pair{&b16, &l16}}) {
      model->zero_grad();
      losses->push_back(model->forward(tokens.data(), targets.data(), batch, len));
      EXPECT_FALSE(model->logits().data()) << "a train loss materialises no logits";
      model->backward();
      model->adam_step(adam);
    }
  }
  for (size_t i = 0; i < l32.size(); ++i)
    EXPECT_NEAR(l16[i], l32[i], 3e-2f * std::fabs(l32[i])) << "step " << i;
  EXPECT_LT(l16.back(), l16.front() - 0.3f) << "bf16 training learns";
}

TEST_F(GpuDemoDevice, PackageNormsAndFusedLossTrainLikeTheRuntimesOwn) {
  // The norm package's RMSNorm and FusedAddRMSNorm (the residual add in the norm, the new
  // residual kept for backward, the normed inputs recomputed there), the softmax package's
  // fused loss (writing the LM head's zero gradient in place, or through a scratch when the
  // gradient accumulates) and, for Qwen3, the rotary package's QKNormRotaryEmbedding (the q/k
  // norms and RoPE in one op each way, rstd recomputed in the backward) and the activation
  // package's SiluAndMulRecompute (the MLP's dx and its dropped output in one backward pass)
  // against the runtime's own add + norm, norms + RoPE, chunked loss and SiluAndMul, fp32.
  Runtime rt;
  const DemoSlots slots = add_device_demo_slots(rt);
  bind_packages(rt, {{kRMSNorm, "norm"},
                     {kFusedAddRMSNorm, "norm"},
                     {kFusedLinearCrossEntropy, "softmax"},
                     {kQKNormRotaryEmbedding, "rotary"},
                     {kSiluAndMulRecompute, "activation"}});
  runtime_->set_mode(Mode::kTrain);
  AdamConfig adam;
  adam.lr = 1e-2f;
  for (const ModelConfig& cfg : {preset("tiny"), tiny_qwen3()}) {
    SCOPED_TRACE(cfg.describe());
    CausalLM host(cfg, *slots_, 11);
    DeviceCausalLM own(host, *slots_, *runtime_, 0, with_dtype(kF32, 7));
    DeviceCausalLM pkg(host, slots, rt, 0, with_dtype(kF32));
    const int batch = 2, len = 20;
    std::vector<int64_t> tokens(batch * len), targets(batch * len);
    for (int step = 0; step < 3; ++step) {
      fill_batch(tokens, targets, cfg.vocab, step);
      if (step != 1) {  // step 1 accumulates onto step 0's gradients
        own.zero_grad();
        pkg.zero_grad();
      }
      const float lo = own.forward(tokens.data(), targets.data(), batch, len);
      const float lp = pkg.forward(tokens.data(), targets.data(), batch, len);
      EXPECT_NEAR(lp, lo, 1e-4f * std::fabs(lo)) << "step " << step;
      own.backward();
      pkg.backward();
      own.adam_step(adam);
      pkg.adam_step(adam);
    }
    for (const char* name :
         {"model.embed_tokens.weight", "model.norm.weight", "model.layers.0.input_layernorm.weight",
          "model.layers.1.post_attention_layernorm.weight",
          "model.layers.1.self_attn.q_proj.weight", "model.layers.0.mlp.gate_proj.weight",
          "model.layers.1.mlp.up_proj.weight", "model.layers.0.mlp.down_proj.weight"})
      expect_close(pkg.download_weight(name), own.download_weight(name), 1e-4f, 1e-3f, name);
    if (cfg.qk_norm)
      for (const char* name :
           {"model.layers.0.self_attn.q_norm.weight", "model.layers.1.self_attn.k_norm.weight",
            "model.layers.1.self_attn.k_proj.weight"})
        expect_close(pkg.download_weight(name), own.download_weight(name), 1e-4f, 1e-3f, name);
    std::vector<const char*> served = {kRMSNorm, kFusedAddRMSNorm, kFusedLinearCrossEntropy,
                                       kSiluAndMulRecompute};
    if (cfg.qk_norm) served.push_back(kQKNormRotaryEmbedding);
    for (const char* slot : served)
      EXPECT_NE(std::find(pkg.package_slots().begin(), pkg.package_slots().end(), slot),
                pkg.package_slots().end())
          << slot << " served by its package";
    EXPECT_TRUE(pkg.refusals().empty());
  }
}

TEST_F(GpuDemoDevice, FusedQkvTrainsLikeThreeProjections) {
  // A bf16 Qwen3 with the attention, rotary and norm packages bound trains its q, k and v
  // projections as one GEMM each way (the packages reading and writing the fused tensor's columns
  // through strided views; q's, k's and v's gradients rows of one): the same losses and
  // gradients, within bf16 rounding, as three GEMMs from the same start. head_dim 64, GQA 4/2.
  Runtime rt;
  const DemoSlots slots = add_device_demo_slots(rt);
  bind_fused_qkv_packages(rt);
  const ModelConfig cfg = qwen3_d64(96);
  CausalLM host(cfg, *slots_, 21);
  DeviceModelOptions fused = with_dtype(kBF16), apart = with_dtype(kBF16);
  apart.fuse_qkv = false;
  DeviceCausalLM one(host, slots, rt, 0, fused), three(host, slots, rt, 0, apart);
  AdamConfig adam;
  adam.lr = 1e-2f;
  const int batch = 3, len = 96;
  std::vector<int64_t> tokens(batch * len), targets(batch * len);
  for (int step = 0; step < 3; ++step) {
    fill_batch(tokens, targets, cfg.vocab, step);
    float loss[2];
    int i = 0;
    for (DeviceCausalLM* m : {&one, &three}) {
      m->zero_grad();
      loss[i++] = m->forward(tokens.data(), targets.data(), batch, len);
      m->backward();
    }
    EXPECT_EQ(one.fused_qkv_layers(), cfg.layers) << "step " << step;
    EXPECT_EQ(three.fused_qkv_layers(), 0) << "step " << step;
    EXPECT_NEAR(loss[0], loss[1], 1e-2f * std::fabs(loss[1])) << "step " << step;
    // The gradients (not the weights after AdamW, whose first steps move a weight by about lr
    // whatever its gradient's size, so that a gradient near zero rounded either way in bf16
    // flips it): within bf16 rounding of the largest.
    if (step == 0)
      for (const char* name :
           {"model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.k_proj.weight",
            "model.layers.0.self_attn.v_proj.weight", "model.layers.1.self_attn.q_proj.weight",
            "model.layers.1.self_attn.k_proj.weight", "model.layers.1.self_attn.v_proj.weight",
            "model.layers.1.self_attn.q_norm.weight", "model.layers.0.input_layernorm.weight"}) {
        const std::vector<float> want = three.download_grad(name);
        float peak = 0.f;
        for (float g : want) peak = std::max(peak, std::fabs(g));
        ASSERT_GT(peak, 0.f) << name;
        expect_close(one.download_grad(name), want, 2e-2f * peak, 5e-2f, name);
      }
    one.adam_step(adam);
    three.adam_step(adam);
  }
  for (const char* slot : {kAttention, kQKNormRotaryEmbedding})
    EXPECT_NE(std::find(one.package_slots().begin(), one.package_slots().end(), slot),
              one.package_slots().end())
        << slot << " served by its package";
  EXPECT_TRUE(one.refusals().empty());
}

TEST_F(GpuDemoDevice, KeptNormedInputsTrainLikeRecomputedOnes) {
  // keep_normed: the train forward keeps each layer's two normed inputs and its rotated q and k
  // (the pool holds that much more after the forward), and the backward uses them instead of
  // computing them again: the same losses and gradients. The runtime's fp32 kernels, then the
  // bf16 model with the packages bound (one q/k/v GEMM, the q/k norm + RoPE op).
  Runtime rt;
  const DemoSlots slots = add_device_demo_slots(rt);
  bind_fused_qkv_packages(rt);
  runtime_->set_mode(Mode::kTrain);
  const ModelConfig cfg = qwen3_d64(96);
  CausalLM host(cfg, *slots_, 41);
  const int batch = 3, len = 96;
  const int64_t T = static_cast<int64_t>(batch) * len;
  const char* names[] = {"model.layers.0.self_attn.q_proj.weight",
                         "model.layers.1.self_attn.k_proj.weight",
                         "model.layers.1.self_attn.v_proj.weight",
                         "model.layers.0.self_attn.q_norm.weight",
                         "model.layers.1.self_attn.k_norm.weight",
                         "model.layers.0.input_layernorm.weight",
                         "model.layers.1.post_attention_layernorm.weight",
                         "model.layers.0.mlp.up_proj.weight",
                         "model.embed_tokens.weight"};
  for (const bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16, packages" : "fp32, the runtime's kernels");
    DeviceModelOptions keep = with_dtype(bf16 ? kBF16 : kF32), again = keep;
    keep.keep_normed = KeepNormed::kOn;  // no FromOutput slot bound: beside the inputs
    again.keep_normed = KeepNormed::kOff;
    DeviceCausalLM kept(host, bf16 ? slots : *slots_, bf16 ? rt : *runtime_, 0, keep),
        recomputed(host, bf16 ? slots : *slots_, bf16 ? rt : *runtime_, 0, again);
    std::vector<int64_t> tokens(batch * len), targets(batch * len);
    fill_batch(tokens, targets, cfg.vocab, 5);
    float loss[2];
    uint64_t held[2];
    int i = 0;
    for (DeviceCausalLM* m : {&kept, &recomputed}) {
      m->zero_grad();
      loss[i] = m->forward(tokens.data(), targets.data(), batch, len);
      held[i++] = m->memory().current_bytes;
      m->backward();
    }
    EXPECT_EQ(kept.fused_qkv_layers(), bf16 ? cfg.layers : 0);
    // Two normed inputs, q and k a layer, in the activations' dtype.
    const uint64_t kept_bytes = static_cast<uint64_t>(cfg.layers) * T *
                                (2 * cfg.hidden + cfg.q_dim() + cfg.kv_dim()) * (bf16 ? 2 : 4);
    EXPECT_GE(held[0], held[1] + kept_bytes) << "bytes held after the forward";
    EXPECT_NEAR(loss[0], loss[1], 1e-6f * std::fabs(loss[1]));
    // The forward's fused add + norm and the backward's norm may round the last bit apart;
    // atomics (the embedding's scatter-add, the attention's dq) may sum in another order.
    expect_grads_close(kept, recomputed, {std::begin(names), std::end(names)}, bf16 ? 1e-2f : 1e-5f,
                       1e-4f);
  }
}

TEST_F(GpuDemoDevice, NormedTensorsKeptInsteadOfInputsTrainLikeRecomputedOnes) {
  // keep_normed auto with the FromOutput slots bound: the train forward keeps the two normed
  // inputs instead of the residuals (FusedAddRMSNormFromOutput) and q and k normed and rotated in
  // place over their projections with each row's rstd (QKNormRotaryEmbeddingFromOutput), so the
  // pool holds no more after the forward than with everything recomputed (but the rstd), and
  // the backwards from those outputs give the same losses and gradients within bf16 rounding.
  // The bf16 Qwen3 with one q/k/v GEMM, then an fp32 Llama (the norms only: its q and k need no
  // norm) with the norm package's fp32 kernels.
  Runtime rt;
  const DemoSlots slots = add_device_demo_slots(rt);
  bind_packages(rt, {{kAttention, "attention"},
                     {kRMSNorm, "norm"},
                     {kFusedAddRMSNorm, "norm"},
                     {kQKNormRotaryEmbedding, "rotary"},
                     {kFusedAddRMSNormFromOutput, "norm"},
                     {kQKNormRotaryEmbeddingFromOutput, "rotary"}});
  for (const bool bf16 : {true, false}) {
    const ModelConfig cfg = bf16 ? qwen3_d64(96) : preset("tiny");
    SCOPED_TRACE(bf16 ? "bf16 Qwen3" : "fp32 Llama");
    const int batch = 3, len = static_cast<int>(cfg.seq);
    const int64_t T = static_cast<int64_t>(batch) * len;
    CausalLM host(cfg, *slots_, 43);
    DeviceModelOptions from_out = with_dtype(bf16 ? kBF16 : kF32), again = from_out;
    from_out.keep_normed = KeepNormed::kAuto;
    again.keep_normed = KeepNormed::kOff;
    DeviceCausalLM kept(host, slots, rt, 0, from_out), recomputed(host, slots, rt, 0, again);
    std::vector<int64_t> tokens(batch * len), targets(batch * len);
    // Two batches on the same weights (an AdamW step between would move weights whose gradients
    // round apart in bf16 by about lr either way: FusedQkvTrainsLikeThreeProjections).
    for (int step = 0; step < 2; ++step) {
      SCOPED_TRACE(testing::Message() << "batch " << step);
      fill_batch(tokens, targets, cfg.vocab, 9 + step);
      float loss[2];
      uint64_t held[2];
      int i = 0;
      for (DeviceCausalLM* m : {&kept, &recomputed}) {
        m->zero_grad();
        loss[i] = m->forward(tokens.data(), targets.data(), batch, len);
        held[i++] = m->memory().current_bytes;
        m->backward();
      }
      if (bf16) {
        EXPECT_EQ(kept.fused_qkv_layers(), cfg.layers);
      }
      // The rows' fp32 rstd of q and k is all it holds more (Qwen3; the pool's size classes
      // round each up by at most a quarter), far less than the residuals (fp32 Llama: 98 KB) or
      // the q/k projections kept beside it would be.
      const uint64_t rstd_bytes =
          bf16 ? static_cast<uint64_t>(cfg.layers) * T * (cfg.heads + cfg.kv_heads) * 4 : 0;
      EXPECT_LE(held[0], held[1] + 2 * rstd_bytes + 16384) << "bytes held after the forward";
      EXPECT_NEAR(loss[0], loss[1], 1e-6f * std::fabs(loss[1]));
      std::vector<const char*> names = {"model.layers.0.self_attn.q_proj.weight",
                                        "model.layers.1.self_attn.k_proj.weight",
                                        "model.layers.1.self_attn.v_proj.weight",
                                        "model.layers.0.input_layernorm.weight",
                                        "model.layers.1.post_attention_layernorm.weight",
                                        "model.layers.0.mlp.up_proj.weight",
                                        "model.embed_tokens.weight"};
      if (bf16) {
        names.push_back("model.layers.0.self_attn.q_norm.weight");
        names.push_back("model.layers.1.self_attn.k_norm.weight");
      }
      // xhat from the bf16 output (y / w) rather than from the residual: a rounding of y more.
      expect_grads_close(kept, recomputed, names, bf16 ? 2e-2f : 1e-4f, 1e-3f);
    }
    std::vector<const char*> served = {kFusedAddRMSNormFromOutput};
    if (bf16) served.push_back(kQKNormRotaryEmbeddingFromOutput);
    for (const char* slot : served)
      EXPECT_NE(std::find(kept.package_slots().begin(), kept.package_slots().end(), slot),
                kept.package_slots().end())
          << slot << " served by its package";
    EXPECT_TRUE(kept.refusals().empty());
  }
}

TEST_F(GpuDemoDevice, GradientsLiveFromTheBackwardToZeroGrad) {
  // zero_grad releases every gradient (PyTorch's set_to_none) and the backward takes each layer's
  // from the pool when it reaches the layer: after zero_grad the pool holds at least the fp32
  // gradients less and none can be read; a train forward takes only the LM head's (the fused
  // loss writes it); AdamW with no gradient moves nothing (weight decay included) and counts no
  // step (a real step after it equals one on a model that never had it); the same batch gives the
  // same gradients again (the fused q/k/v rows of the bf16 model included), and two backwards
  // without zero_grad between add up. The runtime's fp32 kernels, then the bf16 model with the
  // packages bound (one q/k/v GEMM, the fused loss, the q/k norm + RoPE op).
  Runtime rt;
  const DemoSlots slots = add_device_demo_slots(rt);
  bind_packages(rt, {{kAttention, "attention"},
                     {kRMSNorm, "norm"},
                     {kFusedAddRMSNorm, "norm"},
                     {kFusedLinearCrossEntropy, "softmax"},
                     {kQKNormRotaryEmbedding, "rotary"}});
  runtime_->set_mode(Mode::kTrain);
  const ModelConfig cfg = qwen3_d64(96);  // tied: the LM head is the embedding
  CausalLM host(cfg, *slots_, 31);
  const char* names[] = {"model.embed_tokens.weight",
                         "model.norm.weight",
                         "model.layers.0.self_attn.q_proj.weight",
                         "model.layers.1.self_attn.v_proj.weight",
                         "model.layers.1.self_attn.k_norm.weight",
                         "model.layers.0.mlp.up_proj.weight",
                         "model.layers.1.mlp.down_proj.weight"};
  AdamConfig adam;
  adam.lr = 1e-2f;
  adam.weight_decay = 0.1f;
  for (const bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "bf16, packages" : "fp32, the runtime's kernels");
    auto model = [&] {
      return std::make_unique<DeviceCausalLM>(host, bf16 ? slots : *slots_, bf16 ? rt : *runtime_,
                                              0, with_dtype(bf16 ? kBF16 : kF32));
    };
    std::unique_ptr<DeviceCausalLM> owned = model();
    DeviceCausalLM& m = *owned;
    const int batch = 2, len = 48;
    std::vector<int64_t> tokens(batch * len), targets(batch * len);
    fill_batch(tokens, targets, cfg.vocab, 0);
    auto backward = [&](DeviceCausalLM& x) {
      x.forward(tokens.data(), targets.data(), batch, len);
      x.backward();
    };
    auto grads = [&] {
      std::vector<std::vector<float>> g;
      for (const char* name : names) g.push_back(m.download_grad(name));
      return g;
    };
    auto expect_no_grad = [&](const char* name) {
      try {
        m.download_grad(name);
        ADD_FAILURE() << name << ": a gradient where none should be";
      } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput) << e.what();
      }
    };
    backward(m);
    EXPECT_EQ(m.fused_qkv_layers(), bf16 ? cfg.layers : 0);
    const std::vector<std::vector<float>> first = grads();
    const uint64_t with = m.memory().current_bytes;
    m.zero_grad();
    EXPECT_LE(m.memory().current_bytes + m.num_parameters() * sizeof(float), with);
    for (const char* name : names) expect_no_grad(name);
    // A train forward: the loss's gradient for the LM head (the embedding, tied), no layer's.
    m.forward(tokens.data(), targets.data(), batch, len);
    EXPECT_EQ(m.download_grad(names[0]).size(), static_cast<size_t>(cfg.vocab) * cfg.hidden);
    for (size_t i = 1; i < std::size(names); ++i) expect_no_grad(names[i]);
    m.zero_grad();  // drops that forward's loss gradient too: a backward now is refused
    try {
      m.backward();
      ADD_FAILURE() << "a backward after zero_grad without a forward";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput) << e.what();
    }
    // AdamW with no gradient at all: no weight moves, no step is counted.
    std::vector<std::vector<float>> before;
    for (const char* name : names) before.push_back(m.download_weight(name));
    m.adam_step(adam);
    for (size_t i = 0; i < std::size(names); ++i)
      EXPECT_EQ(m.download_weight(names[i]), before[i]) << names[i];
    backward(m);
    const std::vector<std::vector<float>> again = grads();
    backward(m);  // no zero_grad: added to the gradients
    const std::vector<std::vector<float>> twice = grads();
    for (size_t i = 0; i < first.size(); ++i) {
      float peak = 0.f;
      for (float g : first[i]) peak = std::max(peak, std::fabs(g));
      ASSERT_GT(peak, 0.f) << names[i];
      // Atomics (the embedding's scatter-add, the attention's dq) may sum in another order, and
      // in bf16 a last bit that differs may round the other way.
      const float atol = (bf16 ? 1e-2f : 1e-5f) * peak;
      expect_close(again[i], first[i], atol, 1e-5f, names[i]);
      std::vector<float> doubled = first[i];
      for (float& g : doubled) g *= 2.f;
      expect_close(twice[i], doubled, 2 * atol, 1e-4f, std::string(names[i]) + " x 2");
    }
    // One real step (the summed gradients of the two backwards) against a model that never had
    // the empty step: the same bias corrections, so the same weights, but where a gradient near
    // zero took the other sign from the atomics' order (AdamW's first step moves a weight by about
    // lr whatever its gradient's size). Had the empty step been counted, every weight would have
    // moved by about 0.74 lr instead of lr.
    std::unique_ptr<DeviceCausalLM> fresh = model();
    fresh->zero_grad();
    backward(*fresh);
    backward(*fresh);
    m.adam_step(adam);
    fresh->adam_step(adam);
    for (const char* name : names) {
      const std::vector<float> a = m.download_weight(name), b = fresh->download_weight(name);
      ASSERT_EQ(a.size(), b.size()) << name;
      size_t apart = 0;
      for (size_t i = 0; i < a.size(); ++i) apart += std::fabs(a[i] - b[i]) > 0.1f * adam.lr;
      EXPECT_LE(apart, a.size() / 100) << name << ": weights after one step";
    }
  }
}

TEST_F(GpuDemoDevice, ChunkedLossAndGradientsEqualTheFullLogitsOnes) {
  // The host model's loss takes the full [tokens, vocab] logits; the device model's train loss
  // goes 5 tokens at a time (7 chunks, the last one short) or in one chunk.
  runtime_->set_mode(Mode::kTrain);
  AdamConfig adam;
  adam.lr = 1e-2f;
  const ModelConfig cfg = tiny_qwen3();
  CausalLM host(cfg, *slots_, 5);
  DeviceCausalLM chunked(host, *slots_, *runtime_, 0, with_dtype(kF32, 5));
  DeviceCausalLM whole(host, *slots_, *runtime_, 0, with_dtype(kF32, 1 << 20));
  SlotCaller caller(*runtime_, -1);
  const int batch = 2, len = 16;
  std::vector<int64_t> tokens(batch * len), targets(batch * len);
  for (int step = 0; step < 2; ++step) {
    fill_batch(tokens, targets, cfg.vocab, step);
    host.zero_grad();
    chunked.zero_grad();
    whole.zero_grad();
    const float lh = host.forward(caller, *runtime_, tokens.data(), targets.data(), batch, len);
    const float lc = chunked.forward(tokens.data(), targets.data(), batch, len);
    const float lw = whole.forward(tokens.data(), targets.data(), batch, len);
    EXPECT_NEAR(lc, lh, 1e-4f * std::fabs(lh)) << "step " << step;
    EXPECT_NEAR(lw, lh, 1e-4f * std::fabs(lh)) << "step " << step;
    host.backward(caller);
    chunked.backward();
    whole.backward();
    host.adam_step(adam);
    chunked.adam_step(adam);
    whole.adam_step(adam);
  }
  // The tied embedding is the LM head: its gradient is the chunked GEMMs' sum.
  for (const char* name :
       {"model.embed_tokens.weight", "model.norm.weight", "model.layers.1.mlp.down_proj.weight"}) {
    expect_close(chunked.download_weight(name), *host.weight(name), 1e-3f, 1e-3f, name);
    expect_close(chunked.download_weight(name), whole.download_weight(name), 1e-4f, 1e-4f, name);
  }
  // Eval with targets and last-token logits takes the chunked loss too: the full one's value.
  runtime_->set_mode(Mode::kEval);
  fill_batch(tokens, targets, cfg.vocab, 9);
  const float full = whole.forward(tokens.data(), targets.data(), batch, len);
  const float by_chunks =
      chunked.forward(tokens.data(), targets.data(), batch, len, DeviceCausalLM::Logits::kLast);
  EXPECT_NEAR(by_chunks, full, 1e-5f * std::fabs(full));
  runtime_->set_mode(Mode::kTrain);
}

TEST_F(GpuDemoDevice, RandomInitOnTheDeviceIsSeededAndScaled) {
  runtime_->set_mode(Mode::kEval);
  ModelConfig cfg = tiny_qwen3();
  cfg.hidden = 128;
  cfg.ffn = 256;
  const std::map<std::string, std::vector<float>> none;
  DeviceCausalLM a(cfg, none, 11, *slots_, *runtime_, 0, with_dtype(kBF16));
  DeviceCausalLM b(cfg, none, 11, *slots_, *runtime_, 0, with_dtype(kBF16));
  DeviceCausalLM c(cfg, none, 12, *slots_, *runtime_, 0, with_dtype(kBF16));
  const std::string q = "model.layers.0.self_attn.q_proj.weight";
  const std::vector<float> wa = a.download_weight(q);
  EXPECT_EQ(wa, b.download_weight(q));
  EXPECT_NE(wa, c.download_weight(q));
  double sum = 0, sq = 0;
  for (float v : wa) {
    sum += v;
    sq += static_cast<double>(v) * v;
  }
  const double mean = sum / wa.size(), sd = std::sqrt(sq / wa.size() - mean * mean);
  EXPECT_NEAR(mean, 0.0, 0.01);
  EXPECT_NEAR(sd, init_stddev(cfg, q), 0.05 * init_stddev(cfg, q));
  for (float v : a.download_weight("model.norm.weight")) ASSERT_EQ(v, 1.f);
  EXPECT_EQ(a.num_parameters(), CausalLM(cfg, *slots_, 1).num_parameters());
  const int batch = 2, len = 16;
  std::vector<int64_t> tokens(batch * len), targets(batch * len);
  fill_batch(tokens, targets, cfg.vocab, 0);
  const float loss = a.forward(tokens.data(), targets.data(), batch, len);
  EXPECT_NEAR(loss, std::log(static_cast<float>(cfg.vocab)), 1.0f) << "a fresh model guesses";
  runtime_->set_mode(Mode::kTrain);
}

TEST_F(GpuDemoDevice, ShapeAndDtypeErrorsNameTheOpAndTensor) {
  DeviceTensor x = empty({4, 8}), w = empty({7}), y = empty({4, 8});
  try {
    kernels_->rms_norm(*stream_, x, w, 1e-6f, y, nullptr);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
    EXPECT_NE(std::string(e.what()).find("rms_norm (device kernel): weight is float32[7]"),
              std::string::npos)
        << e.what();
  }
  DeviceTensor tokens = empty({4}, kF32);
  DeviceTensor table = empty({10, 8});
  EXPECT_THROW(kernels_->embedding_forward(*stream_, table, tokens, y), Error);
}

TEST_F(GpuDemoDevice, StridedArgViewsRowsAndRefusesElementsOutsideItsBase) {
  DeviceTensor qkv = empty({4, 12});  // 4 tokens of q (8) + k (4)
  const StridedArg k(qkv, 8, {4, 2, 2}, {12, 2, 1});
  const DLTensor* t = k.dl();
  EXPECT_EQ(t->data, static_cast<char*>(qkv.data()) + 8 * sizeof(float));
  ASSERT_EQ(t->ndim, 3);
  EXPECT_EQ(t->shape[0], 4);
  EXPECT_EQ(t->strides[0], 12);
  EXPECT_EQ(t->strides[2], 1);
  EXPECT_EQ(t->dtype.bits, 32);
  // The last row's k ends at element 47, the base's last: one more column is outside.
  EXPECT_THROW(StridedArg(qkv, 9, {4, 2, 2}, {12, 2, 1}), Error);
  EXPECT_THROW(StridedArg(qkv, 8, {5, 2, 2}, {12, 2, 1}), Error);
  EXPECT_THROW(StridedArg(qkv, 0, {4, 12}, {12}), Error) << "one stride per dimension";
  EXPECT_THROW(StridedArg(qkv, -1, {1}, {1}), Error);
  try {
    StridedArg(qkv, 0, {2, 2}, {-1, 1});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidInput);
    EXPECT_NE(std::string(e.what()).find("strided view [2, 2] with strides [-1, 1]"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace kh::demo
