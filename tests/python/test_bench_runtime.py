#!/usr/bin/env python3
"""tools/bench/bench_runtime.py's rounds without a GPU or PyTorch: a scratch copy of the script
beside a stand-in bench_e2e.py (its training child: a RESULT line whose rate grows each run) runs
against a stand-in kernel-hub (`demo --json` as the runtime answers, a rate and step times that
grow each run too). Checked: --rounds 3 alternates the runtime and the configuration (runtime,
compile, runtime, compile, ...), the runtime decodes at the asked shape in the first round only,
the table holds each one's median and their ratio, every round is listed, and so are each
round's step times, the runtime's and PyTorch's; --keep-normed reaches the demo; --rounds 0 is
refused. Usage:
test_bench_runtime.py (exit 0 = pass)."""
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")

# Both stand-ins count their runs in $STUB_LOG (one line a run, in order).
KERNEL_HUB = r'''#!/usr/bin/env python3
import json, os, sys
log = os.environ["STUB_LOG"]
n = sum(1 for l in open(log) if l.startswith("kh")) if os.path.exists(log) else 0
with open(log, "a") as f:
    f.write("kh " + " ".join(sys.argv[1:]) + "\n")
print(json.dumps({"device_run": {
    "train_tokens_per_s": [100000.0, 120000.0, 110000.0][n],
    "prefill_tokens_per_s": 400000.0 + n, "peak_bytes": 23 * 2**30,
    "train_step_ms": [150.0 + n, 151.0 + n]}}))
'''
BENCH_E2E = r'''import json, os, sys
if __name__ == "__main__":
    log = os.environ["STUB_LOG"]
    n = sum(1 for l in open(log) if l.startswith("e2e"))
    with open(log, "a") as f:
        f.write("e2e " + " ".join(sys.argv[1:]) + "\n")
    r = {"tokens_per_s": [70000.0, 80000.0, 75000.0][n], "peak_gib": 40.0}
    if n != 1:  # the second round lists no step times (as an older bench_e2e.py)
        r["step_ms"] = [216.0 + n, 217.5]
    print("RESULT " + json.dumps(r))
'''


def main():
    with tempfile.TemporaryDirectory() as d:
        bench = os.path.join(d, "tools", "bench")
        os.makedirs(bench)
        shutil.copy(os.path.join(REPO, "tools", "bench", "bench_runtime.py"), bench)
        with open(os.path.join(bench, "bench_e2e.py"), "w") as f:
            f.write(BENCH_E2E)
        kh = os.path.join(d, "kernel-hub")
        with open(kh, "w") as f:
            f.write(KERNEL_HUB)
        os.chmod(kh, os.stat(kh).st_mode | stat.S_IXUSR)
        log = os.path.join(d, "log.txt")
        env = dict(os.environ, STUB_LOG=log)
        cmd = [sys.executable, os.path.join(bench, "bench_runtime.py"), "--kernel-hub", kh,
               "--configs", "compile", "--no-torch-decode", "--steps", "2", "--warmup", "1"]
        r = subprocess.run(cmd + ["--rounds", "3"], env=env, capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        runs = [l.split()[0] for l in open(log)]
        assert runs == ["kh", "e2e"] * 3, runs
        kh_args = [l.split()[1:] for l in open(log) if l.startswith("kh")]
        decode = [(a[a.index("--decode-batch") + 1], a[a.index("--decode-context") + 1])
                  for a in kh_args]
        assert decode == [("64", "2048"), ("1", "64"), ("1", "64")], decode
        out = r.stdout
        # Medians: 110,000 (of 100k, 120k, 110k) against 75,000 (of 70k, 80k, 75k) = 1.47x.
        assert "| kernel-hub runtime | 110,000 | 400,001 | 23.0 | 1.47x | - |" in out, out
        assert "| torch.compile | 75,000 | - | 40.0 | 1.00x | - |" in out, out
        assert "| kernel-hub runtime | 100,000 / 400,000 | 120,000 / 400,001 | 110,000 / 400,002 |" \
            in out, out
        assert "| torch.compile | 70,000 / - | 80,000 / - | 75,000 / - |" in out, out
        # Each one's step times, a round a line, under its name: the runtime's, then PyTorch's
        # ("-" for the round that listed none).
        listed = out[out.index("Each timed training step"):].splitlines()[1:9]
        assert listed == ["kernel-hub runtime", "  150.0 151.0", "  151.0 152.0",
                          "  152.0 153.0", "torch.compile", "  216.0 217.5", "  -",
                          "  218.0 217.5"], listed
        # Medians of every round's steps: 151.5 ms (8 x 2048 tokens: 108,145 tokens/s) against
        # 217.5 ms (75,329): 1.44x.
        assert "| kernel-hub runtime | 151.5 | 108,145 | 1.44x |" in out, out
        assert "| torch.compile | 217.5 | 75,329 | 1.00x |" in out, out
        # The demo's own default unless --keep-normed is given, then passed on to every run.
        assert all("--keep-normed" not in a for a in kh_args), kh_args
        os.remove(log)
        r = subprocess.run(cmd + ["--keep-normed", "on"], env=env, capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0, r.stdout + r.stderr
        kh_args = [l.split()[1:] for l in open(log) if l.startswith("kh")]
        assert [a[a.index("--keep-normed") + 1] for a in kh_args] == ["on"], kh_args
        r = subprocess.run(cmd + ["--rounds", "0"], env=env, capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 2 and "--rounds 0" in r.stderr, r.stderr
    print("test_bench_runtime: ok")


if __name__ == "__main__":
    main()
