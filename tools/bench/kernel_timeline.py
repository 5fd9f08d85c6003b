#!/usr/bin/env python3
"""A CUDA-graph step's breakdown from kernel_timeline's rows (libkh_kernel_timeline.so, a CUPTI
injection library): the replays of the graph launched most often (a decode step), the median one
taken, its kernels in GPU order with each one's duration, its gap after the kernel before (negative:
it overlapped, as PDL lets it) and the wall time it added to the step (its end past every earlier
kernel's end); then those added times summed by kind (GEMM, attention, hub kernels, the runtime's
fallbacks, other) and the kernels of one layer in the middle of the step. With --train, a training
step instead (no graph): the kernels from the end of the second-to-last AdamW update up to the end
of the last one, by kind and by kernel name (where a training step's time goes); with --compare,
several variants' training steps side by side (tools/bench/train_ab.sh).

  CUDA_INJECTION64_PATH=$g/bin/libkh_kernel_timeline.so KH_TIMELINE_OUT=/tmp/t.tsv \\
      kernel-hub demo --device cuda:0 --model qwen3-0.6b ...
  python3 tools/bench/kernel_timeline.py /tmp/t.tsv [--json]
  ... kernel-hub demo --device cuda:0 --model qwen3-0.6b --batch 8 --seq 2048 --steps 3
  python3 tools/bench/kernel_timeline.py /tmp/t.tsv --train [--json]
  python3 tools/bench/kernel_timeline.py /tmp/base.tsv --train --compare new=/tmp/new.tsv \\
      [--match 'attn_']
"""
import argparse
import collections
import csv
import json
import re
import statistics
import sys

# Kind of a kernel by its name: first match wins.
KINDS = [
    ("attention combine", ("attn_decode_combine",)),
    ("attention", ("attn_decode", "attn_fwd", "attn_", "kh_paged_decode", "kh_attention_")),
    ("GEMM (skinny)", ("kh_skinny",)),
    ("GEMM (cuBLASLt)", ("nvjet", "gemm", "xmma", "cutlass", "cublas", "splitKreduce")),
    # The runtime's own kernels for layers no package serves (tools/demo/device_*.cu).
    ("runtime fallbacks", ("kh_rms_norm", "kh_rotary", "kh_silu_and_mul", "kh_paged_append",
                           "kh_add_", "kh_bias_add", "kh_cast_", "kh_accumulate_")),
    ("hub kernels", ("norm_", "rope_", "qk_norm_rope", "qknr_", "act_", "paged_kv_append", "lce_",
                     "ce_fwd", "ce_bwd", "ce_train", "softmax_")),
]


def kind_of(name):
    for kind, keys in KINDS:
        if any(k in name for k in keys):
            return kind
    return "other"


def read_rows(path):
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f, delimiter="\t"))
    except OSError as e:
        sys.exit(f"{path}: {e.strerror} (kernel_timeline's rows: $KH_TIMELINE_OUT of a run with "
                 "CUDA_INJECTION64_PATH=libkh_kernel_timeline.so)")
    for r in rows:
        for k in ("start_ns", "end_ns", "stream", "correlation", "graph"):
            r[k] = int(r[k])
    return rows


def graph_steps(rows):
    """The replays (one correlation id each) of the graph with the most of them."""
    steps = collections.defaultdict(list)
    for r in rows:
        if r["graph"]:
            steps[(r["graph"], r["correlation"])].append(r)
    if not steps:
        return []
    per_graph = collections.Counter(g for g, _ in steps)
    graph = per_graph.most_common(1)[0][0]
    return [sorted(v, key=lambda r: r["start_ns"]) for (g, _), v in sorted(steps.items())
            if g == graph]


def annotate(step):
    """Each kernel's duration, gap after the previous kernel's end and the wall time it added."""
    t0 = step[0]["start_ns"]
    frontier = t0
    out = []
    prev_end = t0
    for r in step:
        added = max(0, r["end_ns"] - frontier)  # an idle gap before it counts as its own
        out.append({"name": r["name"], "kind": kind_of(r["name"]),
                    "start_us": (r["start_ns"] - t0) / 1e3,
                    "dur_us": (r["end_ns"] - r["start_ns"]) / 1e3,
                    "gap_us": (r["start_ns"] - prev_end) / 1e3,
                    "added_us": added / 1e3, "grid": r["grid"], "block": r["block"]})
        frontier = max(frontier, r["end_ns"])
        prev_end = r["end_ns"]
    return out


def breakdown(kernels):
    by_kind = collections.OrderedDict()
    for k in kernels:
        b = by_kind.setdefault(k["kind"], {"kernels": 0, "busy_us": 0.0, "added_us": 0.0})
        b["kernels"] += 1
        b["busy_us"] += k["dur_us"]
        b["added_us"] += k["added_us"]
    return by_kind


def one_layer(kernels):
    """One period of the step in its middle: the kernels after one attention up to and with the
    next (the combine, the MLP, the next layer's norm, projections, append and attention)."""
    attn = [i for i, k in enumerate(kernels) if k["kind"] == "attention"]
    if len(attn) < 3:
        return kernels
    mid = len(attn) // 2
    return kernels[attn[mid - 1] + 1:attn[mid] + 1]


