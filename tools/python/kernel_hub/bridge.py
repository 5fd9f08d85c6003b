"""kernelize(model, config=..., device=..., mode=...): binds kernel-hub packages to a PyTorch /
Transformers model's layers, by Transformers' layer names.

What is replaced (each only where the config serves the layer on the model's device, in the
current mode; anything else keeps PyTorch's code):
  RMSNorm          modules whose class name ends in "RMSNorm" and whose forward computes
                   weight * x * rsqrt(mean(x^2) + eps) (checked on a small input at kernelize
                   time: Gemma's (1 + weight) and zero-centred variants are left alone)
  SiluAndMul       MLP modules with gate_proj, up_proj, down_proj and a SiLU act_fn
                   (down(silu(gate(x)) * up(x)); Transformers' SwiGLU MLPs)
  RotaryEmbedding  the apply_rotary_pos_emb of the model's modeling module (Transformers'
                   "rotary_pos_emb"; NeoX layout, unsqueeze_dim 1), for calls from this
                   model's attention modules only
  CrossEntropy     the model's loss_function when it is ForCausalLMLoss
  FusedLinearCrossEntropy
                   a *ForCausalLM model's forward in training with labels (the Liger way:
                   liger_kernel patches the model class's forward to call its fused loss on the
                   hidden states; here kernelize gives the model instance a forward that runs
                   model.model, then the package's fused lm_head + cross-entropy on the last
                   hidden states and lm_head.weight, so the [tokens, vocab] logits never exist).
                   The output's logits are then None, as Liger's are. Where it does not apply
                   (eval mode, no labels, an lm_head with a bias, logit softcapping or scaling,
                   inputs passed positionally past inputs_embeds) the model's own forward runs,
                   with ForCausalLMLoss replaced as above.
  Attention        attn_implementation="kernel_hub" (Transformers' AttentionInterface): causal
                   or full attention without a padding mask or dropout; a padded batch, dropout or
                   an explicit mask falls back to SDPA. A *ForCausalLM's eager training forward
                   (grad enabled) then runs with use_cache=False unless the caller passes
                   use_cache or a cache (the cache would hold a second copy of every layer's K
                   and V); under torch.compile the cache is built but left out of the fused
                   loss's output (_kernel_causal_lm says why).

In eager training the outputs of the kernel RMSNorms that the next layers save for backward (the
q/k/v projections' and the MLP's input) are recomputed in backward from the norm's input instead
of kept (_NormRecompute: two [tokens, hidden] tensors per decoder layer less than Liger keeps);
KERNEL_HUB_RECOMPUTE_NORM=0 keeps them.

Config keys are hub layer names (RMSNorm, SiluAndMul, RotaryEmbedding, CrossEntropy, Attention)
or Transformers' names for them (TRANSFORMERS_NAMES; Liger's "fused_linear_cross_entropy" names
FusedLinearCrossEntropy); values are passed to the C API untouched
(kh_runtime_kernelize parses every KernelConfig form).

Under torch.compile the layers in INDUCTOR_LAYERS (rotary embedding, SiluAndMul) keep PyTorch's
code for Inductor to fuse with the GEMMs around them; kernelize(inductor_layers=()) keeps every
kernel."""
import functools
import inspect
import os
import sys
import weakref

import torch

from . import ops
from .runtime import Runtime

# Transformers' layer names (its kernel mapping and KernelConfig keys) -> kernel-hub layer names.
TRANSFORMERS_NAMES = {
    "rotary_pos_emb": "RotaryEmbedding",
    "ForCausalLMLoss": "CrossEntropy",
    "SiLU": "SiluAndMul",
    "SwiGLU": "SiluAndMul",
    "MLP": "SiluAndMul",
    "attention": "Attention",
    "kernel_hub": "Attention",
    "fused_linear_cross_entropy": "FusedLinearCrossEntropy",
}
LAYERS = ("RMSNorm", "SiluAndMul", "RotaryEmbedding", "CrossEntropy", "Attention",
          "FusedLinearCrossEntropy")

# The hub's default mapping (manifests/examples/demo-config.json's packages).
DEFAULT_CONFIG = {
    "RMSNorm": "kernel-hub/norm",
    "SiluAndMul": "kernel-hub/activation",
    "RotaryEmbedding": "kernel-hub/rotary",
    "CrossEntropy": "kernel-hub/softmax",
    "Attention": "kernel-hub/attention",
    "FusedLinearCrossEntropy": "kernel-hub/softmax",
}

