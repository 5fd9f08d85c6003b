#!/usr/bin/env bash
# Fleet cold start (issue 17): N `kernel-hub pull` processes started at once against one cache and
# one docker-registry, against one process alone. Reports wall times and the registry's request
# counts from its access log (requests per phase, blob GETs, per-blob download count), so that
# "one download per blob, requests <= blobs + manifests + one tag resolution per process" can be
# checked. A benchmark run by hand, not a test (not in tools/test).
#
#   tools/bench/fleet_pull.sh [N=64] [PACKAGE=norm]
#
# Needs a built tree (BUILD, default build/: the CLI and the default hub's layouts) and
# docker-registry (Debian package docker-registry).
set -euo pipefail

N=${1:-64}
PACKAGE=${2:-norm}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${BUILD:-$ROOT/build}
CLI=$BUILD/kernel-hub
LAYOUT=$BUILD/default-hub/kernel-hub/$PACKAGE
REPO=kernel-hub/$PACKAGE
TAG=v1
REF=$REPO@$TAG

[[ -x $CLI ]] || { echo "no CLI at $CLI: build first (cmake --build build)" >&2; exit 2; }
[[ -f $LAYOUT/index.json ]] || { echo "no layout at $LAYOUT: build the default hub first" >&2; exit 2; }
command -v docker-registry >/dev/null ||
  { echo "docker-registry is not installed (Debian package docker-registry)" >&2; exit 2; }

WORK=$(mktemp -d /tmp/kh-fleet-bench.XXXXXX)
REGISTRY_PID=
cleanup() {
  set +e  # the registry's exit status after kill is not a failure of the benchmark
  [[ -n $REGISTRY_PID ]] && kill "$REGISTRY_PID" 2>/dev/null && wait "$REGISTRY_PID" 2>/dev/null
  # KEEP_LOG=FILE keeps the registry's access log for a closer look.
  [[ -n ${KEEP_LOG:-} ]] && cp "$WORK/access.log" "$KEEP_LOG"
  rm -rf "$WORK"
}
trap cleanup EXIT

# A free loopback port: bind 0 and read back what the kernel chose.
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cat >"$WORK/config.yml" <<EOF
version: 0.1
log:
  level: warn
  accesslog:
    disabled: false
storage:
  filesystem:
    rootdirectory: $WORK/registry
http:
  addr: 127.0.0.1:$PORT
  secret: kernel-hub-bench-secret
EOF
# The access log (one line per request, combined log format) goes to stdout.
env -u REGISTRY_HTTP_ADDR docker-registry serve "$WORK/config.yml" >"$WORK/access.log" 2>&1 &
REGISTRY_PID=$!
for _ in $(seq 50); do
  curl -fs "http://127.0.0.1:$PORT/v2/" >/dev/null 2>&1 && break
  sleep 0.1
done

HUB=(--hub "oci://127.0.0.1:$PORT" --plain-http)
"$CLI" "${HUB[@]}" push "$LAYOUT" "$REF" >/dev/null

# Requests in the access log from line $1 on: total, and by kind.
count_from() {
  tail -n +"$1" "$WORK/access.log" | grep -E '"(GET|HEAD|POST|PUT|PATCH) /v2/' >"$WORK/phase.log" || true
  local total blobs manifests
  total=$(wc -l <"$WORK/phase.log")
  blobs=$(grep -cE '"GET /v2/[^ ]*/blobs/' "$WORK/phase.log" || true)
  manifests=$(grep -cE '"(GET|HEAD) /v2/[^ ]*/manifests/' "$WORK/phase.log" || true)
  # The most times any one blob was downloaded (1 = each blob once).
  local most
  most=$(grep -oE '"GET /v2/[^ ]*/blobs/sha256:[0-9a-f]+' "$WORK/phase.log" | sort | uniq -c |
    sort -rn | awk 'NR==1{print $1}')
  # Tag resolutions (one per process is the target) and requests for anything else made twice.
  local tags repeated
  tags=$(grep -cE "\"(GET|HEAD) /v2/$REPO/manifests/$TAG " "$WORK/phase.log" || true)
  repeated=$(grep -oE '"(GET|HEAD|POST|PUT|PATCH) /v2/[^ ]*' "$WORK/phase.log" |
    grep -vE "/manifests/$TAG\$" | sort | uniq -d | wc -l)
  echo "$total requests ($manifests manifest, $blobs blob GETs; most GETs of one blob: ${most:-0}; $tags tag resolutions; $repeated other requests made more than once)"
}
lines() { wc -l <"$WORK/access.log"; }

now() { date +%s.%N; }
BLOBS=$(find "$LAYOUT/blobs/sha256" -type f | wc -l)

# One process, cold cache.
start=$(($(lines) + 1))
t0=$(now)
KERNEL_HUB_CACHE=$WORK/cache-one "$CLI" "${HUB[@]}" pull "$REF" >/dev/null
t1=$(now)
one_wall=$(echo "$t1 - $t0" | bc -l)
sleep 0.2  # the access log is written after the response
one_requests=$(count_from "$start")

# N processes at once, one cold cache between them.
start=$(($(lines) + 1))
mkdir -p "$WORK/logs"
t0=$(now)
pids=()
for i in $(seq "$N"); do
  KERNEL_HUB_CACHE=$WORK/cache-fleet "$CLI" "${HUB[@]}" pull "$REF" >"$WORK/logs/$i.out" 2>&1 &
  pids+=($!)
done
failed=0
first_failed=
for i in "${!pids[@]}"; do
  if ! wait "${pids[$i]}"; then
    failed=$((failed + 1))
    first_failed=${first_failed:-$((i + 1))}
  fi
done
t1=$(now)
fleet_wall=$(echo "$t1 - $t0" | bc -l)
sleep 0.2
fleet_requests=$(count_from "$start")

# The floor on this machine: the same N processes with nothing to fetch (an offline pull from the
# now warm cache: start, read and verify the cache, check the signature).
t0=$(now)
pids=()
for i in $(seq "$N"); do
  KERNEL_HUB_CACHE=$WORK/cache-fleet "$CLI" "${HUB[@]}" --offline pull "$REF" >/dev/null 2>&1 &
  pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid" || true; done
t1=$(now)
floor_wall=$(echo "$t1 - $t0" | bc -l)

printf 'package %s: %d blobs in the layout (config, layers, manifests, index)\n' "$REF" "$BLOBS"
printf '1 process:   %6.2f s wall; %s\n' "$one_wall" "$one_requests"
printf '%d processes: %6.2f s wall (%.2fx one process), %d failed; %s\n' "$N" "$fleet_wall" \
  "$(echo "$fleet_wall / $one_wall" | bc -l)" "$failed" "$fleet_requests"
printf '%d processes, warm cache, offline (the floor: no requests): %6.2f s wall (%.2fx one process)\n' \
  "$N" "$floor_wall" "$(echo "$floor_wall / $one_wall" | bc -l)"
if ((failed > 0)); then
  echo "process $first_failed failed:" && cat "$WORK/logs/$first_failed.out"
fi
