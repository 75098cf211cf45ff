"""RST-03: a device that lost its configuration is detected and FAULTED, never reported HEALTHY.

The fault is a raw secondary bus reset at the port, behind the driver
(faults.lose_config): command register 0, BARs cleared, verified in the guest.
Then, in order:

1. unprompted, the runtime's own periodic checkpoint must move it to FAULTED
   within two `health_poll_ms` periods plus slack (detection latency recorded);
2. `health_poll`, `device` and `inventory` must all say FAULTED, `allocate` is
   refused, and no health transition of the device after the fault leads to HEALTHY;
3. with a second device (when the profile has one): `allocate` right after
   the loss, before any poll noticed, must be refused too (the config_intact
   checkpoint runs before every lease), and the device must end FAULTED.

A fresh VM: the driver's I/O to the device hangs until the config is restored.

The second test walks the clause's other path: the configuration lost while the device is
held, then the lease released (`test_rst03_config_lost_while_allocated_faulted_at_release`).
"""

from __future__ import annotations

import time

import pytest
from reset_support import (
    CALL_TIMEOUT_S,
    EVENT_TIMEOUT_S,
    device_when_settled,
    health_transitions,
    healthy_device,
    subscribe,
)

from hilconform.fixtures.runtime_client import RuntimeCallError

SLACK_S = 5.0
# The release test's own runtime config: a health poll far past the test's length, so no
# periodic checkpoint can look at the device between the loss and the release (see the test).
RELEASE_TEST_POLL_MS = 600_000
LEASE_TTL_S = 120  # no expiry can end the lease before the test releases it


@pytest.mark.clause("RST-03")
@pytest.mark.destructive
@pytest.mark.needs("config-loss")
@pytest.mark.walks("health: HEALTHY > FAULTED")
@pytest.mark.walks("main: INITIALIZED > ERROR")
def test_rst03_lost_config_detected_and_faulted(host, measurements):
    slot, bdf, _record = healthy_device(host, "config-loss")
    runtime = host.runtime
    poll_s = runtime.hello["config"]["health_poll_ms"] / 1000.0
    others = [target for target in host.targets("config-loss") if target != slot]
    for other in others:  # boot self-checks over: a late DISCOVERED -> HEALTHY is not "after the loss"
        device_when_settled(host, host.target_bdf(other))
    mark = subscribe(runtime)

    fault = host.get("config-loss").lose_config(slot)
    faulted = runtime.wait_event(
        "transition", mark, 2 * poll_s + SLACK_S,
        match=lambda d: d["device"] == bdf and d["view"] == "health" and d["to"] == "FAULTED",
        what=f"{bdf} FAULTED after losing its config")
    evidence = faulted["data"].get("checkpoint") or {}
    assert evidence, f"the move to FAULTED carries no evidence: {faulted['data']}"

    result = runtime.call("health_poll", {"device": bdf}, timeout_s=CALL_TIMEOUT_S)["devices"][bdf]
    assert result["state"] == "FAULTED", f"health_poll after the config loss says {result}"
    if "checkpoint" in result:
        assert not result["checkpoint"]["ok"], f"checkpoint passes on a device with no config: {result}"
    record = runtime.call("device", {"device": bdf})
    listed = {d["device"]: d["state"] for d in runtime.call("inventory")["devices"]}
    assert record["state"] == "FAULTED" and listed.get(bdf) == "FAULTED", (
        f"device says {record['state']}, inventory says {listed.get(bdf)}")
    assert not record["in_pool"], record
    path = [(e["data"]["from"], e["data"]["to"], e["data"]["cause"])
            for e in health_transitions(runtime, bdf, mark)]
    assert not any(to == "HEALTHY" for _f, to, _c in path), f"reported HEALTHY after the loss: {path}"
    _allocate_refused(runtime, bdf, fault)

    if others:  # the race: a lease asked for before any poll has noticed
        other_fault = host.get("config-loss").lose_config(others[0])
        other = other_fault.details["bdf"]
        _allocate_refused(runtime, other, other_fault)
        ended = runtime.call("device", {"device": other})
        assert ended["state"] == "FAULTED", f"{other} lost its config; runtime says {ended['state']}"
        path = [(e["data"]["from"], e["data"]["to"], e["data"]["cause"])
                for e in health_transitions(runtime, other, mark)]
        assert not any(to == "HEALTHY" for _f, to, _c in path), f"{other} reported HEALTHY: {path}"

    measurements.record("RST-03", "config_loss_to_faulted", [(faulted["host_ns"] - fault.injected_ns) / 1e6],
                        "ms", budget=(2 * poll_s + SLACK_S) * 1000, budget_stat="max")


def _allocate_refused(runtime, bdf: str, fault) -> None:
    try:
        lease = runtime.call("allocate", {"device": bdf, "holder": "rst03"})
    except RuntimeCallError as exc:
        assert exc.code == "NOT_HEALTHY", f"allocate of {bdf} refused, but with {exc}"
        return
    runtime.call("release", {"lease": lease["lease"]})
    pytest.fail(f"{bdf} lost its config ({fault.details['after']}) and was still allocated: {lease}")


