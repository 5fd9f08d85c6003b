#!/usr/bin/env bash
# The GPU-resident reference runtime (tools/demo) built as an outside runtime is (issue 15):
# `cmake --install` of the build tree into a temporary prefix, tools/demo copied alone into a
# scratch tree (no hub/, loader/, registry/ beside it, so only public headers resolve), and
# tests/sdk/device_runtime/CMakeLists.txt built against the prefix with find_package(KernelHub);
# its smoke program then runs the tiny model on the cpu (and on a GPU where there is one).
# Usage: device_runtime.sh BUILD_DIR SOURCE_DIR. Reuses BUILD_DIR as built.
set -euo pipefail

build=$(cd "$1" && pwd)
source_dir=$(cd "$2" && pwd)
tmp=$(mktemp -d /tmp/kh-devrt.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
step() { echo "== $*"; }
export HOME=$tmp/home KERNEL_HUB_CACHE=$tmp/cache
mkdir -p "$HOME"

step "install into a temporary prefix"
cmake --install "$build" --prefix "$tmp/prefix" >"$tmp/install.log"
for h in kh_prelude.cuh pdl.cuh mma.cuh wgmma.cuh cluster.cuh; do
  [ -e "$tmp/prefix/include/kernel_hub/$h" ] || fail "the install has no $h"
done

step "tools/demo alone, away from the source tree"
mkdir -p "$tmp/src/tools"
cp -r "$source_dir/tools/demo" "$tmp/src/tools/demo"
if grep -n '#include "\(hub\|loader\|registry\|kernels\)/' "$tmp/src/tools/demo"/*.{h,cpp} |
   grep -v '^[^:]*/report\.\(h\|cpp\):'; then
  fail "the runtime includes the internals above (only report.{h,cpp}, the CLI's, may)"
fi

step "build the runtime against the installed SDK (find_package(KernelHub))"
cmake -S "$source_dir/tests/sdk/device_runtime" -B "$tmp/build" -G Ninja \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$tmp/prefix" -DKH_RUNTIME_SRC="$tmp/src" \
  -DKH_DEMO_CONFIG="$source_dir/manifests/examples/demo-config.json" >"$tmp/configure.log" ||
  { cat "$tmp/configure.log"; fail "configure"; }
cmake --build "$tmp/build" -j2 >"$tmp/build.log" 2>&1 || { tail -50 "$tmp/build.log"; fail "build"; }

step "run it"
LD_LIBRARY_PATH=$tmp/prefix/lib "$tmp/build/device_runtime_smoke" | tee "$tmp/smoke.out" ||
  fail "the runtime built against the SDK failed"
grep -q "tiny prefill loss" "$tmp/smoke.out" || fail "no prefill"
grep -q "RMSNorm .*fallback" "$tmp/smoke.out" || fail "no binding table"
echo "PASS"
