#!/usr/bin/env python3
"""Kernelizes a package scaffolded by `kernel-hub init` from the hub it was packed into, through
the C API (libkernel_hub.so, from Python ctypes), and calls its Scale layer on cpu tensors:
forward in eval (y = alpha * x) and backward in train (dx = alpha * dy). Trust and cache come from
the environment (KERNEL_HUB_TRUST_DIR, KERNEL_HUB_CACHE).
Usage: test_init_kernelize.py LIBKERNEL_HUB.so HUB_DIR KERNEL_CONFIG (exit 0 = pass)."""
import ctypes as C
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools",
                                "python", "kernel_hub"))
from kernel_hub_ctypes import (  # noqa: E402
    KH_OK, KH_MODE_EVAL, KH_MODE_TRAIN, KH_DEVICE_CPU, KH_KERNELIZE_EVAL, KH_KERNELIZE_TRAIN,
    OpFn, float_tensor, scale_args, load)



def main():
    lib_path, hub, config_path = sys.argv[1:4]
    lib = load(lib_path)
    rt = lib.kh_runtime_create(0)
    slot = C.c_uint32()
    # No fallback: strict kernelize fails unless the package binds the slot.
    assert lib.kh_runtime_add_slot(rt, b"Scale", OpFn(), OpFn(), OpFn(), 0, C.byref(slot)) == KH_OK
    config = open(config_path, "rb").read()
    report = C.c_void_p()
    status = lib.kh_runtime_kernelize(rt, config, hub.encode(), None,
                                      KH_KERNELIZE_EVAL | KH_KERNELIZE_TRAIN, 1, None,
                                      C.byref(report))
    assert status == KH_OK, lib.kh_last_error().decode()
    text = C.string_at(report.value).decode()
    lib.kh_runtime_free_report(report)
    bindings = json.loads(text)["bindings"]
    for b in bindings:
        print(f"{b['layer']} {b['mode']}: {b['variant']}, {b['trust']}")
    assert sorted((b["layer"], b["mode"]) for b in bindings) == \
        [("Scale", "eval"), ("Scale", "train")], bindings

    x, keep_x = float_tensor([1.0, -2.0, 0.5])
    y, keep_y = float_tensor([0.0, 0.0, 0.0])
    assert lib.kh_runtime_set_mode(rt, KH_MODE_EVAL) == KH_OK
    assert lib.kh_runtime_forward(rt, slot, KH_DEVICE_CPU, scale_args(x, 2.5, y), 3, None) == \
        KH_OK, lib.kh_last_error().decode()
    assert list(keep_y[0]) == [2.5, -5.0, 1.25], list(keep_y[0])

    dy, keep_dy = float_tensor([1.0, 2.0, 4.0])
    dx, keep_dx = float_tensor([0.0, 0.0, 0.0])
    assert lib.kh_runtime_set_mode(rt, KH_MODE_TRAIN) == KH_OK
    assert lib.kh_runtime_backward(rt, slot, KH_DEVICE_CPU, scale_args(dy, 0.5, dx), 3, None) == \
        KH_OK, lib.kh_last_error().decode()
    assert list(keep_dx[0]) == [0.5, 1.0, 2.0], list(keep_dx[0])
    lib.kh_runtime_destroy(rt)
    print("kernelized the scaffold from the hub: Scale forward and backward on cpu OK")


if __name__ == "__main__":
    main()
