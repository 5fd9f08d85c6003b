#!/usr/bin/env python3
"""tools/bench/kernel_timeline.py on rows written as libkh_kernel_timeline.so writes them: the
graph launched most often is the step (another graph and kernels outside graphs are left out),
its median replay is the one reported, each kernel's added wall time is its end past every earlier
end (an idle gap counts to the kernel after it, overlap under PDL counts once), the added times
sum to the step, kernels are sorted into their kinds by name, and one layer is the period between
two attentions. With --train, the kernels outside graphs after the second-to-last run of AdamW
launches up to the end of the last run are one training step, summed by kind and by name (also as
JSON), and --compare puts several variants' steps side by side. Usage:
test_kernel_timeline.py (exit 0 = pass)."""
import json
import os
import subprocess
import sys
import tempfile

TOOL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "bench",
                    "kernel_timeline.py")
HEADER = "start_ns\tend_ns\tstream\tcorrelation\tgraph\tgraph_node\tgrid\tblock\tname\n"

# One layer's kernels (name, duration ns, gap ns after the previous kernel's end: negative =
# overlapped), repeated three times per step; a replay's `stretch` lengthens its attentions.
LAYER = [("norm_fwd_add_rms_bf16_vec_reg", 2000, 500),
         ("nvjet_sm90_tst_64x64_64x13_4x1_v_bz_TNT", 5000, 100),
         ("qk_norm_rope_neox_bf16_f32", 3000, -200),
         ("paged_kv_append_bf16", 2000, -1500),
         ("attn_decode_tc_bf16_d128", 100000, -800),
         ("attn_decode_combine_bf16_d128", 30000, -27000),
         ("kh_skinny_wgmma_n1_s4", 8000, -4000)]


def write_rows(path, rows):
    """rows of (start, end, stream, correlation, graph, name[, grid]) as the injection library
    writes them (grid "1,1,1" unless given); returns path."""
    with open(path, "w") as f:
        f.write(HEADER)
        for start, end, stream, corr, graph, name, *grid in rows:
            g = grid[0] if grid else "1,1,1"
            f.write(f"{start}\t{end}\t{stream}\t{corr}\t{graph}\t0\t{g}\t32,1,1\t{name}\n")
    return path


def step_rows(t0, correlation, graph, stretch):
    rows, end = [], t0
    for _ in range(3):
        for name, dur, gap in LAYER:
            start = end + gap
            end = start + dur * (stretch if name.startswith("attn_decode_tc") else 1)
            rows.append((start, end, 7, correlation, graph, name))
    rows.append((end + 300, end + 300 + 20000, 7, correlation, graph, "kh_argmax_advance_bf16"))
    # A short kernel on another stream that starts last and ends before the argmax: the step
    # still ends with the argmax.
    rows.append((end + 400, end + 900, 8, correlation, graph, "kh_step_advance"))
    return rows


