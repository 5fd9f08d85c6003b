"""`python -m kernel_hub ARGS` (and the `kernel-hub` script the wheel installs): runs the
kernel-hub CLI the package carries."""
import os
import sys

from ._native import cli_path


def main():
    path = cli_path()
    os.execv(path, [path] + sys.argv[1:])


if __name__ == "__main__":
    main()
