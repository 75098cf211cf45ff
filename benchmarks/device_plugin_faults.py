#!/usr/bin/env python3
"""Device-plugin figures (issue 16): how fast the kubelet hears of a fault, and what the stand-in costs.

  * stand-in cost (this machine, no VM): a plugin sends ListAndWatch messages whose one device
    ID is the send time (time.monotonic_ns()); cost = the stand-in's record ts_ns - that time.
    Target: median <= 5 ms.
  * per fault, the reference front end on an emulated host (fresh ACPI VM, the runtime booted
    with device_plugin = true, the stand-in in the guest): removal without warning -> the
    ListAndWatch message without the device Healthy, and its re-add -> the message listing it
    Healthy again; both from the kernel's uevent (an independent udevadm monitor), the node's
    clock. Median, p95, spread, n.

Prints the load average beside the figures: run it alone (two cores are shared by everything).
Usage: benchmarks/device_plugin_faults.py [--messages 200] [--cycles 10] [--profile a100-stock]
       [--skip-vm]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from hilconform.emulators.kubelet_stand_in.device_manager import KubeletStandIn
from hilconform.emulators.kubelet_stand_in.records import RecordStore
from hilconform.runtime.deviceplugin import grpc_api
from hilconform.runtime.deviceplugin.constants import HEALTHY, KUBELET_SOCKET_NAME, VERSION
from hilconform.runtime.deviceplugin.messages import (
    Device,
    DevicePluginOptions,
    ListAndWatchResponse,
    RegisterRequest,
)

RESOURCE = "bench.example.com/dev"


def spread(values: list[float]) -> str:
    ordered = sorted(values)
    p95 = ordered[max(0, -(-95 * len(ordered) // 100) - 1)]
    return (f"median {statistics.median(values):.2f}  p95 {p95:.2f}  min {min(values):.2f}  "
            f"max {max(values):.2f} ms  n={len(values)}")


class TimestampPlugin:
    """A plugin whose ListAndWatch sends `count` messages, each device ID its own send time."""

    def __init__(self, plugin_dir: str, count: int):
        self.plugin_dir, self.count = plugin_dir, count
        self.sent: list[int] = []

    def GetDevicePluginOptions(self, request, context):
        return DevicePluginOptions()

    def ListAndWatch(self, request, context):
        for _ in range(self.count):
            now = time.monotonic_ns()
            self.sent.append(now)
            yield ListAndWatchResponse(devices=(Device(ID=str(now), health=HEALTHY),))
            time.sleep(0.005)
        while context.is_active():
            time.sleep(0.1)


def stand_in_cost(messages: int) -> list[float]:
    with tempfile.TemporaryDirectory(prefix="dp-bench-") as folder:
        records = RecordStore(per_stream=messages + 10)
        stand_in = KubeletStandIn(folder, records)
        stand_in.start()
        plugin = TimestampPlugin(folder, messages)
        server = grpc_api.serve_unix([grpc_api.device_plugin_handler(plugin)],
                                     os.path.join(folder, "bench.sock"), 4 << 20)
        channel = grpc_api.unix_channel(os.path.join(folder, KUBELET_SOCKET_NAME), 4 << 20)
        try:
            grpc_api.wait_ready(channel, 10, "the stand-in")
            grpc_api.RegistrationClient(channel).register(
                RegisterRequest(version=VERSION, endpoint="bench.sock", resource_name=RESOURCE), timeout=10)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                got = [r for r in records.since(0, messages + 50)[0] if r["kind"] == "list_and_watch"]
                if len(got) >= messages:
                    break
                time.sleep(0.05)
            return [(r["ts_ns"] - int(r["message"]["devices"][0]["ID"])) / 1e6 for r in got]
        finally:
            channel.close()
            stand_in.stop()
            server.stop(0)


def fault_figures(profile_name: str, cycles: int) -> tuple[list[float], list[float]]:
    """(loss ms, return ms) per removal without warning and re-add of one device."""
    from hilconform.emulators.profile import load_profile
    from hilconform.emulators.runtime_config import runtime_config_for
    from hilconform.emulators.vm import EmulatedVM
    from hilconform.fixtures.device_plugin import FRONT_END_ON, ReferenceFrontEnd
    from hilconform.fixtures.host import EmulatedHost
    from hilconform.fixtures.kubelet_node import NodeKubelet
    from hilconform.fixtures.uevent_witness import GuestUeventWitness

    profile = load_profile(profile_name).with_hotplug_mode("acpi")
    vm = EmulatedVM(profile, runtime_config=runtime_config_for(profile, FRONT_END_ON))
    host = EmulatedHost(vm, name=profile.name)
    vm.start()
    kubelet = NodeKubelet(host)
    losses, returns = [], []
    try:
        kubelet.start()
        plugin = ReferenceFrontEnd(host)
        resource = plugin.resources[0].name
        target = host.targets("surprise-removal")[0]
        bdf = host.target_bdf(target)

        def wait(what, match, since):
            def accepted(r):
                return (r["kind"] == "list_and_watch" and r["resource"] == resource
                        and match({d["ID"]: d["health"] for d in r["message"]["devices"]}))
            return kubelet.wait_record(what, accepted, since, 60)

        first = wait("all listed", lambda d: len(d) == len(plugin.managed(plugin.resources[0])), 0)
        ids = set(d["ID"] for d in first["message"]["devices"])
        device_id = target  # QEMU's id of the unit in the slot: the slot's name at boot, then each re-add's
        for _ in range(cycles):
            for action, figures in (("remove", losses), ("add", returns)):
                mark = kubelet.last_seq()
                witness = GuestUeventWitness(host)
                try:
                    if action == "remove":
                        host.get("surprise-removal").remove(device_id)
                        got = wait("the loss",
                                   lambda d: sum(d.get(i) == HEALTHY for i in ids) == len(ids) - 1, mark)
                    else:
                        device_id = host.get("hot-add").hot_add(target).device_id
                        got = wait("the return", lambda d: all(d.get(i) == HEALTHY for i in ids), mark)
                finally:
                    seen = witness.stop()
                kernel = [ms for ms, act, dev in seen if act == action and dev == bdf][-1]
                figures.append(got["ts_ns"] / 1e6 - kernel)
    finally:
        kubelet.stop()
        host.close()
    return losses, returns


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200)
    parser.add_argument("--cycles", type=int, default=10)
    parser.add_argument("--profile", default="a100-stock")
    parser.add_argument("--skip-vm", action="store_true", help="only the stand-in's own cost")
    args = parser.parse_args()
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"stand-in cost (plugin send -> record), this machine: {spread(stand_in_cost(args.messages))}")
    if not args.skip_vm:
        losses, returns = fault_figures(args.profile, args.cycles)
        print(f"emulated:{args.profile} (ACPI), reference front end, kernel uevent -> ListAndWatch record:")
        print(f"  removal without warning -> device not Healthy: {spread(losses)}")
        print(f"  re-add of the same unit -> Healthy again:      {spread(returns)}")
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
