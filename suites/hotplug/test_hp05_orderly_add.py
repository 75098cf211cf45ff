"""HP-05 orderly add: link active -> firmware -> MMIO -> interrupts -> join pool, each a
`procedure` event in that order; a device failing a step stays out of the pool and
the failed step is named.

* Passing add (shared host, left as found): a stand-in hot-added into an empty slot
  (QMP `device_add`); its `hot_add` run must report the five steps in order, each
  passed (`ok`; MMIO may be `skipped` only for a device without a memory BAR), end
  `ok`, and the device must be HEALTHY and in the pool. It is then removed again.
* Failing add (fresh host): the runtime is given a config whose expected firmware for
  the stand-in's vendor:device differs from what the device reports (the profile's
  generated runtime config with its `[firmware]` entry replaced). The hot-added
  device must fail at `firmware` (link_active passed before it), run none of the
  later steps, end `failed` with `failed_step: firmware`, be FAULTED and out of the
  pool, and an allocate of it must be refused (NOT_HEALTHY).
"""

from __future__ import annotations

import pytest
from hotplug_support import (
    HOT_ADD_ORDER,
    REMOVE_CALL_TIMEOUT_S,
    REMOVED_TIMEOUT_S,
    check_in_order,
    describe_steps,
    empty_slot,
    ensure_slot_empty,
    first_step,
    hot_add_and_settle,
    subscribe,
    wait_departed,
    watch_departures,
)

from hilconform.fixtures.runtime_client import RuntimeCallError

pytestmark = pytest.mark.clause("HP-05")

WRONG_FIRMWARE = "0.0-hilconform-mismatch"


@pytest.mark.needs("hot-add", "qmp")
def test_orderly_add_steps_in_order(host):
    slot = empty_slot(host)
    runtime = host.runtime
    host.settled_inventory()
    try:
        record, bdf, steps = hot_add_and_settle(host, slot.name)
        order = describe_steps(steps)
        problems = check_in_order(steps, HOT_ADD_ORDER)
        assert not problems, f"hot-add of {bdf}: {'; '.join(problems)} (steps: {order})"
        for name in HOT_ADD_ORDER:
            status = first_step(steps, name)["status"]
            allowed = ("ok", "skipped") if name == "mmio" else ("ok",)
            assert status in allowed, f"step {name} of a good device: {status} ({order})"
        mmio = first_step(steps, "mmio")
        if mmio["status"] == "skipped":
            assert "memory BAR" in str(mmio.get("skipped", "")), f"MMIO check skipped: {mmio}"
        end = first_step(steps, "end")
        assert end is not None and end["status"] == "ok", f"hot-add of {bdf} ended {end} ({order})"
        device = runtime.call("device", {"device": bdf})
        assert device["state"] == "HEALTHY" and device["in_pool"] is True, device

        mark = subscribe(runtime)
        departures = watch_departures(host)
        runtime.call("remove", {"device": bdf}, timeout_s=REMOVE_CALL_TIMEOUT_S)
        runtime.wait_event("removed", mark, REMOVED_TIMEOUT_S, match=lambda d: d["device"] == bdf,
                           what=f"removed {bdf}")
        wait_departed(departures, bdf)
    finally:
        ensure_slot_empty(host, slot.name)


@pytest.mark.destructive
@pytest.mark.needs("hot-add")
def test_failing_firmware_step_keeps_device_out(host_factory):
    profile = host_factory.profile
    slot = next((s for s in profile.slots if not s.populated), None)
    if slot is None:
        pytest.skip(f"profile {profile.name} has no empty hot-plug slot")
    kind = profile.kind(slot.accepts)
    ids = f"{kind.vendor}:{kind.device}"
    config = host_factory.runtime_config(changes={"firmware": {ids: WRONG_FIRMWARE}})
    host = host_factory.fresh(runtime_config=config)
    runtime = host.runtime
    host.settled_inventory()

    _record, bdf, steps = hot_add_and_settle(host, slot.name)
    order = describe_steps(steps)
    link = first_step(steps, "link_active")
    assert link is not None and link["status"] == "ok", f"link_active did not pass first ({order})"
    firmware = first_step(steps, "firmware")
    assert firmware is not None and firmware["status"] == "failed", (
        f"a device reporting firmware other than the expected {WRONG_FIRMWARE!r} passed the "
        f"firmware step ({order}; {firmware})")
    assert link["seq"] < firmware["seq"]
    later = [s["step"] for s in steps if s["step"] in HOT_ADD_ORDER[2:]]
    assert not later, f"steps after the failed firmware check still ran: {later} ({order})"
    end = first_step(steps, "end")
    assert end is not None and end["status"] == "failed", f"hot-add ended {end} ({order})"
    assert end.get("failed_step") == "firmware", f"failed step named {end.get('failed_step')!r}"

    device = runtime.call("device", {"device": bdf})
    assert device["in_pool"] is False, device
    assert device["state"] not in ("HEALTHY", "ALLOCATED"), device
    assert "firmware" in str(device["last_cause"]), device["last_cause"]
    with pytest.raises(RuntimeCallError) as refused:
        runtime.call("allocate", {"device": bdf, "holder": "hp05"})
    assert refused.value.code == "NOT_HEALTHY", refused.value
    assert runtime.violations == []
