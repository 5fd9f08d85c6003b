"""Where a training step's GPU memory goes, kernel-hub against Liger-Kernel (a diagnostic, not a
test; issue 16's "no more memory than eager + Liger"). For each configuration, in its own process
(Liger patches Transformers' classes globally), one training step of a Qwen3-0.6B-shaped model
(random init, bf16, fused AdamW, after one warm-up step that allocates the optimizer state):

  - torch.cuda.memory_allocated before the step and after the forward, the peak during the
    forward, the backward and the optimizer step (max_memory_allocated, reset between phases);
  - the norm outputs kernel-hub recomputes in backward instead of keeping (its own pack hook,
    counted in the measured step);
  - the bytes a forward saves for backward (a saved_tensors_hooks pack hook records each packed
    tensor's storage, counted once, parameters aside), grouped by the autograd node that saved
    them (a walk of the graph from the loss reads each node's saved tensors), from a second
    forward after the measured step (the recording hook turns kernel-hub's recomputation off:
    those outputs show under the nodes that save them);
  - the 15 largest blocks allocated during the step and live at its peak, with the Python frame
    that allocated them (torch.cuda.memory._record_memory_history, the trace replayed up to the
    peak).

Shapes: "full" is issue 16's (28 layers, batch 8 x 2048, the fused loss's default chunk), "test"
is tests/python/test_torch_bridge_gpu.py's PeakMemoryTest (4 layers, batch 4 x 1024,
KERNEL_HUB_LCE_CHUNK_MIB=80). Configurations: kh (kernel_hub.kernelize, mode="train") and liger
(rope, RMSNorm, SwiGLU, fused linear cross-entropy), with environment settings in brackets as in
bench_e2e.py (kh[KERNEL_HUB_RECOMPUTE_NORM=0]); Liger imports as tools/bench/bench_e2e.py finds it
(PYTHONPATH, or installed from .devlibs/wheels into --liger-dir).

Usage (GPU machine, as bench_e2e.py: KERNEL_HUB_LIBRARY and KERNEL_HUB_DATA_DIR set):
  python3 tools/bench/bridge_memory.py [--shapes test,full] [--configs kh,liger]
Prints under ~150 lines for both shapes and both configurations."""
import argparse
import collections
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SHAPES = {  # layers, batch, seq, KERNEL_HUB_LCE_CHUNK_MIB (None: the package default)
    "test": (4, 4, 1024, "80"),
    "full": (28, 8, 2048, None),
}
TOP_NODES = 10
TOP_BLOCKS = 15
TRACE_ENTRIES = 400_000  # the allocator's ring of trace events (a step makes tens of thousands)
MIB = 1 << 20


def mib(b):
    return f"{b / MIB:9.1f} MiB"


def build(which, layers, seq):
    import torch
    import transformers
    if which == "liger":
        import liger_kernel.transformers as lk
        lk.apply_liger_kernel_to_qwen3(rope=True, rms_norm=True, swiglu=True,
                                       cross_entropy=False, fused_linear_cross_entropy=True)
    torch.manual_seed(0)
    config = transformers.Qwen3Config(
        hidden_size=1024, num_hidden_layers=layers, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, intermediate_size=3072, vocab_size=151936,
        max_position_embeddings=max(4096, seq), tie_word_embeddings=True,
        attn_implementation="sdpa")
    with torch.device("cuda:0"):
        model = transformers.Qwen3ForCausalLM(config).to(torch.bfloat16)
    model.train()
    if which == "kh":
        import kernel_hub
        kernel_hub.kernelize(model, device="cuda:0", mode="train")
    return model


def node_saved(node):
    """The tensors an autograd node holds for backward (C++ nodes' _saved_* attributes, Python
    functions' saved_tensors)."""
    out = []
    names = [n for n in dir(node) if n.startswith("_saved_")]
    for name in names:
        try:
            v = getattr(node, name)
        except Exception:  # noqa: BLE001 (freed, or not a tensor)
            continue
        vals = v if isinstance(v, (tuple, list)) else (v,)
        out += [x for x in vals if hasattr(x, "untyped_storage")]
    if hasattr(node, "saved_tensors"):
        try:
            out += [x for x in node.saved_tensors if hasattr(x, "untyped_storage")]
        except Exception:  # noqa: BLE001
            pass
    return out