MODES = {None: ("eval", "train"), "inference": ("eval",), "eval": ("eval",),
         "training": ("train",), "train": ("train",), "both": ("eval", "train")}

# Layers that keep PyTorch's code while torch.compile traces the model, so that Inductor fuses
# them with their neighbours, where that beats a separate kernel: rotary embedding (Inductor
# writes the rotated q and k in one pass, straight in the layout attention takes, and fuses the
# backward likewise; the package rotates in place, so the op copies first: two passes) and
# SiluAndMul (Inductor reads the gate and up projections' outputs directly; the kernel needs them
# concatenated: one more write and read of [tokens, 2 * intermediate]). Eager runs keep every
# kernel. kernelize(inductor_layers=...) or KERNEL_HUB_INDUCTOR_LAYERS (comma-separated hub
# layer names, "" or "none" for none) choose another set.
INDUCTOR_LAYERS = ("RotaryEmbedding", "SiluAndMul")

# The MLP's SiluAndMul backward writes its gradient over the saved gate/up buffer (no
# [tokens, 2 * intermediate] allocation, as Liger's SwiGLU); KERNEL_HUB_SILU_IN_PLACE=0 allocates
# (a second backward through a retained graph needs that).
SILU_IN_PLACE = os.environ.get("KERNEL_HUB_SILU_IN_PLACE", "1") != "0"


def hub_config(config):
    """The config with Transformers' layer names renamed to the hub's (values untouched)."""
    if config is None:
        return dict(DEFAULT_CONFIG)
    if not isinstance(config, dict):
        config = getattr(config, "kernel_mapping", None) or getattr(config, "to_dict")()
    out = {}
    for key, value in config.items():
        name = TRANSFORMERS_NAMES.get(key, key)
        if name in out:
            raise ValueError(f"kernel_hub.kernelize: the config maps layer {name} twice (as "
                             f"{key!r} and another name); keep one")
        out[name] = value
    return out


def device_spec(device):
    """kh_runtime_kernelize's device: "cpu", or cuda:sm_XY:cuda_V for a torch cuda device."""
    device = torch.device(device)
    if device.type == "cpu":
        return "cpu", device
    if device.type != "cuda":
        raise ValueError(f"kernel_hub.kernelize: device {device} is neither cpu nor cuda")
    if device.index not in (None, 0):
        raise ValueError(f"kernel_hub.kernelize: {device}: kh_runtime_kernelize binds CUDA device "
                         "0 only; run the model on cuda:0 (CUDA_VISIBLE_DEVICES selects the GPU)")
    major, minor = torch.cuda.get_device_capability(device)
    return f"cuda:sm_{major}{minor}:cuda_{driver_cuda_version()}", device


def driver_cuda_version():
    """The CUDA version the driver supports (cuDriverGetVersion), which decides which variants
    can load; torch.version.cuda (torch's own toolkit) where the driver cannot be asked."""
    import ctypes
    try:
        v = ctypes.c_int()
        if ctypes.CDLL("libcuda.so.1").cuDriverGetVersion(ctypes.byref(v)) == 0 and v.value:
            return f"{v.value // 1000}.{v.value % 1000 // 10}"
    except OSError:
        pass
    return torch.version.cuda


# ---- The replacements ----

def inductor_layer_set(layers=None):
    """The hub layer names left to Inductor under torch.compile: `layers` (names, Transformers'
    names accepted), else $KERNEL_HUB_INDUCTOR_LAYERS, else INDUCTOR_LAYERS."""
    if layers is None:
        env = os.environ.get("KERNEL_HUB_INDUCTOR_LAYERS")
        if env is None:
            return frozenset(INDUCTOR_LAYERS)
        layers = [] if env.strip().lower() in ("", "none") else env.split(",")
    out = set()
    for name in layers:
        name = TRANSFORMERS_NAMES.get(name.strip(), name.strip())
        if name not in LAYERS:
            raise ValueError(f"kernel_hub.kernelize: inductor_layers names {name!r}; expected "
                             f"hub layer names from {LAYERS}")
        out.add(name)
    return frozenset(out)


class _Bound:
    """What a replaced module or function needs: the runtime, the device type it serves and the
    layers left to Inductor while torch.compile traces."""

    def __init__(self, rt, device_type, inductor=frozenset()):
        self.rt, self.device_type, self.inductor = rt, device_type, inductor

    def use(self, layer, x, needs_grad=False):
        """Whether the bound kernel serves this call. Eval tables hold forward ops without
        autograd: a call that needs gradients in eval mode stays with PyTorch. Under
        torch.compile, the layers in `inductor` stay with PyTorch (a constant while tracing)."""
        if needs_grad and self.rt.mode == "eval" and torch.is_grad_enabled():
            return False
        if layer in self.inductor and torch.compiler.is_compiling():
            return False
        return x.device.type == self.device_type and self.rt.is_bound(layer)


