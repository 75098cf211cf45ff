"""HP-06 endurance: repeated add/remove cycles leave the inventory consistent, leak no
leases or handles, and keep the runtime's memory flat.

Each cycle hot-adds a stand-in into an empty slot (QMP `device_add`), waits for its
self-check, allocates it, and takes it away while it is held, alternating the two
removals the runtime must survive: its own orderly `remove` (even cycles) and a
removal it is not told about (odd cycles: the guest kernel powers the slot off, see
HP-04). After each cycle: the `removed` event and QEMU's `DEVICE_DELETED` arrived,
the inventory equals QEMU's managed endpoints, and `stats` is sampled.

At the end, against the baseline taken before the first cycle: `leases` is the same
(0 held), `open_fds` and `threads` have not grown (ENDURANCE_SLACK each, for a
procedure thread still closing), `internal_errors` is 0, and the runtime's RSS after
the last cycle exceeds its RSS after the first (warm-up: first-time imports, caches,
the event history filling) by at most the profile's `hp06_rss_growth_kb`. The RSS
series is recorded.

CYCLES is 8 for CI; HILCONFORM_NIGHTLY=1 runs NIGHTLY_CYCLES.
"""

from __future__ import annotations

import os

import pytest
from hotplug_support import (
    REMOVE_CALL_TIMEOUT_S,
    REMOVED_TIMEOUT_S,
    allocate,
    budget,
    empty_slot,
    hot_add_and_settle,
    inventory_mismatch,
    pull_slot_power,
    subscribe,
    wait_device_deleted,
)

from hilconform.fixtures.errors import InfrastructureError

pytestmark = [pytest.mark.clause("HP-06"), pytest.mark.destructive, pytest.mark.slow]

CYCLES = 8
NIGHTLY_CYCLES = 60
ENDURANCE_SLACK = 2  # fds / threads a procedure that has just ended may still hold


def _cycles() -> int:
    return NIGHTLY_CYCLES if os.environ.get("HILCONFORM_NIGHTLY") == "1" else CYCLES


def test_add_remove_cycles_leak_nothing(host_factory, measurements):
    host = host_factory.start()
    slot = empty_slot(host)
    runtime = host.runtime
    host.settled_inventory()
    growth_budget_kb = budget(host, "hp06_rss_growth_kb")
    baseline = runtime.call("stats")
    rss_kb, fds = [], []
    for cycle in range(_cycles()):
        record, bdf, steps = hot_add_and_settle(host, slot.name)
        end = [s for s in steps if s["step"] == "end"][-1]
        assert end["status"] == "ok", f"cycle {cycle}: hot-add of {bdf} ended {end}"
        lease = allocate(runtime, bdf, f"hp06-{cycle}")
        mark = subscribe(runtime)
        qmp_mark = host.vm.qmp.mark()
        if cycle % 2 == 0:
            result = runtime.call("remove", {"device": bdf}, timeout_s=REMOVE_CALL_TIMEOUT_S)
            assert result["ok"] is True, f"cycle {cycle}: remove {bdf}: {result}"
        else:
            pull_slot_power(host, bdf)
        runtime.wait_event("removed", mark, REMOVED_TIMEOUT_S, match=lambda d, b=bdf: d["device"] == b,
                           what=f"cycle {cycle}: removed {bdf}")
        if wait_device_deleted(host, qmp_mark, record.device_id) is None:
            missing = f"cycle {cycle}: QEMU still has {record.device_id}"
            if cycle % 2 == 0:  # the runtime powered the slot off and said so
                raise AssertionError(f"{missing} after the runtime's power-off")
            raise InfrastructureError(f"{missing} after the guest powered its slot off")
        revoked = [e for e in runtime.events(mark, "deallocate")
                   if e["data"]["lease"] == lease["lease"]]
        assert revoked, f"cycle {cycle}: lease {lease['lease']} of {bdf} never revoked"
        mismatch = inventory_mismatch(host)
        assert mismatch is None, f"cycle {cycle}: {mismatch}"
        stats = runtime.call("stats")
        rss_kb.append(stats["rss_kb"])
        fds.append(stats["open_fds"])

    final = runtime.call("stats")
    measurements.record("HP-06", "runtime_rss", [v / 1024 for v in rss_kb], "MiB")
    measurements.record("HP-06", "runtime_open_fds", fds, "fds")
    growth_kb = rss_kb[-1] - rss_kb[0]
    measurements.record("HP-06", "rss_growth_after_warmup", [growth_kb], "KiB",
                        budget=growth_budget_kb, budget_stat="max")
    assert runtime.call("leases")["leases"] == [], "leases left after the cycles"
    assert final["leases"] == baseline["leases"], (baseline["leases"], final["leases"])
    assert final["open_fds"] <= baseline["open_fds"] + ENDURANCE_SLACK, (
        f"open fds grew from {baseline['open_fds']} to {final['open_fds']} over "
        f"{len(rss_kb)} cycles (per cycle: {fds})")
    assert final["threads"] <= baseline["threads"] + ENDURANCE_SLACK, (
        f"threads grew from {baseline['threads']} to {final['threads']}")
    assert final["internal_errors"] == 0, final
    assert growth_kb <= growth_budget_kb, (
        f"runtime RSS grew {growth_kb} KiB from cycle 1 to cycle {len(rss_kb)} "
        f"(budget {growth_budget_kb:g} KiB; series KiB: {rss_kb})")
    assert runtime.violations == []
