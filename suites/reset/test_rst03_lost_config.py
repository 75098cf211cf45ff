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
"""

from __future__ import annotations

import pytest
from reset_support import (
    CALL_TIMEOUT_S,
    device_when_settled,
    health_transitions,
    healthy_device,
    subscribe,
)

from hilconform.fixtures.runtime_client import RuntimeCallError

SLACK_S = 5.0


@pytest.mark.clause("RST-03")
@pytest.mark.destructive
@pytest.mark.needs("config-loss")
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
