"""A kernel-hub runtime (kh_runtime_t) from Python: its layer slots, kernelize, the mode switch
and op calls on torch tensors, passed as DLPack views (torch.utils.dlpack.to_dlpack: no copy).

The slots have no fallback op: a layer the config does not serve is left to PyTorch by the
caller (bridge.py reads the report to know which layers are bound in which mode).

Runtimes are never destroyed: a compiled graph or a CUDA graph may still call through one by id,
and the packages stay loaded anyway (kernel_hub.h)."""
import ctypes as C
import json
import threading

from . import kernel_hub_ctypes as capi
from ._native import check, lib

_PyCapsule_GetPointer = C.pythonapi.PyCapsule_GetPointer
_PyCapsule_GetPointer.restype = C.c_void_p
_PyCapsule_GetPointer.argtypes = [C.py_object, C.c_char_p]

MODES = {"eval": capi.KH_MODE_EVAL, "train": capi.KH_MODE_TRAIN}

# Runtimes by id: the custom ops take the id (an int the compiler can keep in a graph), not the
# object.
_runtimes = {}
_runtimes_lock = threading.Lock()


def get(runtime_id):
    return _runtimes[runtime_id]


class Runtime:
    """One layer table: slots by name, one published mode (eval or train)."""

    def __init__(self, slots, strict=False):
        self.handle = C.c_void_p(lib().kh_runtime_create(1 if strict else 0))
        if not self.handle:
            check(capi.KH_ERR_INTERNAL)
        self.slots = {}
        for name in slots:
            index = C.c_uint32()
            check(lib().kh_runtime_add_slot(self.handle, name.encode(), capi.OpFn(), capi.OpFn(),
                                            capi.OpFn(), 0, C.byref(index)))
            self.slots[name] = index.value
        # Which layers a package serves, per mode ("eval"/"train"), from the kernelize report.
        self.bound = {"eval": {}, "train": {}}
        self.report = None
        self.mode = "eval"
        check(lib().kh_runtime_set_mode(self.handle, capi.KH_MODE_EVAL))
        with _runtimes_lock:
            self.id = len(_runtimes)
            _runtimes[self.id] = self

    def kernelize(self, config, hub=None, device="cpu", modes=("eval", "train"), strict=False,
                  lock=None):
        """kh_runtime_kernelize: resolves, fetches, verifies and binds every slot the config
        serves. `config` is a dict (dumped to JSON as is) or JSON text. Returns the report."""
        text = config if isinstance(config, str) else json.dumps(config)
        mask = 0
        for m in modes:
            mask |= {"eval": capi.KH_KERNELIZE_EVAL, "train": capi.KH_KERNELIZE_TRAIN}[m]
        report = C.c_void_p()
        status = lib().kh_runtime_kernelize(
            self.handle, text.encode(), hub.encode() if hub else None,
            device.encode() if device else None, mask, 1 if strict else 0,
            str(lock).encode() if lock else None, C.byref(report))
        try:
            check(status)
            self.report = json.loads(C.string_at(report.value).decode()) if report.value else {}
        finally:
            lib().kh_runtime_free_report(report)
        for b in self.report.get("bindings", []):
            if b.get("source") != "fallback":
                self.bound[b["mode"]][b["layer"]] = b.get("kernel", b.get("package", "?"))
        return self.report

    def is_bound(self, layer, mode=None):
        return layer in self.bound[mode or self.mode]

    def set_mode(self, mode):
        """Publishes the eval or the train table (one atomic store in the runtime)."""
        check(lib().kh_runtime_set_mode(self.handle, MODES[mode]))
        self.mode = mode

    def native_mode(self):
        """The mode the C runtime has published (kh_runtime_get_mode)."""
        m = lib().kh_runtime_get_mode(self.handle)
        return {v: k for k, v in MODES.items()}[m]

    def set_capturing(self, capturing):
        check(lib().kh_runtime_set_capturing(self.handle, 1 if capturing else 0))

    def call(self, layer, args, backward=False):
        """Calls the layer's bound op (forward, forward_train in train mode, or backward) with
        `args` in schema order: torch tensors (DLPack views), None (an absent Tensor?), int or
        float. CUDA tensors run on the current stream of their device."""
        n = len(args)
        arr = (capi.Arg * n)()
        keep = []
        device, stream = capi.KH_DEVICE_CPU, None
        for i, a in enumerate(args):
            if a is None:
                arr[i].kind = capi.KH_ARG_TENSOR
                arr[i].v.t = C.POINTER(capi.DLTensor)()
            elif isinstance(a, bool) or isinstance(a, int):
                arr[i].kind, arr[i].v.i = capi.KH_ARG_INT, int(a)
            elif isinstance(a, float):
                arr[i].kind, arr[i].v.f = capi.KH_ARG_FLOAT, a
            else:
                capsule = _to_dlpack(a)
                keep.append(capsule)
                # DLManagedTensor starts with its DLTensor.
                ptr = _PyCapsule_GetPointer(capsule, b"dltensor")
                arr[i].kind = capi.KH_ARG_TENSOR
                arr[i].v.t = C.cast(ptr, C.POINTER(capi.DLTensor))
                if a.device.type == "cuda" and device == capi.KH_DEVICE_CPU:
                    import torch
                    device = a.device.index if a.device.index is not None else 0
                    stream = C.c_void_p(torch.cuda.current_stream(device).cuda_stream)
        fn = lib().kh_runtime_backward if backward else lib().kh_runtime_forward
        check(fn(self.handle, self.slots[layer], device, arr, n, stream))
        del keep



def _to_dlpack(t):
    from torch.utils.dlpack import to_dlpack
    return to_dlpack(t.detach())
