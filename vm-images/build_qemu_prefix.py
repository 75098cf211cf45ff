#!/usr/bin/env python3
"""Provide a QEMU with the vfio-user client (>= 10.1) for model-based hosts.

* The system QEMU is used when it is new enough (nothing is built).
* Debian 13: qemu-system-x86 from trixie-backports, installed with apt
  (without Recommends: those add a GUI, GL and spice, ~1.1 GB, to a headless TCG QEMU).
* Debian 12: a private prefix, vm-images/build/qemu-prefix/: the trixie-backports
  QEMU and the trixie libraries it loads, fetched with a private apt
  configuration (vm-images/build/qemu-apt/: own sources, lists, cache and an
  empty dpkg status, so the system's apt is untouched) and unpacked with
  `dpkg -x`. It runs through the prefix's own dynamic loader, started by the
  wrapper vm-images/build/qemu-prefix/qemu-system-x86_64.

The stamp vm-images/build/qemu-prefix.stamp holds the recipe hash; the build is
skipped while it matches (or while the system QEMU is new enough: no stamp needed).
Standard library only (runs before the virtualenv), the full one: Debian's
python3-minimal alone lacks shutil and tomllib.
What to fetch is data: vm-images/qemu-prefix.toml.
"""

from __future__ import annotations

import sys

try:
    import argparse
    import hashlib
    import os
    import re
    import shutil
    import subprocess
    import tomllib
    from pathlib import Path
except ImportError as missing:  # python3-minimal only: say what to install, not a traceback
    sys.exit(f"qemu prefix: Python's standard library is incomplete ({missing}); "
             "install it: apt-get install python3")

HERE = Path(__file__).resolve().parent
# emulators/build_folder.py decides where (HILCONFORM_BUILD_DIR; a checkout: vm-images/build).
BUILD = Path(os.environ.get("HILCONFORM_BUILD_DIR") or HERE / "build")
RECIPE = HERE / "qemu-prefix.toml"
PREFIX = BUILD / "qemu-prefix"
APT_DIR = BUILD / "qemu-apt"
STAMP = BUILD / "qemu-prefix.stamp"
WRAPPER = PREFIX / "qemu-system-x86_64"
MIRROR_DEFAULT = "http://deb.debian.org/debian"
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"

WRAPPER_TEXT = """#!/bin/sh
# QEMU from the private prefix, through the prefix's own loader and libraries.
# Both -L are needed, or QEMU loads the host's (older) firmware; QEMU_MODULE_DIR likewise.
# Written by build_qemu_prefix.py.
P="$(dirname "$(readlink -f "$0")")"
L="$P/usr/lib/x86_64-linux-gnu"
export QEMU_MODULE_DIR="$L/qemu"   # else it loads the host QEMU's modules
exec "$L/ld-linux-x86-64.so.2" --library-path "$L:$P/lib/x86_64-linux-gnu" \\
  "$P/usr/bin/qemu-system-x86_64" -L "$P/usr/share/qemu" -L "$P/usr/share/seabios" "$@"
"""


def progress(step: str) -> None:
    print(f"[qemu prefix] {step}", flush=True)


def recipe() -> dict:
    return tomllib.loads(RECIPE.read_text())


