#!/usr/bin/env python3
"""The GPU-resident demo runtime against PyTorch on the same model, side by side in one run.

Runs `kernel-hub demo --device cuda:0 --model qwen3-0.6b --batch 8 --seq 2048 --json --profile`
(the model resident on the GPU, bf16 with fp32 master weights, every layer slot kernelized from
the hub) and, each in its own process, Transformers' Qwen3ForCausalLM from the same config in
PyTorch eager, eager with Liger's kernels (when liger_kernel imports: bench_e2e.py says how to
install its wheel) and under torch.compile (bf16, SDPA, fused AdamW: the model bench_e2e.py builds,
imported from it), and prints one table: train and prefill tokens/s, peak memory and the ratio to
torch.compile; then the runtime's breakdown of one train step and one prefill (GEMM, attention,
hub kernels, other; CUDA events around the phases); then greedy decode (batch 64, context 2048
by default): the runtime's paged-KV decode with a CUDA-graph step (--decode-batch,
--decode-context of the same demo run) next to Transformers' generate() with a static cache on
the same model (bf16, batch 64, its default compile of the decode step), tokens/s of the decode
phase only and the share of the HBM roofline.

Prefill is a forward of batch x seq tokens that keeps each sequence's last logits (what generation
needs): the runtime's Logits::kLast, Transformers' logits_to_keep=1, both under no gradient.
Training tokens/s count the steps after the warm-up; the runtime times its steps after the first
(which compiles kernels and plans GEMMs) with CUDA events, PyTorch its steps after --warmup, and
each timed step's time is listed for both, with the rate the median step gives (the table's rate
is the mean's, which one slow step moves more).

--rounds N runs the runtime and each PyTorch configuration N times, alternating (a round is the
runtime, then every configuration, each in its own process), and reports each one's median with
every round's figure beside it: the GPU's clocks drift with its temperature and power over a run,
and a ratio of two runs taken minutes apart carries that drift (the runtime's decode is measured
in the first round only).

Decode: a context of C tokens is a prompt of C - n and n = min(256, C / 2) generated tokens (the
demo's split). The runtime times its decode steps after the first (which captures the graph) with
CUDA events; Transformers' decode phase is generate(n tokens) - generate(1 token), wall clock,
after a warm-up of both (which compiles). The roofline: the bytes a step must read (every weight
once, the LM head included, and the KV cache at the steps' average context: the runtime's own
arithmetic, decode_roofline.h, read from its JSON and rescaled to Transformers' average context)
over the step time, as a share of the peak bandwidth the runtime reports (the driver's memory
clock x bus width x 2, else H200's 4.8 TB/s).

usage: bench_runtime.py [--kernel-hub build/kernel-hub] [--steps 10] [--warmup 3] [--batch 8]
       [--seq 2048] [--configs eager,liger,compile] [--dtype bf16] [--decode-batch 64]
       [--decode-context 2048] [--no-torch-decode] [--rounds 1] [--keep-normed auto|on|off]"""
import argparse
import json
import os
import statistics
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
    # Liger's patched model for its row (its prefill is Liger's RMSNorm, rope and SwiGLU).
    model = bench_e2e.build(args, {"compile": "compile", "liger": "liger"}.get(which, "eager"))
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