def _kernel_rms_norm(mod, x):
    kh = mod._kernel_hub
    needs_grad = x.requires_grad or mod.weight.requires_grad
    if not kh.use("RMSNorm", x, needs_grad) or mod.weight.dtype != x.dtype:
        return mod._kernel_hub_forward(x)
    eps = float(mod._kernel_hub_eps)
    x = x.contiguous()
    if kh.rt.mode == "train":
        y = ops.rms_norm_train(x, mod.weight, eps, kh.rt.id)[0]
        if _recompute is not None and _recompute.rt is kh.rt:
            _recompute.register(y, x, mod.weight, eps)
        return y
    return ops.rms_norm(x, mod.weight, eps, kh.rt.id)


class _NormOutput:
    """A norm output that the layers after it saved for backward: what recomputes it (the norm's
    input, weight, eps: the norm saves x and weight for its own backward anyway), the versions
    that make the recomputation valid, and the recomputed tensor while its savers unpack it."""
    __slots__ = ("y", "x", "weight", "eps", "y_version", "x_version", "packs", "value")

    def __init__(self, y, x, weight, eps):
        self.y, self.x, self.weight, self.eps = weakref.ref(y), x, weight, eps
        self.y_version, self.x_version = y._version, x._version
        self.packs, self.value = 0, None


class _SavedNormView:
    """What a pack hook keeps of a saved view of a norm output: the entry and the view's
    geometry (Linear saves its input reshaped to 2-D)."""
    __slots__ = ("entry", "shape", "stride", "offset")

    def __init__(self, entry, t):
        self.entry, self.shape, self.stride = entry, t.shape, t.stride()
        self.offset = t.storage_offset()


def _modified_error(what):
    return RuntimeError(
        f"one of the variables needed for gradient computation has been modified by an inplace "
        f"operation ({what}; kernel_hub saves tensors through saved_tensors_hooks during a "
        f"kernelized training forward: set KERNEL_HUB_RECOMPUTE_NORM=0 to leave them to autograd)")


class _NormRecompute:
    """Saved-tensor hooks for a kernelized training forward: the outputs of the kernel RMSNorms
    that the next layers save for backward (q/k/v projections, the MLP's gate/up GEMMs: two
    [tokens, hidden] tensors per decoder layer, 1.75 GiB at Qwen3-0.6B, batch 8 x 2048) are not
    kept; backward recomputes each from the norm's input (which the norm keeps for its own
    backward) with the same kernel, once for all its savers, just before they run and before the
    norm's own backward frees that input. Liger keeps them. Every other saved tensor is kept as
    is, with the version check autograd does without hooks."""

    def __init__(self, rt):
        self.rt = rt
        self.outputs = {}  # storage address -> _NormOutput, for this forward

    def register(self, y, x, weight, eps):
        if y.numel():
            self.outputs[y.untyped_storage().data_ptr()] = _NormOutput(y, x, weight, eps)

    def pack(self, t):
        try:
            entry = self.outputs.get(t.untyped_storage().data_ptr()) if t.numel() else None
        except (RuntimeError, NotImplementedError):  # no storage (sparse, nested, a subclass)
            entry = None
        y = entry.y() if entry is not None else None
        if (y is not None and t.dtype == y.dtype and t.device == y.device
                and t._version == entry.y_version
                and t.untyped_storage().nbytes() == y.untyped_storage().nbytes()):
            entry.packs += 1
            return _SavedNormView(entry, t)
        # Detached: an op's saved output would otherwise hold its own node (a reference cycle
        # through C++ that keeps the graph alive when no backward runs); autograd reattaches
        # the node on unpack. The detached tensor shares the version counter.
        try:
            return t.detach(), t._version
        except RuntimeError:  # an inference tensor has no version counter
            return t.detach(), None

    def unpack(self, packed):
        if not isinstance(packed, _SavedNormView):
            t, version = packed
            if version is not None and t._version != version:
                raise _modified_error(f"a saved {tuple(t.shape)} tensor is at version "
                                      f"{t._version}; expected version {version}")
            return t
        e = packed.entry
        if e.value is None:
            if e.x._version != e.x_version:
                raise _modified_error(f"an RMSNorm's input {tuple(e.x.shape)} is at version "
                                      f"{e.x._version}; expected version {e.x_version}")
            with torch.no_grad():
                e.value = ops.rms_norm_train(e.x, e.weight, e.eps, self.rt.id)[0]
        value = e.value.as_strided(packed.shape, packed.stride, packed.offset)
        e.packs -= 1
        if e.packs <= 0:  # its last saver: the recomputed output goes with it
            e.value = None
        return value


