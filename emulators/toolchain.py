"""Find the host's QEMU tools and their versions (recorded in every run)."""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess

from .errors import ToolMissing

INSTALL_HINT = "apt-get install qemu-system-x86 qemu-utils (or run `make setup` as root)"


def find_tool(name: str) -> str:
    """Path of a host program; HILCONFORM_<NAME> (e.g. HILCONFORM_QEMU_NBD) overrides PATH."""
    env = f"HILCONFORM_{name.upper().replace('-', '_')}"
    if os.environ.get(env):
        path = os.environ[env]
        if not (os.path.isfile(path) and os.access(path, os.X_OK)):
            raise ToolMissing(f"{env}={path}: no such executable")
        return path
    path = shutil.which(name)
    if not path:
        raise ToolMissing(f"{name} not found on PATH; install it: {INSTALL_HINT}")
    return path


def qemu_binary() -> str:
    return find_tool("qemu-system-x86_64")


@functools.cache
def qemu_version(binary: str | None = None) -> str:
    binary = binary or qemu_binary()
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=False).stdout
    match = re.search(r"version (\S+)", out)
    return match.group(1) if match else "unknown"
