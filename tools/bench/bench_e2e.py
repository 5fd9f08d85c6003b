"""End-to-end training benchmark (not a test): training tokens/s and peak GPU memory of a
Qwen3-0.6B-shaped model (transformers' Qwen3Config: hidden 1024, 28 layers, 16/8 heads, head_dim
128, FFN 3072, vocab 151936, tied embeddings; random init, bf16, SDPA attention, fused AdamW) on
random tokens, batch 8 x 2048, for

  eager          PyTorch / Transformers as is
  liger          eager with Liger's kernels (RoPE, RMSNorm, SwiGLU, fused linear cross-entropy),
                 when liger_kernel imports
  compile        torch.compile of the model
  kh             eager + kernel_hub.kernelize (every layer the default hub serves, the fused
                 linear cross-entropy included)
  compile+kh     kernelize, then torch.compile (fullgraph where possible; graph breaks are
                 counted from torch._dynamo.utils.counters and reported). The layers in
                 kernel_hub.INDUCTOR_LAYERS keep PyTorch's code under compile (Inductor fuses
                 them); compile+kh:LAYERS names that set for the row instead ("none" for none, hub
                 layer names joined by "+", e.g. compile+kh:none, compile+kh:RotaryEmbedding),
                 so that several sets run side by side

each in its own process (Liger patches Transformers' modules globally; compile caches stay
apart), same seed, same data, all from the one command so that every ratio is same-run: the loss
after the measured steps is printed next to each row so that a wrong loss shows. One table:
tokens/s, peak memory (and its difference from eager+Liger's), the loss, ratios vs eager, vs
eager+Liger and vs torch.compile, each row's wall time; above it the GPU, torch and Transformers
versions. --layers N builds N Llama-3-8B-shaped layers instead (hidden 4096, 32/8 heads, FFN
14336, vocab 128256, untied); --shape tiny is a seconds-long smoke run of the script (also on
--device cpu).

A configuration may carry environment settings for its process in brackets, so that variants run
side by side in the same invocation: kh[KERNEL_HUB_RECOMPUTE_NORM=0],
kh[KERNEL_HUB_LCE_CHUNK_MIB=80;KERNEL_HUB_RECOMPUTE_NORM=0] (';' between settings).

Liger on the GPU machine (no network there): its wheel is downloaded on the workstation with
  pip download liger-kernel==0.8.5 --no-deps -d .devlibs/wheels
and installed on the GPU machine next to its torch and triton, without touching that Python:
  pip install --no-deps --target /tmp/liger .devlibs/wheels/liger_kernel-0.8.5-py3-none-any.whl
  PYTHONPATH=/tmp/liger:tools/python python3 tools/bench/bench_e2e.py
(--liger-dir DIR does the install itself when the wheel is there and liger_kernel does not
import). kernel_hub needs KERNEL_HUB_LIBRARY (libkernel_hub.so) and a hub holding the packages
(KERNEL_HUB_DATA_DIR with the default hub, as tools/bench/gpu_run.sh sets it).

Usage: python3 tools/bench/bench_e2e.py [--steps 10] [--warmup 3] [--batch 8] [--seq 2048]
       [--layers N | --shape tiny] [--timeout S]
       [--configs eager,liger,compile,kh,compile+kh[,compile+kh:LAYERS...][,kh[VAR=V;...]]]
--timeout S stops a configuration's process after S seconds (its row says so; the others run):
the 5 default rows at the 0.6B shape take about 5 minutes on an H200, most of it compiling.

Peak memory is torch.cuda.max_memory_allocated over the measured steps (tensors; the "reserved"
column is max_memory_reserved: what the caching allocator held from the device)."""
import argparse
import glob
import json
import os
import subprocess
import sys
import time

CONFIGS = ("eager", "liger", "compile", "kh", "compile+kh")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def model_config(args):
    import transformers
    if args.shape == "tiny":
        return transformers.Qwen3Config(
            hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            head_dim=16, intermediate_size=96, vocab_size=512,
            max_position_embeddings=max(4096, args.seq), tie_word_embeddings=True,
            attn_implementation="sdpa")
    if args.layers:
        return transformers.LlamaConfig(
            hidden_size=4096, num_hidden_layers=args.layers, num_attention_heads=32,
            num_key_value_heads=8, intermediate_size=14336, vocab_size=128256,
            max_position_embeddings=max(8192, args.seq), rope_theta=500000.0,
            tie_word_embeddings=False, attn_implementation="sdpa")
    return transformers.Qwen3Config(
        hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
        head_dim=128, intermediate_size=3072, vocab_size=151936,
        max_position_embeddings=max(40960, args.seq), tie_word_embeddings=True,
        attn_implementation="sdpa")


