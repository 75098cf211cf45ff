"""Helpers of the DP suite: what the kubelet stand-in was told, read from its records.

A ListAndWatch record carries the whole device set the plugin advertised (`message.devices`:
ID, health, topology), the node's `ts_ns` when it arrived, and the resource. Nothing here
knows how a plugin names its devices: the suite judges only what reached the kubelet.
"""

from __future__ import annotations

import time

from hilconform.fixtures.config_evidence import config_lost  # noqa: F401 (the DP tests import it)
from hilconform.fixtures.device_plugin import (  # noqa: F401 (the DP tests import them)
    kubelet_with_plugin,
    running_kubelet,
)
from hilconform.fixtures.host_protocol import budget  # noqa: F401 (the DP tests import it from here)
from hilconform.fixtures.node_clock import node_monotonic_ns_now
from hilconform.fixtures.plugin_ties import how_tied, ids_of, named, plugin_ties
from hilconform.fixtures.runtime_waits import poll_until  # noqa: F401 (the DP tests import it from here)
from hilconform.fixtures.uevent_witness import GuestUeventWitness

HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"
SETTLE_S = 60.0  # how long a plugin may take to register and list at all (budgets judge the figures)


def answer_window_s(limit_ms: float) -> float:
    """How long a test waits for the kubelet to hear of a change whose time a budget of
    `limit_ms` judges: the budget, a fifth more and 2 s. A late answer inside it is still
    measured (and fails the budget, its figure in the report); past it, no answer came (a failure
    too). Past the budget the verdict is fixed, so a longer wait only delays it: a plugin that
    never answers DP-08's 10 s budget costs 14 s (it cost 25 s at twice the budget and 5 s)."""
    return 1.2 * limit_ms / 1000 + 2


def advertised(record: dict) -> dict[str, str]:
    """ID -> health of one ListAndWatch record."""
    return {d["ID"]: d["health"] for d in record["message"]["devices"]}


def wait_list(kubelet, resource: str, since_seq: int, match, timeout_s: float, what: str) -> dict:
    """The first ListAndWatch record of `resource` after `since_seq` whose device set
    (`advertised`) `match` accepts."""
    return kubelet.wait_record(
        f"ListAndWatch message of {resource} with {what}",
        lambda r: r["kind"] == "list_and_watch" and r["resource"] == resource and match(advertised(r)),
        since_seq, timeout_s)


def all_healthy(count: int):
    return lambda devices: len(devices) == count and set(devices.values()) == {HEALTHY}


def ms_after(record: dict, start_ns: int) -> float:
    return (record["ts_ns"] - start_ns) / 1e6


def listed_healthy(kubelet, plugin, since_seq: int = 0) -> dict[str, dict]:
    """Each resource's first message after `since_seq` listing all of its managed devices Healthy
    (resource -> record)."""
    found = {}
    for resource in plugin.resources:
        count = len(plugin.managed(resource))
        found[resource.name] = wait_list(kubelet, resource.name, since_seq, all_healthy(count), SETTLE_S,
                                         f"its {count} managed devices all Healthy")
    return found


def latest_list(kubelet, resource: str) -> dict:
    lists = [r for r in kubelet.records(0) if r["kind"] == "list_and_watch" and r["resource"] == resource]
    if not lists:
        raise AssertionError(f"no ListAndWatch message of {resource} at all")
    return lists[-1]


def topologies(record: dict) -> dict[str, object]:
    """ID -> the topology a ListAndWatch record gives it (None where it gives none)."""
    return {d["ID"]: d.get("topology") for d in record["message"]["devices"]}