def decode_split(context):
    """(prompt, generated) of a decode context: the demo's split (decode_generated_tokens)."""
    n = min(256, context // 2)
    return context - n, n


def decode_one(args):
    """Transformers' greedy generate() with a static cache: a RESULT line with the decode phase's
    tokens/s (generate(n) - generate(1): the prefill and first token cancel) and its average
    context."""
    import torch
    model = bench_e2e.build(args, "eager")
    model.eval()
    prompt, n = decode_split(args.decode_context)
    g = torch.Generator(device=args.device).manual_seed(1)
    ids = torch.randint(0, model.config.vocab_size, (args.decode_batch, prompt),
                        device=args.device, generator=g)
    mask = torch.ones_like(ids)

    def generate(tokens):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=tokens,
                             min_new_tokens=tokens, do_sample=False, cache_implementation="static",
                             pad_token_id=0)
        torch.cuda.synchronize()
        assert out.shape == (args.decode_batch, prompt + tokens), out.shape
        return time.perf_counter() - t0

    with torch.no_grad():
        generate(n)  # warm-up: compiles the decode step for these shapes
        generate(1)
        torch.cuda.reset_peak_memory_stats()
        full = min(generate(n) for _ in range(2))
        first = min(generate(1) for _ in range(2))
    steps = n - 1  # step k attends prompt + k tokens, k = 1 .. n - 1
    print("RESULT " + json.dumps({
        "config": "transformers-static", "tokens_per_s": args.decode_batch * steps / (full - first),
        "ms_per_step": (full - first) / steps * 1e3, "average_context": prompt + n / 2,
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30}), flush=True)


