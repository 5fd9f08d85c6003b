#!/usr/bin/env python3
"""Kernel benchmarks on the GPU: our kernels called through the loader (the C API of
libkernel_hub.so via ctypes, with DLPack views of PyTorch tensors), against PyTorch eager and
torch.compile (dynamic=False, fullgraph=True), plus a device copy for the bandwidth roofline of
the same run. Correctness is checked against an fp32 reference before timing. Median of
triton.testing.do_bench (L2 flushed before each call), providers interleaved per shape, the sweep
run twice (rows whose two sweeps differ by more than 3% are flagged).

Usage: bench_kernels.py --lib build/libkernel_hub.so --packages build/kernels [--quick]
       [--more-only] [--sweep-src DIR [--sweep-what ce,normbwd,normfwd,act]]
       (--sweep-src: variants compiled from DIR/<pkg>/<pkg>.cu, timed before the main table)
"""
import argparse
import ctypes as C
import math
import os
import sys

import torch
import torch.nn.functional as F
import triton.testing

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools",
                                "python", "kernel_hub"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bundled beside this script
from kernel_hub_ctypes import (  # noqa: E402
    KH_OK, KH_MODE_EVAL, KH_MODE_TRAIN, KH_ARG_TENSOR, KH_ARG_INT, KH_ARG_FLOAT, DLDevice,
    DLDataType, DLTensor, Arg, OpFn, load)

DL_CUDA, DL_FLOAT, DL_BFLOAT = 2, 2, 4
DTYPES = {torch.bfloat16: (DL_BFLOAT, 16), torch.float16: (DL_FLOAT, 16),
          torch.float32: (DL_FLOAT, 32), torch.int64: (0, 64), torch.int32: (0, 32)}  # kDLInt


class Loader:
    """One kh runtime with a slot per layer, bound to the packages for eval and train."""

    def __init__(self, lib_path, packages):
        self.lib = lib = load(lib_path)
        self.rt = lib.kh_runtime_create(1)
        self.packages = packages
        self.slots = {}
        self.keep = []

    def check(self, status, what):
        if status != KH_OK:
            raise RuntimeError(f"{what}: status {status}: {self.lib.kh_last_error().decode()}")

    def slot(self, layer, package):
        if layer not in self.slots:
            s = C.c_uint32()
            self.check(self.lib.kh_runtime_add_slot(self.rt, layer.encode(), OpFn(), OpFn(),
                                                    OpFn(), 0, C.byref(s)), "add_slot " + layer)
            for mode in (KH_MODE_EVAL, KH_MODE_TRAIN):
                bound = C.c_int32()
                self.check(self.lib.kh_runtime_bind(
                    self.rt, layer.encode(), f"{self.packages}/{package}".encode(), None, mode,
                    torch.cuda.current_device(), C.byref(bound)), f"bind {layer}")
            self.slots[layer] = s.value
        return self.slots[layer]

    def args(self, *values):
        """kh_arg_t array over tensors (DLPack views of their storage), ints and floats."""
        arr = (Arg * len(values))()
        for i, v in enumerate(values):
            if isinstance(v, torch.Tensor):
                code, bits = DTYPES[v.dtype]
                shape = (C.c_int64 * v.dim())(*v.shape)
                strides = (C.c_int64 * v.dim())(*v.stride())
                t = DLTensor(v.data_ptr(), DLDevice(DL_CUDA, v.device.index), v.dim(),
                             DLDataType(code, bits, 1), shape, strides, 0)
                self.keep += [shape, strides, t, v]
                arr[i].kind, arr[i].v.t = KH_ARG_TENSOR, C.pointer(t)
            elif v is None:  # an optional tensor not passed
                arr[i].kind, arr[i].v.t = KH_ARG_TENSOR, None
            elif isinstance(v, int):
                arr[i].kind, arr[i].v.i = KH_ARG_INT, v
            else:
                arr[i].kind, arr[i].v.f = KH_ARG_FLOAT, float(v)
        self.keep.append(arr)
        return arr

    def call(self, layer, package, mode, backward, *values):
        """A zero-argument function that launches the op on the current stream."""
        slot, arr, n = self.slot(layer, package), self.args(*values), len(values)
        fn = self.lib.kh_runtime_backward if backward else self.lib.kh_runtime_forward
        set_mode, rt, dev = self.lib.kh_runtime_set_mode, self.rt, torch.cuda.current_device()

        def run():
            set_mode(rt, mode)
            status = fn(rt, slot, dev, arr, n, C.c_void_p(torch.cuda.current_stream().cuda_stream))
            if status != KH_OK:
                self.check(status, layer)
        return run


