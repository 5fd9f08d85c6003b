#!/usr/bin/env python3
"""The C embedding API (libkernel_hub.so) from Python ctypes: create a runtime, add a slot with a
Python fallback, bind the toy package, call its cpu op on a ctypes-built DLTensor, switch modes,
and read errors. Usage: test_c_api.py LIBKERNEL_HUB.so PACKAGES_DIR (exit 0 = pass)."""
import ctypes as C
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "loader",
                                "python"))
from kernel_hub_ctypes import (  # noqa: E402
    KH_OK, KH_ERR_NOT_FOUND, KH_ERR_REFUSED, KH_MODE_EVAL, KH_MODE_TRAIN, KH_DEVICE_CPU,
    KH_ARG_TENSOR, KH_ARG_FLOAT, kDLCPU, kDLFloat, DLDevice, DLDataType, DLTensor, Arg, OpFn,
    load)


def float_tensor(values):
    """A 1-D float32 cpu DLTensor over a ctypes array; returns (tensor, keepalive)."""
    data = (C.c_float * len(values))(*values)
    shape = (C.c_int64 * 1)(len(values))
    t = DLTensor(C.cast(data, C.c_void_p), DLDevice(kDLCPU, 0), 1, DLDataType(kDLFloat, 32, 1),
                 shape, None, 0)
    return t, (data, shape)


def scale_args(x, alpha, y):
    args = (Arg * 3)()
    args[0].kind, args[0].v.t = KH_ARG_TENSOR, C.pointer(x)
    args[1].kind, args[1].v.f = KH_ARG_FLOAT, alpha
    args[2].kind, args[2].v.t = KH_ARG_TENSOR, C.pointer(y)
    return args


def main():
    lib_path, packages = sys.argv[1], sys.argv[2]
    lib = load(lib_path)

    def err():
        return lib.kh_last_error().decode()

    rt = lib.kh_runtime_create(0)
    assert rt, err()

    # A slot whose fallback is a Python function: serves until a package is bound.
    fallback_calls = []

    @OpFn
    def py_fallback(args, nargs, stream):
        fallback_calls.append(nargs)
        return KH_OK

    slot = C.c_uint32()
    assert lib.kh_runtime_add_slot(rt, b"Scale", py_fallback, OpFn(), OpFn(), 0,
                                   C.byref(slot)) == KH_OK, err()
    found = C.c_uint32(99)
    assert lib.kh_runtime_find_slot(rt, b"Scale", C.byref(found)) == KH_OK, err()
    assert found.value == slot.value
    assert lib.kh_runtime_find_slot(rt, b"Nope", C.byref(found)) == KH_ERR_NOT_FOUND
    assert "Nope" in err(), err()

    x, keep_x = float_tensor([1.0, 2.0, 3.0, 4.0])
    y, keep_y = float_tensor([0.0] * 4)
    args = scale_args(x, 2.5, y)
    assert lib.kh_runtime_forward(rt, slot, KH_DEVICE_CPU, args, 3, None) == KH_OK, err()
    assert fallback_calls == [3], fallback_calls

    # Bind the toy package's cpu op for eval and call it on the ctypes DLTensor.
    bound = C.c_int32(-1)
    pkg = os.path.join(packages, "toy-1.0.0").encode()
    assert lib.kh_runtime_bind(rt, b"Scale", pkg, None, KH_MODE_EVAL, KH_DEVICE_CPU,
                               C.byref(bound)) == KH_OK, err()
    assert bound.value == 1
    assert lib.kh_runtime_set_mode(rt, KH_MODE_EVAL) == KH_OK, err()
    assert lib.kh_runtime_forward(rt, slot, KH_DEVICE_CPU, args, 3, None) == KH_OK, err()
    assert list(keep_y[0]) == [2.5, 5.0, 7.5, 10.0], list(keep_y[0])
    assert fallback_calls == [3], "the bound op, not the fallback, ran"

    # Train: ScaleInfer has no backward, so the fallback is kept (bound = 0).
    assert lib.kh_runtime_bind(rt, b"Scale", pkg, b"ScaleInfer", KH_MODE_TRAIN, KH_DEVICE_CPU,
                               C.byref(bound)) == KH_OK, err()
    assert bound.value == 0
    assert lib.kh_runtime_set_mode(rt, KH_MODE_TRAIN) == KH_OK, err()
    assert lib.kh_runtime_get_mode(rt) == KH_MODE_TRAIN
    assert lib.kh_runtime_forward(rt, slot, KH_DEVICE_CPU, args, 3, None) == KH_OK, err()
    assert fallback_calls == [3, 3]
    assert lib.kh_runtime_backward(rt, slot, KH_DEVICE_CPU, args, 3, None) == KH_ERR_NOT_FOUND
    assert "backward" in err(), err()

    # A mode switch during graph capture is refused.
    assert lib.kh_runtime_set_capturing(rt, 1) == KH_OK
    assert lib.kh_runtime_set_mode(rt, KH_MODE_EVAL) == KH_ERR_REFUSED
    assert "capture" in err(), err()
    assert lib.kh_runtime_set_capturing(rt, 0) == KH_OK
    assert lib.kh_runtime_set_mode(rt, KH_MODE_EVAL) == KH_OK, err()

    # Op errors come back through kh_last_error.
    assert lib.kh_runtime_forward(rt, slot, KH_DEVICE_CPU, args, 2, None) != KH_OK
    assert "expected arguments" in err(), err()

    # A package needing libcudart is refused by the preflight, with the rule named.
    cudart = os.path.join(packages, "toy-cudart").encode()
    assert lib.kh_runtime_bind(rt, b"Scale", cudart, None, KH_MODE_EVAL, KH_DEVICE_CPU,
                               None) == KH_ERR_REFUSED
    assert "needed-libraries" in err() and "libcudart.so.13" in err(), err()

    lib.kh_runtime_destroy(rt)
    print("test_c_api.py: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