def saved_by_node(loss, params, device_type="cuda"):
    """{node name: [bytes, storages]} over the graph from loss, each storage counted once (at the
    first node that holds it met in a depth-first walk from the loss)."""
    seen_nodes, seen_storages = set(), set()
    groups = collections.defaultdict(lambda: [0, 0])
    stack = [loss.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen_nodes:
            continue
        seen_nodes.add(node)
        for t in node_saved(node):
            s = t.untyped_storage()
            key = s.data_ptr()
            if key in params or key in seen_storages or t.device.type != device_type:
                continue
            seen_storages.add(key)
            g = groups[node.name()]
            g[0] += s.nbytes()
            g[1] += 1
        stack += [f for f, _ in node.next_functions if f is not None]
    return groups


def frame_of(frames):
    """The allocating Python frame, outside torch's own files where there is one."""
    py = [f for f in frames if str(f.get("filename", "")).endswith(".py")]
    if py and py[0]["filename"].endswith("bridge_memory.py"):  # outermost first: innermost first
        py = py[::-1]
    for f in py:
        name = f["filename"]
        if "/torch/" not in name:
            short = "/".join(name.split("/")[-2:])
            return f"{short}:{f['line']} {f['name']}"
    if py:
        f = py[0]
        return f"{'/'.join(f['filename'].split('/')[-2:])}:{f['line']} {f['name']}"
    return "(no python frame)"


def live_at_peak(snapshot, start_bytes):
    """Replays the allocator trace: the peak of memory allocated and the blocks allocated during
    the trace that were live at it (largest first), as (bytes, frame)."""
    trace = snapshot["device_traces"][0]
    live, total = {}, start_bytes
    peak, peak_live = start_bytes, {}
    for e in trace:
        action = e["action"]
        if action == "alloc":
            live[e["addr"]] = (e["size"], e.get("frames", []))
            total += e["size"]
            if total > peak:
                peak, peak_live = total, dict(live)
        elif action == "free_completed":
            live.pop(e["addr"], None)
            total -= e["size"]
    blocks = sorted(peak_live.values(), key=lambda b: -b[0])
    return peak, [(size, frame_of(frames)) for size, frames in blocks[:TOP_BLOCKS]], \
        sum(size for size, _ in blocks)


def run_one(which, shape):
    """One configuration and shape in this process: a JSON line."""
    import torch
    layers, batch, seq, _chunk = SHAPES[shape]
    model = build(which, layers, seq)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    g = torch.Generator(device="cuda:0").manual_seed(1)
    ids = torch.randint(0, model.config.vocab_size, (batch, seq), device="cuda:0", generator=g)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}

    def step():
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # the optimizer's state
    torch.cuda.synchronize()
    r = {"config": which, "shape": shape}
    r["before"] = torch.cuda.memory_allocated()
    torch.cuda.memory._record_memory_history(enabled="all", context="alloc", stacks="python",
                                             max_entries=TRACE_ENTRIES)
    torch.cuda.reset_peak_memory_stats()
    # The measured step runs with no hooks of ours (a caller's saved-tensor hooks turn
    # kernel-hub's norm recomputation off); kernel-hub's own pack hook is wrapped to count the
    # norm outputs it does not keep.
    recomputed = {}
    restore = None
    if which == "kh":
        from kernel_hub import bridge
        pack = bridge._NormRecompute.pack

        def counting_pack(scope, t):
            packed = pack(scope, t)
            if isinstance(packed, bridge._SavedNormView):
                s = t.untyped_storage()
                recomputed[s.data_ptr()] = s.nbytes()
            return packed

        bridge._NormRecompute.pack = counting_pack
        restore = lambda: setattr(bridge._NormRecompute, "pack", pack)  # noqa: E731
    try:
        loss = model(input_ids=ids, labels=ids).loss
    finally:
        if restore:
            restore()
    torch.cuda.synchronize()
    r["after_forward"] = torch.cuda.memory_allocated()
    r["forward_peak"] = torch.cuda.max_memory_allocated()
    r["recomputed"] = [sum(recomputed.values()), len(recomputed)]
    torch.cuda.reset_peak_memory_stats()
    loss.backward()
    torch.cuda.synchronize()
    r["backward_peak"] = torch.cuda.max_memory_allocated()
    r["after_backward"] = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    opt.step()
    opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    r["step_peak"] = torch.cuda.max_memory_allocated()
    r["loss"] = float(loss.detach())
    del loss
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    r["trace_peak"], r["blocks"], r["blocks_total"] = live_at_peak(snap, r["before"])
    r["trace_events"] = len(snap["device_traces"][0])
    del snap
    free, total = torch.cuda.mem_get_info()
    r["device_used"] = total - free
    r["reserved_peak"] = torch.cuda.max_memory_reserved()
    # What autograd saves, by node: another forward (not measured above, no backward) under a
    # recording pack hook, which also turns kernel-hub's norm recomputation off: its norm
    # outputs show here under the nodes that save them (MmBackward0, _GateUp).
    packed = {}

    def record(t):
        if t.device.type == "cuda":
            s = t.untyped_storage()
            if s.data_ptr() not in params:
                packed[s.data_ptr()] = s.nbytes()
        return t.detach()  # an output with its own node would be a reference cycle

    with torch.autograd.graph.saved_tensors_hooks(record, lambda t: t):
        loss = model(input_ids=ids, labels=ids).loss
    r["packed"] = sum(packed.values())
    groups = saved_by_node(loss, params)
    r["nodes"] = sorted(([name, b, n] for name, (b, n) in groups.items()), key=lambda x: -x[1])
    del loss
    print("RESULT " + json.dumps(r), flush=True)


