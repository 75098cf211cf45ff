"""DP-06 no flapping: a non-fatal error that the kernel recovers and a requested reset that
completes leave the device Healthy, or (where the runtime's policy takes it out of service
meanwhile) Unhealthy once and Healthy again once: never more than one round trip per fault.

Judged from the stand-in's ListAndWatch records of the resource's IDs from just before the fault
until QUIET_S after the last change once every one is Healthy: each ID's health, consecutive
repeats collapsed, must be [Healthy] or [Healthy, Unhealthy, Healthy] (a message without the ID
counts as Unhealthy), ending Healthy. Every ID is judged, so the test need not know which ID the
plugin gave the faulted device (it once asked Allocate for a PCI address, and skipped a plugin
whose answers name none: a conformant plugin's own IDs are not the harness's business).
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
    poll_until,
    resource_of,
)

pytestmark = [pytest.mark.clause("DP-06"), pytest.mark.destructive, pytest.mark.needs("kubelet-stand-in")]

QUIET_S = 3.0  # no message about the device for this long after the fault: the answer is final
SETTLE_S = 60.0


def _health_courses(kubelet, resource: str, ids: set[str], since_seq: int) -> dict[str, list[str]]:
    """Each ID's health over the resource's ListAndWatch messages since `since_seq`, consecutive
    repeats collapsed (a message without the ID counts as Unhealthy)."""
    courses: dict[str, list[str]] = {i: [] for i in ids}
    for record in kubelet.records(since_seq):
        if record["kind"] == "list_and_watch" and record["resource"] == resource:
            devices = advertised(record)
            for device_id, course in courses.items():
                health = devices.get(device_id, UNHEALTHY)
                if not course or course[-1] != health:
                    course.append(health)
    return courses


def _settled_courses(kubelet, resource: str, ids: set[str], since_seq: int) -> dict[str, list[str]]:
    """Every ID's course once all of them have been Healthy and unchanged for QUIET_S."""
    watched = {"courses": None, "since": time.monotonic()}

    def steady() -> dict[str, list[str]] | None:
        courses = _health_courses(kubelet, resource, ids, since_seq)
        if courses != watched["courses"]:
            watched.update(courses=courses, since=time.monotonic())
            return None
        healthy = all(c and c[-1] == HEALTHY for c in courses.values())
        return courses if healthy and time.monotonic() - watched["since"] >= QUIET_S else None

    return poll_until(steady, SETTLE_S, f"{resource}: every ID Healthy and unchanged for {QUIET_S:g} s",
                      every_s=0.5, error=AssertionError, shown=lambda _: repr(watched["courses"]))


def _judge(courses: dict[str, list[str]], bdf: str, fault: str) -> None:
    """Which ID is the faulted device is the plugin's business (its IDs are its own): every ID,
    the faulted one whichever it is and the others, may make at most one round trip."""
    flapping = {i: c for i, c in courses.items() if c not in ([HEALTHY], [HEALTHY, UNHEALTHY, HEALTHY])}
    assert not flapping, "; ".join(
        f"{fault} of {bdf}: the kubelet saw {i} go {' -> '.join(c)} (at most one round trip)"
        for i, c in sorted(flapping.items()))


def _target_and_ids(host, kubelet, plugin, capability: str):
    listed = listed_healthy(kubelet, plugin)
    target = host.targets(capability)[0]
    bdf = host.target_bdf(target)
    resource = resource_of(plugin, host, bdf)
    return target, bdf, resource.name, set(advertised(listed[resource.name]))


@pytest.mark.needs("aer-nonfatal")
def test_a_recovered_nonfatal_error_is_at_most_one_round_trip(host_factory, device_plugin):
    host = fresh_host(host_factory, device_plugin, None)
    with kubelet_with_plugin(host, device_plugin, booted=True) as (kubelet, plugin):
        target, bdf, resource, ids = _target_and_ids(host, kubelet, plugin, "aer-nonfatal")
        mark = latest_list(kubelet, resource)["seq"] - 1
        host.get("aer-nonfatal").aer_nonfatal(target, wait_recovery=True)
        _judge(_settled_courses(kubelet, resource, ids, mark), bdf, "a recovered non-fatal error")


@pytest.mark.needs("reset")
def test_a_completed_reset_is_at_most_one_round_trip(host_factory, device_plugin):
    host = fresh_host(host_factory, device_plugin, None)
    with kubelet_with_plugin(host, device_plugin, booted=True) as (kubelet, plugin):
        target, bdf, resource, ids = _target_and_ids(host, kubelet, plugin, "reset")
        mark = latest_list(kubelet, resource)["seq"] - 1
        host.get("reset").reset(bdf)
        _judge(_settled_courses(kubelet, resource, ids, mark), bdf, "a completed reset")
