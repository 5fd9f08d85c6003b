"""kernel-hub for PyTorch and Transformers: signed, cached, locked kernel packages bound under a
model's layers, over libkernel_hub.so's C API.

    import kernel_hub
    model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen3-0.6B")
    kernel_hub.kernelize(model, config={"RMSNorm": "kernel-hub/norm", ...})

README.md "PyTorch and Transformers" says what is replaced and what is not."""
import sys

from ._native import KernelHubError, cli_path, library_path, version
from .hub import info, lock, pull, trust_status

__all__ = ["kernelize", "pull", "lock", "trust_status", "info", "version", "KernelHubError",
           "Runtime", "library_path", "cli_path"]


def __getattr__(name):
    # torch and transformers load only when a model is kernelized: pull/lock need neither.
    import importlib
    if name in ("kernelize", "DEFAULT_CONFIG", "TRANSFORMERS_NAMES", "INDUCTOR_LAYERS",
                "register_attention"):
        return getattr(importlib.import_module(".bridge", __name__), name)
    if name == "Runtime":
        return importlib.import_module(".runtime", __name__).Runtime
    if name in ("ops", "bridge", "runtime"):
        return importlib.import_module("." + name, __name__)
    raise AttributeError(f"module 'kernel_hub' has no attribute {name!r}")


if "transformers" in sys.modules:  # attn_implementation="kernel_hub" can be asked for at load
    try:
        from .bridge import register_attention as _register
        _register()
    except ImportError:
        pass