def report(r):
    print(f"\n== {r['config']} | {r['shape']} | loss {r['loss']:.4f}")
    print(f"before step {mib(r['before'])} | after forward {mib(r['after_forward'])} | "
          f"forward peak {mib(r['forward_peak'])}")
    print(f"backward peak {mib(r['backward_peak'])} | optimizer peak {mib(r['step_peak'])} | "
          f"trace peak {mib(r['trace_peak'])} | device used {mib(r['device_used'])}")
    node_total = sum(b for _, b, _ in r["nodes"])
    print(f"left by the forward {mib(r['after_forward'] - r['before'])}; norm outputs "
          f"recomputed in backward instead {mib(r['recomputed'][0])} ({r['recomputed'][1]})")
    print(f"saved for backward without that: {mib(r['packed'])} packed (hook), "
          f"{mib(node_total)} by node:")
    for name, b, n in r["nodes"][:TOP_NODES]:
        print(f"  {mib(b)} {n:4d} storages  {name[:70]}")
    rest = r["nodes"][TOP_NODES:]
    if rest:
        print(f"  {mib(sum(b for _, b, _ in rest))}      in {len(rest)} other node types")
    if r["trace_events"] >= TRACE_ENTRIES:
        print(f"warning: the allocator's trace ring filled ({r['trace_events']} events): the "
              "replay starts late and its peak is wrong; raise TRACE_ENTRIES")
    print(f"live at the peak, allocated during the step: {mib(r['blocks_total'])}; largest:")
    for size, frame in r["blocks"]:
        print(f"  {mib(size)}  {frame[:90]}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="test,full")
    ap.add_argument("--configs", default="kh,liger")
    ap.add_argument("--liger-dir", default="/tmp/liger")
    ap.add_argument("--run", help=argparse.SUPPRESS)
    ap.add_argument("--shape", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.run:
        run_one(args.run, args.shape)
        return
    sys.path.insert(0, HERE)
    import bench_e2e
    base = dict(os.environ)
    base["PYTHONPATH"] = os.pathsep.join(
        p for p in (os.path.join(ROOT, "tools", "python"), base.get("PYTHONPATH")) if p)
    for shape in args.shapes.split(","):
        results = {}
        for which in args.configs.split(","):
            name, settings = bench_e2e.split_config(which)
            env = dict(base)
            if name == "liger":
                liger = bench_e2e.ensure_liger(args)
                if liger is None:
                    print("[liger] liger_kernel does not import and no wheel: skipped")
                    continue
                env["PYTHONPATH"] = os.pathsep.join(
                    p for p in (liger.get("PYTHONPATH"), base["PYTHONPATH"]) if p)
            chunk = SHAPES[shape][3]
            if chunk is not None:
                env["KERNEL_HUB_LCE_CHUNK_MIB"] = chunk
            env.update(settings)
            p = subprocess.run([sys.executable, os.path.abspath(__file__), "--run", name,
                                "--shape", shape], env=env, capture_output=True, text=True)
            line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
            if p.returncode != 0 or not line:
                print(f"[{which} {shape}] failed (exit {p.returncode}):\n{p.stderr[-1500:]}")
                continue
            results[which] = json.loads(line[-1][len("RESULT "):])
            results[which]["config"] = which
            report(results[which])
        if "kh" in results and "liger" in results:
            kh, lg = results["kh"], results["liger"]
            print(f"\n{shape}: kernel-hub - Liger: " + ", ".join(
                f"{k} {(kh[k] - lg[k]) / MIB:+.0f} MiB" for k in
                ("after_forward", "forward_peak", "backward_peak", "step_peak")))


if __name__ == "__main__":
    main()
