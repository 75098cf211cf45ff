"""`hilconform setup` (and `hilconform doctor`, which only checks): what emulated hosts need on this
machine, for an installed hilconform as `make setup image qemu-prefix` does for a checkout.

Three steps, each skipped when already done: the system packages (emulators/host-packages.toml;
installed with apt when root, else the apt line to run), the guest image and the QEMU with the
vfio-user client (the recipes in vm-images/, built into emulators/build_folder.py's folder: the
user's cache, `$XDG_CACHE_HOME/hilconform`, shared by every project and rebuilt only when its
recipe changed). Each step's own progress is shown as it runs. Exit 0 when everything is ready,
1 when something is missing (doctor, or not root), 2 when a step failed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

from .build_folder import ENV, PACKAGE_ROOT, build_folder
from .host_packages import missing_packages

RECIPES = (("guest image", "build_guest.py"), ("QEMU with the vfio-user client", "build_qemu_prefix.py"))
READY, MISSING, FAILED = 0, 1, 2


def say(line: str) -> None:
    print(f"hilconform setup: {line}", flush=True)


def system_packages(check: bool) -> int:
    missing = missing_packages(("run",))
    if not missing:
        say("system packages: installed")
        return READY
    names = " ".join(p.name for p in missing)
    if check or os.geteuid() != 0:
        say(f"system packages missing: {names}; as root: apt-get install {names}")
        for package in missing:
            say(f"  {package.name}: {package.why}")
        return MISSING
    say(f"installing system packages: {names}")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", *names.split()]):
        if subprocess.run(argv, env=env).returncode != 0:
            say(f"`{' '.join(argv)}` failed")
            return FAILED
    return READY


def recipe(label: str, script: str, check: bool) -> int:
    """One vm-images recipe: checked (`--check`), built when out of date and allowed."""
    argv = [sys.executable, str(PACKAGE_ROOT / "vm-images" / script)]
    env = {**os.environ, ENV: str(build_folder())}
    if subprocess.run([*argv, "--check"], env=env, stdout=subprocess.DEVNULL).returncode == 0:
        say(f"{label}: up to date")
        return READY
    if check or os.geteuid() != 0:
        say(f"{label}: not built (or its recipe changed); run `hilconform setup` as root")
        return MISSING
    say(f"{label}: building")
    if subprocess.run(argv, env=env).returncode != 0:
        say(f"{label}: the build failed (its output above)")
        return FAILED
    return READY


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hilconform setup", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only say what is missing (hilconform doctor)")
    args = parser.parse_args(argv)
    folder = build_folder()
    say(f"build folder {folder}")
    worst = system_packages(args.check)
    if worst == READY and not args.check:
        folder.mkdir(parents=True, exist_ok=True)
    for label, script in RECIPES:
        if worst == FAILED:
            break
        worst = max(worst, recipe(label, script, args.check or worst != READY))
    say({READY: "ready", MISSING: "something is missing (above)", FAILED: "failed"}[worst])
    return worst


if __name__ == "__main__":
    sys.exit(main())