def bind(fn, *args):
    return lambda: fn(*args)


def rel_err(out, ref):
    out, ref = out.float(), ref.float()
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def pow2_at_least(n):
    p = 1
    while p < n and p < 1024:
        p <<= 1
    return p


def ws_rows(cols, sms):
    """kh_norm_workspace_rows (kernels/norm/launch_config.h) for bf16: a row per backward CTA,
    CTAs for ~512 threads per SM (threads per row for 4 vectors of 8 each, 32..512; 128-thread
    CTAs for short rows)."""
    nvec = cols // 8
    if nvec > 512 * 4:
        return sms
    tpr = max(pow2_at_least((nvec + 3) // 4), pow2_at_least(min(nvec, 32)))
    rpb = 1 if tpr >= 128 else 128 // tpr
    per_sm = 512 // (tpr * rpb) if tpr * rpb < 512 else 1
    return sms * per_sm


def cases(kh, quick):
    """Yields (name, shape text, bytes, {provider: fn}, check) per op and shape."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    bf = torch.bfloat16
    shapes = [(4096, 4096), (16384, 8192)] if not quick else [(4096, 4096)]
    for m, n in shapes:
        x = torch.randn(m, n, device="cuda", dtype=bf)
        w = torch.randn(n, device="cuda", dtype=bf) * 0.1 + 1
        b = torch.randn(n, device="cuda", dtype=bf) * 0.1
        r = torch.randn(m, n, device="cuda", dtype=bf)
        y = torch.full_like(x, float("nan"))
        eps = 1e-6
        shape = f"{m}x{n}"

        rms = lambda x_, w_, n=n, eps=eps: F.rms_norm(x_, (n,), w_, eps)  # bind n now
        ours = kh.call("RMSNorm", "norm", KH_MODE_EVAL, False, x, w, eps, y)
        ours()
        torch.cuda.synchronize()
        err = rel_err(y, rms(x.float(), w.float()))
        yield ("rmsnorm fwd", shape, 2 * m * n * 2 + 2 * n,
               {"ours": ours, "eager": bind(rms, x, w),
                "compile": bind(torch.compile(rms, dynamic=False, fullgraph=True), x, w)}, (x, w), err)

        y2, res_out = torch.empty_like(x), torch.empty_like(x)
        def add_rms(x_, r_, w_, n=n, eps=eps):
            s = x_ + r_
            return F.rms_norm(s, (n,), w_, eps), s
        ours = kh.call("FusedAddRMSNorm", "norm", KH_MODE_EVAL, False, x, r, w, eps, y2, res_out)
        ours()
        torch.cuda.synchronize()
        err = rel_err(y2, add_rms(x.float(), r.float(), w.float())[0])
        yield ("add+rmsnorm fwd", shape, 4 * m * n * 2 + 2 * n,
               {"ours": ours, "eager": bind(add_rms, x, r, w),
                "compile": bind(torch.compile(add_rms, dynamic=False, fullgraph=True), x, r, w)},
               (x, r, w), err)

        ln = lambda x_, w_, b_, n=n: F.layer_norm(x_, (n,), w_, b_, 1e-5)
        ours = kh.call("LayerNorm", "norm", KH_MODE_EVAL, False, x, w, b, 1e-5, y)
        ours()
        torch.cuda.synchronize()
        err = rel_err(y, ln(x.float(), w.float(), b.float()))
        yield ("layernorm fwd", shape, 2 * m * n * 2 + 4 * n,
               {"ours": ours, "eager": bind(ln, x, w, b),
                "compile": bind(torch.compile(ln, dynamic=False, fullgraph=True), x, w, b)}, (x, w, b),
               err)

        # forward + backward: train forward (saves rstd) then backward (dx, dweight).
        dy = torch.randn_like(x)
        rstd = torch.empty(m, device="cuda", dtype=torch.float32)
        dx, dw = torch.empty_like(x), torch.empty_like(w)
        ws = torch.empty(ws_rows(n, sms), n, device="cuda", dtype=torch.float32)
        fwd = kh.call("RMSNorm", "norm", KH_MODE_TRAIN, False, x, w, eps, y, rstd)
        bwd = kh.call("RMSNorm", "norm", KH_MODE_TRAIN, True, dy, x, w, rstd, dx, dw, ws)
        def ours_fb(fwd=fwd, bwd=bwd):
            fwd()
            bwd()
        ours_fb()
        torch.cuda.synchronize()
        xr, wr = x.float().requires_grad_(), w.float().requires_grad_()
        gx, gw = torch.autograd.grad(rms(xr, wr), (xr, wr), dy.float())
        err = max(rel_err(dx, gx), rel_err(dw, gw))
        xg, wg = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
        def torch_fb(f, xg=xg, wg=wg, dy=dy):
            return lambda: torch.autograd.grad(f(xg, wg), (xg, wg), dy)
        crms = torch.compile(rms, dynamic=False, fullgraph=True)
        yield ("rmsnorm fwd+bwd", shape, 5 * m * n * 2,
               {"ours": ours_fb, "eager": torch_fb(rms), "compile": torch_fb(crms)}, (), err)

        # LayerNorm: train forward (saves mean, rstd), backward (dx, dweight, dbias). Bytes: x
        # read and y written by the forward, x and dy read and dx written by the backward.
        mean = torch.empty(m, device="cuda", dtype=torch.float32)
        db = torch.empty_like(b)
        ws2 = torch.empty(ws_rows(n, sms), 2 * n, device="cuda", dtype=torch.float32)
        fwd = kh.call("LayerNorm", "norm", KH_MODE_TRAIN, False, x, w, b, 1e-5, y, mean, rstd)
        bwd = kh.call("LayerNorm", "norm", KH_MODE_TRAIN, True, dy, x, w, mean, rstd, dx, dw, db,
                      ws2)
        def ours_lfb(fwd=fwd, bwd=bwd):
            fwd()
            bwd()
        ours_lfb()
        torch.cuda.synchronize()
        xr, wr, br = (t.float().requires_grad_() for t in (x, w, b))
        gx, gw, gb = torch.autograd.grad(ln(xr, wr, br), (xr, wr, br), dy.float())
        err = max(rel_err(dx, gx), rel_err(dw, gw), rel_err(db, gb))
        xg, wg, bg = (t.detach().clone().requires_grad_() for t in (x, w, b))
        def torch_lfb(f, xg=xg, wg=wg, bg=bg, dy=dy):
            return lambda: torch.autograd.grad(f(xg, wg, bg), (xg, wg, bg), dy)
        cln = torch.compile(ln, dynamic=False, fullgraph=True)
        yield ("layernorm fwd+bwd", shape, 5 * m * n * 2,
               {"ours": ours_lfb, "eager": torch_lfb(ln), "compile": torch_lfb(cln)}, (), err)

    for m, d in ([(4096, 4096), (16384, 8192)] if not quick else [(4096, 4096)]):
        xin = torch.randn(m, 2 * d, device="cuda", dtype=bf)
        out = torch.full((m, d), float("nan"), device="cuda", dtype=bf)
        shape = f"{m}x2*{d}"
        silu_mul = lambda t, d=d: F.silu(t[:, :d]) * t[:, d:]
        ours = kh.call("SiluAndMul", "activation", KH_MODE_EVAL, False, xin, out)
        ours()
        torch.cuda.synchronize()
        err = rel_err(out, silu_mul(xin.float()))
        yield ("silu_and_mul fwd", shape, 3 * m * d * 2,
               {"ours": ours, "eager": bind(silu_mul, xin),
                "compile": bind(torch.compile(silu_mul, dynamic=False, fullgraph=True), xin)}, (), err)

        gelu_mul = lambda t, d=d: F.gelu(t[:, :d], approximate="tanh") * t[:, d:]
        ours = kh.call("GeluAndMul", "activation", KH_MODE_EVAL, False, xin, 1, out)
        ours()
        torch.cuda.synchronize()
        err = rel_err(out, gelu_mul(xin.float()))
        yield ("gelu_tanh_and_mul fwd", shape, 3 * m * d * 2,
               {"ours": ours, "eager": bind(gelu_mul, xin),
                "compile": bind(torch.compile(gelu_mul, dynamic=False, fullgraph=True), xin)}, (), err)

        dy = torch.randn(m, d, device="cuda", dtype=bf)
        dxin = torch.empty_like(xin)
        fwd = kh.call("SiluAndMul", "activation", KH_MODE_TRAIN, False, xin, out)
        bwd = kh.call("SiluAndMul", "activation", KH_MODE_TRAIN, True, dy, xin, dxin)
        def ours_fb(fwd=fwd, bwd=bwd):
            fwd()
            bwd()
        ours_fb()
        torch.cuda.synchronize()
        xr = xin.float().requires_grad_()
        (gref,) = torch.autograd.grad(silu_mul(xr), (xr,), dy.float())
        err = rel_err(dxin, gref)
        xg = xin.detach().clone().requires_grad_()
        csm = torch.compile(silu_mul, dynamic=False, fullgraph=True)
        def torch_fb(f, xg=xg, dy=dy):
            return lambda: torch.autograd.grad(f(xg), (xg,), dy)
        yield ("silu_and_mul fwd+bwd", shape, 8 * m * d * 2,
               {"ours": ours_fb, "eager": torch_fb(silu_mul), "compile": torch_fb(csm)}, (), err)


def cases_more(kh):
    """Softmax (forward, backward), cross-entropy (forward; forward fused with the gradient) and
    rotary (forward, backward) at the issue's shapes."""
    bf = torch.bfloat16
    for m, n in ((4096, 4096), (16384, 8192)):
        x = torch.randn(m, n, device="cuda", dtype=bf) * 3
        y = torch.full_like(x, float("nan"))
        sm = lambda t: torch.softmax(t, dim=-1)
        ours = kh.call("Softmax", "softmax", KH_MODE_EVAL, False, x, y)
        ours()
        torch.cuda.synchronize()
        err = rel_err(y, sm(x.float()))
        yield ("softmax fwd", f"{m}x{n}", 2 * m * n * 2,
               {"ours": ours, "eager": bind(sm, x),
                "compile": bind(torch.compile(sm, dynamic=False, fullgraph=True), x)}, (), err)

        # Backward alone, from the saved y: dx = y * (dy - sum(dy * y)). Eager is the kernel
        # autograd runs (_softmax_backward_data); compile fuses the same op. Bytes: dy and y read,
        # dx written.
        dy = torch.randn_like(x)
        dx = torch.full_like(x, float("nan"))
        ours = kh.call("Softmax", "softmax", KH_MODE_TRAIN, True, dy, y, dx)
        ours()
        torch.cuda.synchronize()
        yf = y.float()
        err = rel_err(dx, yf * (dy.float() - (dy.float() * yf).sum(-1, keepdim=True)))
        smb = lambda g, t: torch._softmax_backward_data(g, t, -1, t.dtype)
        yield ("softmax bwd", f"{m}x{n}", 3 * m * n * 2,
               {"ours": ours, "eager": bind(smb, dy, y),
                "compile": bind(torch.compile(smb, dynamic=False, fullgraph=True), dy, y)}, (), err)

    t, v = 4096, 128256
    logits = torch.randn(t, v, device="cuda", dtype=bf) * 2
    targets = torch.randint(0, v, (t,), device="cuda", dtype=torch.int64)
    targets[::17] = -100
    loss = torch.full((t,), float("nan"), device="cuda", dtype=torch.float32)
    ce = lambda l, tg: F.cross_entropy(l.float(), tg, ignore_index=-100, reduction="none")
    ours = kh.call("CrossEntropy", "softmax", KH_MODE_EVAL, False, logits, targets, -100, loss)
    ours()
    torch.cuda.synchronize()
    err = rel_err(loss, ce(logits, targets))
    yield ("cross_entropy fwd", f"{t}x{v}", t * v * 2 + 12 * t,
           {"ours": ours, "eager": bind(ce, logits, targets),
            "compile": bind(torch.compile(ce, dynamic=False, fullgraph=True), logits, targets)},
           (), err)

    # Loss and gradient, as training runs it: torch's mean loss then autograd for dlogits
    # (bf16, like the logits); ours is the fused train op with grad_scale = 1 / valid tokens,
    # which writes the per-token loss and dlogits in one launch, then the mean of the loss.
    # Bytes: logits read once, dlogits written once, targets and loss.
    valid = int((targets != -100).sum())
    dlogits = torch.full_like(logits, float("nan"))
    train = kh.call("CrossEntropy", "softmax", KH_MODE_TRAIN, False, logits, targets, -100,
                    1.0 / valid, loss, dlogits)
    def ours_fg(train=train, loss=loss, valid=valid):
        train()
        return loss.sum() / valid
    ours_fg()
    torch.cuda.synchronize()
    lr = logits.float().requires_grad_()
    ref_loss = F.cross_entropy(lr, targets, ignore_index=-100)
    (gref,) = torch.autograd.grad(ref_loss, (lr,))
    err = max(rel_err(dlogits, gref), rel_err(ours_fg(), ref_loss.detach()))
    del lr, gref
    lg = logits.detach().clone().requires_grad_()
    cem = lambda l, tg: F.cross_entropy(l.float(), tg, ignore_index=-100)
    ccem = torch.compile(cem, dynamic=False, fullgraph=True)
    def torch_fg(f, lg=lg, tg=targets):
        return lambda: torch.autograd.grad(f(lg, tg), (lg,))
    yield ("cross_entropy fwd+grad", f"{t}x{v}", 2 * t * v * 2 + 12 * t,
           {"ours": ours_fg, "eager": torch_fg(cem), "compile": torch_fg(ccem)}, (), err)
    del lg

    hq, hk, hd = 32, 8, 128
    inv = 1.0 / (10000 ** (torch.arange(0, hd, 2, device="cuda", dtype=torch.float32) / hd))
    freqs = torch.outer(torch.arange(8192, device="cuda", dtype=torch.float32), inv)
    cos, sin = freqs.cos().contiguous(), freqs.sin().contiguous()
    for tokens in (4096, 16384):
        q = torch.randn(tokens, hq, hd, device="cuda", dtype=bf)
        k = torch.randn(tokens, hk, hd, device="cuda", dtype=bf)
        pos = torch.randint(0, 8192, (tokens,), device="cuda", dtype=torch.int64)

        def rope(q_, k_, pos_, sign=1.0):  # NeoX (rotate halves), out of place as users write it
            c, s_ = cos[pos_][:, None, :], sign * sin[pos_][:, None, :]
            def rot(t_):
                a, b = t_[..., : hd // 2].float(), t_[..., hd // 2:].float()
                return torch.cat((a * c - b * s_, b * c + a * s_), dim=-1).to(t_.dtype)
            return rot(q_), rot(k_)
        # The backward of RoPE is the inverse rotation (sin negated), what autograd computes
        # through the rotate-half ops; ours applies it in place to dq, dk.
        rope_bwd = lambda q_, k_, pos_: rope(q_, k_, pos_, -1.0)
        nbytes = 2 * (q.numel() + k.numel()) * 2 + tokens * 8 + 2 * tokens * (hd // 2) * 4
        shape = f"{tokens}x({hq}+{hk})x{hd}"
        for name, layer_bwd, ref in (("rope neox q+k (in place)", False, rope),
                                     ("rope neox bwd dq+dk (in place)", True, rope_bwd)):
            q0, k0 = q.clone(), k.clone()
            once = kh.call("RotaryEmbedding", "rotary", KH_MODE_TRAIN if layer_bwd else KH_MODE_EVAL,
                           layer_bwd, pos, q0, k0, cos, sin, 1)
            once()
            torch.cuda.synchronize()
            rq, rk = ref(q.float(), k.float(), pos)
            err = max(rel_err(q0, rq), rel_err(k0, rk))
            # In place on q, k: repeated calls keep rotating them, which changes no timing.
            ours = kh.call("RotaryEmbedding", "rotary", KH_MODE_TRAIN if layer_bwd else KH_MODE_EVAL,
                           layer_bwd, pos, q, k, cos, sin, 1)
            yield (name, shape, nbytes,
                   {"ours": ours, "eager": bind(ref, q, k, pos),
                    "compile": bind(torch.compile(ref, dynamic=False, fullgraph=True), q, k, pos)},
                   (), err)


def variant_sweep(src_dir, rep, what, kh):
    """Variants at the headline shapes, compiled from the shipped sources with NVRTC (through
    CuPy) with -D tuning switches and launched with explicit geometry (or, for the norm backward,
    called through the loader with several workspace sizes): one GPU call compares several
    designs. `what`: parts to run (normfwd, act, ce, normbwd). Prints one line per variant (µs,
    TB/s, rel err)."""
    import cupy as cp
    import numpy as np
    bf = torch.bfloat16
    bench_v = lambda fn: triton.testing.do_bench(fn, warmup=10, rep=rep, return_mode="median")
    mods = {}

    def mod(pkg, defs):
        key = (pkg, defs)
        if key not in mods:
            src = open(f"{src_dir}/{pkg}/{pkg}.cu").read()
            opts = ("--std=c++17", "-default-device") + tuple(f"-D{d}" for d in defs)
            try:
                mods[key] = cp.RawModule(code=src, options=opts, backend="nvrtc")
                probe = {"norm": "norm_reduce_partials_bf16", "softmax": "ce_bwd_bf16_vec"}
                mods[key].get_function(probe.get(pkg, "act_silu_fwd_bf16_vec"))  # compiles now
            except Exception as e:  # report and go on with the other variants
                print(f"  !! {pkg} {defs}: {str(e)[:300]}")
                mods[key] = None
        return mods[key]

    P = lambda t: np.uint64(t.data_ptr() if t is not None else 0)
    if "ce" in what:
        sweep_ce(mod, P, bench_v)
    if "normbwd" in what:
        sweep_norm_bwd(kh, bench_v)
    m, n = 16384, 8192
    if "normfwd" not in what and "act" not in what:
        return
    x = torch.randn(m, n, device="cuda", dtype=bf)
    r = torch.randn(m, n, device="cuda", dtype=bf)
    w = torch.randn(n, device="cuda", dtype=bf) * 0.1 + 1
    b = torch.randn(n, device="cuda", dtype=bf) * 0.1
    y, ro = torch.empty_like(x), torch.empty_like(x)
    refs = {"rms": F.rms_norm(x.float(), (n,), w.float(), 1e-6),
            "add_rms": F.rms_norm(x.float() + r.float(), (n,), w.float(), 1e-6),
            "ln": F.layer_norm(x.float(), (n,), w.float(), b.float(), 1e-5)}
    nbytes = {"rms": 2 * m * n * 2, "add_rms": 4 * m * n * 2, "ln": 2 * m * n * 2}
    print(f"\n## sweep: norm fwd {m}x{n} bf16 (defs, threads/row, rows/CTA)")
    for kind in (("rms", "ln", "add_rms") if "normfwd" in what else ()):
        for defs in ((), ("KH_NORM_PARAMS_LATE=0",), ("KH_STREAM_LOAD=0",)):
            if mod("norm", defs) is None:
                continue
            k = mod("norm", defs).get_function(f"norm_fwd_{kind}_bf16_vec_reg")
            for tpr, rpb in ((128, 1), (256, 1)):
                if defs and (tpr, rpb) != (128, 1):
                    continue
                eps = 1e-5 if kind == "ln" else 1e-6
                args = (P(x), np.int64(n), P(r if kind == "add_rms" else None), np.int64(n), P(w),
                        P(b if kind == "ln" else None), P(y), np.int64(n),
                        P(ro if kind == "add_rms" else None), np.int64(n), P(None), P(None),
                        np.int64(m), np.int32(n), np.float32(eps))
                fn = lambda k=k, args=args, g=(m + rpb - 1) // rpb, blk=(tpr, rpb): k((g,), blk, args)
                y.fill_(float("nan"))
                fn()
                torch.cuda.synchronize()
                err = rel_err(y, refs[kind])
                us = bench_v(fn) * 1e3
                print(f"{kind:8s} {','.join(defs) or 'default':24s} {tpr:4d} {rpb:2d}  {us:7.1f} us "
                      f"{nbytes[kind] / us / 1e6:5.2f} TB/s  err {err:.1e}")
    d = 8192
    xin = torch.randn(m, 2 * d, device="cuda", dtype=bf)
    out = torch.empty(m, d, device="cuda", dtype=bf)
    refs = {"silu_and_mul": F.silu(xin[:, :d].float()) * xin[:, d:].float(),
            "gelu_tanh_and_mul": F.gelu(xin[:, :d].float(), approximate="tanh") * xin[:, d:].float()}
    print(f"\n## sweep: act fwd {m}x2*{d} bf16 (defs, tx, ty)")
    for op in (("silu_and_mul", "gelu_tanh_and_mul") if "act" in what else ()):
        for unroll in (4,):  # kUnroll of activation.cu
            for load in (2, 0):
                mo = mod("activation", (f"KH_STREAM_LOAD={load}",))
                if mo is None:
                    continue
                k = mo.get_function(f"act_{op}_fwd_bf16_vec")
                nvec = d // 8
                for tx in (256,):
                    if tx * unroll > nvec * 2:
                        continue
                    ty = max(1, 256 // tx) if tx <= 256 else 1
                    gx, gy = (m + ty - 1) // ty, (nvec + tx * unroll - 1) // (tx * unroll)
                    args = (P(xin), np.int64(2 * d), P(None), np.int64(0), P(out), np.int64(d),
                            np.int64(m), np.int32(d))
                    fn = lambda k=k, args=args, g=(gx, gy), blk=(tx, ty): k(g, blk, args)
                    out.fill_(float("nan"))
                    fn()
                    torch.cuda.synchronize()
                    err = rel_err(out, refs[op])
                    us = bench_v(fn) * 1e3
                    print(f"{op:18s} unroll {unroll} load {load} {tx:4d} {ty:2d}  {us:7.1f} us "
                          f"{3 * m * d * 2 / us / 1e6:5.2f} TB/s  err {err:.1e}")


def sweep_ce(mod, P, bench_v):
    """Cross-entropy 4096 x 128256 bf16, eval and train kernels, with 0..6 resident vectors per
    thread (KH_CE_FWD_RES, KH_CE_TRAIN_RES), at the shipped geometry (1024 threads per row)."""
    import numpy as np
    t, v = 4096, 128256
    x = torch.randn(t, v, device="cuda", dtype=torch.bfloat16) * 2
    tg = torch.randint(0, v, (t,), device="cuda", dtype=torch.int64)
    tg[::17] = -100
    loss = torch.empty(t, device="cuda", dtype=torch.float32)
    dx = torch.empty_like(x)
    ref = F.cross_entropy(x.float(), tg, ignore_index=-100, reduction="none")
    print(f"\n## sweep: cross-entropy {t}x{v} bf16 (kernel, resident vectors per thread)")
    for kernel, switch, res in (("ce_fwd", "KH_CE_FWD_RES", 0), ("ce_fwd", "KH_CE_FWD_RES", 4),
                                ("ce_train", "KH_CE_TRAIN_RES", 0),
                                ("ce_train", "KH_CE_TRAIN_RES", 4),
                                ("ce_train", "KH_CE_TRAIN_RES", 6)):
        mo = mod("softmax", (f"{switch}={res}",))
        if mo is None:
            continue
        k = mo.get_function(f"{kernel}_bf16_vec")
        args = (P(x), np.int64(v), P(tg), np.int64(-100), P(loss), P(dx), np.int64(v),
                np.float32(1.0), np.int64(t), np.int32(v))
        fn = lambda k=k, args=args: k((t,), (1024, 1), args)
        loss.fill_(float("nan"))
        fn()
        torch.cuda.synchronize()
        err = rel_err(loss, ref)
        us = bench_v(fn) * 1e3
        nbytes = t * v * 2 * (2 if kernel == "ce_train" else 1)
        print(f"{kernel:9s} {switch}={res}  {us:7.1f} us {nbytes / us / 1e6:5.2f} TB/s  "
              f"loss err {err:.1e}")


def sweep_norm_bwd(kh, bench_v):
    """RMSNorm and LayerNorm backward at 16384 x 8192 bf16 with 1, 2 and 3 walkers per SM."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    m, n = 16384, 8192
    bf = torch.bfloat16
    x, dy = torch.randn(m, n, device="cuda", dtype=bf), torch.randn(m, n, device="cuda", dtype=bf)
    w = torch.randn(n, device="cuda", dtype=bf) * 0.1 + 1
    b = torch.randn(n, device="cuda", dtype=bf) * 0.1
    y, dx = torch.empty_like(x), torch.empty_like(x)
    dw, db = torch.empty_like(w), torch.empty_like(b)
    mean = torch.empty(m, device="cuda", dtype=torch.float32)
    rstd = torch.empty_like(mean)
    print(f"\n## sweep: norm bwd {m}x{n} bf16 (layer, walkers = workspace rows), backward only")
    for layer in ("RMSNorm", "LayerNorm"):
        ln = layer == "LayerNorm"
        fwd = (kh.call(layer, "norm", KH_MODE_TRAIN, False, x, w, b, 1e-5, y, mean, rstd) if ln
               else kh.call(layer, "norm", KH_MODE_TRAIN, False, x, w, 1e-6, y, rstd))
        fwd()
        for per_sm in (1, 2, 3):
            ws = torch.empty(sms * per_sm, (2 if ln else 1) * n, device="cuda", dtype=torch.float32)
            bwd = (kh.call(layer, "norm", KH_MODE_TRAIN, True, dy, x, w, mean, rstd, dx, dw, db, ws)
                   if ln else kh.call(layer, "norm", KH_MODE_TRAIN, True, dy, x, w, rstd, dx, dw, ws))
            us = bench_v(bwd) * 1e3
            print(f"{layer:9s} walkers {sms * per_sm:4d}  {us:7.1f} us "
                  f"{3 * m * n * 2 / us / 1e6:5.2f} TB/s")


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")


def copy_tbps():
    x = torch.empty(1 << 29, device="cuda", dtype=torch.bfloat16)  # 1 GiB
    y = torch.empty_like(x)
    ms = bench(lambda: y.copy_(x))
    return 2 * x.numel() * 2 / (ms * 1e-3) / 1e12


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--packages", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--more-only", action="store_true",
                    help="only softmax, cross-entropy and rotary")
    ap.add_argument("--sweep-src", help="packages directory (<pkg>/<pkg>.cu): run the variant sweep")
    ap.add_argument("--sweep-rep", type=int, default=60, help="do_bench rep (ms) of the sweep")
    ap.add_argument("--sweep-what", default="ce,normbwd",
                    help="sweep parts: comma-separated normfwd, act, ce, normbwd")
    a = ap.parse_args()
    torch.manual_seed(torch.seed())
    kh = Loader(a.lib, a.packages)
    props = torch.cuda.get_device_properties(0)
    print(f"GPU {props.name}, torch {torch.__version__}, triton {triton.__version__}, "
          f"CUDA {torch.version.cuda}")
    copy = copy_tbps()
    print(f"device copy roofline: {copy:.2f} TB/s (read + write, 1 GiB bf16)")
    if a.sweep_src:
        variant_sweep(a.sweep_src, a.sweep_rep, a.sweep_what.split(","), kh)
    rows = []
    all_cases = ([] if a.more_only else list(cases(kh, a.quick))) + list(cases_more(kh))
    for sweep in range(2):
        for name, shape, nbytes, providers, _, err in all_cases:
            times = {p: bench(fn) for p, fn in providers.items()}  # interleaved per shape
            rows.append((sweep, name, shape, nbytes, times, err))
    print()
    print("| op | shape | ours µs | TB/s | % copy | eager µs | compile µs | vs eager | vs compile "
          "| rel err | sweeps |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    first = {(r[1], r[2]): r for r in rows if r[0] == 0}
    for r in rows:
        if r[0] != 1:
            continue
        _, name, shape, nbytes, t, err = r
        t0 = first[(name, shape)][4]
        ours = min(t["ours"], t0["ours"])
        eager, comp = min(t["eager"], t0["eager"]), min(t["compile"], t0["compile"])
        spread = max(abs(t[p] - t0[p]) / t0[p] for p in t)
        tbps = nbytes / (ours * 1e-3) / 1e12
        print(f"| {name} | {shape} | {ours * 1e3:.1f} | {tbps:.2f} | {100 * tbps / copy:.0f}% | "
              f"{eager * 1e3:.1f} | {comp * 1e3:.1f} | {eager / ours:.2f}x | {comp / ours:.2f}x | "
              f"{err:.1e} | {'ok' if spread <= 0.03 else f'differ {100 * spread:.0f}%'} |")
        if not (err < 2e-2) or math.isnan(err):
            print(f"  !! {name} {shape}: relative error {err} too large", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