def split_config(which):
    """"kh[A=1;B=2]" -> ("kh", {"A": "1", "B": "2"}): the configuration and its process's
    environment settings."""
    if not which.endswith("]") or "[" not in which:
        return which, {}
    name, spec = which[:-1].split("[", 1)
    env = {}
    for item in filter(None, spec.split(";")):
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"bench_e2e: configuration {which!r}: settings are VAR=VALUE "
                             "joined by ';'")
        env[key] = value
    return name, env


def inductor_layers(which):
    """compile+kh:LAYERS -> the inductor_layers argument of kernelize (None: the default)."""
    which = split_config(which)[0]
    if ":" not in which:
        return None
    spec = which.split(":", 1)[1]
    return () if spec == "none" else tuple(spec.split("+"))


def build(args, which):
    import torch
    import transformers
    if split_config(which)[0] == "liger":
        import liger_kernel.transformers as lk
        patch = (lk.apply_liger_kernel_to_llama if args.layers and args.shape != "tiny"
                 else lk.apply_liger_kernel_to_qwen3)
        patch(rope=True, rms_norm=True, swiglu=True, cross_entropy=False,
              fused_linear_cross_entropy=True)
    torch.manual_seed(0)
    config = model_config(args)
    cls = (transformers.LlamaForCausalLM if args.layers and args.shape != "tiny"
           else transformers.Qwen3ForCausalLM)
    with torch.device(args.device):
        model = cls(config).to(torch.bfloat16)
    model.train()
    if split_config(which)[0].split(":")[0] in ("kh", "compile+kh"):
        import kernel_hub
        kernel_hub.kernelize(model, device=args.device, mode="train",
                             inductor_layers=inductor_layers(which))
    return model


def run_one(args, which):
    """One configuration in this process: a JSON line with tokens/s, peak memory, loss, breaks."""
    import torch
    model = build(args, which)
    fullgraph = None
    step_model = model
    compiled = split_config(which)[0].startswith("compile")
    if compiled:
        import torch._dynamo
        torch._dynamo.reset()
        fullgraph = True
        step_model = torch.compile(model, fullgraph=True)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    g = torch.Generator(device=args.device).manual_seed(1)
    vocab = model.config.vocab_size
    batches = [torch.randint(0, vocab, (args.batch, args.seq), device=args.device, generator=g)
               for _ in range(4)]
    cuda = args.device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    def step(i):
        ids = batches[i % len(batches)]
        loss = step_model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    try:
        for i in range(args.warmup):
            step(i)
    except Exception as e:  # noqa: BLE001 (a fullgraph failure: retry allowing breaks)
        if fullgraph is None:
            raise
        print(f"[{which}] fullgraph=True failed ({type(e).__name__}: {str(e)[:200]}); "
              "retrying with graph breaks allowed", file=sys.stderr)
        import torch._dynamo
        torch._dynamo.reset()
        fullgraph = False
        step_model = torch.compile(model)
        for i in range(args.warmup):
            step(i)
    sync()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    # Each timed step's time: CUDA events at the steps' starts and after the last (recorded on
    # the stream, so the loop stays asynchronous); on the CPU, where a step is synchronous, the
    # wall clock.
    marks = [torch.cuda.Event(enable_timing=True) for _ in range(args.steps + 1)] if cuda else []
    stamps = []
    t0 = time.perf_counter()
    for i in range(args.steps):
        if cuda:
            marks[i].record()
        else:
            stamps.append(time.perf_counter())
        loss = step(args.warmup + i)
    if cuda:
        marks[-1].record()
    sync()
    dt = time.perf_counter() - t0
    if not cuda:
        stamps.append(t0 + dt)
    step_ms = ([a.elapsed_time(b) for a, b in zip(marks, marks[1:])] if cuda else
               [(b - a) * 1e3 for a, b in zip(stamps, stamps[1:])])
    breaks = None
    if compiled:
        from torch._dynamo.utils import counters
        breaks = {k: v for k, v in counters["graph_break"].items()}
    print("RESULT " + json.dumps({
        "config": which, "tokens_per_s": args.batch * args.seq * args.steps / dt,
        "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0,
        "reserved_gib": torch.cuda.max_memory_reserved() / 2**30 if cuda else 0.0,
        "loss": float(loss.detach()), "step_ms": step_ms,
        "fullgraph": fullgraph, "graph_breaks": breaks}), flush=True)


def ensure_liger(args):
    """liger_kernel importable in the children: as is, or installed from the wheel with --target."""
    env = dict(os.environ)
    try:
        import liger_kernel  # noqa: F401
        return env
    except ImportError:
        pass
    wheels = sorted(glob.glob(os.path.join(ROOT, ".devlibs", "wheels", "liger_kernel-*.whl")))
    if not wheels or not args.liger_dir:
        return None
    if not os.path.isdir(os.path.join(args.liger_dir, "liger_kernel")):
        subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index",
                        "--target", args.liger_dir, wheels[-1]], check=True)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (args.liger_dir, env.get("PYTHONPATH")) if p)
    return env


