"""LIFE-05: uncorrectable non-fatal errors that recover leave the device HEALTHY or DEGRADED
per policy; errors past the threshold make it DEGRADED, then FAULTED; a recovery
operation returns DEGRADED -> HEALTHY.

Errors are real: HMP `pcie_aer_inject_error <root port> UNSUP` (uncorrectable,
non-fatal by default severity) at the port above one device, verified by the guest's
AER counters; the kernel recovers the device and the runtime reports `recovered`.
Each host gets an explicit `[aer]` policy (runtime config; the runtime's `hello` must
echo it) with an hour-long half-life and no AER-driven reset, so the state after N
errors follows from the thresholds alone. Thresholds sit half-way between error
counts (the decayed weight of N errors is just under N).

* Thresholds (policy `nonfatal_recovered = HEALTHY`, degrade after 2 errors, fault
  after 4): error 1 leaves the device HEALTHY (no health move); error 2 -> DEGRADED
  (allocation refused); `recover` -> HEALTHY (in the pool again); errors 3-4 ->
  DEGRADED, errors 5-6 -> FAULTED, in that order. The other devices stay HEALTHY.
* Policy (`nonfatal_recovered = DEGRADED`, thresholds out of reach): one recovered
  error -> DEGRADED although the error weight is far below degrade_weight; `recover`
  -> HEALTHY; one more error leaves it DEGRADED at the test's end, and the host's close
  watches it past the test (LIFE-01 over the runtime's whole life: only `recover` heals it).
* Decay (a half-life of seconds, one error past degrade_weight): the device is DEGRADED;
  it is watched for longer than the decay takes to bring its weight under
  degrade_weight (plus three health polls, where a runtime would act on it) and must
  stay DEGRADED, however far its errors faded, until `recover`; then `recover` heals it.
  "Nothing else" returns DEGRADED -> HEALTHY. An error whose weight had already faded
  under the threshold when the kernel finished recovering it (a test bed slower than
  the half-life) is the test bed's miss: inconclusive, never a failure.
"""

from __future__ import annotations

import math

import pytest
from lifecycle_support import (
    PROCEDURE_TIMEOUT_S,
    STEADY_AER,
    allocate,
    device_record,
    flush,
    health_moves,
    inject_nonfatal,
    refused,
    require_aer_recovery,
    runtime_config,
    settled_inventory,
    slot_of,
    subscribe_live,
    threshold,
    wait_state,
)

from hilconform.fixtures.errors import Inconclusive

pytestmark = [pytest.mark.clause("LIFE-05"), pytest.mark.destructive]

THRESHOLDS = {**STEADY_AER, "nonfatal_recovered": "HEALTHY", "degrade_weight": threshold(2),
              "fault_weight": threshold(4)}
DEGRADING_POLICY = {**STEADY_AER, "nonfatal_recovered": "DEGRADED", "degrade_weight": 100.0,
                    "fault_weight": 200.0}
# One error (weight 1) degrades the device while it has not faded to a quarter: two half-lives,
# 6 s from its count to the kernel's recovery, which the test bed needs (else inconclusive).
DECAYING_POLICY = {"half_life_s": 3.0, "reset_weight": 1000.0, "nonfatal_recovered": "HEALTHY",
                   "degrade_weight": 0.25, "fault_weight": 100.0}
POLLS_WATCHED = 3  # health polls after the weight fell under degrade_weight, where a runtime acts


def _start(host_factory, aer: dict):
    host = host_factory.fresh(runtime_config=runtime_config(host_factory, {"aer": aer}))
    runtime = host.runtime
    reported = runtime.hello["config"]["aer"]
    assert {k: reported.get(k) for k in aer} == aer, f"the runtime runs AER policy {reported}, not {aer}"
    return host, runtime


