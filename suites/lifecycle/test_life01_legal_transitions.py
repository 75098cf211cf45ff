"""LIFE-01: only legal transitions; each carries a timestamp and a cause and passes a
health checkpoint.

A fresh host; the suite subscribes with replay from the runtime's first event, so the
checker (fixtures/transition_checker.py) sees every transition since boot and each device must
start at the views' initial states. Then a mix of operations, each of which must show
the moves it stands for (a runtime that emits nothing cannot pass):

allocate/renew/release, a lease left to expire, a non-fatal AER error under the policy
`nonfatal_recovered = DEGRADED` and `recover` (devices with a driver: the kernel
recovers only those), a hot-add that passes its self-check and its orderly removal
while allocated (protocol `remove`), a hot-add that fails it (firmware mismatch: a
stand-in kind no boot device is, edu on a100/t4, reports 1.0 where the runtime expects
9.9) and its attention-button removal (QMP `device_del`), and a reset.

Every transition is checked against the published table (legal pair, ts_ns, cause,
checkpoint, per-device continuity and monotonic time, the published view
combination) and the spec's rules on causes (fixtures/transition_rules.toml: the ways
back to HEALTHY only by `recover`, inside its procedure run, and by the release
checkpoint; a table that allows more is itself a violation), and the inventory must
sit exactly where the transitions left it. The same rules are checked on every other
suite test's events (fixtures/transition_watch.py).
"""

from __future__ import annotations

import pytest
from lifecycle_support import (
    PROCEDURE_TIMEOUT_S,
    allocate,
    failing_add,
    flush,
    inject_nonfatal,
    remove_and_wait_gone,
    require_empty_slot,
    runtime_config,
    settled_inventory,
    slot_of,
    subscribe_from_start,
    wait_procedure_end,
    wait_state,
)

pytestmark = [pytest.mark.clause("LIFE-01"), pytest.mark.destructive, pytest.mark.slow]

# DEGRADED by policy after any recovered error; thresholds out of reach (LIFE-05 checks them).
AER_POLICY = {"aer": {"nonfatal_recovered": "DEGRADED", "degrade_weight": 1000.0, "fault_weight": 1000.0,
                      "reset_weight": 1000.0}}
# Health moves the operations stand for (the clause's paths, not one runtime's detours):
# a runtime that skips or hides any of them fails here.
CORE_MOVES = {
    ("DISCOVERED", "HEALTHY"),  # boot and hot-add self-checks
    ("HEALTHY", "ALLOCATED"),
    ("ALLOCATED", "RELEASED"),
    ("RELEASED", "HEALTHY"),
}
AER_MOVES = {("HEALTHY", "DEGRADED"), ("DEGRADED", "HEALTHY")}  # policy DEGRADED, then recover
FAILED_ADD_MOVES = {("DISCOVERED", "FAULTED"), ("FAULTED", "REMOVED")}


def test_every_transition_of_a_mixed_workload_is_legal_and_complete(host_factory, request):
    failing = failing_add(host_factory)
    changes = {**AER_POLICY, **(failing.config if failing else {})}
    host = host_factory.fresh(runtime_config=runtime_config(host_factory, changes))
    runtime = host.runtime
    checker, mark = subscribe_from_start(runtime)
    boot = [d["device"] for d in settled_inventory(runtime)["devices"]]
    assert boot, "the runtime lists none of the profile's boot devices"
    slot = require_empty_slot(host)[0]
    required = set(CORE_MOVES)
    removed = []

    # allocate, renew (the holder uses it), release
    lease = allocate(runtime, device=boot[0], holder="life01-a", ttl_s=60)
    runtime.call("renew", {"lease": lease["lease"]})
    runtime.call("release", {"lease": lease["lease"]})

    # a lease nobody renews: it expires and the devices return to the pool
    short = allocate(runtime, device=boot[-1], holder="life01-b", ttl_s=1.0)
    runtime.wait_event("lease", mark, 15, what=f"expiry of {short['lease']}",
                       match=lambda d: d["lease"] == short["lease"] and d["action"] == "expired")
    wait_state(runtime, boot[-1], {"HEALTHY"})

    # a recovered non-fatal error: DEGRADED by policy; recover brings it back
    target = runtime.call("device", {"device": boot[-1]})
    if target["info"].get("driver") is not None:  # the kernel recovers only devices with a driver
        inject_nonfatal(host, slot_of(host, target["device"]), target["device"])
        wait_state(runtime, target["device"], {"DEGRADED"})
        result = runtime.call("recover", {"device": target["device"]}, timeout_s=PROCEDURE_TIMEOUT_S)
        assert result["recovered"] is True, result
        required |= AER_MOVES

    # hot-add that passes its self-check; orderly removal while allocated (protocol remove)
    step = runtime.mark()
    added = host.get("hot-add").hot_add(slot)
    wait_procedure_end(runtime, step, "hot_add", added.bdf)
    assert wait_state(runtime, added.bdf, {"HEALTHY", "FAULTED"})["state"] == "HEALTHY"
    held = allocate(runtime, device=added.bdf, holder="life01-c", ttl_s=60)
    remove_and_wait_gone(host, runtime, added.bdf)
    removed.append(added.bdf)

    # hot-add that fails its firmware step, then an attention-button removal (device_del)
    if failing is not None:
        step = runtime.mark()
        failed = failing.add(host, slot)
        wait_procedure_end(runtime, step, "hot_add", failed)
        assert wait_state(runtime, failed, {"HEALTHY", "FAULTED"})["state"] == "FAULTED"
        step = runtime.mark()
        host.get("orderly-removal").remove(slot)
        runtime.wait_event("removed", step, 20, match=lambda d: d["device"] == failed,
                           what=f"removal of {failed}")
        removed.append(failed)
        required |= FAILED_ADD_MOVES

    # a requested reset of a healthy device
    reset = runtime.call("reset", {"device": boot[0]}, timeout_s=PROCEDURE_TIMEOUT_S)
    assert reset["outcome"] == "ok", reset

    inventory = settled_inventory(runtime)
    flush(runtime)
    checker.feed_all(runtime.events(mark))
    request.node.add_report_section("call", "LIFE-01 transitions checked", checker.summary())
    checker.assert_clean()
    checker.assert_matches_inventory(inventory["devices"])
    assert checker.complete_history, "the runtime's replay did not start at its first event"

    seen = {(frm, to) for (view, frm, to) in checker.counts if view == "health"}
    missing = required - seen
    assert not missing, f"operations ran but these health moves were never emitted: {sorted(missing)}"
    for bdf in removed:
        assert checker.position(bdf, "health") == "REMOVED", f"{bdf} left without a move to REMOVED"
        assert bdf not in {d["device"] for d in inventory["devices"]}
    assert held["lease"] not in {x["lease"] for x in runtime.call("leases")["leases"]}
    for bdf in boot:
        assert checker.position(bdf, "health") is not None, f"{bdf}: no transition was ever emitted"
    assert runtime.violations == [], runtime.violations
