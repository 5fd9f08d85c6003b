#!/usr/bin/env python3
"""Checks README.md's CLI reference against the binary's own --help, so that the two cannot
drift apart: every command (and nested command) `kernel-hub --help` lists has a README heading
"### `kernel-hub CMD ...`", every long option any --help prints appears in the README, and every
KERNEL_HUB_* variable the sources read (getenv) is in the README's environment table.
Usage: check_readme.py KERNEL_HUB_BINARY SOURCE_DIR"""
import os
import re
import subprocess
import sys


def help_text(binary, args):
    out = subprocess.run([binary, *args, "--help"], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        sys.exit(f"{' '.join(args) or 'kernel-hub'} --help exited {out.returncode}: {out.stderr}")
    return out.stdout


def subcommands(text):
    part = text.split("\nSubcommands:\n", 1)
    if len(part) < 2:
        return []
    return [m.group(1) for m in re.finditer(r"^  ([a-z][a-z0-9-]*)\s", part[1], re.M)]


def main():
    binary, src = sys.argv[1], sys.argv[2]
    readme = open(os.path.join(src, "README.md"), encoding="utf-8").read()
    headings = re.findall(r"^###+ `kernel-hub ([a-z][a-z -]*)", readme, re.M)
    problems = []

    def walk(path):
        text = help_text(binary, path)
        for opt in set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]+)", text)):
            if opt != "--help" and opt not in readme:
                problems.append(f"option {opt} (kernel-hub {' '.join(path)} --help) is not in README.md")
        for sub in subcommands(text):
            cmd = " ".join(path + [sub])
            nested = subcommands(help_text(binary, path + [sub]))
            if not nested and not any(h.strip() == cmd or h.startswith(cmd + " ") for h in headings):
                problems.append(f"command `kernel-hub {cmd}` has no README heading "
                                f"(\"### `kernel-hub {cmd} ...`\")")
            walk(path + [sub])

    walk([])
    env_table = readme.split("## Environment", 1)[-1]
    for root in ("hub", "loader", "registry", "tools"):
        for dirpath, _, files in os.walk(os.path.join(src, root)):
            for f in files:
                if not f.endswith((".cpp", ".h", ".c")):
                    continue
                code = open(os.path.join(dirpath, f), encoding="utf-8").read()
                for var in set(re.findall(r'getenv\("(KERNEL_HUB_[A-Z_]+)"\)', code)):
                    if f"`{var}" not in env_table:
                        problems.append(f"{var} (read in {root}/{os.path.relpath(dirpath, os.path.join(src, root))}/{f}) "
                                        "is not in README.md's Environment table")
    for p in sorted(set(problems)):
        print(p)
    if problems:
        sys.exit(1)
    print(f"README.md covers every command, option and KERNEL_HUB_* variable ({len(headings)} headings)")


if __name__ == "__main__":
    main()
