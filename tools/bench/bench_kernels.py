#!/usr/bin/env python3
"""Kernel benchmarks on the GPU: our kernels called through the loader (the C API of
libkernel_hub.so via ctypes, with DLPack views of PyTorch tensors), against PyTorch eager and
torch.compile (dynamic=False, fullgraph=True), plus a device copy for the bandwidth roofline of
the same run. Correctness is checked against an fp32 reference before timing. Median of
triton.testing.do_bench (L2 flushed before each call), providers interleaved per shape, the sweep
run twice (rows whose two sweeps differ by more than 3% are flagged).

Usage: bench_kernels.py --lib build/libkernel_hub.so --packages build/kernels [--quick]
       [--sweep-src DIR]  (variants of the forward kernels from DIR/<pkg>/<pkg>.cu)
"""
import argparse
import ctypes as C
import math
import os
import sys

import torch
import torch.nn.functional as F
import triton.testing

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "loader",
                                "python"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # bundled beside this script
from kernel_hub_ctypes import (  # noqa: E402
    KH_OK, KH_MODE_EVAL, KH_MODE_TRAIN, KH_ARG_TENSOR, KH_ARG_INT, KH_ARG_FLOAT, DLDevice,
    DLDataType, DLTensor, Arg, OpFn, load)

DL_CUDA, DL_FLOAT, DL_BFLOAT = 2, 2, 4
DTYPES = {torch.bfloat16: (DL_BFLOAT, 16), torch.float16: (DL_FLOAT, 16),
          torch.float32: (DL_FLOAT, 32), torch.int64: (0, 64)}  # kDLInt


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


def ws_rows(cols, sms):
    per_sm = 16 if cols <= 256 else 8 if cols <= 1024 else 4 if cols <= 2048 else 2 if cols <= 4096 else 1
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
    """Softmax, cross-entropy and rotary at the issue's shapes."""
    bf = torch.bfloat16
    m, n = 16384, 8192
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

    tokens, hq, hk, hd = 16384, 32, 8, 128
    q = torch.randn(tokens, hq, hd, device="cuda", dtype=bf)
    k = torch.randn(tokens, hk, hd, device="cuda", dtype=bf)
    pos = torch.randint(0, 8192, (tokens,), device="cuda", dtype=torch.int64)
    inv = 1.0 / (10000 ** (torch.arange(0, hd, 2, device="cuda", dtype=torch.float32) / hd))
    freqs = torch.outer(torch.arange(8192, device="cuda", dtype=torch.float32), inv)
    cos, sin = freqs.cos().contiguous(), freqs.sin().contiguous()

    def rope(q_, k_, pos_):  # NeoX (rotate halves), out of place as users write it
        c, s_ = cos[pos_][:, None, :], sin[pos_][:, None, :]
        def rot(t_):
            a, b = t_[..., : hd // 2].float(), t_[..., hd // 2:].float()
            return torch.cat((a * c - b * s_, b * c + a * s_), dim=-1).to(t_.dtype)
        return rot(q_), rot(k_)
    q0, k0 = q.clone(), k.clone()
    once = kh.call("RotaryEmbedding", "rotary", KH_MODE_EVAL, False, pos, q0, k0, cos, sin, 1)
    once()
    torch.cuda.synchronize()
    rq, rk = rope(q.float(), k.float(), pos)
    err = max(rel_err(q0, rq), rel_err(k0, rk))
    ours = kh.call("RotaryEmbedding", "rotary", KH_MODE_EVAL, False, pos, q, k, cos, sin, 1)
    nbytes = 2 * (q.numel() + k.numel()) * 2 + tokens * 8 + 2 * tokens * (hd // 2) * 4
    yield ("rope neox q+k (in place)", f"{tokens}x({hq}+{hk})x{hd}", nbytes,
           {"ours": ours, "eager": bind(rope, q, k, pos),
            "compile": bind(torch.compile(rope, dynamic=False, fullgraph=True), q, k, pos)},
           (), err)


def variant_sweep(src_dir, rep):
    """Variants of the forward kernels at the headline shapes, compiled from the shipped sources
    with NVRTC (through CuPy) with -D tuning switches and launched with explicit geometry: one
    GPU call compares several designs. Prints one line per variant (µs, TB/s, rel err)."""
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
                mods[key].get_function("norm_reduce_partials_bf16" if pkg == "norm" else
                                       "act_silu_fwd_bf16_vec")  # compiles now
            except Exception as e:  # report and go on with the other variants
                print(f"  !! {pkg} {defs}: {str(e)[:300]}")
                mods[key] = None
        return mods[key]

    P = lambda t: np.uint64(t.data_ptr() if t is not None else 0)
    m, n = 16384, 8192
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
    for kind in ("rms", "ln", "add_rms"):
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
    for op in ("silu_and_mul", "gelu_tanh_and_mul"):
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
    a = ap.parse_args()
    torch.manual_seed(torch.seed())
    kh = Loader(a.lib, a.packages)
    props = torch.cuda.get_device_properties(0)
    print(f"GPU {props.name}, torch {torch.__version__}, triton {triton.__version__}, "
          f"CUDA {torch.version.cuda}")
    copy = copy_tbps()
    print(f"device copy roofline: {copy:.2f} TB/s (read + write, 1 GiB bf16)")
    if a.sweep_src:
        variant_sweep(a.sweep_src, a.sweep_rep)
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
