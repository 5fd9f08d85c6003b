#!/usr/bin/env python3
"""The kernel_hub wheel: built offline from this build tree (pip wheel --no-build-isolation
--no-index, from a copy of tools/python so the checkout stays clean), installed into a scratch
folder with pip, then used from there with no KERNEL_HUB_* variable pointing back at the tree:
the library, the CLI and the signed default hub must all come from the wheel (the share layout,
hub/data_dir.cpp). No torch needed.

Then the manylinux wheel (tools/python/build_wheel.py: libcurl and libarchive carried, auditwheel
repair) when auditwheel and patchelf are found ($KERNEL_HUB_AUDITWHEEL, PATH, or next to this
Python; that part says SKIPPED otherwise): its tag is manylinux, it carries those libraries and
their dependencies, and installed, the same checks pass with the libraries of the wheel loaded
(/proc/self/maps) and not the system's.

Usage: test_wheel.py BUILD_DIR (exit 0 = pass; 77 = skipped: no pip or setuptools)."""
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.normpath(os.path.join(HERE, "..", "..", "tools", "python"))
sys.path.insert(0, SOURCE)
import build_wheel  # noqa: E402  (tools/python/build_wheel.py)

CHECK = r"""
import ctypes, json, os, sys
import kernel_hub
from kernel_hub.runtime import Runtime
site = sys.argv[1]
assert kernel_hub.library_path().startswith(site), kernel_hub.library_path()
assert kernel_hub.cli_path().startswith(site), kernel_hub.cli_path()
print("version", kernel_hub.version())
trust = kernel_hub.trust_status("kernel-hub/norm@v1")
assert trust["status"] == "signed", trust
rt = Runtime(["RMSNorm"])
report = rt.kernelize({"RMSNorm": "kernel-hub/norm"}, device="cpu")
assert rt.is_bound("RMSNorm", "eval") and rt.is_bound("RMSNorm", "train"), report
print("bound from", [b["kernel"] for b in report["bindings"]])
# kernelize unpacked the package's archive into the cache: libarchive is loaded. Which copies
# of the dlopen'ed libraries did the process map? (the manylinux check reads this line)
maps = open("/proc/self/maps").read().split()
print("mapped", sorted({p for p in maps if "/libarchive" in p or "/libcurl" in p}))
"""


CURL_CHECK = r"""
import kernel_hub
from kernel_hub.runtime import Runtime
try:
    Runtime(["RMSNorm"]).kernelize({"RMSNorm": "kernel-hub/norm"}, hub="http://127.0.0.1:9",
                                   device="cpu", strict=True)
except kernel_hub.KernelHubError:
    pass
maps = open("/proc/self/maps").read().split()
print("\n".join(sorted({p for p in maps if any(n in p for n in ("/libcurl", "/libnghttp2",
                                                                "/libssl"))})))
"""


def install_and_check(wheel, tmp, env):
    """Installs `wheel` into a scratch folder and runs CHECK there; returns CHECK's output."""
    site = os.path.join(tmp, "site")
    shutil.rmtree(site, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target",
                    site, wheel], check=True, env=env)
    env = dict(env, PYTHONPATH=site, KERNEL_HUB_CACHE=os.path.join(tmp, "cache"))
    shutil.rmtree(env["KERNEL_HUB_CACHE"], ignore_errors=True)  # packages unpacked anew
    out = subprocess.run([sys.executable, "-c", CHECK, site], check=True, env=env, cwd=tmp,
                         capture_output=True, text=True)
    print(out.stdout, end="")
    # The console script runs the carried CLI.
    cli = subprocess.run([os.path.join(site, "bin", "kernel-hub"), "--version"],
                         capture_output=True, text=True, env=env)
    assert cli.returncode == 0 and cli.stdout.strip(), cli
    print("kernel-hub script:", cli.stdout.strip())
    return out.stdout, site