@pytest.mark.clause("RST-03")
@pytest.mark.destructive
@pytest.mark.needs("config-loss")
def test_rst03_config_lost_while_allocated_faulted_at_release(host_factory, measurements, request):
    """Configuration lost while the device is held, then released: RELEASED -> FAULTED, read
    from the device at the release checkpoint, never RELEASED -> HEALTHY from a cached record.

    Why its own test: the first test loses the config of an idle device, which the periodic
    poll judges; a runtime whose release checkpoint answers from what it already knows (the
    checkpoint the device passed when the lease was granted, its state before the lease)
    hands a device with cleared BARs back to the pool as HEALTHY, under the release
    checkpoint's own cause (legal for LIFE-01), and only a loss during a lease shows it.

    Keeping the release checkpoint the judged path: the test's runtime runs with
    `health_poll_ms` RELEASE_TEST_POLL_MS (10 min, a fresh VM of its own), so no periodic
    checkpoint looks at the device between the loss and the release, and the release
    follows the loss (verified in the guest) at once. The last checkpoint the runtime has
    of the device is then the one it passed when the lease was granted (intact): a move out
    of RELEASED to FAULTED can only come from reading the device after the loss, and one
    to HEALTHY is the cached answer the clause forbids. A runtime that catches the loss
    while the device is still held (ALLOCATED -> FAULTED, revoking the lease: legal) has
    walked another conformant path; then the release checkpoint is not reached, and the
    test judges what the clause asks of that path (FAULTED, never HEALTHY, not allocatable),
    saying so in its report (`judged_path`). A runtime that ignores the poll override
    (a real host keeps its deployed config) is judged the same way.
    """
    host = host_factory.fresh(runtime_overrides={"health_poll_ms": RELEASE_TEST_POLL_MS})
    runtime = host.runtime
    slot, bdf, _record = healthy_device(host, "config-loss")
    mark = subscribe(runtime)
    lease = runtime.call("allocate", {"device": bdf, "holder": "rst03-release", "ttl_s": LEASE_TTL_S},
                         timeout_s=CALL_TIMEOUT_S)
    runtime.wait_event("transition", mark, EVENT_TIMEOUT_S, what=f"{bdf} ALLOCATED",
                       match=lambda d: d["device"] == bdf and d["view"] == "health"
                       and d["to"] == "ALLOCATED")
    held_mark = runtime.mark()

    fault = host.get("config-loss").lose_config(slot)  # verified in the guest: BARs cleared
    released_ns = time.monotonic_ns()
    try:
        runtime.call("release", {"lease": lease["lease"]}, timeout_s=CALL_TIMEOUT_S)
        release_error = None
    except RuntimeCallError as exc:  # a runtime that revoked the lease on its own finding
        release_error = exc
    first = runtime.wait_event("transition", held_mark, EVENT_TIMEOUT_S, what=f"{bdf} leaves ALLOCATED",
                               match=lambda d: d["device"] == bdf and d["view"] == "health")["data"]
    if first["to"] != "RELEASED":
        # caught while held (another conformant path): the release checkpoint was not reached
        judged_path = f"{first['from']} -> {first['to']} while held ({first['cause']})"
        assert first["to"] == "FAULTED", (
            f"{bdf} lost its config while held and went {first['from']} -> {first['to']} "
            f"({first['cause']}), not FAULTED")
    else:
        assert release_error is None, f"release of {lease['lease']} refused: {release_error}"
        out = runtime.event_or_none(
            "transition", held_mark, EVENT_TIMEOUT_S,
            match=lambda d: d["device"] == bdf and d["view"] == "health" and d["from"] == "RELEASED")
        assert out is not None, (
            f"{bdf} lost its config while held; {EVENT_TIMEOUT_S:g} s after its release it is still "
            f"RELEASED: the release checkpoint never judged it ({_health_moves(runtime, bdf, mark)})")
        data = out["data"]
        evidence = data.get("checkpoint") or {}
        assert data["to"] != "HEALTHY", (
            f"{bdf} lost its config while held (guest read {fault.details['after']}) and its release "
            f"checkpoint reported it HEALTHY (cause {data['cause']!r}, checkpoint {evidence}): "
            f"an answer from a cached record, not from the device")
        assert data["to"] == "FAULTED", f"{bdf} lost its config; its release checkpoint moved it {data}"
        assert evidence, f"the release checkpoint's move to FAULTED carries no evidence: {data}"
        if "ok" in evidence:
            assert evidence["ok"] is False, f"the checkpoint that FAULTED {bdf} says ok: {evidence}"
        judged_path = f"RELEASED -> FAULTED at the release checkpoint ({data['cause']})"
        measurements.record("RST-03", "release_to_faulted", [(out["host_ns"] - released_ns) / 1e6], "ms")

    record = runtime.call("device", {"device": bdf})
    listed = {d["device"]: d["state"] for d in runtime.call("inventory")["devices"]}
    assert record["state"] == "FAULTED" and listed.get(bdf) == "FAULTED", (
        f"after the release {bdf} says {record['state']}, inventory says {listed.get(bdf)}")
    assert not record["in_pool"], record
    path = _health_moves(runtime, bdf, held_mark)
    assert not any(to == "HEALTHY" for _f, to, _c in path), f"reported HEALTHY after the loss: {path}"
    _allocate_refused(runtime, bdf, fault)
    request.node.user_properties.append(("judged_path", judged_path))
    request.node.add_report_section("call", "RST-03 judged path", judged_path)


def _health_moves(runtime, bdf: str, after: int) -> list[tuple[str, str, str]]:
    return [(e["data"]["from"], e["data"]["to"], e["data"]["cause"])
            for e in health_transitions(runtime, bdf, after)]
