"""The Debian packages the machine running hilconform needs, and which of them are missing.

The list is data (emulators/host-packages.toml): `make setup` runs this module with the system's
python3 before any virtualenv exists (`python3 -m emulators.host_packages` from the checkout:
standard library only), `hilconform setup` imports it, so both install and check the same
packages. A package counts as installed when dpkg says so (`dpkg-query`: its status is
"installed"), whoever asks: a user's PATH lacks /usr/sbin, where debootstrap and mkfs.ext4 live,
so a `command -v` there called them missing. Only where there is no dpkg (not Debian) does the
package's `tool` decide (`command -v` with the system folders on the PATH, or the shell test
given).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from .errors import BadInput
from .toml_file import check_entry, read_toml

DATA = Path(__file__).resolve().with_name("host-packages.toml")
GROUPS = ("run", "test")
KEYS = {"tool": str, "for": str}
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class HostPackagesError(BadInput):
    """host-packages.toml is malformed: the message names the entry and what is wrong."""


@dataclass(frozen=True)
class HostPackage:
    name: str
    group: str
    tool: str
    why: str

    def installed(self) -> bool:
        if shutil.which("dpkg-query", path=SYSTEM_PATH):
            status = subprocess.run(["dpkg-query", "-W", "-f=${db:Status-Status}", self.name],
                                    capture_output=True, text=True, env={**os.environ, "PATH": SYSTEM_PATH})
            return status.returncode == 0 and status.stdout.strip() == "installed"
        check = self.tool if " " in self.tool else f"command -v {self.tool}"
        return subprocess.run(["sh", "-c", f"{check} >/dev/null 2>&1"],
                              env={**os.environ, "PATH": f"{os.environ.get('PATH', '')}:{SYSTEM_PATH}"}
                              ).returncode == 0


def read_packages(path: Path = DATA) -> list[HostPackage]:
    """Every package, strictly: an unknown group or key is an error."""
    data = read_toml(path, HostPackagesError, "the host packages")
    unknown = set(data) - set(GROUPS)
    if unknown:
        raise HostPackagesError(f"{path}: unknown group(s) {', '.join(sorted(unknown))} (known: {GROUPS})")
    packages = []
    for group in GROUPS:
        for name, entry in data.get(group, {}).items():
            check_entry(f"{group}.{name}", entry, KEYS, tuple(KEYS), str(path), HostPackagesError)
            packages.append(HostPackage(name, group, entry["tool"], entry["for"]))
    return packages


def missing_packages(groups: tuple[str, ...] = ("run",), path: Path = DATA) -> list[HostPackage]:
    return [p for p in read_packages(path) if p.group in groups and not p.installed()]


def apt_install_command(packages: list[HostPackage]) -> list[str]:
    return ["apt-get", "install", "-y", "-qq", *(p.name for p in packages)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("list", "missing"),
                        help="every package of the groups, or the missing ones")
    parser.add_argument("--group", action="append", choices=GROUPS, help="repeatable (default: run)")
    args = parser.parse_args(argv)
    groups = tuple(args.group or ["run"])
    chosen = (missing_packages(groups) if args.what == "missing"
              else [p for p in read_packages() if p.group in groups])
    print(" ".join(p.name for p in chosen))
    return 0


if __name__ == "__main__":
    sys.exit(main())
