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

Judged on the runtime's own deadline arithmetic (fixtures/floor_judgement.py `judge_timer`): the
`drain` `timeout` event reports, on the runtime's clock, when the drain started, its deadline and
when it gave up (`started_ns`, `deadline_ns`, `gave_up_ns`, docs/protocol.md). Its deadline less
its start and its give-up less its start must lie within the profile's `drain_timeout_ms` +-
`drain_tolerance_ms` (an absolute figure from the profile, not the runtime's own setting: a runtime
configured to wait longer fails), and it must not give up before its own deadline: with NO excuse
for the node's stalls (a stall inside a timer's sleep delays nothing; load never excuses a wrong
timeout). The runtime's own `elapsed_ms` likewise. Those times must be true: the host's interval
between its receipts of the drain's announced start (`drain started`) and its give-up may exceed
the reported one only by `drain_tolerance_ms` (the events' way to the host) and the stall of the
guest's virtual CPUs after the reported give-up (`drain_give_up_report_lag`; a profile with
`drain_stall_limit_ms` subtracts that stall, inconclusive past it). A runtime that reports no such
times is judged by the host's interval whole, without excuse (`drain_give_up_host_clock`).

The escalation is event-bound: from the drain's start to the `reset` step `started` must lie
within the same window, less only the virtual CPUs' stall between the give-up and the reset's start
(the runtime's clock; `judge_interval_over_stalls`). The outcome is recorded: a `reset` event with
`source: drain_timeout` and an outcome, matching the `remove` reply's `reset` part. The node's
stalls over the whole drain (every thread the guest runs on) are recorded beside
(`drain_give_up_node_stalled`), never subtracted.
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

from hilconform.fixtures.floor_judgement import TimerReport, judge_timer
from hilconform.fixtures.stall_witness import acting_stalled_host_ms

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
    _judge_give_up(host, measurements, stalls, start, drain, reset_started, low, high, tolerance_ms)

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


def _judge_give_up(host, measurements, stalls, start: dict, drain: dict, reset_started: dict,
                   low: float, high: float, tolerance_ms: float) -> None:
    """The give-up is timer-bound: judged on the runtime's own deadline arithmetic with no excuse
    (`judge_timer`), its reported times checked against the host's receipts of the drain's start and
    give-up, less only the guest's virtual CPUs' stall after the give-up. The escalation is
    event-bound (the give-up triggers it): start to the reset's start, less only that stall
    between the give-up and the reset's start."""
    report = TimerReport.of(drain)
    host_ms = (drain["host_ns"] - start["host_ns"]) / 1e6
    measurements.record("HP-03", "drain_give_up_node_stalled",  # the old excuse: every thread, all of it
                        [stalled_ms(stalls, start["ts_ns"], drain["ts_ns"])], "ms")
    end_stall_ms = None
    if report is not None:  # the host's estimate of the give-up, to the give-up's receipt
        gave_up_host_ns = start["host_ns"] + (report.gave_up_ns - report.started_ns)
        end_stall_ms = acting_stalled_host_ms(stalls, gave_up_host_ns, drain["host_ns"])
    judge_timer(host, measurements, "HP-03", "drain_give_up", report, host_ms, low, high, tolerance_ms,
                end_stall_ms, "drain_stall_limit_ms")
    elapsed = measurements.record("HP-03", "drain_elapsed_reported", [drain["elapsed_ms"]], "ms",
                                  budget=high, budget_stat="max")
    assert low <= drain["elapsed_ms"] <= high, (  # the runtime's own figure: no excuse either
        f"the runtime reports its drain gave up after {elapsed.text()}, not within {low:g}..{high:g} ms")
    started_ns = report.started_ns if report is not None else start["ts_ns"]
    judge_interval_over_stalls(host, measurements, "HP-03", "drain_start_to_reset",
                               (reset_started["ts_ns"] - started_ns) / 1e6,
                               stalled_ms(stalls, drain["ts_ns"], reset_started["ts_ns"], acting=True),
                               low, high, "drain_stall_limit_ms")
