"""HP-01 orderly removal: isolate -> drain -> DEALLOCATE -> topology -> power-off, each a
`procedure` event with a timestamp; the holder gets DEALLOCATE before the device goes.

Two entries into the same procedure, both on an allocated device hot-added into an
empty slot of the shared host (so the host is left as found):

* protocol `remove` (any hot-plug mode: the runtime powers the slot off itself);
* the attention button (native pciehp only): `host.get("orderly-removal").remove` presses it with
  QMP `device_del`; the runtime sees "Powering off due to button press" in the kernel
  log and runs the procedure inside pciehp's 5 s window.

"Before the device disappears" is checked three ways: the `deallocate` event's seq is
below the `power_off` step's and the `removed` event's (runtime order), and it reached
the host before QEMU's `DEVICE_DELETED` (host receipt times, `host_ns`).
"""

from __future__ import annotations

import pytest
from hotplug_support import (
    REMOVAL_ORDER,
    REMOVE_CALL_TIMEOUT_S,
    REMOVED_TIMEOUT_S,
    allocate,
    check_in_order,
    describe_steps,
    empty_slot,
    ensure_slot_empty,
    events_for,
    first_step,
    hot_add_and_settle,
    run_steps,
    subscribe,
    wait_departed,
    wait_procedure_end,
    watch_departures,
)

pytestmark = pytest.mark.clause("HP-01")


def _check_orderly_removal(runtime, mark: int, run_id: str, bdf: str, lease: dict,
                           left_ns: int | None) -> None:
    steps = run_steps(runtime, mark, run_id)
    order = describe_steps(steps)
    problems = check_in_order(steps, REMOVAL_ORDER)
    assert not problems, f"removal of {bdf}: {'; '.join(problems)} (steps: {order})"
    by_name = {s["step"]: s for s in steps if s["status"] != "started"}
    for name in ("isolate", "deallocate", "topology", "power_off"):
        assert by_name[name]["status"] == "ok", f"step {name} of {bdf}: {by_name[name]} ({order})"
    assert by_name["drain"]["status"] in ("ok", "skipped"), (
        f"drain of an idle healthy device did not finish: {by_name['drain']} ({order})")
    # isolate means no new work and bus mastering off, before the holder loses the device
    bus_off = first_step(steps, "bus_master_off", ("ok",))
    assert bus_off is not None, f"bus mastering never cleared during the removal of {bdf} ({order})"
    assert by_name["isolate"]["seq"] < bus_off["seq"] < by_name["deallocate"]["seq"], (
        f"bus mastering cleared outside isolate..deallocate ({order})")
    assert first_step(steps, "reset") is None, f"a healthy idle device was reset ({order})"

    deallocs = [e for e in events_for(runtime, mark, "deallocate", bdf)
                if e["data"]["lease"] == lease["lease"]]
    assert deallocs, f"holder {lease['holder']} never got DEALLOCATE for {bdf} ({order})"
    dealloc = deallocs[0]
    assert dealloc["data"]["holder"] == lease["holder"]
    assert dealloc["data"]["reason"] == "hot_remove", dealloc["data"]
    assert dealloc["seq"] < by_name["topology"]["seq"], "DEALLOCATE after the topology update"
    assert dealloc["seq"] < by_name["power_off"]["seq"], "DEALLOCATE after the slot power-off"
    removed = events_for(runtime, mark, "removed", bdf)
    assert removed, f"no removed event for {bdf}"
    assert dealloc["seq"] < removed[0]["seq"], "DEALLOCATE after the removed event"
    assert left_ns is not None, f"{bdf} never left the host after the power-off"
    assert dealloc["host_ns"] < left_ns, (
        f"DEALLOCATE reached the host {(dealloc['host_ns'] - left_ns) / 1e6:.1f} ms "
        "after the device left it")
    removed_moves = [e for e in events_for(runtime, mark, "transition", bdf)
                     if e["data"]["view"] == "health" and e["data"]["to"] == "REMOVED"]
    assert removed_moves and removed_moves[0]["seq"] > dealloc["seq"], "REMOVED before DEALLOCATE"
    held = [le for le in runtime.call("leases")["leases"] if bdf in le["devices"]]
    assert not held, f"{bdf} is gone but still leased: {held}"
    assert runtime.violations == []


@pytest.mark.needs("hot-add", "qmp")
@pytest.mark.walks("health: DISCOVERED > HEALTHY > ALLOCATED > RELEASED > REMOVED")
@pytest.mark.walks("main: INITIALIZED > ALLOCATED > INITIALIZED > POWER_OFF")
def test_orderly_removal_by_request(host):
    slot = empty_slot(host)
    runtime = host.runtime
    host.settled_inventory()
    try:
        record, bdf, _ = hot_add_and_settle(host, slot.name)
        lease = allocate(runtime, bdf, "hp01-request")
        mark = subscribe(runtime)
        departures = watch_departures(host)
        result = runtime.call("remove", {"device": bdf}, timeout_s=REMOVE_CALL_TIMEOUT_S)
        end = wait_procedure_end(runtime, bdf, "hot_remove", mark, REMOVED_TIMEOUT_S)
        runtime.wait_event("removed", mark, REMOVED_TIMEOUT_S, match=lambda d: d["device"] == bdf,
                           what=f"removed {bdf}")
        left_ns = wait_departed(departures, bdf)
        assert result["ok"] is True, result
        assert end["data"]["entry"] == "request"
        _check_orderly_removal(runtime, mark, end["data"]["run"], bdf, lease, left_ns)
    finally:
        ensure_slot_empty(host, slot.name)


@pytest.mark.needs("hot-add", "orderly-removal")
def test_orderly_removal_attention_button(host):
    slot = empty_slot(host)
    runtime = host.runtime
    host.settled_inventory()
    try:
        record, bdf, _ = hot_add_and_settle(host, slot.name)
        lease = allocate(runtime, bdf, "hp01-button")
        mark = subscribe(runtime)
        removal = host.get("orderly-removal").remove(record.device_id)  # returns once it left
        end = wait_procedure_end(runtime, bdf, "hot_remove", mark, REMOVED_TIMEOUT_S)
        runtime.wait_event("removed", mark, REMOVED_TIMEOUT_S, match=lambda d: d["device"] == bdf,
                           what=f"removed {bdf}")
        assert end["data"]["entry"] == "attention_button", end["data"]
        _check_orderly_removal(runtime, mark, end["data"]["run"], bdf, lease, removal.verified_ns)
    finally:
        ensure_slot_empty(host, slot.name)
