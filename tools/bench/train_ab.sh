#!/usr/bin/env bash
# Training variants of the GPU-resident runtime side by side, on the GPU machine from the
# repository root with .devlibs/gpu carried (gpu_bundle.sh): each argument is LABEL=WORDS, a
# `kernel-hub demo` run of Qwen3-0.6B (KH_AB_STEPS training steps of 8 x 2048, default 5; a
# prefill; a short decode) with WORDS' options, VAR=VALUE settings, BIN=PATH (another kernel-hub)
# or HUB=DIR (another build's packages; ab_variant.sh). The runs are interleaved KH_AB_ROUNDS
# times (default 2) so that drift shows as spread; one row a run: training and prefill tokens/s
# and peak memory. Then, unless KH_AB_TIMELINE=0, one kernel timeline a variant (3 steps under
# libkh_kernel_timeline.so) and the steps side by side (kernel_timeline.py --compare; the first
# variant is the baseline), the kernels listed those matching KH_AB_KERNELS (a regular
# expression; default: the 15 that added the most). Every run's JSON goes to $OUT/train_ab.jsonl.
#   tools/bench/train_ab.sh "main=HUB=$PWD/.devlibs/mainhub" "new="
#   KH_AB_KERNELS='attn_' tools/bench/train_ab.sh "base=" "nofuse=--some-option"
set -uo pipefail
root=$(pwd); out=${OUT:-/tmp/kh-gpu-out}; mkdir -p "$out"
. "$root/tools/bench/gpu_env.sh"
. "$root/tools/bench/ab_variant.sh"
[ $# -ge 1 ] || { echo "usage: $0 LABEL=WORDS..." >&2; exit 2; }
for v in "$@"; do ab_variant "$v" || exit 2; done
rounds=${KH_AB_ROUNDS:-2}; steps=${KH_AB_STEPS:-5}
run_demo() {  # the variant set by ab_variant, with `extra` settings; the arguments go first
  env "${envs[@]}" "${extra[@]}" "$bin" demo --device cuda:0 --model qwen3-0.6b --batch 8 \
    --seq 2048 --decode-batch 1 --decode-context 64 --json "$@" "${opts[@]}"
}
printf '%-12s %5s %15s %17s %9s %13s\n' variant round 'train tokens/s' 'prefill tokens/s' 'peak GiB' 'reserved GiB'
for r in $(seq 1 "$rounds"); do
  for v in "$@"; do
    ab_variant "$v"
    log=/tmp/kh-train-ab.json
    extra=()
    run_demo --steps "$steps" >"$log" 2>/tmp/kh-train-ab.err ||
      { echo "$label: failed"; tail -5 /tmp/kh-train-ab.err | tee -a "$out/train_ab.err"; continue; }
    { echo "{\"variant\": \"$label\", \"round\": $r, \"run\":"; cat "$log"; echo "}"; } |
      python3 -c 'import json,sys; print(json.dumps(json.loads(sys.stdin.read())))' >>"$out/train_ab.jsonl"
    python3 - "$label" "$r" "$log" <<'PY'
import json, sys
label, r, path = sys.argv[1:]
d = json.load(open(path))["device_run"]
print(f"{label:<12} {r:>5} {d['train_tokens_per_s']:15,.0f} {d['prefill_tokens_per_s']:17,.0f} "
      f"{d['peak_bytes'] / 2**30:9.3f} {d.get('reserved_bytes', 0) / 2**30:13.3f}")
PY
  done
done
[ "${KH_AB_TIMELINE:-1}" = 0 ] && exit 0
tsvs=()
for v in "$@"; do
  ab_variant "$v"
  tsv=/tmp/kh-train-ab-$label.tsv; rm -f "$tsv"
  extra=("CUDA_INJECTION64_PATH=$g/bin/libkh_kernel_timeline.so" "KH_TIMELINE_OUT=$tsv")
  run_demo --steps 3 >/dev/null 2>/tmp/kh-train-ab.err ||
    { echo "$label: timeline run failed"; tail -5 /tmp/kh-train-ab.err; exit 1; }
  tsvs+=("$label=$tsv")
done
first=${tsvs[0]}
python3 "$g/kernel_timeline.py" "${first#*=}" --train --label "${first%%=*}" \
  ${KH_AB_KERNELS:+--match "$KH_AB_KERNELS"} --compare "${tsvs[@]:1}" | tee "$out/train_ab_timeline.md"
