"""Attention benchmark on the GPU machine: the attention package's ops through libkernel_hub.so
(the same loader path a runtime uses) against PyTorch's scaled_dot_product_attention with the
flash (FlashAttention-2) and cuDNN backends, in one process, interleaved per shape, after a
correctness check of ours against an fp32 reference. Forward TFLOP/s = 4*B*H*Sq*Sk*D (x0.5
causal) / time; forward+backward TFLOP/s = 3.5x that / time (the backward counted as 2.5x the
forward, as FlashAttention reports it); decode TB/s = K/V bytes read / time.

Usage: python3 bench_attention.py --lib libkernel_hub.so --packages DIR (run by gpu_run.sh)."""
import argparse
import ctypes as C
import math
import sys

import torch
import torch.nn.functional as F
import triton
from torch.nn.attention import SDPBackend, sdpa_kernel

from bench_kernels import KH_MODE_EVAL, KH_MODE_TRAIN, Loader, OpFn


class AttentionLoader(Loader):
    """Binds the inference-only layers (PagedAttention, PagedKVAppend: no backward op, so a train
    bind is refused) for eval only; Attention in both modes."""
    EVAL_ONLY = {"PagedAttention", "PagedKVAppend"}

    def slot(self, layer, package):
        if layer not in self.EVAL_ONLY or layer in self.slots:
            return super().slot(layer, package)
        s = C.c_uint32()
        self.check(self.lib.kh_runtime_add_slot(self.rt, layer.encode(), OpFn(), OpFn(), OpFn(), 0,
                                                C.byref(s)), "add_slot " + layer)
        bound = C.c_int32()
        self.check(self.lib.kh_runtime_bind(
            self.rt, layer.encode(), f"{self.packages}/{package}".encode(), None, KH_MODE_EVAL,
            torch.cuda.current_device(), C.byref(bound)), f"bind {layer}")
        self.slots[layer] = s.value
        return s.value


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def sdpa(q, k, v, causal, backend):
    """q [B, S, H, D] -> SDPA's [B, H, S, D] views (no copies)."""
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    gqa = q.shape[2] != k.shape[2]

    def run():
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal, enable_gqa=gqa)
    return run


def forward_rows(kh):
    bf = torch.bfloat16
    shapes = [  # B, Hq, Hkv, S, D, causal, what
        (2, 16, 16, 8192, 128, False, "issue 14 table"),
        (2, 16, 16, 8192, 128, True, "issue 14 table"),
        (2, 32, 8, 4096, 128, True, "Llama-3-8B GQA"),
        (4, 16, 8, 2048, 128, True, "Qwen3-0.6B"),
        (1, 64, 8, 8192, 128, True, "Llama-3-70B GQA"),
        (2, 16, 16, 8192, 64, True, "head_dim 64"),
        (2, 16, 16, 4096, 256, True, "head_dim 256 (Gemma)"),
    ]
    for B, H, HK, S, D, causal, what in shapes:
        q = torch.randn(B, S, H, D, device="cuda", dtype=bf)
        k = torch.randn(B, S, HK, D, device="cuda", dtype=bf)
        v = torch.randn(B, S, HK, D, device="cuda", dtype=bf)
        out = torch.full_like(q, float("nan"))
        ours = kh.call("Attention", "attention", KH_MODE_EVAL, False, q, k, v, None, None, 0,
                       int(causal), -1, 1.0 / math.sqrt(D), out, None)
        ours()
        torch.cuda.synchronize()
        ref = sdpa(q.float(), k.float(), v.float(), causal, SDPBackend.MATH)().transpose(1, 2)
        err = ((out.float() - ref).norm() / ref.norm()).item()
        providers = {"ours": ours, "flash": sdpa(q, k, v, causal, SDPBackend.FLASH_ATTENTION),
                     "cudnn": sdpa(q, k, v, causal, SDPBackend.CUDNN_ATTENTION)}
        flops = 4 * B * H * S * S * D * (0.5 if causal else 1.0)
        yield (f"fwd B={B} H={H}/{HK} S={S} D={D}{' causal' if causal else ''}", what, flops,
               providers, err)


