#!/usr/bin/env bash
# `kernel-hub init` end to end, as a kernel author runs it against the SDK, outside the source
# tree: scaffold a package, configure and build it with find_package(KernelHub), check it, sign
# and pack it into a layout hub, trust the key, resolve a KernelConfig against that hub, pull what
# it resolved (signature and digests verified), and kernelize it through libkernel_hub.so and
# call its op (test_init_kernelize.py).
# Usage: test_init.sh --install BUILD_DIR
#          installs BUILD_DIR into a temporary prefix, moves the prefix (nothing installed may
#          depend on where it was installed) and uses the moved prefix's CLI, CMake package and
#          libkernel_hub.so
#        test_init.sh KERNEL_HUB_CLI SDK_PREFIX LIBKERNEL_HUB
#          SDK_PREFIX is what the scaffold gets as CMAKE_PREFIX_PATH (lib/cmake/KernelHub/ inside)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ "$1" = --install ]; then
  echo "--- cmake --install $2, then move the prefix"
  cmake --install "$2" --prefix "$work/installed" >/dev/null
  mv "$work/installed" "$work/moved"
  prefix=$work/moved cli=$work/moved/bin/kernel-hub
  libkernel_hub=$(find "$prefix" -name libkernel_hub.so -print -quit)
  [ -n "$libkernel_hub" ] || { echo "FAILED: the install has no libkernel_hub.so"; exit 1; }
else
  cli=$1 prefix=$2 libkernel_hub=$3
fi
# A fresh cache and trust store; no ambient hub settings.
unset KERNEL_HUB_ENDPOINT KERNEL_HUB_OFFLINE KERNEL_HUB_DISABLE KERNEL_HUB_LOCAL \
      KERNEL_HUB_ALLOW_UNSIGNED
export KERNEL_HUB_CACHE=$work/cache KERNEL_HUB_TRUST_DIR=$work/trust
step() { echo "--- $*"; }

step init
"$cli" init "$work/scale" --name acme/scale
for f in CMakeLists.txt kernel.json.in host.cpp scale.cu kernel-config.json README.md .gitignore; do
  [ -f "$work/scale/$f" ] || { echo "FAILED: init wrote no $f"; exit 1; }
done

step configure and build against "$prefix"
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S "$work/scale" -B "$work/scale/build" "${generator[@]}" -DCMAKE_PREFIX_PATH="$prefix"
cmake --build "$work/scale/build"
pkg=$work/scale/build/package
for f in libscale.so scale.cu kernel.json; do
  [ -f "$pkg/$f" ] || { echo "FAILED: the build left no $f in $pkg"; exit 1; }
done
grep -q '"Scale": {' "$pkg/kernel.json" || { echo "FAILED: kernel.json has no Scale layer"; exit 1; }

step check
"$cli" check "$pkg"

step keygen, pack --sign, trust add
"$cli" keygen -o "$work/publisher.key"
"$cli" pack "$pkg" --repo acme/scale -o "$work/hub" --sign "$work/publisher.key"
"$cli" trust add "$work/publisher.key.pub" --for 'acme/*'

step resolve and pull from the packed hub
out=$("$cli" --hub "$work/hub" resolve --config "$work/scale/kernel-config.json")
echo "$out"
grep -q 'acme/scale@v1' <<<"$out" || { echo "FAILED: Scale did not resolve to acme/scale@v1"; exit 1; }
"$cli" --hub "$work/hub" pull --config "$work/scale/kernel-config.json"

step kernelize through libkernel_hub.so and call Scale
python3 "$here/test_init_kernelize.py" "$libkernel_hub" "$work/hub" "$work/scale/kernel-config.json"
echo "init scaffold OK: built, checked, packed, signed, resolved, pulled and kernelized"
