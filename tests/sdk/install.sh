#!/usr/bin/env bash
# The installed SDK, as a user outside this repository meets it (issue 13):
#   1. `cmake --install` of the build tree into a temporary prefix; nothing installed holds a path
#      of the build or source tree; libkernel_hub.so's SONAME and its exported symbols
#      (exactly tests/sdk/exported_symbols.txt).
#   2. The prefix is MOVED and made read-only; from outside the source tree:
#      a C consumer built with pkg-config, a C++ consumer with find_package(KernelHub) (each
#      kernelizes from the default hub found relative to the moved prefix, on a fresh cache, and
#      calls an op), a host library built with KernelHub::package and checked with the installed
#      `kernel-hub check`, the installed `kernel-hub demo`, the man page and bash completion.
#   3. A copy of the binary away from any prefix says it has no default hub (no empty hub).
#   4. The .deb (cpack -G DEB): Depends lists the libraries loaded at run time, and this machine
#      satisfies every entry; installed with dpkg into a scratch root, its kernel-hub runs the
#      demo.
# Usage: install.sh BUILD_DIR SOURCE_DIR. Reuses BUILD_DIR as built: builds only the consumers.
set -euo pipefail

build=$(cd "$1" && pwd)
source_dir=$(cd "$2" && pwd)
tmp=$(mktemp -d /tmp/kh-sdk.XXXXXX)
cleanup() { chmod -R u+w "$tmp" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
step() { echo "== $*"; }

# Nothing from this session's hub or cache settings; a home of its own.
unset KERNEL_HUB_ENDPOINT KERNEL_HUB_OFFLINE KERNEL_HUB_DATA_DIR KERNEL_HUB_LOCAL \
      KERNEL_HUB_DISABLE KERNEL_HUB_TRUST_DIR KERNEL_HUB_ALLOW_UNSIGNED
export HOME=$tmp/home XDG_CACHE_HOME= XDG_CONFIG_HOME=
mkdir -p "$HOME"

step "install into a temporary prefix"
cmake --install "$build" --prefix "$tmp/prefix" --strip >"$tmp/install.log"
for f in bin/kernel-hub lib/libkernel_hub.so lib/libkernel_hub.so.0 include/kernel_hub/kernel_hub.h \
         include/kernel_hub/kernel_hub.hpp include/kernel_hub/kernel_hub_base.hpp \
         include/kernel_hub/kernel_hub_abi.h include/kernel_hub/dlpack/dlpack.h \
         lib/cmake/KernelHub/KernelHubConfig.cmake lib/cmake/KernelHub/KernelHubConfigVersion.cmake \
         lib/cmake/KernelHub/host_library.map lib/pkgconfig/kernel_hub.pc \
         share/kernel-hub/default-hub-key/signing.pub share/man/man1/kernel-hub.1 \
         share/bash-completion/completions/kernel-hub share/zsh/site-functions/_kernel-hub; do
  [ -e "$tmp/prefix/$f" ] || fail "the install has no $f"
done
[ -d "$tmp/prefix/share/kernel-hub/default-hub/kernel-hub/norm" ] || fail "no default hub installed"
[ ! -e "$tmp/prefix/share/kernel-hub/default-hub-key/signing.pem" ] ||
  fail "the default hub's PRIVATE key was installed"

step "no build-tree or source-tree path in anything installed"
for dir in "$build" "$source_dir"; do
  if grep -rlF "$dir" "$tmp/prefix"; then fail "the files above contain $dir"; fi
done

step "libkernel_hub.so: SONAME and exactly the public symbols"
soname=$(readelf -d "$tmp/prefix/lib/libkernel_hub.so" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')
[ "$soname" = libkernel_hub.so.0 ] || fail "SONAME is '$soname', expected libkernel_hub.so.0"
[ "$(readlink "$tmp/prefix/lib/libkernel_hub.so.0")" = libkernel_hub.so.0.4.0 ] ||
  fail "libkernel_hub.so.0 does not point at libkernel_hub.so.0.4.0"
nm -D --defined-only "$tmp/prefix/lib/libkernel_hub.so" | c++filt |
  sed -E 's/^[0-9a-f]+ [A-Za-z] //' | sort -u >"$tmp/symbols.txt"
grep -v '^#' "$source_dir/tests/sdk/exported_symbols.txt" | sort -u >"$tmp/expected.txt"
diff -u "$tmp/expected.txt" "$tmp/symbols.txt" ||
  fail "libkernel_hub.so exports other symbols than tests/sdk/exported_symbols.txt (- missing, + extra); see registry/embed/kernel_hub.map"

step "move the prefix and make it read-only"
mv "$tmp/prefix" "$tmp/moved"
prefix=$tmp/moved
chmod -R a-w "$prefix"
mkdir -p "$tmp/work"
cd "$tmp/work"

step "C consumer via pkg-config"
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
[ "$(pkg-config --modversion kernel_hub)" = 0.4.0 ] || fail "pkg-config --modversion kernel_hub"
# shellcheck disable=SC2046
cc -std=c99 -Wall -Wextra -Werror -o embed_c "$source_dir/tools/examples/embed_minimal.c" \
   $(pkg-config --cflags --libs kernel_hub) -lm
KERNEL_HUB_CACHE=$tmp/cache-c LD_LIBRARY_PATH=$prefix/lib ./embed_c >embed_c.out ||
  { cat embed_c.out; fail "the C consumer failed"; }
grep -q "kernel-hub/activation" embed_c.out || fail "the C consumer did not bind kernel-hub/activation"
grep -q "kernel-hub 0.4.0 (built against 0.4.0)" embed_c.out || fail "kh_version()"

step "C++ consumer via find_package(KernelHub)"
cmake -S "$source_dir/tools/examples/sdk" -B cxx -G Ninja -DCMAKE_PREFIX_PATH="$prefix" \
      -DCMAKE_BUILD_TYPE=Release >cxx.log || { cat cxx.log; fail "configuring the CMake consumer"; }
cmake --build cxx >>cxx.log || { cat cxx.log; fail "building the CMake consumer"; }
KERNEL_HUB_CACHE=$tmp/cache-cxx ./cxx/embed_minimal_cpp >embed_cpp.out ||
  { cat embed_cpp.out; fail "the C++ consumer failed"; }
grep -q "kernel-hub/norm" embed_cpp.out || fail "the C++ consumer did not bind kernel-hub/norm"
grep -q "matches the runtime's own code" embed_cpp.out || fail "the C++ consumer's op"
KERNEL_HUB_CACHE=$tmp/cache-cxx2 ./cxx/embed_minimal_c >/dev/null || fail "the CMake C consumer"

step "a host library built with KernelHub::package passes the installed kernel-hub check"
cmake -S "$source_dir/tests/sdk/package" -B package -G Ninja -DCMAKE_PREFIX_PATH="$prefix" \
      -DKH_SOURCE_DIR="$source_dir" >package.log || { cat package.log; fail "configuring the package"; }
cmake --build package >>package.log || { cat package.log; fail "building the package"; }
"$prefix/bin/kernel-hub" check package/libexample.so >check.out ||
  { cat check.out; fail "kernel-hub check of the package"; }

step "the moved kernel-hub: --version and the demo from the default hub"
[ "$("$prefix/bin/kernel-hub" --version)" = "kernel-hub 0.4.0" ] || fail "kernel-hub --version"
KERNEL_HUB_CACHE=$tmp/cache-demo "$prefix/bin/kernel-hub" demo --device cpu --steps 5 >demo.out ||
  { cat demo.out; fail "kernel-hub demo from the moved prefix"; }
grep -q "kernel-hub/norm" demo.out || { cat demo.out; fail "the demo bound no kernel-hub/norm"; }

step "man page and bash completion"
grep -qF '.SS "kernel\-hub demo"' "$prefix/share/man/man1/kernel-hub.1" ||
  fail "the man page lacks the demo command"
if command -v man >/dev/null; then
  man -l "$prefix/share/man/man1/kernel-hub.1" 2>/dev/null | grep -q "kernel-hub demo" ||
    fail "the man page does not render"
fi
completion=$(bash -c 'source "$1"; COMP_WORDS=(kernel-hub pu); COMP_CWORD=1; _kernel_hub;
                      echo "${COMPREPLY[*]}"; COMP_WORDS=(kernel-hub --hub x gc --ma); COMP_CWORD=4;
                      _kernel_hub; echo "${COMPREPLY[*]}"' _ "$prefix/share/bash-completion/completions/kernel-hub")
[ "$completion" = $'pull push\n--max-size' ] || fail "bash completion gave '$completion'"

step "a copy of the binary away from any prefix says it has no default hub"
cp "$prefix/bin/kernel-hub" "$tmp/lonely-kernel-hub"
if KERNEL_HUB_CACHE=$tmp/cache-lonely "$tmp/lonely-kernel-hub" pull kernel-hub/norm@v1 \
     >lonely.out 2>&1; then
  fail "a binary with no default hub pulled something"
fi
grep -q "data directory" lonely.out || { cat lonely.out; fail "no message about the missing default hub"; }
KERNEL_HUB_DATA_DIR=$prefix/share/kernel-hub KERNEL_HUB_CACHE=$tmp/cache-lonely \
  "$tmp/lonely-kernel-hub" pull kernel-hub/norm@v1 >/dev/null || fail "KERNEL_HUB_DATA_DIR"

step "the .deb"
cpack -G DEB --config "$build/CPackConfig.cmake" -B "$tmp/deb" >cpack.log 2>&1 ||
  { cat cpack.log; fail "cpack -G DEB"; }
deb=$(ls "$tmp"/deb/kernel-hub_*.deb)
depends=$(dpkg-deb -f "$deb" Depends)
echo "Depends: $depends"
# Linked (dpkg-shlibdeps) and loaded with dlopen (tools/cmake/deb.cmake).
for package in libc6 libstdc++6 libssl3 libfmt libcurl4 libarchive13 libzstd1; do
  [[ ", $depends" == *", $package"* ]] || fail "the .deb's Depends lacks $package"
done
# Every dependency is installed on this machine, in a version that satisfies it: installing the
# .deb on a clean machine of this kind pulls exactly these.
IFS=',' read -ra items <<<"$depends"
for item in "${items[@]}"; do
  read -r name op version <<<"$(sed -E 's/^ *([^ (]+) *(\(([<>=]+) *([^)]+)\))?.*/\1 \3 \4/' <<<"$item")"
  installed=$(dpkg-query -W -f '${Version}' "$name" 2>/dev/null) ||
    fail "the .deb depends on $name, which no package of this machine provides"
  if [ -n "$op" ]; then
    dpkg --compare-versions "$installed" "$op" "$version" ||
      fail "the .deb depends on $name ($op $version); this machine has $installed"
  fi
done
# Installed with dpkg into a scratch root (unprivileged: fakeroot, maintainer scripts run
# outside a chroot; the scratch root has none of the dependencies, hence --force-depends), else
# unpacked with dpkg-deb.
mkdir -p "$tmp/root/var/lib/dpkg/updates" "$tmp/root/var/lib/dpkg/info"
touch "$tmp/root/var/lib/dpkg/status"
if command -v fakeroot >/dev/null; then
  fakeroot dpkg --force-not-root --force-script-chrootless --force-depends --root="$tmp/root" \
    --admindir="$tmp/root/var/lib/dpkg" -i "$deb" >dpkg.log 2>&1 || { cat dpkg.log; fail "dpkg -i"; }
  dpkg-query --admindir="$tmp/root/var/lib/dpkg" -W -f '${Status}' kernel-hub |
    grep -q "install ok installed" || fail "dpkg did not record kernel-hub as installed"
else
  echo "(no fakeroot: unpacking with dpkg-deb -x)"
  dpkg-deb -x "$deb" "$tmp/root"
fi
[ -x "$tmp/root/usr/bin/kernel-hub" ] && [ -d "$tmp/root/usr/share/kernel-hub/default-hub" ] ||
  fail "the .deb lacks /usr/bin/kernel-hub or /usr/share/kernel-hub/default-hub"
KERNEL_HUB_CACHE=$tmp/cache-deb "$tmp/root/usr/bin/kernel-hub" demo --device cpu --steps 5 \
  >deb-demo.out || { cat deb-demo.out; fail "the demo from the .deb"; }
grep -q "kernel-hub/norm" deb-demo.out || fail "the .deb's demo bound no kernel-hub/norm"
echo "sdk.install: ok"