def _errors(host, slot: str, bdf: str, count: int) -> dict:
    """Inject `count` errors one after the other; each must be counted exactly once."""
    runtime = host.runtime
    for _ in range(count):
        before = runtime.call("device", {"device": bdf})["aer"]["counts"]["nonfatal"]
        mark = runtime.mark()
        event = inject_nonfatal(host, slot, bdf)
        assert event["data"]["kind"] == "recovered", f"the kernel did not recover {bdf}: {event['data']}"
        after = runtime.call("device", {"device": bdf})["aer"]["counts"]["nonfatal"]
        counted = [e["data"]["delta"] for e in runtime.events(mark, "aer")
                   if e["data"]["device"] == bdf and e["data"]["kind"] == "counted"]
        assert after - before == 1, (
            f"one injected non-fatal error at {slot}'s port was counted {after - before} times for "
            f"{bdf} (counted events: {counted}); the error weight, hence the state, is wrong")
    return runtime.call("device", {"device": bdf})


def _recover(runtime, bdf: str) -> dict:
    result = runtime.call("recover", {"device": bdf}, timeout_s=PROCEDURE_TIMEOUT_S)
    assert result.get("recovered") is True, f"recover of {bdf} failed: {result}"
    record = wait_state(runtime, bdf, {"HEALTHY", "DEGRADED", "FAULTED"})
    assert (record["state"], record["in_pool"]) == ("HEALTHY", True), f"after recover: {record}"
    return record


@pytest.mark.walks("health: HEALTHY > DEGRADED > HEALTHY@recover > ALLOCATED > RELEASED "
                   "> HEALTHY@release_checkpoint > DEGRADED > FAULTED")
@pytest.mark.walks("main: INITIALIZED > ALLOCATED > INITIALIZED > ERROR")
def test_errors_past_the_thresholds_degrade_then_fault_and_recover_restores(host_factory):
    host, runtime = _start(host_factory, THRESHOLDS)
    checker, mark = subscribe_live(runtime)
    boot = settled_inventory(runtime)["devices"]
    require_aer_recovery(boot[0])
    bdf, others = boot[0]["device"], [d["device"] for d in boot[1:]]
    slot = slot_of(host, bdf)
    start = runtime.mark()

    record = _errors(host, slot, bdf, 1)
    assert record["aer"]["counts"]["nonfatal"] >= 1, f"the error was not counted: {record['aer']}"
    assert record["state"] == "HEALTHY", f"one recovered error (policy HEALTHY, below threshold): {record}"
    assert health_moves(runtime, start, bdf) == [], "a recovered error below the threshold moved health"

    record = _errors(host, slot, bdf, 1)
    assert record["state"] == "DEGRADED", f"2 errors, degrade_weight {THRESHOLDS['degrade_weight']}: {record}"
    denied = refused(lambda: allocate(runtime, device=bdf, holder="life05", ttl_s=60))
    assert denied is not None and denied.code == "NOT_HEALTHY", f"allocating the DEGRADED device: {denied!r}"

    _recover(runtime, bdf)
    lease = allocate(runtime, device=bdf, holder="life05", ttl_s=60)
    runtime.call("release", {"lease": lease["lease"]})
    wait_state(runtime, bdf, {"HEALTHY"})

    record = _errors(host, slot, bdf, 2)
    assert record["state"] == "DEGRADED", f"2 errors after recover: {record}"
    record = _errors(host, slot, bdf, 2)
    assert record["state"] == "FAULTED", f"4 errors, fault_weight {THRESHOLDS['fault_weight']}: {record}"

    flush(runtime)
    moves = [m for m in health_moves(runtime, start, bdf) if m[0] != "ALLOCATED" and m[1] != "ALLOCATED"]
    assert moves == [("HEALTHY", "DEGRADED"), ("DEGRADED", "HEALTHY"), ("RELEASED", "HEALTHY"),
                     ("HEALTHY", "DEGRADED"), ("DEGRADED", "FAULTED")], f"health moves of {bdf}: {moves}"
    states = {d["device"]: d["state"] for d in runtime.call("inventory")["devices"]}
    assert all(states[o] == "HEALTHY" for o in others), f"errors at {bdf}'s port touched others: {states}"
    checker.feed_all(runtime.events(mark))
    checker.assert_clean()