def train_rows(kh):
    """forward_train (with the LSE) + backward of ours against SDPA's forward + autograd backward."""
    bf = torch.bfloat16
    shapes = [  # B, Hq, Hkv, S, D, causal, what
        (2, 16, 16, 8192, 128, False, "issue 14 table"),
        (2, 16, 16, 8192, 128, True, "issue 14 table"),
        (2, 32, 8, 4096, 128, True, "Llama-3-8B GQA"),
        (4, 16, 8, 2048, 128, True, "Qwen3-0.6B"),
        (2, 16, 16, 8192, 64, True, "head_dim 64"),
    ]
    for B, H, HK, S, D, causal, what in shapes:
        q, k, v, g = (torch.randn(B, S, h, D, device="cuda", dtype=bf) for h in (H, HK, HK, H))
        out, dq = torch.empty_like(q), torch.full_like(q, float("nan"))
        dk, dv = torch.full_like(k, float("nan")), torch.full_like(v, float("nan"))
        lse = torch.empty(H, B * S, device="cuda", dtype=torch.float32)
        ws = torch.empty(B * S * H * (D + 1), device="cuda", dtype=torch.float32)
        scale = 1.0 / math.sqrt(D)
        fwd = kh.call("Attention", "attention", KH_MODE_TRAIN, False, q, k, v, None, None, 0,
                      int(causal), -1, scale, out, lse)
        bwd = kh.call("Attention", "attention", KH_MODE_TRAIN, True, g, q, k, v, out, lse, None,
                      None, 0, 0, int(causal), -1, scale, dq, dk, dv, ws)

        def ours(fwd=fwd, bwd=bwd):
            fwd()
            bwd()
        ours()
        torch.cuda.synchronize()
        qr, kr, vr = (x.float().requires_grad_() for x in (q, k, v))
        sdpa(qr, kr, vr, causal, SDPBackend.MATH)().transpose(1, 2).backward(g.float())
        err = max(((a.float() - b.grad).norm() / b.grad.norm()).item()
                  for a, b in ((dq, qr), (dk, kr), (dv, vr)))
        del qr, kr, vr

        def torch_fb(backend, q=q, k=k, v=v, g=g):
            qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))
            fn = sdpa(qg, kg, vg, causal, backend)
            gt = g.transpose(1, 2)
            return lambda: torch.autograd.grad(fn(), (qg, kg, vg), gt)
        providers = {"ours": ours, "flash": torch_fb(SDPBackend.FLASH_ATTENTION),
                     "cudnn": torch_fb(SDPBackend.CUDNN_ATTENTION)}
        flops = 3.5 * 4 * B * H * S * S * D * (0.5 if causal else 1.0)
        yield (f"fwd+bwd B={B} H={H}/{HK} S={S} D={D}{' causal' if causal else ''}", what, flops,
               providers, err)


def decode_rows(kh):
    bf = torch.bfloat16
    shapes = [  # B, Hq, Hkv, ctx, D, page, tokens in the sequences (None: ctx)
        (1, 32, 8, 8192, 128, 16, None), (8, 32, 8, 8192, 128, 16, None),
        (64, 32, 8, 8192, 128, 16, None),
        (64, 32, 8, 8192, 128, 64, None),  # issue 14's decode target: 64-token pages
        (16, 64, 8, 4096, 128, 16, None), (32, 16, 8, 4096, 128, 16, None),
        # The runtime's decode (issue 15): Qwen3-0.6B and Llama-3-8B heads, batch 64, a cache of
        # 2048 tokens per sequence, full or at the decode's average 1920.
        (64, 16, 8, 2048, 128, 64, None), (64, 16, 8, 2048, 128, 64, 1920),
        (64, 32, 8, 2048, 128, 64, None),
    ]
    for B, H, HK, ctx, D, page, used in shapes:
        pages_per = ctx // page
        k_cache = torch.randn(B * pages_per, page, HK, D, device="cuda", dtype=bf)
        v_cache = torch.randn_like(k_cache)
        table = torch.randperm(B * pages_per, device="cuda", dtype=torch.int32).view(B, pages_per)
        used = used or ctx
        lens = torch.full((B,), used, device="cuda", dtype=torch.int32)
        q = torch.randn(B, 1, H, D, device="cuda", dtype=bf)
        out = torch.full_like(q, float("nan"))
        ws = torch.empty(B * H * 32 * (D + 2), device="cuda", dtype=torch.float32)
        ours = kh.call("PagedAttention", "attention", KH_MODE_EVAL, False, q, k_cache, v_cache,
                       table, lens, -1, 1.0 / math.sqrt(D), out, ws)
        ours()
        torch.cuda.synchronize()
        # Contiguous K/V for SDPA (what it needs; the gather is not timed).
        k = k_cache[table.long()].reshape(B, ctx, HK, D)[:, :used].contiguous()
        v = v_cache[table.long()].reshape(B, ctx, HK, D)[:, :used].contiguous()
        ref = sdpa(q.float(), k.float(), v.float(), False, SDPBackend.MATH)().transpose(1, 2)
        err = ((out.float() - ref).norm() / ref.norm()).item()
        providers = {"ours": ours, "flash": sdpa(q, k, v, False, SDPBackend.FLASH_ATTENTION),
                     "cudnn": sdpa(q, k, v, False, SDPBackend.CUDNN_ATTENTION)}
        of = f" of {ctx}" if used != ctx else ""
        yield (f"decode B={B} H={H}/{HK} ctx={used}{of} D={D} page={page}", "paged (ours), "
               "contiguous (torch)", 2 * B * used * HK * D * 2, providers, err)


