"""HP-06 endurance: repeated add/remove cycles leave the inventory consistent, leak no
leases or handles, and keep the runtime's memory flat.

Each cycle hot-adds a stand-in into an empty slot (QMP `device_add`), waits for its
self-check, allocates it, and takes it away while it is held, alternating the two
removals the runtime must survive: its own orderly `remove` (even cycles) and a
removal it is not told about (odd cycles: the guest kernel powers the slot off, see
HP-04). After each cycle: the `removed` event and QEMU's `DEVICE_DELETED` arrived,
the inventory equals QEMU's managed endpoints, and `stats` is sampled.

A leak is a trend, not one sample at a busy moment: `stats` is sampled only when the
runtime says it is idle (no device `busy` in its inventory: every procedure over), and
then until `open_fds` and `threads` read the same twice in a row (a procedure thread
that has reported its end may still be closing its files; bounded by QUIET_TIMEOUT_S).
One such sample before the first cycle is the baseline, one after each cycle the series.
(A single `stats` taken right after the last removal once decided the verdict: fds 12 ->
16 with every per-cycle sample 12, a correct runtime called NONCONFORMANT.)

Judged on the series' end, the median of its last TAIL samples: `leases` is the
baseline's (0 held), `open_fds` and `threads` have not grown past the baseline by more
than ENDURANCE_SLACK, `internal_errors` is 0, and the runtime's RSS grew from the first
cycle (warm-up: first-time imports, caches, the event history filling) by at most the
profile's `hp06_rss_growth_kb`. A leak of one fd every other cycle shows at 8 cycles;
slower ones at the nightly NIGHTLY_CYCLES. The series are recorded.

CYCLES is 8 for CI; HILCONFORM_NIGHTLY=1 runs NIGHTLY_CYCLES.
"""

from __future__ import annotations

import os
import statistics
import time

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
    wait_departed,
    watch_departures,
)

from hilconform.fixtures.errors import InfrastructureError

pytestmark = [pytest.mark.clause("HP-06"), pytest.mark.destructive, pytest.mark.slow]

CYCLES = 8
NIGHTLY_CYCLES = 60
ENDURANCE_SLACK = 2  # fds / threads a runtime may open on demand (a worker thread, a log file)
TAIL = 3  # the series' end: the median of its last TAIL idle samples
QUIET_TIMEOUT_S = 10.0  # idle and steady within this, else sampled as it is (noted)
QUIET_GAP_S = 0.2


def _cycles() -> int:
    return NIGHTLY_CYCLES if os.environ.get("HILCONFORM_NIGHTLY") == "1" else CYCLES


@pytest.mark.needs("hot-add", "qmp")  # the profile's empty slots, each cycle's unit in it
def test_add_remove_cycles_leak_nothing(host_factory, measurements):
    host = host_factory.fresh()
    slot = empty_slot(host)
    runtime = host.runtime
    host.settled_inventory()
    growth_budget_kb = budget(host, "hp06_rss_growth_kb")
    baseline, _ = _idle_stats(runtime)
    rss_kb, fds, threads, unsteady = [], [], [], []
    for cycle in range(_cycles()):
        record, bdf, steps = hot_add_and_settle(host, slot.name)
        end = [s for s in steps if s["step"] == "end"][-1]
        assert end["status"] == "ok", f"cycle {cycle}: hot-add of {bdf} ended {end}"
        lease = allocate(runtime, bdf, f"hp06-{cycle}")
        mark = subscribe(runtime)
        departures = watch_departures(host)
        if cycle % 2 == 0:
            result = runtime.call("remove", {"device": bdf}, timeout_s=REMOVE_CALL_TIMEOUT_S)
            assert result["ok"] is True, f"cycle {cycle}: remove {bdf}: {result}"
        else:
            pull_slot_power(host, bdf)
        runtime.wait_event("removed", mark, REMOVED_TIMEOUT_S, match=lambda d, b=bdf: d["device"] == b,
                           what=f"cycle {cycle}: removed {bdf}")
        if wait_departed(departures, bdf) is None:
            missing = f"cycle {cycle}: QEMU still has {record.device_id}"
            if cycle % 2 == 0:  # the runtime powered the slot off and said so
                raise AssertionError(f"{missing} after the runtime's power-off")
            raise InfrastructureError(f"{missing} after the guest powered its slot off")
        revoked = [e for e in runtime.events(mark, "deallocate")
                   if e["data"]["lease"] == lease["lease"]]
        assert revoked, f"cycle {cycle}: lease {lease['lease']} of {bdf} never revoked"
        mismatch = inventory_mismatch(host)
        assert mismatch is None, f"cycle {cycle}: {mismatch}"
        stats, steady = _idle_stats(runtime)
        if not steady:
            unsteady.append(cycle)
        rss_kb.append(stats["rss_kb"])
        fds.append(stats["open_fds"])
        threads.append(stats["threads"])

    measurements.record("HP-06", "runtime_rss", [v / 1024 for v in rss_kb], "MiB")
    measurements.record("HP-06", "runtime_open_fds", fds, "fds")
    measurements.record("HP-06", "runtime_threads", threads, "threads")
    growth_kb = _tail(rss_kb) - rss_kb[0]
    measurements.record("HP-06", "rss_growth_after_warmup", [growth_kb], "KiB",
                        budget=growth_budget_kb, budget_stat="max")
    where = (f"over {len(fds)} cycles, sampled idle (not steady within {QUIET_TIMEOUT_S:g} s after "
             f"cycles {unsteady})" if unsteady else f"over {len(fds)} cycles, sampled idle and steady")
    assert runtime.call("leases")["leases"] == [], "leases left after the cycles"
    assert stats["leases"] == baseline["leases"], (baseline["leases"], stats["leases"])
    assert _tail(fds) <= baseline["open_fds"] + ENDURANCE_SLACK, (
        f"open fds grew from {baseline['open_fds']} to {_tail(fds)} (median of the last {TAIL}) "
        f"{where} (per cycle: {fds})")
    assert _tail(threads) <= baseline["threads"] + ENDURANCE_SLACK, (
        f"threads grew from {baseline['threads']} to {_tail(threads)} (median of the last {TAIL}) "
        f"{where} (per cycle: {threads})")
    assert stats["internal_errors"] == 0, stats
    assert growth_kb <= growth_budget_kb, (
        f"runtime RSS grew {growth_kb} KiB from cycle 1 to the median of the last {TAIL} cycles "
        f"(budget {growth_budget_kb:g} KiB; series KiB: {rss_kb})")
    assert runtime.violations == []


def _tail(series: list[float]) -> float:
    return statistics.median(series[-TAIL:])


def _idle_stats(runtime) -> tuple[dict, bool]:
    """`stats` once the runtime says it is idle (no device busy in its inventory) and its fds and
    threads read the same twice in a row; (stats, whether that happened before the deadline)."""
    deadline = time.monotonic() + QUIET_TIMEOUT_S
    previous = None
    while True:
        busy = [d["device"] for d in runtime.call("inventory")["devices"] if d.get("busy")]
        stats = runtime.call("stats")
        if not busy and previous is not None and all(
                stats[k] == previous[k] for k in ("open_fds", "threads")):
            return stats, True
        if time.monotonic() >= deadline:
            return stats, False
        previous = None if busy else stats
        time.sleep(QUIET_GAP_S)  # bounded by the deadline: sampling, not waiting for an event
