#!/usr/bin/env bash
# Runs on the GPU machine from the repository root, with .devlibs/gpu carried (see
# gpu_bundle.sh): GPU tests, the device-load benchmark and the kernel benchmarks against
# PyTorch. Logs go to $OUT (or /tmp/kh-gpu-out). KH_GTEST_FILTER: a --gtest_filter for the test
# binaries (e.g. "-*Activation*" to leave out the 65 s activation sweep when only norm or softmax
# code changed); KH_GPU_TESTS: the test binaries to run (default: all); KH_BENCH_ARGS and
# KH_ATTENTION_BENCH_ARGS: extra options of bench_kernels.py and bench_attention.py;
# KH_SKIP_DEMO, KH_SKIP_ATTENTION_BENCH, KH_SKIP_KERNEL_BENCH: leave those runs out.
set -uo pipefail
root=$(pwd); out=${OUT:-/tmp/kh-gpu-out}; mkdir -p "$out"
. "$root/tools/bench/gpu_env.sh"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,temperature.gpu --format=csv | tee "$out/gpu.txt"
# The test binaries look for packages where gpu_bundle.sh built them ($KH_GPU_BUILD_DIR, default
# build-gpu/, of this checkout, which does not travel): put the bundled ones there.
build=$root/${KH_GPU_BUILD_DIR:-build-gpu}
mkdir -p "$build/tests"
rm -rf "$build/kernels" "$build/tests/packages" "$build/default-hub" "$build/default-hub-key" \
  "$build/kernel-hub"
ln -s "$g/kernels" "$build/kernels"
ln -s "$g/packages" "$build/tests/packages"
# The embedded default hub, its public key (trusted by the build) and the CLI, where the binaries
# look for them.
ln -s "$g/default-hub" "$build/default-hub"
ln -s "$g/default-hub-key" "$build/default-hub-key"
ln -s "$g/bin/kernel-hub" "$build/kernel-hub"
status=0
for t in ${KH_GPU_TESTS:-test_gpu_device_code test_gpu_launch test_kernels_gpu test_kernels_gpu_rotary_softmax \
    test_kernels_gpu_attention test_gpu_gemm test_kernels_gpu_linear_ce test_gpu_device_api test_gpu_demo_device \
    test_gpu_tensor_map test_gpu_demo_decode test_gpu_skinny_gemm test_gpu_device_info}; do
  "$g/bin/$t" --gtest_filter="${KH_GTEST_FILTER:-*}" 2>&1 | tee "$out/$t.log" | grep -E '^\[  (PASSED|FAILED|SKIPPED) |tests ran|rel' | tail -40
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
done
"$g/bin/bench_device_load" 2>&1 | tee "$out/bench_device_load.log" | tail -12
# The demo on the GPU (test and a plain run) and warm kernelize on this machine's CPU.
if [ -x "$g/bin/test_demo" ] && [ -z "${KH_SKIP_DEMO:-}" ]; then
  "$g/bin/test_demo" 2>&1 | tee "$out/test_demo.log" | grep -E '^\[  (PASSED|FAILED|SKIPPED) |tests ran' | tail -10
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
  "$build/kernel-hub" demo --device cuda:0 2>&1 | tee "$out/demo_cuda.log" | tail -14
  "$g/bin/bench_kernelize" 2>&1 | tee "$out/bench_kernelize.log" | tail -6
fi
# The runtime's logits against Transformers' (fp32 reference, bf16 tolerance); exit 77: skipped.
if [ -x "$g/bin/demo_logits" ] && [ -f "$g/test_demo_transformers_gpu.py" ] &&
  [ -z "${KH_SKIP_DEMO:-}" ]; then
  python3 "$g/test_demo_transformers_gpu.py" "$g/bin/demo_logits" "$g/kernels" 2>&1 |
    tee "$out/test_demo_transformers_gpu.log" | tail -20
  rc=${PIPESTATUS[0]}; [ "$rc" -eq 0 ] || [ "$rc" -eq 77 ] || status=1
fi
if [ -f "$g/bench_attention.py" ] && [ -z "${KH_SKIP_ATTENTION_BENCH:-}" ]; then
  (cd "$g" && python3 bench_attention.py --lib "$g/bin/libkernel_hub.so" --packages "$g/kernels" \
    ${KH_ATTENTION_BENCH_ARGS:-}) \
    2>&1 | tee "$out/bench_attention.log" | tail -30
fi
if [ -f "$g/bench_kernels.py" ] && [ -z "${KH_SKIP_KERNEL_BENCH:-}" ]; then
  # KH_BENCH_ARGS: extra options, e.g. "--sweep-src .devlibs/gpu/kernels" for the variant sweep.
  python3 "$g/bench_kernels.py" --lib "$g/bin/libkernel_hub.so" --packages "$g/kernels" \
    ${KH_BENCH_ARGS:-} 2>&1 | tee "$out/bench_kernels.log" | tail -100
fi
exit $status