@pytest.mark.walks("health: HEALTHY > DEGRADED > HEALTHY@recover > DEGRADED")
def test_a_recovered_error_leaves_the_state_the_policy_names(host_factory):
    host, runtime = _start(host_factory, DEGRADING_POLICY)
    checker, mark = subscribe_live(runtime)
    target = settled_inventory(runtime)["devices"][-1]
    require_aer_recovery(target)
    bdf = target["device"]
    start = runtime.mark()

    record = _errors(host, slot_of(host, bdf), bdf, 1)
    assert record["state"] == "DEGRADED", f"policy nonfatal_recovered=DEGRADED, one recovered error: {record}"
    assert record["aer"]["weight"] < DEGRADING_POLICY["degrade_weight"], record["aer"]
    _recover(runtime, bdf)

    flush(runtime)
    assert health_moves(runtime, start, bdf) == [("HEALTHY", "DEGRADED"), ("DEGRADED", "HEALTHY")]
    checker.feed_all(runtime.events(mark))
    checker.assert_clean()

    # Left DEGRADED for the rest of the runtime's life: no recover comes, so nothing may heal it.
    # The host's close watches it for the profile's degraded_watch_s (fixtures/runtime_life_watch.py),
    # past the end of this test: a runtime that heals it on its own then is a LIFE-01 finding.
    record = _errors(host, slot_of(host, bdf), bdf, 1)
    assert record["state"] == "DEGRADED", f"policy nonfatal_recovered=DEGRADED, one recovered error: {record}"


def test_a_degraded_device_stays_degraded_after_its_errors_decay_until_recover(host_factory):
    host, runtime = _start(host_factory, DECAYING_POLICY)
    checker, mark = subscribe_live(runtime)
    target = settled_inventory(runtime)["devices"][0]
    require_aer_recovery(target)
    bdf = target["device"]
    start = runtime.mark()
    degrade = DECAYING_POLICY["degrade_weight"]

    outcome = inject_nonfatal(host, slot_of(host, bdf), bdf)["data"]
    assert outcome["kind"] == "recovered", f"the kernel did not recover {bdf}: {outcome}"
    record = device_record(runtime, bdf)
    if record["state"] == "HEALTHY" and outcome.get("weight", degrade) < degrade:
        raise Inconclusive(f"the error's weight had faded to {outcome.get('weight')} (under degrade_weight "
                           f"{degrade}) by the time the kernel recovered {bdf}: the test bed was slower "
                           f"than the policy's half-life of {DECAYING_POLICY['half_life_s']} s")
    assert record["state"] == "DEGRADED", (
        f"one error, weight {outcome.get('weight')} at its recovery >= degrade_weight {degrade}: {record}")

    weight = record["aer"]["weight"]
    poll_s = runtime.hello["config"].get("health_poll_ms", 1000) / 1000.0
    faded_s = DECAYING_POLICY["half_life_s"] * math.log2(max(weight, degrade) / degrade)
    watch_s = faded_s + POLLS_WATCHED * poll_s + 1.0
    watched = runtime.mark()
    moved = runtime.event_or_none("transition", watched, watch_s,
                                  match=lambda d: d["device"] == bdf and d["view"] == "health")
    record = device_record(runtime, bdf)
    assert moved is None and record["state"] == "DEGRADED", (
        f"{bdf} was DEGRADED with error weight {weight}; {watch_s:.1f} s later (its weight under "
        f"degrade_weight {degrade} after {faded_s:.1f} s, then {POLLS_WATCHED} health polls) it moved "
        f"{moved and (moved['data']['from'], moved['data']['to'], moved['data']['cause'])} and is "
        f"{record['state']}: only a recovery operation returns DEGRADED -> HEALTHY")
    if record["aer"]["weight"] >= degrade:
        raise Inconclusive(f"{bdf}'s error weight is still {record['aer']['weight']} after {watch_s:.1f} s "
                           f"(more errors than the one injected?): its decay was never watched")

    _recover(runtime, bdf)
    flush(runtime)
    assert health_moves(runtime, start, bdf) == [("HEALTHY", "DEGRADED"), ("DEGRADED", "HEALTHY")]
    checker.feed_all(runtime.events(mark))
    checker.assert_clean()
