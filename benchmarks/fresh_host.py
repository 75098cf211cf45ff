#!/usr/bin/env python3
"""Benchmark how long a destructive test waits for a fresh emulated host: by boot (how it was
until issue 17, and still the way for a configuration QEMU cannot migrate) and by restoring a
saved ready VM (fixtures/fresh_host.py, emulators/vm_snapshot.py), side by side, same machine,
same run.

  * by boot: the request (EmulatedVM.start) -> the runtime's inventory complete, N boots
  * by restore: the first host of the configuration boots and is saved (its cost printed), then
    N hosts are restored: the request -> the runtime's inventory complete; or, where QEMU cannot
    migrate the host, what QEMU says
Each figure: median, p95, spread (n), with the load average. Run it alone: VMs booting beside
it slow every figure.

Target (issue 17): fresh host <= 1.5 s median on emulated:a100-stock and emulated:a100.
Usage: benchmarks/fresh_host.py [--profile a100-stock --profile a100] [--hosts 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from hilconform.emulators import vm_snapshot
from hilconform.emulators.errors import InfrastructureError
from hilconform.emulators.profile import load_profile
from hilconform.emulators.runtime_config import runtime_config_for
from hilconform.emulators.toolchain import qemu_binary_for, qemu_version
from hilconform.emulators.vm import EmulatedVM
from hilconform.fixtures.fresh_host import start_from_saved, why_booted
from hilconform.fixtures.host import EmulatedHost


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def summary(values: list[float]) -> str:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return (f"median {statistics.median(ordered):.2f} s, p95 {p95:.2f} s, "
            f"spread {ordered[0]:.2f}-{ordered[-1]:.2f} s (n={len(ordered)})")


def fresh_host(profile_name: str, restoring: bool) -> tuple[EmulatedHost, float]:
    """A fresh host as a destructive test gets one; (host, s from request to inventory complete)."""
    profile = load_profile(profile_name)
    requested = time.monotonic()
    host = EmulatedHost(EmulatedVM(profile, runtime_config=runtime_config_for(profile)), name=profile.name)
    if restoring:
        start_from_saved(host)
    else:
        host.vm.start()
    host.settled_inventory(timeout_s=120)
    return host, time.monotonic() - requested


def measure(profile_name: str, hosts: int, restoring: bool) -> list[float]:
    figures = []
    for _ in range(hosts):
        try:
            host, took = fresh_host(profile_name, restoring)
        except InfrastructureError as exc:
            raise SystemExit(f"{profile_name}: a fresh host failed: {exc}") from None
        host.close()
        figures.append(took)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", action="append", help="repeatable (default: a100-stock and a100)")
    parser.add_argument("--hosts", type=int, default=5, help="fresh hosts per way and profile")
    args = parser.parse_args()
    profiles = args.profile or ["a100-stock", "a100"]
    print(f"hilconform fresh-host benchmark, {os.cpu_count()} CPUs, load average {load()} at start")
    for name in profiles:
        qemu = qemu_binary_for(load_profile(name))
        print(f"emulated:{name} (QEMU {qemu_version(qemu)}):")
        booted = measure(name, args.hosts, restoring=False)
        print(f"  by boot:    {summary(booted)}; load average {load()}")
        first, took_first = fresh_host(name, restoring=True)
        first.close()
        key = first.vm.configuration_key()
        saved = vm_snapshot.saved_vms().get(key)
        if saved is None:
            print(f"  by restore: not restorable, a fresh host boots: {why_booted().get(key)}")
            continue
        print(f"  first host of its configuration: boot and save {took_first:.2f} s "
              f"(stream {saved.size_bytes / 2**20:.0f} MiB)")
        restored = measure(name, args.hosts, restoring=True)
        print(f"  by restore: {summary(restored)}; load average {load()}")
        print(f"  median {statistics.median(booted):.2f} s -> {statistics.median(restored):.2f} s")
    print(f"load average {load()} at end")


if __name__ == "__main__":
    main()