def main():
    rows = []
    # Three replays of the decode graph (42), the middle one in length the median; one replay of
    # another graph (9) and a kernel outside any graph.
    for i, stretch in enumerate((1, 3, 2)):
        rows += step_rows(10_000_000 * (i + 1), 100 + i, 42, stretch)
    rows += step_rows(90_000_000, 300, 9, 1)
    rows.append((5, 10, 7, 400, 0, "kh_embedding_fwd_bf16"))
    with tempfile.TemporaryDirectory() as d:
        path = write_rows(os.path.join(d, "t.tsv"), rows)
        out = json.loads(subprocess.run([sys.executable, TOOL, path, "--json"], check=True,
                                        capture_output=True, text=True).stdout)
        table = subprocess.run([sys.executable, TOOL, path], check=True, capture_output=True,
                               text=True).stdout
        empty = write_rows(os.path.join(d, "empty.tsv"), [])
        bad = subprocess.run([sys.executable, TOOL, empty], capture_output=True, text=True)
    assert out["replays"] == 3, out
    assert out["kernels_per_step"] == 3 * len(LAYER) + 2, out
    median = step_rows(30_000_000, 102, 42, 2)
    span_us = (max(r[1] for r in median) - median[0][0]) / 1e3
    assert abs(out["step_us"] - span_us) < 1e-6, (out["step_us"], span_us)
    # The replays start 10 ms apart: the gap is the time from one's end to the next one's start
    # (the median of two: their mean).
    replays = [step_rows(10_000_000 * (i + 1), 100 + i, 42, stretch)
               for i, stretch in enumerate((1, 3, 2))]
    gaps = [b[0][0] - max(r[1] for r in a) for a, b in zip(replays, replays[1:])]
    gap_us = sum(gaps) / 2 / 1e3
    assert abs(out["replay_gap_us"] - gap_us) < 1e-6, (out["replay_gap_us"], gap_us)
    assert "median gap between consecutive replays" in table, table
    assert "kh_argmax_advance_bf16" in table.split("last 3 kernels")[1], table
    kinds = out["by_kind"]
    assert kinds["attention"]["kernels"] == 3 and kinds["attention combine"]["kernels"] == 3, kinds
    assert kinds["GEMM (cuBLASLt)"]["kernels"] == 3 and kinds["GEMM (skinny)"]["kernels"] == 3
    assert kinds["hub kernels"]["kernels"] == 9 and kinds["other"]["kernels"] == 2, kinds
    added = sum(k["added_us"] for k in kinds.values())
    assert abs(added - span_us) < 1e-6, (added, span_us)
    # The combine ran beside the attention but for its last 3 us; the skinny GEMM overlapped the
    # combine's last 4 us of its 8.
    assert abs(kinds["attention combine"]["added_us"] - 3 * 3.0) < 1e-6, kinds
    assert abs(kinds["GEMM (skinny)"]["added_us"] - 3 * 4.0) < 1e-6, kinds
    layer = out["layer"]
    assert [k["name"] for k in layer] == [n for n, _, _ in LAYER[5:]] + \
        [n for n, _, _ in LAYER[:5]], [k["name"] for k in layer]
    assert "| attention | 3 |" in table and "median step" in table, table
    assert bad.returncode != 0 and "no CUDA-graph kernels" in bad.stderr, bad.stderr
    # The runtime's own kernels (a model no package serves) are attention or fallbacks, not other.
    sys.path.insert(0, os.path.dirname(TOOL))
    import kernel_timeline  # noqa: E402
    assert kernel_timeline.kind_of("kh_paged_decode_bf16") == "attention"
    assert kernel_timeline.kind_of("kh_rms_norm_bf16") == "runtime fallbacks"
    assert kernel_timeline.kind_of("norm_fwd_add_rms_bf16_vec_reg") == "hub kernels"
    assert kernel_timeline.kind_of("kh_argmax_advance_bf16") == "other"
    assert kernel_timeline.kind_of("lce_grad_bf16") == "hub kernels"
    assert kernel_timeline.kind_of("ce_train_bf16") == "hub kernels"
    train()
    print("kernel_timeline: ok")


def train_rows(attn_ns, graph_between, attn_grid="1,1,1"):
    """Three training steps' rows outside graphs (with graph_between, a graph replay after each);
    step 2's GEMM is longer than the others' so that only the last step's figures may show."""
    rows, t = [], 1000
    for step in range(3):
        for name, dur in (("norm_fwd_rms_bf16", 1000), ("nvjet_gemm", 4000 if step == 2 else 2000),
                          ("attn_fwd90_bf16_d128", attn_ns), ("lce_grad_bf16", 3000),
                          ("kh_adamw_f32", 500), ("kh_adamw_f32", 500)):
            grid = attn_grid if name.startswith("attn_") else "1,1,1"
            rows.append((t, t + dur, 7, len(rows), 0, name, grid))
            t += dur + 100
        if graph_between:
            rows.append((t, t + 50, 7, len(rows), 5, "kh_skinny_wgmma_n1_s4"))
            t += 150
    return rows


