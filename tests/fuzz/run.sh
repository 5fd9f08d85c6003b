#!/usr/bin/env bash
# Builds the fuzz targets with clang (once; concurrent callers wait on a lock), runs the
# regression inputs of TARGET, then fuzzes it for SECONDS from its seed corpus.
# Usage: run.sh BUILD_DIR TARGET SECONDS     (exit 77 = skipped: no clang/libFuzzer)
set -euo pipefail
build=$1 target=$2 seconds=$3
src=$(cd "$(dirname "$0")" && pwd)
command -v clang++ >/dev/null || { echo "clang++ not installed: skipping"; exit 77; }
mkdir -p "$build"
(
  flock 9
  log="$build/build.log"
  if [ ! -f "$build/CMakeCache.txt" ]; then
    cmake -S "$src" -B "$build" -G Ninja -DCMAKE_CXX_COMPILER=clang++ >"$log" 2>&1 ||
      { cat "$log"; exit 1; }
  fi
  cmake --build "$build" >"$log" 2>&1 || { cat "$log"; exit 1; }
) 9>"$build/.lock"
bin="$build/fuzz_$target"
if [ -d "$src/regressions/$target" ] && [ -n "$(ls -A "$src/regressions/$target")" ]; then
  "$bin" "$src/regressions/$target"/*
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r "$src/corpus/$target/." "$work/" 2>/dev/null || true
cd "$work"
"$bin" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
  -artifact_prefix="$build/crash-$target-" "$work"