class LostDevice:
    """Which of `before`'s Healthy IDs stand for the device at `bdf` and which for the others,
    by what the plugin itself says (fixtures/plugin_ties.py: Allocate's device nodes,
    environment, CDI names, topology), asked of the plugin before the fault (Allocate refuses
    Unhealthy IDs). DP-03: every ID tied to the lost device goes Unhealthy or is dropped, every
    other one of `before`'s Healthy IDs stays listed Healthy. Only `before`'s Healthy IDs are
    judged: a device lost earlier may stay listed Unhealthy or be dropped (found with a plugin
    that keeps lost devices Unhealthy, which a count of Healthy IDs had failed); IDs new since
    `before` are not judged here."""

    def __init__(self, host, kubelet, plugin, resource, bdf: str, before_record: dict):
        self.bdf, self.resource = bdf, resource.name
        before = advertised(before_record)
        healthy = sorted(i for i, health in before.items() if health == HEALTHY)
        self.ties = plugin_ties(host, kubelet, resource.name, healthy, topologies(before_record),
                                plugin.managed(resource))
        self.lost = ids_of(self.ties, bdf)
        self.others = set(healthy) - self.lost
        assert self.lost, (f"{resource.name}: none of the Healthy IDs stands for the device at {bdf} by what "
                           f"the plugin says of them ({named(self.ties, healthy)}): its loss cannot be "
                           "reported")

    def match(self, devices: dict[str, str]) -> bool:
        return (all(devices.get(i) != HEALTHY for i in self.lost)
                and all(devices.get(i) == HEALTHY for i in self.others))

    def wrongly_lost(self, devices: dict[str, str]) -> set[str]:
        return {i for i in self.others if devices.get(i) != HEALTHY}

    def describe(self) -> str:
        return (f"the device at {self.bdf} ({named(self.ties, self.lost)}) gone or Unhealthy "
                "and the others Healthy")

    def await_loss(self, kubelet, since_seq: int, timeout_s: float, why: str = "") -> dict:
        """The first ListAndWatch record after `since_seq` in which exactly the lost device's IDs
        are gone or Unhealthy; every record before it listed the other devices Healthy ("stay
        Healthy"). A failure names the IDs the plugin took out instead and the IDs it kept."""
        what = self.describe() + (f" ({why})" if why else "")
        try:
            found = wait_list(kubelet, self.resource, since_seq, self.match, timeout_s, what)
        except AssertionError as missed:
            lists = [r for r in kubelet.records(since_seq)
                     if r["kind"] == "list_and_watch" and r["resource"] == self.resource]
            last = advertised(lists[-1]) if lists else None
            if last is None:
                raise
            wrong = set().union(*(self.wrongly_lost(advertised(r)) for r in lists))
            kept = {i for i in self.lost if last.get(i) == HEALTHY}
            raise AssertionError(
                f"{self.resource}: the device lost is at {self.bdf}, which the plugin ties to "
                f"{named(self.ties, self.lost)}; in {timeout_s:.1f} s it reported "
                f"{named(self.ties, wrong)} of other devices gone or Unhealthy and kept "
                f"{named(self.ties, kept)} of the lost one Healthy (tied by what the plugin said: "
                f"{how_tied(self.ties, self.lost | wrong)}) ({missed})") from None
        for record in kubelet.records(since_seq):
            if record["seq"] >= found["seq"]:
                break
            if record["kind"] == "list_and_watch" and record["resource"] == self.resource:
                wrong = self.wrongly_lost(advertised(record))
                assert not wrong, (
                    f"{self.resource}: the device lost is at {self.bdf} ({named(self.ties, self.lost)}), but "
                    f"the plugin reported {named(self.ties, wrong)} of other devices gone or Unhealthy "
                    f"on the way (record {record['seq']}; they were to stay listed Healthy)")
        return found


def healthy_ids(record_or_devices: dict) -> set[str]:
    """The IDs a ListAndWatch record (or its `advertised` set) lists Healthy."""
    devices = advertised(record_or_devices) if "message" in record_or_devices else record_or_devices
    return {i for i, health in devices.items() if health == HEALTHY}


def kernel_event_ms(seen: list, action: str, bdf: str) -> float:
    """The node's-clock time (ms) the witness saw the kernel's `action` uevent of `bdf`."""
    times = [ms for ms, act, dev in seen if act == action and dev == bdf]
    if not times:
        raise AssertionError(f"the uevent witness saw no kernel {action} of {bdf}: {seen}")
    return times[-1]