def child(args, script, run, env):
    cmd = [sys.executable, script, "--run", run, "--steps", str(args.steps), "--warmup",
           str(args.warmup), "--batch", str(args.batch), "--seq", str(args.seq), "--device",
           args.device]
    if os.path.samefile(script, __file__):  # bench_e2e.py's train runs take no decode options
        cmd += ["--decode-batch", str(args.decode_batch), "--decode-context",
                str(args.decode_context)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    if p.returncode != 0 or not line:
        print(f"[{run}] failed (exit {p.returncode}):\n{p.stderr[-3000:]}", file=sys.stderr)
        return None
    return json.loads(line[-1][len("RESULT "):])


def run_kernel_hub(args, decode=True):
    """One `kernel-hub demo` run; without `decode` a one-sequence decode of at most 64 tokens (the
    demo always decodes; its context may not pass --seq) that the report does not use."""
    batch, context = ((args.decode_batch, args.decode_context) if decode
                      else (1, min(64, args.decode_context)))
    cmd = [args.kernel_hub, "demo", "--device", args.device, "--model", "qwen3-0.6b", "--batch",
           str(args.batch), "--seq", str(args.seq), "--steps", str(args.steps + 1), "--dtype",
           args.dtype, "--decode-batch", str(batch), "--decode-context", str(context), "--json",
           "--profile"] + (["--keep-normed", args.keep_normed] if args.keep_normed else [])
    print("$ " + " ".join(cmd), file=sys.stderr)
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        print(f"[kernel-hub] failed (exit {p.returncode}):\n{p.stderr[-3000:]}", file=sys.stderr)
        return None
    return json.loads(p.stdout)


def num(v, fmt="{:,.0f}"):
    """A figure for the tables, '-' where there is none."""
    return fmt.format(v) if v is not None else "-"


def progress(r, label, run):
    """One run's figures on stderr as it ends (a run cut short still leaves the rounds before)."""
    fig = f"train {num(run['train'])}, prefill {num(run['prefill'])} tokens/s" if run else "failed"
    print(f"[round {r + 1}] {label}: {fig}", file=sys.stderr, flush=True)


def median_row(rounds):
    """A configuration's rounds as one row: the median of each figure over the rounds that gave
    it, None where none did."""
    row = {}
    for key in ("train", "prefill", "peak_gib"):
        vals = [r[key] for r in rounds if r and r[key] is not None]
        row[key] = statistics.median(vals) if vals else None
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kernel-hub", default=os.path.join(ROOT, "build", "kernel-hub"))
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--configs", default="eager,liger,compile",
                    help="the PyTorch side (liger: when liger_kernel imports)")
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "fp32"), help="the runtime's")
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--keep-normed", choices=("auto", "on", "off"),
                    help="the runtime's `demo --keep-normed` (default: the demo's, auto)")
    ap.add_argument("--decode-batch", type=int, default=64)
    ap.add_argument("--decode-context", type=int, default=2048,
                    help="prompt + generated tokens a sequence (at most --seq)")
    ap.add_argument("--torch-decode", action=argparse.BooleanOptionalAction, default=True,
                    help="Transformers' generate() with a static cache beside the runtime's decode")
    ap.add_argument("--rounds", type=int, default=1,
                    help="runs of the runtime and of each configuration, alternating; the table "
                    "gives each one's median")
    ap.add_argument("--run", help=argparse.SUPPRESS)  # prefill-<config> or decode, in a child
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error(f"--rounds {args.rounds}: expected 1 or more")
    args.layers = 0  # bench_e2e's model: Qwen3-0.6B
    args.shape = None
    if args.decode_context > args.seq:
        ap.error(f"--decode-context {args.decode_context} exceeds --seq {args.seq}")
    if args.run == "decode":
        decode_one(args)
        return
    if args.run:
        prefill_one(args, args.run[len("prefill-"):])
        return

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (os.path.join(ROOT, "tools", "python"), env.get("PYTHONPATH")) if p)
    runs = {}  # label -> one {"train", "prefill", "peak_gib"} a round (None: failed)
    kh = None
    for r in range(args.rounds):
        out = run_kernel_hub(args, decode=r == 0)
        kh = out if r == 0 else kh  # the decode table and the profile: the first round's
        d = out["device_run"] if out else None
        runs.setdefault("kernel-hub runtime", []).append(
            {"train": d["train_tokens_per_s"], "prefill": d["prefill_tokens_per_s"],
             "peak_gib": d["peak_bytes"] / 2**30, "step_ms": d.get("train_step_ms", [])}
            if d else None)
        progress(r, "kernel-hub runtime", runs["kernel-hub runtime"][-1])
        for which in args.configs.split(","):
            train = child(args, os.path.join(HERE, "bench_e2e.py"), which, env)
            prefill = child(args, os.path.abspath(__file__), "prefill-" + which, env)
            label = {"eager": "PyTorch eager", "liger": "eager + Liger",
                     "compile": "torch.compile"}.get(which, which)
            runs.setdefault(label, []).append(
                {"train": train["tokens_per_s"] if train else None,
                 "prefill": prefill["tokens_per_s"] if prefill else None,
                 "peak_gib": train["peak_gib"] if train else None,
                 "step_ms": train.get("step_ms", []) if train else []})
            progress(r, label, runs[label][-1])
    rows = {label: median_row(rs) for label, rs in runs.items()}

    ref = rows.get("torch.compile", {})
    print(f"\nQwen3-0.6B, batch {args.batch} x {args.seq}, {args.dtype}, {args.steps} steps "
          f"(prefill: last-token logits)")
    print("| runtime | train tokens/s | prefill tokens/s | peak GiB (train) | train vs compile "
          "| prefill vs compile |")
    print("|---|---|---|---|---|---|")

    def ratio(v, r):
        return f"{v / r:.2f}x" if v and r else "-"

    for name, r in rows.items():
        print(f"| {name} | {num(r['train'])} | {num(r['prefill'])} | "
              f"{num(r['peak_gib'], '{:.1f}')} | {ratio(r['train'], ref.get('train'))} | "
              f"{ratio(r['prefill'], ref.get('prefill'))} |")
    if args.rounds > 1:
        print(f"\nEach round (the table: medians of {args.rounds}; train / prefill tokens/s):")
        print("| runtime | " + " | ".join(f"round {i + 1}" for i in range(args.rounds)) + " |")
        print("|---|" + "---|" * args.rounds)
        for name, rs in runs.items():
            print(f"| {name} | " + " | ".join(
                f"{num(r['train'])} / {num(r['prefill'])}" if r else "failed" for r in rs) + " |")
    # A list a round ([] where the run failed or listed none), so that line i is round i.
    steps = {label: [(r or {}).get("step_ms") or [] for r in rs] for label, rs in runs.items()}
    if any(ms for rounds in steps.values() for ms in rounds):
        # Side by side, so that a drift over a run (clocks under the power limit) shows on both.
        print("\nEach timed training step (ms, CUDA events), a round a line:")
        for label, rounds in steps.items():
            if not any(rounds):
                continue
            print(label)
            for ms in rounds:
                print("  " + (" ".join(f"{x:.1f}" for x in ms) if ms else "-"))
        # The median step of every round: a rate that one slow step (a clock drop) moves less.
        med = {label: statistics.median([x for ms in rounds for x in ms])
               for label, rounds in steps.items() if any(rounds)}
        ref_ms = med.get("torch.compile")
        print("\nThe median timed step of every round, and the training rate it gives:")
        print("| runtime | median step ms | train tokens/s | vs compile |")
        print("|---|---|---|---|")
        for label, ms in med.items():
            print(f"| {label} | {ms:.1f} | {num(args.batch * args.seq / (ms / 1e3))} | "
                  f"{f'{ref_ms / ms:.2f}x' if ref_ms else '-'} |")
    if kh and "profile" in kh["device_run"]:
        print("\nkernel-hub runtime, one step (CUDA events around the phases):")
        print("| phase | total ms | GEMM | attention | hub kernels | other |")
        print("|---|---|---|---|---|---|")
        for what, key in (("train step", "train_step"), ("prefill", "prefill")):
            p = kh["device_run"]["profile"][key]
            print(f"| {what} | {p['total_ms']:.1f} | {p['gemm_ms']:.1f} | "
                  f"{p['attention_ms']:.1f} | {p['hub_kernels_ms']:.1f} | {p['other_ms']:.1f} |")
        print("package kernels ran for: " + ", ".join(kh["device_run"]["package_slots"]))
    print_decode(args, kh, child(args, os.path.abspath(__file__), "decode", env)
                 if args.torch_decode else None)