def recipe_hash() -> str:
    digest = hashlib.sha256()
    for path in (Path(__file__).resolve(), RECIPE):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def qemu_version(argv: list[str]) -> str | None:
    try:
        out = subprocess.run([*argv, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"version (\d+\.\d+(?:\.\d+)?)", out)
    return match.group(1) if match else None


def offers_vfio_user(argv: list[str]) -> bool:
    """Whether this QEMU has the client device (a build may leave it out even when new enough)."""
    try:
        result = subprocess.run([*argv, "-device", "vfio-user-pci,help"], capture_output=True,
                                text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return result.returncode == 0 and "socket=" in result.stdout


def system_qemu_new_enough(minimum: str) -> str | None:
    """The system QEMU's version if it has the vfio-user client, else None."""
    path = shutil.which("qemu-system-x86_64")
    version = qemu_version([path]) if path else None
    if version and version_tuple(version) >= version_tuple(minimum) and offers_vfio_user([path]):
        return version
    return None


def debian_major(version_file: Path = Path("/etc/debian_version")) -> int:
    """13 on trixie ("13.8"); 0 where there is no number (testing/sid: "forky/sid", not Debian)."""
    try:
        return int(version_file.read_text().split(".")[0])
    except (OSError, ValueError):
        return 0


def way_to_get_qemu(system_version: str | None, major: int) -> str:
    """How to get the QEMU: system (new enough), backports (Debian 13: apt), prefix (Debian 12, others)."""
    if system_version:
        return "system"
    return "backports" if major >= 13 else "prefix"


def up_to_date() -> bool:
    minimum = recipe()["min_version"]
    if system_qemu_new_enough(minimum):
        return True  # whoever installed it, nothing to build: a user need not run this as root
    if not STAMP.exists() or STAMP.read_text().strip() != recipe_hash():
        return False
    version = qemu_version([str(WRAPPER)]) if WRAPPER.exists() else None
    return bool(version and version_tuple(version) >= version_tuple(minimum))


def run(argv: list[str]) -> str:
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        sys.exit(f"qemu prefix: `{' '.join(argv)}` failed ({result.returncode}):\n"
                 f"{result.stdout[-2000:]}{result.stderr[-2000:]}")
    return result.stdout


def mirror_in_policy(policy: str) -> str | None:
    """The Debian mirror of the host's own release in `apt-cache policy` (not security, not backports)."""
    for line in policy.splitlines():
        match = re.search(r"(https?://\S+/debian)/?\s+(\S+)/main\s", line)
        if match and not re.search(r"security|backports", match.group(2)):
            return match.group(1)
    return None


def mirror() -> str:
    """HILCONFORM_DEBIAN_MIRROR, else the host apt's mirror (as the guest build), else deb.debian.org."""
    if os.environ.get("HILCONFORM_DEBIAN_MIRROR"):
        return os.environ["HILCONFORM_DEBIAN_MIRROR"].rstrip("/")
    try:
        policy = subprocess.run(["apt-cache", "policy"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        policy = ""
    return mirror_in_policy(policy) or MIRROR_DEFAULT


def backports_sources(cfg: dict, mirror_url: str) -> str:
    """The deb822 sources file that enables the release the packages come from."""
    return (f"Types: deb\nURIs: {mirror_url}\nSuites: {cfg['release']}\n"
            f"Components: {' '.join(cfg['components'])}\nSigned-By: {KEYRING}\n")


def backports_install_argv(cfg: dict) -> list[str]:
    """apt-get install of the packages from the backports release, Depends only."""
    return ["env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-y", "-qq",
            "--no-install-recommends", "-t", cfg["release"], *cfg["packages"]]


def install_from_backports(cfg: dict) -> None:
    """Debian 13: enable trixie-backports and install QEMU from it the ordinary way."""
    if os.geteuid() != 0:
        sys.exit("qemu prefix: installing QEMU from trixie-backports needs root: sudo make qemu-prefix")
    Path(cfg["trixie_backports_sources"]).write_text(backports_sources(cfg, mirror()))
    progress(f"installing {' '.join(cfg['packages'])} from {cfg['release']} (apt, no Recommends)")
    run(["apt-get", "update", "-qq"])
    run(backports_install_argv(cfg))


def apt_argv(cfg: dict) -> list[str]:
    """apt-get with every state folder inside APT_DIR (the system's apt is not touched)."""
    options = {
        "Dir::Etc::SourceList": APT_DIR / "sources.list",
        "Dir::Etc::SourceParts": APT_DIR / "sources.list.d",
        "Dir::Etc::Preferences": APT_DIR / "preferences",
        "Dir::Etc::PreferencesParts": APT_DIR / "preferences.d",
        "Dir::State": APT_DIR / "state",
        "Dir::State::Lists": APT_DIR / "lists",
        "Dir::State::status": APT_DIR / "status",
        "Dir::Cache": APT_DIR / "cache",
        "Dir::Cache::archives": APT_DIR / "archives",
        "APT::Architecture": "amd64",
        "APT::Install-Recommends": "false",
        "APT::Install-Suggests": "false",
        "APT::Get::Download-Only": "true",
        "Debug::NoLocking": "true",
    }
    argv = ["apt-get", "-qq"]
    for key, value in options.items():
        argv += ["-o", f"{key}={value}"]
    return argv


def fetch_debs(cfg: dict) -> list[Path]:
    for sub in ("sources.list.d", "preferences.d", "state", "lists/partial", "cache",
                "archives/partial"):
        (APT_DIR / sub).mkdir(parents=True, exist_ok=True)
    (APT_DIR / "sources.list").write_text("".join(
        f"deb [signed-by={KEYRING}] {mirror()} {suite} {' '.join(cfg['components'])}\n"
        for suite in cfg["suites"]
    ))
    # An empty status: apt sees nothing installed and resolves every library the packages load.
    (APT_DIR / "status").write_text("")
    for old in (APT_DIR / "archives").glob("*.deb"):
        old.unlink()
    progress(f"apt-get update ({', '.join(cfg['suites'])}; private lists in {APT_DIR})")
    argv = apt_argv(cfg)
    run([*argv, "update"])
    progress(f"downloading {' '.join(cfg['packages'])} from {cfg['release']} and their libraries")
    run([*argv, "-t", cfg["release"], "install", *cfg["packages"]])
    debs = sorted((APT_DIR / "archives").glob("*.deb"))
    if not debs:
        sys.exit("qemu prefix: apt downloaded no packages")
    return debs


def unpack(cfg: dict, debs: list[Path]) -> None:
    staging = BUILD / "qemu-prefix.new"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for deb in debs:
        run(["dpkg-deb", "-x", str(deb), str(staging)])
    for rel in cfg["drop"]:
        shutil.rmtree(staging / rel, ignore_errors=True)
    bindir = staging / "usr" / "bin"
    for binary in bindir.iterdir():
        if binary.name != "qemu-system-x86_64":
            binary.unlink()
    (staging / WRAPPER.name).write_text(WRAPPER_TEXT)
    (staging / WRAPPER.name).chmod(0o755)
    shutil.rmtree(PREFIX, ignore_errors=True)
    staging.rename(PREFIX)
    size = sum(p.stat().st_size for p in PREFIX.rglob("*") if p.is_file() and not p.is_symlink())
    progress(f"{len(debs)} packages unpacked into {PREFIX} ({size / 1e6:.0f} MB)")


def build() -> None:
    cfg = recipe()
    BUILD.mkdir(parents=True, exist_ok=True)
    minimum = cfg["min_version"]
    version = system_qemu_new_enough(minimum)
    way = way_to_get_qemu(version, debian_major())
    if way == "system":
        progress(f"system QEMU {version} has the vfio-user client; nothing to build")
    elif way == "backports":
        install_from_backports(cfg)
        version = system_qemu_new_enough(minimum)
    else:
        unpack(cfg, fetch_debs(cfg))
        version = qemu_version([str(WRAPPER)])
    if not version or version_tuple(version) < version_tuple(minimum):
        sys.exit(f"qemu prefix: got QEMU {version or 'that does not start'}; need >= {minimum}")
    STAMP.write_text(recipe_hash() + "\n")
    progress(f"QEMU {version} with vfio-user ready")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 0 if a QEMU with vfio-user is ready, 1 if it needs building")
    parser.add_argument("--force", action="store_true", help="rebuild even if the stamp matches")
    args = parser.parse_args()
    if args.check:
        sys.exit(0 if up_to_date() else 1)
    if up_to_date() and not args.force:
        progress("up to date")
        return
    build()


if __name__ == "__main__":
    main()
