#!/usr/bin/env bash
# Runs the main part of the README's first quick-start command exactly as written (what follows
# `tools/bootstrap && `, from the repository root, on a fresh cache) and checks its output: every
# demo slot bound from a package in both modes, and the training loss fell.
# Usage: quickstart.sh SOURCE_DIR
set -euo pipefail
src=$1
line=$(awk '/^## Quick start/{q=1} q && /^```sh/{getline; print; exit}' "$src/README.md")
case "$line" in
  "tools/bootstrap && "*) cmd=${line#tools/bootstrap && } ;;
  *) echo "README quick start's first command is '$line', not 'tools/bootstrap && ...'"; exit 1 ;;
esac
cache=$(mktemp -d)
trap 'rm -rf "$cache"' EXIT
echo "running: $cmd"
out=$(cd "$src" && env -u KERNEL_HUB_ENDPOINT -u KERNEL_HUB_OFFLINE -u KERNEL_HUB_DISABLE \
  -u KERNEL_HUB_LOCAL -u KERNEL_HUB_ALLOW_UNSIGNED KERNEL_HUB_CACHE="$cache" bash -c "$cmd" 2>&1) || {
  echo "$out"; echo "FAILED: $cmd"; exit 1; }
echo "$out"
# Every slot from a package; on a GPU the fp32 demo keeps Attention's fallback (the attention
# package's cuda kernels take bf16/fp16), so there only Attention's table rows may say fallback.
if ! grep -Eq 'kernelize: ([0-9]+) of \1 slot bindings from packages' <<<"$out"; then
  grep -Eq '^kernel-hub demo: .* on cuda:[0-9]+$' <<<"$out" &&
    ! sed -n '/^LAYER/,$p' <<<"$out" | grep -Ev '^(Attention | )' | grep -q ' fallback ' ||
    { echo "FAILED: not every slot was bound from a package"; exit 1; }
fi
loss=$(grep -Eo 'train: loss [0-9.]+ -> [0-9.]+' <<<"$out") || { echo "FAILED: no train line"; exit 1; }
awk '{ if (!($5 < $3)) { print "FAILED: the loss did not fall: " $0; exit 1 } }' <<<"$loss"
grep -q '^LAYER' <<<"$out" || { echo "FAILED: no binding table"; exit 1; }
echo "quick start OK: $loss"