def train_step(rows, optimizer="adamw"):
    """The last whole training step outside graphs: the kernels after the second-to-last run of
    consecutive optimizer launches up to the end of the last run, in start order."""
    ks = sorted((r for r in rows if not r["graph"]), key=lambda r: r["start_ns"])
    ends = [i for i, r in enumerate(ks)
            if optimizer in r["name"] and (i + 1 == len(ks) or optimizer not in ks[i + 1]["name"])]
    if len(ends) < 2:
        return []
    return ks[ends[-2] + 1:ends[-1] + 1]


def train_breakdown(step):
    """A training step's wall time (us), its added times by kind and by (kernel, grid): one
    kernel's launches at different shapes (a norm over the hidden size and over the q/k heads)
    are different rows, most added time first."""
    kernels = annotate(step)
    wall = (max(r["end_ns"] for r in step) - step[0]["start_ns"]) / 1e3
    by_launch = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for k in kernels:
        e = by_launch[(k["name"], k["grid"])]
        e[0] += 1
        e[1] += k["dur_us"]
        e[2] += k["added_us"]
    rows = [{"name": name, "grid": grid, "kind": kind_of(name), "launches": n, "busy_us": busy,
             "added_us": added, "us_a_launch": busy / n}
            for (name, grid), (n, busy, added) in sorted(by_launch.items(), key=lambda x: -x[1][2])]
    return {"kernels": len(kernels), "step_us": wall, "by_kind": breakdown(kernels),
            "by_launch": rows}


def print_train(b, top=30):
    print(f"one training step: {b['kernels']} kernels, {b['step_us'] / 1e3:.2f} ms from the first "
          f"kernel's start to the last one's end\n")
    print("| kind | kernels | busy ms (sum of durations) | wall ms added | share of step |")
    print("|---|---|---|---|---|")
    total = sum(k["added_us"] for k in b["by_kind"].values())
    for kind, k in b["by_kind"].items():
        print(f"| {kind} | {k['kernels']} | {k['busy_us'] / 1e3:.2f} | "
              f"{k['added_us'] / 1e3:.2f} | {100 * k['added_us'] / total:.1f}% |")
    print(f"\nThe {top} kernels (by grid) that added the most wall time:\n")
    print("| kernel | kind | grid | launches | busy ms | wall ms added | us a launch |")
    print("|---|---|---|---|---|---|---|")
    for r in b["by_launch"][:top]:
        print(f"| {short(r['name'], 60)} | {r['kind']} | {r['grid']} | {r['launches']} | "
              f"{r['busy_us'] / 1e3:.2f} | {r['added_us'] / 1e3:.2f} | {r['us_a_launch']:.1f} |")


def print_compare(variants, match):
    """Training steps of several variants side by side (the first is the baseline): the step,
    the kinds' added times, and the time a launch of every (kernel, grid) whose name matches
    `match` (a regular expression) or, without one, of the 15 that added the most in the first."""
    labels = list(variants)
    base = variants[labels[0]]
    head = " | ".join(labels)
    print(f"| | {head} | " + " | ".join(f"{l} / {labels[0]}" for l in labels[1:]) + " |")
    print("|---" * (1 + 2 * len(labels) - 1) + "|")

    def row(what, values, fmt):
        ratios = [f"{v / values[0]:.3f}" if values[0] and v is not None else "-" for v in values[1:]]
        cells = [fmt(v) if v is not None else "-" for v in values]
        print(f"| {what} | " + " | ".join(cells + ratios) + " |")

    row("step ms", [variants[l]["step_us"] / 1e3 for l in labels], lambda v: f"{v:.2f}")
    for kind in base["by_kind"]:
        row(f"{kind} ms (wall added)",
            [variants[l]["by_kind"].get(kind, {}).get("added_us", 0.0) / 1e3 for l in labels],
            lambda v: f"{v:.2f}")
    keys = [(r["name"], r["grid"]) for r in base["by_launch"]
            if (re.search(match, r["name"]) if match else True)]
    if not match:
        keys = keys[:15]
    launches = {l: {(r["name"], r["grid"]): r for r in variants[l]["by_launch"]} for l in labels}
    by_name = {l: {} for l in labels}
    for l in labels:
        for r in variants[l]["by_launch"]:
            by_name[l].setdefault(r["name"], []).append(r)

    def launch_of(label, key):
        """The variant's launches of (kernel, grid), else of the kernel on its one other grid (a
        persistent kernel, another tile size), compared as the same kernel."""
        if key in launches[label]:
            return launches[label][key]
        same_name = by_name[label].get(key[0], [])
        return same_name[0] if len(same_name) == 1 else None

    for key in keys:
        found = [launch_of(l, key) for l in labels]
        grids = " / ".join(dict.fromkeys(r["grid"] for r in found if r) or [key[1]])
        row(f"{short(key[0], 48)} [{grids}] us a launch",
            [r["us_a_launch"] if r else None for r in found], lambda v: f"{v:.1f}")