def versions(device):
    """The GPU, torch and Transformers this run measured with (one line above the table)."""
    import torch
    import transformers
    gpu = torch.cuda.get_device_name(device) if device.startswith("cuda") else "cpu"
    return f"{gpu}, torch {torch.__version__}, Transformers {transformers.__version__}"


def run_child(args, which, env):
    """One configuration in a child process: its RESULT (with wall_s), or None after saying why."""
    cmd = [sys.executable, os.path.abspath(__file__), "--run", which, "--steps",
           str(args.steps), "--warmup", str(args.warmup), "--batch", str(args.batch),
           "--seq", str(args.seq), "--layers", str(args.layers), "--device", args.device,
           "--shape", args.shape]
    env = dict(env, **split_config(which)[1])
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True,
                           timeout=args.timeout or None)
    except subprocess.TimeoutExpired:
        print(f"[{which}] stopped after --timeout {args.timeout} s", file=sys.stderr)
        return None
    wall = time.perf_counter() - t0
    line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    if p.returncode != 0 or not line:
        print(f"[{which}] failed (exit {p.returncode}):\n{p.stderr[-3000:]}", file=sys.stderr)
        return None
    for note in p.stderr.splitlines():  # the script's own notices (a fullgraph retry)
        if note.startswith(f"[{which}]"):
            print(note, file=sys.stderr)
    r = json.loads(line[-1][len("RESULT "):])
    r["wall_s"] = wall
    return r


def table(args, results):
    """The one table, ratios against this run's eager, eager+Liger and torch.compile rows."""
    shape = ("tiny Qwen3 (smoke run)" if args.shape == "tiny" else
             f"{args.layers} Llama-3-8B layers" if args.layers else "Qwen3-0.6B")
    lines = [f"{shape}, batch {args.batch} x {args.seq}, bf16, {args.steps} steps after "
             f"{args.warmup}; {versions(args.device)}; one invocation, one process per row",
             "| config | tokens/s | peak GiB | vs Liger peak | reserved GiB | loss | vs eager | "
             "vs eager+Liger | vs compile | fullgraph / breaks | wall s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    eager = results.get("eager", {}).get("tokens_per_s")
    liger = results.get("liger", {}).get("tokens_per_s")
    liger_peak = results.get("liger", {}).get("peak_gib")
    compiled = results.get("compile", {}).get("tokens_per_s")
    for which, r in results.items():
        tps = r["tokens_per_s"]
        ratio = lambda ref: f"{tps / ref:.2f}x" if ref else "-"  # noqa: E731
        peak = f"{r['peak_gib'] - liger_peak:+.2f}" if liger_peak is not None else "-"
        breaks = "-"
        if r["graph_breaks"] is not None:
            n = sum(r["graph_breaks"].values())
            breaks = f"{'yes' if r['fullgraph'] else 'no'} / {n}"
            if n:
                breaks += " (" + "; ".join(f"{k[:60]}: {v}" for k, v in
                                          list(r["graph_breaks"].items())[:3]) + ")"
        lines.append(f"| {which} | {tps:,.0f} | {r['peak_gib']:.2f} | {peak} | "
                     f"{r.get('reserved_gib', 0):.2f} | {r['loss']:.4f} | {ratio(eager)} | "
                     f"{ratio(liger)} | {ratio(compiled)} | {breaks} | {r['wall_s']:.0f} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--layers", type=int, default=0,
                    help="N Llama-3-8B-shaped layers instead of Qwen3-0.6B")
    ap.add_argument("--shape", default="", choices=("", "tiny"),
                    help="tiny: a 2-layer hidden-64 Qwen3, a smoke run of the script")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--timeout", type=float, default=0,
                    help="seconds one configuration's process may run (0: no limit)")
    ap.add_argument("--device", default="cuda:0", help="cpu: a smoke run of the script itself")
    ap.add_argument("--liger-dir", default="/tmp/liger",
                    help="where to install .devlibs/wheels' Liger when it does not import")
    ap.add_argument("--run", help=argparse.SUPPRESS)  # one configuration, in a child process
    args = ap.parse_args()
    if args.run:
        run_one(args, args.run)
        return
    base_env = dict(os.environ)
    base_env["PYTHONPATH"] = os.pathsep.join(
        p for p in (os.path.join(ROOT, "tools", "python"), base_env.get("PYTHONPATH")) if p)
    results = {}
    for which in args.configs.split(","):
        env = base_env
        if split_config(which)[0] == "liger":
            env = ensure_liger(args)
            if env is None:
                print("[liger] liger_kernel does not import and no wheel in .devlibs/wheels: "
                      "skipped", file=sys.stderr)
                continue
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (env.get("PYTHONPATH"), base_env["PYTHONPATH"]) if p)
        r = run_child(args, which, env)
        if r is not None:
            results[which] = r
    print("\n" + table(args, results))


if __name__ == "__main__":
    main()
