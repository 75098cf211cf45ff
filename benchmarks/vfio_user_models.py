#!/usr/bin/env python3
"""Benchmark the vfio-user device models against QEMU's stock devices and print the figures.

  * register access cost: host-side round trip of one 4-byte read through the model server
    (the small client, no QEMU); a guest's 32-bit loads through sysfs resource0 of a model's
    BAR0 (served over the socket), of its memfd-mapped BAR1, and of a stock nvme's BAR0
    (QEMU-emulated MMIO), each as N runs of COUNT loads (ns per load; the guest's Python loop
    under TCG is part of every figure, the memfd BAR shows how much)
  * QEMU start -> guest ready: the stock a100 host on the system QEMU, the same host on the
    vfio-user QEMU, and the a100 host (two A100 models) on the vfio-user QEMU

Every figure: median, min, max and n. Usage:
  benchmarks/vfio_user_models.py [--runs 20] [--boots 20] [--count 200] [--skip-boot]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from hilconform.emulators.profile import load_profile
from hilconform.emulators.toolchain import qemu_binary, qemu_version, vfio_user_qemu_binary
from hilconform.emulators.vfio_user import guest_bar
from hilconform.emulators.vfio_user.client import VfioUserClient
from hilconform.emulators.vfio_user.device import ModelDevice
from hilconform.emulators.vfio_user.model import load_model
from hilconform.emulators.vfio_user.registers import register_map
from hilconform.emulators.vfio_user.server import ModelServer
from hilconform.emulators.vm import EmulatedVM

R = register_map()
GUEST_BAR = Path(guest_bar.__file__).read_bytes()
MODEL_HOST = "a100"
NVME_CSTS = 0x1C


def spread(values: list[float], unit: str) -> str:
    return (f"median {statistics.median(values):.1f} {unit}  min {min(values):.1f}  "
            f"max {max(values):.1f}  n={len(values)}")


def host_round_trips(runs: int, count: int) -> list[float]:
    """µs per 4-byte register read, client -> model server -> client, per run."""
    with tempfile.TemporaryDirectory(prefix="vu-bench-") as folder:
        server = ModelServer(ModelDevice(load_model("a100-sxm4"), "bench"), Path(folder) / "s.sock").start()
        try:
            with VfioUserClient(server.socket_path) as client:
                client.version()
                client.write(7, 0x04, b"\x02\x00")  # memory decoding on, as a guest would
                per_run = []
                for _ in range(runs):
                    started = time.perf_counter_ns()
                    for _ in range(count):
                        client.read32(0, R["scratch"])
                    per_run.append((time.perf_counter_ns() - started) / count / 1000)
                return per_run
        finally:
            server.stop()


def guest_loads(vm, bdf: str, offset: int, bar: int, runs: int, count: int) -> list[float]:
    """µs per 32-bit guest load (sysfs resource mapping), per run."""
    values = []
    for _ in range(runs):
        result = vm.agent.run(["python3", "-", bdf, "time", hex(offset), str(count), str(bar)],
                              stdin=GUEST_BAR, timeout_s=120)
        result.check()
        values.append(float(result.stdout) / 1000)
    return values


def first_bdf(vm, ids: str) -> str:
    out = vm.agent.run(["lspci", "-D", "-n", "-d", ids]).check().stdout.split()
    if not out:
        raise SystemExit(f"no {ids} device in the guest")
    return out[0]


def boots(profile, binary: str, count: int) -> list[float]:
    ready = []
    for _ in range(count):
        vm = EmulatedVM(profile)
        vm.qemu_binary = binary
        vm.qemu_version = qemu_version(binary)
        with vm:
            ready.append(vm.timings["guest_ready_s"])
    return ready


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="runs per register figure")
    parser.add_argument("--count", type=int, default=200, help="loads per run")
    parser.add_argument("--boots", type=int, default=20, help="boots per guest-ready figure")
    parser.add_argument("--skip-boot", action="store_true")
    args = parser.parse_args()
    system, vfio_user = qemu_binary(), vfio_user_qemu_binary()
    print(f"system QEMU {qemu_version(system)}; vfio-user QEMU {qemu_version(vfio_user)} ({vfio_user}); TCG")

    print("register access cost")
    print(f"  host round trip, model server (µs/read): {spread(host_round_trips(args.runs, 2000), 'µs')}")
    with EmulatedVM(load_profile(MODEL_HOST)) as vm:
        bdf = first_bdf(vm, "10de:20b0")
        print(f"  guest load, model BAR0 over the socket (µs): "
              f"{spread(guest_loads(vm, bdf, R['scratch'], 0, args.runs, args.count), 'µs')}")
        print(f"  guest load, model BAR1 memfd-mapped (µs):   "
              f"{spread(guest_loads(vm, bdf, 0, 1, args.runs, args.count), 'µs')}")
    with EmulatedVM(load_profile("a100-stock")) as vm:
        bdf = first_bdf(vm, "1b36:0010")
        # A driver-claimed BAR cannot be mapped from user space (IO_STRICT_DEVMEM): unbind nvme.
        vm.agent.shell(f"echo {bdf} > /sys/bus/pci/devices/{bdf}/driver/unbind").check()
        print(f"  guest load, stock nvme BAR0 (QEMU MMIO) (µs): "
              f"{spread(guest_loads(vm, bdf, NVME_CSTS, 0, args.runs, args.count), 'µs')}")

    if args.skip_boot:
        return
    print("QEMU start -> guest ready")
    stock = load_profile("a100-stock")
    print(f"  stock a100 (4 nvme), QEMU {qemu_version(system)} (s): "
          f"{spread(boots(stock, system, args.boots), 's')}")
    print(f"  stock a100 (4 nvme), QEMU {qemu_version(vfio_user)} (s): "
          f"{spread(boots(stock, vfio_user, args.boots), 's')}")
    models = load_profile(MODEL_HOST)
    print(f"  a100 (2 A100 models), QEMU {qemu_version(vfio_user)} (s): "
          f"{spread(boots(models, vfio_user, args.boots), 's')}")


if __name__ == "__main__":
    main()
