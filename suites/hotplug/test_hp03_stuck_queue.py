"""HP-03 stuck queue: the drain gives up at its timeout and escalates to a forced reset
instead of waiting; the reset's outcome is recorded.

Precondition (the test bed's; missed: inconclusive): the queue is stuck from before the
removal until the drain has given up. A read is stuck on the device (`faults.stall_queue`,
verified in the guest) and *held* until the runtime's own `drain` step event arrives
(fixtures/preconditions.py), then answered; with no drain event within HOLD_DEADLINE_S it is
answered anyway (an nvme reset while a request is stuck freezes the whole VM until the
backend answers: docs/faults.md). A fixed 3 s hold raced the runtime: a removal that began
late found the queue answered. Missed: released at the deadline sooner than
`drain_timeout_ms` + `drain_tolerance_ms` after the step before the drain reached the host.

Behaviour (the runtime's; wrong: fail): the drain ends `timeout`; a drain that ends `ok`
with the queue held, or after it had held the whole window, fails.

Measured on the runtime's clock (`ts_ns` of the `procedure` events): drain start
(the last step before the drain's outcome: its announced start `drain started`, else
`bus_master_off` or `isolate`) -> the
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
    budget,
    describe_steps,
    events_for,
    final_step,
    first_step,
    judge_interval_over_stalls,
    queue_slot,
    run_steps,
    stalled_ms,
    step_before,
    subscribe,
    wait_procedure_end,
)

pytestmark = [pytest.mark.clause("HP-03"), pytest.mark.destructive]

HOLD_DEADLINE_S = 10.0  # far past any drain's give-up; then the "hardware" answers anyway
HOLD_WAIT_S = 60.0
RESET_OUTCOMES = ("ok", "error", "unsupported", "timeout")


@pytest.mark.needs("queue-stall")
def test_stuck_queue_drain_times_out_and_resets(host_factory, measurements, preconditions):
    host = host_factory.fresh()
    slot = queue_slot(host)
    timeout_ms = budget(host, "drain_timeout_ms")
    tolerance_ms = budget(host, "drain_tolerance_ms")
    runtime = host.runtime
    host.settled_inventory()
    bdf = host.target_bdf(slot.name)

    witness = host.stall_witness()  # before the stall: it times the node's stalls in the drain
    try:
        # stall_queue issues one direct read itself and verifies it is stuck
        stall = host.get("queue-stall").stall_queue(slot.name)
        try:
            mark = subscribe(runtime)
            hold = preconditions.hold(
                "queue_stuck", "the queue stuck from before the removal until the drain gave up",
                runtime, "procedure", mark,
                lambda d: (d.get("device") == bdf and d.get("procedure") == "hot_remove"
                           and d.get("step") == "drain" and d.get("status") != "started"),
                "the end of the removal's drain", stall.resume, HOLD_DEADLINE_S,
                held_from_ns=stall.record.injected_ns)
            result = runtime.call("remove", {"device": bdf}, timeout_s=REMOVE_CALL_TIMEOUT_S)
            end = wait_procedure_end(runtime, bdf, "hot_remove", mark, REMOVED_TIMEOUT_S)
            held = hold.wait(HOLD_WAIT_S)
        finally:
            stall.resume()  # idempotent: a failed call never leaves the backend stopped
    finally:
        stalls = witness.stop()
    steps = run_steps(runtime, mark, end["data"]["run"])
    order = describe_steps(steps)

    drain = final_step(steps, "drain")
    assert drain is not None, f"no drain step ({order})"
    start = step_before(steps, drain)
    _judge_precondition(preconditions, held, start, drain, timeout_ms + tolerance_ms)
    assert drain["status"] == "timeout", (
        f"stuck queue of {bdf}: drain ended {drain['status']!r}, not 'timeout' "
        f"({drain}; steps: {order})")
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


def _judge_precondition(preconditions, held, start: dict, drain: dict, window_ms: float) -> None:
    """Met when the queue was still stuck as the drain ended (released by the drain's own event),
    or when it was held past the whole window after the step before the drain reached the host
    (a drain still waiting then had all its time); otherwise inconclusive."""
    if held.by_event:
        preconditions.met(held, f"stuck until the drain ended {drain['status']!r} (seq {drain['seq']})")
        return
    held_after_start_ms = (held.released_ns - start["host_ns"]) / 1e6
    if held_after_start_ms < window_ms:
        preconditions.missed(held, f"answered {held_after_start_ms:.1f} ms after the {start['step']} step "
                                   f"reached the host, before the drain's window ({window_ms:g} ms) was out")
    preconditions.met(held, f"no drain step within {HOLD_DEADLINE_S:g} s: answered then, "
                            f"{held_after_start_ms:.0f} ms after the drain began")


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
