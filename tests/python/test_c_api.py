#!/usr/bin/env python3
"""The C embedding API (libkernel_hub.so) from Python ctypes: create a runtime, add a slot with a
Python fallback, bind the toy package, call its cpu op on a ctypes-built DLTensor, switch modes,
and read errors. Usage: test_c_api.py LIBKERNEL_HUB.so PACKAGES_DIR (exit 0 = pass)."""
import ctypes as C
import os
import sys

KH_OK, KH_ERR_NOT_FOUND, KH_ERR_REFUSED = 0, 4, 8
KH_MODE_EVAL, KH_MODE_TRAIN, KH_DEVICE_CPU = 0, 1, -1
KH_ARG_TENSOR, KH_ARG_INT, KH_ARG_FLOAT = 1, 2, 3
KH_FLAG_HAS_BACKWARD = 1
kDLCPU, kDLFloat = 1, 2


class DLDevice(C.Structure):
    _fields_ = [("device_type", C.c_int), ("device_id", C.c_int32)]


class DLDataType(C.Structure):
    _fields_ = [("code", C.c_uint8), ("bits", C.c_uint8), ("lanes", C.c_uint16)]


class DLTensor(C.Structure):
    _fields_ = [("data", C.c_void_p), ("device", DLDevice), ("ndim", C.c_int32),
                ("dtype", DLDataType), ("shape", C.POINTER(C.c_int64)),
                ("strides", C.POINTER(C.c_int64)), ("byte_offset", C.c_uint64)]


class ArgValue(C.Union):
    _fields_ = [("t", C.POINTER(DLTensor)), ("i", C.c_int64), ("f", C.c_double),
                ("dt", DLDataType)]


class Arg(C.Structure):
    _fields_ = [("kind", C.c_int32), ("v", ArgValue)]


OpFn = C.CFUNCTYPE(C.c_int32, C.POINTER(Arg), C.c_int32, C.c_void_p)


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
    assert C.sizeof(DLTensor) == 48 and C.sizeof(Arg) == 16, "ctypes layout mismatch"
    lib = C.CDLL(lib_path)
    lib.kh_runtime_create.restype = C.c_void_p
    lib.kh_runtime_create.argtypes = [C.c_int32]
    lib.kh_runtime_destroy.argtypes = [C.c_void_p]
    lib.kh_runtime_add_slot.argtypes = [C.c_void_p, C.c_char_p, OpFn, OpFn, OpFn, C.c_uint32,
                                        C.POINTER(C.c_uint32)]
    lib.kh_runtime_find_slot.argtypes = [C.c_void_p, C.c_char_p, C.POINTER(C.c_uint32)]
    lib.kh_runtime_bind.argtypes = [C.c_void_p, C.c_char_p, C.c_char_p, C.c_char_p, C.c_int32,
                                    C.c_int32, C.POINTER(C.c_int32)]
    lib.kh_runtime_set_mode.argtypes = [C.c_void_p, C.c_int32]
    lib.kh_runtime_get_mode.argtypes = [C.c_void_p]
    lib.kh_runtime_set_capturing.argtypes = [C.c_void_p, C.c_int32]
    lib.kh_runtime_forward.argtypes = [C.c_void_p, C.c_uint32, C.c_int32, C.POINTER(Arg),
                                       C.c_int32, C.c_void_p]
    lib.kh_runtime_backward.argtypes = lib.kh_runtime_forward.argtypes
    lib.kh_last_error.restype = C.c_char_p

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
