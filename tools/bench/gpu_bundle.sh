#!/usr/bin/env bash
# Prepares what a run on the GPU machine needs (it has CUDA, PyTorch and Ubuntu 24.04 but not
# all of our runtime libraries): a Release build of the GPU tests, benchmarks, the C API and the
# packages, stripped, plus the Debian runtime libraries the GPU machine lacks, all under
# .devlibs/gpu (ignored by git; carry it with the device tool). Then run tools/bench/gpu_run.sh
# there. Usage: tools/bench/gpu_bundle.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
out=.devlibs/gpu
# KH_GPU_BUILD_DIR=build reuses the RelWithDebInfo tree tools/bootstrap made (no second build;
# binaries are stripped below either way).
bdir=${KH_GPU_BUILD_DIR:-build-gpu}
[ "$bdir" != build-gpu ] || cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DKH_FUZZ_SECONDS=1 >/dev/null
cmake --build "$bdir" -j "$(nproc)" --target test_gpu_device_code test_gpu_launch launch_probe_package test_kernels_gpu \
  test_kernels_gpu_rotary_softmax test_kernels_gpu_attention test_gpu_gemm test_kernels_gpu_linear_ce \
  test_gpu_device_api test_gpu_demo_device test_gpu_tensor_map test_gpu_demo_decode \
  test_gpu_skinny_gemm test_gpu_device_info bench_skinny_gemm bench_train_gemms bench_device_load kh_kernel_timeline kernel_hub kernel_packages toy_packages \
  kernel-hub default_hub test_demo bench_kernelize demo_logits \
  | grep -E "error|FAILED" || true
rm -rf "$out" && mkdir -p "$out/bin" "$out/lib"
cp "$bdir"/tests/test_gpu_device_code "$bdir"/tests/test_gpu_launch "$bdir"/tests/test_kernels_gpu \
   "$bdir"/tests/test_kernels_gpu_rotary_softmax "$bdir"/tests/test_kernels_gpu_attention \
   "$bdir"/tests/test_gpu_gemm "$bdir"/tests/test_kernels_gpu_linear_ce \
   "$bdir"/tests/test_gpu_device_api "$bdir"/tests/test_gpu_demo_device "$bdir"/tests/test_gpu_tensor_map "$bdir"/tests/test_gpu_demo_decode \
   "$bdir"/tests/test_gpu_skinny_gemm "$bdir"/tests/test_gpu_device_info "$bdir"/tools/bench/bench_skinny_gemm \
   "$bdir"/tools/bench/bench_train_gemms \
   "$bdir"/tools/bench/bench_device_load "$bdir"/tools/bench/libkh_kernel_timeline.so \
   "$bdir"/libkernel_hub.so "$bdir"/kernel-hub "$bdir"/tests/test_demo \
   "$bdir"/tools/bench/bench_kernelize "$bdir"/tests/demo_logits "$out/bin/"
strip "$out"/bin/*
cp -r "$bdir"/kernels "$out/kernels"
cp -r "$bdir"/tests/packages "$out/packages"
cp -r "$bdir"/default-hub "$out/default-hub"
mkdir -p "$out/default-hub-key" && cp "$bdir"/default-hub-key/signing.pub "$out/default-hub-key/"
find "$out/kernels" "$out/packages" -name 'CMakeFiles' -prune -exec rm -rf {} + 2>/dev/null || true
find "$out/kernels" "$out/packages" \( -name '*.cmake' -o -name 'Makefile' \) -delete
# Runtime libraries missing on the GPU machine (seen there: libarchive and ICU).
tmp=$(mktemp -d)
(cd "$tmp" && apt-get download -qq libarchive13 libicu72 libxml2 >/dev/null)
for deb in "$tmp"/*.deb; do dpkg -x "$deb" "$tmp/x"; done
cp -a "$tmp"/x/usr/lib/x86_64-linux-gnu/lib{archive.so.13*,icuuc.so.72*,icudata.so.72*,xml2.so.2*} \
  "$out/lib/"
rm -rf "$tmp"
# CUPTI, for the kernel timeline's injection library (the GPU machine's toolkit may lack it).
cp -aL "$(ldd "$out/bin/libkh_kernel_timeline.so" | awk '/libcupti/ {print $3}')" "$out/lib/"
# ICU's data is most of them (31 MB): gzipped, the bundle stays under the device tool's 64 MiB
# carry limit; gpu_run.sh unpacks it there.
tar -czf "$out/lib.tgz" -C "$out" lib && rm -rf "${out:?}/lib"
cp tools/bench/gpu_run.sh tools/bench/bench_kernels.py tools/bench/bench_attention.py \
   tools/bench/kernel_timeline.py tools/python/kernel_hub/kernel_hub_ctypes.py \
   tests/python/test_demo_transformers_gpu.py "$out/"
du -sh "$out"
