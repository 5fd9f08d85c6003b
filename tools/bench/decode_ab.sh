#!/usr/bin/env bash
# Decode variants of the GPU-resident runtime side by side, on the GPU machine from the
# repository root with .devlibs/gpu carried (gpu_bundle.sh): each argument is LABEL=OPTIONS, a
# `kernel-hub demo` run of Qwen3-0.6B (2 training steps of 1 x 2048, then greedy decode of
# 64 x 2048 with the CUDA-graph step) with those extra options; ENV settings go before the
# options as VAR=VALUE words. Prints one row per variant (ms per step, tokens/s, the roofline
# shares), the runs interleaved KH_AB_ROUNDS times (default 2) so drift shows as spread.
# KH_AB_SEQ: the model's sequence and the decode context (default 2048).
#   tools/bench/decode_ab.sh "whole=--decode-overlap off" "halves=--decode-overlap on"
# Another build's packages: HUB=DIR, its default hub and key in a directory of their own
# (default-hub/, default-hub-key/signing.pub; ab_variant.sh):
#   tools/bench/decode_ab.sh "new=" "old=HUB=$PWD/.devlibs/oldhub"
# Another build's runtime (its kernel-hub binary, carried beside the bundle): BIN=PATH.
#   tools/bench/decode_ab.sh "new=" "old=BIN=$PWD/.devlibs/kernel-hub.main"
set -uo pipefail
root=$(pwd); out=${OUT:-/tmp/kh-gpu-out}; mkdir -p "$out"
. "$root/tools/bench/gpu_env.sh"
. "$root/tools/bench/ab_variant.sh"
for v in "$@"; do ab_variant "$v" || exit 2; done  # every variant well-formed before any run
rounds=${KH_AB_ROUNDS:-2}; ctx=${KH_AB_SEQ:-2048}
echo "decode context $ctx"
printf '%-12s %5s %9s %11s %7s %7s %8s %9s %12s\n' variant round ms/step tokens/s %peak %read overlap fused_qkv fused_append
for r in $(seq 1 "$rounds"); do
  for v in "$@"; do
    ab_variant "$v"
    log=/tmp/kh-decode-ab.json
    env "${envs[@]}" "$bin" demo --device cuda:0 --model qwen3-0.6b --seq "$ctx" \
      --decode-context "$ctx" --batch 1 --steps 2 --json "${opts[@]}" >"$log" 2>/tmp/kh-decode-ab.err ||
      { echo "$label: failed"; tail -5 /tmp/kh-decode-ab.err | tee -a "$out/decode_ab.err"; continue; }
    # Every run's JSON, one line each, in one file (the device tool brings back few files).
    { echo "{\"variant\": \"$label\", \"round\": $r, \"context\": $ctx, \"run\":"; cat "$log"; echo "}"; } |
      python3 -c 'import json,sys; print(json.dumps(json.loads(sys.stdin.read())))' >>"$out/decode_ab.jsonl"
    python3 - "$label" "$r" "$log" <<'PY'
import json, sys
label, r, path = sys.argv[1:]
d = json.load(open(path))["device_run"]["decode"]
print(f"{label:<12} {r:>5} {d['ms_per_step']:9.3f} {d['tokens_per_s']:11.0f} "
      f"{100 * d['roofline_fraction']:6.1f}% {100 * d['read_roofline_fraction']:6.1f}% "
      f"{str(d.get('overlapped_halves')):>8} {str(d.get('fused_qkv')):>9} "
      f"{str(d.get('fused_append')):>12}")
PY
  done
done
