#!/usr/bin/env python3
"""The C embedding API (libkernel_hub.so) from Python ctypes: create a runtime, add a slot with a
Python fallback, bind the toy package, call its cpu op on a ctypes-built DLTensor, switch modes,
kernelize from a local package, and read errors and their statuses (one per kind of failure,
named as kernel_hub_abi.h names them). Usage: test_c_api.py LIBKERNEL_HUB.so PACKAGES_DIR
(exit 0 = pass)."""
import ctypes as C
import json
import os
import re
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools",
                                "python", "kernel_hub"))
from kernel_hub_ctypes import (  # noqa: E402
    KH_OK, KH_ERR_INVALID_ARGUMENT, KH_ERR_NOT_FOUND, KH_ERR_REFUSED, KH_ERR_IO, KH_MODE_EVAL,
    KH_MODE_TRAIN, KH_DEVICE_CPU, KH_KERNELIZE_EVAL, STATUS_NAMES,
    OpFn, float_tensor, scale_args, load)

ABI_HEADER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "include",
                          "kernel_hub", "kernel_hub_abi.h")



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
    check_statuses(lib)
    check_kernelize(lib, packages)
    print("test_c_api.py: ok")
    return 0


def check_statuses(lib):
    """The statuses kernel_hub_abi.h defines, kernel_hub_ctypes.py's copy of them and
    kh_status_name() agree, and no two kinds of failure share a value."""
    text = open(ABI_HEADER, encoding="utf-8").read()
    defined = {int(v): n for n, v in re.findall(r"^#define (KH_OK|KH_ERR_\w+) (\d+)", text, re.M)}
    assert len(defined) >= 14, defined
    assert defined == STATUS_NAMES, (defined, STATUS_NAMES)
    for value, name in defined.items():
        assert lib.kh_status_name(value).decode() == name, (value, name)
    assert lib.kh_status_name(1000).decode() == "unknown status"


def check_kernelize(lib, packages):
    """kh_runtime_kernelize from a local package directory (KERNEL_HUB_LOCAL: no hub), then
    failures whose status names their kind."""
    with tempfile.TemporaryDirectory(prefix="kh-c-api-") as work:
        os.environ["KERNEL_HUB_CACHE"] = os.path.join(work, "cache")
        os.environ["KERNEL_HUB_LOCAL"] = "test/toy=" + os.path.join(packages, "toy-1.0.0")
        config = json.dumps({"Scale": "test/toy@v1"}).encode()

        def kernelize(config_json, modes=0, want_report=False):
            rt = lib.kh_runtime_create(0)
            slot = C.c_uint32()
            assert lib.kh_runtime_add_slot(rt, b"Scale", OpFn(), OpFn(), OpFn(), 0,
                                           C.byref(slot)) == KH_OK
            report = C.c_void_p()
            status = lib.kh_runtime_kernelize(rt, config_json, None, None, modes, 1, None,
                                              C.byref(report) if want_report else None)
            message = lib.kh_last_error().decode()
            text = None
            if report.value:
                text = C.string_at(report.value).decode()
                lib.kh_runtime_free_report(report)
            return rt, slot, status, message, text

        rt, slot, status, message, report = kernelize(config, KH_KERNELIZE_EVAL, True)
        assert status == KH_OK, message
        bindings = json.loads(report)["bindings"]
        assert [(b["layer"], b["mode"], b["source"]) for b in bindings] == \
            [("Scale", "eval", "local")], bindings
        x, keep_x = float_tensor([1.0, 2.0])
        y, keep_y = float_tensor([0.0, 0.0])
        args = scale_args(x, 3.0, y)
        assert lib.kh_runtime_set_mode(rt, KH_MODE_EVAL) == KH_OK
        assert lib.kh_runtime_forward(rt, slot, KH_DEVICE_CPU, args, 3, None) == KH_OK, \
            lib.kh_last_error()
        assert list(keep_y[0]) == [3.0, 6.0], list(keep_y[0])
        lib.kh_runtime_destroy(rt)

        def expect(status_wanted, config_json, what, modes=0):
            rt, _, status, message, _ = kernelize(config_json, modes)
            lib.kh_runtime_destroy(rt)
            assert status == status_wanted, (what, STATUS_NAMES.get(status), message)
            assert message, what

        expect(KH_ERR_INVALID_ARGUMENT, b"{not json", "malformed config")
        expect(KH_ERR_INVALID_ARGUMENT, config, "unknown mode bits", modes=0x4)
        expect(KH_ERR_NOT_FOUND, json.dumps({"Scale": "test/toy@v1:Other"}).encode(),
               "a layer the package does not have")
        # strict: ScaleInfer has no backward op, so its train bind would keep the fallback.
        expect(KH_ERR_REFUSED, json.dumps({"Scale": "test/toy@v1:ScaleInfer"}).encode(),
               "strict train bind without backward")
        # A cache that cannot be created: a file where its parent directory should be.
        open(os.path.join(work, "file"), "w").close()
        os.environ["KERNEL_HUB_CACHE"] = os.path.join(work, "file", "cache")
        expect(KH_ERR_IO, config, "unusable cache")
        del os.environ["KERNEL_HUB_LOCAL"], os.environ["KERNEL_HUB_CACHE"]


if __name__ == "__main__":
    sys.exit(main())