# The _NormRecompute of the kernelized training forward running now (None outside one).
_recompute = None


def _recompute_applies(kh):
    """Whether a kernelized forward recomputes norm outputs in backward: eager training with the
    RMSNorm kernel bound, grad enabled, not traced (torch.compile's partitioner chooses what to
    recompute), no saved-tensor hooks of the caller's (an offloading or checkpointing scope keeps
    its own), and KERNEL_HUB_RECOMPUTE_NORM not 0."""
    if (os.environ.get("KERNEL_HUB_RECOMPUTE_NORM", "1") == "0" or kh.rt.mode != "train"
            or not torch.is_grad_enabled() or torch.compiler.is_compiling()
            or not kh.rt.is_bound("RMSNorm")):
        return False
    return _caller_hooks() is None


def _caller_hooks():
    """The innermost saved-tensor hooks in effect (torch's private query; its argument,
    ignore_is_tracing, came in a later torch than the query itself), or None."""
    top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
    if top is None:
        return None
    try:
        return top(False)
    except TypeError:
        return top()


def _run_recomputing_norms(kh, fn, *args, **kwargs):
    """fn(*args, **kwargs), recomputing the kernel RMSNorms' saved outputs in backward where
    _recompute_applies."""
    global _recompute
    if not _recompute_applies(kh):
        return fn(*args, **kwargs)
    scope = _NormRecompute(kh.rt)
    outer, _recompute = _recompute, scope
    try:
        with torch.autograd.graph.saved_tensors_hooks(scope.pack, scope.unpack):
            return fn(*args, **kwargs)
    finally:
        _recompute = outer


class _GateUp(torch.autograd.Function):
    """[gate_proj(x), up_proj(x)] as the one [..., 2 * intermediate] tensor SiluAndMul reads, each
    GEMM writing its half (cuBLAS takes the row stride): no concatenation (a write and a read of
    [tokens, 2 * intermediate] per layer) and no separate gate and up tensors. Saves what the two
    Linear layers would (x and the weights); the backward accumulates both halves' dx in one
    buffer (mm, then addmm_)."""

    @staticmethod
    def forward(ctx, x, w_gate, w_up):
        x2 = x.reshape(-1, x.shape[-1])
        i = w_gate.shape[0]
        h = x2.new_empty(x2.shape[0], 2 * i)
        torch.mm(x2, w_gate.t(), out=h[:, :i])
        torch.mm(x2, w_up.t(), out=h[:, i:])
        ctx.save_for_backward(x, w_gate, w_up)
        return h.view(*x.shape[:-1], 2 * i)

    @staticmethod
    def backward(ctx, dh):
        x, w_gate, w_up = ctx.saved_tensors
        i = w_gate.shape[0]
        dh2 = dh.reshape(-1, 2 * i)
        x2 = x.reshape(-1, x.shape[-1])
        dx = d_gate = d_up = None
        if ctx.needs_input_grad[0]:
            dx = torch.mm(dh2[:, :i], w_gate).addmm_(dh2[:, i:], w_up).view(x.shape)
        if ctx.needs_input_grad[1]:
            d_gate = dh2[:, :i].t().mm(x2)
        if ctx.needs_input_grad[2]:
            d_up = dh2[:, i:].t().mm(x2)
        return dx, d_gate, d_up


def _plain_linear(lin, x):
    """Whether lin(x) is x @ lin.weight^T exactly: a torch Linear (not one an adapter library
    swapped in after kernelize), no bias, no hooks, no autocast, one dtype."""
    return (type(lin) is torch.nn.Linear and lin.bias is None and not lin._forward_hooks
            and not lin._forward_pre_hooks
            and lin.weight.dtype == x.dtype and lin.weight.device == x.device
            and not torch.is_autocast_enabled(x.device.type))