def resource_of(plugin, host, bdf: str):
    """The plugin's resource whose model the device at `bdf` is."""
    ids = {fn.bdf: fn.ids for fn in host.ground_truth()}.get(bdf)
    for resource in plugin.resources:
        if ids in resource.device_ids:
            return resource
    raise AssertionError(f"{bdf} ({ids}) belongs to no resource the plugin serves")


def await_departure(departures, bdf: str, timeout_s: float = 30.0) -> None:
    """Until the host reports `bdf` gone (`departures`: the hot-plug capability's watch, made
    before the removal; an orderly removal ends with the slot powered off)."""
    if departures.wait_gone(bdf, timeout_s) is None:
        raise AssertionError(f"{bdf} still on the host {timeout_s:.0f} s after its removal")


def fresh_host(host_factory, device_plugin, hotplug_mode: str | None):
    """A host in its starting state for the plugin under test: an emulated one started with the
    kubelet stand-in on its node and the reference front end on from the start (nothing for a
    command plugin, which the test starts); a real host put back after the test
    (HostFactory.fresh)."""
    overrides = device_plugin.boot_overrides if device_plugin is not None else None
    return host_factory.fresh(hotplug_mode=hotplug_mode, runtime_overrides=overrides, kubelet_stand_in=True)


def remove_and_await_loss(host, kubelet, plugin, target: str, capability: str, timeout_s: float,
                          wait_departure: bool = False) -> tuple[str, dict, float]:
    """Remove `target`'s device through `capability` while the uevent witness watches; its
    resource, the ListAndWatch record of the loss (exactly it gone or Unhealthy, the others still
    Healthy) and the node's-clock ms of the kernel's `remove` uevent. `wait_departure`: also until
    the node no longer has the device, before the witness stops."""
    bdf = host.target_bdf(target)
    hot_plug = host.get(capability)
    departures = hot_plug.departures()
    witness = GuestUeventWitness(host)
    try:
        resource, lost, _record = _fault_and_await_loss(host, kubelet, plugin, bdf,
                                                        lambda: hot_plug.remove(target), timeout_s)
        if wait_departure:
            await_departure(departures, bdf)
    finally:
        seen = witness.stop()
    return resource, lost, kernel_event_ms(seen, "remove", bdf)


def fault_and_await_loss(host, kubelet, plugin, target: str, inject, timeout_s: float,
                         out_of_service=None) -> tuple[str, dict, float] | None:
    """`inject()` a fault that leaves `target`'s device on the bus (lost configuration, fallen off
    the bus, a fatal error) and returns its record: the resource, the ListAndWatch record of the
    loss and when the fault was requested on the node's clock in ms (no uevent marks such a fault).
    The controller's clock is mapped onto the node's by one read of it just before; the mapping
    errs early (the figure is never less than the truth), so the fault's own checks before and
    after the change do not count.

    `out_of_service(record)`: for a fault whose outcome the node decides (the kernel may recover a
    device from a fatal error), the node's evidence that the device is out of service ("" when it
    came back intact: None is returned, there is no loss to judge)."""
    bdf = host.target_bdf(target)
    node_ns = node_monotonic_ns_now(host)
    node_offset_ns = node_ns - time.monotonic_ns()  # read at or before now: an early start
    found = _fault_and_await_loss(host, kubelet, plugin, bdf, inject, timeout_s, out_of_service)
    if found is None:
        return None
    resource, lost, record = found
    return resource, lost, (record.requested_ns + node_offset_ns) / 1e6


def _fault_and_await_loss(host, kubelet, plugin, bdf: str, inject, timeout_s: float,
                          out_of_service=None) -> tuple[str, dict, object] | None:
    resource = resource_of(plugin, host, bdf)
    device = LostDevice(host, kubelet, plugin, resource, bdf, latest_list(kubelet, resource.name))
    mark = kubelet.last_seq()
    record = inject()
    why = ""
    if out_of_service is not None:
        why = out_of_service(record)
        if not why:
            return None
    lost = device.await_loss(kubelet, mark, timeout_s, why)
    return resource.name, lost, record
