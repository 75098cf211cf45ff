"""Find the host's QEMU tools and their versions (recorded in every run)."""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess

from .build_folder import build_folder, is_checkout
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


# -- the QEMU that model-based hosts need (vfio-user client) ---------------------------------------
VFIO_USER_MIN_VERSION = (10, 1)
def qemu_prefix_wrapper():
    """The private QEMU prefix's qemu-system-x86_64 (emulators/build_folder.py)."""
    return build_folder() / "qemu-prefix" / "qemu-system-x86_64"


def vfio_user_hint() -> str:
    how = "`make qemu-prefix`" if is_checkout() else "`hilconform setup`"
    return (f"run {how} as root (Debian 12: builds a private QEMU prefix from trixie-backports in "
            f"{build_folder() / 'qemu-prefix'}; Debian 13: installs qemu-system-x86 from trixie-backports), "
            "or point HILCONFORM_QEMU_VFIO_USER at a qemu-system-x86_64 >= 10.1")


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version)[:2])


@functools.cache
def has_vfio_user(binary: str) -> bool:
    """Whether this QEMU offers the vfio-user client device (`vfio-user-pci`)."""
    try:
        # Asks for this one device's options: a full `-device help` loads every module on the host.
        result = subprocess.run([binary, "-device", "vfio-user-pci,help"], capture_output=True,
                                text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0 and "socket=" in result.stdout


def vfio_user_qemu_binary() -> str:
    """A QEMU >= 10.1 with vfio-user: HILCONFORM_QEMU_VFIO_USER, the system's, or the private prefix."""
    candidates = []
    if os.environ.get("HILCONFORM_QEMU_VFIO_USER"):
        candidates.append(("HILCONFORM_QEMU_VFIO_USER", os.environ["HILCONFORM_QEMU_VFIO_USER"]))
    else:
        system = shutil.which("qemu-system-x86_64")
        if system:
            candidates.append(("system", system))
        if qemu_prefix_wrapper().exists():
            candidates.append(("prefix", str(qemu_prefix_wrapper())))
    seen = []
    for origin, binary in candidates:
        version = qemu_version(binary)
        seen.append(f"{origin} {binary}: QEMU {version}")
        if version != "unknown" and _version_tuple(version) >= VFIO_USER_MIN_VERSION \
                and has_vfio_user(binary):
            return binary
    found = "; ".join(seen) or "no QEMU found"
    raise ToolMissing(
        f"model-based hosts need QEMU >= {'.'.join(map(str, VFIO_USER_MIN_VERSION))} with the vfio-user "
        f"client (vfio-user-pci); found: {found}. To get it: {vfio_user_hint()}"
    )


def qemu_binary_for(profile) -> str:
    """The QEMU a host of `profile` runs on: one QEMU (>= 10.1) for every host where it is set up.

    A profile with device models needs it (vfio-user). A stock-device profile gets it too, because
    it can migrate nvme (QEMU 7.2 cannot), so such a host is restored from a saved ready VM instead
    of booted (emulators/vm_snapshot.py), and Debian 12 runs what Debian 13 runs. A stock profile
    falls back to the system QEMU where no such QEMU is set up, and takes the system one when
    HILCONFORM_QEMU_SYSTEM_X86_64 names it.
    """
    if getattr(profile, "uses_models", False):
        return vfio_user_qemu_binary()
    if os.environ.get("HILCONFORM_QEMU_SYSTEM_X86_64"):
        return qemu_binary()
    try:
        return vfio_user_qemu_binary()
    except ToolMissing:
        return qemu_binary()