def _kernel_mlp(mod, x):
    kh = mod._kernel_hub
    if not kh.use("SiluAndMul", x):
        return mod._kernel_hub_forward(x)
    if (not torch.compiler.is_compiling() and _plain_linear(mod.gate_proj, x)
            and _plain_linear(mod.up_proj, x)):
        h = _GateUp.apply(x, mod.gate_proj.weight, mod.up_proj.weight)
    else:  # hooks, autocast, or traced by torch.compile (which keeps torch's Linear)
        h = torch.cat([mod.gate_proj(x), mod.up_proj(x)], dim=-1)
    # h is this function's own: its gradient may overwrite it (ops.silu_and_mul consume_input).
    return mod.down_proj(ops.silu_and_mul(h, kh.rt.id, SILU_IN_PLACE))


_swapped = {}


def _forward_as(forward, cls):
    """`forward` under cls.forward's name, docs and signature (inspect.signature follows
    __wrapped__): Transformers' Trainer reads the model's forward signature to choose the dataset
    columns it passes (remove_unused_columns), and *args, **kwargs would drop them all."""
    def wrapper(self, *args, **kwargs):
        return forward(self, *args, **kwargs)

    return functools.update_wrapper(wrapper, cls.forward)


def _swap_forward(mod, forward, kh):
    """Gives `mod` a subclass of its class whose forward is `forward` with the original's
    signature (the original stays reachable as _kernel_hub_forward); torch.compile traces it
    like any module."""
    cls = type(mod)
    if getattr(cls, "_kernel_hub_base", None) is not None:
        cls = cls._kernel_hub_base
    key = (cls, forward)
    if key not in _swapped:
        _swapped[key] = type(cls.__name__, (cls,), {
            "forward": _forward_as(forward, cls), "_kernel_hub_base": cls,
            "_kernel_hub_forward": lambda self, *a, **k: cls.forward(self, *a, **k)})
    mod.__class__ = _swapped[key]
    mod._kernel_hub = kh


def _is_plain_rms_norm(mod):
    if not type(mod).__name__.endswith("RMSNorm"):
        return False
    eps = getattr(mod, "variance_epsilon", getattr(mod, "eps", None))
    w = getattr(mod, "weight", None)
    if not isinstance(eps, float) or not isinstance(w, torch.Tensor) or w.dim() != 1:
        return False
    if w.device.type == "meta":
        return False
    with torch.no_grad():
        x = torch.randn(2, w.shape[0], device=w.device, dtype=w.dtype)
        xf = x.float()
        want = w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(w.dtype)
        base = getattr(type(mod), "_kernel_hub_base", type(mod))
        got = base.forward(mod, x)
    mod._kernel_hub_eps = eps
    return got.shape == want.shape and torch.allclose(got.float(), want.float(), rtol=1e-3,
                                                      atol=1e-3)


def _is_silu_mlp(mod):
    act = getattr(mod, "act_fn", None)
    return (all(isinstance(getattr(mod, n, None), torch.nn.Linear)
                for n in ("gate_proj", "up_proj", "down_proj"))
            and type(act).__name__ in ("SiLU", "SiLUActivation"))


# The _Bound of the kernelized attention module running now (None outside one): the modeling
# module's apply_rotary_pos_emb is one function for every model of that family, so the
# replacement serves only calls made from inside a kernelized model's attention.
_active = None


def _kernel_attention(mod, *args, **kwargs):
    global _active
    outer, _active = _active, mod._kernel_hub
    try:
        return mod._kernel_hub_forward(*args, **kwargs)
    finally:
        _active = outer


def _rotary_replacement(original):
    def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1, **kwargs):
        kh = _active
        if (kh is None or unsqueeze_dim != 1 or kwargs or not kh.use("RotaryEmbedding", q)
                or cos.shape[-1] % 2 or cos.shape[-1] > q.shape[-1] or q.dim() != 4):
            return original(q, k, cos, sin, unsqueeze_dim, **kwargs)
        return ops.rotary(q, k, cos.to(q.dtype), sin.to(q.dtype), kh.rt.id)

    apply_rotary_pos_emb._kernel_hub_original = original
    return apply_rotary_pos_emb


def _loss_replacement(original, kh):
    def ForCausalLMLoss(logits, labels, vocab_size, num_items_in_batch=None, ignore_index=-100,
                        shift_labels=None, **kwargs):
        if not kh.use("CrossEntropy", logits, logits.requires_grad):
            return original(logits, labels, vocab_size, num_items_in_batch=num_items_in_batch,
                            ignore_index=ignore_index, shift_labels=shift_labels, **kwargs)
        logits = logits.float()
        if shift_labels is None:
            labels = torch.nn.functional.pad(labels, (0, 1), value=ignore_index)
            shift_labels = labels[..., 1:].contiguous()
        logits = logits.view(-1, vocab_size)
        shift_labels = shift_labels.view(-1).to(logits.device)
        if kh.rt.mode == "train":
            per_token = ops.cross_entropy_train(logits, shift_labels, ignore_index, kh.rt.id)[0]
        else:
            per_token = ops.cross_entropy(logits, shift_labels, ignore_index, kh.rt.id)
        if num_items_in_batch is None:  # "mean" over the tokens not ignored, as torch does
            return per_token.sum() / (shift_labels != ignore_index).sum()
        if torch.is_tensor(num_items_in_batch):
            num_items_in_batch = num_items_in_batch.to(per_token.device)
        return per_token.sum() / num_items_in_batch

    return ForCausalLMLoss


