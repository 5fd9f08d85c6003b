"""kernel-hub's layers as torch.library custom ops (namespace kernel_hub): each calls the layer
bound in a Runtime (the `rt` argument, its id) through the C API, on DLPack views of the
tensors and the current CUDA stream. Fake implementations give shapes and dtypes to
torch.compile; autograd formulas call the layers' backward ops.

Which op runs is the runtime's published table: eval mode calls the layer's forward op, train
mode its forward_train op, whose arguments may differ (RMSNorm and CrossEntropy also write what
backward needs). So each such layer has an eval op and a train op here; callers pick by
Runtime.mode (bridge.py does).

Arguments follow the packages' op schemas (kernels/*/host.cpp)."""
import os

import torch

from . import runtime as _runtime

Tensor = torch.Tensor


def _call(rt, layer, args, backward=False):
    _runtime.get(rt).call(layer, args, backward=backward)


def _rows(x):
    return x.numel() // x.shape[-1] if x.dim() and x.shape[-1] else 0


def _unused_grads_stay_none(ctx):
    """Backward gets None, not zeros, for the outputs nothing used. Autograd otherwise
    materialises a zero gradient of each output's full size before calling backward: for the
    fused loss's d_hidden and d_weight outputs (outputs only so that backward can have them) that
    was a [vocab, hidden] and a [tokens, hidden] buffer of zeros at the start of backward, the
    step's memory peak (0.32 GiB at Qwen3-0.6B, batch 8 x 2048); likewise for rstd, lse and the
    unfused cross-entropy's [tokens, vocab] dlogits. Every multi-output op's setup calls this, and
    its backward takes None for an output's gradient."""
    ctx.set_materialize_grads(False)


# ---- RMSNorm (kernel-hub/norm): x [..., cols] with a contiguous last dimension ----

@torch.library.custom_op("kernel_hub::rms_norm", mutates_args=())
def rms_norm(x: Tensor, weight: Tensor, eps: float, rt: int) -> Tensor:
    y = torch.empty_like(x)
    _call(rt, "RMSNorm", [x, weight, eps, y])
    return y


@rms_norm.register_fake
def _(x, weight, eps, rt):
    return torch.empty_like(x)


@torch.library.custom_op("kernel_hub::rms_norm_train", mutates_args=())
def rms_norm_train(x: Tensor, weight: Tensor, eps: float, rt: int) -> tuple[Tensor, Tensor]:
    y = torch.empty_like(x)
    rstd = torch.empty(_rows(x), dtype=torch.float32, device=x.device)
    _call(rt, "RMSNorm", [x, weight, eps, y, rstd])
    return y, rstd


@rms_norm_train.register_fake
def _(x, weight, eps, rt):
    return torch.empty_like(x), x.new_empty(_rows(x), dtype=torch.float32)