def print_decode(args, kh, torch_decode):
    """The decode table: the runtime's row from its JSON, Transformers' beside it."""
    d = kh["device_run"].get("decode") if kh else None
    prompt, n = decode_split(args.decode_context)
    print(f"\nDecode, greedy: batch {args.decode_batch}, context {args.decode_context} "
          f"({prompt}-token prompts + {n} generated)")
    print("| runtime | decode tokens/s | ms/step | avg context | step reads GB | TB/s "
          "| % of HBM peak | % of measured read | vs Transformers |")
    print("|---|---|---|---|---|---|---|---|---|")
    if not d:
        print("| kernel-hub runtime | - | - | - | - | - | - | - | - |")
        return
    peak = d["peak_bandwidth_bytes_per_s"]
    read = d.get("read_bandwidth_bytes_per_s") or 0
    kv_per_token = d["kv_bytes"] / d["average_context"] if d["average_context"] else 0
    ref = torch_decode["tokens_per_s"] if torch_decode else None
    rows = [("kernel-hub runtime (CUDA graph" + (", PagedAttention package)" if d["package"]
                                                 else ", runtime attention)"),
             d["tokens_per_s"], d["ms_per_step"], d["average_context"], d["step_bytes"])]
    if torch_decode:
        ctx = torch_decode["average_context"]
        rows.append(("Transformers generate, static cache", torch_decode["tokens_per_s"],
                     torch_decode["ms_per_step"], ctx, d["weight_bytes"] + kv_per_token * ctx))
    for name, tps, ms, ctx, step_bytes in rows:
        bw = step_bytes / (ms / 1e3)
        vs = f"{tps / ref:.2f}x" if ref else "-"
        of_read = f"{bw / read * 100:.0f}%" if read else "-"
        print(f"| {name} | {tps:,.0f} | {ms:.3f} | {ctx:.0f} | {step_bytes / 1e9:.2f} | "
              f"{bw / 1e12:.2f} | {bw / peak * 100:.0f}% | {of_read} | {vs} |")
    print(f"peak bandwidth {peak / 1e12:.2f} TB/s ({d['peak_bandwidth_source']}); a plain read "
          f"measured {read / 1e12:.2f} TB/s in the same run; the runtime's KV cache is "
          f"{d['cache_dtype']}")


if __name__ == "__main__":
    main()