def _fused_loss(kh, hidden, weight, labels, ignore_index=-100, num_items_in_batch=None,
                shift_labels=None):
    """ForCausalLMLoss's result (mean over the shifted labels not ignored, or the sum over
    num_items_in_batch) from the last hidden states and the lm_head weight, fused."""
    if shift_labels is None:
        labels = torch.nn.functional.pad(labels, (0, 1), value=ignore_index)
        shift_labels = labels[..., 1:]
    shift_labels = shift_labels.reshape(-1).to(hidden.device).contiguous()
    h = hidden.reshape(-1, hidden.shape[-1])
    loss = ops.linear_cross_entropy_train(h, weight, shift_labels, ignore_index, kh.rt.id)[0]
    if num_items_in_batch is not None:  # sum / num_items, as ForCausalLMLoss does
        if torch.is_tensor(num_items_in_batch):
            num_items_in_batch = num_items_in_batch.to(loss.device)
        loss = loss * (shift_labels != ignore_index).sum() / num_items_in_batch
    return loss


def _fused_loss_applies(mod):
    """Whether mod is a *ForCausalLM whose logits are exactly lm_head(hidden) (no bias, no
    softcapping or scaling between them and the loss)."""
    head, config = getattr(mod, "lm_head", None), getattr(mod, "config", None)
    if not isinstance(head, torch.nn.Linear) or head.bias is not None:
        return False
    if not isinstance(getattr(mod, "model", None), torch.nn.Module) or config is None:
        return False
    for attr in ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier"):
        if getattr(config, attr, None) not in (None, 1, 1.0):
            return False
    return hasattr(mod, "loss_function")


def _training_without_cache(mod, args, kwargs):
    """Whether this is a training forward (grad enabled) that did not ask for a KV cache.
    Transformers' use_cache defaults to the config's (True), and its DynamicCache keeps a copy of
    every layer's keys and values ([batch, heads, seq, d]) while the forward runs; the attention
    kernel reads [batch, seq, heads, d] and saves that copy for backward, so with the cache each
    layer's K and V would be held twice (1.8 GiB over Qwen3-0.6B's 28 layers at 16k tokens).
    Gradient checkpointing in Transformers turns the cache off the same way."""
    return (mod._kernel_hub_takes_use_cache and mod.training and torch.is_grad_enabled()
            and len(args) <= 3 and kwargs.get("use_cache") is None
            and kwargs.get("past_key_values") is None and kwargs.get("cache") is None)


# The output fields that hold the KV cache (Transformers 5: cache; 4: past_key_values).
_CACHE_FIELDS = ("cache", "past_key_values")


def _kernel_causal_lm(mod, *args, **kwargs):
    kh = mod._kernel_hub
    no_cache = _training_without_cache(mod, args, kwargs)
    if no_cache and not torch.compiler.is_compiling():
        kwargs = dict(kwargs, use_cache=False)
    # Under torch.compile the cache stays: without one, Transformers cannot rule out packed
    # sequences in the positions while tracing and builds an explicit mask (which sends attention
    # to SDPA). The fused path below leaves it out of the output, so Inductor writes each K and V
    # once, straight in the layout the attention kernel reads.
    labels = kwargs.get("labels")
    weight = mod.lm_head.weight
    if (not mod._kernel_hub_fused_loss or labels is None or len(args) > 5
            or kh.rt.mode != "train" or not kh.use("FusedLinearCrossEntropy", weight)
            or kwargs.get("return_dict") is False):
        return _run_recomputing_norms(kh, mod._kernel_hub_forward, *args, **kwargs)
    kw = {k: v for k, v in kwargs.items()
          if k not in ("labels", "logits_to_keep", "shift_labels")}
    outputs = _run_recomputing_norms(kh, mod.model, *args, **kw)
    hidden = outputs[0]
    if hidden.dtype != weight.dtype:
        hidden = hidden.to(weight.dtype)
    loss = _fused_loss(kh, hidden, weight, labels,
                       num_items_in_batch=kwargs.get("num_items_in_batch"),
                       shift_labels=kwargs.get("shift_labels"))
    from transformers.modeling_outputs import CausalLMOutputWithPast
    fields = {k: v for k, v in outputs.items() if k in mod._kernel_hub_output_fields
              and not (no_cache and k in _CACHE_FIELDS)}
    return CausalLMOutputWithPast(loss=loss, logits=None, **fields)


