"""Where the native parts are and how to reach them: libkernel_hub.so (the C API, through the
ctypes declarations of kernel_hub_ctypes.py) and the kernel-hub CLI.

Lookup order, the same for both:
  1. $KERNEL_HUB_LIBRARY / $KERNEL_HUB_CLI (a build tree or an SDK prefix elsewhere);
  2. the SDK prefix the wheel carries (kernel_hub/_sdk: `cmake --install` of the build tree, so
     the library and the CLI find the default hub in _sdk/share/kernel-hub exactly as an
     installed SDK does; hub/data_dir.cpp);
  3. a build tree beside this source folder (<repo>/build), for running from the checkout.
"""
import ctypes as C
import glob
import os
import threading

from . import kernel_hub_ctypes as capi

_HERE = os.path.dirname(os.path.abspath(__file__))
_SDK = os.path.join(_HERE, "_sdk")
_REPO_BUILD = os.path.normpath(os.path.join(_HERE, "..", "..", "..", "build"))


class KernelHubError(RuntimeError):
    """A C API call failed: `status` is its KH_ERR_* name (for the CLI's hub operations, the
    error kind it reports, e.g. "not found"); the message says what and what to do."""

    def __init__(self, status, message):
        self.status = status if isinstance(status, str) else capi.STATUS_NAMES.get(status,
                                                                                    str(status))
        super().__init__(f"{self.status}: {message}")


def _first(candidates):
    for c in candidates:
        if c and os.path.exists(c):
            return c
    return None


def library_path():
    found = _first([os.environ.get("KERNEL_HUB_LIBRARY")] +
                   sorted(glob.glob(os.path.join(_SDK, "lib*", "**", "libkernel_hub.so.0"),
                                    recursive=True)) +
                   [os.path.join(_REPO_BUILD, "libkernel_hub.so")])
    if not found:
        raise FileNotFoundError(
            "libkernel_hub.so not found: set KERNEL_HUB_LIBRARY to it, or install the package "
            "from a built tree (pip install tools/python; README 'PyTorch and Transformers')")
    return found


def cli_path():
    found = _first([os.environ.get("KERNEL_HUB_CLI"), os.path.join(_SDK, "bin", "kernel-hub"),
                    os.path.join(_REPO_BUILD, "kernel-hub")])
    if not found:
        raise FileNotFoundError(
            "the kernel-hub CLI was not found: set KERNEL_HUB_CLI to it, or install the package "
            "from a built tree")
    return found


_lib = None
_lib_lock = threading.Lock()


def lib():
    """libkernel_hub.so, loaded once, with the C API's signatures declared."""
    global _lib
    with _lib_lock:
        if _lib is None:
            _lib = capi.load(library_path())
            _lib.kh_version.restype = C.c_char_p
    return _lib


def check(status):
    """Raises KernelHubError for a status other than KH_OK, with this thread's message."""
    if status != capi.KH_OK:
        raise KernelHubError(status, lib().kh_last_error().decode(errors="replace"))


def version():
    """The loaded libkernel_hub.so's version, "MAJOR.MINOR.PATCH"."""
    return lib().kh_version().decode()