def _norm_workspace_rows(x):
    # kh_norm_workspace_rows (kernels/norm/launch_config.h): a row per backward CTA, about
    # 512 threads a multiprocessor (4 CTAs of 128 threads for the short rows of hidden sizes up
    # to 4096 and the q/k norms; fewer for longer rows, whose CTAs are larger); on cpu one walker.
    rows = _rows(x)
    if x.device.type != "cuda":
        return 1
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    cols = x.shape[-1]
    per_sm = 4 if cols <= 4096 else max(1, 4 * 4096 // cols)
    return max(1, min(rows, sms * per_sm))


@torch.library.custom_op("kernel_hub::rms_norm_backward", mutates_args=())
def rms_norm_backward(dy: Tensor, x: Tensor, weight: Tensor, rstd: Tensor,
                      rt: int) -> tuple[Tensor, Tensor]:
    dx = torch.empty_like(x)
    dweight = torch.empty_like(weight)
    workspace = torch.empty(_norm_workspace_rows(x), x.shape[-1], dtype=torch.float32,
                            device=x.device)
    _call(rt, "RMSNorm", [dy, x, weight, rstd, dx, dweight, workspace], backward=True)
    return dx, dweight


@rms_norm_backward.register_fake
def _(dy, x, weight, rstd, rt):
    return torch.empty_like(x), torch.empty_like(weight)


def _rms_norm_setup(ctx, inputs, output):
    x, weight, _eps, rt = inputs
    ctx.save_for_backward(x, weight, output[1])
    ctx.rt = rt
    _unused_grads_stay_none(ctx)


def _rms_norm_backward(ctx, dy, _drstd):
    if dy is None:  # only rstd was used: no gradient flows
        return None, None, None, None
    x, weight, rstd = ctx.saved_tensors
    dx, dweight = rms_norm_backward(dy.contiguous(), x, weight, rstd, ctx.rt)
    return dx, dweight, None, None


rms_norm_train.register_autograd(_rms_norm_backward, setup_context=_rms_norm_setup)


# ---- SiluAndMul (kernel-hub/activation): x [..., 2d] -> silu(x[..., :d]) * x[..., d:] ----
# consume_input: the caller's x is a scratch intermediate that only this op reads (the bridge's
# gate/up buffer), so backward writes dx over the saved x, as Liger's SwiGLU does, instead of
# allocating a [..., 2d] buffer (192 MiB per layer at Qwen3-0.6B, batch 8 x 2048, while the
# backward's memory is highest). The kernel reads each element pair before writing it, in the
# same thread, so dx may alias x. A second backward through a retained graph then raises.

@torch.library.custom_op("kernel_hub::silu_and_mul", mutates_args=())
def silu_and_mul(x: Tensor, rt: int, consume_input: bool = False) -> Tensor:
    y = x.new_empty(*x.shape[:-1], x.shape[-1] // 2)
    _call(rt, "SiluAndMul", [x, y])
    return y


@silu_and_mul.register_fake
def _(x, rt, consume_input=False):
    return x.new_empty(*x.shape[:-1], x.shape[-1] // 2)


@torch.library.custom_op("kernel_hub::silu_and_mul_backward", mutates_args=())
def silu_and_mul_backward(dy: Tensor, x: Tensor, rt: int) -> Tensor:
    dx = torch.empty_like(x)
    _call(rt, "SiluAndMul", [dy, x, dx], backward=True)
    return dx


@silu_and_mul_backward.register_fake
def _(dy, x, rt):
    return torch.empty_like(x)


@torch.library.custom_op("kernel_hub::silu_and_mul_backward_", mutates_args=("x",))
def silu_and_mul_backward_(dy: Tensor, x: Tensor, rt: int) -> None:
    _call(rt, "SiluAndMul", [dy, x, x], backward=True)  # dx over x


@silu_and_mul_backward_.register_fake
def _(dy, x, rt):
    return None


def _silu_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])
    ctx.rt = inputs[1]
    ctx.consume_input = inputs[2] if len(inputs) > 2 else False
    ctx.consumed = False


def _silu_backward(ctx, dy):
    (x,) = ctx.saved_tensors
    if not ctx.consume_input:
        return silu_and_mul_backward(dy.contiguous(), x, ctx.rt), None, None
    if ctx.consumed:
        raise RuntimeError(
            "kernel_hub::silu_and_mul: one of the variables needed for gradient computation has "
            "been modified by an inplace operation: the first backward wrote the input's "
            "gradient over the saved input (consume_input=True, the bridge's MLP); a second "
            "backward through a retained graph needs KERNEL_HUB_SILU_IN_PLACE=0")
    ctx.consumed = True
    silu_and_mul_backward_(dy.contiguous(), x, ctx.rt)
    return x, None, None


silu_and_mul.register_autograd(_silu_backward, setup_context=_silu_setup)


# ---- RotaryEmbedding (kernel-hub/rotary), in Transformers' layout ----
# q [batch, q_heads, seq, head_dim], k [batch, k_heads, seq, head_dim], cos/sin [batch or 1, seq,
# rot_dim] as Transformers' rotary modules make them (cat(freqs, freqs): the NeoX layout). The
# package rotates [tokens, heads, head_dim] views in place from a [positions, rot_dim / 2] cache:
# here the cache rows are the batch's tokens and positions are 0..tokens-1.

def _rotate(rt, q, k, cos, sin, backward):
    batch, seq = q.shape[0], q.shape[2]
    half = cos.shape[-1] // 2
    cos = cos.expand(batch, seq, cos.shape[-1])
    sin = sin.expand(batch, seq, sin.shape[-1])
    qt, kt = q.transpose(1, 2), k.transpose(1, 2)  # [batch, seq, heads, head_dim] views
    try:  # one call when batch and seq collapse into tokens (Transformers' usual strides)
        views = [(qt.view(batch * seq, *qt.shape[2:]), kt.view(batch * seq, *kt.shape[2:]),
                  cos.reshape(batch * seq, -1), sin.reshape(batch * seq, -1))]
    except RuntimeError:
        views = [(qt[b], kt[b], cos[b], sin[b]) for b in range(batch)]
    for qv, kv, c, s in views:
        positions = torch.arange(qv.shape[0], dtype=torch.int64, device=q.device)
        _call(rt, "RotaryEmbedding", [positions, qv, kv, c[:, :half], s[:, :half], 1],
              backward=backward)


@torch.library.custom_op("kernel_hub::rotary", mutates_args=())
def rotary(q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, rt: int) -> tuple[Tensor, Tensor]:
    qo, ko = torch.empty_like(q), torch.empty_like(k)
    qo.copy_(q)
    ko.copy_(k)
    _rotate(rt, qo, ko, cos, sin, backward=False)
    return qo, ko


@rotary.register_fake
def _(q, k, cos, sin, rt):
    return torch.empty_like(q), torch.empty_like(k)


@torch.library.custom_op("kernel_hub::rotary_backward", mutates_args=())
def rotary_backward(dq: Tensor, dk: Tensor, cos: Tensor, sin: Tensor,
                    rt: int) -> tuple[Tensor, Tensor]:
    dqo, dko = torch.empty_like(dq), torch.empty_like(dk)
    dqo.copy_(dq)
    dko.copy_(dk)
    _rotate(rt, dqo, dko, cos, sin, backward=True)
    return dqo, dko


@rotary_backward.register_fake
def _(dq, dk, cos, sin, rt):
    return torch.empty_like(dq), torch.empty_like(dk)


def _rotary_setup(ctx, inputs, output):
    q, k, cos, sin, rt = inputs
    ctx.save_for_backward(cos, sin)
    ctx.rt = rt
    ctx.q_meta = (q.shape, q.dtype, q.device, q.stride())
    ctx.k_meta = (k.shape, k.dtype, k.device, k.stride())
    _unused_grads_stay_none(ctx)


def _zeros_like_meta(meta):
    shape, dtype, device, stride = meta
    return torch.empty_strided(shape, stride, dtype=dtype, device=device).zero_()


def _rotary_backward(ctx, dq, dk):
    if dq is None and dk is None:
        return None, None, None, None, None
    # One of q and k unused (rare): its gradient is zero, rotated or not.
    dq = _zeros_like_meta(ctx.q_meta) if dq is None else dq
    dk = _zeros_like_meta(ctx.k_meta) if dk is None else dk
    cos, sin = ctx.saved_tensors
    dq, dk = rotary_backward(dq, dk, cos, sin, ctx.rt)
    # cos and sin come from the rotary module's buffers: no gradient flows to them.
    return dq, dk, None, None, None


rotary.register_autograd(_rotary_backward, setup_context=_rotary_setup)


# ---- CrossEntropy (kernel-hub/softmax): logits [tokens, vocab], int64 targets -> fp32 loss
# per token (0 for ignore_index) ----

@torch.library.custom_op("kernel_hub::cross_entropy", mutates_args=())
def cross_entropy(logits: Tensor, targets: Tensor, ignore_index: int, rt: int) -> Tensor:
    loss = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
    _call(rt, "CrossEntropy", [logits, targets, ignore_index, loss])
    return loss


@cross_entropy.register_fake
def _(logits, targets, ignore_index, rt):
    return logits.new_empty(logits.shape[0], dtype=torch.float32)


@torch.library.custom_op("kernel_hub::cross_entropy_train", mutates_args=())
def cross_entropy_train(logits: Tensor, targets: Tensor, ignore_index: int,
                        rt: int) -> tuple[Tensor, Tensor]:
    # forward_train writes the gradient too: dlogits = softmax - onehot (grad_scale 1).
    loss = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
    dlogits = torch.empty_like(logits)
    _call(rt, "CrossEntropy", [logits, targets, ignore_index, 1.0, loss, dlogits])
    return loss, dlogits


@cross_entropy_train.register_fake
def _(logits, targets, ignore_index, rt):
    return logits.new_empty(logits.shape[0], dtype=torch.float32), torch.empty_like(logits)


@torch.library.custom_op("kernel_hub::cross_entropy_backward", mutates_args=())
def cross_entropy_backward(dloss: Tensor, dlogits: Tensor, rt: int) -> Tensor:
    # The backward op scales dlogits in place; the saved tensor stays intact (a second
    # backward through a retained graph must see it unscaled), so it scales a copy.
    out = dlogits.clone()
    _call(rt, "CrossEntropy", [dloss, out], backward=True)
    return out


@cross_entropy_backward.register_fake
def _(dloss, dlogits, rt):
    return torch.empty_like(dlogits)


def _ce_setup(ctx, inputs, output):
    ctx.save_for_backward(output[1])
    ctx.rt = inputs[3]
    _unused_grads_stay_none(ctx)


def _ce_backward(ctx, dloss, _ddlogits):
    if dloss is None:
        return None, None, None, None
    (dlogits,) = ctx.saved_tensors
    return cross_entropy_backward(dloss.float().contiguous(), dlogits, ctx.rt), None, None, None


cross_entropy_train.register_autograd(_ce_backward, setup_context=_ce_setup)


# ---- Attention (kernel-hub/attention): padded q [batch, seq_q, q_heads, d], k/v [batch, seq_k,
# k_heads, d] (GQA: q_heads a multiple of k_heads), causal bottom-right, sliding window ----

@torch.library.custom_op("kernel_hub::attention", mutates_args=())
def attention(q: Tensor, k: Tensor, v: Tensor, causal: int, window_left: int, scale: float,
              rt: int) -> tuple[Tensor, Tensor]:
    out = torch.empty_like(q)
    lse = torch.empty(q.shape[2], q.shape[0] * q.shape[1], dtype=torch.float32, device=q.device)
    _call(rt, "Attention", [q, k, v, None, None, q.shape[1], causal, window_left, scale, out, lse])
    return out, lse


@attention.register_fake
def _(q, k, v, causal, window_left, scale, rt):
    return torch.empty_like(q), q.new_empty(q.shape[2], q.shape[0] * q.shape[1],
                                            dtype=torch.float32)


@torch.library.custom_op("kernel_hub::attention_backward", mutates_args=())
def attention_backward(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor,
                       causal: int, window_left: int, scale: float,
                       rt: int) -> tuple[Tensor, Tensor, Tensor]:
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    workspace = None
    if q.device.type == "cuda":  # tokens_q * q_heads * (head_dim + 1) fp32 (kernels/attention)
        workspace = torch.empty(q.shape[0] * q.shape[1] * q.shape[2] * (q.shape[3] + 1),
                                dtype=torch.float32, device=q.device)
    _call(rt, "Attention", [dout, q, k, v, out, lse, None, None, q.shape[1], k.shape[1], causal,
                            window_left, scale, dq, dk, dv, workspace], backward=True)
    return dq, dk, dv


@attention_backward.register_fake
def _(dout, q, k, v, out, lse, causal, window_left, scale, rt):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _attn_setup(ctx, inputs, output):
    q, k, v, causal, window_left, scale, rt = inputs
    ctx.save_for_backward(q, k, v, output[0], output[1])
    ctx.args = (causal, window_left, scale, rt)
    _unused_grads_stay_none(ctx)


def _attn_backward(ctx, dout, _dlse):
    if dout is None:  # only lse was used
        return None, None, None, None, None, None, None
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = attention_backward(dout.contiguous(), q, k, v, out, lse, *ctx.args)
    return dq, dk, dv, None, None, None, None


attention.register_autograd(_attn_backward, setup_context=_attn_setup)


# ---- FusedLinearCrossEntropy (kernel-hub/softmax 1.1): hidden [tokens, H], weight [V, H] (an
# lm_head's, no bias), int64 labels [tokens] -> the mean loss over tokens not ignored, without the
# [tokens, V] logits; train also gives d_hidden (hidden's dtype) and d_weight ----

# Rows of logits per chunk: as many as fit in LCE_CHUNK_BYTES, a multiple of 128 between 128 and
# 1024 (kernels/softmax/linear_ce.h). The chunk is live at the step's memory peak (the end of the
# forward); more rows mean fewer passes of the d_weight GEMM's read-modify-write over [V, H]
# (256 rows in bf16: 128 FLOP per byte of d_weight traffic, about an H200's compute-to-bandwidth
# ratio). Qwen3's vocab 151936 in bf16: 1024 rows, 297 MiB (Liger bounds the chunk by the hidden
# states' size: 128 rows at 16k tokens, 32 at 4k). On the H200 at Qwen3-0.6B, batch 8 x 2048
# (tools/bench/RESULTS.md), 256 rows (80 MiB) trained at 72.7k tokens/s and 1024 rows at 86.2k,
# with the same peak (23.39 GiB): that peak was the start of backward, where autograd handed the
# op zero gradients of d_hidden and d_weight (0.32 GiB, more than the chunk; gone since, see
# _unused_grads_stay_none), so the chunk, live at the end of the forward, is now expected to set
# the peak. KERNEL_HUB_LCE_CHUNK_MIB sets another budget.
LCE_CHUNK_BYTES = int(os.environ.get("KERNEL_HUB_LCE_CHUNK_MIB", "300")) << 20
LCE_CHUNK_ROWS = 1024

# d_weight's dtype: the weight's (None; what Liger does by default: it rounds once per chunk and
# needs no [V, H] fp32 buffer, 0.6 GB at Qwen3's head), or torch.float32 (one rounding, at the
# cost of that buffer and a conversion). KERNEL_HUB_LCE_FP32_WEIGHT_GRAD=1 sets float32.
LCE_WEIGHT_GRAD_DTYPE = (torch.float32 if os.environ.get("KERNEL_HUB_LCE_FP32_WEIGHT_GRAD") == "1"
                         else None)


def _lce_chunk_rows(tokens, vocab, elem_bytes):
    rows = LCE_CHUNK_BYTES // max(1, vocab * elem_bytes) // 128 * 128
    return max(1, min(tokens, LCE_CHUNK_ROWS, max(128, rows)))


def _lce_workspace(hidden, weight):
    n, v = hidden.shape[0], weight.shape[0]
    rows = _lce_chunk_rows(n, v, hidden.element_size())
    nbytes = 256 + (n * 4 + 255) // 256 * 256 + rows * v * hidden.element_size() + 256
    return torch.empty(nbytes, dtype=torch.uint8, device=hidden.device)


@torch.library.custom_op("kernel_hub::linear_cross_entropy", mutates_args=())
def linear_cross_entropy(hidden: Tensor, weight: Tensor, labels: Tensor, ignore_index: int,
                         rt: int) -> Tensor:
    loss = torch.empty(1, dtype=torch.float32, device=hidden.device)  # the ops take 1-D
    _call(rt, "FusedLinearCrossEntropy",
          [hidden, weight, labels, ignore_index, _lce_workspace(hidden, weight), loss])
    return loss.reshape(())


@linear_cross_entropy.register_fake
def _(hidden, weight, labels, ignore_index, rt):
    return hidden.new_empty((), dtype=torch.float32)


def _lce_weight_grad_dtype(weight):
    return LCE_WEIGHT_GRAD_DTYPE or weight.dtype


@torch.library.custom_op("kernel_hub::linear_cross_entropy_train", mutates_args=())
def linear_cross_entropy_train(hidden: Tensor, weight: Tensor, labels: Tensor, ignore_index: int,
                               rt: int) -> tuple[Tensor, Tensor, Tensor]:
    # forward_train writes the gradients of the mean loss too; backward scales them.
    loss = torch.empty(1, dtype=torch.float32, device=hidden.device)
    d_hidden = torch.empty_like(hidden)
    d_weight = torch.empty(weight.shape, dtype=_lce_weight_grad_dtype(weight),
                           device=weight.device)
    _call(rt, "FusedLinearCrossEntropy",
          [hidden, weight, labels, ignore_index, _lce_workspace(hidden, weight), loss, d_hidden,
           d_weight])
    return loss.reshape(()), d_hidden, d_weight


@linear_cross_entropy_train.register_fake
def _(hidden, weight, labels, ignore_index, rt):
    return (hidden.new_empty((), dtype=torch.float32), torch.empty_like(hidden),
            weight.new_empty(weight.shape, dtype=_lce_weight_grad_dtype(weight)))


@torch.library.custom_op("kernel_hub::linear_cross_entropy_scale_",
                         mutates_args=("d_hidden", "d_weight"))
def linear_cross_entropy_scale_(dloss: Tensor, d_hidden: Tensor, d_weight: Tensor,
                                rt: int) -> None:
    # The backward op: both gradients times the loss's upstream gradient, in place (no pass when
    # it is exactly 1). In place, as Liger does, so the backward allocates nothing: the saved
    # gradients become the returned ones. The declared mutation bumps their version counters, so
    # a second backward through a retained graph fails with torch's "modified by an inplace
    # operation" error instead of using scaled gradients.
    _call(rt, "FusedLinearCrossEntropy", [dloss, d_hidden, d_weight], backward=True)


@linear_cross_entropy_scale_.register_fake
def _(dloss, d_hidden, d_weight, rt):
    return None


def _lce_setup(ctx, inputs, output):
    ctx.save_for_backward(output[1], output[2])
    ctx.rt = inputs[4]
    ctx.weight_dtype = inputs[1].dtype
    _unused_grads_stay_none(ctx)


def _lce_backward(ctx, dloss, _dh, _dw):
    # The gradients of d_hidden and d_weight themselves (None unless a caller differentiates
    # through them) are not part of the loss's: they are the loss's gradients, not functions
    # of the inputs that backward propagates.
    if dloss is None:
        return None, None, None, None, None
    d_hidden, d_weight = ctx.saved_tensors
    linear_cross_entropy_scale_(dloss.float().reshape(1).contiguous(), d_hidden, d_weight, ctx.rt)
    if d_weight.dtype != ctx.weight_dtype:  # LCE_WEIGHT_GRAD_DTYPE float32
        d_weight = d_weight.to(ctx.weight_dtype)
    return d_hidden, d_weight, None, None, None


linear_cross_entropy_train.register_autograd(_lce_backward, setup_context=_lce_setup)