def kernel_hub_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                         sliding_window=None, is_causal=None, **kwargs):
    """Transformers' attention interface for attn_implementation="kernel_hub": query
    [batch, heads, seq, d] -> ([batch, seq, heads, d], None)."""
    kh = getattr(module, "_kernel_hub", None)
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    # No mask: every key is visible up to the causal diagonal. The kernel's causal mask is
    # aligned bottom-right, which is that diagonal when the lengths are equal or one query
    # attends to all; a longer KV (a static cache's prefill) needs SDPA's top-left alignment.
    lengths_ok = query.dim() == 4 and (query.shape[2] == key.shape[2] or query.shape[2] == 1)
    if (kh is None or not kh.use("Attention", query) or attention_mask is not None
            or dropout > 0.0 or not lengths_ok):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling,
                                      dropout=dropout, sliding_window=sliding_window,
                                      is_causal=is_causal, **kwargs)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    window_left = sliding_window - 1 if sliding_window else -1
    out, _ = ops.attention(query.transpose(1, 2).contiguous(), key.transpose(1, 2).contiguous(),
                           value.transpose(1, 2).contiguous(), int(bool(causal)), window_left,
                           float(scale), kh.rt.id)
    return out, None


def kernel_hub_mask(*args, **kwargs):
    """The mask function of attn_implementation="kernel_hub": None (the kernel masks causally by
    itself) for a plain causal mask without padding or window and equal lengths or one query,
    also while tracing or capturing a CUDA graph (where SDPA's mask function builds the mask);
    otherwise SDPA's mask, and kernel_hub_attention then falls back to SDPA."""
    from transformers.masking_utils import causal_mask_function, sdpa_mask
    q, kv = kwargs.get("q_length"), kwargs.get("kv_length")
    if (not args and kwargs.get("attention_mask") is None and kwargs.get("local_size") is None
            and kwargs.get("mask_function") is causal_mask_function
            and isinstance(q, int) and isinstance(kv, int) and (q == kv or q == 1)):
        return None
    return sdpa_mask(*args, **kwargs)


