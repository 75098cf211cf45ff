#!/usr/bin/env python3
"""Benchmark the emulated host's foundation and print the figures.

  * guest image build time: cold (forced rebuild) and warm (up to date)
  * QEMU start -> guest ready (guest agent answers): median and spread of N boots
  * QEMU resident memory once the guest is ready

Goal (issue 2): guest ready <= 8 s median under TCG on a 2-core machine.
Usage: benchmarks/guest_boot.py [--profile a100] [--boots 5] [--skip-cold]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

from hilconform.emulators.profile import load_profile
from hilconform.emulators.toolchain import qemu_version
from hilconform.emulators.vm import EmulatedVM

BUILD_SCRIPT = Path(__file__).resolve().parent.parent / "vm-images" / "build_guest.py"


def timed_build(force: bool) -> float:
    started = time.monotonic()
    argv = [sys.executable, str(BUILD_SCRIPT)] + (["--force"] if force else [])
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    return time.monotonic() - started


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def spread(values: list[float]) -> str:
    return (f"median {statistics.median(values):.2f}  min {min(values):.2f}  "
            f"max {max(values):.2f}  n={len(values)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="a100")
    parser.add_argument("--boots", type=int, default=5)
    parser.add_argument("--skip-cold", action="store_true", help="do not force a cold image build")
    args = parser.parse_args()

    print(f"QEMU {qemu_version()}, profile {args.profile}, TCG")
    if not args.skip_cold:
        print(f"image build, cold: {timed_build(force=True):.1f} s")
    print(f"image build, warm (up to date): {timed_build(force=False):.2f} s")

    profile = load_profile(args.profile)
    ready, rss = [], []
    for _ in range(args.boots):
        with EmulatedVM(profile) as vm:
            ready.append(vm.timings["guest_ready_s"])
            rss.append(rss_mib(vm.qemu.pid))
    print(f"QEMU start -> guest ready (s): {spread(ready)}")
    print(f"QEMU resident memory at ready (MiB): {spread(rss)}")


if __name__ == "__main__":
    main()
