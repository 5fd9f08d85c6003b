#!/usr/bin/env python3
"""tools/bench/train_ab.sh's plumbing without a GPU: a scratch repository root holds the bench
scripts and a bundle (.devlibs/gpu) whose kernel-hub is a stand-in that answers `demo --json` as
the runtime does (its rates set by the variant's settings and options) and, under
KH_TIMELINE_OUT, writes the rows libkh_kernel_timeline.so would (three training steps). Checked:
every variant runs every round in order with its own settings (HUB=DIR: data dir, cache and trust
store of its own; VAR=VALUE; options after the script's; BIN=PATH: another binary), one row a run
and one JSON line a run in $OUT, the timelines side by side with the first variant as the
baseline and KH_AB_KERNELS choosing the kernels listed, KH_AB_TIMELINE=0 leaving them out, and a
malformed variant refused before anything runs. Usage: test_train_ab.py (exit 0 = pass)."""
import json
import os
import shutil
import stat
import subprocess
import tempfile

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")

# The stand-in: logs its arguments and settings, answers with rates from them.
STUB = r'''#!/usr/bin/env python3
import json, os, sys
args = sys.argv[1:]
with open(os.environ["STUB_LOG"], "a") as f:
    f.write(json.dumps({"bin": sys.argv[0], "args": args,
                        "data": os.environ.get("KERNEL_HUB_DATA_DIR"),
                        "cache": os.environ.get("KERNEL_HUB_CACHE"),
                        "trust": os.environ.get("KERNEL_HUB_TRUST_DIR"),
                        "knob": os.environ.get("KNOB"),
                        "timeline": os.environ.get("KH_TIMELINE_OUT")}) + "\n")
fast = "--fast" in args or os.environ.get("KERNEL_HUB_DATA_DIR", "").endswith("oldhub")
attn_ns = 6000 if fast else 9000
out = os.environ.get("KH_TIMELINE_OUT")
if out:
    t, rows = 1000, []
    for step in range(3):
        for name, dur in (("nvjet_gemm", 4000), ("attn_fwd90_bf16_d128", attn_ns),
                          ("lce_grad_bf16", 3000), ("kh_adamw_f32", 500)):
            rows.append(f"{t}\t{t + dur}\t7\t{len(rows)}\t0\t0\t1,1,1\t32,1,1\t{name}")
            t += dur + 100
    with open(out, "w") as f:
        f.write("start_ns\tend_ns\tstream\tcorrelation\tgraph\tgraph_node\tgrid\tblock\tname\n")
        f.write("\n".join(rows) + "\n")
print(json.dumps({"device_run": {"train_tokens_per_s": 110000.0 if fast else 100000.0,
                                 "prefill_tokens_per_s": 450000.0, "peak_bytes": 24709267456}}))
'''


def make_root(d):
    bench = os.path.join(d, "tools", "bench")
    os.makedirs(bench)
    for f in ("gpu_env.sh", "ab_variant.sh", "train_ab.sh"):
        shutil.copy(os.path.join(REPO, "tools", "bench", f), bench)
    g = os.path.join(d, ".devlibs", "gpu")
    os.makedirs(os.path.join(g, "bin"))
    os.makedirs(os.path.join(g, "lib"))
    shutil.copy(os.path.join(REPO, "tools", "bench", "kernel_timeline.py"), g)
    for name in ("kernel-hub", "other-kernel-hub"):
        path = os.path.join(g, "bin", name)
        with open(path, "w") as f:
            f.write(STUB)
        os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
    return g


def run(root, args, **env):
    e = dict(os.environ, OUT=os.path.join(root, "out"), STUB_LOG=os.path.join(root, "log.jsonl"))
    e.update(env)
    return subprocess.run(["tools/bench/train_ab.sh", *args], cwd=root, env=e,
                          capture_output=True, text=True, timeout=120)


def main():
    with tempfile.TemporaryDirectory() as root:
        g = make_root(root)
        hub = os.path.join(root, "oldhub")
        r = run(root, ["base=", f"hub=HUB={hub}", "opt=KNOB=7 --fast",
                       f"bin=BIN={g}/bin/other-kernel-hub"], KH_AB_KERNELS="attn_")
        assert r.returncode == 0, r.stdout + r.stderr
        calls = [json.loads(l) for l in open(os.path.join(root, "log.jsonl"))]
        # 2 rounds of 4 variants, then one timeline run each.
        assert len(calls) == 12, calls
        labels = ["base", "hub", "opt", "bin"] * 3
        lines = [l for l in r.stdout.splitlines() if l.split()[:1] and l.split()[0] in labels[:4]]
        assert [l.split()[0] for l in lines[:8]] == labels[:8], r.stdout
        assert lines[0].split()[2] == "100,000" and lines[1].split()[2] == "110,000", lines
        base, hubc, opt, binc = calls[:4]
        assert base["data"].endswith(".devlibs/gpu") and "--steps" in base["args"], base
        assert hubc["data"] == hub and hubc["cache"].endswith("kh-cache-ab-hub"), hubc
        assert hubc["trust"].endswith("kh-trust-ab-hub"), hubc
        assert opt["knob"] == "7" and opt["args"][-1] == "--fast", opt
        assert binc["bin"].endswith("other-kernel-hub"), binc
        assert all(c["timeline"] is None for c in calls[:8]), calls[:8]
        assert all(c["timeline"] and "--steps" in c["args"] for c in calls[8:]), calls[8:]
        jsonl = [json.loads(l) for l in open(os.path.join(root, "out", "train_ab.jsonl"))]
        assert [(j["variant"], j["round"]) for j in jsonl[:2]] == [("base", 1), ("hub", 1)], jsonl
        assert len(jsonl) == 8, jsonl
        # The timelines: base is the baseline; hub and opt ran the short attention.
        table = open(os.path.join(root, "out", "train_ab_timeline.md")).read()
        assert "| | base | hub | opt | bin | hub / base | opt / base | bin / base |" in table, table
        assert "| attn_fwd90_bf16_d128 [1,1,1] us a launch | 9.0 | 6.0 | 6.0 | 9.0 | 0.667 | " \
            "0.667 | 1.000 |" in table, table
        assert "lce_grad" not in table, table

        os.remove(os.path.join(root, "log.jsonl"))
        r = run(root, ["a=", "b=--fast"], KH_AB_TIMELINE="0", KH_AB_ROUNDS="1")
        assert r.returncode == 0, r.stdout + r.stderr
        assert len(open(os.path.join(root, "log.jsonl")).readlines()) == 2

        r = run(root, ["a=", "no-label"])
        assert r.returncode == 2 and "'no-label' is not LABEL=WORDS" in r.stderr, r.stderr
    print("train_ab: ok")


if __name__ == "__main__":
    main()