def register_attention():
    """Registers "kernel_hub" in Transformers' AttentionInterface and AttentionMaskInterface so
    attn_implementation="kernel_hub" can be asked for. Called by kernelize and on import when
    transformers is already imported."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface
    AttentionInterface.register("kernel_hub", kernel_hub_attention)
    AttentionMaskInterface.register("kernel_hub", kernel_hub_mask)


def _attention_modules(model):
    for m in model.modules():
        if hasattr(m, "q_proj") and hasattr(m, "o_proj") and hasattr(m, "head_dim"):
            yield m


def kernelize(model, config=None, device=None, mode=None, hub=None, lock=None, strict=False,
              inductor_layers=None):
    """Binds kernel-hub packages to `model`'s layers and returns the model.

    config  a KernelConfig dict in any form kh_runtime_kernelize accepts (Transformers' plain
            {"RMSNorm": "org/repo", ...}, per device {"RMSNorm": {"cuda": ..., "cpu": ...}}, mode
            maps {"eval": ..., "train": ...}), or a transformers.KernelConfig; keys may be
            Transformers' names (TRANSFORMERS_NAMES). Default: DEFAULT_CONFIG.
    device  torch device the model runs on (default: its parameters' device)
    mode    "inference"/"eval", "training"/"train", or None (both): which tables are bound
    hub     hub address (default $KERNEL_HUB_ENDPOINT, else the embedded default hub)
    lock    a kernels.lock: only its digests are accepted
    strict  a mapped layer that falls back fails instead
    inductor_layers
            hub layer names that keep PyTorch's code while torch.compile traces the model, for
            Inductor to fuse (default: $KERNEL_HUB_INDUCTOR_LAYERS, else INDUCTOR_LAYERS); ()
            keeps every kernel under compile. Eager calls are not affected.

    model.train() / model.eval() then publish the matching table (Runtime.set_mode). The
    runtime and its report are model.kernel_hub_runtime and .report."""
    if device is None:
        p = next(model.parameters(), None)
        device = p.device if p is not None else "cpu"
    spec, device = device_spec(device)
    if mode not in MODES:
        raise ValueError(f"kernel_hub.kernelize: mode {mode!r}; expected one of "
                         f"{sorted(k for k in MODES if k)} or None (both)")
    rt = Runtime(LAYERS, strict=strict)
    rt.kernelize(hub_config(config), hub=hub, device=spec, modes=MODES[mode], strict=strict,
                 lock=lock)
    kh = _Bound(rt, device.type, inductor_layer_set(inductor_layers))
    replaced = {name: 0 for name in LAYERS}
    for m in model.modules():
        if _is_plain_rms_norm(m):
            _swap_forward(m, _kernel_rms_norm, kh)
            replaced["RMSNorm"] += 1
        elif _is_silu_mlp(m):
            _swap_forward(m, _kernel_mlp, kh)
            replaced["SiluAndMul"] += 1
    # Rotary: the modeling module's apply_rotary_pos_emb, which its attention calls by name;
    # the attention modules mark themselves active while they run (_kernel_attention).
    for m in list(_attention_modules(model)):
        base = getattr(type(m), "_kernel_hub_base", type(m))
        mod = sys.modules.get(base.__module__)
        fn = getattr(mod, "apply_rotary_pos_emb", None) if mod else None
        if fn is not None and not hasattr(fn, "_kernel_hub_original"):
            mod.apply_rotary_pos_emb = _rotary_replacement(fn)
        if fn is not None:
            replaced["RotaryEmbedding"] += 1
        _swap_forward(m, _kernel_attention, kh)
    if "Attention" in rt.bound["eval"] or "Attention" in rt.bound["train"]:
        register_attention()
        if getattr(model.config, "_attn_implementation", None) != "kernel_hub" and hasattr(
                model, "set_attn_implementation"):
            model.set_attn_implementation("kernel_hub")
        replaced["Attention"] = sum(1 for _ in _attention_modules(model))
    if hasattr(type(model), "loss_function"):
        from transformers.loss.loss_utils import ForCausalLMLoss
        current = model.loss_function
        if getattr(current, "__name__", "") == "ForCausalLMLoss":
            model.loss_function = _loss_replacement(
                ForCausalLMLoss if current is ForCausalLMLoss else current, kh)
            replaced["CrossEntropy"] = 1
    # The *ForCausalLM's forward: the fused loss in training, and no KV cache in a training
    # forward when the attention kernel serves training (_training_without_cache). The flags
    # are set even when nothing is swapped, for a model kernelized before with another config.
    fused = "FusedLinearCrossEntropy" in rt.bound["train"] and _fused_loss_applies(model)
    base_forward = getattr(type(model), "_kernel_hub_base", type(model)).forward
    takes_use_cache = (isinstance(getattr(model, "model", None), torch.nn.Module)
                       and "use_cache" in inspect.signature(base_forward).parameters
                       and "Attention" in rt.bound["train"])
    # And the norm outputs recomputed in backward (_NormRecompute), around the whole forward.
    recompute_norms = (isinstance(getattr(model, "model", None), torch.nn.Module)
                       and "RMSNorm" in rt.bound["train"] and replaced["RMSNorm"] > 0)
    model._kernel_hub_fused_loss = fused
    model._kernel_hub_takes_use_cache = takes_use_cache
    if fused or takes_use_cache or recompute_norms:
        model._kernel_hub_output_fields = frozenset()
        if fused:
            import dataclasses
            from transformers.modeling_outputs import CausalLMOutputWithPast
            # What the base model's output hands on (past key values or cache, hidden states,
            # attentions), read once here so the traced forward does no introspection.
            model._kernel_hub_output_fields = frozenset(
                f.name for f in dataclasses.fields(CausalLMOutputWithPast)) - {"loss", "logits"}
        _swap_forward(model, _kernel_causal_lm, kh)
        replaced["FusedLinearCrossEntropy"] = int(fused)
    _hook_train(model, rt)
    model.kernel_hub_runtime = rt
    model.kernel_hub_replaced = replaced
    return model


def _hook_train(model, rt):
    """model.train(mode) / model.eval() also publish the runtime's train or eval table."""
    base_train = getattr(model.train, "_kernel_hub_base", model.train)

    def train(mode=True):
        out = base_train(mode)
        rt.set_mode("train" if mode else "eval")
        return out

    train._kernel_hub_base = base_train
    model.train = train
    rt.set_mode("train" if model.training else "eval")
