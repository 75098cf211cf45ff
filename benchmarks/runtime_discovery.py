#!/usr/bin/env python3
"""Benchmark the reference runtime in the emulated guest and print the figures.

  * hot-add overhead: the runtime's `discovered` event time minus the raw udev
    event time for the same add (both guest CLOCK_MONOTONIC; the raw time is
    what `udevadm monitor` prints), over N adds. Goal: median <= 20 ms.
  * hot-add latency seen from the host: device_add returned -> event received.
  * cold discovery: runtime start -> inventory complete, for the largest
    profile (a100), over several boots.
  * the runtime's resident memory (goal <= 40 MB).

Adds use ACPI hot-plug by default (removal takes ~0.1 s instead of pciehp's
6 s blink); `--mode native` measures the native path.
Usage: benchmarks/runtime_discovery.py [--adds 10] [--boots 3] [--mode acpi]
"""

from __future__ import annotations

import argparse
import re
import statistics

from hilconform.emulators.profile import load_profile
from hilconform.emulators.runtime_config import runtime_config_for
from hilconform.emulators.vm import EmulatedVM
from hilconform.fixtures.host import EmulatedHost

UDEV_MONITOR_LOG = "/run/hilconform/udev-monitor.log"
_MONITOR_LINE = re.compile(r"^UDEV\s+\[(\d+\.\d+)\]\s+add\s+\S+/([0-9a-f:.]+)\s+\(pci\)")


def figures(values: list[float]) -> str:
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return (f"median {statistics.median(values):.1f}  min {ordered[0]:.1f}  p95 {p95:.1f}  "
            f"max {ordered[-1]:.1f}  n={len(values)}")


def start_host(profile_name: str, mode: str | None = None) -> EmulatedHost:
    profile = load_profile(profile_name)
    if mode:
        profile = profile.with_hotplug_mode(mode)
    vm = EmulatedVM(profile, runtime_config=runtime_config_for(profile)).start()
    return EmulatedHost(vm, name=profile.name)


def udev_add_times(host: EmulatedHost) -> dict[str, list[float]]:
    """bdf -> guest monotonic seconds of each raw udev `add` event, in order."""
    text = host.vm.agent.read_file(UDEV_MONITOR_LOG).decode(errors="replace")
    times: dict[str, list[float]] = {}
    for line in text.splitlines():
        match = _MONITOR_LINE.match(line)
        if match:
            times.setdefault(match.group(2), []).append(float(match.group(1)))
    return times


def measure_hot_adds(adds: int, mode: str) -> None:
    host = start_host("a100-stock", mode)
    try:
        runtime = host.runtime
        runtime.call("subscribe", {})
        host.shell(f"setsid stdbuf -oL udevadm monitor --udev --subsystem-match=pci "
                   f"> {UDEV_MONITOR_LOG} 2>&1 < /dev/null &"
                   # its banner says it is subscribed; wait for it (5 s deadline)
                   f"for i in $(seq 50); do grep -q '^UDEV - ' {UDEV_MONITOR_LOG} && exit 0; "
                   "sleep 0.1; done; exit 1").check()
        slot = next(s for s in host.profile.slots if not s.populated)
        events, host_latency = [], []
        for i in range(adds):
            mark = runtime.mark()
            added = host.get("hot-add").hot_add(slot.name, device_id=f"bench{i}")
            event = runtime.wait_event("discovered", mark, timeout_s=20,
                                       match=lambda d, bdf=added.bdf: d["device"] == bdf)
            events.append((added.bdf, event["ts_ns"], event["data"].get("udev_received_ns")))
            host_latency.append((event["host_ns"] - added.returned_ns) / 1e6)
            host.get("hot-add").remove(added.device_id)
        raw = udev_add_times(host)
        if any(len(raw.get(bdf, [])) < adds for bdf, *_ in events):
            raise SystemExit(f"udev monitor saw {raw}, expected {adds} adds")
        overhead, receipt, processing = [], [], []
        for index, (bdf, ts_ns, received_ns) in enumerate(events):
            overhead.append(ts_ns / 1e6 - raw[bdf][index] * 1e3)
            if received_ns:
                receipt.append(received_ns / 1e6 - raw[bdf][index] * 1e3)
                processing.append((ts_ns - received_ns) / 1e6)
        rss_kb = runtime.call("stats")["rss_kb"]
        print(f"hot-add ({mode}) runtime event minus raw udev event (ms): {figures(overhead)}")
        if receipt:
            print(f"  of which: udev event -> runtime read it (ms): {figures(receipt)}")
            print(f"  of which: runtime read it -> discovered event (ms): {figures(processing)}")
        print(f"hot-add ({mode}) device_add returned -> runtime event on host (ms): "
              f"{figures(host_latency)}")
        print(f"runtime resident memory after {adds} add/remove cycles: {rss_kb / 1024:.1f} MiB")
    finally:
        host.close()


def measure_cold_discovery(boots: int) -> None:
    durations, rss = [], []
    for _ in range(boots):
        host = start_host("a100-stock")
        try:
            runtime = host.runtime
            mark = runtime.mark()
            runtime.call("subscribe", {"since_seq": 0})
            event = runtime.wait_event("inventory_complete", mark, timeout_s=30)
            durations.append(float(event["data"]["duration_ms"]))
            rss.append(runtime.call("stats")["rss_kb"] / 1024)
        finally:
            host.close()
    print(f"cold discovery, a100 (runtime start -> inventory complete, ms): {figures(durations)}")
    print(f"runtime resident memory after cold discovery (MiB): {figures(rss)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--adds", type=int, default=10)
    parser.add_argument("--boots", type=int, default=3)
    parser.add_argument("--mode", choices=("acpi", "native"), default="acpi")
    args = parser.parse_args()
    measure_cold_discovery(args.boots)
    measure_hot_adds(args.adds, args.mode)


if __name__ == "__main__":
    main()
