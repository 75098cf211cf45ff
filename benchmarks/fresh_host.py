#!/usr/bin/env python3
"""Benchmark how long a destructive test waits for a fresh emulated host, and what stands in the
way of restoring a saved one instead of booting (issue 17).

  * fresh host: the request (EmulatedVM.start) -> the runtime's inventory complete, per boot;
    median, p95 and spread of N boots per profile, with the load average before and after
  * migration blockers: on one ready host per profile, QMP `migrate` to a file is tried and what
    QEMU refuses is printed (9p shares mounted in the guest, vfio-user devices, ...), then again
    with the guest's 9p shares unmounted where the guest lets them go

Target (issue 17): fresh host <= 1.5 s median on emulated:a100-stock and emulated:a100.
Run it alone: VMs booting beside it slow every boot.
Usage: benchmarks/fresh_host.py [--profile a100-stock --profile a100] [--boots 5] [--no-probe]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from hilconform.emulators.errors import InfrastructureError, QmpError
from hilconform.emulators.profile import load_profile
from hilconform.emulators.runtime_config import runtime_config_for
from hilconform.emulators.toolchain import qemu_version
from hilconform.emulators.vm import EmulatedVM
from hilconform.fixtures.host import EmulatedHost

SHARES = ("/opt/hilconform/src", "/opt/hilconform/run")  # the guest's 9p mounts (guest-init.sh)


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def summary(values: list[float]) -> str:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return (f"median {statistics.median(ordered):.2f} s, p95 {p95:.2f} s, "
            f"spread {ordered[0]:.2f}-{ordered[-1]:.2f} s (n={len(ordered)})")


def fresh_host(profile_name: str) -> tuple[EmulatedHost, float, float]:
    """A host booted as a destructive test gets one; (host, s to guest ready, s to inventory)."""
    profile = load_profile(profile_name)
    requested = time.monotonic()
    vm = EmulatedVM(profile, runtime_config=runtime_config_for(profile)).start()
    ready = time.monotonic() - requested
    host = EmulatedHost(vm, name=profile.name)
    host.settled_inventory(timeout_s=120)
    return host, ready, time.monotonic() - requested


def try_migration(host: EmulatedHost, target: Path) -> str:
    """`migrate` to a file: QEMU's refusal, or how the migration ended."""
    qmp = host.vm.qmp
    try:
        qmp.execute("migrate", {"uri": f"exec:cat > {target}"}, timeout_s=30)
    except QmpError as exc:
        return f"refused: {exc}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        status = qmp.execute("query-migrate", timeout_s=10)
        if status.get("status") in ("completed", "failed", "cancelled"):
            size = target.stat().st_size if target.exists() else 0
            return f"{status['status']} {status.get('error-desc', '')} ({size / 2**20:.0f} MiB)".strip()
        time.sleep(0.2)
    return "still running after 60 s"


def probe(profile_name: str) -> None:
    host, _, _ = fresh_host(profile_name)
    try:
        with tempfile.TemporaryDirectory(prefix="hilc-migrate-") as folder:
            print(f"  {profile_name}: migrate as booted: {try_migration(host, Path(folder) / 'a')}")
            left = []
            for share in SHARES:
                done = host.shell(f"umount {share} 2>&1 || umount -l {share} 2>&1; mountpoint -q {share} "
                                  "&& echo still-mounted || echo unmounted", timeout_s=30)
                words = done.stdout.split()
                left.append(f"{share}: {words[-1] if words else '?'}")
            print(f"  {profile_name}: guest shares: {'; '.join(left)}")
            print(f"  {profile_name}: migrate with them unmounted: {try_migration(host, Path(folder) / 'b')}")
    finally:
        host.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", action="append", help="repeatable (default: a100-stock and a100)")
    parser.add_argument("--boots", type=int, default=5)
    parser.add_argument("--no-probe", action="store_true", help="skip the migration probe")
    args = parser.parse_args()
    profiles = args.profile or ["a100-stock", "a100"]
    print(f"hilconform fresh-host benchmark, QEMU {qemu_version()}, {os.cpu_count()} CPUs, "
          f"load average {load()} at start")
    for name in profiles:
        ready, inventory = [], []
        for _ in range(args.boots):
            try:
                host, to_ready, to_inventory = fresh_host(name)
            except InfrastructureError as exc:
                raise SystemExit(f"{name}: a boot failed: {exc}") from None
            host.close()
            ready.append(to_ready)
            inventory.append(to_inventory)
        print(f"emulated:{name} fresh host by boot (request -> runtime inventory complete): "
              f"{summary(inventory)}; guest ready {summary(ready)}; load average {load()}")
    if not args.no_probe:
        print("migration to a file (the restore path a snapshot design would take):")
        for name in profiles:
            probe(name)
    print(f"load average {load()} at end")


if __name__ == "__main__":
    main()