def timed(fn):
    try:
        return bench(fn)
    except Exception as e:  # a backend that does not take the shape
        return float("nan") if "No available kernel" in str(e) or "not supported" in str(e) \
            else float("nan")


def rate_table(rows, what_rows, err_name, max_err):
    """Prints a TFLOP/s table of ours against torch's flash and cuDNN backends; returns the number
    of rows whose relative error is max_err or more."""
    print(f"\n| {what_rows} (bf16) | model | ours TFLOP/s | FA2 (torch flash) | cuDNN | vs FA2 "
          f"| vs cuDNN | {err_name} |")
    print("|---|---|---|---|---|---|---|---|")
    bad = 0
    for name, what, flops, prov, err in rows:
        t = {k: timed(f) for k, f in prov.items()}
        tf = {k: flops / (ms * 1e-3) / 1e12 for k, ms in t.items()}
        print(f"| {name} | {what} | {tf['ours']:.0f} | {tf['flash']:.0f} | {tf['cudnn']:.0f} | "
              f"{tf['ours'] / tf['flash']:.2f}x | {tf['ours'] / tf['cudnn']:.2f}x | {err:.1e} |",
              flush=True)
        bad += not (err < max_err)
    return bad


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", required=True)
    ap.add_argument("--packages", required=True)
    ap.add_argument("--only", choices=("forward", "training", "decode"),
                    help="run one table only")
    a = ap.parse_args()
    kh = AttentionLoader(a.lib, a.packages)
    p = torch.cuda.get_device_properties(0)
    print(f"GPU {p.name}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    bad = 0
    if a.only in (None, "forward"):
        bad += rate_table(forward_rows(kh), "forward", "rel err", 1e-2)
    if a.only in (None, "training"):
        bad += rate_table(train_rows(kh), "forward+backward", "rel err (dq, dk, dv)", 2e-2)
    if a.only not in (None, "decode"):
        return 1 if bad else 0
    print("\n| decode (bf16) | layout | ours µs | TB/s | torch flash µs | cuDNN µs | vs best torch "
          "| rel err |")
    print("|---|---|---|---|---|---|---|---|")
    for name, what, nbytes, prov, err in decode_rows(kh):
        t = {k: timed(f) for k, f in prov.items()}
        best = min(x for x in (t["flash"], t["cudnn"]) if not math.isnan(x))
        print(f"| {name} | {what} | {t['ours'] * 1e3:.1f} | {nbytes / (t['ours'] * 1e-3) / 1e12:.2f}"
              f" | {t['flash'] * 1e3:.1f} | {t['cudnn'] * 1e3:.1f} | {best / t['ours']:.2f}x | "
              f"{err:.1e} |", flush=True)
        bad += not (err < 1e-2)
    if bad:
        print(f"{bad} rows with a relative error >= 1e-2", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
