"""Builds the kernel_hub wheel from a configured and built kernel-hub tree (no compiler here):
`cmake --install` of that tree goes into kernel_hub/_sdk (bin/kernel-hub, lib/libkernel_hub.so*,
share/kernel-hub/default-hub and its public key, headers), where the library and the CLI find
their data as an installed SDK does (hub/data_dir.cpp). The tree: $KERNEL_HUB_BUILD_DIR, default
<repo>/build; its CMakeCache.txt names the sources. Why not scikit-build-core: it would rebuild
the whole C++ project inside pip (minutes, and its build requirements from an index); the tree the
tests already built is the one shipped."""
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


class BinaryDistribution(Distribution):
    # libkernel_hub.so and the CLI are native: a platform wheel, not py3-none-any.
    def has_ext_modules(self):
        return True


setup(version=version(), cmdclass={"build_py": BuildPyWithSdk}, distclass=BinaryDistribution)
