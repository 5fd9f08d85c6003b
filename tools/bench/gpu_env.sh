# shellcheck shell=bash
# Sourced by the GPU machine's scripts (gpu_run.sh, decode_ab.sh, train_ab.sh) from the repository root, with
# .devlibs/gpu carried (gpu_bundle.sh): the bundle's runtime libraries on LD_LIBRARY_PATH, a
# cache, cuBLASLt and the bundle's data directory. Sets g (the bundle).
g=$(pwd)/.devlibs/gpu
mkdir -p /tmp/kh-dl
# The bundle's runtime libraries travel gzipped (gpu_bundle.sh).
if [ -f "$g/lib.tgz" ]; then mkdir -p /tmp/kh-lib && tar -xzf "$g/lib.tgz" -C /tmp/kh-lib; libs=/tmp/kh-lib/lib
else libs=$g/lib; fi
for f in "$libs"/*; do [ -e "$f" ] || continue; n=$(basename "$f"); ldconfig -p | grep -qF "$n (" || ln -sf "$f" /tmp/kh-dl/"$n"; done
export LD_LIBRARY_PATH=/tmp/kh-dl
export KERNEL_HUB_CACHE=/tmp/kh-cache
# The GEMM service's cuBLASLt: the system's, else the one torch's nvidia-cublas wheel ships.
if ! ldconfig -p | grep -q 'libcublasLt.so.1[23] '; then
  d=$(python3 -c 'import nvidia.cublas, os; print(os.path.join(list(nvidia.cublas.__path__)[0], "lib"))' 2>/dev/null)
  [ -n "$d" ] && [ -d "$d" ] && export KERNEL_HUB_CUBLASLT=$d
fi
# The bundled binaries are away from their build tree: the default hub and its key are in the
# bundle (hub/data_dir.h).
export KERNEL_HUB_DATA_DIR=$g