def check_manylinux(build, tmp, env):
    auditwheel = build_wheel.find_auditwheel(None)
    if not auditwheel:
        print("manylinux wheel: SKIPPED (no auditwheel: $KERNEL_HUB_AUDITWHEEL, PATH or next to "
              f"{sys.executable}; README 'PyTorch and Transformers')")
        return
    dist = os.path.join(tmp, "manylinux")
    wheel = build_wheel.build(build, dist, auditwheel, quiet=True)
    name = os.path.basename(wheel)
    assert "-manylinux_" in name, f"{name}: expected a manylinux tag"
    names = zipfile.ZipFile(wheel).namelist()
    for want in ("kernel_hub/_sdk/lib/libcurl.so.4", "kernel_hub/_sdk/lib/libarchive.so.13"):
        assert want in names, f"{name} lacks {want}"
    grafted = [n for n in names if n.startswith("kernel_hub.libs/")]
    for want in ("libcrypto", "libfmt", "libssl", "libnghttp2"):
        assert any(os.path.basename(n).startswith(want) for n in grafted), \
            f"{name}: kernel_hub.libs/ lacks {want} ({grafted})"
    print(f"{name}: {len(grafted)} libraries grafted, "
          f"{os.path.getsize(wheel) / 2**20:.1f} MiB")
    out, site = install_and_check(wheel, tmp, env)
    mapped = [line for line in out.splitlines() if line.startswith("mapped ")]
    assert mapped and "libarchive.so.13" in mapped[0] and site in mapped[0], \
        f"libarchive should come from the wheel ({site}): {mapped}"
    assert "/usr/lib" not in mapped[0] and "/lib/x86_64" not in mapped[0], mapped
    # libcurl too, and its own dependencies from kernel_hub.libs: a kernelize against a hub that
    # refuses connections loads it (and fails, as it should).
    env = dict(env, PYTHONPATH=site, KERNEL_HUB_CACHE=os.path.join(tmp, "cache-curl"))
    out = subprocess.run([sys.executable, "-c", CURL_CHECK], check=True, env=env, cwd=tmp,
                         capture_output=True, text=True).stdout
    libs = out.split()
    for want in ("libcurl.so.4", "libnghttp2", "libssl"):
        found = [p for p in libs if want in os.path.basename(p)]
        assert found and all(p.startswith(site) for p in found), f"{want}: {found} ({out})"
    print("manylinux wheel: libcurl and its dependencies from the wheel")
    print("manylinux wheel: ok")


def main():
    build = os.path.abspath(sys.argv[1])
    try:  # pip, and setuptools with bdist_wheel (built in since 70.1, else the wheel package)
        import setuptools
        if tuple(int(p) for p in setuptools.__version__.split(".")[:2]) < (70, 1):
            import wheel  # noqa: F401
        subprocess.run([sys.executable, "-m", "pip", "--version"], check=True,
                       stdout=subprocess.DEVNULL)
    except (ImportError, ValueError, subprocess.CalledProcessError) as e:
        print(f"SKIPPED: building the wheel offline needs pip and setuptools >= 70.1 (or the "
              f"wheel package) in {sys.executable} ({e!r}); -DKH_TORCH_PYTHON picks another")
        return 77
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "src")
        shutil.copytree(SOURCE, src, ignore=shutil.ignore_patterns("build", "dist", "*.egg-info",
                                                                    "__pycache__", "_sdk"))
        env = dict(os.environ, KERNEL_HUB_BUILD_DIR=build, PIP_NO_INDEX="1",
                   PIP_DISABLE_PIP_VERSION_CHECK="1")
        for k in ("KERNEL_HUB_LIBRARY", "KERNEL_HUB_CLI", "KERNEL_HUB_DATA_DIR",
                  "KERNEL_HUB_ENDPOINT", "PYTHONPATH"):
            env.pop(k, None)
        dist = os.path.join(tmp, "dist")
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps",
                        "-q", "-w", dist, src], check=True, env=env)
        (wheel,) = os.listdir(dist)
        assert "-py3-none-linux_" in wheel, \
            f"{wheel}: expected a platform wheel for any Python 3 (native library, no extension)"
        names = zipfile.ZipFile(os.path.join(dist, wheel)).namelist()
        for want in ("kernel_hub/_sdk/bin/kernel-hub", "libkernel_hub.so.0",
                     "kernel_hub/_sdk/share/kernel-hub/default-hub/kernel-hub/norm/",
                     "kernel_hub/_sdk/share/kernel-hub/default-hub-key/signing.pub",
                     "kernel_hub/ops.py", "kernel_hub/kernel_hub_ctypes.py"):
            assert any(want in n for n in names), f"{wheel} lacks {want}"
        size = os.path.getsize(os.path.join(dist, wheel))
        print(f"{wheel}: {len(names)} files, {size / 2**20:.1f} MiB")
        install_and_check(os.path.join(dist, wheel), tmp, env)
        print("wheel: ok")
        check_manylinux(build, tmp, env)
    return 0


if __name__ == "__main__":
    sys.exit(main())
