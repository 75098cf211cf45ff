#!/usr/bin/env python3
"""How long a device plugin of a given size takes to reach an emulated node (issue 33).

The path `install_executable` takes: the file copied into the VM's run share on this machine
(its SHA-256 checked), then the guest mounts the share on first use and checks the SHA-256 of
the bytes it reads there (EmulatedVM.share_file_in_guest). Incompressible (random) bytes, a new
file name each round so nothing is cached in the guest. Before this path a 22 MB plugin never
arrived (the guest agent carried it base64-encoded in one message).

Prints median, spread and n for each size, and the load average: run it alone.
Usage: benchmarks/plugin_transfer.py [--sizes-mib 16 64 256] [--rounds 5] [--profile a100]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from hilconform.emulators.profile import load_profile
from hilconform.emulators.runtime_config import runtime_config_for
from hilconform.emulators.vm import EmulatedVM
from hilconform.fixtures.command_plugin import copy_unchanged, file_sha256


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes-mib", type=int, nargs="+", default=[16, 64, 256])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profile", default="a100")
    args = parser.parse_args()
    profile = load_profile(args.profile)
    vm = EmulatedVM(profile, runtime_config=runtime_config_for(profile))
    load_before = os.getloadavg()[0]
    vm.start()
    try:
        with tempfile.TemporaryDirectory(prefix="hilc-bench-") as folder:
            for size in args.sizes_mib:
                times, host_times = [], []
                for round_ in range(args.rounds):
                    local = Path(folder) / f"plugin-{size}m-{round_}"
                    with local.open("wb") as out:
                        for _ in range(size):
                            out.write(os.urandom(1 << 20))
                    sha256 = file_sha256(local)
                    started = time.monotonic()
                    copy = copy_unchanged(local, sha256, vm.layout.guest_share / "device-plugin")
                    copied = time.monotonic()
                    vm.share_file_in_guest(f"device-plugin/{copy.name}", sha256)
                    done = time.monotonic()
                    times.append(done - started)
                    host_times.append(copied - started)
                    copy.unlink()
                    local.unlink()
                print(f"{size:4d} MiB: median {statistics.median(times):.2f} s (min {min(times):.2f}, max "
                      f"{max(times):.2f}, n={len(times)}); of it on this machine median "
                      f"{statistics.median(host_times):.2f} s", flush=True)
    finally:
        vm.stop()
    print(f"1-min load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after; profile "
          f"{profile.name}; guest {profile.memory_mib} MiB; {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
