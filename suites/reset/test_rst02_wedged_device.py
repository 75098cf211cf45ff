"""RST-02: a wedged device is reset when its drain times out; a reset over budget FAULTs it.

The device's command queue is stalled and the runtime is asked to `remove` it:
the drain must give up at `drain_timeout_ms` and escalate to a forced reset
(source `drain_timeout`), and that reset must not come back within its budget.

Precondition (the test bed's; fixtures/preconditions.py): the queue stuck until the drain
gave up, and the reset kept from completing past its budget. Each fault is held from the
runtime's own act, not from the stall (a fixed 4 s from the stall raced a removal that
began late):
* a device model (vfio-user): its queue sticks (completions stop) until the runtime's
  drain has ended; its `reset-not-ready` knob keeps the card not ready for
  NOT_READY_AFTER_FLR_S after the runtime's FLR, so the guest kernel's reset waits ("not
  ready ... after FLR; waiting"), as it does for a wedged real card; nothing else in the VM
  stops;
* an nvme stand-in: its NBD backend is SIGSTOPped with a read in flight, and resetting an
  nvme whose request is stuck freezes the whole VM until the backend answers (no event can
  come meanwhile), so the backend answers HOLD_PAST_RESET_S after the runtime's `reset
  started` step reached the host.
The runtime's reset budget is shortened to RESET_TIMEOUT_MS (runtime_overrides): with the
default 5000 ms the stall would have to outlast 5 s of frozen VM. The reset therefore cannot
complete within its budget, and the device must be FAULTED (cause `*:reset_timeout`)
before it leaves, and never reported HEALTHY.
"""

from __future__ import annotations

import pytest
from reset_support import (
    CALL_TIMEOUT_S,
    EVENT_TIMEOUT_S,
    health_transitions,
    healthy_device,
    steps,
    subscribe,
)

from hilconform.fixtures.preconditions import after

RESET_TIMEOUT_MS = 1000
NOT_READY_AFTER_FLR_S = 4.0  # a model card's not-ready time after the runtime's own FLR
HOLD_PAST_RESET_S = 3 * RESET_TIMEOUT_MS / 1000  # an nvme's stuck read, after the reset's start
HOLD_DEADLINE_S = 30.0


@pytest.mark.clause("RST-02")
@pytest.mark.destructive
@pytest.mark.slow
@pytest.mark.needs("queue-stall")
def test_rst02_wedged_device_reset_on_drain_timeout_faulted_over_budget(host_factory, measurements,
                                                                        preconditions):
    host = host_factory.fresh(runtime_overrides={"reset_timeout_ms": RESET_TIMEOUT_MS})
    runtime = host.runtime
    config = runtime.hello["config"]
    assert config["reset_timeout_ms"] == RESET_TIMEOUT_MS, f"runtime ignored the override: {config}"
    slot, bdf, _record = healthy_device(host, "queue-stall")
    mark = subscribe(runtime)

    model = "reset-not-ready" in host.target_capabilities(slot)
    if model:
        host.get("reset-not-ready").delay_reset_ready(slot, NOT_READY_AFTER_FLR_S)
    stall = host.get("queue-stall").stall_queue(slot)
    try:
        match, release, release_on = _release_point(bdf, stall, model)
        hold = preconditions.hold("queue_stuck_reset_held", "the queue stuck until the drain gave up "
                                  "and the reset kept past its budget", runtime, "procedure", mark, match,
                                  release_on, release, HOLD_DEADLINE_S, held_from_ns=stall.record.injected_ns)
        result = runtime.call("remove", {"device": bdf},
                              timeout_s=HOLD_DEADLINE_S + HOLD_PAST_RESET_S + 2 * CALL_TIMEOUT_S)
        held = hold.wait(HOLD_DEADLINE_S + HOLD_PAST_RESET_S + EVENT_TIMEOUT_S)
    finally:
        stall.resume()  # idempotent: a failed call never leaves the backend stopped
    preconditions.met(held, f"released by {held.released_by} after {held.held_ms} ms"
                      + ("" if held.by_event else f": the runtime had {HOLD_DEADLINE_S:g} s"))

    run = [e["data"] for e in steps(runtime, bdf, mark, "hot_remove")]
    order = [(s["step"], s["status"]) for s in run]
    drain = next((s for s in run if s["step"] == "drain" and s["status"] != "started"), None)
    assert drain is not None and drain["status"] == "timeout", (
        f"the queue of {bdf} was stuck; its drain should time out, steps: {order}")
    reset_started = next((s for s in run if s["step"] == "reset" and s["status"] == "started"), None)
    assert reset_started is not None and run.index(reset_started) > run.index(drain), (
        f"no forced reset after the drain timed out: {order}")
    reset_done = next((s for s in run if s["step"] == "reset" and s["status"] != "started"), None)
    assert reset_done is not None and reset_done["status"] == "timeout", (
        f"the reset of the wedged {bdf} was held past its {RESET_TIMEOUT_MS} ms "
        f"budget and should have timed out: {reset_done}")
    assert result.get("reset", {}).get("outcome") == "timeout", f"remove's reply: {result}"

    recorded = [e["data"] for e in runtime.events(mark, "reset")
                if e["data"]["device"] == bdf and e["data"].get("source") == "drain_timeout"]
    assert recorded and recorded[0]["outcome"] == "timeout", f"reset events: {recorded}"

    moves = health_transitions(runtime, bdf, mark)
    path = [(e["data"]["from"], e["data"]["to"], e["data"]["cause"]) for e in moves]
    faulted = next((e for e in moves if e["data"]["to"] == "FAULTED"), None)
    assert faulted is not None, f"the reset overran its budget but {bdf} was never FAULTED: {path}"
    assert "reset_timeout" in faulted["data"]["cause"], f"FAULTED for another reason: {path}"
    removed = [e for e in moves if e["data"]["to"] == "REMOVED"]
    assert not removed or removed[0]["seq"] > faulted["seq"], f"removed before FAULTED: {path}"
    assert not any(e["data"]["to"] == "HEALTHY" for e in moves), f"reported HEALTHY: {path}"
    waited_ms = (faulted["data"]["ts_ns"] - reset_started["ts_ns"]) / 1e6
    assert waited_ms >= RESET_TIMEOUT_MS * 0.95, (
        f"FAULTED {waited_ms:.0f} ms after the reset started: before its {RESET_TIMEOUT_MS} ms budget")

    # The late outcome (`reset` event with late: true) is not awaited: on an nvme, with bus
    # mastering cleared before the drain, the stuck read's completion cannot be posted after
    # the backend answers, so the reset only ends with the nvme driver's 30 s I/O timeout.
    measurements.record("RST-02", "reset_started_to_faulted_guest_clock", [waited_ms], "ms")


def _release_point(bdf: str, stall, model: bool):
    """(event match, release, in words): a model's queue is let go when its drain has ended (the
    not-ready card holds the reset); an nvme's stuck read only HOLD_PAST_RESET_S after the
    reset's start (it freezes the VM: no later event can arrive before it is let go)."""
    if model:
        return (lambda d: (d.get("device") == bdf and d.get("procedure") == "hot_remove"
                           and d.get("step") == "drain" and d.get("status") != "started"),
                stall.resume, "the end of the drain (the card then stays not ready after the FLR)")
    return (lambda d: (d.get("device") == bdf and d.get("procedure") == "hot_remove"
                       and d.get("step") == "reset" and d.get("status") == "started"),
            after(HOLD_PAST_RESET_S, stall.resume), f"the reset's start, then {HOLD_PAST_RESET_S:g} s")
