#!/usr/bin/env python3
"""The GPU-resident demo runtime against PyTorch on the same model, side by side in one run.

Runs `kernel-hub demo --device cuda:0 --model qwen3-0.6b --batch 8 --seq 2048 --json --profile`
(the model resident on the GPU, bf16 with fp32 master weights, every layer slot kernelized from
the hub) and, each in its own process, Transformers' Qwen3ForCausalLM from the same config in
PyTorch eager and under torch.compile (bf16, SDPA, fused AdamW: the model bench_e2e.py builds,
imported from it), and prints one table: train and prefill tokens/s, peak memory and the ratio to
torch.compile; then the runtime's breakdown of one train step and one prefill (GEMM, attention,
hub kernels, other; CUDA events around the phases).

Prefill is a forward of batch x seq tokens that keeps each sequence's last logits (what generation
needs): the runtime's Logits::kLast, Transformers' logits_to_keep=1, both under no gradient.
Training tokens/s count the steps after the warm-up; the runtime times its steps after the first
(which compiles kernels and plans GEMMs) with CUDA events.

usage: bench_runtime.py [--kernel-hub build/kernel-hub] [--steps 10] [--warmup 3] [--batch 8]
       [--seq 2048] [--configs eager,compile] [--dtype bf16]"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
import bench_e2e  # noqa: E402  (the PyTorch model and its train step: one definition)


def prefill_one(args, which):
    """Prefill in this process: a RESULT line with tokens/s and peak memory."""
    import torch
    model = bench_e2e.build(args, "compile" if which == "compile" else "eager")
    model.eval()
    fwd = model
    if which == "compile":
        import torch._dynamo
        torch._dynamo.reset()
        fwd = torch.compile(model)
    g = torch.Generator(device=args.device).manual_seed(1)
    ids = torch.randint(0, model.config.vocab_size, (args.batch, args.seq), device=args.device,
                        generator=g)
    with torch.no_grad():
        for _ in range(args.warmup):
            fwd(input_ids=ids, logits_to_keep=1)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        for _ in range(args.steps):
            fwd(input_ids=ids, logits_to_keep=1)
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
    print("RESULT " + json.dumps({
        "config": which, "tokens_per_s": args.batch * args.seq * args.steps / dt,
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30}), flush=True)


def child(args, script, run, env):
    cmd = [sys.executable, script, "--run", run, "--steps", str(args.steps), "--warmup",
           str(args.warmup), "--batch", str(args.batch), "--seq", str(args.seq), "--device",
           args.device]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    if p.returncode != 0 or not line:
        print(f"[{run}] failed (exit {p.returncode}):\n{p.stderr[-3000:]}", file=sys.stderr)
        return None
    return json.loads(line[-1][len("RESULT "):])


def run_kernel_hub(args):
    cmd = [args.kernel_hub, "demo", "--device", args.device, "--model", "qwen3-0.6b", "--batch",
           str(args.batch), "--seq", str(args.seq), "--steps", str(args.steps + 1), "--dtype",
           args.dtype, "--json", "--profile"]
    print("$ " + " ".join(cmd), file=sys.stderr)
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        print(f"[kernel-hub] failed (exit {p.returncode}):\n{p.stderr[-3000:]}", file=sys.stderr)
        return None
    return json.loads(p.stdout)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernel-hub", default=os.path.join(ROOT, "build", "kernel-hub"))
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--configs", default="eager,compile", help="the PyTorch side")
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"), help="the runtime's")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--run", help=argparse.SUPPRESS)  # prefill-<config>, in a child process
    args = ap.parse_args()
    args.layers = 0  # bench_e2e's model: Qwen3-0.6B
    if args.run:
        prefill_one(args, args.run[len("prefill-"):])
        return

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (os.path.join(ROOT, "tools", "python"), env.get("PYTHONPATH")) if p)
    rows = {}
    kh = run_kernel_hub(args)
    if kh:
        d = kh["device_run"]
        rows["kernel-hub runtime"] = {"train": d["train_tokens_per_s"],
                                      "prefill": d["prefill_tokens_per_s"],
                                      "peak_gib": d["peak_bytes"] / 2**30}
    for which in args.configs.split(","):
        train = child(args, os.path.join(HERE, "bench_e2e.py"), which, env)
        prefill = child(args, os.path.abspath(__file__), "prefill-" + which, env)
        label = {"eager": "PyTorch eager", "compile": "torch.compile"}.get(which, which)
        rows[label] = {"train": train["tokens_per_s"] if train else None,
                       "prefill": prefill["tokens_per_s"] if prefill else None,
                       "peak_gib": train["peak_gib"] if train else None}

    ref = rows.get("torch.compile", {})
    print(f"\nQwen3-0.6B, batch {args.batch} x {args.seq}, {args.dtype}, {args.steps} steps "
          f"(prefill: last-token logits)")
    print("| runtime | train tokens/s | prefill tokens/s | peak GiB (train) | train vs compile "
          "| prefill vs compile |")
    print("|---|---|---|---|---|---|")

    def num(v, fmt="{:,.0f}"):
        return fmt.format(v) if v is not None else "-"

    def ratio(v, r):
        return f"{v / r:.2f}x" if v and r else "-"

    for name, r in rows.items():
        print(f"| {name} | {num(r['train'])} | {num(r['prefill'])} | "
              f"{num(r['peak_gib'], '{:.1f}')} | {ratio(r['train'], ref.get('train'))} | "
              f"{ratio(r['prefill'], ref.get('prefill'))} |")
    if kh and "profile" in kh["device_run"]:
        print("\nkernel-hub runtime, one step (CUDA events around the phases):")
        print("| phase | total ms | GEMM | attention | hub kernels | other |")
        print("|---|---|---|---|---|---|")
        for what, key in (("train step", "train_step"), ("prefill", "prefill")):
            p = kh["device_run"]["profile"][key]
            print(f"| {what} | {p['total_ms']:.1f} | {p['gemm_ms']:.1f} | "
                  f"{p['attention_ms']:.1f} | {p['hub_kernels_ms']:.1f} | {p['other_ms']:.1f} |")
        print("package kernels ran for: " + ", ".join(kh["device_run"]["package_slots"]))


if __name__ == "__main__":
    main()
