"""HP-03 stuck queue: the drain gives up at its timeout and escalates to a forced reset
instead of waiting; the reset's outcome is recorded.

A read is stuck on the device (its NBD backend stopped with `faults.stall_queue`,
verified in the guest), then the removal is requested. The "hardware" answers
HARDWARE_ANSWERS_AFTER_S after the stall, far beyond the drain timeout: QEMU 7.2
freezes the whole VM while the guest resets an nvme whose request is stuck, so
the stall always ends on a timer (docs/faults.md).

Measured on the runtime's clock (`ts_ns` of the `procedure` events): drain start
(the last step before the `drain` event: `bus_master_off` or `isolate`) -> the
`drain` event with status `timeout` (the give-up) and -> the `reset` step `started`
(the escalation). Both must lie within the profile's `drain_timeout_ms` +-
`drain_tolerance_ms` (an absolute figure from the profile, not the runtime's own
setting: a runtime configured to wait longer fails). The outcome is recorded: a
`reset` event with `source: drain_timeout` and an outcome, matching the `remove`
reply's `reset` part.

Where the node stalls, the test bed's share is set apart (fixtures/floor_judgement.py,
`judge_interval_over_stalls`): an independent stall witness on the node
(fixtures/stall_witness.py) times how long inside each interval no woken thread could run;
a profile with `drain_stall_limit_ms` (emulated, TCG) judges a late interval less those
stalls, inconclusive when the stalls were over that limit. An early interval fails whatever
the stalls.
"""

from __future__ import annotations

import pytest
from hotplug_support import (
    REMOVE_CALL_TIMEOUT_S,
    REMOVED_TIMEOUT_S,
    GuestStallWitness,
    budget,
    describe_steps,
    events_for,
    first_step,
    judge_interval_over_stalls,
    queue_slot,
    run_steps,
    stalled_ms,
    subscribe,
    wait_procedure_end,
)

pytestmark = [pytest.mark.clause("HP-03"), pytest.mark.destructive]

HARDWARE_ANSWERS_AFTER_S = 3.0
RESET_OUTCOMES = ("ok", "error", "unsupported", "timeout")


@pytest.mark.needs("queue-stall")
def test_stuck_queue_drain_times_out_and_resets(host_factory, measurements):
    host = host_factory.start()
    slot = queue_slot(host)
    timeout_ms = budget(host, "drain_timeout_ms")
    tolerance_ms = budget(host, "drain_tolerance_ms")
    runtime = host.runtime
    host.settled_inventory()
    bdf = host.target_bdf(slot.name)

    witness = GuestStallWitness(host)  # before the stall: the read is stuck for a few seconds only
    try:
        # stall_queue issues one direct read itself and verifies it is stuck
        stall = host.faults.stall_queue(slot.name, resume_after_s=HARDWARE_ANSWERS_AFTER_S)
        mark = subscribe(runtime)
        result = runtime.call("remove", {"device": bdf}, timeout_s=REMOVE_CALL_TIMEOUT_S)
        end = wait_procedure_end(runtime, bdf, "hot_remove", mark, REMOVED_TIMEOUT_S)
    finally:
        stalls = witness.stop()
    stall.wait_resumed(HARDWARE_ANSWERS_AFTER_S + 10)
    steps = run_steps(runtime, mark, end["data"]["run"])
    order = describe_steps(steps)

    drain = first_step(steps, "drain")
    assert drain is not None, f"no drain step ({order})"
    assert drain["status"] == "timeout", (
        f"stuck queue of {bdf}: drain ended {drain['status']!r}, not 'timeout' "
        f"({drain}; steps: {order})")
    start = max((s for s in steps if s["seq"] < drain["seq"]), key=lambda s: s["seq"])
    reset_started = first_step(steps, "reset", ("started",))
    assert reset_started is not None and reset_started["seq"] > drain["seq"], (
        f"the drain timeout did not escalate to a reset (steps: {order})")
    low, high = timeout_ms - tolerance_ms, timeout_ms + tolerance_ms
    intervals = (  # name, figure (ms), the step it ends at; the runtime's own figure spans the give-up's
        ("drain_give_up", _interval_ms(start, drain), drain),
        ("drain_start_to_reset", _interval_ms(start, reset_started), reset_started),
        ("drain_elapsed_reported", drain["elapsed_ms"], drain),
    )
    for name, figure_ms, end_step in intervals:
        judge_interval_over_stalls(host, measurements, "HP-03", name, figure_ms,
                                   stalled_ms(stalls, start["ts_ns"], end_step["ts_ns"]), low, high,
                                   "drain_stall_limit_ms")

    reset_done = [s for s in steps if s["step"] == "reset" and s["status"] != "started"]
    assert reset_done, f"the reset's outcome is not reported as a step ({order})"
    resets = [e for e in events_for(runtime, mark, "reset", bdf)
              if e["data"].get("source") == "drain_timeout"]
    assert resets, f"no reset event with source drain_timeout for {bdf}"
    outcome = resets[0]["data"]["outcome"]
    assert outcome in RESET_OUTCOMES, resets[0]["data"]
    assert isinstance(resets[0]["data"].get("duration_ms"), int | float), resets[0]["data"]
    assert "reset" in result and result["reset"]["outcome"] == outcome, (
        f"remove reply's reset part {result.get('reset')} differs from the reset event {outcome!r}")
    assert result["drain"]["status"] == "timeout", result
    assert runtime.violations == []


def _interval_ms(start: dict, end: dict) -> float:
    """From one procedure event to a later one, in ms.

    Two estimates, each too long by at most one event's emission delay: the runtime
    stamps `ts_ns` before it takes its lock to send the event (seen waiting ~135 ms
    there on TCG), and the host stamps `host_ns` on receipt. The runtime-clock interval
    carries the start event's delay, the host-clock one the end event's; the smaller is
    the better estimate. Neither can come out shorter than the real interval by more
    than the virtio-serial transit jitter (~0.2 ms).
    """
    runtime_ms = (end["ts_ns"] - start["ts_ns"]) / 1e6
    host_ms = (end["host_ns"] - start["host_ns"]) / 1e6
    return min(runtime_ms, host_ms)
