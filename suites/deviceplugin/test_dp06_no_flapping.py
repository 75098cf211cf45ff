"""DP-06 no flapping: a non-fatal error that the kernel recovers and a requested reset that
completes leave the device Healthy, or (where the runtime's policy takes it out of service
meanwhile) Unhealthy once and Healthy again once: never more than one round trip per fault.

Judged from the stand-in's ListAndWatch records of the device's ID from just before the fault
until QUIET_S after its last change once the runtime ended its recovery: the ID's health,
consecutive repeats collapsed, must be [Healthy] or [Healthy, Unhealthy, Healthy] (a message
without the ID counts as Unhealthy), ending Healthy.
"""

from __future__ import annotations

import time

import pytest
from dp_support import (
    HEALTHY,
    UNHEALTHY,
    advertised,
    fresh_host,
    kubelet_with_plugin,
    latest_list,
    listed_healthy,
    resource_of,
)

pytestmark = [pytest.mark.clause("DP-06"), pytest.mark.destructive, pytest.mark.needs("kubelet-stand-in")]

QUIET_S = 3.0  # no message about the device for this long after the fault: the answer is final
SETTLE_S = 60.0


def _health_course(kubelet, resource: str, device_id: str, since_seq: int) -> list[str]:
    course = []
    for record in kubelet.records(since_seq):
        if record["kind"] == "list_and_watch" and record["resource"] == resource:
            health = advertised(record).get(device_id, UNHEALTHY)
            if not course or course[-1] != health:
                course.append(health)
    return course


def _settled_course(kubelet, resource: str, device_id: str, since_seq: int) -> list[str]:
    """The device's health course once it has been Healthy and unchanged for QUIET_S."""
    deadline = time.monotonic() + SETTLE_S
    last, steady_since = None, time.monotonic()
    while time.monotonic() < deadline:
        course = _health_course(kubelet, resource, device_id, since_seq)
        if course != last:
            last, steady_since = course, time.monotonic()
        elif course and course[-1] == HEALTHY and time.monotonic() - steady_since >= QUIET_S:
            return course
        time.sleep(0.5)
    raise AssertionError(f"{device_id} was not Healthy and steady within {SETTLE_S:.0f} s: {last}")


def _judge(course: list[str], device_id: str, fault: str) -> None:
    assert course in ([HEALTHY], [HEALTHY, UNHEALTHY, HEALTHY]), (
        f"{fault}: the kubelet saw {device_id} go {' -> '.join(course)} (at most one round trip)")


def _target_and_id(host, kubelet, plugin, capability: str):
    listed = listed_healthy(kubelet, plugin)
    target = host.targets(capability)[0]
    bdf = host.target_bdf(target)
    resource = resource_of(plugin, host, bdf)
    ids_before = set(advertised(listed[resource.name]))
    return target, bdf, resource.name, ids_before


def _device_id_of(host, kubelet, resource: str, bdf: str, ids: set[str]) -> str:
    """Which advertised ID is the device at `bdf`: the one whose Allocate names its PCI address
    or one of its nodes (asked one ID at a time)."""
    for device_id in sorted(ids):
        answer = kubelet.ask("allocate", {"resource": resource, "containers": [[device_id]]})["response"]
        reply = answer["container_responses"][0]
        if bdf in " ".join(reply["envs"].values()) or any(bdf in a for a in reply["annotations"].values()):
            return device_id
    pytest.skip(f"the plugin's Allocate names no PCI address: cannot tell which ID is {bdf}")


@pytest.mark.needs("aer-nonfatal")
def test_a_recovered_nonfatal_error_is_at_most_one_round_trip(host_factory, device_plugin):
    host = fresh_host(host_factory, device_plugin, None)
    with kubelet_with_plugin(host, device_plugin, booted=True) as (kubelet, plugin):
        target, bdf, resource, ids = _target_and_id(host, kubelet, plugin, "aer-nonfatal")
        device_id = _device_id_of(host, kubelet, resource, bdf, ids)
        mark = latest_list(kubelet, resource)["seq"] - 1
        host.get("aer-nonfatal").aer_nonfatal(target, wait_recovery=True)
        _judge(_settled_course(kubelet, resource, device_id, mark), device_id, "a recovered non-fatal error")


@pytest.mark.needs("reset")
def test_a_completed_reset_is_at_most_one_round_trip(host_factory, device_plugin):
    host = fresh_host(host_factory, device_plugin, None)
    with kubelet_with_plugin(host, device_plugin, booted=True) as (kubelet, plugin):
        target, bdf, resource, ids = _target_and_id(host, kubelet, plugin, "reset")
        device_id = _device_id_of(host, kubelet, resource, bdf, ids)
        mark = latest_list(kubelet, resource)["seq"] - 1
        host.get("reset").reset(bdf)
        _judge(_settled_course(kubelet, resource, device_id, mark), device_id, "a completed reset")