def train():
    """Three training steps outside graphs (a graph replay between them is left out): the last
    one, from after the second run of AdamW launches to the end of the third, is reported."""
    rows = train_rows(attn_ns=6000, graph_between=True)
    # A variant whose attention is 1.5x as long (9000 ns against 6000).
    slow = train_rows(attn_ns=9000, graph_between=False)
    with tempfile.TemporaryDirectory() as d:
        path = write_rows(os.path.join(d, "t.tsv"), rows)
        table = subprocess.run([sys.executable, TOOL, path, "--train"], check=True,
                               capture_output=True, text=True).stdout
        as_json = json.loads(subprocess.run([sys.executable, TOOL, path, "--train", "--json"],
                                            check=True, capture_output=True, text=True).stdout)
        other = write_rows(os.path.join(d, "slow.tsv"), slow)
        compare = subprocess.run([sys.executable, TOOL, path, "--train", "--label", "new",
                                  "--compare", f"old={other}", "--match", "attn_|gemm"],
                                 check=True, capture_output=True, text=True).stdout
        # A variant whose attention runs on another grid (a persistent kernel) still compares.
        regrid = write_rows(os.path.join(d, "regrid.tsv"),
                            train_rows(attn_ns=3000, graph_between=False, attn_grid="132,1,1"))
        compare_grid = subprocess.run([sys.executable, TOOL, path, "--train", "--compare",
                                       f"persistent={regrid}", "--match", "attn_"],
                                      check=True, capture_output=True, text=True).stdout
        no_train = subprocess.run([sys.executable, TOOL, path, "--compare", f"old={other}"],
                                  capture_output=True, text=True)
        no_label = subprocess.run([sys.executable, TOOL, path, "--train", "--compare", other],
                                  capture_output=True, text=True)
        same_label = subprocess.run([sys.executable, TOOL, path, "--train", "--compare",
                                     f"base={other}"], capture_output=True, text=True)
        bad_match = subprocess.run([sys.executable, TOOL, path, "--train", "--compare",
                                    f"old={other}", "--match", "attn_("],
                                   capture_output=True, text=True)
        one = write_rows(os.path.join(d, "one.tsv"), [(0, 10, 7, 1, 0, "kh_adamw_f32")])
        bad = subprocess.run([sys.executable, TOOL, one, "--train"], capture_output=True, text=True)
    assert as_json["kernels"] == 6 and abs(as_json["step_us"] - 15.5) < 1e-6, as_json
    assert as_json["by_launch"][0]["name"] == "attn_fwd90_bf16_d128", as_json["by_launch"]
    assert as_json["by_kind"]["GEMM (cuBLASLt)"]["kernels"] == 1, as_json["by_kind"]
    # The step: 15.5 us against 18.5 (the attention 3 us longer); its launch 6.0 against 9.0 us;
    # only the kernels --match names are listed.
    assert "| step ms | 0.02 | 0.02 | 1.194 |" in compare, compare
    assert "| attn_fwd90_bf16_d128 [1,1,1] us a launch | 6.0 | 9.0 | 1.500 |" in compare, compare
    assert "nvjet_gemm [1,1,1] us a launch | 4.0 | 4.0 | 1.000 |" in compare, compare
    assert "lce_grad" not in compare, compare
    assert "| attn_fwd90_bf16_d128 [1,1,1 / 132,1,1] us a launch | 6.0 | 3.0 | 0.500 |" in \
        compare_grid, compare_grid
    assert no_train.returncode != 0 and "--compare needs --train" in no_train.stderr
    assert no_label.returncode != 0 and "expected LABEL=TSV" in no_label.stderr, no_label.stderr
    assert same_label.returncode != 0 and "label 'base' is taken" in same_label.stderr, \
        same_label.stderr
    assert bad_match.returncode != 0 and "not a regular expression" in bad_match.stderr, \
        bad_match.stderr
    assert "one training step: 6 kernels" in table, table
    assert "| nvjet_gemm | GEMM (cuBLASLt) | 1,1,1 | 1 | 0.00 | 0.00 | 4.0 |" in table, table
    assert "| kh_adamw_f32 | other | 1,1,1 | 2 |" in table, table
    assert "| hub kernels | 2 |" in table and "kh_skinny" not in table, table
    assert bad.returncode != 0 and "fewer than two AdamW updates" in bad.stderr, bad.stderr


if __name__ == "__main__":
    main()
