"""Hub and cache operations: pull, lock, trust status. The C API (kernel_hub.h) exposes the
runtime and kernelize only, so these run the kernel-hub CLI the package carries (the same
library code, kernel-hub --json) and return its JSON; a failure raises KernelHubError with the
CLI's message."""
import json
import os
import subprocess
import tempfile

from ._native import KernelHubError, cli_path


def _run(args, hub=None, offline=False):
    cmd = [cli_path(), "--json", "--quiet"]
    if hub:
        cmd += ["--hub", hub]
    if offline:
        cmd.append("--offline")
    proc = subprocess.run(cmd + args, capture_output=True, text=True)
    if proc.returncode != 0:
        raise KernelHubError(_error_kind(proc.stdout), (
            proc.stderr.strip() or proc.stdout.strip() or
            f"kernel-hub {' '.join(args)} exited {proc.returncode}"))
    return json.loads(proc.stdout) if proc.stdout.strip() else {}


def _error_kind(stdout):
    """The error kind of the CLI's --json output ({"error": {"kind": ...}} alone or per ref)."""
    try:
        out = json.loads(stdout)
    except ValueError:
        return "error"
    for item in out if isinstance(out, list) else [out]:
        if isinstance(item, dict) and isinstance(item.get("error"), dict):
            return item["error"].get("kind", "error")
    return "error"


def _config_file(config, tmp):
    from .bridge import hub_config
    path = os.path.join(tmp, "kernels.json")
    with open(path, "w") as f:
        json.dump(hub_config(config), f)
    return path


def pull(ref=None, config=None, lock=None, targets=(), hub=None, offline=False):
    """Fetches into the cache and verifies: a ref ("kernel-hub/norm@v1"), what a KernelConfig
    needs on `targets` (device specs: "cpu", "cuda:sm_90:cuda_13.0"), or a lock file's digests."""
    with tempfile.TemporaryDirectory() as tmp:
        args = ["pull"]
        if ref:
            args.append(ref)
        if config is not None:
            args += ["--config", _config_file(config, tmp)]
        if lock:
            args += ["--lock", str(lock)]
        for t in targets:
            args += ["--target", t]
        return _run(args, hub, offline)


def lock(config, output, targets=("cpu",), hub=None, offline=False):
    """Pins every ref of a KernelConfig to its index digest and, per target, the variant; writes
    the lock file `output` (for kernelize(..., lock=output)) and returns the CLI's summary."""
    with tempfile.TemporaryDirectory() as tmp:
        args = ["lock", "--config", _config_file(config, tmp), "-o", str(output)]
        for t in targets:
            args += ["--target", t]
        return _run(args, hub, offline)


def trust_status(ref, hub=None, offline=False):
    """Pulls `ref` (verified blobs into the cache, nothing unpacked) and returns the signature
    check of its index: {"status": "signed" | "unsigned-allowed" | "refused", "message": ...}
    ("trust" of `kernel-hub pull REF --json`)."""
    return _run(["pull", ref], hub, offline)[0].get("trust", {})


def info(ref, hub=None, offline=False):
    """A ref's index and variants, as `kernel-hub info --json` prints them."""
    return _run(["info", ref], hub, offline)