def short(name, n=48):
    return name if len(name) <= n else name[: n - 3] + "..."


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("tsv", help="kernel_timeline's output ($KH_TIMELINE_OUT)")
    ap.add_argument("--json", action="store_true", help="print the breakdown as JSON")
    ap.add_argument("--train", action="store_true",
                    help="the last training step (between AdamW updates) instead of a graph step")
    ap.add_argument("--compare", nargs="+", metavar="LABEL=TSV",
                    help="with --train: more variants' rows, side by side with tsv's (labelled by "
                         "--label) as the baseline")
    ap.add_argument("--label", default="base", help="tsv's label with --compare (default base)")
    ap.add_argument("--match", help="with --compare: the kernels to list (a regular expression)")
    a = ap.parse_args()
    if a.compare and not a.train:
        sys.exit("--compare needs --train")
    if a.train:
        variants = {a.label: a.tsv}
        for v in a.compare or []:
            label, sep, path = v.partition("=")
            if not sep or not label or not path:
                sys.exit(f"--compare {v!r}: expected LABEL=TSV")
            if label in variants:
                sys.exit(f"--compare {v!r}: label {label!r} is taken (--label names tsv's; give "
                         "each variant its own)")
            variants[label] = path
        if a.match:
            try:
                re.compile(a.match)
            except re.error as e:
                sys.exit(f"--match {a.match!r}: not a regular expression ({e})")
        steps = {}
        for label, path in variants.items():
            step = train_step(read_rows(path))
            if not step:
                sys.exit(f"{path}: fewer than two AdamW updates outside graphs (--steps 2 or more?)")
            steps[label] = train_breakdown(step)
        if a.compare:
            print_compare(steps, a.match)
        elif a.json:
            print(json.dumps(steps[a.label], indent=1))
        else:
            print_train(steps[a.label])
        return
    steps = graph_steps(read_rows(a.tsv))
    if not steps:
        sys.exit(f"{a.tsv}: no CUDA-graph kernels (was the step captured? CUDA_INJECTION64_PATH set?)")
    # First start to last end (the kernel that starts last need not end last beside a branch).
    spans = [(max(r["end_ns"] for r in s) - s[0]["start_ns"], i) for i, s in enumerate(steps)]
    spans_sorted = sorted(spans)
    median_span, median_i = spans_sorted[len(spans_sorted) // 2]
    kernels = annotate(steps[median_i])
    total = sum(k["added_us"] for k in kernels)
    kinds = breakdown(kernels)
    layer = one_layer(kernels)
    # Idle time from one replay's last kernel to the next one's first (the replays were launched
    # back to back on one stream): what a graph launch costs at the step boundary.
    gaps = [(b[0]["start_ns"] - max(r["end_ns"] for r in a)) / 1e3 for a, b in zip(steps, steps[1:])]
    replay_gap = statistics.median(gaps) if gaps else None
    if a.json:
        print(json.dumps({"replays": len(steps), "kernels_per_step": len(kernels),
                          "step_us": median_span / 1e3,
                          "step_us_min": spans_sorted[0][0] / 1e3, "replay_gap_us": replay_gap,
                          "by_kind": kinds, "layer": layer}, indent=1))
        return
    print(f"{len(steps)} replays of the graph, {len(kernels)} kernels each; median step "
          f"{median_span / 1e3:.1f} us (min {spans_sorted[0][0] / 1e3:.1f}, max "
          f"{spans_sorted[-1][0] / 1e3:.1f}; first kernel's start to last kernel's end)\n")
    print("| kind | kernels | busy us (sum of durations) | wall us added | share of step |")
    print("|---|---|---|---|---|")
    for kind, b in kinds.items():
        print(f"| {kind} | {b['kernels']} | {b['busy_us']:.1f} | {b['added_us']:.1f} | "
              f"{100 * b['added_us'] / total:.1f}% |")
    print(f"\nOne layer in the middle of the step ({len(layer)} kernels, "
          f"{sum(k['added_us'] for k in layer):.1f} us added):\n")
    print("| kernel | kind | grid | us | gap after previous us | wall us added |")
    print("|---|---|---|---|---|---|")
    for k in layer:
        print(f"| {short(k['name'])} | {k['kind']} | {k['grid']} | {k['dur_us']:.2f} | "
              f"{k['gap_us']:.2f} | {k['added_us']:.2f} |")
    print("\nThe step's first 2 and last 3 kernels (outside the layers: embedding, LM head, "
          "argmax):\n")
    print("| kernel | kind | grid | us | gap after previous us | wall us added |")
    print("|---|---|---|---|---|---|")
    for k in kernels[:2] + kernels[-3:]:
        print(f"| {short(k['name'])} | {k['kind']} | {k['grid']} | {k['dur_us']:.2f} | "
              f"{k['gap_us']:.2f} | {k['added_us']:.2f} |")
    med = statistics.median(k["gap_us"] for k in kernels[1:]) if len(kernels) > 1 else 0
    print(f"\nmedian gap between consecutive kernels: {med:.2f} us")
    if replay_gap is not None:
        print(f"median gap between consecutive replays: {replay_gap:.2f} us")


if __name__ == "__main__":
    main()
