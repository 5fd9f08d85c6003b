"""ctypes declarations of kernel-hub's C API (include/kernel_hub/kernel_hub.h and
include/kernel_hub/kernel_hub_abi.h) and DLPack's DLTensor, for Python callers: tests,
benchmarks, scripts. No dependencies.

    import kernel_hub_ctypes as kh
    lib = kh.load("build/libkernel_hub.so")
    rt = lib.kh_runtime_create(0)
"""
import ctypes as C

# Statuses (kernel_hub_abi.h): KH_OK and one KH_ERR_* per kind of failure.
KH_OK = 0
KH_ERR_INVALID_ARGUMENT = 1
KH_ERR_UNSUPPORTED = 2
KH_ERR_NO_DEVICE = 3
KH_ERR_NOT_FOUND = 4
KH_ERR_LAUNCH = 5
KH_ERR_ABI = 6
KH_ERR_INTERNAL = 7
KH_ERR_REFUSED = 8
KH_ERR_NETWORK = 9
KH_ERR_AUTH = 10
KH_ERR_INTEGRITY = 11
KH_ERR_OFFLINE = 12
KH_ERR_IO = 13
# value -> name, as kh_status_name() answers.
STATUS_NAMES = {v: k for k, v in dict(globals()).items()
                if k == "KH_OK" or k.startswith("KH_ERR_")}

KH_MODE_EVAL, KH_MODE_TRAIN, KH_DEVICE_CPU = 0, 1, -1
KH_KERNELIZE_EVAL, KH_KERNELIZE_TRAIN = 0x1, 0x2
KH_ARG_TENSOR, KH_ARG_INT, KH_ARG_FLOAT = 1, 2, 3
KH_FLAG_HAS_BACKWARD = 1
kDLCPU, kDLCUDA = 1, 2
kDLInt, kDLUInt, kDLFloat, kDLBfloat = 0, 1, 2, 4


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
    """kh_arg_t: a tensor, an integer, a float or a dtype."""
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
    """The arguments of the toy and scaffolded Scale ops: (Tensor x, float alpha, Tensor(a!) y)."""
    args = (Arg * 3)()
    args[0].kind, args[0].v.t = KH_ARG_TENSOR, C.pointer(x)
    args[1].kind, args[1].v.f = KH_ARG_FLOAT, alpha
    args[2].kind, args[2].v.t = KH_ARG_TENSOR, C.pointer(y)
    return args


def load(path):
    """Opens libkernel_hub.so and declares the C API's signatures."""
    assert C.sizeof(DLTensor) == 48 and C.sizeof(Arg) == 16, "ctypes layout mismatch"
    lib = C.CDLL(path)
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
    lib.kh_runtime_kernelize.argtypes = [C.c_void_p, C.c_char_p, C.c_char_p, C.c_char_p,
                                         C.c_uint32, C.c_int32, C.c_char_p,
                                         C.POINTER(C.c_void_p)]
    lib.kh_runtime_free_report.argtypes = [C.c_void_p]
    lib.kh_last_error.restype = C.c_char_p
    lib.kh_status_name.restype = C.c_char_p
    lib.kh_status_name.argtypes = [C.c_int32]
    return lib
