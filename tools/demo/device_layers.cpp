// DeviceCausalLM's layers (device_model.h): the calls each op makes (the GEMM service, a slot's
// package op or the runtime's kernel) and one decoder layer's forward and backward, the host
// model's layer_forward / layer_backward on the device.
#include "tools/demo/device_model.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>

#include "kernel_hub/kernel_hub.hpp"
#include "tools/demo/device_linear.h"

namespace kh::demo {

// ---- the layers' calls --------------------------------------------------------------------

namespace {

// A FromOutput slot refused a backward after its forward dropped (or overwrote) the inputs the
// other backward reads: nothing can compute it now.
[[noreturn]] void from_output_refused(const char* slot, const char* what, const char* lost) {
  throw Error(ErrorKind::kIo, fmt::format("device model: {} refused {} ({}); {}: train with "
                                          "--keep-normed off",
                                          slot, what, last_op_error(), lost));
}

}  // namespace

void DeviceCausalLM::linear(const DeviceTensor& x, const Param& w, const Param* bias,
                            DeviceTensor& y) {
  timed(Phase::kGemm, [&] { linear_forward(stream_, x, run(w), y); });
  if (bias) kernels_.bias_add(stream_, y, run(*bias));
}

void DeviceCausalLM::linear_grad(const DeviceTensor& x, Param& w, Param* bias,
                                 const DeviceTensor& dy, DeviceTensor* dx, bool accumulate_dx) {
  const bool fresh = take_zero(w);
  timed(Phase::kGemm,
        [&] { linear_backward(stream_, x, run(w), dy, dx, &w.g, accumulate_dx, !fresh); });
  if (bias) {
    clear_if_zero(*bias);
    kernels_.column_sum_add(stream_, dy, bias->g);
  }
}

void DeviceCausalLM::norm(const DeviceTensor& x, const Param& w, DeviceTensor& y,
                          DeviceTensor* rstd) {
  if (bound(slots_.rms_norm)) {
    std::vector<kh_arg_t> args = {tensor_arg(&x), tensor_arg(&run(w)), float_arg(cfg_.eps),
                                  tensor_arg(&y)};
    if (rstd) args.push_back(tensor_arg(rstd));
    if (call_slot(slots_.rms_norm, kRMSNorm, false, args)) return;
  }
  kernels_.rms_norm(stream_, x, run(w), cfg_.eps, y, rstd);
}

// The partial rows the norm package's backward reduces dweight through: one per backward CTA,
// and W sets the backward's parallelism, so it is sized for the whole GPU as the package
// recommends (kh_norm_workspace_rows: CTAs for about 512 threads a multiprocessor of
// kh_device_get_info's count, which for bf16 rows of up to 4096 columns and the q/k norms' head_dim
// rows is 4 CTAs of 128 threads; fewer for longer rows), not the host model's 64, which made the
// Qwen3-0.6B step's RMSNorm backward 200 ms; 16 a multiprocessor was 1 ms a step slower than 4.
DeviceTensor DeviceCausalLM::norm_workspace(int64_t rows, int64_t cols) {
  const int64_t per_sm = cols <= 4096 ? 4 : std::max<int64_t>(1, 4 * 4096 / cols);
  return empty(
      {std::clamp<int64_t>(per_sm * multiprocessors_, 1, std::max<int64_t>(1, rows)), cols});
}

void DeviceCausalLM::norm_backward(const DeviceTensor& dy, const DeviceTensor& x, Param& w,
                                   const DeviceTensor& rstd, DeviceTensor& dx) {
  const int64_t C = w.w.numel(), R = x.numel() / C;
  if (bound(slots_.rms_norm)) {
    DeviceTensor dweight = act({C});  // x's dtype
    DeviceTensor workspace = norm_workspace(R, C);
    if (call_slot(slots_.rms_norm, kRMSNorm, true,
                  {tensor_arg(&dy), tensor_arg(&x), tensor_arg(&run(w)), tensor_arg(&rstd),
                   tensor_arg(&dx), tensor_arg(&dweight), tensor_arg(&workspace)})) {
      add_grad(w, dweight);  // the op overwrites dweight; the runtime adds
      return;
    }
  }
  DeviceTensor dweight = empty({C});
  kernels_.rms_norm_backward(stream_, dy, x, run(w), rstd, dx, dweight);
  add_grad(w, dweight);
}

void DeviceCausalLM::renorm(const DeviceTensor& x, const Param& w, DeviceTensor& y) {
  const int64_t rows = x.numel() / w.w.numel();
  DeviceTensor rstd = train_ ? empty({rows}) : DeviceTensor();
  norm(x, w, y, train_ ? &rstd : nullptr);
}

DeviceTensor DeviceCausalLM::add_norm(const DeviceTensor& branch, DeviceTensor residual,
                                      const Param& w, DeviceTensor& y, DeviceTensor* rstd) {
  if (!branch.data()) {
    norm(residual, w, y, rstd);
    return residual;
  }
  DeviceTensor out = train_ ? act(residual.shape()) : residual.view(residual.shape());
  if (bound(slots_.fused_add_rms_norm)) {
    std::vector<kh_arg_t> args = {tensor_arg(&branch), tensor_arg(&residual), tensor_arg(&run(w)),
                                  float_arg(cfg_.eps), tensor_arg(&y),        tensor_arg(&out)};
    if (rstd) args.push_back(tensor_arg(rstd));
    if (call_slot(slots_.fused_add_rms_norm, kFusedAddRMSNorm, false, args)) return out;
  }
  kernels_.add(stream_, residual, branch, out);
  norm(out, w, y, rstd);
  return out;
}

void DeviceCausalLM::add_norm_backward(const DeviceTensor& dy, const DeviceTensor* dresidual,
                                       const DeviceTensor& residual_out, Param& w,
                                       const DeviceTensor& rstd, DeviceTensor& dx,
                                       bool from_output) {
  const uint32_t slot =
      from_output ? slots_.fused_add_rms_norm_from_output : slots_.fused_add_rms_norm;
  if (bound(slot)) {
    const int64_t C = w.w.numel(), R = residual_out.numel() / C;
    DeviceTensor dweight = act({C});
    DeviceTensor workspace = norm_workspace(R, C);
    if (call_slot(
            slot, from_output ? kFusedAddRMSNormFromOutput : kFusedAddRMSNorm, true,
            {tensor_arg(&dy), tensor_arg(dresidual), tensor_arg(&residual_out), tensor_arg(&run(w)),
             tensor_arg(&rstd), tensor_arg(&dx), tensor_arg(&dweight), tensor_arg(&workspace)})) {
      add_grad(w, dweight);
      return;
    }
  }
  if (from_output)
    from_output_refused(kFusedAddRMSNormFromOutput, "the norm's backward from its output",
                        "the residual it would need instead was not kept");
  norm_backward(dy, residual_out, w, rstd, dx);
  if (dresidual) kernels_.add(stream_, dx, *dresidual, dx);
}

bool DeviceCausalLM::qknr_forward(const Layer& L, kh_arg_t qi, kh_arg_t ki, DeviceTensor& q,
                                  DeviceTensor& k) {
  if (!train_ || !bound(slots_.qk_norm_rotary)) return false;
  const int64_t T = q.shape()[0], NH = cfg_.heads, NKV = cfg_.kv_heads, HD = cfg_.head_dim;
  DeviceTensor qo = q.view({T, NH, HD}), ko = k.view({T, NKV, HD});
  return call_slot(slots_.qk_norm_rotary, kQKNormRotaryEmbedding, false,
                   {tensor_arg(&positions_), qi, ki, tensor_arg(&run(*L.q_norm)),
                    tensor_arg(&run(*L.k_norm)), float_arg(cfg_.eps), tensor_arg(&cos_),
                    tensor_arg(&sin_), int_arg(1), tensor_arg(&qo), tensor_arg(&ko)});
}

bool DeviceCausalLM::qk_from_projections(const Layer& L, const DeviceTensor& q_pre,
                                         const DeviceTensor& k_pre, DeviceTensor& q,
                                         DeviceTensor& k, DeviceTensor* rstd_q,
                                         DeviceTensor* rstd_k) {
  const int64_t T = q_pre.shape()[0], NH = cfg_.heads, NKV = cfg_.kv_heads, HD = cfg_.head_dim;
  const DeviceTensor qi = q_pre.view({T, NH, HD}), ki = k_pre.view({T, NKV, HD});
  if (qknr_forward(L, tensor_arg(&qi), tensor_arg(&ki), q, k)) return true;
  DeviceTensor qn = q.view({T * NH, HD}), kn = k.view({T * NKV, HD});
  if (rstd_q) {
    norm(q_pre.view({T * NH, HD}), *L.q_norm, qn, rstd_q);
    norm(k_pre.view({T * NKV, HD}), *L.k_norm, kn, rstd_k);
  } else {
    renorm(q_pre.view({T * NH, HD}), *L.q_norm, qn);
    renorm(k_pre.view({T * NKV, HD}), *L.k_norm, kn);
  }
  DeviceTensor q3 = q.view({T, NH, HD}), k3 = k.view({T, NKV, HD});
  rotary(q3, k3, false);
  return false;
}

// The fused q/k/v projection's parts as strided views of s.qkv ([T, q_dim + 2 kv_dim]).
DeviceCausalLM::QkvViews DeviceCausalLM::qkv_views(const DeviceTensor& qkv) const {
  const int64_t T = qkv.shape()[0], W = qkv.shape()[1], Q = cfg_.q_dim(), KV = cfg_.kv_dim();
  const int64_t NH = cfg_.heads, NKV = cfg_.kv_heads, HD = cfg_.head_dim, S = len_, B = T / S;
  return {StridedArg(qkv, 0, {T, NH, HD}, {W, HD, 1}), StridedArg(qkv, Q, {T, NKV, HD}, {W, HD, 1}),
          StridedArg(qkv, Q + KV, {B, S, NKV, HD}, {S * W, W, HD, 1}),
          StridedArg(qkv, 0, {B, S, NH, HD}, {S * W, W, HD, 1}),
          StridedArg(qkv, Q, {B, S, NKV, HD}, {S * W, W, HD, 1})};
}

void DeviceCausalLM::unfuse_qkv(Saved& s) {
  const int64_t T = s.qkv.shape()[0], Q = cfg_.q_dim(), KV = cfg_.kv_dim();
  // q and k rotated in place (qk_from_output) are the forward's q and k, not the projections.
  DeviceTensor& q = s.qk_from_output ? s.q : s.q_pre;
  DeviceTensor& k = s.qk_from_output ? s.k : s.k_pre;
  q = act({T, Q});
  k = act({T, KV});
  s.v = act({T, KV});
  kernels_.copy_columns(stream_, s.qkv, 0, q, 0, Q);
  kernels_.copy_columns(stream_, s.qkv, Q, k, 0, KV);
  kernels_.copy_columns(stream_, s.qkv, Q + KV, s.v, 0, KV);
  s.qkv = DeviceTensor();
}

// head_dim a multiple of 8 keeps the views' token stride and column offsets on 16 bytes, which
// is all the packages ask of a layout beyond what they ask of the unfused tensors: a refusal
// (which turns the slot off for good, call_slot) is then never the fused layout's.
bool DeviceCausalLM::fused_qkv_trains(const Layer& L) const {
  return options_.fuse_qkv && train_ && L.qkv && L.q_norm && cfg_.head_dim % 8 == 0 &&
         bound(slots_.qk_norm_rotary) && attention_bound();
}

bool DeviceCausalLM::qknr_backward(Layer& L, kh_arg_t qi, kh_arg_t ki, const DeviceTensor& dq3,
                                   const DeviceTensor& dk3, kh_arg_t dqi, kh_arg_t dki,
                                   const Saved* from_output) {
  const uint32_t slot = from_output ? slots_.qk_norm_rotary_from_output : slots_.qk_norm_rotary;
  const char* name = from_output ? kQKNormRotaryEmbeddingFromOutput : kQKNormRotaryEmbedding;
  const int64_t HD = cfg_.head_dim;
  DeviceTensor dqw = act({HD}), dkw = act({HD});
  // One partial row of both weights' gradients per walker CTA: the package's bf16 kernel keeps
  // 2 of its 256-thread CTAs resident a multiprocessor (128 registers a thread), so 2 a
  // multiprocessor run in one wave.
  DeviceTensor workspace = empty({std::max<int64_t>(1, 2 * multiprocessors_), 2 * HD});
  // From the output: q and k rotated, the forward's rstd, no eps.
  std::vector<kh_arg_t> args = {tensor_arg(&positions_), tensor_arg(&dq3), tensor_arg(&dk3), qi,
                                ki};
  if (from_output) {
    args.push_back(tensor_arg(&from_output->rstd_q));
    args.push_back(tensor_arg(&from_output->rstd_k));
  }
  args.push_back(tensor_arg(&run(*L.q_norm)));
  args.push_back(tensor_arg(&run(*L.k_norm)));
  if (!from_output) args.push_back(float_arg(cfg_.eps));
  for (kh_arg_t a : {tensor_arg(&cos_), tensor_arg(&sin_), int_arg(1), dqi, dki, tensor_arg(&dqw),
                     tensor_arg(&dkw), tensor_arg(&workspace)})
    args.push_back(a);
  if (!(bound(slot) && call_slot(slot, name, true, args))) {
    if (from_output)
      from_output_refused(name, "the backward of the q/k norms and RoPE it ran in place",
                          "the q/k projections it would need instead were overwritten");
    return false;
  }
  add_grad(*L.q_norm, dqw);
  add_grad(*L.k_norm, dkw);
  return true;
}

bool DeviceCausalLM::qknr_forward_in_place(const Layer& L, Saved& s) {
  if (!bound(slots_.qk_norm_rotary_from_output)) return false;
  const int64_t T = s.qkv.shape()[0];
  DeviceTensor rq = empty({T * cfg_.heads}), rk = empty({T * cfg_.kv_heads});
  const QkvViews in = qkv_views(s.qkv);
  if (!call_slot(slots_.qk_norm_rotary_from_output, kQKNormRotaryEmbeddingFromOutput, false,
                 {tensor_arg(&positions_), tensor_arg(&in.q), tensor_arg(&in.k),
                  tensor_arg(&run(*L.q_norm)), tensor_arg(&run(*L.k_norm)), float_arg(cfg_.eps),
                  tensor_arg(&cos_), tensor_arg(&sin_), int_arg(1), tensor_arg(&in.q),
                  tensor_arg(&in.k), tensor_arg(&rq), tensor_arg(&rk)}))
    return false;
  s.rstd_q = std::move(rq);
  s.rstd_k = std::move(rk);
  s.qk_from_output = true;
  return true;
}

bool DeviceCausalLM::norms_from_output() const {
  return train_ && options_.keep_normed != KeepNormed::kOff &&
         bound(slots_.fused_add_rms_norm_from_output);
}

bool DeviceCausalLM::keeps_normed_inputs() const {
  return train_ && (options_.keep_normed == KeepNormed::kOn || norms_from_output());
}

void DeviceCausalLM::rotary(DeviceTensor& q3, DeviceTensor& k3, bool backward) {
  if (bound(slots_.rotary) && call_slot(slots_.rotary, kRotaryEmbedding, backward,
                                        {tensor_arg(&positions_), tensor_arg(&q3), tensor_arg(&k3),
                                         tensor_arg(&cos_), tensor_arg(&sin_), int_arg(1)}))
    return;
  kernels_.rotary(stream_, positions_, q3, &k3, cos_, sin_, /*neox=*/true, backward);
}

// ---- one decoder layer: the host model's layer_forward / layer_backward on the device ------

void DeviceCausalLM::layer_forward(Layer& L, Saved& s, DeviceTensor& h, DeviceTensor& branch) {
  const int64_t H = cfg_.hidden, Q = cfg_.q_dim(), KV = cfg_.kv_dim(), F = cfg_.ffn;
  const int64_t NH = cfg_.heads, NKV = cfg_.kv_heads, HD = cfg_.head_dim;
  const int64_t B = batch_, S = len_, T = B * S;
  s = Saved{};  // nothing of an earlier forward that no backward consumed (its qkv, say)
  if (train_) {
    s.rstd1 = empty({T});
    s.rstd2 = empty({T});
  }
  DeviceTensor a = act({T, H});
  h = add_norm(branch, std::move(h), *L.attn_norm, a, train_ ? &s.rstd1 : nullptr);
  // The residual is kept for the norm's backward unless that reads the norm's output.
  s.norm_from_output = norms_from_output();
  if (train_ && !s.norm_from_output) s.h_in = h.view(h.shape());
  const bool keep = keeps_normed_inputs();
  if (keep) s.attn_in = a.view(a.shape());
  // Training with the q/k norms and the packages' attention: q, k and v from one GEMM into s.qkv,
  // whose columns the packages read (and whose gradient's columns they write) in place; should a
  // package refuse, the parts are copied apart (unfuse_qkv) for the runtime's own kernels. With
  // QKNormRotaryEmbeddingFromOutput (keep_normed), q and k are normed and rotated in place.
  bool fused_qk = false;  // q and k written from s.qkv, rstd_q and rstd_k not
  if (fused_qkv_trains(L)) {
    s.qkv = act({T, Q + 2 * KV});
    linear(a, *L.qkv, nullptr, s.qkv);
    fused_qk = options_.keep_normed != KeepNormed::kOff && qknr_forward_in_place(L, s);
    if (!fused_qk) {
      s.q = act({T, Q});
      s.k = act({T, KV});
      QkvViews in = qkv_views(s.qkv);
      fused_qk = qknr_forward(L, tensor_arg(&in.q), tensor_arg(&in.k), s.q, s.k);
      if (!fused_qk) unfuse_qkv(s);
    }
  } else {
    s.q = act({T, Q});
    s.k = act({T, KV});
    s.v = act({T, KV});
    linear(a, *L.wv, L.bv, s.v);
    if (L.q_norm) {
      s.q_pre = act({T, Q});
      s.k_pre = act({T, KV});
      linear(a, *L.wq, L.bq, s.q_pre);
      linear(a, *L.wk, L.bk, s.k_pre);
    } else {
      linear(a, *L.wq, L.bq, s.q);
      linear(a, *L.wk, L.bk, s.k);
    }
  }
  if (L.q_norm && !fused_qk) {  // Qwen3: RMSNorm over each head's head_dim, before RoPE
    if (train_) {
      s.rstd_q = empty({T * NH});
      s.rstd_k = empty({T * NKV});
    }
    if (qk_from_projections(L, s.q_pre, s.k_pre, s.q, s.k, train_ ? &s.rstd_q : nullptr,
                            train_ ? &s.rstd_k : nullptr)) {
      s.rstd_q = DeviceTensor();  // not written: the fused backward recomputes them
      s.rstd_k = DeviceTensor();
    }
  } else if (!L.q_norm) {
    DeviceTensor q3 = s.q.view({T, NH, HD}), k3 = s.k.view({T, NKV, HD});
    rotary(q3, k3, false);
  }
  a = DeviceTensor();
  s.attn = act({B, S, NH, HD});
  if (train_) s.lse = empty({NH, T});
  DeviceTensor* lse = train_ ? &s.lse : nullptr;
  bool attended = false;
  if (attention_bound()) {
    std::optional<QkvViews> fused;
    DeviceTensor q4, k4, v4;
    if (s.qkv.data())
      fused = qkv_views(s.qkv);
    else
      v4 = s.v.view({B, S, NKV, HD});
    const bool qk_in_qkv = !s.q.data();  // (qk_from_output)
    if (!qk_in_qkv) {
      q4 = s.q.view({B, S, NH, HD});
      k4 = s.k.view({B, S, NKV, HD});
    }
    attended = call_slot(slots_.attention, kAttention, false,
                         {qk_in_qkv ? tensor_arg(&fused->q4) : tensor_arg(&q4),
                          qk_in_qkv ? tensor_arg(&fused->k4) : tensor_arg(&k4),
                          fused ? tensor_arg(&fused->v) : tensor_arg(&v4), tensor_arg(nullptr),
                          tensor_arg(nullptr), int_arg(S), int_arg(1), int_arg(-1),
                          float_arg(attention_scale()), tensor_arg(&s.attn), tensor_arg(lse)});
  }
  if (!attended) {
    if (s.qkv.data()) unfuse_qkv(s);  // the runtime's attention takes contiguous tensors
    DeviceTensor q4 = s.q.view({B, S, NH, HD}), k4 = s.k.view({B, S, NKV, HD});
    DeviceTensor v4 = s.v.view({B, S, NKV, HD});
    timed(Phase::kAttention,
          [&] { kernels_.attention_forward(stream_, q4, k4, v4, attention_scale(), s.attn, lse); });
  }
  if (s.qkv.data()) ++fused_qkv_layers_;
  if (prefilling_kv_) prefill_kv(L, s);
  // Without keep_normed on, backward recomputes them from q_pre and k_pre (qk_from_output: they
  // are all there is).
  if (L.q_norm && options_.keep_normed != KeepNormed::kOn && !s.qk_from_output) {
    s.q = DeviceTensor();
    s.k = DeviceTensor();
  }
  branch = act({T, H});
  linear(s.attn.view({T, Q}), *L.wo, L.bo, branch);

  DeviceTensor m = act({T, H});
  h = add_norm(branch, std::move(h), *L.mlp_norm, m, train_ ? &s.rstd2 : nullptr);
  if (train_ && !s.norm_from_output) s.h_mid = h.view(h.shape());
  if (keep) s.mlp_in = m.view(m.shape());
  s.gu = act({T, 2 * F});
  DeviceTensor act_out = act({T, F});
  linear(m, *L.gate_up, nullptr, s.gu);
  m = DeviceTensor();
  silu_and_mul(s.gu, act_out);
  branch = act({T, H});  // added to h by the next norm (the next layer's, or the final one)
  linear(act_out, *L.wdown, nullptr, branch);
  // silu(gate) * up is not kept: backward recomputes it from gu (cheap, and T * ffn fewer
  // elements held per layer). Eval keeps nothing: the blocks go back to the pool.
  if (!train_) s = Saved{};
}

DeviceTensor DeviceCausalLM::normed_input(DeviceTensor& kept, const DeviceTensor& x,
                                          const Param& w) {
  if (kept.data()) {  // taken: its block goes back to the pool after the use
    DeviceTensor taken;
    std::swap(taken, kept);
    return taken;
  }
  DeviceTensor normed = act(x.shape());
  renorm(x, w, normed);
  return normed;
}

void DeviceCausalLM::silu_and_mul(const DeviceTensor& gu, DeviceTensor& out) {
  if (!(bound(slots_.silu_and_mul) &&
        call_slot(slots_.silu_and_mul, kSiluAndMul, false, {tensor_arg(&gu), tensor_arg(&out)})))
    kernels_.silu_and_mul(stream_, gu, out);
}

// dh: the gradient of the layer's output stream in (both h_mid and the MLP branch get it), of
// its input stream out (the previous layer's h_mid and MLP branch, or the embedding).
void DeviceCausalLM::layer_backward(Layer& L, Saved& s, DeviceTensor& dh) {
  const int64_t H = cfg_.hidden, Q = cfg_.q_dim(), KV = cfg_.kv_dim(), F = cfg_.ffn;
  const int64_t NH = cfg_.heads, NKV = cfg_.kv_heads, HD = cfg_.head_dim;
  const int64_t B = batch_, S = len_, T = B * S;
  ensure_layer_grads(L);  // from the pool now, as the layers above give theirs activations back
  // MLP branch: dgu = [dgate | dup], and the fused weight's backward is both linears' at once.
  // silu(gate) * up (act_out) was not kept by forward: ds = dh Wdown^T first (it does not read
  // act_out), then SiluAndMulRecompute's backward gives dgu and act_out in one pass (else the
  // SiluAndMul slot's forward again and its backward), then Wdown's gradient from act_out.
  DeviceTensor act_out = act({T, F}), ds = act({T, F}), dgu = act({T, 2 * F}), dm = act({T, H});
  timed(Phase::kGemm,
        [&] { linear_backward(stream_, act_out, run(*L.wdown), dh, &ds, nullptr, false); });
  if (!(bound(slots_.silu_and_mul_recompute) &&
        call_slot(slots_.silu_and_mul_recompute, kSiluAndMulRecompute, true,
                  {tensor_arg(&ds), tensor_arg(&s.gu), tensor_arg(&dgu), tensor_arg(&act_out)}))) {
    silu_and_mul(s.gu, act_out);
    if (!(bound(slots_.silu_and_mul) &&
          call_slot(slots_.silu_and_mul, kSiluAndMul, true,
                    {tensor_arg(&ds), tensor_arg(&s.gu), tensor_arg(&dgu)})))
      kernels_.silu_and_mul_backward(stream_, ds, s.gu, dgu);
  }
  ds = DeviceTensor();
  timed(Phase::kGemm, [&, fresh = take_zero(*L.wdown)] {
    linear_backward(stream_, act_out, run(*L.wdown), dh, nullptr, &L.wdown->g, false, !fresh);
  });
  act_out = DeviceTensor();
  {
    // From the output, the norm's backward reads it too: not taken.
    DeviceTensor m = s.norm_from_output ? s.mlp_in.view(s.mlp_in.shape())
                                        : normed_input(s.mlp_in, s.h_mid, *L.mlp_norm);
    linear_grad(m, *L.gate_up, nullptr, dgu, &dm, false);
  }
  dgu = DeviceTensor();
  DeviceTensor d_mid = act({T, H});
  add_norm_backward(dm, &dh, s.norm_from_output ? s.mlp_in : s.h_mid, *L.mlp_norm, s.rstd2, d_mid,
                    s.norm_from_output);
  s.mlp_in = DeviceTensor();
  dh = std::move(d_mid);
  dm = DeviceTensor();

  // Attention branch.
  DeviceTensor dattn = act({B, S, NH, HD});
  DeviceTensor dattn2 = dattn.view({T, Q});
  linear_grad(s.attn.view({T, Q}), *L.wo, L.bo, dh, &dattn2, false);
  // The fused q/k/v layout holds only while the packages it needs serve (one refused since the
  // forward: the parts apart).
  if (s.qkv.data() && !(attention_bound() && (s.qk_from_output || bound(slots_.qk_norm_rotary)))) {
    unfuse_qkv(s);
    --fused_qkv_layers_;
  }
  bool fused = s.qkv.data() != nullptr;
  // q and k: kept by the forward (keep_normed; in s.qkv with qk_from_output), else recomputed.
  if (L.q_norm && !s.q.data() && !s.qk_from_output) {
    s.q = act({T, Q});
    s.k = act({T, KV});
    if (fused) {
      const QkvViews in = qkv_views(s.qkv);
      if (!qknr_forward(L, tensor_arg(&in.q), tensor_arg(&in.k), s.q, s.k)) {
        unfuse_qkv(s);
        --fused_qkv_layers_;
        fused = false;
      }
    }
    if (!fused) qk_from_projections(L, s.q_pre, s.k_pre, s.q, s.k, nullptr, nullptr);
  }
  std::optional<QkvViews> in;
  if (fused) in = qkv_views(s.qkv);
  // dqkv: the fused projection's output gradient, whose columns dq_pre, dk_pre and dv are.
  DeviceTensor dqkv = fused ? act({T, Q + 2 * KV}) : DeviceTensor();
  std::optional<QkvViews> dfused;
  if (fused) dfused = qkv_views(dqkv);
  DeviceTensor dq = act({B, S, NH, HD}), dk = act({B, S, NKV, HD});
  DeviceTensor dv = fused ? DeviceTensor() : act({B, S, NKV, HD});
  const bool qk_in_qkv = fused && s.qk_from_output;
  DeviceTensor q4 = qk_in_qkv ? DeviceTensor() : s.q.view({B, S, NH, HD}),
               k4 = qk_in_qkv ? DeviceTensor() : s.k.view({B, S, NKV, HD}),
               o4 = s.attn.view(s.attn.shape());
  DeviceTensor v4 = fused ? DeviceTensor() : s.v.view({B, S, NKV, HD});
  bool served = false;
  if (attention_bound()) {
    // The package's cuda backward sums dq through an fp32 workspace of T * NH * (HD + 1).
    DeviceTensor workspace = empty({T * NH * (HD + 1)});
    served = call_slot(
        slots_.attention, kAttention, true,
        {tensor_arg(&dattn), qk_in_qkv ? tensor_arg(&in->q4) : tensor_arg(&q4),
         qk_in_qkv ? tensor_arg(&in->k4) : tensor_arg(&k4),
         fused ? tensor_arg(&in->v) : tensor_arg(&v4), tensor_arg(&o4), tensor_arg(&s.lse),
         tensor_arg(nullptr), tensor_arg(nullptr), int_arg(S), int_arg(S), int_arg(1), int_arg(-1),
         float_arg(attention_scale()), tensor_arg(&dq), tensor_arg(&dk),
         fused ? tensor_arg(&dfused->v) : tensor_arg(&dv), tensor_arg(&workspace)});
  }
  if (!served) {
    // The runtime's attention takes contiguous tensors, and accumulates dk and dv in fp32
    // (atomics): narrowed for bf16.
    DeviceTensor vc = fused ? act({B, S, NKV, HD}) : v4.view(v4.shape());
    DeviceTensor dvc = fused ? act({B, S, NKV, HD}) : dv.view(dv.shape());
    if (fused) {
      DeviceTensor v2 = vc.view({T, KV});
      kernels_.copy_columns(stream_, s.qkv, Q + KV, v2, 0, KV);
    }
    if (qk_in_qkv) {  // contiguous copies of the rotated q and k
      q4 = act({B, S, NH, HD});
      k4 = act({B, S, NKV, HD});
      DeviceTensor q2 = q4.view({T, Q}), k2 = k4.view({T, KV});
      kernels_.copy_columns(stream_, s.qkv, 0, q2, 0, Q);
      kernels_.copy_columns(stream_, s.qkv, Q, k2, 0, KV);
    }
    DeviceTensor dk32 = bf16_ ? empty(dk.shape()) : dk.view(dk.shape());
    DeviceTensor dv32 = bf16_ ? empty(dvc.shape()) : dvc.view(dvc.shape());
    timed(Phase::kAttention, [&] {
      kernels_.attention_backward(stream_, dattn, q4, k4, vc, o4, s.lse, attention_scale(), dq,
                                  dk32, dv32);
    });
    if (bf16_) {
      kernels_.cast(stream_, dk32, dk);
      kernels_.cast(stream_, dv32, dvc);
    }
    if (fused) kernels_.copy_columns(stream_, dvc.view({T, KV}), 0, dqkv, Q + KV, KV);
  }
  dattn = DeviceTensor();
  q4 = DeviceTensor();
  k4 = DeviceTensor();
  if (!s.qk_from_output) {  // (else the q/k norms' backward reads them)
    s.q = DeviceTensor();
    s.k = DeviceTensor();
  }
  DeviceTensor dq3 = dq.view({T, NH, HD}), dk3 = dk.view({T, NKV, HD});
  DeviceTensor dq2 = dq.view({T, Q}), dk2 = dk.view({T, KV});
  if (L.q_norm && s.qk_from_output) {  // from the rotated q and k and the forward's rstd
    if (fused) {
      qknr_backward(L, tensor_arg(&in->q), tensor_arg(&in->k), dq3, dk3, tensor_arg(&dfused->q),
                    tensor_arg(&dfused->k), &s);
    } else {
      DeviceTensor dq_pre = act({T, Q}), dk_pre = act({T, KV});
      const DeviceTensor qi = s.q.view({T, NH, HD}), ki = s.k.view({T, NKV, HD});
      DeviceTensor dqi = dq_pre.view({T, NH, HD}), dki = dk_pre.view({T, NKV, HD});
      qknr_backward(L, tensor_arg(&qi), tensor_arg(&ki), dq3, dk3, tensor_arg(&dqi),
                    tensor_arg(&dki), &s);
      dq2 = dq_pre.view({T, Q});
      dk2 = dk_pre.view({T, KV});
    }
    s.q = DeviceTensor();
    s.k = DeviceTensor();
  } else if (L.q_norm) {
    bool done = false;
    DeviceTensor dq_pre, dk_pre;  // the unfused backward's (the fused one writes into dqkv)
    if (fused) {
      done = qknr_backward(L, tensor_arg(&in->q), tensor_arg(&in->k), dq3, dk3,
                           tensor_arg(&dfused->q), tensor_arg(&dfused->k));
      // Refused: the unfused backward below reads contiguous q_pre and k_pre (the views in `in`
      // keep the fused tensor alive).
      if (!done) unfuse_qkv(s);
    } else {
      dq_pre = act({T * NH, HD});
      dk_pre = act({T * NKV, HD});
      const DeviceTensor qi = s.q_pre.view({T, NH, HD}), ki = s.k_pre.view({T, NKV, HD});
      DeviceTensor dqi = dq_pre.view({T, NH, HD}), dki = dk_pre.view({T, NKV, HD});
      done = qknr_backward(L, tensor_arg(&qi), tensor_arg(&ki), dq3, dk3, tensor_arg(&dqi),
                           tensor_arg(&dki));
    }
    if (!done) {
      if (!dq_pre.data()) {
        dq_pre = act({T * NH, HD});
        dk_pre = act({T * NKV, HD});
      }
      rotary(dq3, dk3, true);
      if (s.rstd_q.shape().empty()) {  // the fused forward ran but its backward was refused
        s.rstd_q = empty({T * NH});
        s.rstd_k = empty({T * NKV});
        DeviceTensor qn = act({T * NH, HD}), kn = act({T * NKV, HD});
        norm(s.q_pre.view({T * NH, HD}), *L.q_norm, qn, &s.rstd_q);
        norm(s.k_pre.view({T * NKV, HD}), *L.k_norm, kn, &s.rstd_k);
      }
      norm_backward(dq.view({T * NH, HD}), s.q_pre.view({T * NH, HD}), *L.q_norm, s.rstd_q, dq_pre);
      norm_backward(dk.view({T * NKV, HD}), s.k_pre.view({T * NKV, HD}), *L.k_norm, s.rstd_k,
                    dk_pre);
      if (fused) {
        kernels_.copy_columns(stream_, dq_pre.view({T, Q}), 0, dqkv, 0, Q);
        kernels_.copy_columns(stream_, dk_pre.view({T, KV}), 0, dqkv, Q, KV);
      }
    }
    if (!fused) {
      dq2 = dq_pre.view({T, Q});
      dk2 = dk_pre.view({T, KV});
    }
  } else {
    rotary(dq3, dk3, true);
  }
  DeviceTensor da = act({T, H});
  {
    DeviceTensor a = s.norm_from_output ? s.attn_in.view(s.attn_in.shape())
                                        : normed_input(s.attn_in, s.h_in, *L.attn_norm);
    if (fused) {  // q's, k's and v's weight gradients are the rows of qkv's (ensure_layer_grads)
      // Overwritten when all three are zero (ensure_layer_grads takes them from the pool together).
      const bool fresh = L.wq->g_zero && L.wk->g_zero && L.wv->g_zero;
      for (Param* p : {L.wq, L.wk, L.wv}) {
        if (!fresh) clear_if_zero(*p);
        p->g_zero = false;
      }
      L.qkv->g_zero = fresh;
      linear_grad(a, *L.qkv, nullptr, dqkv, &da, false);
    } else {
      linear_grad(a, *L.wq, L.bq, dq2, &da, false);
      linear_grad(a, *L.wk, L.bk, dk2, &da, true);
      linear_grad(a, *L.wv, L.bv, dv.view({T, KV}), &da, true);
    }
  }
  DeviceTensor d_in = act({T, H});
  add_norm_backward(da, &dh, s.norm_from_output ? s.attn_in : s.h_in, *L.attn_norm, s.rstd1, d_in,
                    s.norm_from_output);
  s.attn_in = DeviceTensor();
  dh = std::move(d_in);
}

}  // namespace kh::demo
